"""PulsarXComBackend in real ``dag.test()`` runs on SQLite, on both back ends.

The backend is configured as a deployment would (``[core] xcom_backend`` through
``AIRFLOW__CORE__XCOM_BACKEND``, ``[pulsarstate]`` through ``AIRFLOW__PULSARSTATE__*``). The task
runner resolves ``[core] xcom_backend`` once, when it is imported (before these tests set it), so the
fixture re-resolves it with Airflow's own ``resolve_xcom_backend()`` into the two module globals that
hold it; the CLI test runs ``airflow dags test`` in a fresh process, where the configuration alone
selects the backend. Every test gets its own ``key_namespace``, so tests never see each other's entries.
Tests run with the default layout (``xcom_layout = messages``) unless they parametrize ``layout``.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from airflow_provider_pulsarstate.engine.errors import (
    XComEntryNotFoundError,
    XComReferenceError,
    XComStoreUnavailableError,
)
from airflow_provider_pulsarstate.engine.recipes.xcom_messages import XComIdentity, XComMessageLog, message_topic
from airflow_provider_pulsarstate.engine.recipes.xcom_store import run_topic
from airflow_provider_pulsarstate.hooks.pulsarstate import PulsarStateHook
from airflow_provider_pulsarstate.xcom.backend import DB_VALUE_MARKER, REFERENCE_MARKER, PulsarXComBackend, close_stores
from tests.airflow.conftest import AIRFLOW_BIN
from tests.airflow.dagruns import ROOT, TEST_DAGS, load_dag, run_dag
from tests.airflow.metadata_db import copy_airflow_db
from tests.airflow.xcom_values import EXPECTED, same

BACKEND_PATH = "airflow_provider_pulsarstate.xcom.backend.PulsarXComBackend"
TOPIC = "airflow-xcom"


VERSIONS = {"messages": 3, "map": 2}


@pytest.fixture
def layout() -> str:
    """``[pulsarstate] xcom_layout`` of the test (parametrize ``layout`` to change it)."""
    return "messages"


@pytest.fixture
def xcom_backend(
    dag_bundles: None, state_backend: str, layout: str, monkeypatch: pytest.MonkeyPatch
) -> Iterator[SimpleNamespace]:
    """PulsarXComBackend configured for this test, with a fresh key namespace."""
    from airflow.sdk.execution_time import task_runner
    from airflow.sdk.execution_time import xcom as xcom_module

    namespace = f"t{uuid.uuid4().hex[:10]}"
    monkeypatch.setenv("AIRFLOW__CORE__XCOM_BACKEND", BACKEND_PATH)
    monkeypatch.setenv("AIRFLOW__PULSARSTATE__KEY_NAMESPACE", namespace)
    monkeypatch.setenv("AIRFLOW__PULSARSTATE__XCOM_LAYOUT", layout)
    backend = xcom_module.resolve_xcom_backend()
    assert backend is PulsarXComBackend
    monkeypatch.setattr(xcom_module, "XCom", backend)
    monkeypatch.setattr(task_runner, "XCom", backend)
    close_stores()  # the connection changes between tests: the next use opens the map anew
    yield SimpleNamespace(namespace=namespace, kind=state_backend, layout=layout, version=VERSIONS[layout])
    close_stores()


def _run_maps(hook: PulsarStateHook, namespace: str, dag_id: str) -> dict[str, int]:
    """``{run_id: entries}`` of the run maps ``dag_id`` has in ``namespace`` (as the clean-up lists them)."""
    from airflow_provider_pulsarstate.xcom.cleanup import _list_run_maps

    found, _ = _list_run_maps(hook.get_conn(), hook.topic_name(TOPIC), namespace, dag_id, None)
    return {m.run_id: len(m.entries) for m in found}


def _store(hook: PulsarStateHook, namespace: str, dag_id: str, run_id: str) -> Any:
    """The XCom map of one DAG run (owned by ``hook``)."""
    topic = run_topic(hook.topic_name(TOPIC), namespace, dag_id, run_id)
    return hook.get_xcom_store(topic, namespace=namespace, writer_idle_timeout=0.2)


def _messages(hook: PulsarStateHook, namespace: str, dag_id: str, run_id: str) -> XComMessageLog:
    """The XCom message topic of one DAG run (closed by the caller)."""
    return XComMessageLog(
        hook.get_conn(), message_topic(hook.topic_name(TOPIC), namespace, dag_id, run_id), namespace=namespace
    )


def _entries(
    hook: PulsarStateHook, layout: str, namespace: str, dag_id: str, run_id: str
) -> dict[tuple[str, int, str], Any]:
    """``{(task_id, map_index, key): [(topic, key text, size, type, try), ...]}`` of one run, in either layout
    (a message topic keeps every push; a map the last value per key)."""
    found: dict[tuple[str, int, str], Any] = {}
    if layout == "map":
        store = _store(hook, namespace, dag_id, run_id)
        for e in store.list_run(dag_id, run_id):
            found[(e.task_id, e.map_index, e.key)] = [
                (store.topic, e.map_key, e.record.size, e.record.type_name, e.record.try_number)
            ]
        return found
    with _messages(hook, namespace, dag_id, run_id) as log:
        for m in log.scan().messages:
            assert m.message is not None
            i, r = m.message.identity, m.message.record
            found.setdefault((i.task_id, i.map_index, i.key), []).append(
                (log.topic, i.map_key, r.size, r.type_name, r.try_number)
            )
    return found


def _db_rows(run_id: str) -> list[Any]:
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        rows = session.scalars(select(XComModel).where(XComModel.run_id == run_id)).all()
        return [SimpleNamespace(task_id=r.task_id, map_index=r.map_index, key=r.key, value=r.value) for r in rows]


def _returns(run_id: str) -> dict[str, Any]:
    """Each unmapped task's return value, read back through the backend from the DB row."""
    return {
        r.task_id: PulsarXComBackend.deserialize_value(SimpleNamespace(value=r.value))
        for r in _db_rows(run_id)
        if r.key == "return_value" and r.map_index == -1
    }


