"""The guarantees of SharedStateManager and PulsarMap, on both back ends (real broker for Pulsar)."""

from __future__ import annotations

import json
import logging
import threading
import time
from typing import Any

import pytest

from airflow_provider_pulsarstate import (
    AcquireMode,
    CorruptEntryError,
    OperationTimeoutError,
    SerializationError,
    SharedStateManager,
    ValueTooLargeError,
    WriterBusyError,
    WriterFencedError,
)
from airflow_provider_pulsarstate.engine.backends.base import Backend
from airflow_provider_pulsarstate.engine.envelope import RecordKind, decode_writes
from airflow_provider_pulsarstate.engine.wal import LogReader
from airflow_provider_pulsarstate.testing import FaultInjectingBackend, wait_until


def records(backend: Backend, topic: str, kind: RecordKind | None = RecordKind.DATA) -> list[Any]:
    """Every complete record of the topic, read with a fresh reader."""
    reader = LogReader(backend, topic)
    out = []
    try:
        while reader.has_next():
            rec = reader.read_next(timeout=10)
            if rec is not None and (kind is None or rec.kind is kind):
                out.append(rec)
    finally:
        reader.close()
    return out


class Counting:
    """A counter state whose applier counts its calls."""

    def __init__(self) -> None:
        self.calls = 0

    def apply(self, state: dict, op: dict) -> None:
        self.calls += 1
        state[op["k"]] = state.get(op["k"], 0) + op["d"]


def counter_manager(backend: Backend, topic: str, counting: Counting, **options: Any) -> SharedStateManager:
    options.setdefault("acquire_timeout", 20.0)
    return SharedStateManager(backend, topic, initializer=dict, applier=counting.apply, **options)


# ---------------------------------------------------------------------------------- PulsarMap API
def test_map_interface_and_pip_return_values(maps: Any) -> None:
    m = maps()
    assert m.get("a") is None
    assert m.put("a", {"v": 1}) == {"v": 1}
    assert m.get("a") == {"v": 1}
    assert m.get_or_default("zz", 7) == 7
    assert m.update("n", lambda k, v: (v or 0) + 5) == 5
    assert m.put_if_absent("n", 99) == 5
    assert m.put_if_absent("p", 1) == 1
    assert m.replace("p", 2, 3) == 1  # expected value did not match: unchanged
    assert m.replace("p", 1, 3) == 3
    assert m.pop("p") == 3
    assert m.delete("n") is None
    assert sorted(m.list_keys()) == ["a"]
    m.put("b", 2)
    m.put("c", 3)
    seen: dict = {}
    assert m.scan(lambda k: k != "a", seen.__setitem__) == 2
    assert seen == {"b": 2, "c": 3}
    assert m.update_multiple(lambda k: k in ("b", "c"), lambda k, v: v * 10) == 2
    assert m.to_dict() == {"a": {"v": 1}, "b": 20, "c": 30}
    assert m.clear() == 3
    assert m.size() == 0


def test_a_write_that_changes_nothing_appends_nothing(maps: Any, backend: Backend, topic: str) -> None:
    m = maps()
    m.put("k", 1)
    before = len(records(backend, topic))
    assert m.put("k", 1) == 1
    assert m.replace("k", 5, 6) == 1
    assert m.delete("absent") is None
    assert len(records(backend, topic)) == before


# ---------------------------------------------------------------------------------- atomicity
def test_a_20mb_write_is_one_record_and_lands_whole(maps: Any, backend: Backend, topic: str) -> None:
    m = maps()
    blob = json.dumps("x" * 1000).encode()  # a serialized value, as PulsarMap ops carry them
    m.update_multiple(lambda k: True, lambda k, v: v)  # no-op write first, for an EPOCH record
    n = m.manager.write(lambda s: [(1, f"k{i:05d}", blob) for i in range(21_000)], lambda s: len(s))
    assert n == 21_000
    recs = records(backend, topic)
    assert len(recs) == 1 and len(recs[0].body) > 20 * 1024 * 1024
    fresh = maps()
    assert fresh.size(latest=True) == 21_000


