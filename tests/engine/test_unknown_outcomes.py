"""A write whose outcome is unknown stays unknown until the log settles it; calls take a timeout.

Both back ends (real broker for Pulsar), with the fault-injecting harness for outages.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from airflow_provider_pulsarstate import OperationTimeoutError, UnknownOutcomeError, WriteOutcome
from airflow_provider_pulsarstate.engine.backends.base import Backend
from airflow_provider_pulsarstate.testing import FaultInjectingBackend, wait_until
from tests.engine.test_conformance import Counting, counter_manager, records


def inc(s: dict) -> list[dict]:
    return [{"k": "x", "d": 1}]


def x(s: dict) -> int:
    return s.get("x", 0)


def assert_log_holds(backend: Backend, topic: str, value: int) -> None:
    fresh = counter_manager(backend, topic, Counting())
    try:
        assert fresh.read(x, latest=True) == value
    finally:
        fresh.close()


def test_a_landed_write_of_unknown_outcome_is_not_forgotten_during_an_outage(backend: Backend, topic: str) -> None:
    """The reported case: a lost acknowledgement, then the rebuild fails (the log is unreachable).
    Before, the write failed with BackendUnavailableError and a caller's retry applied it twice."""
    faulty = FaultInjectingBackend(backend)
    m = counter_manager(faulty, topic, Counting(), operation_timeout=5)
    try:
        m.write(inc)
        faulty.lose_next_ack(then=faulty.start_outage)  # it lands; then nothing can be read
        with pytest.raises(UnknownOutcomeError) as info:
            m.write(inc, x, timeout=60)
        err = info.value
        assert err.writer_id == m.writer_id and isinstance(err.seq, int)
        assert err.write_id == (m.writer_id, err.seq)
        assert m.outcome(err.write_id) is WriteOutcome.PENDING  # not forgotten, not "failed"
        assert m.outcome(err.write_id, timeout=0.5) is WriteOutcome.PENDING  # still unreachable
        faulty.end_outage()
        assert m.outcome(err.write_id, timeout=30) is WriteOutcome.LANDED  # found by the catch-up
        assert m.read(x, latest=True) == 2
    finally:
        m.close()
    assert_log_holds(backend, topic, 2)
    assert len(records(backend, topic)) == 2  # exactly once


def test_a_lost_write_of_unknown_outcome_is_settled_as_not_landed(backend: Backend, topic: str) -> None:
    faulty = FaultInjectingBackend(backend)
    m = counter_manager(faulty, topic, Counting(), operation_timeout=5)
    try:
        m.write(inc)
        faulty.fail_next_append(then=faulty.start_outage)  # nothing lands, and the log is unreachable
        with pytest.raises(UnknownOutcomeError) as info:
            m.write(inc, timeout=60)
        write_id = info.value.write_id
        assert m.outcome(write_id) is WriteOutcome.PENDING
        faulty.end_outage()
        # not in the log, and the writer's new EPOCH record proves it can never land
        assert m.outcome(write_id, timeout=30) is WriteOutcome.NOT_LANDED
        assert m.write(inc, x) == 2  # so sending it again is safe
    finally:
        m.close()
    assert_log_holds(backend, topic, 2)
    assert len(records(backend, topic)) == 2


def test_outcome_of_writes_it_does_not_track(backend: Backend, topic: str) -> None:
    m = counter_manager(backend, topic, Counting())
    try:
        future = m.write_async(inc)
        future.result()
        assert m.outcome(future.write_id) is WriteOutcome.UNKNOWN  # never in doubt: not tracked
        assert m.outcome((b"another instance", 1)) is WriteOutcome.UNKNOWN
    finally:
        m.close()


def test_a_write_that_times_out_waiting_for_the_writer_is_never_sent(backend: Backend, topic: str) -> None:
    holder = counter_manager(backend, topic, Counting(), writer_idle_timeout=None, handover_check_interval=None)
    m = counter_manager(backend, topic, Counting(), acquire_timeout=30)
    try:
        holder.write(inc)
        started = time.monotonic()
        with pytest.raises(OperationTimeoutError, match="nothing was appended"):
            m.write(inc, timeout=0.5)
        assert time.monotonic() - started < 3
        holder.close()  # the writer comes free: the abandoned write must not go out now
        assert m.write(inc, x, timeout=30) == 2
        time.sleep(0.5)
        assert m.read(x, latest=True, timeout=10) == 2
    finally:
        holder.close()
        m.close()
    assert len(records(backend, topic)) == 2  # holder's increment and one of m's


def test_a_write_that_times_out_while_being_sent_is_unknown_then_settled(backend: Backend, topic: str) -> None:
    faulty = FaultInjectingBackend(backend)
    m = counter_manager(faulty, topic, Counting())
    try:
        m.write(inc)
        faulty.delay_next_append(1.5)
        with pytest.raises(UnknownOutcomeError) as info:
            m.write(inc, timeout=0.3)
        write_id = info.value.write_id
        assert m.outcome(write_id) is WriteOutcome.PENDING
        wait_until(lambda: m.outcome(write_id) is WriteOutcome.LANDED, timeout=20, what="the slow append to land")
        assert m.read(x, latest=True) == 2
    finally:
        m.close()
    assert len(records(backend, topic)) == 2


