"""start_from_trigger with a real ``airflow scheduler`` and ``airflow triggerer`` (LocalExecutor, SQLite).

``dag.test()`` bypasses start_from_trigger, so this runs the real processes: the scheduler
defers the sensor straight to the triggerer, the triggerer renders its templated fields, polls
the embedded log and ends the task with its XCom. No API server runs, so a worker could not run
the task at all; the sensor's execute()/execute_complete() also leave a marker file if called.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sqlite3
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any, Callable

import pytest

from airflow_provider_pulsarstate.hooks.pulsarstate import PulsarStateHook
from airflow_provider_pulsarstate.testing.airflow_processes import free_port

from tests.airflow.conftest import AIRFLOW_BIN

LIVE_DAG = Path(__file__).resolve().parent / "dags_live" / "start_from_trigger_dag.py"
DAG_ID = "offset_sensor_start_from_trigger"


def _wait(what: str, probe: Callable[[], Any], timeout: float, logs: list[Path]) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = probe()
        if value:
            return value
        time.sleep(0.5)
    tails = "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-4000:]}" for p in logs if p.exists())
    pytest.fail(f"timed out after {timeout}s waiting for {what}\n{tails}")


_DB: Path | None = None  # the test's own metadata DB (set by the test)


def _query(sql: str, *args: Any) -> list[tuple[Any, ...]]:
    assert _DB is not None
    conn = sqlite3.connect(_DB, timeout=30)
    try:
        return conn.execute(sql, args).fetchall()
    finally:
        conn.close()


def _ti_state(run_id: str) -> str | None:
    rows = _query("SELECT state FROM task_instance WHERE dag_id = ? AND run_id = ? AND task_id = 'wait'", DAG_ID, run_id)
    return None if not rows or rows[0][0] is None else str(rows[0][0])


@pytest.mark.slow
def test_start_from_trigger_completes_the_task_without_a_worker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Its own AIRFLOW_HOME and metadata DB: triggers and runs left by the session's dag.test() runs
    # must not reach this scheduler and triggerer. State: one embedded file, shared explicitly.
    home = tmp_path / "airflow-home"
    home.mkdir()
    global _DB
    _DB = home / "airflow.db"
    state_conn = json.dumps({"conn_type": "pulsarstate", "extra": {"service_url": str(tmp_path / "state.db")}})
    monkeypatch.setenv("AIRFLOW_CONN_PULSARSTATE_DEFAULT", state_conn)
    dags = tmp_path / "dags"
    dags.mkdir()
    shutil.copy(LIVE_DAG, dags / LIVE_DAG.name)
    bundle = [{
        "name": "live", "classpath": "airflow.dag_processing.bundles.local.LocalDagBundle",
        "kwargs": {"path": str(dags), "refresh_interval": 0},
    }]
    env = {
        **os.environ,
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{_DB}",
        "AIRFLOW_CONN_PULSARSTATE_DEFAULT": state_conn,
        "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
        "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "False",
        "AIRFLOW__DAG_PROCESSOR__DAG_BUNDLE_CONFIG_LIST": json.dumps(bundle),
        "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": "http://127.0.0.1:9/execution/",  # nothing listens: no worker can run
        # the log servers' fixed default ports (8793/8794) may be taken by another Airflow on this host
        "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(free_port()),
        "AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT": str(free_port()),
    }
    for args in (["db", "migrate"], ["dags", "reserialize", "--bundle-name", "live"]):
        done = subprocess.run([AIRFLOW_BIN, *args], env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]

    topic = f"live-{uuid.uuid4().hex[:10]}"
    marker = tmp_path / "worker-ran"
    with PulsarStateHook() as hook:
        full = hook.create_topic(topic)
        publisher = hook.get_publisher(full)
        for i in range(2):
            publisher.send(f"before-{i}".encode())
        publisher.flush(timeout=30)

    logs = [tmp_path / "scheduler.log", tmp_path / "triggerer.log"]
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for name, log in zip(("scheduler", "triggerer"), logs):
            with open(log, "wb") as out:
                procs.append(subprocess.Popen(
                    [AIRFLOW_BIN, name], env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
                ))
        run_id = f"live__{uuid.uuid4().hex[:8]}"
        conf = {"topic": topic, "target": 5, "marker": str(marker)}
        triggered = subprocess.run(
            [AIRFLOW_BIN, "dags", "trigger", DAG_ID, "--run-id", run_id, "--conf", json.dumps(conf)],
            env=env, capture_output=True, text=True, timeout=300,
        )
        assert triggered.returncode == 0, triggered.stdout[-3000:] + triggered.stderr[-3000:]

        def deferred() -> bool:
            state = _ti_state(run_id)
            assert state not in ("failed", "up_for_retry", "success", "skipped"), f"the sensor ended {state} without deferring"
            return state == "deferred"

        _wait("the sensor to be deferred", deferred, 180, logs)
        time.sleep(1.0)  # the trigger polls 2 of 5 messages a few times
        assert _ti_state(run_id) == "deferred"
        with PulsarStateHook() as hook:
            publisher = hook.get_publisher(full)
            for i in range(3):
                publisher.send(f"after-{i}".encode())
            publisher.flush(timeout=30)
        state = _wait("the sensor to finish", lambda: _ti_state(run_id) in ("success", "failed", "skipped", "up_for_retry") and _ti_state(run_id), 120, logs)
        assert state == "success", f"the sensor ended {state}\n" + "\n".join(
            f"--- {p.name}\n{p.read_text(errors='replace')[-6000:]}" for p in logs if p.exists()
        )

        rows = _query("SELECT value FROM xcom WHERE dag_id = ? AND run_id = ? AND key = 'return_value'", DAG_ID, run_id)
        values = []
        for (value,) in rows:
            while isinstance(value, (str, bytes)):  # the DB column holds the serialized value as JSON text
                value = json.loads(value)
            values.append(value)
        assert len(values) == 1
        seen = values[0]
        assert seen["met"] and seen["topic"] == full and seen["value"] == 5 and seen["target"] == 5  # rendered in the triggerer
        assert not marker.exists(), marker.read_text()
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
