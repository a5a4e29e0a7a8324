"""Acceptance: a mapped task of 100 instances pushing XComs at once through a real scheduler
(api-server, scheduler and dag-processor; LocalExecutor at parallelism 16, SQLite), with
PulsarXComBackend configured, on both back ends: every instance succeeds and the downstream task
reads all 100 values; the DB holds only references, all to the run's own map.

About 2-3 minutes per back end here (100 task processes on 2 CPUs): real concurrency needs real
processes; dag.test() runs the instances one after another.
"""

from __future__ import annotations

import json
import sqlite3
import uuid
from pathlib import Path

import pytest

from airflow_provider_pulsarstate import ConnectionConfig, open_backend
from airflow_provider_pulsarstate.engine.recipes.xcom_messages import XComMessageLog, message_topic
from airflow_provider_pulsarstate.testing.airflow_processes import AirflowProcesses

XCOM_BACKEND = "airflow_provider_pulsarstate.xcom.backend.PulsarXComBackend"
DAGS = Path(__file__).resolve().parent / "dags_xcom_live"
DAG_ID = "xcom_fanout"
N = 100


def _references(db: Path, run_id: str) -> list[dict[str, object]]:
    conn = sqlite3.connect(db, timeout=30)
    try:
        rows = conn.execute(
            "SELECT value FROM xcom WHERE dag_id = ? AND run_id = ? AND task_id = 'square' AND key = 'return_value'",
            (DAG_ID, run_id),
        ).fetchall()
    finally:
        conn.close()
    return [json.loads(v if isinstance(v, str) else bytes(v).decode()) for (v,) in rows]


def _states(db: Path, run_id: str) -> dict[str, int]:
    conn = sqlite3.connect(db, timeout=30)
    try:
        return dict(
            conn.execute(
                "SELECT state, count(*) FROM task_instance WHERE dag_id = ? AND run_id = ? AND try_number = 1 "
                "GROUP BY state",
                (DAG_ID, run_id),
            ).fetchall()
        )
    finally:
        conn.close()


@pytest.mark.parametrize("back_end", ["embedded", pytest.param("pulsar", marks=pytest.mark.pulsar)])
def test_a_mapped_task_of_100_instances_pushes_at_once_and_its_downstream_reads_all(
    tmp_path: Path, back_end: str, request: pytest.FixtureRequest, migrated_db: Path
) -> None:
    if back_end == "pulsar":
        broker = request.getfixturevalue("pulsar_broker")
        extra = {"service_url": broker.service_url, "admin_url": broker.admin_url, "operation_timeout": 30}
    else:
        extra = {"service_url": str(tmp_path / "state.db")}
    namespace, xcom_topic = f"fanout-{uuid.uuid4().hex[:8]}", "airflow-xcom"
    env = {
        "AIRFLOW_CONN_PULSARSTATE_DEFAULT": json.dumps({"conn_type": "pulsarstate", "extra": extra}),
        "AIRFLOW__CORE__XCOM_BACKEND": XCOM_BACKEND,
        "AIRFLOW__PULSARSTATE__XCOM_TOPIC": xcom_topic,
        "AIRFLOW__PULSARSTATE__KEY_NAMESPACE": namespace,
        "AIRFLOW__CORE__MAX_ACTIVE_TASKS_PER_DAG": "64",
    }
    with AirflowProcesses(
        home=tmp_path / "airflow",
        dags_folder=DAGS,
        env=env,
        metadata_db=migrated_db,
        components=("api-server", "scheduler", "dag-processor"),
        parallelism=16,
    ) as af:
        af.wait_for_dag(DAG_ID)
        run_id = af.trigger(DAG_ID, conf={"n": N})
        state = af.wait_for_run(DAG_ID, run_id, timeout=900)
        states = _states(af.home / "airflow.db", run_id)
        assert state == "success", f"{state}: {states}\n{af.tail('scheduler')}"
        assert states == {"success": N + 2}, states  # every instance, no retry
        references = _references(af.home / "airflow.db", run_id)

    config = ConnectionConfig(url=extra["service_url"], admin_url=extra.get("admin_url", ""))
    topic = message_topic(config.topic_name(xcom_topic), namespace, DAG_ID, run_id)  # the default layout
    assert len(references) == N and {r["topic"] for r in references} == {topic}, references[:3]
    backend = open_backend(config)
    try:
        with XComMessageLog(backend, topic, namespace=namespace) as log:
            values = {
                (m.identity.task_id, m.identity.map_index): json.loads(m.record.value_json)
                for m in (found.message for found in log.scan().messages)
                if m is not None and m.identity.key == "return_value"
            }
    finally:
        backend.close()
    squares = {index: v for (task_id, index), v in values.items() if task_id == "square"}
    assert squares == {i: {"x": i, "square": i * i} for i in range(N)}
    # the downstream task read all 100 values (it checks them) and pushed their count
    assert values[("collect", -1)] == {"count": N, "sum_of_squares": sum(i * i for i in range(N))}