def test_reads_honour_their_timeout(backend: Backend, topic: str) -> None:
    faulty = FaultInjectingBackend(backend)
    m = counter_manager(faulty, topic, Counting())
    try:
        m.write(inc)
        faulty.delay_next_append(2.0)
        pending = m.write_async(inc)
        time.sleep(0.3)  # the append is in flight, the state lock held
        for latest in (False, True):
            started = time.monotonic()
            with pytest.raises(OperationTimeoutError):
                m.read(x, latest=latest, timeout=0.3)
            assert time.monotonic() - started < 1.5
        pending.result(timeout=20)
        assert m.read(x, latest=True, timeout=10) == 2
    finally:
        m.close()


def test_map_methods_take_a_timeout(maps: Any) -> None:
    m = maps()
    assert m.put("a", 1, timeout=30) == 1
    assert m.update("a", lambda k, v: v + 1, timeout=30) == 2
    assert m.put_if_absent("b", 1, timeout=30) == 1
    assert m.replace("b", 1, 5, timeout=30) == 5
    assert m.get("a", latest=True, timeout=30) == 2
    assert m.get("b", linearizable=True, timeout=30) == 5
    assert m.to_dict(timeout=30) == {"a": 2, "b": 5}
    assert m.size(latest=True, timeout=30) == 2 and m.list_keys(timeout=30) == ["a", "b"]
    assert m.scan(lambda k: True, lambda k, v: None, timeout=30) == 2
    assert m.update_multiple(lambda k: True, lambda k, v: v * 10, timeout=30) == 2
    assert m.pop("a", timeout=30) == 20
    m.delete("b", timeout=30)
    assert m.clear(timeout=30) == 0


def test_a_map_write_that_times_out_while_being_sent(maps: Any, backend: Backend) -> None:
    faulty = FaultInjectingBackend(backend)
    table = maps(on=faulty)
    table.put("k", 1)
    faulty.delay_next_append(1.5)
    with pytest.raises(UnknownOutcomeError) as info:
        table.put("k", 2, timeout=0.3)
    assert table.outcome(info.value.write_id) is WriteOutcome.PENDING
    wait_until(lambda: table.outcome(info.value.write_id) is WriteOutcome.LANDED, timeout=20, what="the put to land")
    assert maps().get("k", latest=True) == 2


def test_a_first_replay_cut_short_by_a_timeout_is_resumed_not_restarted(
    maps: Any, backend: Backend, topic: str
) -> None:
    w = maps(checkpoint_after_bytes=None)
    for i in range(400):
        w.put(f"k{i}", i)
    fresh = maps(checkpoint_after_bytes=None)
    timeouts = 0
    while True:
        try:
            size = fresh.size(timeout=0.002)
            break
        except OperationTimeoutError:
            timeouts += 1
    assert size == 400 and timeouts >= 1
    stats = fresh.manager.stats
    assert stats["records_replayed"] == len(records(backend, topic)) == 400  # each replayed once
    assert stats["rebuilds"] == 0


def _withholding(backend: Backend, misses: list[int], *, pause: bool) -> Backend:
    """``backend`` whose readers answer None to their first ``misses[0]`` reads although entries
    wait (``has_next``): after the whole wait when ``pause`` (a broker slow to deliver), at once
    otherwise (a wait cut short). ``misses[0]`` counts down as they happen."""
    from airflow_provider_pulsarstate.engine.backends.base import RawReader
    from airflow_provider_pulsarstate.testing.harness import ForwardingBackend

    class Withholding(RawReader):
        def __init__(self, inner: RawReader) -> None:
            self.inner = inner

        def read_next(self, *, timeout: float) -> Any:
            if misses[0] > 0:
                misses[0] -= 1
                if pause:
                    time.sleep(timeout)
                return None
            return self.inner.read_next(timeout=timeout)

        def has_next(self) -> bool:
            return self.inner.has_next()

        def close(self) -> None:
            self.inner.close()

    class WithholdingBackend(ForwardingBackend):
        def create_reader(self, topic: str, *, start: Any = None) -> RawReader:
            return Withholding(self.inner.create_reader(topic, **({} if start is None else {"start": start})))

    return WithholdingBackend(backend)


def test_a_read_that_times_out_with_entries_waiting_is_not_taken_for_the_tail(maps: Any, backend: Backend) -> None:
    """Deterministic form of the test above: the back end has entries (has_next) but delivers none
    before the caller's deadline. The replay must pause (OperationTimeoutError), never serve the
    prefix read so far as the whole log (a fresh replica once answered size() == 0 of 400)."""
    w = maps(checkpoint_after_bytes=None)
    for i in range(5):
        w.put(f"k{i}", i)
    fresh = maps(on=_withholding(backend, [3], pause=True), checkpoint_after_bytes=None)
    answers = []
    while True:
        try:
            answers.append(fresh.size(timeout=0.05))
            break
        except OperationTimeoutError:
            answers.append("timeout")
    assert answers[-1] == 5 and answers[:-1] == ["timeout"] * (len(answers) - 1) and len(answers) > 1


def test_a_read_that_gives_up_before_the_deadline_with_entries_waiting_is_not_taken_for_the_tail(
    maps: Any, backend: Backend
) -> None:
    """A back end's wait may end before the caller's deadline (the Pulsar client counts whole
    milliseconds) while entries wait: the replay reads on, and never answers with a prefix."""
    w = maps(checkpoint_after_bytes=None)
    for i in range(5):
        w.put(f"k{i}", i)
    early = [3]
    fresh = maps(on=_withholding(backend, early, pause=False), checkpoint_after_bytes=None)
    assert fresh.size(timeout=60.0) == 5
    assert early == [0]