def _run_id(dag_id: str) -> str:
    from airflow.models.dagrun import DagRun
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        return session.scalars(select(DagRun.run_id).where(DagRun.dag_id == dag_id).order_by(DagRun.id.desc())).first()


# ---------------------------------------------------------------------------------- values
@pytest.mark.parametrize("layout", ["messages", "map"])
def test_values_round_trip_and_the_db_holds_references_only(xcom_backend: SimpleNamespace) -> None:
    dag = load_dag(TEST_DAGS / "xcom_test_dags.py", "xcom_backend_values")
    run = run_dag(dag, {"big_size": 10})
    assert run.state == "success", run.states
    run_id = _run_id(dag.dag_id)
    # the pulling task checked every value and its exact type (a mismatch fails it)
    assert run.states["pull"] == "success"
    returns = _returns(run_id)
    assert returns["total"] == 12 and returns["big_len"] == 10 and returns["big"] == "x" * 10

    rows = _db_rows(run_id)
    # push returns a dict[str, Any]: TaskFlow also pushes each of its keys (multiple_outputs)
    expected_rows = (
        {("push", -1, k) for k in [*EXPECTED, "pushed", "when"]}
        | {(t, -1, "return_value") for t in ("push", "pull", "total", "big", "big_len")}
        | {("double", i, "return_value") for i in range(3)}
    )
    assert {(r.task_id, r.map_index, r.key) for r in rows} == expected_rows
    with PulsarStateHook() as hook:
        entries = _entries(hook, xcom_backend.layout, xcom_backend.namespace, dag.dag_id, run_id)
        for row in rows:
            ref = row.value
            assert isinstance(ref, dict) and ref[REFERENCE_MARKER] == xcom_backend.version, row  # never the value
            ((topic, key_text, size, type_name, _),) = entries[(row.task_id, row.map_index, row.key)]
            assert ref["topic"] == topic and "preview" not in ref  # the run's own topic; no value text
            assert ref["key"] == key_text and ref["size"] == size and ref["type"] == type_name
            assert ("address" in ref) == (xcom_backend.layout == "messages")
        assert len(entries) == len(rows)
        # the UI's view: where, size and type
        assert next(r.value for r in rows if r.key == "a_set")["type"] == "set"
        assert next(r.value for r in rows if r.key == "a_dataclass")["type"] == "tests.airflow.xcom_values.Point"
        mapped = sorted((r.map_index, r.value["key"]) for r in rows if r.task_id == "double")
        assert [m for m, _ in mapped] == [0, 1, 2] and all(k.endswith(f"/double/{m}/return_value") for m, k in mapped)
        # the values themselves, read back through the backend from the DB references
        for row in rows:
            if row.task_id == "push" and row.key in EXPECTED:
                assert same(PulsarXComBackend.deserialize_value(SimpleNamespace(value=row.value)), EXPECTED[row.key])


@pytest.mark.parametrize("mode", ["db", "error"])
def test_oversized_values(xcom_backend: SimpleNamespace, monkeypatch: pytest.MonkeyPatch, mode: str) -> None:
    monkeypatch.setenv("AIRFLOW__PULSARSTATE__XCOM_MAX_VALUE_BYTES", "1000")
    monkeypatch.setenv("AIRFLOW__PULSARSTATE__XCOM_OVERSIZE", mode)
    close_stores()
    dag = load_dag(TEST_DAGS / "xcom_test_dags.py", "xcom_backend_values")
    run = run_dag(dag, {"big_size": 5000})
    run_id = _run_id(dag.dag_id)
    rows = {(r.task_id, r.key): r.value for r in _db_rows(run_id)}
    if mode == "db":
        assert run.state == "success", run.states
        assert _returns(run_id)["big_len"] == 5000
        # in the DB, as Airflow's own backend keeps it, wrapped so that it can never pass for a reference
        assert rows[("big", "return_value")] == {DB_VALUE_MARKER: 1, "value": "x" * 5000}
        assert rows[("push", "a_dict")][REFERENCE_MARKER] == xcom_backend.version  # small values still go to Pulsar
        with PulsarStateHook() as hook:
            entries = _entries(hook, xcom_backend.layout, xcom_backend.namespace, dag.dag_id, run_id)
            assert ("big", -1, "return_value") not in entries
    else:
        assert run.states["big"] == "failed" and run.states["big_len"] == "upstream_failed"
        assert ("big", "return_value") not in rows
        assert run.states["pull"] == "success"


