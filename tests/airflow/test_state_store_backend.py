"""PulsarStateStoreBackend with real dag.test() runs on SQLite, on both back ends and in the three
configurations: server ([state_store] backend), worker ([workers] state_store_backend) and both.
Task state lives in one map per DAG run, asset state in one map per asset."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from airflow_provider_pulsarstate.hooks.pulsarstate import (
    AssetStateScope,
    PulsarStateHook,
    TaskStateScope,
    close_shared_state_maps,
)
from airflow_provider_pulsarstate.testing.airflow_processes import free_port
from tests.airflow.dagruns import TEST_DAGS, load_dag, run_dag

BACKEND = "airflow_provider_pulsarstate.state_store.backend.PulsarStateStoreBackend"
DAGS = TEST_DAGS / "state_store_dags.py"
ASSET_NAME = "pulsarstate-state-asset"
WARNING = "was not written through the configured state backend"


def _reset_backend_caches() -> None:
    import airflow.state
    from airflow.sdk.execution_time import context

    airflow.state._backend_instance = None
    context._get_worker_state_store_backend.cache_clear()
    close_shared_state_maps()  # settings, the cached connection and the pooled maps


@pytest.fixture(autouse=True)
def _fresh_process_state() -> Iterator[None]:
    """Each test reads its connection anew (the state_backend fixture switches it)."""
    close_shared_state_maps()
    yield
    close_shared_state_maps()


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


def _cli_env(root: Path) -> dict[str, str]:
    """A CLI process's environment. The provider's commands never fall back to the embedded log: the
    embedded case (no connection in this process) names the default file through a connection."""
    import os

    env = {**os.environ, "PYTHONPATH": str(root)}
    env.setdefault("AIRFLOW_CONN_PULSARSTATE_DEFAULT", json.dumps({"conn_type": "pulsarstate"}))
    return env


def _recording_opened_maps(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The topics of the state maps this process opens from now on (dag.test() runs the tasks and
    the execution API in this process)."""
    from airflow_provider_pulsarstate.hooks import shared_objects

    opened: list[str] = []
    original = shared_objects.borrow

    def recording(config, key, factory):
        if key and key[0] == "state-map":
            opened.append(key[1])
        return original(config, key, factory)

    monkeypatch.setattr(shared_objects, "borrow", recording)
    return opened


def test_task_and_asset_state_through_the_context(
    dag_bundles: None,
    state_backend: str,
    state_mode: str,
    airflow_db: Path,
    capfd: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    dag = load_dag(DAGS, "state_store_basics")
    tag = uuid.uuid4().hex[:8]
    task_rows_before = _db_rows(airflow_db, "task_state_store")
    asset_rows_before = _db_rows(airflow_db, "asset_state_store")
    opened = _recording_opened_maps(monkeypatch)
    run = run_dag(dag, {"tag": tag})
    out = capfd.readouterr()
    assert run.state == "success", run.states
    store, x = _store(), run.xcoms

    # the run's tasks opened their own run's map and their asset's map, nothing else (not the old single map)
    run_id = _mapped_returns(airflow_db, "task_state")[0]
    own = {
        store.topic_of(TaskStateScope("state_store_basics", run_id, "task_state")),
        store.topic_of(AssetStateScope(ASSET_NAME)),
    }
    assert set(opened) == own, (set(opened) - own, own)

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
        # expires_at honoured: retention=1 s (the clean-up's clock is the DB's: SQLite gives whole seconds)
        time.sleep(2.2)
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
            "AND key = 'return_value'",
            (run_id, task_id),
        ).fetchall()
    finally:
        conn.close()
    return run_id, {i: json.loads(v) if isinstance(v, str) else json.loads(bytes(v)) for i, v in rows}


