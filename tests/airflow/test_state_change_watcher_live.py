"""Acceptance: a view apply schedules ``dags/price_table_changes.py`` through an AssetWatcher
with StateChangeTrigger (real ``airflow triggerer``, ``scheduler``, ``dag-processor`` and
``api-server``; LocalExecutor, SQLite; the trigger's watermark in Airflow's own asset state
store), on both back ends (embedded: the default, no connection at all).

1. One view apply -> exactly one asset event and one DAG run, whose task read exactly that
   commit's changes.
2. The triggerer's supervisor is frozen (SIGSTOP) so the trigger receives the next apply but its
   event cannot be stored; after a few poll intervals the triggerer is killed (SIGKILL) and
   started again -> the apply arrives once: one more asset event and one more run, nothing lost,
   nothing doubled.

Over 60 s (about 100-150 s per back end here: a DB migration, four Airflow components, two task
runs, and a triggerer restart that waits for the old triggerer's heartbeat to lapse).
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_pulsarstate import ConnectionConfig, open_backend
from airflow_provider_pulsarstate.engine.recipes.table import StateTable
from airflow_provider_pulsarstate.testing.airflow_processes import AirflowProcesses
from tests.airflow.dagruns import EXAMPLE_DAGS

DAG_ID = "price_table_changes"
ASSET = "pulsarstate-price-table-applies"


def _query(db: Path, sql: str, *args: Any) -> list[tuple]:
    conn = sqlite3.connect(db, timeout=30)
    try:
        return conn.execute(sql, args).fetchall()
    finally:
        conn.close()


def asset_events(db: Path) -> list[dict]:
    rows = _query(
        db, "SELECT e.extra FROM asset_event e JOIN asset a ON a.id = e.asset_id WHERE a.name = ? ORDER BY e.id", ASSET
    )
    return [(json.loads(extra) if isinstance(extra, str) else extra)["payload"] for (extra,) in rows]


def stored_latency(db: Path, offset: int) -> float:
    """Seconds from the commit's publish time to its stored asset event (the event's timestamp, UTC)."""
    from datetime import datetime, timezone

    for stamp, extra in _query(db, "SELECT e.timestamp, e.extra FROM asset_event e ORDER BY e.id"):
        payload = (json.loads(extra) if isinstance(extra, str) else extra)["payload"]
        if payload["offset"] == offset:
            stored = datetime.fromisoformat(stamp).replace(tzinfo=timezone.utc).timestamp()
            return stored - payload["publish_time"]
    raise AssertionError(f"no asset event of offset {offset}")


def watermark(db: Path) -> dict | None:
    rows = _query(
        db,
        "SELECT s.value FROM asset_state_store s JOIN asset a ON a.id = s.asset_id WHERE a.name = ? AND s.key LIKE ?",
        ASSET,
        "pulsarstate.state_change:%",
    )
    return json.loads(rows[0][0]) if rows else None


def wait(predicate: Any, what: str, af: AirflowProcesses, timeout: float = 180) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := predicate():
            return value
        time.sleep(0.5)
    raise AssertionError(
        f"timed out waiting for {what}\n--- triggerer:\n{af.tail('triggerer')}\n--- scheduler:\n{af.tail('scheduler')}"
    )


def apply_view(table: StateTable, prices: dict[str, float]) -> Any:
    view = table.create_view(scope_prefix="sku-")
    with table.stager(view.view_id) as stager:
        for sku, price in prices.items():
            stager.set(sku, {"price": price, "currency": "EUR"})
    table.seal(view.view_id, stagers=[stager])
    return table.apply(view.view_id, max_delete_fraction=None)


@pytest.mark.parametrize("back_end", ["embedded", pytest.param("pulsar", marks=pytest.mark.pulsar)])
def test_a_view_apply_runs_the_dag_once_even_when_the_triggerer_dies_before_storing_it(
    tmp_path: Path, back_end: str, request: pytest.FixtureRequest, migrated_db: Path
) -> None:
    table_name = f"price-table-{uuid.uuid4().hex[:8]}"  # the session broker outlives this test
    dags = tmp_path / "dags"
    dags.mkdir()
    source = (EXAMPLE_DAGS / "price_table_changes.py").read_text()
    assert 'TABLE_TOPIC = "price-table"' in source and "POLL_INTERVAL = 5.0" in source
    (dags / "price_table_changes.py").write_text(
        source.replace('TABLE_TOPIC = "price-table"', f'TABLE_TOPIC = "{table_name}"').replace(
            "POLL_INTERVAL = 5.0", "POLL_INTERVAL = 1.0"
        )
    )
    env = {"AIRFLOW__TRIGGERER__TRIGGERER_HEALTH_CHECK_THRESHOLD": "5"}
    home = tmp_path / "airflow"
    if back_end == "pulsar":
        broker = request.getfixturevalue("pulsar_broker")
        extra = {"service_url": broker.service_url, "admin_url": broker.admin_url, "operation_timeout": 30}
        env["AIRFLOW_CONN_PULSARSTATE_DEFAULT"] = json.dumps({"conn_type": "pulsarstate", "extra": extra})
        config = ConnectionConfig(url=broker.service_url, admin_url=broker.admin_url)
    else:  # the embedded default: no connection; the tasks and the trigger use $AIRFLOW_HOME/pulsarstate/state.db
        config = ConnectionConfig(url=str(home / "pulsarstate" / "state.db"))
    (home / "pulsarstate").mkdir(parents=True, mode=0o700)
    backend = open_backend(config)
    table = StateTable(backend, config.topic_name(table_name), writer_idle_timeout=0.1)
    db = home / "airflow.db"
    try:
        apply_view(table, {f"sku-{i}": 10.0 + i for i in range(20)})  # before the watcher: not an event
        with AirflowProcesses(home=home, dags_folder=dags, env=env, metadata_db=migrated_db) as af:
            af.wait_for_dag(DAG_ID)
            start = wait(lambda: watermark(db), "the trigger's first watermark", af)
            assert start["offset"] == table.manager.applied_offset

            # 1. one apply -> one asset event -> one run that read exactly that commit
            first = apply_view(table, {**{f"sku-{i}": 10.0 + i for i in range(20)}, "sku-3": 99.0, "sku-20": 5.0})
            wait(lambda: [r for r in af.runs(DAG_ID) if r["state"] == "success"], "the first run", af)
            assert [e["offset"] for e in asset_events(db)] == [first.commit_offset]
            (run,) = af.runs(DAG_ID)
            (summary,) = af.xcom(DAG_ID, run["dag_run_id"], "report_changes")
            assert (summary["offset"], summary["view_id"], summary["sets"], summary["deletes"]) == (
                first.commit_offset,
                first.view_id,
                2,
                0,
            )
            assert sorted(summary["set_keys"]) == ["sku-20", "sku-3"] and summary["changes"] == 2
            latency = stored_latency(db, first.commit_offset)
            print(f"{back_end}: apply published -> asset event stored in {latency:.2f}s (poll interval 1 s)")

            # 2. received but not stored: freeze the supervisor (the trigger runner, its child, keeps
            #    polling), apply, let 5 poll intervals pass, kill the triggerer, start it again
            supervisor = af._procs["triggerer"].pid  # the `airflow triggerer` process itself, not its runner child
            os.kill(supervisor, signal.SIGSTOP)
            try:
                second = apply_view(table, {**{f"sku-{i}": 10.0 + i for i in range(20)}, "sku-3": 99.0})
                time.sleep(5)
                assert len(asset_events(db)) == 1 and watermark(db)["offset"] < second.commit_offset
            finally:
                af.kill("triggerer")
            af.start_component("triggerer")
            wait(
                lambda: len([r for r in af.runs(DAG_ID) if r["state"] == "success"]) == 2,
                "the run of the redelivered apply",
                af,
            )
            wait(lambda: watermark(db)["offset"] >= second.commit_offset, "the watermark past the second apply", af)
            time.sleep(3)  # a few more polls: nothing more may come
            assert [e["offset"] for e in asset_events(db)] == [first.commit_offset, second.commit_offset]
            runs = af.runs(DAG_ID)
            assert len(runs) == 2
            (summary,) = af.xcom(DAG_ID, runs[1]["dag_run_id"], "report_changes")
            assert (summary["offset"], summary["sets"], summary["deletes"], summary["delete_keys"]) == (
                second.commit_offset,
                0,
                1,
                ["sku-20"],
            )
    finally:
        table.close()
        backend.close()
