#!/usr/bin/env python
"""What installing the provider costs a deployment: site-packages size and install time over plain Airflow.

Usage (from the repository root)::

    .venv/bin/python benchmarks/bench_install_size.py                   # builds the wheel, four fresh venvs
    .venv/bin/python benchmarks/bench_install_size.py --wheel dist/airflow_provider_pulsarstate-0.1.0-py3-none-any.whl
    .venv/bin/python benchmarks/bench_install_size.py --json sizes.json --keep /tmp/venvs

Each row is a brand-new venv (``uv venv``) with one ``uv pip install`` resolved afresh from the
index, as a user installs (no lock): plain ``apache-airflow==3.3.*``; plus this provider's wheel;
plus the wheel with ``[spark]``; plus ``apache-airflow-providers-apache-kafka`` for comparison.
Size is the apparent size of site-packages with bytecode compiled (as pip leaves it); the delta is over plain Airflow; "added" names the
largest distributions a row adds. Install time is the ``uv pip install`` wall time with uv's cache
as it is (a warm cache: downloads excluded; run ``uv cache clean`` first for a cold figure).
Target: the core install adds at most 150 MB (PASS/FAIL).

Then, in the core venv (no Spark), it checks the installed wheel as a user would meet it: the
broker harness and its packaged Maven project import and are present, the Spark helpers fail with
the ``[spark]`` install hint, and ``airflow providers get`` knows the provider.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import print_run_header  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
AIRFLOW = "apache-airflow==3.3.*"
TARGET_MB = 150.0
MB = 1_000_000


def _uv() -> str:
    beside = Path(sys.executable).with_name("uv")
    found = str(beside) if beside.exists() else shutil.which("uv")
    if not found:
        sys.exit("uv is needed (pip install uv)")
    return found


def _build_wheel(out: Path) -> Path:
    subprocess.run([_uv(), "build", "--wheel", "--quiet", "--out-dir", str(out), str(ROOT)], check=True)
    (wheel,) = out.glob("*.whl")
    return wheel


def _site_packages(venv: Path) -> Path:
    (site,) = venv.glob("lib/python*/site-packages")
    return site


def _size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and not f.is_symlink())


def _distributions(site: Path) -> dict[str, int]:
    """distribution name -> bytes of the files its RECORD lists."""
    sizes: dict[str, int] = {}
    for info in site.glob("*.dist-info"):
        record = info / "RECORD"
        if not record.exists():
            continue
        total = 0
        for line in record.read_text().splitlines():
            parts = line.rsplit(",", 2)
            if len(parts) == 3 and parts[2].isdigit():
                total += int(parts[2])
        sizes[_name(info)] = total
    return sizes


def _name(info: Path) -> str:
    return info.name.split("-")[0].lower().replace("_", "-")


def _versions(site: Path) -> dict[str, str]:
    return {_name(info): info.name[: -len(".dist-info")].split("-", 1)[1] for info in site.glob("*.dist-info")}


def _venv(workdir: Path, name: str, requirements: list[str], python: str) -> dict[str, Any]:
    venv = workdir / name
    shutil.rmtree(venv, ignore_errors=True)
    subprocess.run([_uv(), "venv", "--quiet", "--python", python, str(venv)], check=True)
    start = time.monotonic()
    # --compile-bytecode: what pip does by default, so the sizes are what a pip-built image holds.
    subprocess.run(
        [
            _uv(),
            "pip",
            "install",
            "--quiet",
            "--compile-bytecode",
            "--python",
            str(venv / "bin" / "python"),
            *requirements,
        ],
        check=True,
    )
    seconds = time.monotonic() - start
    site = _site_packages(venv)
    print(f"  {name}: {_size(site) / MB:.0f} MB in {seconds:.1f} s", file=sys.stderr, flush=True)
    return {
        "name": name,
        "requirements": requirements,
        "venv": str(venv),
        "bytes": _size(site),
        "seconds": round(seconds, 1),
        "dists": _distributions(site),
        "versions": _versions(site),
    }


def _check_core_venv(venv: Path) -> list[tuple[str, bool, str]]:
    """The installed wheel, without Spark, as a user meets it."""
    python = str(venv / "bin" / "python")
    home = Path(tempfile.mkdtemp(prefix="pulsarstate-install-home-"))
    env = {**os.environ, "AIRFLOW_HOME": str(home), "AIRFLOW__CORE__LOAD_EXAMPLES": "False", "PYTHONPATH": ""}
    probe = (
        "import json, importlib.util\n"
        "import airflow_provider_pulsarstate\n"
        "from airflow_provider_pulsarstate.testing import broker\n"
        "from airflow_provider_pulsarstate.spark import write_view\n"
        "out = {'pom': (broker._RESOURCE_DIR / 'pom.xml').is_file(), 'conf': (broker._RESOURCE_DIR / 'standalone.conf').is_file(),\n"
        "       'pyspark': importlib.util.find_spec('pyspark') is not None, 'from': airflow_provider_pulsarstate.__file__}\n"
        "for name, call in [('write_view', lambda: write_view(None, config={}, table_topic='t', view_id='v', key_column='k')),\n"
        "                   ('spark_submit', lambda: __import__('airflow_provider_pulsarstate.operators.spark_submit'))]:\n"
        "    try:\n"
        "        call(); out[name] = 'no error'\n"
        "    except ImportError as exc:\n"
        "        out[name] = str(exc)\n"
        "print(json.dumps(out))\n"
    )
    checks: list[tuple[str, bool, str]] = []
    try:
        result = subprocess.run([python, "-c", probe], env=env, capture_output=True, text=True, timeout=300, cwd=home)
        if result.returncode != 0:
            return [("import the installed wheel", False, result.stderr.strip().splitlines()[-1])]
        out = json.loads(result.stdout.strip().splitlines()[-1])
        checks.append(("imported from the venv, not the checkout", str(venv) in out["from"], out["from"]))
        checks.append(("broker harness files (pom.xml, standalone.conf) installed", out["pom"] and out["conf"], ""))
        checks.append(("no pyspark in the core install", not out["pyspark"], ""))
        hint = "pip install 'airflow-provider-pulsarstate[spark]'"
        for name in ("write_view", "spark_submit"):
            checks.append((f"{name} without Spark names the [spark] extra", hint in out[name], out[name][:120]))
        airflow = str(venv / "bin" / "airflow")
        got = subprocess.run(
            [airflow, "providers", "get", "airflow-provider-pulsarstate"],
            env=env,
            cwd=home,
            capture_output=True,
            text=True,
            timeout=300,
        )
        checks.append(
            (
                "`airflow providers get airflow-provider-pulsarstate`",
                got.returncode == 0 and "airflow-provider-pulsarstate" in got.stdout,
                (got.stdout + got.stderr).strip().splitlines()[-1] if (got.stdout + got.stderr).strip() else "",
            )
        )
    finally:
        shutil.rmtree(home, ignore_errors=True)
    return checks


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--wheel", type=Path, help="the wheel to measure (default: build one from the checkout)")
    parser.add_argument("--python", default="3.11", help="the venvs' Python (default 3.11, the one CI tests)")
    parser.add_argument("--keep", type=Path, help="build the venvs here and keep them (default: a temp dir, removed)")
    parser.add_argument("--json", type=Path, help="also write the results as JSON")
    args = parser.parse_args()

    print_run_header()
    workdir = args.keep or Path(tempfile.mkdtemp(prefix="pulsarstate-install-"))
    workdir.mkdir(parents=True, exist_ok=True)
    try:
        wheel = (args.wheel or _build_wheel(workdir / "dist")).resolve()
        print(f"wheel: {wheel.name}", flush=True)
        uri = wheel.as_uri()
        rows = [
            _venv(workdir, "airflow", [AIRFLOW], args.python),
            _venv(workdir, "provider", [AIRFLOW, f"airflow-provider-pulsarstate @ {uri}"], args.python),
            _venv(workdir, "provider-spark", [AIRFLOW, f"airflow-provider-pulsarstate[spark] @ {uri}"], args.python),
            _venv(workdir, "kafka-provider", [AIRFLOW, "apache-airflow-providers-apache-kafka"], args.python),
        ]
        base = rows[0]
        print()
        for row in rows:
            v = row["versions"]
            print(
                f"{row['name']}: "
                + ", ".join(
                    f"{d} {v[d]}"
                    for d in (
                        "apache-airflow",
                        "airflow-provider-pulsarstate",
                        "pyspark",
                        "apache-airflow-providers-apache-kafka",
                    )
                    if d in v
                )
            )
        print()
        print(
            f"| install (fresh venv, Python {args.python}) | site-packages | over plain Airflow | uv install time | largest added distributions | target |"
        )
        print("|---|---:|---:|---:|---|---|")
        for row in rows:
            delta = (row["bytes"] - base["bytes"]) / MB
            added = {d: s for d, s in row["dists"].items() if d not in base["dists"]}
            largest = ", ".join(f"{d} {s / MB:.1f}" for d, s in sorted(added.items(), key=lambda kv: -kv[1])[:4])
            target = ""
            if row["name"] == "provider":
                target = f"<= +{TARGET_MB:.0f} MB: {'PASS' if delta <= TARGET_MB else 'FAIL'}"
            row["delta_mb"] = round(delta, 1)
            print(
                f"| {' + '.join(r.split(' @ ')[0] for r in row['requirements'])} | {row['bytes'] / MB:.0f} MB "
                f"| {'' if row is base else f'{delta:+.0f} MB'} | {row['seconds']:.1f} s | {largest} | {target} |"
            )
        print()
        checks = _check_core_venv(Path(rows[1]["venv"]))
        print("| the installed wheel, core install (no Spark) | result | detail |")
        print("|---|---|---|")
        for name, ok, detail in checks:
            print(f"| {name} | {'PASS' if ok else 'FAIL'} | {detail.replace('|', '/')} |")
        if args.json:
            for row in rows:
                row.pop("dists")
                row["versions"] = {d: v for d, v in row["versions"].items() if "airflow" in d or "spark" in d}
            args.json.write_text(json.dumps({"rows": rows, "checks": checks}, indent=2))
        core_ok = rows[1]["delta_mb"] <= TARGET_MB and all(ok for _, ok, _ in checks)
        return 0 if core_ok else 1
    finally:
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
