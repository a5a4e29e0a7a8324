"""Background threads never die silently: failures reach the callers, and the manager recovers.

Raw sqlite3 errors are injected through a wrapped connection (an edge case: mocks are fine); the
back-end-neutral cases use the fault-injecting harness on both back ends.
"""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_pulsarstate import (
    BackendUnavailableError,
    ConnectionConfig,
    PulsarMap,
    UnknownOutcomeError,
    WriteOutcome,
    open_backend,
)
from airflow_provider_pulsarstate.engine.backends.base import Backend
from airflow_provider_pulsarstate.engine.backends.embedded import EmbeddedBackend
from airflow_provider_pulsarstate.testing import FaultInjectingBackend, wait_until
from tests.engine.test_conformance import Counting, counter_manager


def inc(s: dict) -> list[dict]:
    return [{"k": "x", "d": 1}]


def x(s: dict) -> int:
    return s.get("x", 0)


class FlakyConnection:
    """A sqlite3 connection whose entry reads fail with a raw driver error while ``broken`` is set."""

    def __init__(self, conn: sqlite3.Connection, broken: threading.Event) -> None:
        self._conn = conn
        self._broken = broken

    def execute(self, sql: str, *args: Any) -> Any:
        if self._broken.is_set() and sql.lstrip().startswith("SELECT pos, payload"):
            raise sqlite3.OperationalError("disk I/O error")
        return self._conn.execute(sql, *args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)


@pytest.fixture
def flaky_embedded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """(embedded back end whose new connections are flaky, the event that breaks them)."""
    backend = open_backend(ConnectionConfig(url=str(tmp_path / "state.db"), operation_timeout=5.0))
    assert isinstance(backend, EmbeddedBackend)
    broken = threading.Event()
    real_connect = backend.connect
    monkeypatch.setattr(backend, "connect", lambda: FlakyConnection(real_connect(), broken))
    yield backend, broken
    backend.close()


def test_sqlite_errors_reach_callers_as_ours(flaky_embedded: Any, topic: str) -> None:
    backend, broken = flaky_embedded
    table = PulsarMap(backend, topic)
    try:
        table.put("k", 1)
        broken.set()
        with pytest.raises(BackendUnavailableError, match="disk I/O error"):
            table.get("k", latest=True)
        broken.clear()
        assert table.get("k", latest=True) == 1
    finally:
        table.close()


def test_the_follower_survives_sqlite_errors_and_listeners_keep_receiving(flaky_embedded: Any, topic: str) -> None:
    backend, broken = flaky_embedded
    writer = PulsarMap(backend, topic, writer_idle_timeout=0.1)
    follower = PulsarMap(backend, topic, follow_interval=0.05)
    seen: list[Any] = []
    follower.add_listener(lambda c: seen.append((c.key, c.value)))
    try:
        follower.start()
        writer.put("a", 1)
        wait_until(lambda: ("a", 1) in seen, timeout=10, what="the first change")
        broken.set()
        wait_until(lambda: follower.manager.stats["follower_errors"] >= 2, timeout=10, what="follower errors")
        broken.clear()
        writer.put("b", 2)
        wait_until(lambda: ("b", 2) in seen, timeout=15, what="changes after the errors")
        assert follower.manager.follower_alive
    finally:
        writer.close()
        follower.close()


def test_the_follower_survives_any_error(backend: Backend, topic: str) -> None:
    faulty = FaultInjectingBackend(backend)
    writer = PulsarMap(backend, topic, writer_idle_timeout=0.1)
    follower = PulsarMap(faulty, topic, follow_interval=0.05)
    seen: list[Any] = []
    follower.add_listener(lambda c: seen.append(c.key))
    try:
        follower.start()
        faulty.start_outage(error=RuntimeError)  # not one of our errors: a driver bug
        wait_until(lambda: follower.manager.stats["follower_errors"] >= 2, timeout=10, what="follower errors")
        faulty.end_outage()
        writer.put("after", 1)
        wait_until(lambda: seen == ["after"], timeout=15, what="the follower to go on")
    finally:
        writer.close()
        follower.close()


def test_a_rebuild_failing_with_sqlite_errors_fails_the_write_instead_of_hanging(
    flaky_embedded: Any, topic: str
) -> None:
    """Before: the raw error killed the commit thread; this write and every later one hung."""
    backend, broken = flaky_embedded
    faulty = FaultInjectingBackend(backend)
    m = counter_manager(faulty, topic, Counting(), operation_timeout=5)
    try:
        m.write(inc)
        faulty.lose_next_ack(then=broken.set)  # it lands; the rebuild's reads then fail
        future = m.write_async(inc)
        with pytest.raises(UnknownOutcomeError):
            future.result(timeout=30)
        broken.clear()
        assert m.write_async(inc, x).result(timeout=30) == 3  # later writes work again
        assert m.outcome(future.write_id) is WriteOutcome.LANDED
    finally:
        m.close()


def test_a_raw_error_during_a_rebuild_fails_the_write_instead_of_hanging(backend: Backend, topic: str) -> None:
    faulty = FaultInjectingBackend(backend)
    m = counter_manager(faulty, topic, Counting(), operation_timeout=5)
    try:
        m.write(inc)
        faulty.lose_next_ack(then=lambda: faulty.start_outage(error=RuntimeError))  # a driver bug, not our error
        future = m.write_async(inc)
        with pytest.raises(UnknownOutcomeError) as info:
            future.result(timeout=30)
        assert info.value.write_id == future.write_id
        faulty.end_outage()
        assert m.write_async(inc, x).result(timeout=30) == 3
        assert m.outcome(future.write_id) is WriteOutcome.LANDED
    finally:
        m.close()


def test_a_commit_thread_failure_does_not_hang_later_writes(backend: Backend, topic: str) -> None:
    """Before: a writer whose close raised during the idle release killed the commit thread for good."""
    faulty = FaultInjectingBackend(backend)
    m = counter_manager(faulty, topic, Counting(), writer_idle_timeout=0.1)
    try:
        m.write(inc)
        faulty.fail_next_close()
        wait_until(lambda: "close" in faulty.injected, timeout=10, what="the idle release")
        wait_until(lambda: not m.holds_writer, timeout=10, what="the writer dropped")
        assert m.write_async(inc, x).result(timeout=30) == 2
        assert m.write_async(inc, x).result(timeout=30) == 3
    finally:
        m.close()


def test_a_dead_commit_thread_fails_its_writes_and_is_replaced(
    backend: Backend, topic: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    m = counter_manager(backend, topic, Counting())
    try:
        m.write(inc)
        real_commit = m._committer.commit

        def broken_commit(batch: list) -> None:
            raise RuntimeError("bug in the commit loop")

        monkeypatch.setattr(m._committer, "commit", broken_commit)
        future = m.write_async(inc)
        with pytest.raises(Exception, match="bug in the commit loop"):
            future.result(timeout=10)
        assert m.stats["committer_errors"] == 1
        monkeypatch.setattr(m._committer, "commit", real_commit)
        assert m.write_async(inc, x).result(timeout=30) == 2  # a new commit thread took over
    finally:
        m.close()
