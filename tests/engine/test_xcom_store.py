"""XComStore (engine/recipes/xcom_store.py) on both back ends: key layout, records, listing,
clean-up selection, and a run's XComs read by a plain Python process that never imports Airflow."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from airflow_provider_pulsarstate.engine.backends.base import Backend
from airflow_provider_pulsarstate.engine.config import ConnectionConfig
from airflow_provider_pulsarstate.engine.errors import SerializationError, ValueTooLargeError, XComReferenceError
from airflow_provider_pulsarstate.engine.recipes.xcom_store import RECORD_SERDE, XComStore

ROOT = Path(__file__).resolve().parents[2]


def _store(backend: Backend, topic: str, namespace: str = "prod", **options: object) -> XComStore:
    return XComStore(backend, topic, namespace=namespace, writer_idle_timeout=0.2, **options).start()


def test_keys_are_quoted_and_cannot_be_forged(backend: Backend, topic: str) -> None:
    with _store(backend, topic) as store:
        key, record = store.put("d/1", "run/a%2F", "t", 3, "k/x", '{"a":1}', type_name="dict", try_number=2)
        assert key == "prod/xcom/d%2F1/run%2Fa%252F/t/3/k%2Fx"
        assert store.parse_key(key) == ("d/1", "run/a%2F", "t", 3, "k/x")
        assert store.get("d/1", "run/a%2F", "t", 3, "k/x", latest=True) == record
        assert record.size == 7 and record.type_name == "dict" and record.try_number == 2
        assert abs(record.written_at - time.time()) < 60 and record.json_value() == {"a": 1}
        for bad in [
            "other/xcom/d/r/t/-1/k",
            "prod/xcom/d/r/t/-1",
            "prod/xcom/d/r/t/x/k",
            "prod/xcom/d/r/t/-1/k/extra",
            "prod/xcom/d/r/t/-1/",
            "prod/xcom/d/r%2f/t/-1/k",
        ]:  # lower-case quoting: another spelling
            with pytest.raises(XComReferenceError):
                store.parse_key(bad)
        with pytest.raises(XComReferenceError):
            store.get_by_key("other/xcom/d/r/t/-1/k")
        with pytest.raises(XComReferenceError):
            store.map_key("d", "", "t", -1, "k")
        with pytest.raises(XComReferenceError):
            XComStore(backend, topic, namespace="a/b")


def test_limits_and_corrupt_records(backend: Backend, topic: str) -> None:
    with _store(backend, topic, max_value_bytes=100) as store:
        with pytest.raises(ValueTooLargeError, match="101 bytes, over the 100-byte limit"):
            store.put("d", "r", "t", -1, "k", "x" * 101, type_name="str")
        assert store.list_runs() == []  # nothing appended
        store.map.manager.write(lambda m: [(1, "prod/xcom/d/r/t/-1/bad", b"no header")], lambda m: None)
        with pytest.raises(SerializationError, match="prod/xcom/d/r/t/-1/bad"):
            store.get_by_key("prod/xcom/d/r/t/-1/bad", latest=True)
    for garbage in [
        b"no header",
        b"[1]\n1",
        b'{"t":"x","n":1,"type":"int"}\n1',
        b'{"t":1,"n":1,"type":"int","try":true}\n1',
    ]:
        with pytest.raises(ValueError):
            RECORD_SERDE.deserialize(garbage)


def test_list_runs_and_delete_runs(backend: Backend, topic: str) -> None:
    with _store(backend, topic) as store, _store(backend, topic, namespace="staging") as other:
        for run in ("r1", "r2"):
            for task in ("a", "b"):
                store.put("dag", run, task, -1, "return_value", json.dumps([run, task]), type_name="list")
        store.put("dag2", "r1", "a", 0, "return_value", "1", type_name="int")
        other.put("dag", "r1", "a", -1, "return_value", "2", type_name="int")  # another namespace, same ids
        runs = {(r.dag_id, r.run_id): r for r in store.list_runs()}
        assert set(runs) == {("dag", "r1"), ("dag", "r2"), ("dag2", "r1")}
        assert runs[("dag", "r1")].entries == 2 and runs[("dag", "r1")].bytes == 2 * len(json.dumps(["r1", "a"]))
        assert [r.run_id for r in store.list_runs(dag_id="dag")] == ["r1", "r2"]
        assert [(e.task_id, e.record.json_value()) for e in store.list_run("dag", "r2")] == [
            ("a", ["r2", "a"]),
            ("b", ["r2", "b"]),
        ]

        assert store.delete_runs([("dag", "r1"), ("dag2", "r1")]) == 3
        assert [(r.dag_id, r.run_id) for r in store.list_runs()] == [("dag", "r2")]
        assert other.list_run("dag", "r1", latest=True)[0].record.json_value() == 2  # untouched
        assert store.delete("dag", "r2", "a", -1, "return_value") is True
        assert store.delete("dag", "r2", "a", -1, "return_value") is False


def test_find_stale_runs_missing_and_expired(backend: Backend, topic: str) -> None:
    with _store(backend, topic) as store:
        for run in ("gone", "old", "kept", "old-and-gone"):
            store.put("dag", run, "t", -1, "k", "1", type_name="int")
        for run in ("old", "old-and-gone"):
            entry = store.list_run("dag", run)[0]
            store.map.put(entry.map_key, dataclasses.replace(entry.record, written_at=time.time() - 10 * 86400))
        asked: list[tuple[str, list[str]]] = []

        def existing(dag_id: str, run_ids: list[str]) -> set[str]:
            asked.append((dag_id, sorted(run_ids)))
            return {"old", "kept"}

        stale = store.find_stale_runs(existing_runs=existing, older_than=time.time() - 5 * 86400)
        assert asked == [("dag", ["gone", "kept", "old", "old-and-gone"])]
        assert sorted((s.run.run_id, s.reason) for s in stale) == [
            ("gone", "missing"),
            ("old", "expired"),
            ("old-and-gone", "missing"),
        ]
        expired_only = store.find_stale_runs(older_than=time.time() - 5 * 86400)
        assert sorted((s.run.run_id, s.reason) for s in expired_only) == [
            ("old", "expired"),
            ("old-and-gone", "expired"),
        ]
        assert store.delete_runs(stale) == 3
        assert [r.run_id for r in store.list_runs()] == ["kept"]


def test_delete_older_tries(backend: Backend, topic: str) -> None:
    with _store(backend, topic) as store:
        store.put("d", "r", "t", 1, "a", "1", type_name="int", try_number=1)
        store.put("d", "r", "t", 1, "b", "1", type_name="int", try_number=None)  # unknown try: kept
        store.put("d", "r", "t", 2, "a", "1", type_name="int", try_number=1)  # another map index
        store.put("d", "r", "t", 1, "c", "1", type_name="int", try_number=2)
        assert store.delete_older_tries("d", "r", "t", 1, 2) == 1
        assert sorted((e.map_index, e.key) for e in store.list_run("d", "r")) == [(1, "b"), (1, "c"), (2, "a")]


READER = """
import json, sys
from airflow_provider_pulsarstate import ConnectionConfig, open_backend
from airflow_provider_pulsarstate.engine.recipes.xcom_store import XComStore

