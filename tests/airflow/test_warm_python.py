"""The warm parent that pipeline-worker tests fork their ``dag.test()`` processes from behaves as
``python script.py args`` would: arguments, environment, exit code, SIGKILL, atexit, output."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.airflow.warm_python import run_warm

SCRIPT = """
import atexit, os, signal, sys, time
print("argv", sys.argv[1:], "env", os.environ.get("WARM_TEST"), "main", __name__, "sys.path[0]", sys.path[0])
print("to stderr", file=sys.stderr)
atexit.register(lambda: print("atexit ran", flush=True))
if sys.argv[1] == "kill":
    os.kill(os.getpid(), signal.SIGKILL)
if sys.argv[1] == "sleep":
    time.sleep(120)
if sys.argv[1] == "raise":
    raise ValueError("boom")
sys.exit(int(sys.argv[2]))
"""


@pytest.fixture(scope="module")
def script(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("warm") / "script.py"
    path.write_text(SCRIPT)
    return path


def test_a_forked_script_sees_its_arguments_environment_and_exit_code(script: Path) -> None:
    env = {**os.environ, "WARM_TEST": "one"}
    done = run_warm(script, ["exit", "3"], env=env, timeout=300)
    assert done.returncode == 3
    assert done.stdout.splitlines() == [
        f"argv ['exit', '3'] env one main __main__ sys.path[0] {script.parent}",
        "atexit ran",
    ]
    assert done.stderr == "to stderr\n"
    other = run_warm(script, ["exit", "0"], env={**env, "WARM_TEST": "two"}, timeout=300)  # same parent
    assert other.returncode == 0 and "env two" in other.stdout


def test_a_killed_or_failing_script_reports_as_a_process_would(script: Path) -> None:
    killed = run_warm(script, ["kill"], env=dict(os.environ), timeout=300)
    assert killed.returncode == -9 and "atexit ran" not in killed.stdout
    failed = run_warm(script, ["raise"], env=dict(os.environ), timeout=300)
    assert failed.returncode == 1 and "ValueError: boom" in failed.stderr
    with pytest.raises(subprocess.TimeoutExpired):
        run_warm(script, ["sleep"], env=dict(os.environ), timeout=1)


def test_the_parent_forks_with_airflow_imported_and_no_thread_left(script: Path) -> None:
    probe = script.with_name("probe.py")
    probe.write_text("import sys, threading\nprint('airflow' in sys.modules, threading.active_count())\n")
    done = run_warm(probe, env=dict(os.environ), timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True", "1"]