def test_a_broker_outage_fails_the_task_and_writes_nothing_to_the_db(
    dag_bundles: None,
    state_mode: str,
    airflow_db: Path,
    monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture[str],
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
    assert [r for r in _db_rows(airflow_db, "asset_state_store") if r[0] == "outage"] == [
        r for r in before if r[0] == "outage"
    ]


def test_async_twins_run_off_the_event_loop(state_backend: str, airflow_db: Path) -> None:
    from airflow.sdk.state import AssetScope, TaskScope

    from airflow_provider_pulsarstate.state_store.backend import PulsarStateStoreBackend

    backend = PulsarStateStoreBackend()
    scope = TaskScope(dag_id="d", run_id=f"r-{uuid.uuid4().hex[:6]}", task_id="t", map_index=2)
    asset = AssetScope(name=f"async-{uuid.uuid4().hex[:6]}")
    from airflow_provider_pulsarstate.engine.recipes.map import PulsarMap

    threads: list[int] = []
    original = PulsarMap.get

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

    PulsarMap.get = recording_get  # every scope map: the backend reads through them
    try:
        asyncio.run(main())
    finally:
        PulsarMap.get = original


def test_bad_stored_data_and_foreign_references_are_clear_errors(state_backend: str, airflow_db: Path) -> None:
    from airflow.sdk.state import TaskScope

    from airflow_provider_pulsarstate.hooks.pulsarstate import StateStoreDataError
    from airflow_provider_pulsarstate.state_store.backend import PulsarStateStoreBackend

    backend, store = PulsarStateStoreBackend(), _store()
    scope = TaskScope(dag_id="d", run_id=f"r-{uuid.uuid4().hex[:6]}", task_id="t")
    engine_scope = TaskStateScope(scope.dag_id, scope.run_id, scope.task_id)
    key = store.map_key(engine_scope, "k")
    with store.table(engine_scope) as table:
        table.put(key, "not a record")
    with pytest.raises(StateStoreDataError, match=key.replace("/", ".")):
        backend.get(scope, "k")
    with pytest.raises(StateStoreDataError, match="not JSON text"):
        backend.set(scope, "k2", "{bad")
    with pytest.raises(StateStoreDataError, match="does not name a state entry"):
        backend.deserialize_task_state_store_from_ref("other/task/x")
    with store.table(engine_scope) as table:
        table.delete(key)


def test_writer_idle_timeout_setting_is_checked() -> None:
    from configparser import ConfigParser

    from airflow_provider_pulsarstate.engine.errors import ConfigurationError
    from airflow_provider_pulsarstate.provider_settings import load_settings

    conf = ConfigParser()
    conf.read_dict({"pulsarstate": {"state_store_writer_idle_timeout": "1.5", "key_namespace": "t"}})
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
        [airflow_bin, "pulsarstate", "state-store-cleanup"],
        env=_cli_env(root),
        capture_output=True,
        text=True,
        timeout=300,
        cwd=root,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "state-store-cleanup: removed 1 expired entry" in result.stdout, result.stdout
    with store.table(scope) as table:
        assert table.get(store.map_key(scope, "stale"), latest=True) is None
    assert store.entries(scope) == {"fresh": 2, "forever": 3}


def _secret(store) -> tuple[TaskStateScope, str]:
    """Another DAG's task state holding a password, and the map key a forged reference would name."""
    scope = TaskStateScope("state_store_secret", f"secret-{uuid.uuid4().hex[:6]}", "t")
    store.set(scope, "password", "hunter2")
    return scope, store.map_key(scope, "password")


def test_references_and_scopes_follow_airflow_isolation(
    dag_bundles: None, state_backend: str, state_mode: str, airflow_db: Path
) -> None:
    """A stored value shaped like a reference is never followed; a forged DB row whose reference names
    another DAG's entry, or another key of the task's own, is refused naming the key; a task cannot
    reach another task instance's scope through the backend (ti:self)."""
    store = _store()
    secret_scope, secret_ref = _secret(store)
    run = run_dag(load_dag(DAGS, "state_store_isolation"), {"secret_ref": secret_ref, "other_run": secret_scope.run_id})
    assert run.state == "success", run.states
    x = run.xcoms
    shaped = {"__airflow_state_ref__": secret_ref}
    assert x["value_shaped_like_a_reference"] == {"read": shaped}

    forged = x["forged_rows"]
    if state_mode == "worker":  # the DB row is the task's: its reference is checked against the row
        for key, named in (("other_dag", "password"), ("other_key", "mine")):
            assert forged[key].startswith("StateScopeError: state reference"), forged
            assert f"names key {named!r}" in forged[key] and f"but key {key!r}" in forged[key], forged
            assert f"{key}-value" not in forged
    else:  # the server hands out its own references: the forged one is just a value
        assert forged["other_dag"] == "allowed" and forged["other_dag-value"] == shaped, forged
    assert "hunter2" not in json.dumps(x)

    scopes = x["other_scopes"]
    for op in ("get", "set", "ref", "delete", "clear"):
        assert scopes[op].startswith("StateScopeError: state key"), (op, scopes)
        assert "may reach only its own task state" in scopes[op], scopes
    assert "'password' of task state_store_secret.t of run" in scopes["get"], scopes
    assert "'mine' of task state_store_isolation.forged_rows" in scopes["set"], scopes
    assert scopes["own"] == "allowed", scopes
    assert store.get(secret_scope, "password") == "hunter2"


def test_multi_team_needs_a_namespace_and_topics_per_team(monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow_provider_pulsarstate.engine.errors import ConfigurationError
    from airflow_provider_pulsarstate.state_store.backend import PulsarStateStoreBackend

    monkeypatch.setenv("AIRFLOW__CORE__MULTI_TEAM", "True")
    monkeypatch.setenv("AIRFLOW__PULSARSTATE__TEAMS", "")
    with pytest.raises(ConfigurationError, match=r"cannot list the teams .*set \[pulsarstate\] teams"):
        PulsarStateStoreBackend()
    monkeypatch.setenv("AIRFLOW__PULSARSTATE__TEAMS", "team_a,team_b")
    with pytest.raises(
        ConfigurationError,
        match=r"team 'team_a' has no \[pulsarstate\] key_namespace of its own.*"
        r"AIRFLOW__TEAM_A___PULSARSTATE__KEY_NAMESPACE",
    ):
        PulsarStateStoreBackend()
    for team in ("TEAM_A", "TEAM_B"):
        monkeypatch.setenv(f"AIRFLOW__{team}___PULSARSTATE__KEY_NAMESPACE", team.lower())
        monkeypatch.setenv(f"AIRFLOW__{team}___PULSARSTATE__XCOM_TOPIC", f"xcom-{team.lower()}")
    monkeypatch.setenv("AIRFLOW__TEAM_A___PULSARSTATE__STATE_STORE_TOPIC", "state-shared")
    monkeypatch.setenv("AIRFLOW__TEAM_B___PULSARSTATE__STATE_STORE_TOPIC", "state-shared")
    with pytest.raises(
        ConfigurationError,
        match="team 'team_b' shares \\[pulsarstate\\] state_store_topic = 'state-shared' with team 'team_a'",
    ):
        PulsarStateStoreBackend()
    monkeypatch.setenv("AIRFLOW__TEAM_B___PULSARSTATE__STATE_STORE_TOPIC", "state-b")
    PulsarStateStoreBackend()  # each team has its own: accepted


def test_cleanup_keeps_live_runs_and_values_written_meanwhile(state_backend: str, airflow_db: Path) -> None:
    """A RUNNING run's 31-day-old state stays; a finished run's map whose state all expired is
    deleted whole; a value written into a finished run's map during the clean-up survives
    (compare-and-delete); a missing run's map goes; asset maps lose only their expired entries."""
    from airflow_provider_pulsarstate.state_store.cleanup import run_state_cleanup
    from airflow_provider_pulsarstate.xcom.cleanup import RunStatus

    store, now = _store(), time.time()
    month_ago = now - 31 * 86400
    tag = uuid.uuid4().hex[:6]
    running = TaskStateScope("cleanup_dag", f"running-{tag}", "t")
    finished = TaskStateScope("cleanup_dag", f"finished-{tag}", "t")
    racing = TaskStateScope("cleanup_dag", f"racing-{tag}", "t")
    missing = TaskStateScope("cleanup_dag", f"missing-{tag}", "t")
    partly = TaskStateScope("cleanup_dag", f"partly-{tag}", "t")
    asset = AssetStateScope(f"cleanup-asset-{tag}")
    for scope in (running, finished, racing, missing, partly, asset):
        store.set(scope, "old", 1, expires_at=month_ago)
    store.set(partly, "young", 2, expires_at=now + 3600)
    store.set(asset, "young", 3)
    close_shared_state_maps()  # as in the clean-up's own process: no map of these runs open (a Pulsar reader
    # left open on a deleted topic would re-create it)
    store = _store()
    statuses = {
        running.run_id: RunStatus("running"),
        finished.run_id: RunStatus("success", month_ago),
        racing.run_id: RunStatus("failed", month_ago),
        partly.run_id: RunStatus("success", month_ago),
    }

    def run_statuses(dag_id: str, run_ids: list[str]) -> dict[str, RunStatus]:
        if dag_id == "cleanup_dag":
            store.set(racing, "late", "written during the clean-up")  # after listing, before deleting
        return {r: statuses[r] for r in run_ids if r in statuses}

    report = run_state_cleanup(store, run_statuses=run_statuses, now=now, timeout=30)
    assert store.entries(running) == {}  # expired reads as absent ...
    with store.table(running) as table:  # ... but the entry is kept for the running run
        assert table.get(store.map_key(running, "old"), latest=True) is not None
    assert store.get(racing, "late") == "written during the clean-up"
    assert store.entries(partly) == {"young": 2} and store.entries(asset) == {"young": 3}
    close_shared_state_maps()
    topics = set(PulsarStateHook().get_conn().list_topics(store.topic_of(finished)[:-32]))
    assert store.topic_of(finished) not in topics and store.topic_of(missing) not in topics
    assert {store.topic_of(running), store.topic_of(racing), store.topic_of(partly)} <= topics
    assert report.runs_live >= 1 and report.runs_missing >= 1 and report.maps_changed >= 1 and report.maps_dropped >= 2


def test_legacy_single_map_state_is_migrated(state_backend: str, airflow_db: Path) -> None:
    """``airflow pulsarstate state-store-migrate`` (a real CLI process) moves the old single map's
    entries of this namespace and of the old default ``airflow`` into the per-scope maps; newer
    values, other namespaces and expired entries are handled as documented; a reference the DB kept
    from before resolves to the moved entry."""
    import subprocess
    import sys

    from airflow_provider_pulsarstate.provider_settings import settings
    from airflow_provider_pulsarstate.state_store.backend import PulsarStateStoreBackend

    store, tag = _store(), uuid.uuid4().hex[:6]
    hook = PulsarStateHook()
    legacy = hook.get_map(settings().state_store_topic)
    old_task = TaskStateScope("legacy_dag", f"run-{tag}", "t", 2)
    old_asset = AssetStateScope(f"legacy-asset-{tag}")
    newer = AssetStateScope(f"legacy-newer-{tag}")

    def legacy_key(namespace: str, scope, key: str) -> str:
        return namespace + store.map_key(scope, key)[len(store.namespace) :]

    def record(value, expires_at=None) -> dict:
        return {"json": json.dumps(value), "expires_at": expires_at}

    rows = {
        legacy_key("airflow", old_task, "job"): record({"id": 7}),
        legacy_key(store.namespace, old_asset, "mark"): record(41, time.time() + 3600),
        legacy_key("airflow", newer, "mark"): record("old"),
        legacy_key("airflow", old_asset, "gone"): record(1, time.time() - 60),
        legacy_key("elsewhere", old_asset, "mark"): record("not ours"),
    }
    for key, value in rows.items():
        legacy.put(key, value)
    store.set(newer, "mark", "new")
    airflow_bin = str(Path(sys.executable).with_name("airflow"))
    root = Path(__file__).resolve().parents[2]
    result = subprocess.run(
        [airflow_bin, "pulsarstate", "state-store-migrate"],
        env=_cli_env(root),
        capture_output=True,
        text=True,
        timeout=300,
        cwd=root,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "moved 2 entries" in result.stdout and "1 kept: newer" in result.stdout and "1 expired" in result.stdout, (
        result.stdout
    )
    assert store.get(old_task, "job") == {"id": 7} and store.get(old_asset, "mark") == 41
    assert store.get(newer, "mark") == "new"
    remaining = legacy.to_dict(latest=True)
    assert set(rows) & set(remaining) == {legacy_key("elsewhere", old_asset, "mark")}
    # a worker reference written before the move (old default namespace) reads the moved value
    old_ref = legacy_key("airflow", old_task, "job")
    assert PulsarStateStoreBackend().deserialize_task_state_store_from_ref(old_ref) == {"id": 7}
    hook.close()