config = ConnectionConfig(**json.loads(sys.argv[1]))
backend = open_backend(config)
with XComStore(backend, sys.argv[2], namespace="prod") as store:
    runs = [(r.dag_id, r.run_id, r.entries) for r in store.list_runs(dag_id="etl")]
    values = {f"{e.task_id}[{e.map_index}].{e.key}": [e.record.type_name, e.record.json_value()]
              for e in store.list_run("etl", "manual__1")}
backend.close()
print(json.dumps({"airflow_imported": any(m == "airflow" or m.startswith("airflow.") for m in sys.modules),
                  "runs": runs, "values": values}))
"""


def test_a_plain_python_process_reads_a_runs_xcoms(
    backend: Backend, backend_config: ConnectionConfig, topic: str
) -> None:
    with _store(backend, topic) as store:
        store.put("etl", "manual__1", "extract", -1, "return_value", '{"rows":3}', type_name="dict")
        store.put(
            "etl",
            "manual__1",
            "load",
            0,
            "return_value",
            '{"__classname__":"builtins.tuple","__version__":1,"__data__":[1,2]}',
            type_name="tuple",
        )
        store.put("etl", "manual__2", "extract", -1, "return_value", "1", type_name="int")
    args = {"url": backend_config.url, "operation_timeout": 15.0}
    if backend_config.kind != "embedded":
        args["admin_url"] = backend_config.admin_url
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    result = subprocess.run(
        [sys.executable, "-c", READER, json.dumps(args), topic], env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr[-3000:]
    out = json.loads(result.stdout.strip().splitlines()[-1])
    assert out["airflow_imported"] is False
    assert out["runs"] == [["etl", "manual__1", 2], ["etl", "manual__2", 1]]
    assert out["values"] == {
        "extract[-1].return_value": ["dict", {"rows": 3}],
        "load[0].return_value": ["tuple", {"__classname__": "builtins.tuple", "__version__": 1, "__data__": [1, 2]}],
    }


def test_run_topics_are_per_namespace_and_run_and_listed_by_prefix(backend: Backend, topic: str) -> None:
    from airflow_provider_pulsarstate.engine.recipes.xcom_store import is_run_topic, run_topic, run_topic_prefix

    a = run_topic(topic, "prod", "dag", "run/1")
    assert a == run_topic(topic, "prod", "dag", "run/1")  # stable
    assert (
        len(
            {
                a,
                run_topic(topic, "prod", "dag", "run/2"),
                run_topic(topic, "prod", "dag2", "run/1"),
                run_topic(topic, "prod2", "dag", "run/1"),
                run_topic(topic, "prod", "dag/run", "1"),
            }
        )
        == 5
    )
    prefix = run_topic_prefix(topic, "prod")
    assert is_run_topic(a, prefix) and not is_run_topic(a + "-checkpoints", prefix)
    assert not is_run_topic(run_topic(topic, "prod2", "dag", "run/1"), prefix)
    for name in (a, run_topic(topic, "prod", "dag", "run/2")):
        with _store(backend, name) as store:
            store.put("dag", "r", "t", -1, "k", "1", type_name="int")
    with _store(backend, run_topic(topic, "other", "dag", "r")) as store:
        store.put("dag", "r", "t", -1, "k", "1", type_name="int")
    listed = backend.list_topics(prefix)
    assert sorted(t for t in listed if is_run_topic(t, prefix)) == sorted([a, run_topic(topic, "prod", "dag", "run/2")])
    assert backend.list_topics(topic + "-nothing-here") == []


def test_a_run_map_is_dropped_only_while_it_holds_what_was_listed(backend: Backend, topic: str) -> None:
    from airflow_provider_pulsarstate.engine.recipes.xcom_store import drop_run_map

    with _store(backend, topic) as store:
        store.put("dag", "r", "t", -1, "a", "1", type_name="int")
        listed = store.entries()
        store.put("dag", "r", "t", -1, "b", "2", type_name="int")  # lands after the listing
    assert drop_run_map(backend, topic, namespace="prod", expected=listed, timeout=30) is False
    with _store(backend, topic) as store:
        assert sorted(e.key for e in store.list_run("dag", "r")) == ["a", "b"]  # nothing deleted
        listed = store.entries()
    assert drop_run_map(backend, topic, namespace="prod", expected=listed, timeout=30) is True
    assert topic not in backend.list_topics(topic)
    with _store(backend, topic) as store:
        assert store.list_run("dag", "r") == []