def test_a_writer_that_dies_half_way_leaves_nothing_applied(maps: Any, backend: Backend, topic: str) -> None:
    faulty = FaultInjectingBackend(backend)
    m = maps(on=faulty, max_frame_bytes=64 * 1024, max_retries=0)
    m.put("before", 1)
    faulty.crash_next_append(after_frames=3)
    with pytest.raises(Exception):
        m.manager.write(lambda s: [(1, f"big{i}", b'"' + b"y" * 1000 + b'"') for i in range(1000)], retry=False)
    assert faulty.injected == ["partial"]
    fresh = maps()
    assert fresh.to_dict(latest=True) == {"before": 1}
    # the log goes on: the next writer's records apply normally
    fresh.put("after", 2)
    assert maps().to_dict(latest=True) == {"before": 1, "after": 2}


# ---------------------------------------------------------------------------------- catch-up & double apply
def test_ops_are_generated_from_the_caught_up_state(maps: Any) -> None:
    a, b = maps(writer_idle_timeout=0.2), maps(writer_idle_timeout=0.2)
    b.start()  # b's replica is now empty and stays stale
    a.put("n", 1)
    a.update("n", lambda k, v: v + 1)
    assert b.get("n") is None  # stale local replica
    assert b.update("n", lambda k, v: (v or 0) + 1) == 3  # generated after catching up under the writer


def test_no_op_is_applied_twice(backend: Backend, topic: str) -> None:
    c1 = Counting()
    m = counter_manager(backend, topic, c1)
    try:
        for i in range(20):
            m.write(lambda s: [{"k": "x", "d": 1}])
        futures = [m.write_async(lambda s: [{"k": "x", "d": 1}]) for _ in range(50)]
        for f in futures:
            f.result()
        assert m.read(lambda s: s["x"], latest=True) == 70
        assert c1.calls == 70  # the replay of our own records applied nothing again
        c2 = Counting()
        other = counter_manager(backend, topic, c2)
        assert other.read(lambda s: s["x"], latest=True) == 70 and c2.calls == 70
        other.close()
    finally:
        m.close()


def test_group_commit_shares_records(backend: Backend, topic: str) -> None:
    m = counter_manager(backend, topic, Counting())
    try:
        futures = [m.write_async(lambda s: [{"k": "x", "d": 1}], lambda s: s["x"]) for _ in range(500)]
        results = [f.result() for f in futures]
        assert sorted(results) == list(range(1, 501))  # each write saw its own predecessor
        assert m.stats["records_appended"] < 500
        assert m.stats["acquisitions"] == 1
    finally:
        m.close()


# ---------------------------------------------------------------------------------- exactly once
def test_lost_ack_is_found_in_the_log_not_sent_again(backend: Backend, topic: str) -> None:
    faulty = FaultInjectingBackend(backend)
    m = counter_manager(faulty, topic, Counting())
    try:
        m.write(lambda s: [{"k": "x", "d": 1}])
        faulty.lose_next_ack()
        assert m.write(lambda s: [{"k": "x", "d": 1}], lambda s: s["x"]) == 2
        assert faulty.injected == ["lose_ack"]
        assert m.stats["retries"] == 1
        assert m.read(lambda s: s["x"], latest=True) == 2
    finally:
        m.close()
    fresh = counter_manager(backend, topic, Counting())
    try:
        assert fresh.read(lambda s: s["x"], latest=True) == 2  # exactly once in the log
    finally:
        fresh.close()
    assert sum(1 for r in records(backend, topic)) == 2


def test_failed_send_is_retried_with_regenerated_ops(backend: Backend, topic: str) -> None:
    faulty = FaultInjectingBackend(backend)
    m = counter_manager(faulty, topic, Counting())
    try:
        m.write(lambda s: [{"k": "x", "d": 1}])
        faulty.fail_next_append()
        assert m.write(lambda s: [{"k": "x", "d": 1}], lambda s: s["x"]) == 2
        assert m.stats["rebuilds"] == 1  # local ops were rolled back by a replay
    finally:
        m.close()
    assert len(records(backend, topic)) == 2


# ---------------------------------------------------------------------------------- fencing
def test_fenced_writer_never_appends_and_retries_on_a_new_epoch(maps: Any, backend: Backend, topic: str) -> None:
    # a keeps its writer even while b waits for it (no handover): b must take it over
    a = maps(writer_idle_timeout=None, handover_check_interval=None, acquire_mode=AcquireMode.FENCE)
    b = maps(writer_idle_timeout=None, acquire_mode=AcquireMode.FENCE)
    a.put("n", 1)
    assert a.manager.holds_writer
    b.update("n", lambda k, v: v + 10)  # takes the writer over: a is fenced
    with pytest.raises(WriterFencedError):
        a.update("n", lambda k, v: v + 100, retry=False)
    assert b.get("n", latest=True) == 11  # the fenced write never landed
    assert a.update("n", lambda k, v: v + 100) == 111  # retried on a new epoch, from the new state
    epochs = [r.epoch for r in records(backend, topic, kind=RecordKind.EPOCH)]
    assert epochs == sorted(epochs) and len(set(epochs)) == len(epochs)


