"""StateTable checkpoints and the table's log format, on both back ends.

A checkpoint of a table holds its rows, its views (open ones and the newest closed ones, with
their results), the per-key change offsets conflict checks need and the recorded source offsets:
a fresh instance that loads it must behave exactly like one that replayed the whole log.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest

from airflow_provider_pulsarstate.engine.backends.base import Backend
from airflow_provider_pulsarstate.engine.checkpoint import CheckpointStore
from airflow_provider_pulsarstate.engine.errors import ViewConflictError, ViewNotFoundError
from airflow_provider_pulsarstate.engine.manager import SharedStateManager
from airflow_provider_pulsarstate.engine.recipes import table_state as table_state_module
from airflow_provider_pulsarstate.engine.recipes.table import SourceRange, StateTable
from airflow_provider_pulsarstate.engine.recipes.table_ops import decode_op, encode_op
from tests.engine.test_views import switch as staged_view


def switch(table: StateTable, rows: dict[str, dict], *, sources: list[SourceRange] | None = None, **view: Any) -> str:
    return staged_view(table, rows, sources=sources or [], **view).view_id


def everything(table: StateTable) -> tuple[Any, ...]:
    """What a table instance knows, for comparing two of them."""
    views = sorted((v.as_dict() for v in table.views(latest=True)), key=lambda v: v["view_id"])
    return table.to_dict(latest=True), views, table.source_offsets("src", latest=True)


def test_a_fresh_instance_loads_the_checkpoint_and_equals_a_full_replay(tables: Any) -> None:
    w = tables(checkpoint_after_bytes=None)
    rows = {f"k{i}": {"v": i, "f": i / 2} for i in range(50)}
    applied = switch(w, rows, sources=[SourceRange("src", 0, 0, 50)])
    w.apply(applied)
    # an open, sealed, scoped view goes into the image
    switch(
        w,
        {**{k: r for k, r in rows.items() if k.startswith("k1")}, "k1": {"v": -1}},
        view_id="still-open",
        scope_prefix="k1",
    )
    info = w.checkpoint()
    assert info is not None
    w.put("after", {"v": "tail"})  # a record after the checkpoint: replayed on top of the image

    fresh = tables()
    fresh.start()
    assert fresh.manager.stats["checkpoint_loaded_offset"] == info.offset
    assert fresh.manager.stats["records_replayed"] == 1
    replayed = tables(use_checkpoints=False)
    assert everything(fresh) == everything(replayed) == everything(w)
    assert fresh.get("k3") == {"v": 3, "f": 1.5} and fresh.get("after") == {"v": "tail"}
    # the idempotent re-apply answers from the image too
    again = fresh.apply(applied)
    assert again.already_applied and again.set == 50 and again.commit_offset == w.view_info(applied).commit_offset
    result = fresh.apply("still-open")
    assert (result.set, result.delete, result.unchanged) == (1, 0, 10)


def test_conflicts_are_detected_across_a_checkpoint(tables: Any) -> None:
    w = tables(checkpoint_after_bytes=None)
    w.apply(switch(w, {"a": {"v": 1}, "b": {"v": 1}}))
    view = switch(w, {"a": {"v": 2}, "b": {"v": 2}}, view_id="late")  # baseline pinned here
    w.put("a", {"v": 99})  # another producer changes a key the view touches
    assert w.checkpoint() is not None
    w.close()

    fresh = tables()
    fresh.start()
    assert fresh.manager.stats["records_replayed"] == 0  # everything came from the image
    with pytest.raises(ViewConflictError, match="'late'.*1 key.*: a$") as err:
        fresh.apply(view)
    assert err.value.keys == ["a"]
    assert fresh.get("a") == {"v": 99}  # nothing published


def test_the_writer_checkpoints_by_itself_after_enough_log(tables: Any) -> None:
    w = tables(checkpoint_after_bytes=2_000)
    for version in range(3):
        w.apply(switch(w, {f"k{i}": {"v": i + version} for i in range(200)}))
    w.close()  # joins a checkpoint still being stored
    assert w.manager.stats["checkpoints_written"] >= 1
    fresh = tables()
    assert fresh.to_dict(latest=True) == {f"k{i}": {"v": i + 2} for i in range(200)}
    assert fresh.manager.stats["checkpoint_loaded_offset"] > 0


def test_a_damaged_table_image_means_a_full_replay(
    tables: Any, backend: Backend, topic: str, caplog: pytest.LogCaptureFixture
) -> None:
    w = tables(checkpoint_after_bytes=None)
    w.apply(switch(w, {f"k{i}": {"v": i} for i in range(20)}))
    info = w.checkpoint()
    assert info is not None
    # a complete, checksummed image that is not a table image (as anyone who can write the topics could store)
    CheckpointStore(backend, topic).save(
        offset=info.offset, epoch=info.epoch, position=info.position, data=b"\x93\x01\xc0\xc0", log_id=info.log_id
    )
    caplog.set_level(logging.WARNING, logger="airflow_provider_pulsarstate")
    fresh = tables()
    assert fresh.to_dict(latest=True) == {f"k{i}": {"v": i} for i in range(20)}
    assert fresh.manager.stats["checkpoint_loaded_offset"] == -1
    assert any("does not deserialize" in r.getMessage() for r in caplog.records)


def test_closed_views_beyond_the_limit_are_forgotten_identically_everywhere(
    tables: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(table_state_module, "KEEP_CLOSED_VIEWS", 3)
    w = tables(checkpoint_after_bytes=None)
    ids = [switch(w, {"k": {"v": n}}, view_id=f"v{n}") for n in range(6)]
    for vid in ids[:5]:
        w.apply(vid, overwrite=True)  # each view touches the key the one before it changed
    # five closed and one open view: only the newest three closed ones are kept, the open one always
    assert [v.view_id for v in w.views()] == ["v2", "v3", "v4", "v5"]
    with pytest.raises(ViewNotFoundError, match="v0"):
        w.apply("v0")
    w.checkpoint()
    w.drop("v5")
    assert [v.view_id for v in tables().views()] == [v.view_id for v in w.views()] == ["v3", "v4", "v5"]
    assert [v.view_id for v in tables(use_checkpoints=False).views()] == ["v3", "v4", "v5"]


def test_memory_held_does_not_grow_with_versions(tables: Any) -> None:
    """Per-key change offsets live only while a view is open; closed views are bounded."""
    w = tables(checkpoint_after_bytes=None)
    for version in range(8):
        w.apply(switch(w, {f"k{i}": {"v": i + version} for i in range(30)}))
        state = w.manager.read(lambda s: s)
        assert state.changed == {} and state.n_open == 0
    assert len(state.rows) == 30 and all(type(v) is bytes for v in state.rows.values())


def test_a_log_written_with_json_row_ops_stays_readable(backend: Backend, topic: str, tables: Any) -> None:
    """Row ops were JSON objects (the record as an object) before the binary layout."""
    old = SharedStateManager(
        backend,
        topic,
        initializer=dict,
        applier=lambda s, op: None,
        op_serializer=lambda op: json.dumps(op).encode(),
        op_deserializer=json.loads,
        acquire_timeout=30.0,
    )
    old.write(
        lambda s: [
            {"o": "set", "k": "a", "v": {"b": 2.0, "a": "x"}, "w": None},
            {"o": "set", "k": "gone", "v": {"v": 1}, "w": None},
            {"o": "del", "k": "gone", "w": None},
        ]
    )
    old.close()
    t = tables()
    assert t.to_dict(latest=True) == {"a": {"a": "x", "b": 2}}
    assert t.manager.read(lambda s: s.rows["a"]) == b'{"a":"x","b":2}'  # canonicalized as read
    view = switch(t, {"a": {"b": 2, "a": "x"}})
    assert t.apply(view).unchanged == 1  # equal as bytes: nothing published


@pytest.mark.parametrize(
    "op",
    [
        {"o": "set", "k": "ключ/1", "v": b'{"a":1}', "w": "view-1"},
        {"o": "set", "k": "k", "v": b"{}", "w": None},
        {"o": "del", "k": "k", "w": "v"},
        {"o": "view_end", "id": "v", "status": "applied", "result": {"set": 1}},
    ],
)
def test_ops_round_trip(op: dict[str, Any]) -> None:
    assert decode_op(encode_op(op)) == op


@pytest.mark.parametrize(
    "data, problem",
    [
        (b"\x01\x00", "truncated"),
        (b"\x01\x00\x00\x00\x00\x00\x09k", "declares a 9-byte key"),
        (b"\x02\x00\x00\x00\x00\x00\x01kv", "declares a 1-byte key"),
        (b'{"o":"exec"}', "unknown table op type 'exec'"),
    ],
)
def test_malformed_ops_are_refused(data: bytes, problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        decode_op(data)
