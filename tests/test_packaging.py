"""What users install: the wheel (built through the sdist, as a release would be) carries the whole
package with its data files, the licence, and metadata whose core dependencies hold no Spark runtime."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import zipfile
from email.message import Message
from email.parser import Parser
from pathlib import Path

import pytest

# the tests share the module's built wheel: on one xdist worker, built once
pytestmark = pytest.mark.xdist_group("packaging")

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "airflow_provider_pulsarstate"
SPARK_RUNTIME = {"pyspark", "pyspark-client", "pyarrow", "apache-airflow-providers-apache-spark"}


def _uv() -> str:
    beside = Path(sys.executable).with_name("uv")  # the [test] extra installs it
    found = str(beside) if beside.exists() else shutil.which("uv")
    assert found, "uv is needed to build the wheel (pip install uv)"
    return found


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    src = tmp_path_factory.mktemp("src")
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, src / name)
    shutil.copytree(ROOT / PACKAGE, src / PACKAGE, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    dist = tmp_path_factory.mktemp("dist")
    result = subprocess.run(
        [_uv(), "build", "--quiet", "--out-dir", str(dist), str(src)], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stdout + result.stderr
    (built,) = dist.glob("*.whl")
    return built


def _metadata(wheel: Path) -> Message:
    with zipfile.ZipFile(wheel) as zf:
        (name,) = [n for n in zf.namelist() if n.endswith(".dist-info/METADATA")]
        return Parser().parsestr(zf.read(name).decode())


def _requirement_name(spec: str) -> str:
    return re.split(r"[\s\[;<>=!~]", spec, maxsplit=1)[0].lower().replace("_", "-")


def test_the_wheel_carries_every_package_file(wheel: Path) -> None:
    expected = {
        path.relative_to(ROOT).as_posix()
        for path in (ROOT / PACKAGE).rglob("*")
        if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc"
    }
    with zipfile.ZipFile(wheel) as zf:
        shipped = {n for n in zf.namelist() if n.startswith(f"{PACKAGE}/")}
    assert expected - shipped == set(), "missing from the wheel (package-data in pyproject.toml?)"
    assert {
        "airflow_provider_pulsarstate/testing/pulsar_standalone/pom.xml",
        "airflow_provider_pulsarstate/testing/pulsar_standalone/standalone.conf",
    } <= shipped


def test_the_wheel_carries_the_licence_and_project_metadata(wheel: Path) -> None:
    meta = _metadata(wheel)
    assert meta["License-Expression"] == "Apache-2.0"
    assert meta.get_all("License-File") == ["LICENSE"]
    with zipfile.ZipFile(wheel) as zf:
        (licence,) = [n for n in zf.namelist() if n.endswith(".dist-info/licenses/LICENSE")]
        text = zf.read(licence).decode()
    assert text == (ROOT / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text and "END OF TERMS AND CONDITIONS" in text
    urls = dict(u.split(", ", 1) for u in meta.get_all("Project-URL") or [])
    assert {"Source", "Issues", "Documentation"} <= set(urls), urls
    with zipfile.ZipFile(wheel) as zf:
        (entry_points,) = [n for n in zf.namelist() if n.endswith(".dist-info/entry_points.txt")]
        assert "[apache_airflow_provider]" in zf.read(entry_points).decode()


def test_the_core_dependencies_hold_no_spark_runtime(wheel: Path) -> None:
    requires = _metadata(wheel).get_all("Requires-Dist") or []
    core = {_requirement_name(r) for r in requires if "extra ==" not in r}
    spark = [r for r in requires if re.search(r'extra\s*==\s*"spark"', r)]
    assert core & SPARK_RUNTIME == set(), f"Spark runtime in the core install: {sorted(core & SPARK_RUNTIME)}"
    assert {_requirement_name(r) for r in spark} >= SPARK_RUNTIME
    # pyspark and pyspark-client write the same pyspark/ directory: one exact version for both.
    pins = {_requirement_name(r): r.split(";")[0].split("==")[-1].strip() for r in spark if "==" in r}
    assert pins.get("pyspark") and pins.get("pyspark") == pins.get("pyspark-client"), spark
