"""A watcher that reports, from inside a real trigger runner, what its full garbage collections walk.

``GcProbeTrigger(report=path, expect=n)`` waits until ``n`` asyncio tasks run in its process (the
other triggers started), then writes JSON to ``report``: its pid and parent pid, the objects frozen
(``gc.get_freeze_count()``), the objects a full collection walks (every tracked object not frozen),
the running tasks (at its own start and at the report), and, from its start to the report, the full
collections with the longest pause (CPU time of the collecting thread) and the loop's worst stall
(``LoopLag``: lateness of a 10 ms ticker, minus time waiting for a CPU), then the CPU time of one
full collection it runs itself (what such a pause costs the runner's loop). It never fires.
"""

from __future__ import annotations

import asyncio
import gc
import json
import os
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from airflow.triggers.base import BaseEventTrigger, TriggerEvent

from airflow_provider_pulsarstate.testing.airflow_processes import AirflowProcesses
from tests.airflow.trigger_driver import LoopLag

SITECUSTOMIZE = (  # the two lines README documents
    "from airflow_provider_pulsarstate.triggerer_gc import freeze_triggerer_imports\n\nfreeze_triggerer_imports()\n"
)


class _FullCollections:
    def __init__(self) -> None:
        self.count, self.longest, self._started = 0, 0.0, 0.0

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if info.get("generation") != 2:
            return
        if phase == "start":
            self._started = time.thread_time()
        else:
            self.count += 1
            self.longest = max(self.longest, time.thread_time() - self._started)


class GcProbeTrigger(BaseEventTrigger):
    def __init__(self, *, report: str, expect: int) -> None:
        super().__init__()
        self.report, self.expect = report, expect

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return f"{type(self).__module__}.{type(self).__qualname__}", {"report": self.report, "expect": self.expect}

    async def run(self) -> AsyncIterator[TriggerEvent]:
        collections = _FullCollections()
        gc.callbacks.append(collections)
        try:
            tasks_at_start = len(asyncio.all_tasks())
            async with LoopLag() as lag:
                deadline = time.monotonic() + 120
                while len(asyncio.all_tasks()) < self.expect and time.monotonic() < deadline:
                    await asyncio.sleep(0.2)
                await asyncio.sleep(2)  # the last ones' first reads
            objects = gc.get_objects()  # the permanent generation is not listed
            walked = len(objects)
            kinds: dict[str, int] = {}
            for obj in objects:
                kinds[type(obj).__name__] = kinds.get(type(obj).__name__, 0) + 1
            del objects
            gc.callbacks.remove(collections)
            cpu = time.thread_time()
            gc.collect()  # what one full collection costs this runner's loop now
            full_collection_cpu = time.thread_time() - cpu
            report = {
                "pid": os.getpid(),
                "ppid": os.getppid(),
                "frozen": gc.get_freeze_count(),
                "walked": walked,
                "full_collection_cpu": full_collection_cpu,
                "tasks": len(asyncio.all_tasks()),
                "tasks_at_probe_start": tasks_at_start,
                "worst_loop_stall": lag.worst,
                "full_collections": collections.count,
                "longest_full_collection": collections.longest,
                "walked_types": dict(sorted(kinds.items(), key=lambda kv: -kv[1])[:12]),
            }
            tmp = Path(self.report + ".tmp")
            tmp.write_text(json.dumps(report))
            tmp.replace(self.report)
            await asyncio.Event().wait()
        finally:
            if collections in gc.callbacks:
                gc.callbacks.remove(collections)
        yield TriggerEvent(None)  # pragma: no cover - never reached


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
probe = Asset("gc-probe", watchers=[AssetWatcher(name="probe", trigger=GcProbeTrigger(report=REPORT, expect=2 * WATCHERS))])


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


@dataclass
class Run:
    report: dict[str, Any]
    triggerer_pid: int
    triggerer_log: str
    dag_processor_log: str


def run_many_watchers(
    tmp: Path, *, migrated_db: Path, watchers: int, freeze: bool, timeout: float = 150, slow_turns: Path | None = None
) -> Run:
    """A dag-processor and a real ``airflow triggerer`` (with the documented sitecustomize on its
    PYTHONPATH only when ``freeze``) running ``watchers`` StateChangeTrigger watchers (embedded back
    end, one stream each) and the probe; returns the probe's report once written. ``slow_turns``:
    the triggerer's loop turns over 50 ms go to that file (``tests/airflow/slow_turns.py``)."""
    root = str(Path(__file__).resolve().parents[2])
    report, dags, site, home = tmp / "report.json", tmp / "dags", tmp / "site", tmp / "airflow"
    dags.mkdir()
    site.mkdir()
    (home / "pulsarstate").mkdir(parents=True, mode=0o700)  # the embedded default's directory
    (dags / "many_watchers.py").write_text(
        DAG.replace("__WATCHERS__", str(watchers)).replace("__REPORT__", repr(str(report)))
    )
    site_lines = SITECUSTOMIZE if freeze else ""
    if slow_turns is not None:
        site_lines += (
            "\nimport sys\n\nif len(sys.argv) > 1 and sys.argv[1] == 'triggerer':\n"
            f"    from tests.airflow.slow_turns import install\n\n    install({str(slow_turns)!r})\n"
        )
    (site / "sitecustomize.py").write_text(site_lines)
    triggerer_path = f"{site}:{root}" if site_lines else root
    with AirflowProcesses(
        home=home,
        dags_folder=dags,
        # a thousand watchers written by the dag-processor while the triggerer heartbeats: wait
        # for SQLite's lock instead of failing the triggerer's job row ("database is locked")
        env={
            "PYTHONPATH": root,
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home / 'airflow.db'}?timeout=60",
            # the embedded log, named: the runner's lookup of an undefined connection takes ~20 s
            "AIRFLOW_CONN_PULSARSTATE_DEFAULT": json.dumps(
                {"conn_type": "pulsarstate", "extra": {"service_url": str(home / "pulsarstate" / "state.db")}}
            ),
        },
        components=("dag-processor", "triggerer"),
        metadata_db=migrated_db,
        component_env={"triggerer": {"PYTHONPATH": triggerer_path}},
    ) as af:
        deadline = time.monotonic() + timeout
        while not report.exists():
            if not (af.alive("triggerer") and af.alive("dag-processor")) or time.monotonic() > deadline:
                raise AssertionError(f"no probe report\n--- triggerer:\n{af.tail('triggerer')}")
            time.sleep(0.5)
        return Run(
            json.loads(report.read_text()),
            af._procs["triggerer"].pid,
            af.log_path("triggerer").read_text(errors="replace"),
            af.log_path("dag-processor").read_text(errors="replace"),
        )
