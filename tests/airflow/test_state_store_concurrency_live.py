"""Acceptance: 8 concurrent tasks incrementing one state key (real api-server + scheduler,
LocalExecutor with parallelism 8, SQLite; PulsarStateStoreBackend configured on server and
workers), on both back ends. PulsarXComBackend is configured too: the 8 tasks push their XComs
at once, and every value lands in the XCom map with only a reference in the DB.

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

from airflow_provider_pulsarstate.engine.recipes.state_store import AssetStateScope, OwnedMaps, StateStore
from airflow_provider_pulsarstate.engine.recipes.xcom_messages import XComMessageLog, message_topic
from airflow_provider_pulsarstate.testing.airflow_processes import AirflowProcesses

BACKEND = "airflow_provider_pulsarstate.state_store.backend.PulsarStateStoreBackend"
XCOM_BACKEND = "airflow_provider_pulsarstate.xcom.backend.PulsarXComBackend"
REFERENCE_MARKER = "__pulsarstate_xcom__"  # what the backend's DB references carry
DAGS = Path(__file__).resolve().parent / "dags_state_live"
DAG_ID = "state_store_concurrency"
N = 5
NAMESPACE = "live"


def _db_xcoms(db: Path, run_id: str) -> list[str]:
    conn = sqlite3.connect(db, timeout=30)
    try:
        rows = conn.execute(
            "SELECT value FROM xcom WHERE dag_id = ? AND run_id = ? AND task_id = 'increment' AND key = 'return_value'",
            (DAG_ID, run_id),
        ).fetchall()
    finally:
        conn.close()
    return [v if isinstance(v, str) else bytes(v).decode() for (v,) in rows]


@pytest.mark.parametrize("back_end", ["embedded", pytest.param("pulsar", marks=pytest.mark.pulsar)])
def test_eight_concurrent_tasks_atomic_update_loses_nothing_get_set_loses(
    tmp_path: Path, back_end: str, request: pytest.FixtureRequest, migrated_db: Path
) -> None:
    if back_end == "pulsar":
        broker = request.getfixturevalue("pulsar_broker")
        extra = {"service_url": broker.service_url, "admin_url": broker.admin_url, "operation_timeout": 30}
        topic = f"airflow-state-store-{uuid.uuid4().hex[:8]}"  # the session broker outlives this test
        xcom_topic = f"airflow-xcom-{uuid.uuid4().hex[:8]}"
    else:
        extra = {"service_url": str(tmp_path / "state.db")}
        topic, xcom_topic = "airflow-state-store", "airflow-xcom"
    env = {
        "AIRFLOW_CONN_PULSARSTATE_DEFAULT": json.dumps({"conn_type": "pulsarstate", "extra": extra}),
        "AIRFLOW__PULSARSTATE__STATE_STORE_TOPIC": topic,
        "AIRFLOW__STATE_STORE__BACKEND": BACKEND,
        "AIRFLOW__WORKERS__STATE_STORE_BACKEND": BACKEND,
        "AIRFLOW__CORE__MAX_ACTIVE_TASKS_PER_DAG": "16",
        "AIRFLOW__CORE__XCOM_BACKEND": XCOM_BACKEND,
        "AIRFLOW__PULSARSTATE__XCOM_TOPIC": xcom_topic,
        "AIRFLOW__PULSARSTATE__KEY_NAMESPACE": NAMESPACE,
    }
    runs = {}
    totals = {}
    with AirflowProcesses(
        home=tmp_path / "airflow",
        dags_folder=DAGS,
        env=env,
        metadata_db=migrated_db,
        components=("api-server", "scheduler", "dag-processor"),
        parallelism=8,
    ) as af:
        af.wait_for_dag(DAG_ID)
        for pattern in ("atomic", "get_set"):
            barrier = tmp_path / f"barrier-{pattern}"
            barrier.mkdir()
            key = f"{pattern}-{uuid.uuid4().hex[:6]}"
            run_id = af.trigger(DAG_ID, conf={"pattern": pattern, "n": N, "key": key, "barrier": str(barrier)})
            state = af.wait_for_run(DAG_ID, run_id, timeout=240)
            assert state == "success", f"{pattern}: {state}\n{af.tail('scheduler')}"
            references = _db_xcoms(af.home / "airflow.db", run_id)
            assert len(references) == 8 and all(REFERENCE_MARKER in r for r in references), references
            runs[pattern] = (run_id, key)

    # what the tasks read through the context is what a plain reader of the map sees
    from airflow_provider_pulsarstate import ConnectionConfig, open_backend

    config = ConnectionConfig(url=extra["service_url"], admin_url=extra.get("admin_url", ""))
    backend = open_backend(config)
    try:
        with OwnedMaps(backend) as maps:
            store = StateStore(maps, config.topic_name(topic), namespace=NAMESPACE)
            for pattern, (run_id, key) in runs.items():
                xcom_run = message_topic(config.topic_name(xcom_topic), NAMESPACE, DAG_ID, run_id)
                with XComMessageLog(backend, xcom_run, namespace=NAMESPACE) as xcoms:  # the default layout
                    values = {
                        (m.identity.task_id, m.identity.map_index): json.loads(m.record.value_json)
                        for m in (found.message for found in xcoms.scan().messages)
                        if m is not None and m.identity.key == "return_value"
                    }
                spans = [v for (task_id, _), v in values.items() if task_id == "increment"]
                assert len(spans) == 8, values
                assert max(s["start"] for s in spans) < min(s["end"] for s in spans), "the 8 tasks did not overlap"
                seen = values[("total", -1)]
                assert store.get(AssetStateScope("pulsarstate-counter"), key) == seen, pattern
                totals[pattern] = (seen, key)
    finally:
        backend.close()
    print(f"8 tasks x {N} increments: {totals}")
    assert totals["atomic"][0] == 8 * N
    assert totals["get_set"][0] < 8 * N, f"upstream's get/set pattern lost nothing this time: {totals}"
