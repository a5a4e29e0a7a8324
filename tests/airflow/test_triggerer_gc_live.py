"""Acceptance: the documented triggerer setting (a ``sitecustomize.py`` calling
``freeze_triggerer_imports()``, on the triggerer's ``PYTHONPATH`` only) takes effect in a real
``airflow triggerer`` running many watchers (dag-processor and triggerer, SQLite, embedded back end).

Measured inside the trigger runner (the triggerer's forked child) by a probe watcher: the objects
frozen, and what a full garbage collection there walks (every tracked object not frozen); counts,
never time. The other components run without the setting. About 40-60 s here (a DB copy, two
components, the triggerer importing Airflow, the provider and the client library before it starts);
`benchmarks/bench_triggerer_gc.py` runs the same with 1,000 watchers, with and without the setting.
"""

from __future__ import annotations

from pathlib import Path

from tests.airflow.gc_probe import run_many_watchers

WATCHERS = 100


def test_the_documented_sitecustomize_freezes_the_imports_of_a_real_trigger_runner(
    tmp_path: Path, migrated_db: Path
) -> None:
    run = run_many_watchers(tmp_path, migrated_db=migrated_db, watchers=WATCHERS, freeze=True)
    got = run.report
    print(f"trigger runner with {WATCHERS} watchers: {got}")
    # the probe ran in the triggerer's forked runner, not in the supervisor, with the watchers running
    assert got["ppid"] == run.triggerer_pid and got["pid"] != run.triggerer_pid
    assert got["tasks"] >= 2 * WATCHERS, got  # each watcher: its run and its stream
    # the freeze happened in the triggerer only, and the runner inherited it
    assert "pulsarstate triggerer_gc: froze" in run.triggerer_log and "triggerer_gc" not in run.dag_processor_log
    assert got["frozen"] > 150_000, got  # Airflow's, the providers' and the client library's objects
    # a full collection in the runner walks a fraction of the process's objects, not all of them
    # (without the freeze in the runner itself, the supervisor's ~100,000 later objects stayed)
    assert got["walked"] < got["frozen"] / 4, got
