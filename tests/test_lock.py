"""The test command installs exact versions from requirements/test.lock, refreshed on purpose by dev/lock:
the lock satisfies pyproject.toml, names the Python CI tests, and a changed lock reinstalls."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import tomllib
from packaging.markers import default_environment
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parent.parent
LOCK = ROOT / "requirements" / "test.lock"
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _pins() -> dict[str, str]:
    """name -> version of every pin that applies to this interpreter."""
    env = default_environment()
    pins: dict[str, str] = {}
    for line in LOCK.read_text().splitlines():
        if not line or line.startswith((" ", "#")):
            continue
        req = Requirement(line)
        if req.marker is None or req.marker.evaluate(env):
            (spec,) = req.specifier
            pins[_canonical(req.name)] = spec.version
    return pins


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def test_the_lock_satisfies_every_declared_requirement() -> None:
    pins = _pins()
    declared = [
        *PROJECT["dependencies"],
        *PROJECT["optional-dependencies"]["spark"],
        *PROJECT["optional-dependencies"]["test"],
    ]
    unmet = []
    for text in declared:
        req = Requirement(text)
        if _canonical(req.name) == PROJECT["name"]:
            continue  # the project's own extras, listed above
        version = pins.get(_canonical(req.name))
        if version is None or not req.specifier.contains(version, prereleases=True):
            unmet.append(f"{text} (lock: {version})")
    assert unmet == [], f"requirements/test.lock is stale, run dev/lock: {unmet}"


def test_the_python_classifiers_are_the_locked_python() -> None:
    (locked,) = re.findall(r"--python-version (\d+\.\d+)", (ROOT / "dev" / "lock").read_text())
    prefix = "Programming Language :: Python :: "
    versions = {c[len(prefix) :] for c in PROJECT["classifiers"] if c.startswith(prefix) and "." in c[len(prefix) :]}
    assert versions == {locked}


def test_bootstrap_reinstalls_when_the_lock_changes(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    (repo / "dev").mkdir(parents=True)
    (repo / "requirements").mkdir()
    shutil.copy(ROOT / "dev" / "bootstrap.sh", repo / "dev" / "bootstrap.sh")
    shutil.copy(ROOT / "pyproject.toml", repo / "pyproject.toml")
    shutil.copy(LOCK, repo / "requirements" / "test.lock")
    (repo / ".venv" / "bin").mkdir(parents=True)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "uv-calls"
    stubs = {"uv": f'echo "$*" >> {calls}\n', "java": "", "mvn": "", "python": ""}
    for name, body in stubs.items():
        target = repo / ".venv" / "bin" / "python" if name == "python" else bin_dir / name
        target.write_text(f"#!/bin/sh\n{body}exit 0\n")
        target.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}

    def bootstrap() -> list[str]:
        before = calls.read_text().splitlines() if calls.exists() else []
        result = subprocess.run(
            ["bash", "dev/bootstrap.sh"], cwd=repo, env=env, capture_output=True, text=True, timeout=60
        )
        assert result.returncode == 0, result.stdout + result.stderr
        after = calls.read_text().splitlines() if calls.exists() else []
        return after[len(before) :]

    first = bootstrap()
    assert any(c.startswith("pip sync") and c.endswith("requirements/test.lock") for c in first), first
    assert any(c.startswith("pip install") and "--no-deps -e ." in c for c in first), first
    # compiled at install: PYTHONDONTWRITEBYTECODE would otherwise make every process compile Airflow
    assert all("--compile-bytecode" in c for c in first if c.startswith(("pip sync", "pip install"))), first
    assert bootstrap() == []  # nothing changed: nothing to do
    with (repo / "requirements" / "test.lock").open("a") as lock:
        lock.write("# refreshed\n")
    assert any(c.startswith("pip sync") for c in bootstrap())
