"""Acceptance: 8 concurrent tasks incrementing one state key (real api-server + scheduler,
LocalExecutor with parallelism 8, SQLite; PulsarStateStoreBackend configured on server and
workers), on both back ends.

The atomic update (PulsarStateHook.update_state) loses nothing; upstream's get/set pattern,
through context["asset_state_store"], loses increments (a 0.3 s gap between get and set makes
the overlap reliable; a file barrier starts the 8 tasks together).

Over 60 s (about 90-130 s per back end here: a DB migration, three Airflow components, 18 task processes):
real concurrency needs real processes; dag.test() runs tasks one after another.
"""

from __future__ import annotations

import json
import sqlite3
import uuid
from pathlib import Path

import pytest

from airflow_provider_pulsarstate.engine.recipes.state_store import AssetStateScope, StateStore
from airflow_provider_pulsarstate.testing.airflow_processes import AirflowProcesses

BACKEND = "airflow_provider_pulsarstate.state_store.backend.PulsarStateStoreBackend"
DAGS = Path(__file__).resolve().parent / "dags_state_live"
DAG_ID = "state_store_concurrency"
N = 5


def _intervals(db: Path, run_id: str) -> list[dict]:
    conn = sqlite3.connect(db, timeout=30)
    try:
        rows = conn.execute(
            "SELECT value FROM xcom WHERE dag_id = ? AND run_id = ? AND task_id = 'increment' AND key = 'return_value'",
            (DAG_ID, run_id),
        ).fetchall()
    finally:
        conn.close()
    return [json.loads(v if isinstance(v, str) else bytes(v)) for (v,) in rows]


@pytest.mark.parametrize("back_end", ["embedded", pytest.param("pulsar", marks=pytest.mark.pulsar)])
def test_eight_concurrent_tasks_atomic_update_loses_nothing_get_set_loses(
    tmp_path: Path, back_end: str, request: pytest.FixtureRequest
) -> None:
    if back_end == "pulsar":
        broker = request.getfixturevalue("pulsar_broker")
        extra = {"service_url": broker.service_url, "admin_url": broker.admin_url, "operation_timeout": 30}
        topic = f"airflow-state-store-{uuid.uuid4().hex[:8]}"  # the session broker outlives this test
    else:
        extra = {"service_url": str(tmp_path / "state.db")}
        topic = "airflow-state-store"
    env = {
        "AIRFLOW_CONN_PULSARSTATE_DEFAULT": json.dumps({"conn_type": "pulsarstate", "extra": extra}),
        "AIRFLOW__PULSARSTATE__STATE_STORE_TOPIC": topic,
        "AIRFLOW__STATE_STORE__BACKEND": BACKEND,
        "AIRFLOW__WORKERS__STATE_STORE_BACKEND": BACKEND,
        "AIRFLOW__CORE__MAX_ACTIVE_TASKS_PER_DAG": "16",
    }
    totals = {}
    with AirflowProcesses(home=tmp_path / "airflow", dags_folder=DAGS, env=env,
                          components=("api-server", "scheduler", "dag-processor"), parallelism=8) as af:
        af.wait_for_dag(DAG_ID)
        for pattern in ("atomic", "get_set"):
            barrier = tmp_path / f"barrier-{pattern}"
            barrier.mkdir()
            key = f"{pattern}-{uuid.uuid4().hex[:6]}"
            run_id = af.trigger(DAG_ID, conf={"pattern": pattern, "n": N, "key": key, "barrier": str(barrier)})
            state = af.wait_for_run(DAG_ID, run_id, timeout=240)
            assert state == "success", f"{pattern}: {state}\n{af.tail('scheduler')}"
            spans = _intervals(af.home / "airflow.db", run_id)
            assert len(spans) == 8
            assert max(s["start"] for s in spans) < min(s["end"] for s in spans), "the 8 tasks did not overlap"
            totals[pattern] = (af.xcom(DAG_ID, run_id, "total"), key)

    # what the tasks read through the context is what a plain reader of the map sees
    from airflow_provider_pulsarstate import ConnectionConfig, PulsarMap, open_backend

    config = ConnectionConfig(url=extra["service_url"], admin_url=extra.get("admin_url", ""))
    backend = open_backend(config)
    try:
        with PulsarMap(backend, config.topic_name(topic)) as table:
            store = StateStore(table)
            for pattern, (seen, key) in totals.items():
                assert store.get(AssetStateScope("pulsarstate-counter"), key) == seen, pattern
    finally:
        backend.close()
    print(f"8 tasks x {N} increments: {totals}")
    assert totals["atomic"][0] == 8 * N
    assert totals["get_set"][0] < 8 * N, f"upstream's get/set pattern lost nothing this time: {totals}"
