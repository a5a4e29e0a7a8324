"""Taking the writer: local reads never wait for it, the backlog is read before it, and a rejected
write never takes it. Both back ends (real broker for Pulsar)."""

from __future__ import annotations

import time
from typing import Any

import pytest

from airflow_provider_pulsarstate import AcquireMode, SerializationError, ValueTooLargeError
from airflow_provider_pulsarstate.engine.backends.base import Backend
from airflow_provider_pulsarstate.engine.envelope import RecordKind
from airflow_provider_pulsarstate.testing import wait_until
from tests.engine.test_conformance import records


def test_local_reads_do_not_wait_while_the_writer_is_being_taken(maps: Any) -> None:
    holder = maps(writer_idle_timeout=None, handover_check_interval=None)  # kept while the other waits
    holder.put("k", 1)
    waiting = maps(acquire_mode=AcquireMode.WAIT, acquire_timeout=30)
    waiting.start()
    pending = waiting.put_async("k", 2)  # its commit thread now waits for the holder's writer
    time.sleep(0.5)
    assert not pending.done()
    slowest = 0.0
    for _ in range(10):
        started = time.monotonic()
        assert waiting.get("k") == 1
        slowest = max(slowest, time.monotonic() - started)
        time.sleep(0.05)
    assert slowest < 0.2, f"a local get() waited {slowest:.2f}s behind the writer's acquisition"
    holder.close()
    assert pending.result(timeout=30) == 2


def test_a_replica_far_behind_catches_up_before_taking_the_writer(maps: Any) -> None:
    behind = maps()
    behind.start()  # empty replica; it falls behind from here
    ahead = maps(writer_idle_timeout=None)
    for i in range(50):
        ahead.put_async(f"k{i}", i)
    ahead.put("last", 1)
    ahead.close()
    held_while_applying: list[bool] = []
    behind.add_listener(lambda change: held_while_applying.append(behind.manager.holds_writer))
    behind.put("mine", 1)
    assert len(held_while_applying) == 52
    assert not any(held_while_applying[:51]), "the backlog was read while holding the exclusive writer"
    assert held_while_applying[51]  # its own write, of course, under the writer


def test_a_rejected_value_takes_no_writer_and_appends_nothing(maps: Any, backend: Backend, topic: str) -> None:
    first = maps(writer_idle_timeout=0.1)
    first.put("ok", 1)
    wait_until(lambda: not first.manager.holds_writer, timeout=10, what="idle writer release")
    entries = len(records(backend, topic, kind=None))
    other = maps(max_value_bytes=1000)
    other.start()
    with pytest.raises(SerializationError, match="key 'bad'"):
        other.put("bad", {1, 2})  # rejected when called, before anything is submitted
    with pytest.raises(ValueTooLargeError, match="key 'big'"):
        other.put("big", "z" * 2000)
    with pytest.raises(SerializationError, match="key 7"):
        other.put_async(7, "a str key is expected")  # type: ignore[arg-type]
    with pytest.raises(SerializationError, match="key 'computed'"):
        other.update("computed", lambda k, v: {1, 2})  # computed from the state: rejected before the writer
    with pytest.raises(SerializationError):
        other.manager.write(lambda s: [(1, object(), b"")])  # the op serializer rejects it
    rejected = other.update_async("computed", lambda k, v: {3})
    no_op = other.update_async("absent", lambda k, v: None)  # nothing to append: no writer either
    with pytest.raises(SerializationError):
        rejected.result(timeout=30)
    assert no_op.result(timeout=30) is None
    assert other.manager.stats["acquisitions"] == 0 and not other.manager.holds_writer
    assert len(records(backend, topic, kind=None)) == entries  # no EPOCH record, nothing at all
    assert len(records(backend, topic, kind=RecordKind.EPOCH)) == 1  # the first writer's only
    assert other.put("fine", 2) == 2  # a good write still goes through
    assert maps().to_dict(latest=True) == {"ok": 1, "fine": 2}


def test_a_batch_with_a_rejected_write_commits_the_others(maps: Any) -> None:
    m = maps()
    m.put("n", 0)
    futures = [m.update_async("n", lambda k, v: v + 1) for _ in range(5)]
    futures.insert(2, m.update_async("bad", lambda k, v: {1}))
    futures += [m.update_async("n", lambda k, v: v + 1) for _ in range(5)]
    results = []
    for f in futures:
        try:
            results.append(f.result(timeout=30))
        except SerializationError:
            results.append("rejected")
    assert results == [1, 2, "rejected", 3, 4, 5, 6, 7, 8, 9, 10]
    assert maps().get("n", latest=True) == 10
