"""Acceptance: asset watchers on Pulsar topics with a real triggerer and scheduler (LocalExecutor,
SQLite), one Airflow process set for the module.

* one published message -> exactly one asset event and one DAG run, for each of two watchers of
  one topic (PulsarMessageTrigger and MessageQueueTrigger(scheme="pulsar")), which share one
  consumer (the subscription has one consumer on the broker);
* the triggerer killed (SIGKILL) after receiving a message and before storing its asset event: after
  the restart the message comes again and exactly one asset event and one DAG run result.

Over 60 s (about 90-150 s here: a DB migration, four Airflow components, a triggerer restart
that waits for the dead triggerer's health check): watchers only run in a real triggerer.
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pulsar
import pytest
import requests

from airflow_provider_pulsarstate.testing.airflow_processes import AirflowProcesses

# the tests share one deployment (the module fixture ``live``): on one xdist worker, started once
pytestmark = [pytest.mark.pulsar, pytest.mark.xdist_group("message-watcher-live")]

DAGS = Path(__file__).resolve().parent / "dags_messages_live"


def _path(topic: str) -> str:
    return topic.replace("persistent://", "persistent/")


class _Env:
    def __init__(self, af: AirflowProcesses, broker: Any, shared: str, held: str, hold: Path, receipts: Path) -> None:
        self.af, self.broker, self.shared, self.held, self.hold, self.receipts = (
            af,
            broker,
            shared,
            held,
            hold,
            receipts,
        )

    def publish(self, topic: str, payload: bytes) -> None:
        client = pulsar.Client(self.broker.service_url)
        try:
            client.create_producer(topic, batching_enabled=False).send(payload)
        finally:
            client.close()

    def asset_events(self, name: str) -> list[dict[str, Any]]:
        conn = sqlite3.connect(self.af.home / "airflow.db", timeout=30)
        try:
            rows = conn.execute(
                "SELECT e.extra FROM asset_event e JOIN asset a ON a.id = e.asset_id WHERE a.name = ? ORDER BY e.id",
                (name,),
            ).fetchall()
        finally:
            conn.close()
        return [json.loads(extra) if isinstance(extra, str) else extra for (extra,) in rows]

    def subscription(self, topic: str, name: str) -> dict[str, Any]:
        stats = requests.get(f"{self.broker.admin_url}/admin/v2/{_path(topic)}/stats", timeout=10).json()
        return stats.get("subscriptions", {}).get(name, {})

    def wait(self, what: str, probe: Any, timeout: float = 120.0) -> Any:
        deadline = time.monotonic() + timeout
        while True:
            value = probe()
            if value:
                return value
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {what}\n--- triggerer:\n{self.af.tail('triggerer')}")
            time.sleep(0.5)

    def finished_runs(self, dag_id: str) -> list[dict[str, Any]]:
        return [r for r in self.af.runs(dag_id) if r.get("state") in ("success", "failed")]


@pytest.fixture(scope="module")
def live(pulsar_broker: Any, tmp_path_factory: pytest.TempPathFactory, migrated_db: Path) -> Iterator[_Env]:
    tmp = tmp_path_factory.mktemp("messages-live")
    shared = f"persistent://public/default/live-orders-{uuid.uuid4().hex[:8]}"
    held = f"persistent://public/default/live-held-{uuid.uuid4().hex[:8]}"
    for topic in (shared, held):  # watchers refuse topics that do not exist
        resp = requests.put(f"{pulsar_broker.admin_url}/admin/v2/{_path(topic)}", timeout=10)
        assert resp.status_code in (204, 409), resp.text
    extra = {"service_url": pulsar_broker.service_url, "admin_url": pulsar_broker.admin_url, "operation_timeout": 15}
    hold, receipts = tmp / "hold", tmp / "receipts"
    root = str(Path(__file__).resolve().parents[2])
    env = {
        "AIRFLOW_CONN_PULSARSTATE_DEFAULT": json.dumps({"conn_type": "pulsarstate", "extra": extra}),
        "PULSARSTATE_TEST_SHARED_TOPIC": shared,
        "PULSARSTATE_TEST_HELD_TOPIC": held,
        "PULSARSTATE_TEST_HOLD": str(hold),
        "PULSARSTATE_TEST_RECEIPTS": str(receipts),
        "PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH", "")) if p),
        # a restarted triggerer takes over the killed one's triggers once its heartbeat is this old
        "AIRFLOW__TRIGGERER__TRIGGERER_HEALTH_CHECK_THRESHOLD": "5",
    }
    with AirflowProcesses(
        home=tmp / "airflow", dags_folder=DAGS, env=env, parallelism=2, metadata_db=migrated_db
    ) as af:
        for dag_id in ("on_orders_a", "on_orders_b", "on_held"):
            af.wait_for_dag(dag_id)
        yield _Env(af, pulsar_broker, shared, held, hold, receipts)


def test_one_message_one_asset_event_and_one_run_per_watcher_on_one_consumer(live: _Env) -> None:
    # both watchers subscribed, through one consumer
    live.wait(
        "the shared subscription's consumer", lambda: live.subscription(live.shared, "live-watchers").get("consumers")
    )
    live.publish(live.shared, b"order-1")
    for dag_id in ("on_orders_a", "on_orders_b"):
        live.wait(f"a finished run of {dag_id}", lambda dag_id=dag_id: live.finished_runs(dag_id))
    time.sleep(3)  # room for a (wrong) second event or run
    a, b = live.asset_events("pulsar-orders-a"), live.asset_events("pulsar-orders-b")
    assert len(a) == 1 and len(b) == 1, (a, b)
    assert a[0]["payload"]["messages"][0]["payload"] == "order-1"
    assert b[0]["payload"]["messages"][0]["payload"] == "b3JkZXItMQ=="  # base64 (MessageQueueTrigger's watcher)
    for dag_id in ("on_orders_a", "on_orders_b"):
        runs = live.af.runs(dag_id)
        assert [r["state"] for r in runs] == ["success"], runs
    sub = live.subscription(live.shared, "live-watchers")
    assert len(sub["consumers"]) == 1, sub  # the two watchers share one consumer
    live.wait(
        "the message to be acknowledged", lambda: live.subscription(live.shared, "live-watchers")["msgBacklog"] == 0, 30
    )


def test_triggerer_killed_before_the_event_is_stored_redelivers_exactly_once(live: _Env) -> None:
    live.hold.touch()
    live.wait("the held subscription's consumer", lambda: live.subscription(live.held, "live-held").get("consumers"))
    live.publish(live.held, b"held-1")
    live.wait("the message to reach the apply function", lambda: live.receipts.exists() and live.receipts.read_text())
    live.af.kill("triggerer")  # SIGKILL: received, not stored
    assert live.asset_events("pulsar-held") == []
    live.hold.unlink()
    live.af.start_component("triggerer")
    events = live.wait("the asset event after the restart", lambda: live.asset_events("pulsar-held"), 180)
    live.wait("a finished run of on_held", lambda: live.finished_runs("on_held"))
    time.sleep(3)
    events = live.asset_events("pulsar-held")
    assert len(events) == 1, events
    assert events[0]["payload"]["messages"][0]["payload"] == "held-1"
    assert live.receipts.read_text().splitlines() == ["held-1", "held-1"]  # received twice: redelivered
    assert [r["state"] for r in live.af.runs("on_held")] == ["success"]
    live.wait(
        "the message to be acknowledged", lambda: live.subscription(live.held, "live-held")["msgBacklog"] == 0, 30
    )