def test_fail_fast_and_bounded_wait(maps: Any) -> None:
    a = maps(writer_idle_timeout=None, handover_check_interval=None)  # kept while the others try
    a.put("k", 1)
    busy = maps(acquire_mode=AcquireMode.FAIL_FAST)
    with pytest.raises(WriterBusyError):
        busy.put("k", 2)
    waiter = maps(acquire_mode=AcquireMode.WAIT, acquire_timeout=1.5)
    start = time.monotonic()
    with pytest.raises(OperationTimeoutError):
        waiter.put("k", 3)
    assert time.monotonic() - start < 10


def test_idle_writer_is_released(maps: Any) -> None:
    a = maps(writer_idle_timeout=0.3)
    a.put("k", 1)
    wait_until(lambda: not a.manager.holds_writer, timeout=10, what="idle writer release")
    b = maps(acquire_mode=AcquireMode.FAIL_FAST)
    assert b.put("k", 2) == 2


# ---------------------------------------------------------------------------------- reads
def test_read_latest_sees_the_tail_and_linearizable_goes_through_the_writer(
    maps: Any, backend: Backend, topic: str
) -> None:
    a, b = maps(writer_idle_timeout=0.1), maps(writer_idle_timeout=0.1)
    b.start()
    a.put("k", 1)
    assert b.get("k") is None
    assert b.get("k", latest=True) == 1
    wait_until(lambda: not a.manager.holds_writer, timeout=10, what="idle writer release")
    a.put("k", 2)
    wait_until(lambda: not a.manager.holds_writer, timeout=10, what="idle writer release")
    assert b.get("k", linearizable=True) == 2
    assert len(records(backend, topic, kind=RecordKind.BARRIER)) == 1


def test_read_latest_includes_own_unawaited_writes(maps: Any) -> None:
    m = maps()
    for i in range(200):
        m.put_async(f"k{i}", i)  # not awaited
    assert m.size(latest=True) == 200


def test_bootstrap_replays_with_progress(maps: Any, caplog: pytest.LogCaptureFixture) -> None:
    w = maps()
    futures = [w.put_async(f"k{i}", i) for i in range(3000)]
    for f in futures:
        f.result()
    caplog.set_level(logging.INFO, logger="airflow_provider_pulsarstate")
    fresh = maps(progress_interval=0.0)
    assert fresh.size(latest=True) == 3000
    lines = [r.getMessage() for r in caplog.records if "replaying" in r.getMessage()]
    assert lines and "records" in lines[-1] and "records/s" in lines[-1]


# ---------------------------------------------------------------------------------- listeners
def test_listeners_see_every_committed_change_once(maps: Any) -> None:
    a = maps(writer_idle_timeout=0.1)
    b = maps(follow_interval=0.05, writer_idle_timeout=0.1)
    seen_a: list = []
    seen_b: list = []
    a.add_listener(lambda c: seen_a.append((c.type, c.key, c.value, c.offset)))
    b.add_listener(lambda c: seen_b.append((c.type, c.key, c.value, c.offset)))
    b.start()
    a.put("x", 1)
    a.delete("x")
    a.put("y", 2)
    a.clear()
    expected = [("set", "x", 1, 0), ("delete", "x", None, 1), ("set", "y", 2, 2), ("clear", None, None, 3)]
    assert seen_a == expected
    wait_until(lambda: len(seen_b) >= 4, timeout=10, what="follower catching up")
    assert seen_b == expected


# ---------------------------------------------------------------------------------- bad input
def test_unserializable_or_oversized_values_append_nothing(maps: Any, backend: Backend, topic: str) -> None:
    m = maps(max_value_bytes=1000)
    m.put("ok", 1)
    with pytest.raises(SerializationError, match="key 'bad'"):
        m.put("bad", {1, 2})
    with pytest.raises(ValueTooLargeError, match="key 'big'.*1,000-byte limit"):
        m.put("big", "z" * 2000)
    with pytest.raises(SerializationError, match="key 7"):
        m.put(7, "not a str key")  # type: ignore[arg-type]
    assert len(records(backend, topic)) == 1
    assert maps().to_dict(latest=True) == {"ok": 1}


