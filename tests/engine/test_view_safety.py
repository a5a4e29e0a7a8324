"""Temp views never execute code named in a log, and never publish a foreign or corrupt staged row."""

from __future__ import annotations

import struct
import time
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest

from airflow_provider_pulsarstate.engine.backends.base import Backend
from airflow_provider_pulsarstate.engine.envelope import (
    KEY_DELETE,
    KEY_SET,
    FrameError,
    decode_key_op,
    encode_key_op,
    encode_writes,
)
from airflow_provider_pulsarstate.engine.errors import UnknownScopePredicateError, ViewStagedRowError
from airflow_provider_pulsarstate.engine.recipes.table import StateTable, ViewStager, staging_topic

MARKERS: list[str] = []


def touch_marker(key: str) -> bool:
    """Would prove code ran: the old importlib resolution called this with a staged key."""
    Path(key).touch()
    MARKERS.append(key)
    return True


@pytest.fixture
def table(backend: Backend, topic: str) -> Iterator[StateTable]:
    t = StateTable(backend, topic, acquire_timeout=30.0, writer_idle_timeout=0.1)
    yield t
    t.close()


def _forge_view(table: StateTable, view_id: str, predicate: str) -> None:
    """Append a view record naming ``predicate`` straight to the log (as anyone with write access could)."""
    meta = {
        "scope_prefix": None,
        "scope_predicate": predicate,
        "expires_at": time.time() + 3600,
        "created_at": time.time(),
    }
    table.manager.write(lambda s: [{"o": "view", "id": view_id, "meta": meta}])


def _stage_foreign(backend: Backend, table: StateTable, view_id: str, ops: list[bytes], seq: int = 7) -> None:
    writer = backend.open_shared_writer(staging_topic(table.topic, view_id))
    try:
        writer.append([encode_writes([(seq, ops)])], timeout=60.0)
    finally:
        writer.close()


def test_a_predicate_named_in_the_log_is_never_imported_or_called(
    table: StateTable, backend: Backend, tmp_path: Path
) -> None:
    table.put("keep", {"v": 1})
    for name in ("os:system", "os.system", "tests.engine.test_view_safety:touch_marker"):
        with pytest.raises(
            UnknownScopePredicateError, match=f"scope predicate {name!r} is not registered.*register_scope_predicate"
        ):
            table.create_view(scope_predicate=name)
    marker = tmp_path / "predicate-ran"
    _forge_view(table, "forged", "tests.engine.test_view_safety:touch_marker")
    with ViewStager(backend, table.topic, "forged") as stager:
        stager.set(str(marker), {"v": 2})
    table.seal("forged", stagers=[stager])
    for attempt in (table.plan, table.apply):
        with pytest.raises(
            UnknownScopePredicateError,
            match="view 'forged': scope predicate 'tests.engine.test_view_safety:touch_marker'",
        ):
            attempt("forged")
    assert not marker.exists() and MARKERS == []
    assert table.to_dict(latest=True) == {"keep": {"v": 1}}


# (op, expected message, whether the message names the stager: structural faults are found as a
# batch is read, value faults only for rows the diff would publish, by key)
_BAD_ROWS = [
    (encode_key_op(KEY_SET, b"\xff\xfe", b'{"v":1}'), r"key b'\\xff\\xfe'.*not valid UTF-8", True),
    (bytes([9]) + b"k-kind", r"key 'k-kind'.*unknown row kind 9", True),
    (encode_key_op(KEY_SET, b"k-json", b"not json"), r"key 'k-json'.*not the canonical JSON", False),
    (encode_key_op(KEY_SET, b"k-list", b"[1,2]"), r"key 'k-list'.*must be a dict", False),
    (encode_key_op(KEY_SET, b"k-nested", b'{"a":{"b":1}}'), r"key 'k-nested'.*not a JSON scalar", False),
    (encode_key_op(KEY_SET, b"k-order", b'{"b":1,"a":2}'), r"key 'k-order'.*not canonical", False),
    (
        bytes([KEY_SET]) + struct.pack(">I", 1000) + b"k-long",
        r"key b.*k-long.*key length of 1000 bytes but holds only 6",
        True,
    ),
    (b"\x03\x92\x01", r"key '\?'.*batch of rows does not decode", True),
    (b"\x03" + msgspec.msgpack.encode([["k-int", 5]]), r"key '\?'.*batch of rows does not decode", True),
    (b"\x04" + msgspec.msgpack.encode({"k-int": 5}), r"key '\?'.*batch of rows does not decode", True),
    (b"\x04" + msgspec.msgpack.encode({"": b"{}"}), r"key ''.*empty key", False),
]


