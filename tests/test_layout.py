"""The package layering is a checked contract: ``lint-imports`` with the contracts in pyproject.toml."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LINT = str(Path(sys.executable).with_name("lint-imports"))


def _lint(cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(cwd)}
    return subprocess.run([LINT, "--no-cache"], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def test_layering_contracts_hold() -> None:
    result = _lint(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "3 kept, 0 broken" in result.stdout


ENGINE = "reach into the engine"
LAYERS = "Layers:"


@pytest.mark.parametrize(
    ("module", "line", "contract"),
    [
        ("engine/manager.py", "import airflow.sdk\n", "import nothing from Airflow"),
        ("spark/views.py", "from airflow.sdk import BaseHook\n", "import nothing from Airflow"),
        ("engine/topic_stream.py", "import airflow.triggers.base\n", "import nothing from Airflow"),
        ("engine/wal.py", "import airflow_provider_pulsarstate.hooks.pulsarstate\n", LAYERS),
        ("engine/recipes/map.py", "from airflow_provider_pulsarstate.spark import views\n", LAYERS),
        ("hooks/pulsarstate.py", "from airflow_provider_pulsarstate.triggers import polling\n", LAYERS),
        ("xcom/backend.py", "import airflow_provider_pulsarstate.cli.commands\n", LAYERS),
        ("operators/views.py", "from airflow_provider_pulsarstate.engine.recipes.table import StateTable\n", ENGINE),
        ("triggers/offsets.py", "from airflow_provider_pulsarstate.engine.offsets import open_async_probe\n", ENGINE),
        (
            "sensors/offsets.py",
            "from airflow_provider_pulsarstate.engine.offsets.consumer import PullConsumer\n",
            ENGINE,
        ),
        (
            "triggers/leadership.py",
            "from airflow_provider_pulsarstate.engine.leadership import read_leadership\n",
            ENGINE,
        ),
        ("sensors/leadership.py", "from airflow_provider_pulsarstate.engine.recipes.lease import Leases\n", ENGINE),
        (
            "triggers/messages.py",
            "from airflow_provider_pulsarstate.engine.backends.pulsar import client_options\n",
            ENGINE,
        ),
        ("triggers/messages.py", "from airflow_provider_pulsarstate.engine.topic_stream import TopicStream\n", ENGINE),
        ("queues/pulsar.py", "from airflow_provider_pulsarstate.engine.backends import open_backend\n", ENGINE),
        ("xcom/backend.py", "import airflow_provider_pulsarstate.engine\n", ENGINE),
        # A new engine module is covered without being listed anywhere.
        ("state_store/backend.py", "from airflow_provider_pulsarstate.engine.brand_new import thing\n", ENGINE),
    ],
)
def test_a_violation_breaks_the_build(tmp_path: Path, module: str, line: str, contract: str) -> None:
    if "brand_new" in line:
        (_copy(tmp_path) / "engine" / "brand_new.py").write_text("thing = 1\n")
    _inject(tmp_path, module, line)
    _assert_broken(_lint(tmp_path), contract)


def test_a_new_subpackage_must_take_a_layer(tmp_path: Path) -> None:
    """The layers contract is exhaustive: a part nobody placed fails the build, whatever it imports."""
    package = _copy(tmp_path)
    (package / "newpart").mkdir()
    (package / "newpart" / "__init__.py").write_text("import airflow_provider_pulsarstate.engine.errors\n")
    result = _lint(tmp_path)
    assert result.returncode != 0
    assert "newpart" in result.stdout + result.stderr, result.stdout + result.stderr


def _copy(tmp_path: Path) -> Path:
    package = tmp_path / "airflow_provider_pulsarstate"
    if not package.exists():
        shutil.copytree(
            ROOT / "airflow_provider_pulsarstate",
            package,
            ignore=shutil.ignore_patterns("__pycache__", "pulsar_standalone"),
        )
        shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    return package


def _inject(tmp_path: Path, module: str, line: str) -> None:
    target = _copy(tmp_path) / module
    target.write_text(target.read_text() + "\n" + line)


def _assert_broken(result: subprocess.CompletedProcess[str], contract: str) -> None:
    assert result.returncode != 0, result.stdout
    report = result.stdout.split("Broken contracts")[-1]
    broken = [line for line in result.stdout.splitlines() if line.rstrip().endswith("BROKEN")]
    assert any(contract in line for line in broken) or contract in report, result.stdout
