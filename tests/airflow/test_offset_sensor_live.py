"""start_from_trigger with a real ``airflow scheduler`` and ``airflow triggerer`` (LocalExecutor, SQLite).

``dag.test()`` bypasses start_from_trigger, so this runs the real processes: the scheduler
defers the sensor straight to the triggerer, the triggerer renders its templated fields, polls
the embedded log and ends the task with its XCom. No API server runs, so a worker could not run
the task at all; the sensor's execute()/execute_complete() also leave a marker file if called.
Both sensors: OffsetProgressSensor (messages arrive) and LeadershipSensor (a named writer takes
the topic).
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
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_pulsarstate.hooks.pulsarstate import PulsarStateHook
from airflow_provider_pulsarstate.testing.airflow_processes import free_port
from tests.airflow.conftest import AIRFLOW_BIN
from tests.airflow.metadata_db import copy_airflow_db

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


class _Live:
    """A scheduler and a triggerer of their own (AIRFLOW_HOME, metadata DB) over one embedded state file."""

    def __init__(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, dag_file: Path, dag_id: str, migrated_db: Path
    ) -> None:
        # Its own AIRFLOW_HOME and metadata DB: triggers and runs left by the session's dag.test() runs
        # must not reach this scheduler and triggerer. State: one embedded file, shared explicitly.
        global _DB
        home = tmp_path / "airflow-home"
        home.mkdir()
        _DB = home / "airflow.db"
        self.dag_id = dag_id
        state_conn = json.dumps({"conn_type": "pulsarstate", "extra": {"service_url": str(tmp_path / "state.db")}})
        monkeypatch.setenv("AIRFLOW_CONN_PULSARSTATE_DEFAULT", state_conn)
        dags = tmp_path / "dags"
        dags.mkdir()
        shutil.copy(dag_file, dags / dag_file.name)
        bundle = [
            {
                "name": "live",
                "classpath": "airflow.dag_processing.bundles.local.LocalDagBundle",
                "kwargs": {"path": str(dags), "refresh_interval": 0},
            }
        ]
        self.env = {
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
        copy_airflow_db(migrated_db, _DB)
        done = subprocess.run(
            [AIRFLOW_BIN, "dags", "reserialize", "--bundle-name", "live"],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        self.logs = [tmp_path / "scheduler.log", tmp_path / "triggerer.log"]
        self.procs: list[subprocess.Popen[bytes]] = []

    def __enter__(self) -> _Live:
        for name, log in zip(("scheduler", "triggerer"), self.logs):
            with open(log, "wb") as out:
                self.procs.append(
                    subprocess.Popen(
                        [AIRFLOW_BIN, name], env=self.env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
                    )
                )
        return self

    def __exit__(self, *exc: object) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)

    def state(self, run_id: str) -> str | None:
        rows = _query(
            "SELECT state FROM task_instance WHERE dag_id = ? AND run_id = ? AND task_id = 'wait'", self.dag_id, run_id
        )
        return None if not rows or rows[0][0] is None else str(rows[0][0])

    def trigger_and_wait_deferred(self, conf: dict[str, Any]) -> str:
        run_id = f"live__{uuid.uuid4().hex[:8]}"
        triggered = subprocess.run(
            [AIRFLOW_BIN, "dags", "trigger", self.dag_id, "--run-id", run_id, "--conf", json.dumps(conf)],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert triggered.returncode == 0, triggered.stdout[-3000:] + triggered.stderr[-3000:]

        def deferred() -> bool:
            state = self.state(run_id)
            assert state not in ("failed", "up_for_retry", "success", "skipped"), (
                f"the sensor ended {state} without deferring"
            )
            return state == "deferred"

        _wait("the sensor to be deferred", deferred, 180, self.logs)
        return run_id

    def finished(self, run_id: str) -> Any:
        """Wait for the run's sensor to end with success; its XCom return value."""
        done = ("success", "failed", "skipped", "up_for_retry")
        state = _wait("the sensor to finish", lambda: self.state(run_id) in done and self.state(run_id), 120, self.logs)
        assert state == "success", f"the sensor ended {state}\n" + "\n".join(
            f"--- {p.name}\n{p.read_text(errors='replace')[-6000:]}" for p in self.logs if p.exists()
        )
        rows = _query(
            "SELECT value FROM xcom WHERE dag_id = ? AND run_id = ? AND key = 'return_value'", self.dag_id, run_id
        )
        values = []
        for (value,) in rows:
            while isinstance(value, (str, bytes)):  # the DB column holds the serialized value as JSON text
                value = json.loads(value)
            values.append(value)
        assert len(values) == 1
        return values[0]


@pytest.mark.slow
def test_start_from_trigger_completes_the_task_without_a_worker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, migrated_db: Path
) -> None:
    live = _Live(tmp_path, monkeypatch, LIVE_DAG, DAG_ID, migrated_db)
    topic = f"live-{uuid.uuid4().hex[:10]}"
    marker = tmp_path / "worker-ran"
    with PulsarStateHook() as hook:
        full = hook.create_topic(topic)
        publisher = hook.get_publisher(full)
        for i in range(2):
            publisher.send(f"before-{i}".encode())
        publisher.flush(timeout=30)
    with live:
        run_id = live.trigger_and_wait_deferred({"topic": topic, "target": 5, "marker": str(marker)})
        time.sleep(1.0)  # the trigger polls 2 of 5 messages a few times
        assert live.state(run_id) == "deferred"
        with PulsarStateHook() as hook:
            publisher = hook.get_publisher(full)
            for i in range(3):
                publisher.send(f"after-{i}".encode())
            publisher.flush(timeout=30)
        seen = live.finished(run_id)
    assert (
        seen["met"] and seen["topic"] == full and seen["value"] == 5 and seen["target"] == 5
    )  # rendered in the triggerer
    assert not marker.exists(), marker.read_text()


@pytest.mark.slow
def test_a_leadership_sensor_started_from_the_trigger_sees_the_named_writer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, migrated_db: Path
) -> None:
    from airflow_provider_pulsarstate.engine.backends.base import AcquireMode

    live = _Live(tmp_path, monkeypatch, LIVE_DAG, "leadership_sensor_start_from_trigger", migrated_db)
    topic = f"live-{uuid.uuid4().hex[:10]}"
    marker = tmp_path / "worker-ran"
    with PulsarStateHook() as hook:
        full = hook.topic_name(topic)
        other = hook.get_conn().acquire_writer(full, mode=AcquireMode.FAIL_FAST, timeout=10, name="someone-else")
        other.close()  # a leader came and went: not the one awaited
    with live:
        run_id = live.trigger_and_wait_deferred({"topic": topic, "leader": "live-leader", "marker": str(marker)})
        time.sleep(1.0)  # the trigger polls: nobody leads
        assert live.state(run_id) == "deferred"
        with PulsarStateHook() as hook:
            writer = hook.get_conn().acquire_writer(full, mode=AcquireMode.FAIL_FAST, timeout=10, name="live-leader")
            try:
                seen = live.finished(run_id)
            finally:
                writer.close()
    (partition,) = seen["partitions"]
    assert seen["met"] and seen["topic"] == full and seen["leader_name"] == "live-leader"  # rendered in the triggerer
    assert partition["leader"] == "live-leader" and partition["access_mode"] == "Exclusive" and partition["epoch"] >= 1
    assert not marker.exists(), marker.read_text()
