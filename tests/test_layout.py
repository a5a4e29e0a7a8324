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


@pytest.mark.parametrize(
    ("module", "line", "contract"),
    [
        ("engine/manager.py", "import airflow.sdk\n", "import nothing from Airflow"),
        ("spark/views.py", "from airflow.sdk import BaseHook\n", "import nothing from Airflow"),
        ("engine/log.py", "import airflow_provider_pulsarstate.hooks.pulsarstate\n", "knows nothing of the layers"),
        ("operators/views.py", "from airflow_provider_pulsarstate.engine.recipes.table import StateTable\n", "only through the hook"),
        ("triggers/offsets.py", "from airflow_provider_pulsarstate.engine.offsets import open_async_probe\n", "only through the hook"),
        ("sensors/offsets.py", "from airflow_provider_pulsarstate.engine.offsets.consumer import PullConsumer\n", "only through the hook"),
        ("triggers/leadership.py", "from airflow_provider_pulsarstate.engine.leadership import read_leadership\n", "only through the hook"),
        ("sensors/leadership.py", "from airflow_provider_pulsarstate.engine.recipes.lease import Leases\n", "only through the hook"),
        # issue 12
        ("triggers/messages.py", "from airflow_provider_pulsarstate.engine.backends.pulsar import client_options\n", "only through the hook"),
        ("queues/pulsar.py", "from airflow_provider_pulsarstate.engine.backends import open_backend\n", "only through the hook"),
        ("engine/topic_stream.py", "import airflow.triggers.base\n", "import nothing from Airflow"),
    ],
)
def test_a_violation_breaks_the_build(tmp_path: Path, module: str, line: str, contract: str) -> None:
    shutil.copytree(ROOT / "airflow_provider_pulsarstate", tmp_path / "airflow_provider_pulsarstate",
                    ignore=shutil.ignore_patterns("__pycache__", "pulsar_standalone"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    target = tmp_path / "airflow_provider_pulsarstate" / module
    target.write_text(target.read_text() + "\n" + line)
    result = _lint(tmp_path)
    assert result.returncode != 0
    broken = [l for l in result.stdout.splitlines() if l.rstrip().endswith("BROKEN")]
    assert any(contract in l for l in broken) or contract in result.stdout.split("Broken contracts")[-1], result.stdout
