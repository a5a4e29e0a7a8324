"""A failed Pulsar test's report ends with the tail of the broker log (tests/conftest.py's hook);
a failed test that used no broker gets none, and a passing one nothing."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

_TESTS = """
import pytest

@pytest.mark.pulsar
def test_pulsar_fails():
    assert False, "pulsar test failed"

@pytest.mark.pulsar
def test_pulsar_passes():
    pass

def test_plain_fails():
    assert False, "plain test failed"
"""


def test_a_failed_pulsar_test_reports_the_last_lines_of_the_broker_log(tmp_path: Path) -> None:
    log = tmp_path / "broker.log"
    log.write_text("".join(f"broker line {i:03d}\n" for i in range(120)))
    (tmp_path / "test_inner.py").write_text(_TESTS)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PULSARSTATE_TEST_BROKER_LOG": str(log)}
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "tests.conftest",
            "-p",
            "no:cacheprovider",
            "-p",
            "no:xdist",
            "-q",
            "--rootdir",
            str(tmp_path),
            str(tmp_path / "test_inner.py"),
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    out = result.stdout
    assert "2 failed, 1 passed" in out, out[-3000:]
    assert out.count(f"last 50 lines of {log}") == 1, out[-3000:]
    section = out.split(f"last 50 lines of {log}")[1].split("short test summary")[0]
    assert "broker line 119" in section and "broker line 070" in section and "broker line 069" not in section, section
    plain = out.split("test_plain_fails")[1]
    assert "broker line" not in plain.split("short test summary")[0], out[-3000:]
