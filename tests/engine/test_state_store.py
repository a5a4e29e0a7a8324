"""StateStore (engine/recipes/state_store.py): task/asset state in one PulsarMap per DAG run and per
asset, on both back ends."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from datetime import datetime, timezone

import pytest

from airflow_provider_pulsarstate.engine.backends import Backend
from airflow_provider_pulsarstate.engine.recipes.state_store import (
    AssetStateScope,
    OwnedMaps,
    StateStore,
    StateStoreDataError,
    TaskStateScope,
    parse_state_key,
)

T0 = TaskStateScope("dag/a", "run/1", "t", 0)
T1 = TaskStateScope("dag/a", "run/1", "t", 1)
ASSET = AssetStateScope("s3://bucket/prices")


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def maps(backend: Backend) -> Iterator[OwnedMaps]:
    with OwnedMaps(backend) as m:
        yield m


def _store(maps: OwnedMaps, topic: str, **options: object) -> StateStore:
    options.setdefault("namespace", "ns")
    return StateStore(maps, topic, **options)  # type: ignore[arg-type]


def test_keys_are_quoted_and_scopes_kept_apart(maps: OwnedMaps, topic: str) -> None:
    store = _store(maps, topic)
    store.set(T0, "k/x", {"a": 1})
    store.set(T1, "k/x", 2)
    store.set(ASSET, "k", [1, "x"])
    assert store.map_key(T0, "k/x") == "ns/task/dag%2Fa/run%2F1/t/0/k%2Fx"
    assert store.map_key(ASSET, "k") == "ns/asset/s3%3A%2F%2Fbucket%2Fprices/k"
    assert store.get(T0, "k/x") == {"a": 1} and store.get(T1, "k/x") == 2 and store.get(ASSET, "k") == [1, "x"]
    assert store.get_json(T0, "k/x") == '{"a": 1}'
    assert store.entries(T0) == {"k/x": {"a": 1}}
    assert store.entries(T0, all_map_indices=True) == {(0, "k/x"): {"a": 1}, (1, "k/x"): 2}
    assert store.entries(ASSET) == {"k": [1, "x"]}
    # a task id holding '/' cannot reach another task's entries
    assert store.entries(TaskStateScope("dag/a", "run/1", "t/0", -1)) == {}
    # one map per DAG run and one per asset; nothing on the base topic
    assert store.topic_of(T0) == store.topic_of(T1) != store.topic_of(ASSET)
    assert maps.opened() == sorted({store.topic_of(T0), store.topic_of(ASSET)})
    assert parse_state_key("ns", "ns/task/dag%2Fa/run%2F1/t/0/k%2Fx") == (T0, "k/x")
    for forged in ("ns/task/dag/a/run/1/t/0/k", "other/asset/x/k", "ns/asset/x", "ns/task/d/r/t/zero/k"):
        with pytest.raises(StateStoreDataError, match="does not name a state entry"):
            parse_state_key("ns", forged)


def test_delete_and_clear_one_map_index_or_all(maps: OwnedMaps, topic: str) -> None:
    store = _store(maps, topic)
    for scope in (T0, T1):
        store.set(scope, "a", 1)
        store.set(scope, "b", 2)
    store.set(ASSET, "a", 1)
    store.delete(T0, "a")
    store.delete(T0, "missing")
    assert store.entries(T0) == {"b": 2}
    assert store.clear(T1) == 2 and store.entries(T1) == {} and store.entries(T0) == {"b": 2}
    store.set(T1, "c", 3)
    assert store.clear(T0, all_map_indices=True) == 2
    assert store.entries(T0, all_map_indices=True) == {} and store.get(ASSET, "a") == 1
    assert store.clear(ASSET) == 1 and store.get(ASSET, "a") is None


def test_expired_entries_read_as_absent_and_are_removed(maps: OwnedMaps, topic: str) -> None:
    clock = Clock()
    store = _store(maps, topic, clock=clock)
    store.set(T0, "short", 1, expires_at=clock.now + 5)
    store.set(T0, "dated", 2, expires_at=datetime.fromtimestamp(clock.now + 50, tz=timezone.utc))
    store.set(ASSET, "forever", 3)
    assert store.get(T0, "short") == 1
    clock.now += 10
    assert store.get(T0, "short") is None and store.get(T0, "short", "dflt") == "dflt"
    assert store.entries(T0) == {"dated": 2}
    assert store.update(T0, "short", lambda v: (v or 0) + 10) == 10  # an expired value reads as None
    clock.now += 100
    assert store.remove_expired() == 1  # "dated"; "short" was re-created by update, without expiry
    with store.table(T0) as run_map, store.table(ASSET) as asset_map:
        assert store.entries(T0) == {"short": 10} and run_map.size() + asset_map.size() == 2
    assert store.get(ASSET, "forever") == 3
    with pytest.raises(ValueError, match="timezone-aware"):
        store.set(T0, "x", 1, expires_at=datetime(2030, 1, 1))


def test_update_keeps_expiry_and_set_expiry(maps: OwnedMaps, topic: str) -> None:
    clock = Clock()
    store = _store(maps, topic, clock=clock)
    store.set(T0, "n", 1, expires_at=clock.now + 5)
    assert store.update(T0, "n", lambda v: v + 1) == 2
    clock.now += 6
    assert store.get(T0, "n") is None  # update kept the expiry
    store.set(T0, "m", 1)
    assert store.set_expiry(T0, "m", clock.now + 1) is True and store.set_expiry(T0, "nope", None) is False
    clock.now += 2
    assert store.get(T0, "m") is None and store.remove_expired() == 2


def test_update_none_deletes_and_compare_and_set(maps: OwnedMaps, topic: str) -> None:
    store = _store(maps, topic)
    assert store.compare_and_set(ASSET, "w", None, 5) is True
    assert store.compare_and_set(ASSET, "w", None, 6) is False and store.get(ASSET, "w") == 5
    assert store.compare_and_set(ASSET, "w", 4, 6) is False
    assert store.compare_and_set(ASSET, "w", 5, 6) is True and store.get(ASSET, "w") == 6
    assert store.compare_and_set(ASSET, "w", 6, None) is True and store.get(ASSET, "w") is None
    store.set(ASSET, "x", 1)
    assert store.update(ASSET, "x", lambda v: None) is None and store.entries(ASSET) == {}


def test_concurrent_updates_lose_nothing(backend: Backend, topic: str) -> None:
    # two map instances (as two processes would have), four threads each
    with OwnedMaps(backend) as a, OwnedMaps(backend) as b:
        stores = [StateStore(a, topic, namespace="airflow"), StateStore(b, topic, namespace="airflow")]

        def work(store: StateStore) -> None:
            for _ in range(10):
                store.update(ASSET, "n", lambda v: (v or 0) + 1)

        threads = [threading.Thread(target=work, args=(stores[i % 2],)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert stores[0].get(ASSET, "n") == 80 and stores[1].get(ASSET, "n") == 80


def test_bad_stored_data_names_the_key(maps: OwnedMaps, topic: str) -> None:
    store = _store(maps, topic)
    key = store.map_key(T0, "k")
    with store.table(T0) as table:
        table.put(key, {"json": "{not json", "expires_at": None})
    with pytest.raises(StateStoreDataError, match="ns/task/dag%2Fa/run%2F1/t/0/k.*not JSON"):
        store.get(T0, "k")
    with store.table(T0) as table:
        table.put(key, [1, 2])
    with pytest.raises(StateStoreDataError, match="ns/task/dag%2Fa/run%2F1/t/0/k.*not a state record"):
        store.get(T0, "k")
    with pytest.raises(StateStoreDataError, match="not JSON text"):
        store.set_json(T0, "k2", "{nope")
    with pytest.raises(StateStoreDataError, match="not JSON-serializable"):
        store.set(T0, "k2", object())
    assert store.remove_expired() == 0  # bad records are left alone
    with store.table(T0) as table:
        assert table.get(key) == [1, 2]
    assert json.loads(json.dumps(store.entries(T1))) == {}