def test_unknown_op_type_names_topic_and_offset(maps: Any, backend: Backend, topic: str) -> None:
    raw = SharedStateManager(
        backend, topic, initializer=dict, applier=lambda s, o: None, op_serializer=bytes, op_deserializer=bytes
    )
    raw.write(lambda s: [b"\x01\x00\x00\x00\x01a1"])  # a valid map put a=1
    raw.write(lambda s: [b"\x09junk"])  # op type 9 does not exist
    raw.close()
    m = maps()
    with pytest.raises(CorruptEntryError) as info:
        m.get("a", latest=True)
    assert info.value.topic == topic and "offset 1" in str(info.value) and "unknown map op type 9" in str(info.value)
    skipping = maps(on_corrupt="skip")
    assert skipping.to_dict(latest=True) == {"a": 1}


def test_a_stored_value_that_does_not_decode_fails_on_read_naming_the_key(
    maps: Any, backend: Backend, topic: str
) -> None:
    raw = SharedStateManager(
        backend, topic, initializer=dict, applier=lambda s, o: None, op_serializer=bytes, op_deserializer=bytes
    )
    raw.write(lambda s: [b"\x01\x00\x00\x00\x02ok1", b"\x01\x00\x00\x00\x03bad{not json"])
    raw.close()
    m = maps()
    assert m.get("ok", latest=True) == 1  # replay and other keys are unaffected
    with pytest.raises(SerializationError, match=r"stored value of key 'bad' does not decode"):
        m.get("bad")
    with pytest.raises(SerializationError, match="key 'bad'"):
        m.update("bad", lambda k, v: 0)  # a write from it fails before appending anything


def test_undecodable_entry_stops_bootstrap_unless_skipped(
    maps: Any, backend: Backend, backend_config: Any, topic: str
) -> None:
    m = maps(writer_idle_timeout=0.05)
    m.put("a", 1)
    wait_until(lambda: not m.manager.holds_writer, timeout=10, what="idle writer release")
    write_garbage(backend, backend_config, topic, b"short")
    write_garbage(backend, backend_config, topic, b"not a frame, but long enough to hold a header" * 2)
    with pytest.raises(CorruptEntryError) as info:
        maps().get("a", latest=True)
    assert info.value.topic == topic and "shorter than the 44-byte header" in info.value.cause
    assert "next offset 1" in str(info.value)
    skipping = maps(on_corrupt="skip")
    assert skipping.get("a", latest=True) == 1
    assert skipping.manager.stats.corrupt_skipped == 2  # both logged and skipped, nothing else lost
    skipping.put("b", 2)
    assert maps(on_corrupt="skip").to_dict(latest=True) == {"a": 1, "b": 2}


def write_garbage(backend: Backend, config: Any, topic: str, payload: bytes) -> None:
    """Append bytes that are not a frame, the way a foreign producer would."""
    if config.kind == "pulsar":
        import pulsar

        client = pulsar.Client(config.url)
        try:
            producer = client.create_producer(topic, batching_enabled=False)
            producer.send(payload)
            producer.close()
        finally:
            client.close()
    else:
        writer = backend.acquire_writer(topic, mode=AcquireMode.FAIL_FAST, timeout=5)
        writer.append([payload], timeout=5)
        writer.close()


# ---------------------------------------------------------------------------------- threads
def test_blocking_calls_are_thread_safe(maps: Any) -> None:
    m = maps()
    errors: list[BaseException] = []

    def work(i: int) -> None:
        try:
            for _ in range(25):
                m.update("n", lambda k, v: (v or 0) + 1)
                m.get("n", latest=True)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert maps().get("n", latest=True) == 200


def test_generic_manager_with_json_ops(backend: Backend, topic: str) -> None:
    m = SharedStateManager(backend, topic, initializer=list, applier=lambda s, op: s.append(op))
    try:
        assert m.write(lambda s: [{"i": len(s)}, {"i": len(s) + 1}], lambda s: list(s)) == [{"i": 0}, {"i": 1}]
        [(seq, ops)] = decode_writes(records(backend, topic)[0].body)  # one write, two ops, one record
        assert seq == 1 and [json.loads(op) for op in ops] == [{"i": 0}, {"i": 1}]
    finally:
        m.close()
