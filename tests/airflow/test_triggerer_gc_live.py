"""Acceptance: the documented triggerer setting (a ``sitecustomize.py`` calling
``freeze_triggerer_imports()``, on the triggerer's ``PYTHONPATH`` only) takes effect in a real
``airflow triggerer`` running many watchers (dag-processor and triggerer, SQLite, embedded back end).

Measured inside the trigger runner (the triggerer's forked child) by a probe watcher: the objects
frozen, and what a full garbage collection there walks (every tracked object not frozen); counts,
never time. The other components run without the setting. About 30-50 s here.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from airflow_provider_pulsarstate.testing.airflow_processes import AirflowProcesses
from airflow_provider_pulsarstate.triggerer_gc import PRELOAD

WATCHERS = 300

DAG = """
import pendulum
from airflow.sdk import Asset, AssetWatcher, dag

from airflow_provider_pulsarstate.triggers.state_change import StateChangeTrigger
from tests.airflow.gc_probe import GcProbeTrigger

WATCHERS, REPORT = __WATCHERS__, __REPORT__

assets = [
    Asset(
        f"gc-watch-{i}",
        watchers=[AssetWatcher(name=f"w{i}", trigger=StateChangeTrigger(table="gc-table", key_prefix=f"p{i}-", on=["keys"]))],
    )
    for i in range(WATCHERS)
]
probe = Asset("gc-probe", watchers=[AssetWatcher(name="probe", trigger=GcProbeTrigger(report=REPORT, expect=WATCHERS))])


@dag(
    dag_id="many_watchers",
    schedule=[probe, *assets],
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    is_paused_upon_creation=False,
)
def many_watchers():
    pass


many_watchers()
"""


def test_the_documented_sitecustomize_freezes_the_imports_of_a_real_trigger_runner(
    tmp_path: Path, migrated_db: Path
) -> None:
    root = str(Path(__file__).resolve().parents[2])
    report, dags, site, home = tmp_path / "report.json", tmp_path / "dags", tmp_path / "site", tmp_path / "airflow"
    dags.mkdir()
    site.mkdir()
    (home / "pulsarstate").mkdir(parents=True, mode=0o700)  # the embedded default's directory
    (dags / "many_watchers.py").write_text(
        DAG.replace("__WATCHERS__", str(WATCHERS)).replace("__REPORT__", repr(str(report)))
    )
    (site / "sitecustomize.py").write_text(  # the two lines README documents
        "from airflow_provider_pulsarstate.triggerer_gc import freeze_triggerer_imports\n\nfreeze_triggerer_imports()\n"
    )
    with AirflowProcesses(
        home=home,
        dags_folder=dags,
        env={"PYTHONPATH": root},
        components=("dag-processor", "triggerer"),
        metadata_db=migrated_db,
        component_env={"triggerer": {"PYTHONPATH": f"{site}:{root}"}},
    ) as af:
        deadline = time.monotonic() + 150
        while not report.exists():
            assert af.alive("triggerer") and af.alive("dag-processor"), af.tail("triggerer")
            assert time.monotonic() < deadline, f"no probe report\n--- triggerer:\n{af.tail('triggerer')}"
            time.sleep(0.5)
        got = json.loads(report.read_text())
        triggerer_pid = af._procs["triggerer"].pid
        log = af.log_path("triggerer").read_text(errors="replace")
        dag_processor_log = af.log_path("dag-processor").read_text(errors="replace")
    print(f"trigger runner with {WATCHERS} watchers: {got}")
    # the probe ran in the triggerer's forked runner, not in the supervisor, with the watchers running
    assert got["ppid"] == triggerer_pid and got["pid"] != triggerer_pid
    assert got["tasks"] >= WATCHERS, got
    # the freeze happened in the triggerer only, after the imports, and the runner inherited it
    assert "pulsarstate triggerer_gc: froze" in log and "triggerer_gc" not in dag_processor_log
    assert got["frozen"] > 150_000, got  # Airflow's, the providers' and the client library's objects
    # a full collection in the runner walks a fraction of the process's objects, not all of them
    assert got["walked"] < got["frozen"] / 2, got
    assert all(name.split(".")[0] in ("airflow", "airflow_provider_pulsarstate", "pulsar") for name in PRELOAD)