def test_oversize_error_names_the_limit_and_the_size(
    xcom_backend: SimpleNamespace, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AIRFLOW__PULSARSTATE__XCOM_MAX_VALUE_BYTES", "100")
    monkeypatch.setenv("AIRFLOW__PULSARSTATE__XCOM_OVERSIZE", "error")
    close_stores()  # settings are read once per process
    with pytest.raises(Exception) as info:
        PulsarXComBackend.serialize_value("y" * 200, key="k", task_id="t", dag_id="d", run_id="r", map_index=-1)
    assert type(info.value).__name__ == "XComValueTooLargeError"
    assert (
        "202 bytes" in str(info.value)
        and "100-byte limit" in str(info.value)
        and "xcom_max_value_bytes" in str(info.value)
    )


def _ref(run_id: str, task_id: str, key: str = "return_value", map_index: int = -1) -> dict[str, Any]:
    return next(r.value for r in _db_rows(run_id) if (r.task_id, r.key, r.map_index) == (task_id, key, map_index))


# ---------------------------------------------------------------------------------- purge and references
@pytest.mark.parametrize("layout", ["map"])
def test_purge_removes_the_entry_and_a_purged_reference_names_its_key(xcom_backend: SimpleNamespace) -> None:
    dag = load_dag(TEST_DAGS / "xcom_test_dags.py", "xcom_backend_plain")
    run = run_dag(dag, {})
    assert run.state == "success", run.states
    run_id = _run_id(dag.dag_id)
    ref = _ref(run_id, "consume")
    assert PulsarXComBackend.deserialize_value(SimpleNamespace(value=ref)) == 3
    PulsarXComBackend.purge(SimpleNamespace(key="return_value", value=ref))
    with PulsarStateHook() as hook:
        store = _store(hook, xcom_backend.namespace, dag.dag_id, run_id)
        assert store.get(dag.dag_id, run_id, "consume", -1, "return_value", latest=True) is None
        assert store.get(dag.dag_id, run_id, "produce", -1, "return_value", latest=True) is not None  # only that one
    with pytest.raises(XComEntryNotFoundError) as info:
        PulsarXComBackend.deserialize_value(SimpleNamespace(value=ref))
    assert ref["key"] in str(info.value) and "purged" in str(info.value)
    PulsarXComBackend.purge(SimpleNamespace(key="return_value", value=ref))  # idempotent


def test_purging_a_message_reference_drops_only_the_row(xcom_backend: SimpleNamespace) -> None:
    dag = load_dag(TEST_DAGS / "xcom_test_dags.py", "xcom_backend_plain")
    assert run_dag(dag, {}).state == "success"
    run_id = _run_id(dag.dag_id)
    ref = _ref(run_id, "consume")
    assert ref[REFERENCE_MARKER] == 3
    with PulsarStateHook() as hook:
        before = _entries(hook, "messages", xcom_backend.namespace, dag.dag_id, run_id)
    PulsarXComBackend.purge(SimpleNamespace(key="return_value", value=ref))  # no I/O, nothing to delete
    with PulsarStateHook() as hook:  # the message is immutable: it goes with its run's topic (clean-up)
        assert _entries(hook, "messages", xcom_backend.namespace, dag.dag_id, run_id) == before


@pytest.mark.parametrize("layout", ["messages", "map"])
def test_references_are_checked_before_they_are_followed(xcom_backend: SimpleNamespace) -> None:
    ref = PulsarXComBackend.serialize_value({"a": 1}, key="k", task_id="t", dag_id="d", run_id="r/1", map_index=-1)
    assert ref["key"] == f"{xcom_backend.namespace}/xcom/d/r%2F1/t/-1/k"  # '/' in a run id cannot make a segment
    extra: list[dict[str, Any]] = []
    with PulsarStateHook() as hook:  # an entry of another deployment sharing the Pulsar namespace
        if xcom_backend.layout == "map":
            other = _store(hook, "other-deployment", "d", "r")
            other_key, _ = other.put("d", "r", "t", -1, "k", '{"secret":1}', type_name="dict")
            other_topic = other.topic
        else:
            other = _messages(hook, "other-deployment", "d", "r")
            row = XComIdentity("other-deployment", "d", "r", "t", -1, "k")
            other_address, other_message = other.append(row, '{"secret":1}', type_name="dict")
            other_key, other_topic = row.map_key, other.topic
            sibling = PulsarXComBackend.serialize_value(
                {"b": 2}, key="k2", task_id="t", dag_id="d", run_id="r/1", map_index=-1
            )
            extra = [
                {**ref, "address": other_address, "writer": other_message.writer_id},  # another deployment's message
                {**ref, "address": sibling["address"]},  # a message of another row of this run
                {**ref, "address": sibling["address"], "writer": sibling["writer"]},
                {**ref, "writer": sibling["writer"]},  # another push of... another writer
                {**ref, "address": "e:0:999999" if xcom_backend.kind == "embedded" else "p:0:CAEQAQ=="},
                {k: v for k, v in ref.items() if k != "address"},
                {**ref, "address": 7},
            ]
        forged = [
            *extra,
            {**ref, "topic": "persistent://public/default/some-other-topic"},
            {**ref, "topic": other_topic, "key": other_key},
            {**ref, "key": other_key},
            {**ref, "key": ref["key"] + "/extra"},
            {**ref, "key": f"{xcom_backend.namespace}/xcom/d/r/1/t/-1/k"},
            {**ref, "key": f"{xcom_backend.namespace}/xcom/d/r%2F2/t/-1/k"},  # another run: not this topic's
            {**ref, "key": 42},
            {**ref, REFERENCE_MARKER: 99},
            {**ref, REFERENCE_MARKER: True},
        ]
        for bad in forged:
            with pytest.raises((XComReferenceError, XComEntryNotFoundError)) as info:
                PulsarXComBackend.deserialize_value(SimpleNamespace(value=bad))
            text = str(info.value)
            assert "secret" not in text
            if isinstance(info.value, XComEntryNotFoundError):  # an address nothing is at
                assert ref["key"] in text, text
            else:
                assert (
                    "refusing" in text
                    or "not an XCom key" in text
                    or "malformed" in text
                    or "canonical" in text
                    or "bad address" in text
                ), text
            PulsarXComBackend.purge(SimpleNamespace(key="k", value=bad))  # logged, nothing deleted
        if xcom_backend.layout == "map":
            assert other.get("d", "r", "t", -1, "k", latest=True) is not None
        else:
            assert other.read(other_address, identity=row, writer_id=other_message.writer_id).record.size == 12
            other.close()
    assert PulsarXComBackend.deserialize_value(SimpleNamespace(value=ref)) == {"a": 1}
    # values that are not references (pushed straight to the DB, oversized) pass through serde
    assert PulsarXComBackend.deserialize_value(SimpleNamespace(value={"plain": [1, 2]})) == {"plain": [1, 2]}


def test_another_dags_xcom_cannot_be_read_purged_or_overwritten(
    xcom_backend: SimpleNamespace, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("AIRFLOW__PULSARSTATE__XCOM_MAX_VALUE_BYTES", "1000")
    close_stores()
    victim = load_dag(TEST_DAGS / "xcom_test_dags.py", "xcom_backend_plain")
    assert run_dag(victim, {}).state == "success"
    victim_run = _run_id(victim.dag_id)
    victim_ref = _ref(victim_run, "produce")
    with PulsarStateHook() as hook:
        before = _entries(hook, xcom_backend.layout, xcom_backend.namespace, victim.dag_id, victim_run)
    attack = load_dag(TEST_DAGS / "xcom_test_dags.py", "xcom_isolation")
    params = {
        "victim_topic": victim_ref["topic"],
        "victim_key": victim_ref["key"],
        "victim_dag": victim.dag_id,
        "victim_run": victim_run,
        "victim_ref": json.dumps(victim_ref),
    }
    with caplog.at_level("ERROR", logger="airflow_provider_pulsarstate.xcom.backend"):
        run = run_dag(attack, params)
    assert run.states["forge"] == "success", run.states  # try 2, after Airflow purged try 1's forged row
    run_id = _run_id(attack.dag_id)
    # the retry's purge refused to follow the forged reference into the victim's map
    assert any(
        "not purging XCom 'stolen'" in r.getMessage() and victim_ref["key"] in r.getMessage() for r in caplog.records
    ), [r.getMessage() for r in caplog.records]
    # reading the forged row: refused, naming the key; nothing of the victim read
    read = PulsarXComBackend.deserialize_value(SimpleNamespace(value=_ref(run_id, "read_forged")))
    assert read.startswith("XComReferenceError") and victim_ref["key"] in read and "not bound to its row" in read, read
    assert "rows" not in read
    # overwriting another DAG's XCom: refused before anything was written
    outcome = PulsarXComBackend.deserialize_value(SimpleNamespace(value=_ref(run_id, "forge")))["overwrite"]
    assert outcome.startswith("XComReferenceError") and "may push only its own XComs" in outcome, outcome
    # an over-limit value carrying the marker is kept (wrapped) in the DB and read back as itself
    lookalike = PulsarXComBackend.deserialize_value(SimpleNamespace(value=_ref(run_id, "read_lookalike")))
    assert lookalike[REFERENCE_MARKER] == xcom_backend.version and lookalike["key"] == victim_ref["key"]
    assert len(lookalike["pad"]) == 3000
    assert _ref(run_id, "forge", "lookalike")[DB_VALUE_MARKER] == 1
    # the victim's value and row are as they were
    assert _ref(victim_run, "produce") == victim_ref
    assert PulsarXComBackend.deserialize_value(SimpleNamespace(value=victim_ref))["rows"] == 3
    with PulsarStateHook() as hook:
        assert _entries(hook, xcom_backend.layout, xcom_backend.namespace, victim.dag_id, victim_run) == before


def test_references_of_the_single_map_layout_stay_readable(xcom_backend: SimpleNamespace) -> None:
    # Earlier versions kept every XCom of the deployment in the map of xcom_topic itself, keyed under
    # the old default namespace "airflow" (or a configured one), with version-1 references.
    with PulsarStateHook() as hook:
        full = hook.topic_name(TOPIC)
        refs = []
        for namespace in ("airflow", xcom_backend.namespace):
            legacy = hook.get_xcom_store(TOPIC, namespace=namespace, writer_idle_timeout=0.2)
            key, record = legacy.put("d", "r", "t", -1, f"k-{namespace}", '{"old":1}', type_name="dict")
            refs.append(
                {
                    REFERENCE_MARKER: 1,
                    "topic": full,
                    "key": key,
                    "size": record.size,
                    "type": "dict",
                    "written_at": "2026-11-01T00:00:00+00:00",
                }
            )
    for ref in refs:
        assert PulsarXComBackend.deserialize_value(SimpleNamespace(key=ref["key"].rsplit("/", 1)[1], value=ref)) == {
            "old": 1
        }
    PulsarXComBackend.purge(SimpleNamespace(key=refs[1]["key"].rsplit("/", 1)[1], value=refs[1]))
    with pytest.raises(XComEntryNotFoundError):
        PulsarXComBackend.deserialize_value(SimpleNamespace(value=refs[1]))
    # a version-1 reference is still bound to the configured topic
    with pytest.raises(XComReferenceError):
        PulsarXComBackend.deserialize_value(SimpleNamespace(value={**refs[0], "topic": full + "-other"}))


def test_references_of_the_map_layout_stay_readable(
    xcom_backend: SimpleNamespace, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AIRFLOW__PULSARSTATE__XCOM_LAYOUT", "map")
    close_stores()
    old = PulsarXComBackend.serialize_value({"v": 2}, key="k", task_id="t", dag_id="d", run_id="r", map_index=-1)
    assert old[REFERENCE_MARKER] == 2 and "address" not in old
    monkeypatch.setenv("AIRFLOW__PULSARSTATE__XCOM_LAYOUT", "messages")
    close_stores()
    new = PulsarXComBackend.serialize_value({"v": 3}, key="k", task_id="t", dag_id="d", run_id="r", map_index=-1)
    assert new[REFERENCE_MARKER] == 3 and new["topic"] != old["topic"]
    assert PulsarXComBackend.deserialize_value(SimpleNamespace(key="k", value=old)) == {"v": 2}
    assert PulsarXComBackend.deserialize_value(SimpleNamespace(key="k", value=new)) == {"v": 3}
    PulsarXComBackend.purge(SimpleNamespace(key="k", value=old))  # a map reference still deletes its entry
    with pytest.raises(XComEntryNotFoundError):
        PulsarXComBackend.deserialize_value(SimpleNamespace(value=old))
    with pytest.raises(XComReferenceError):  # a map reference is bound to the run map's topic
        PulsarXComBackend.deserialize_value(SimpleNamespace(value={**old, "topic": new["topic"]}))
    with pytest.raises(XComReferenceError):  # and a message reference to the run's message topic
        PulsarXComBackend.deserialize_value(SimpleNamespace(value={**new, "topic": old["topic"]}))


def test_multi_team_mode_is_refused_unless_every_team_has_its_own_namespace_and_topics(
    xcom_backend: SimpleNamespace, monkeypatch: pytest.MonkeyPatch
) -> None:
    from airflow_provider_pulsarstate.engine.errors import ConfigurationError

    monkeypatch.setenv("AIRFLOW__CORE__MULTI_TEAM", "True")
    monkeypatch.setenv("AIRFLOW__PULSARSTATE__TEAMS", "red,blue")
    monkeypatch.setattr("airflow_provider_pulsarstate.hooks.teams.teams_from_db", lambda: None)  # a task process
    for option in ("KEY_NAMESPACE", "STATE_STORE_TOPIC", "XCOM_TOPIC"):
        monkeypatch.setenv(f"AIRFLOW__RED___PULSARSTATE__{option}", f"red-{option.lower()}")
    close_stores()
    with pytest.raises(ConfigurationError) as info:  # blue has nothing of its own: nothing is written
        PulsarXComBackend.serialize_value({"a": 1}, key="k", task_id="t", dag_id="d", run_id="r", map_index=-1)
    assert "multi_team" in str(info.value) and "'blue'" in str(info.value) and "key_namespace" in str(info.value)
    with pytest.raises(ConfigurationError):
        PulsarXComBackend.deserialize_value(SimpleNamespace(value={REFERENCE_MARKER: 2, "topic": "t", "key": "k"}))
    for option in ("KEY_NAMESPACE", "STATE_STORE_TOPIC", "XCOM_TOPIC"):
        monkeypatch.setenv(f"AIRFLOW__BLUE___PULSARSTATE__{option}", f"blue-{option.lower()}")
    close_stores()
    ref = PulsarXComBackend.serialize_value({"a": 1}, key="k", task_id="t", dag_id="d", run_id="r", map_index=-1)
    assert PulsarXComBackend.deserialize_value(SimpleNamespace(value=ref)) == {"a": 1}
    close_stores()


# ---------------------------------------------------------------------------------- retries
@pytest.mark.parametrize("layout", ["messages", "map"])
def test_a_retry_clears_the_previous_try_values(xcom_backend: SimpleNamespace) -> None:
    dag = load_dag(TEST_DAGS / "xcom_test_dags.py", "xcom_backend_retry")
    run = run_dag(dag, {})
    assert run.state == "success" and run.states["flaky"] == "success", run.states
    run_id = _run_id(dag.dag_id)
    assert sorted(r.key for r in _db_rows(run_id)) == ["return_value", "second_try"]
    second = PulsarXComBackend.deserialize_value(SimpleNamespace(value=_ref(run_id, "flaky", "second_try")))
    if xcom_backend.layout == "messages":  # the DB rows are the truth: try 1's messages are referred to by none
        assert second == {"try": 2, "at_start": []}  # (the DAG looks into the run map, which this layout never writes)
        with PulsarStateHook() as hook:
            pushed = _entries(hook, "messages", xcom_backend.namespace, dag.dag_id, run_id)
        assert sorted(k[2] for k in pushed) == ["first_try", "orphan", "return_value", "second_try"]
        return
    # Airflow purged first_try (it was in the DB) when try 2 started; the orphan never was in the DB
    assert second == {"try": 2, "at_start": ["orphan"]}
    with PulsarStateHook() as hook:
        entries = _store(hook, xcom_backend.namespace, dag.dag_id, run_id).list_run(dag.dag_id, run_id)
    # first_try: purged by Airflow's clear at the start of try 2 (purge); orphan: never in the DB,
    # removed when try 2 stored its first value
    assert sorted(e.key for e in entries) == ["return_value", "second_try"]
    assert {e.record.try_number for e in entries} == {2}


# ---------------------------------------------------------------------------------- concurrency
@pytest.mark.parametrize("layout", ["messages", "map"])
def test_several_tasks_of_one_run_push_at_once(xcom_backend: SimpleNamespace, tmp_path: Path) -> None:
    run_id, go = f"concurrent-{uuid.uuid4().hex[:6]}", tmp_path / "go"
    # 8 tasks: 2 processes (each its own map instance, competing for the writer) x 4 threads
    tasks = [[f"task_{p}_{t}" for t in range(4)] for p in range(2)]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    procs = [
        subprocess.Popen(
            [sys.executable, str(ROOT / "tests/airflow/xcom_push_worker.py"), "xcom_concurrent", run_id, str(go), *ids],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for ids in tasks
    ]
    try:
        for proc in procs:  # every process has its map open before any pushes
            assert proc.stdout is not None
            while (line := proc.stdout.readline()) and line.strip() != "ready":
                pass
            assert line.strip() == "ready", proc.stderr.read()[-3000:] if proc.stderr else ""
        go.touch()
        refs: dict[str, Any] = {}
        for proc in procs:
            out, err = proc.communicate(timeout=180)
            assert proc.returncode == 0, err[-3000:]
            refs.update({line["task_id"]: line["reference"] for line in map(json.loads, _result_lines(out))})
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    assert sorted(refs) == sorted(t for ids in tasks for t in ids)
    for task_id, ref in refs.items():
        assert PulsarXComBackend.deserialize_value(SimpleNamespace(value=ref))["task"] == task_id
    with PulsarStateHook() as hook:
        assert _run_maps(hook, xcom_backend.namespace, "xcom_concurrent") == {run_id: 8}


def _result_lines(out: str) -> list[str]:
    return [line for line in out.splitlines() if line.startswith('{"task_id"')]


# ---------------------------------------------------------------------------------- outage
def test_a_broker_outage_fails_the_task_and_nothing_lands_in_the_db(
    dag_bundles: None,
    monkeypatch: pytest.MonkeyPatch,  # noqa: F811
) -> None:
    import socket
    import time

    from airflow.sdk.execution_time import task_runner
    from airflow.sdk.execution_time import xcom as xcom_module

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]  # nothing listens here once the socket is closed
    extra = {
        "service_url": f"pulsar://127.0.0.1:{dead}",
        "admin_url": f"http://127.0.0.1:{dead}",
        "operation_timeout": 3,
    }
    monkeypatch.setenv("AIRFLOW_CONN_PULSARSTATE_DEFAULT", json.dumps({"conn_type": "pulsarstate", "extra": extra}))
    monkeypatch.setenv("AIRFLOW__CORE__XCOM_BACKEND", BACKEND_PATH)
    monkeypatch.setattr(xcom_module, "XCom", xcom_module.resolve_xcom_backend())
    monkeypatch.setattr(task_runner, "XCom", xcom_module.XCom)
    close_stores()
    try:
        started = time.monotonic()
        with pytest.raises(XComStoreUnavailableError) as info:
            PulsarXComBackend.serialize_value({"a": 1}, key="k", task_id="t", dag_id="d", run_id="r", map_index=-1)
        message = str(info.value)
        assert "XCom 'k' of task d.t, run 'r'" in message and "airflow-xcom" in message
        assert "Nothing was written to the metadata DB" in message
        assert time.monotonic() - started < 60
        close_stores()

        dag = load_dag(TEST_DAGS / "xcom_test_dags.py", "xcom_backend_plain")
        run = run_dag(dag, {})
        assert run.state == "failed" and run.states["produce"] == "failed", run.states
        assert run.states["consume"] == "upstream_failed"
        assert _db_rows(_run_id(dag.dag_id)) == []  # no silent fallback to the DB
    finally:
        close_stores()


# ---------------------------------------------------------------------------------- clean-up
def _delete_run(dag_id: str, run_id: str) -> None:
    from airflow.models.dagrun import DagRun
    from airflow.utils.session import create_session
    from sqlalchemy import delete

    with create_session() as session:
        session.execute(delete(DagRun).where(DagRun.dag_id == dag_id, DagRun.run_id == run_id))


def _age(store: Any, dag_id: str, run_id: str, days: float) -> None:
    """Make a run's entries look ``days`` old (rewrites their written-at time)."""
    import dataclasses
    import time

    for entry in store.list_run(dag_id, run_id):
        store.map.put(entry.map_key, dataclasses.replace(entry.record, written_at=time.time() - days * 86400))


@pytest.mark.parametrize(
    "layout", ["map"]
)  # ages values by rewriting map records; messages are judged by the log's time
def test_cleanup_operator_removes_deleted_and_expired_runs(xcom_backend: SimpleNamespace) -> None:
    plain = load_dag(TEST_DAGS / "xcom_test_dags.py", "xcom_backend_plain")
    cleanup = load_dag(TEST_DAGS / "xcom_test_dags.py", "xcom_backend_cleanup")
    run_ids = []
    for _ in range(3):
        assert run_dag(plain, {}).state == "success"
        run_ids.append(_run_id(plain.dag_id))
    gone, old, kept = run_ids
    _delete_run(plain.dag_id, gone)  # deleted from the DB: Airflow calls no purge
    assert _db_rows(gone) == []
    with PulsarStateHook() as hook:
        _age(_store(hook, xcom_backend.namespace, plain.dag_id, old), plain.dag_id, old, days=10)
        per_run = _run_maps(hook, xcom_backend.namespace, plain.dag_id)
    assert set(per_run) == set(run_ids)

    dry = run_dag(cleanup, {"dry_run": True, "older_than_days": 5})
    assert dry.state == "success", dry.states
    counts = PulsarXComBackend.deserialize_value(SimpleNamespace(value=_ref(_run_id(cleanup.dag_id), "cleanup")))
    assert counts == {
        "runs_scanned": 3,
        "entries_scanned": sum(per_run.values()),
        "runs_missing": 1,
        "runs_expired": 1,
        "runs_live": 0,
        "runs_changed": 0,
        "maps_foreign": 0,
        "entries_deleted": 0,
        "bytes_deleted": 0,
        "dry_run": True,
    }
    with PulsarStateHook() as hook:
        assert set(_run_maps(hook, xcom_backend.namespace, plain.dag_id)) == set(run_ids)

    cleanup = load_dag(TEST_DAGS / "xcom_test_dags.py", "xcom_backend_cleanup")  # dag.test() renders in place
    real = run_dag(cleanup, {"older_than_days": 5})
    assert real.state == "success", real.states
    counts = PulsarXComBackend.deserialize_value(SimpleNamespace(value=_ref(_run_id(cleanup.dag_id), "cleanup")))
    assert counts["runs_missing"] == 1 and counts["runs_expired"] == 1 and counts["dry_run"] is False
    assert counts["entries_deleted"] == per_run[gone] + per_run[old] and counts["bytes_deleted"] > 0
    with PulsarStateHook() as hook:
        assert list(_run_maps(hook, xcom_backend.namespace, plain.dag_id)) == [kept]
    assert PulsarXComBackend.deserialize_value(SimpleNamespace(value=_ref(kept, "consume"))) == 3


def _set_run(dag_id: str, run_id: str, **values: Any) -> None:
    from airflow.models.dagrun import DagRun
    from airflow.utils.session import create_session
    from sqlalchemy import update

    with create_session() as session:
        session.execute(update(DagRun).where(DagRun.dag_id == dag_id, DagRun.run_id == run_id).values(**values))


@pytest.mark.parametrize("layout", ["messages", "map"])
def test_cleanup_keeps_live_runs_new_values_and_other_deployments(xcom_backend: SimpleNamespace) -> None:
    import datetime

    from airflow_provider_pulsarstate.cli.xcom_cleanup import db_now, run_statuses_in_db
    from airflow_provider_pulsarstate.provider_settings import settings
    from airflow_provider_pulsarstate.xcom.cleanup import run_cleanup

    plain = load_dag(TEST_DAGS / "xcom_test_dags.py", "xcom_backend_plain")
    run_ids = []
    for _ in range(4):
        assert run_dag(plain, {}).state == "success"
        run_ids.append(_run_id(plain.dag_id))
    running, expired, pushed_into, recent = run_ids
    long_ago = datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(days=31)
    _set_run(plain.dag_id, running, state="running", end_date=None)  # e.g. cleared and re-running
    for run_id in (expired, pushed_into):
        _set_run(plain.dag_id, run_id, end_date=long_ago)
    with PulsarStateHook() as hook:
        if xcom_backend.layout == "map":
            _age(_store(hook, xcom_backend.namespace, plain.dag_id, running), plain.dag_id, running, days=31)
        # another deployment's run topics in the same Pulsar namespace, of a run our DB never had
        other = _store(hook, "other-deployment", plain.dag_id, "their-run")
        other.put(plain.dag_id, "their-run", "t", -1, "k", '{"theirs":1}', type_name="dict")
        theirs = XComIdentity("other-deployment", plain.dag_id, "their-run", "t", -1, "k")
        with _messages(hook, "other-deployment", plain.dag_id, "their-run") as their_messages:
            their_address, their_message = their_messages.append(theirs, '{"theirs":1}', type_name="dict")
        before = _run_maps(hook, xcom_backend.namespace, plain.dag_id)

    def statuses_then_a_push(dag_id: str, ids: list[str]) -> dict[str, Any]:
        found = run_statuses_in_db(dag_id, ids)  # listed already; a task pushes before the deletion
        PulsarXComBackend.serialize_value("late", key="late", task_id="consume", dag_id=dag_id, run_id=pushed_into)
        return found

    lines: list[str] = []
    log = SimpleNamespace(info=lambda fmt, *a: lines.append(fmt % a))
    report = run_cleanup(
        run_statuses=statuses_then_a_push, older_than_days=30, now=db_now(), settings=settings(), log=log
    )
    assert (report.runs_scanned, report.runs_expired, report.runs_missing) == (4, 2, 0), report
    assert (report.runs_live, report.runs_changed, report.entries_deleted) == (1, 1, before[expired]), report
    assert expired[:44] in lines[-1] and "expired" in lines[-1] and "1 not finished" in lines[-1], lines
    with PulsarStateHook() as hook:
        after = _run_maps(hook, xcom_backend.namespace, plain.dag_id)
        assert after == {running: before[running], pushed_into: before[pushed_into] + 1, recent: before[recent]}
        assert (
            _store(hook, "other-deployment", plain.dag_id, "their-run").get(
                plain.dag_id, "their-run", "t", -1, "k", latest=True
            )
            is not None
        )
        with _messages(hook, "other-deployment", plain.dag_id, "their-run") as their_messages:
            assert their_messages.read(their_address, identity=theirs, writer_id=their_message.writer_id)
    assert PulsarXComBackend.deserialize_value(SimpleNamespace(value=_ref(running, "consume"))) == 3


def _db_run_ids(db: Path, dag_id: str) -> list[str]:
    """Run ids of ``dag_id`` in the DB file, oldest first, through a fresh connection: what the
    CLI processes see, whatever this process's pooled connections hold."""
    conn = sqlite3.connect(db, timeout=30)
    try:
        return [r for (r,) in conn.execute("SELECT run_id FROM dag_run WHERE dag_id = ? ORDER BY id", (dag_id,))]
    finally:
        conn.close()


def _db_delete_run(db: Path, dag_id: str, run_id: str) -> None:
    conn = sqlite3.connect(db, timeout=30)
    try:
        conn.execute("PRAGMA foreign_keys = ON")  # its task instances and XCom rows go with it, as in Airflow
        conn.execute("DELETE FROM dag_run WHERE dag_id = ? AND run_id = ?", (dag_id, run_id))
        conn.commit()
    finally:
        conn.close()


def test_cleanup_cli_in_a_real_airflow_process(
    xcom_backend: SimpleNamespace, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, migrated_db: Path
) -> None:
    # ~60-90 s: four airflow processes (dags test twice, the CLI twice), each importing
    # Airflow, on a metadata DB of their own (the session's is shared with every dag.test() run),
    # read and changed through fresh connections to its file, as the CLI processes do.
    home = tmp_path / "airflow-home"
    home.mkdir()
    airflow_db = home / "airflow.db"
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{airflow_db}",
    }
    if xcom_backend.kind == "embedded":  # the default embedded file lives under AIRFLOW_HOME: name one both sides use
        state = json.dumps({"conn_type": "pulsarstate", "extra": {"service_url": str(tmp_path / "state.db")}})
        env["AIRFLOW_CONN_PULSARSTATE_DEFAULT"] = state
        monkeypatch.setenv("AIRFLOW_CONN_PULSARSTATE_DEFAULT", state)
        close_stores()
    copy_airflow_db(migrated_db, airflow_db)  # the run's migrated template, as a migration would leave it
    before = set(_db_run_ids(airflow_db, "xcom_backend_plain"))
    # in a separate process the configuration alone selects the backend
    for _ in range(2):
        result = subprocess.run(
            [AIRFLOW_BIN, "dags", "test", "xcom_backend_plain"],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
            cwd=ROOT,
        )
        assert result.returncode == 0, (result.stdout[-2000:], result.stderr[-3000:])
    new = [r for r in _db_run_ids(airflow_db, "xcom_backend_plain") if r not in before]
    assert len(new) == 2, new
    gone, kept = new
    conn = sqlite3.connect(airflow_db, timeout=30)
    try:
        (stored,) = conn.execute(
            "SELECT value FROM xcom WHERE run_id = ? AND task_id = 'consume' AND key = 'return_value'", (gone,)
        ).fetchone()
    finally:
        conn.close()
    assert REFERENCE_MARKER in (stored if isinstance(stored, str) else bytes(stored).decode()), stored
    _db_delete_run(airflow_db, "xcom_backend_plain", gone)

    cli = [AIRFLOW_BIN, "pulsarstate", "xcom-cleanup", "--dag-id", "xcom_backend_plain"]
    dry = subprocess.run([*cli, "--dry-run"], env=env, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert dry.returncode == 0, dry.stderr[-3000:]
    assert "[dry run]" in dry.stdout and gone[:44] in dry.stdout and "missing" in dry.stdout, dry.stdout[-3000:]
    assert (
        "1 missing from the metadata DB, 0 past retention;" in dry.stdout and "would delete 4 entries" in dry.stdout
    ), dry.stdout
    with PulsarStateHook() as hook:
        assert len(_run_maps(hook, xcom_backend.namespace, "xcom_backend_plain")) == 2

    real = subprocess.run(cli, env=env, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert real.returncode == 0, real.stderr[-3000:]
    assert "scanned 2 runs / 8 entries; stale: 1 missing from the metadata DB, 0 past retention;" in real.stdout, (
        real.stdout
    )
    assert "deleted 4 entries" in real.stdout, real.stdout
    with PulsarStateHook() as hook:
        assert list(_run_maps(hook, xcom_backend.namespace, "xcom_backend_plain")) == [kept]


def test_provider_info_registers_the_operator_and_the_cli() -> None:
    import importlib

    from airflow_provider_pulsarstate.provider_info import provider_info

    info = provider_info()
    assert "airflow_provider_pulsarstate.operators.xcom_cleanup" in info["operators"][0]["python-modules"]
    (path,) = info["cli"]
    module, _, name = path.rpartition(".")
    (group,) = getattr(importlib.import_module(module), name)()
    assert group.name == "pulsarstate" and [c.name for c in group.subcommands][:3] == [
        "xcom-cleanup",
        "state-store-cleanup",
        "state-store-migrate",
    ]
