"""``freeze_triggerer_imports``: freezes the imports of a triggerer process only, and again in the
process it forks (the trigger runner); counts of frozen objects, never time. Each case runs in a
fresh interpreter (a freeze cannot be undone for the objects of the test session)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _run(code: str, *args: str) -> subprocess.CompletedProcess[str]:
    env_path = str(ROOT)
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={"PYTHONPATH": env_path, "PATH": "/usr/bin:/bin"},
    )


FORK = """
import gc, json, os, sys
from airflow_provider_pulsarstate.triggerer_gc import freeze_triggerer_imports
frozen = freeze_triggerer_imports(preload=["json", "decimal"])
made_after = [[i] for i in range(5000)]  # the supervisor's later long-lived objects
read, write = os.pipe()
pid = os.fork()
if pid == 0:
    os.write(write, json.dumps({"child": gc.get_freeze_count()}).encode())
    os._exit(0)
os.waitpid(pid, 0)
child = json.loads(os.read(read, 1000))["child"]
print(json.dumps({"frozen": frozen, "parent": gc.get_freeze_count(), "child": child, "decimal": "decimal" in sys.modules}))
"""


def test_a_triggerer_freezes_its_imports_and_its_runner_freezes_what_came_after() -> None:
    done = _run(FORK, "triggerer", "--capacity", "1000")
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout)
    assert got["decimal"] and got["frozen"] > 1000 and got["parent"] > got["frozen"] - 100  # refcount frees a few
    assert got["child"] >= got["frozen"] + 5000  # the 5,000 lists made after the first freeze
    assert f"froze {got['frozen']} objects" in done.stderr


def test_any_other_process_is_left_alone_and_imports_nothing() -> None:
    for argv in (["scheduler"], ["dag-processor"], ["tasks", "run", "triggerer"], []):
        done = _run(FORK, *argv)
        assert done.returncode == 0, done.stderr
        got = json.loads(done.stdout)
        assert got == {"frozen": 0, "parent": 0, "child": 0, "decimal": False}, (argv, got)
        assert done.stderr == ""


def test_a_failing_import_freezes_nothing_and_names_the_module() -> None:
    code = (
        "import gc\n"
        "from airflow_provider_pulsarstate.triggerer_gc import freeze_triggerer_imports\n"
        "print(freeze_triggerer_imports(argv=['airflow', 'triggerer'], preload=['json', 'no_such_module_xyz']),"
        " gc.get_freeze_count())\n"
    )
    done = _run(code)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["0", "0"]
    assert "importing no_such_module_xyz failed" in done.stderr


def test_the_default_preload_is_what_a_triggerer_running_our_triggers_imports() -> None:
    from airflow_provider_pulsarstate import triggerer_gc

    assert "airflow.jobs.triggerer_job_runner" in triggerer_gc.PRELOAD
    assert {f"airflow_provider_pulsarstate.triggers.{m}" for m in ("state_change", "messages")} <= set(
        triggerer_gc.PRELOAD
    )
