"""PulsarXComBackend in real ``dag.test()`` runs on SQLite, on both back ends.

The backend is configured as a deployment would (``[core] xcom_backend`` through
``AIRFLOW__CORE__XCOM_BACKEND``, ``[pulsarstate]`` through ``AIRFLOW__PULSARSTATE__*``). The task
runner resolves ``[core] xcom_backend`` once, when it is imported (before these tests set it), so the
fixture re-resolves it with Airflow's own ``resolve_xcom_backend()`` into the two module globals that
hold it; the CLI test runs ``airflow dags test`` in a fresh process, where the configuration alone
selects the backend. Every test gets its own ``key_namespace``, so tests never see each other's entries.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import uuid
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Iterator

import pytest

from airflow_provider_pulsarstate.engine.errors import (
    XComEntryNotFoundError,
    XComReferenceError,
    XComStoreUnavailableError,
)
from airflow_provider_pulsarstate.hooks.pulsarstate import PulsarStateHook
from airflow_provider_pulsarstate.xcom.backend import REFERENCE_MARKER, PulsarXComBackend, close_stores
from tests.airflow.conftest import AIRFLOW_BIN
from tests.airflow.dagruns import ROOT, TEST_DAGS, load_dag, run_dag
from tests.airflow.test_views_operators import dag_bundles  # noqa: F401
from tests.airflow.xcom_values import EXPECTED, same

BACKEND_PATH = "airflow_provider_pulsarstate.xcom.backend.PulsarXComBackend"
TOPIC = "airflow-xcom"


@pytest.fixture
def xcom_backend(dag_bundles: None, state_backend: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[SimpleNamespace]:
    """PulsarXComBackend configured for this test, with a fresh key namespace."""
    from airflow.sdk.execution_time import task_runner
    from airflow.sdk.execution_time import xcom as xcom_module

    namespace = f"t{uuid.uuid4().hex[:10]}"
    monkeypatch.setenv("AIRFLOW__CORE__XCOM_BACKEND", BACKEND_PATH)
    monkeypatch.setenv("AIRFLOW__PULSARSTATE__KEY_NAMESPACE", namespace)
    backend = xcom_module.resolve_xcom_backend()
    assert backend is PulsarXComBackend
    monkeypatch.setattr(xcom_module, "XCom", backend)
    monkeypatch.setattr(task_runner, "XCom", backend)
    close_stores()  # the connection changes between tests: the next use opens the map anew
    yield SimpleNamespace(namespace=namespace, kind=state_backend)
    close_stores()


def _store(hook: PulsarStateHook, namespace: str) -> Any:
    return hook.get_xcom_store(TOPIC, namespace=namespace, writer_idle_timeout=0.2)


def _db_rows(run_id: str) -> list[Any]:
    from sqlalchemy import select

    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    with create_session() as session:
        rows = session.scalars(select(XComModel).where(XComModel.run_id == run_id)).all()
        return [
            SimpleNamespace(task_id=r.task_id, map_index=r.map_index, key=r.key, value=r.value)
            for r in rows
        ]


def _returns(run_id: str) -> dict[str, Any]:
    """Each unmapped task's return value, read back through the backend from the DB row."""
    return {
        r.task_id: PulsarXComBackend.deserialize_value(SimpleNamespace(value=r.value))
        for r in _db_rows(run_id) if r.key == "return_value" and r.map_index == -1
    }


def _run_id(dag_id: str) -> str:
    from sqlalchemy import select

    from airflow.models.dagrun import DagRun
    from airflow.utils.session import create_session

    with create_session() as session:
        return session.scalars(select(DagRun.run_id).where(DagRun.dag_id == dag_id).order_by(DagRun.id.desc())).first()


# ---------------------------------------------------------------------------------- values
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
    expected_rows = {("push", -1, k) for k in [*EXPECTED, "pushed", "when"]} | {
        (t, -1, "return_value") for t in ("push", "pull", "total", "big", "big_len")
    } | {("double", i, "return_value") for i in range(3)}
    assert {(r.task_id, r.map_index, r.key) for r in rows} == expected_rows
    with PulsarStateHook() as hook:
        store = _store(hook, xcom_backend.namespace)
        entries = {(e.task_id, e.map_index, e.key): e for e in store.list_run(dag.dag_id, run_id)}
        for row in rows:
            ref = row.value
            assert isinstance(ref, dict) and ref[REFERENCE_MARKER] == 1, row  # a reference, never the value
            assert ref["topic"] == hook.topic_name(TOPIC)
            entry = entries[(row.task_id, row.map_index, row.key)]
            assert ref["key"] == entry.map_key and ref["size"] == entry.record.size
            assert ref["type"] == entry.record.type_name
        assert len(entries) == len(rows)
        # the UI's view: where, size, type and a short preview
        a_set = next(r.value for r in rows if r.key == "a_set")
        assert a_set["type"] == "set" and a_set["preview"] in ("{'a', 'b', 'c'}", "{'a', 'c', 'b'}", "{'b', 'a', 'c'}",
                                                                 "{'b', 'c', 'a'}", "{'c', 'a', 'b'}", "{'c', 'b', 'a'}")
        point = next(r.value for r in rows if r.key == "a_dataclass")
        assert point["type"] == "tests.airflow.xcom_values.Point" and point["preview"].startswith("Point(x=7, ")
        assert len(point["preview"]) <= 80
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
        assert rows[("big", "return_value")] == "x" * 5000  # in the DB, as Airflow's own backend keeps it
        assert rows[("push", "a_dict")][REFERENCE_MARKER] == 1  # small values still go to the map
        with PulsarStateHook() as hook:
            assert _store(hook, xcom_backend.namespace).get(dag.dag_id, run_id, "big", -1, "return_value", latest=True) is None
    else:
        assert run.states["big"] == "failed" and run.states["big_len"] == "upstream_failed"
        assert ("big", "return_value") not in rows
        assert run.states["pull"] == "success"


def test_oversize_error_names_the_limit_and_the_size(xcom_backend: SimpleNamespace, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW__PULSARSTATE__XCOM_MAX_VALUE_BYTES", "100")
    monkeypatch.setenv("AIRFLOW__PULSARSTATE__XCOM_OVERSIZE", "error")
    with pytest.raises(Exception) as info:
        PulsarXComBackend.serialize_value("y" * 200, key="k", task_id="t", dag_id="d", run_id="r", map_index=-1)
    assert type(info.value).__name__ == "XComValueTooLargeError"
    assert "202 bytes" in str(info.value) and "100-byte limit" in str(info.value) and "xcom_max_value_bytes" in str(info.value)
