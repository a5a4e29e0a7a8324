"""Benchmark: switching a 1M-key table through a temp view, beside a plain in-memory dict diff.

    .venv/bin/python benchmarks/bench_views.py                 # embedded log in a temp dir
    .venv/bin/python benchmarks/bench_views.py --rows 100000   # smaller
    .venv/bin/python benchmarks/bench_views.py --service-url pulsar://127.0.0.1:6650 --admin-url http://127.0.0.1:8080

Both sides run in child processes of their own, so each peak RSS is that side's alone:

* ours: a fresh StateTable bootstraps the committed table (1M keys), stages the new full table
  into a view, and applies it (the minimal diff, one record);
* baseline: build the old and the new table as two dicts and diff them with ``==``.

The published op count must equal the true diff (computed by the baseline); the script exits 1
if it does not.
"""

from __future__ import annotations

import argparse
import json
import logging
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

TOPIC = "persistent://public/default/bench-prices"


def row(i: int, version: int) -> dict:
    """The record of sku i in a version: 1% of prices change from one version to the next."""
    bump = version if i % 100 == version % 100 else 0
    return {"price": round((i * 7919 % 10_000) / 100 + bump, 2), "currency": "EUR", "stock": i % 50}


def table(rows: int, version: int) -> dict[str, dict]:
    return {f"sku-{i:07d}": row(i, version) for i in range(rows)}


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def run_baseline(rows: int) -> dict:
    start = time.perf_counter()
    old, new = table(rows, 0), table(rows, 1)
    built = time.perf_counter()
    sets = [k for k, v in new.items() if old.get(k) != v]
    deletes = [k for k in old if k not in new]
    done = time.perf_counter()
    return {"diff_s": done - built, "total_s": done - start, "ops": len(sets) + len(deletes), "peak_rss_mb": peak_rss_mb()}


def run_ours(rows: int, config: dict, *, load: bool) -> dict:
    from airflow_provider_pulsarstate import ConnectionConfig, open_backend
    from airflow_provider_pulsarstate.engine.recipes.table import StateTable

    backend = open_backend(ConnectionConfig(**config))
    state = StateTable(backend, TOPIC, operation_timeout=600.0)
    out: dict = {}
    t0 = time.perf_counter()
    state.start()
    out["bootstrap_s"] = time.perf_counter() - t0
    version = 0 if load else 1
    view = state.create_view()
    t1 = time.perf_counter()
    with state.stager(view.view_id, batch_rows=5000) as stager:
        for i in range(rows):
            stager.set(f"sku-{i:07d}", row(i, version))
    t2 = time.perf_counter()
    result = state.apply(view.view_id)
    t3 = time.perf_counter()
    out.update(stage_s=t2 - t1, apply_s=t3 - t2, ops=result.set + result.delete, unchanged=result.unchanged,
               commit_offset=result.commit_offset, peak_rss_mb=peak_rss_mb())
    state.close()
    backend.close()
    return out


def child(args: list[str]) -> dict:
    proc = subprocess.run([sys.executable, __file__, *args], capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"child {args[:2]} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--service-url", default="")
    parser.add_argument("--admin-url", default="")
    parser.add_argument("--json", dest="json_out", default="")
    parser.add_argument("--phase", choices=["baseline", "load", "ours"], help=argparse.SUPPRESS)
    parser.add_argument("--config", help=argparse.SUPPRESS)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stderr)

    if args.phase == "baseline":
        print(json.dumps(run_baseline(args.rows)))
        return 0
    if args.phase in ("load", "ours"):
        print(json.dumps(run_ours(args.rows, json.loads(args.config), load=args.phase == "load")))
        return 0

    tmp = tempfile.mkdtemp(prefix="bench-views-")
    config = (
        {"url": args.service_url, "admin_url": args.admin_url, "operation_timeout": 600.0}
        if args.service_url else {"url": f"{tmp}/state.db", "operation_timeout": 600.0}
    )
    backend_name = "pulsar" if args.service_url else "embedded"
    common = ["--rows", str(args.rows), "--config", json.dumps(config)]
    logging.info("loading the committed table: %d rows (%s back end)", args.rows, backend_name)
    load = child(["--phase", "load", *common])
    logging.info("loaded in %.1fs; applying version 1 (1%% changed) in a fresh process", load["stage_s"] + load["apply_s"])
    ours = child(["--phase", "ours", *common])
    base = child(["--phase", "baseline", "--rows", str(args.rows)])

    rows = [
        ("diff + publish (s)", f"{ours['apply_s']:.2f}", f"{base['diff_s']:.2f}", f"{ours['apply_s'] / base['diff_s']:.1f}x"),
        ("peak RSS (MB)", f"{ours['peak_rss_mb']:.0f}", f"{base['peak_rss_mb']:.0f}", f"{ours['peak_rss_mb'] / base['peak_rss_mb']:.2f}x"),
        ("ops published / diff", str(ours["ops"]), str(base["ops"]), "equal" if ours["ops"] == base["ops"] else "DIFFERENT"),
    ]
    print(f"\nview switch of {args.rows:,} keys, 1% changed, {backend_name} back end")
    print(f"{'':<22} {'ours (apply)':>14} {'dict diff':>12} {'ratio':>10}")
    for name, a, b, r in rows:
        print(f"{name:<22} {a:>14} {b:>12} {r:>10}")
    print(f"ours also: bootstrap {ours['bootstrap_s']:.1f}s, staging {ours['stage_s']:.1f}s "
          f"({args.rows / ours['stage_s']:,.0f} rows/s), unchanged {ours['unchanged']:,}, commit offset {ours['commit_offset']}")
    if args.json_out:
        Path(args.json_out).write_text(json.dumps({"rows": args.rows, "backend": backend_name, "ours": ours, "baseline": base, "load": load}, indent=2))
    return 0 if ours["ops"] == base["ops"] else 1


if __name__ == "__main__":
    sys.exit(main())
