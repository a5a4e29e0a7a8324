"""PulsarStateStoreBackend with real dag.test() runs on SQLite, on both back ends and in the three
configurations: server ([state_store] backend), worker ([workers] state_store_backend) and both."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import threading
import time
import uuid
from pathlib import Path
from typing import Iterator

import pytest

from airflow_provider_pulsarstate.hooks.pulsarstate import AssetStateScope, PulsarStateHook, TaskStateScope
from airflow_provider_pulsarstate.testing.airflow_processes import free_port
from tests.airflow.dagruns import TEST_DAGS, load_dag, run_dag
from tests.airflow.test_views_operators import dag_bundles  # noqa: F401

BACKEND = "airflow_provider_pulsarstate.state_store.backend.PulsarStateStoreBackend"
DAGS = TEST_DAGS / "state_store_dags.py"
ASSET_NAME = "pulsarstate-state-asset"
WARNING = "was not written through the configured state backend"


def _reset_backend_caches() -> None:
    import airflow.state
    from airflow.sdk.execution_time import context

    airflow.state._backend_instance = None
    context._get_worker_state_store_backend.cache_clear()


@pytest.fixture(params=["server", "worker", "both"])
def state_mode(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    if request.param in ("server", "both"):
        monkeypatch.setenv("AIRFLOW__STATE_STORE__BACKEND", BACKEND)
    if request.param in ("worker", "both"):
        monkeypatch.setenv("AIRFLOW__WORKERS__STATE_STORE_BACKEND", BACKEND)
    _reset_backend_caches()
    yield request.param
    monkeypatch.undo()
    _reset_backend_caches()


def _db_rows(db: Path, table: str) -> list[tuple]:
    conn = sqlite3.connect(db, timeout=30)
    try:
        return conn.execute(f"SELECT key, value FROM {table}").fetchall()  # noqa: S608 - fixed table names
    finally:
        conn.close()


def _store():
    return PulsarStateHook().get_state_store()


def test_task_and_asset_state_through_the_context(
    dag_bundles: None, state_backend: str, state_mode: str, airflow_db: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    dag = load_dag(DAGS, "state_store_basics")
    tag = uuid.uuid4().hex[:8]
    task_rows_before = _db_rows(airflow_db, "task_state_store")
    asset_rows_before = _db_rows(airflow_db, "asset_state_store")
    run = run_dag(dag, {"tag": tag})
    out = capfd.readouterr()
    assert run.state == "success", run.states
    store, x = _store(), run.xcoms

    # mapped instances kept apart: each saw only its own value
    run_id, mapped = _mapped_returns(airflow_db, "task_state")
    assert mapped == {i: {"before": "absent", "k": {"index": i}, "gone": "absent", "short": i} for i in range(3)}
    per_index = store.entries(TaskStateScope("state_store_basics", run_id, "task_state"), all_map_indices=True)
    assert {k: v for k, v in per_index.items() if k[1] == "k"} == {(i, "k"): {"index": i} for i in range(3)}

    # asset scope, keyed by the asset's name (the server resolved asset_id -> name)
    assert x["asset_state"] == {"a": [1, "two"], "b": "absent"}
    assert store.get(AssetStateScope(ASSET_NAME), f"{tag}-a") == [1, "two"]
    assert store.get(AssetStateScope(ASSET_NAME), f"{tag}-b") is None

    # a retry sees the previous try's state
    assert x["retried"] == {"attempts": [1, 2]}
    assert x["clear_all"] == {"x": "absent", "y": "absent"}

    if state_mode == "worker":
        # the DB holds references only, each naming an entry in the map
        rows = _db_rows(airflow_db, "task_state_store")
        new = [r for r in rows if r not in task_rows_before]
        assert new and all(set(json.loads(v)) == {"__airflow_state_ref__"} for _, v in new), new
        for _, v in new:
            assert store.owns(json.loads(v)["__airflow_state_ref__"])
        assets = [r for r in _db_rows(airflow_db, "asset_state_store") if r[0] == f"{tag}-a"]
        assert len(assets) == 1 and set(json.loads(assets[0][1])) == {"__airflow_state_ref__"}
    else:
        # the DB's state tables hold nothing; the hook's atomic update is what the context reads
        assert _db_rows(airflow_db, "task_state_store") == task_rows_before
        assert _db_rows(airflow_db, "asset_state_store") == asset_rows_before
        assert x["hook_update"] == {"counter": 100, "swapped": True, "refused": False}
        # expires_at honoured: retention=1 s
        time.sleep(1.2)
        short = TaskStateScope("state_store_basics", run_id, "task_state", 0)
        assert store.get(short, "k") == {"index": 0} and store.get(short, "short") is None
        from airflow_provider_pulsarstate.state_store.backend import PulsarStateStoreBackend

        assert PulsarStateStoreBackend().cleanup() >= 3
    if state_mode == "both":
        assert WARNING not in out.out + out.err


def _mapped_returns(db: Path, task_id: str) -> tuple[str, dict[int, object]]:
    """The newest run of state_store_basics and the return value of each map index of ``task_id``."""
    conn = sqlite3.connect(db, timeout=30)
    try:
        (run_id,) = conn.execute(
            "SELECT run_id FROM dag_run WHERE dag_id = 'state_store_basics' ORDER BY id DESC LIMIT 1"
        ).fetchone()
        rows = conn.execute(
            "SELECT map_index, value FROM xcom WHERE dag_id = 'state_store_basics' AND run_id = ? AND task_id = ? "
            "AND key = 'return_value'", (run_id, task_id),
        ).fetchall()
    finally:
        conn.close()
    return run_id, {i: json.loads(v) if isinstance(v, str) else json.loads(bytes(v)) for i, v in rows}


def test_a_broker_outage_fails_the_task_and_writes_nothing_to_the_db(
    dag_bundles: None, state_mode: str, airflow_db: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    dead = f"pulsar://127.0.0.1:{free_port()}"
    extra = {"service_url": dead, "admin_url": f"http://127.0.0.1:{free_port()}", "operation_timeout": 2}
    monkeypatch.setenv("AIRFLOW_CONN_PULSARSTATE_DEFAULT", json.dumps({"conn_type": "pulsarstate", "extra": extra}))
    before = _db_rows(airflow_db, "asset_state_store")
    run = run_dag(load_dag(DAGS, "state_store_outage"), {})
    out = capfd.readouterr()
    assert run.state == "failed" and run.states["write_during_outage"] == "failed", run.states
    assert "StateStoreUnavailableError" in out.out + out.err
    assert "connection 'pulsarstate_default', topic 'airflow-state-store' could not be reached" in out.out + out.err
    assert [r for r in _db_rows(airflow_db, "asset_state_store") if r[0] == "outage"] == [r for r in before if r[0] == "outage"]


def test_async_twins_run_off_the_event_loop(state_backend: str, airflow_db: Path) -> None:
    from airflow.sdk.state import AssetScope, TaskScope

    from airflow_provider_pulsarstate.state_store.backend import PulsarStateStoreBackend

    backend = PulsarStateStoreBackend()
    scope = TaskScope(dag_id="d", run_id=f"r-{uuid.uuid4().hex[:6]}", task_id="t", map_index=2)
    asset = AssetScope(name=f"async-{uuid.uuid4().hex[:6]}")
    store = _store()
    threads: list[int] = []
    original = store.table.get

    async def main() -> None:
        loop_thread = threading.get_ident()
        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0.001)

        tick = asyncio.create_task(ticker())
        await backend.aset(scope, "k", json.dumps({"v": 1}))
        assert json.loads(await backend.aget(scope, "k")) == {"v": 1}
        await backend.aset(asset, "w", "5")
        assert await backend.aget(asset, "w") == "5"
        await backend.adelete(scope, "k")
        assert await backend.aget(scope, "k") is None
        await backend.aset(scope, "k2", "1")
        await backend.aclear(scope)
        assert await backend.aget(scope, "k2") is None
        await backend.aclear(asset)
        assert await backend.aget(asset, "w") is None
        tick.cancel()
        assert loop_thread not in threads and threads, threads
        assert ticks > 0

    def recording_get(*args, **kwargs):
        threads.append(threading.get_ident())
        return original(*args, **kwargs)

    store.table.get = recording_get  # the process-wide map: the backend reads through it
    try:
        asyncio.run(main())
    finally:
        del store.table.get


def test_bad_stored_data_and_foreign_references_are_clear_errors(state_backend: str, airflow_db: Path) -> None:
    from airflow.sdk.state import TaskScope

    from airflow_provider_pulsarstate.hooks.pulsarstate import StateStoreDataError
    from airflow_provider_pulsarstate.state_store.backend import PulsarStateStoreBackend

    backend, store = PulsarStateStoreBackend(), _store()
    scope = TaskScope(dag_id="d", run_id=f"r-{uuid.uuid4().hex[:6]}", task_id="t")
    key = store.map_key(TaskStateScope(scope.dag_id, scope.run_id, scope.task_id), "k")
    store.table.put(key, "not a record")
    with pytest.raises(StateStoreDataError, match=key.replace("/", ".")):
        backend.get(scope, "k")
    with pytest.raises(StateStoreDataError, match="not JSON text"):
        backend.set(scope, "k2", "{bad")
    with pytest.raises(StateStoreDataError, match="does not name a state entry"):
        backend.deserialize_task_state_store_from_ref("other/task/x")
    store.table.delete(key)


def test_writer_idle_timeout_setting_is_checked() -> None:
    from configparser import ConfigParser

    from airflow_provider_pulsarstate.engine.errors import ConfigurationError
    from airflow_provider_pulsarstate.hooks.provider_config import load_settings

    conf = ConfigParser()
    conf.read_dict({"pulsarstate": {"state_store_writer_idle_timeout": "1.5"}})
    assert load_settings(conf).state_store_writer_idle_timeout == 1.5
    for bad in ("soon", "-1", "inf"):
        conf.read_dict({"pulsarstate": {"state_store_writer_idle_timeout": bad}})
        with pytest.raises(ConfigurationError, match=r"\[pulsarstate\] state_store_writer_idle_timeout"):
            load_settings(conf)


def test_uri_only_asset_scope_is_refused_on_workers_with_a_clear_error(state_backend: str, airflow_db: Path) -> None:
    from airflow.sdk.state import AssetScope

    from airflow_provider_pulsarstate.state_store.backend import PulsarStateStoreBackend

    with pytest.raises(ValueError, match="needs the asset's name"):
        PulsarStateStoreBackend().serialize_asset_state_store_to_ref(value=1, key="k", scope=AssetScope(uri="s3://x/y"))


def test_state_store_cleanup_cli_removes_expired_entries_in_a_real_airflow_process(
    state_backend: str, airflow_db: Path
) -> None:
    """Airflow's own clean-up skips custom backends: ``airflow pulsarstate state-store-cleanup``
    (a real CLI process, the same settings) removes the expired entries and keeps the others."""
    import os
    import subprocess
    import sys

    scope = AssetStateScope(f"cli-{uuid.uuid4().hex[:8]}")
    store = _store()
    store.set(scope, "stale", 1, expires_at=time.time() - 60)
    store.set(scope, "fresh", 2, expires_at=time.time() + 3600)
    store.set(scope, "forever", 3)
    airflow_bin = str(Path(sys.executable).with_name("airflow"))
    root = Path(__file__).resolve().parents[2]
    result = subprocess.run(
        [airflow_bin, "pulsarstate", "state-store-cleanup"], env={**os.environ, "PYTHONPATH": str(root)},
        capture_output=True, text=True, timeout=300, cwd=root,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "state-store-cleanup: removed 1 expired entry" in result.stdout, result.stdout
    assert store.table.get(store.map_key(scope, "stale"), latest=True) is None
    assert store.entries(scope) == {"fresh": 2, "forever": 3}