def test_foreign_staged_rows_are_rejected_and_nothing_is_published(table: StateTable, backend: Backend) -> None:
    table.put("keep", {"v": 1})
    for i, (op, message, names_stager) in enumerate(_BAD_ROWS):
        view = table.create_view(view_id=f"foreign-{i}")
        with table.stager(view.view_id) as stager:
            stager.set("keep", {"v": 1})
            stager.set("good", {"v": 2})
        # the foreign row comes under the sealed stager's id, so it is part of the view
        table.seal(view.view_id, stagers={stager.stager_id: 3})
        _stage_foreign(backend, table, view.view_id, [op], seq=int(stager.stager_id, 16))
        for attempt in (table.plan, table.apply):
            with pytest.raises(ViewStagedRowError, match=rf"view 'foreign-{i}': staged row of {message}") as info:
                attempt(view.view_id)
            assert (f"stager {stager.stager_id}" in str(info.value)) == names_stager
        assert table.to_dict(latest=True) == {"keep": {"v": 1}}, message  # nothing published


def test_decode_key_op_rejects_a_key_length_past_the_op() -> None:
    assert decode_key_op(encode_key_op(KEY_SET, b"key", b"value")) == (KEY_SET, b"key", b"value")
    assert decode_key_op(encode_key_op(KEY_DELETE, b"key")) == (KEY_DELETE, b"key", None)
    with pytest.raises(FrameError, match="declares a key length of 10 bytes but holds only 3"):
        decode_key_op(bytes([KEY_SET]) + struct.pack(">I", 10) + b"key")
    with pytest.raises(FrameError, match="shorter than its key length field"):
        decode_key_op(bytes([KEY_SET, 0, 0]))


def test_apply_refuses_by_default_to_delete_more_than_half_the_scope(table: StateTable) -> None:
    from airflow_provider_pulsarstate.engine.errors import ViewGuardError

    for i in range(10):
        table.put(f"k{i}", {"v": i})

    def view(n: int) -> str:
        v = table.create_view()
        with table.stager(v.view_id) as stager:
            for i in range(n):
                stager.set(f"k{i}", {"v": i})
        table.seal(v.view_id, stagers=[stager])
        return v.view_id

    short = view(4)  # a job that staged too little would delete 6 of 10
    with pytest.raises(
        ViewGuardError, match=r"would delete 6 key.*max_delete_fraction=0.5 of 10 row\(s\) in scope \(limit 5\)"
    ):
        table.apply(short)
    with pytest.raises(ViewGuardError, match="would delete 6"):
        table.apply(short, max_delete_fraction=0.55)
    assert table.size(latest=True) == 10  # nothing published
    assert table.apply(short, max_deletes=6).delete == 6  # the caller raised the limit
    table.apply(view(10))
    assert table.apply(view(5)).delete == 5  # exactly half is allowed
    assert table.apply(view(0), max_delete_fraction=None).delete == 5  # no limit


def test_remote_stagers_that_wrote_elsewhere_make_apply_refuse(
    table: StateTable, backend: Backend, tmp_path: Path
) -> None:
    """Executors on other hosts with a private embedded file: their rows never reach this table's staging topic."""
    from airflow_provider_pulsarstate import ConnectionConfig, open_backend
    from airflow_provider_pulsarstate.engine.errors import ViewNotSealedError, ViewSealMismatchError

    for i in range(10):
        table.put(f"k{i}", {"v": i})
    view = table.create_view()
    elsewhere = open_backend(ConnectionConfig(url=str(tmp_path / "other-host.db")))
    try:
        remote = [ViewStager(elsewhere, table.topic, view.view_id) for _ in range(2)]
        for n, stager in enumerate(remote):
            with stager:
                stager.set_many([(f"k{i}", {"v": i}) for i in range(n * 5, n * 5 + 5)])
    finally:
        elsewhere.close()
    with pytest.raises(ViewNotSealedError, match="is not sealed"):
        table.apply(view.view_id, max_delete_fraction=None)
    table.seal(view.view_id, stagers=remote)  # the driver seals with the counts the executors reported
    for attempt in (table.plan, lambda v: table.apply(v, max_delete_fraction=None)):
        with pytest.raises(
            ViewSealMismatchError,
            match=rf"{remote[0].stager_id}: 5 vs 0, {remote[1].stager_id}: 5 vs 0|"
            rf"{remote[1].stager_id}: 5 vs 0, {remote[0].stager_id}: 5 vs 0",
        ):
            attempt(view.view_id)
    assert table.to_dict(latest=True) == {f"k{i}": {"v": i} for i in range(10)}  # nothing deleted


def test_only_rows_of_sealed_stagers_are_applied(table: StateTable, backend: Backend) -> None:
    """A failed (retried) Spark task's partial rows are ignored; the seal names the attempts that counted."""
    table.put("a", {"v": 1})
    view = table.create_view()
    with table.stager(view.view_id) as failed:
        failed.set("bogus", {"v": 0})
    with table.stager(view.view_id) as retried:
        retried.set("a", {"v": 2})
    info = table.seal(view.view_id, stagers=[retried])
    assert info.sealed == {retried.stager_id: 1}
    result = table.apply(view.view_id)
    assert (result.set, result.delete) == (1, 0)
    assert table.to_dict(latest=True) == {"a": {"v": 2}}
