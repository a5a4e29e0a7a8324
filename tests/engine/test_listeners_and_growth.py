"""Nothing grows without bound, listeners can be removed and their errors are counted, and a
listener writing while the idle writer is released does not deadlock. Both back ends."""

from __future__ import annotations

import logging
import time
from typing import Any

import pytest

from airflow_provider_pulsarstate import AcquireMode, PulsarMap
from airflow_provider_pulsarstate.engine.backends.base import Backend
from airflow_provider_pulsarstate.testing import FaultInjectingBackend, wait_until
from tests.engine.test_conformance import Counting, counter_manager


def test_closed_writers_and_readers_are_forgotten_by_the_back_end(backend: Backend, topic: str) -> None:
    for _ in range(20):
        backend.create_reader(topic).close()
        backend.acquire_writer(topic, mode=AcquireMode.FAIL_FAST, timeout=10).close()
    for _ in range(5):
        backend.open_shared_writer(f"{topic}-shared").close()
    assert not backend._children  # type: ignore[attr-defined]
    kept = backend.create_reader(topic)
    assert set(backend._children) == {kept}  # type: ignore[attr-defined]
    kept.close()


def test_a_manager_that_rebuilds_and_reacquires_keeps_no_dead_children(backend: Backend, topic: str) -> None:
    faulty = FaultInjectingBackend(backend)
    m = counter_manager(faulty, topic, Counting(), writer_idle_timeout=0.01)
    try:
        m.write(lambda s: [{"k": "x", "d": 1}])
        for _ in range(10):
            faulty.fail_next_append()  # each: drop the writer, rebuild the state, take a new writer
            m.write(lambda s: [{"k": "x", "d": 1}])
        # Every fault drops the writer and the retry takes a new one; a rebuild is skipped when the
        # idle release already caught the state up, so only "at least one" is certain for it.
        assert m.stats["retries"] >= 10 and m.stats["acquisitions"] >= 11 and m.stats["rebuilds"] >= 1
        assert len(backend._children) <= 2  # type: ignore[attr-defined] # one reader, maybe the writer
    finally:
        m.close()
    assert not backend._children  # type: ignore[attr-defined]


def test_a_removed_listener_hears_nothing_more(maps: Any) -> None:
    m = maps()
    first: list[Any] = []
    second: list[Any] = []
    handle = m.add_listener(lambda c: first.append(c.key))
    m.add_listener(lambda c: second.append(c.key))
    m.put("a", 1)
    assert m.remove_listener(handle) is True
    assert m.remove_listener(handle) is False
    m.put("b", 2)
    assert first == ["a"] and second == ["a", "b"]
    assert m.manager.listener_count == 1


def test_listener_errors_are_counted_logged_and_handed_to_the_hook(maps: Any, caplog: pytest.LogCaptureFixture) -> None:
    m = maps()
    errors: list[Any] = []
    seen: list[Any] = []

    def failing(change: Any) -> None:
        raise ValueError(f"cannot handle {change.key}")

    m.add_listener(failing, on_error=lambda exc, change: errors.append((str(exc), change.key, change.offset)))
    m.add_listener(lambda c: seen.append(c.key))
    with caplog.at_level(logging.ERROR, logger="airflow_provider_pulsarstate"):
        m.put("a", 1)
        m.put("b", 2)
    assert m.manager.stats["listener_errors"] == 2
    assert errors == [("cannot handle a", "a", 0), ("cannot handle b", "b", 1)]
    assert seen == ["a", "b"]  # the other listener is unaffected
    lines = [r.getMessage() for r in caplog.records if "listener" in r.getMessage()]
    assert any(m.topic in line and "offset 1" in line and "cannot handle b" in line for line in lines)


def test_a_listener_writing_while_the_idle_writer_is_released_does_not_deadlock(backend: Backend, topic: str) -> None:
    """The committer used to take the queue's condition, then the state lock, to release an idle
    writer, while a listener (running under the state lock) calling write_async wanted the
    condition: a lock-order inversion. Here the follower delivers a change while this instance
    still believes it holds the writer (it was fenced), and the listener calls write_async only
    after the idle release has started."""
    b = PulsarMap(backend, topic, follow_interval=0.05, writer_idle_timeout=0.5, acquire_timeout=30)
    a = PulsarMap(backend, topic, acquire_mode=AcquireMode.FENCE, writer_idle_timeout=0.2)
    submitted: list[Any] = []

    def listener(change: Any) -> None:
        if change.key == "from-a" and not submitted:
            time.sleep(1.0)  # holding b's state lock while b's idle release fires
            submitted.append(b.put_async("from-listener", 1))

    b.add_listener(listener)
    b.start()
    b.put("from-b", 1)  # b holds the writer; its idle timer starts
    a.put("from-a", 1)  # fences b; b's follower applies it and runs the listener
    try:
        wait_until(lambda: submitted, timeout=15, what="the listener's write_async to return")
        assert submitted[0].result(timeout=30) == 1
        assert b.get("from-listener", latest=True, timeout=30) == 1
    finally:
        if submitted:  # on a deadlock, closing would hang too
            a.close()
            b.close()
