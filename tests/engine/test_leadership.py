"""Observing who leads a topic (engine/leadership.py) on both back ends, and the two upstream traps
of exclusive-producer election on the real broker: an orphan left by a timed-out creation
(apache/pulsar#25936) and a waiter stuck beside a Shared producer (apache/pulsar#24516)."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from collections import Counter
from typing import Any

import pulsar
import pytest

from airflow_provider_pulsarstate import AcquireMode, ConnectionConfig, PulsarMap, open_backend
from airflow_provider_pulsarstate.engine.backends.base import Backend
from airflow_provider_pulsarstate.engine.errors import (
    BackendUnavailableError,
    LeadershipError,
    OperationTimeoutError,
    WriterBusyError,
)
from airflow_provider_pulsarstate.engine.leadership import (
    Leadership,
    open_async_leadership_probe,
    read_leadership,
)
from airflow_provider_pulsarstate.engine.offsets import create_topic


def _one(backend: Backend, topic: str) -> Leadership:
    found = read_leadership(backend, topic)
    assert len(found) == 1 and found[0].partition is None, found
    return found[0]


def _leaders_within(backend: Backend, topic: str, *, seconds: float) -> list[tuple[str | None, int]]:
    """(leader, epoch) as read until a leader is listed or ``seconds`` pass: a writer dropped by
    an unload is listed again once it has reconnected."""
    seen: list[tuple[str | None, int]] = []
    deadline = time.monotonic() + seconds
    while True:
        one = _one(backend, topic)
        seen.append((one.leader, one.epoch))
        if one.leader is not None or time.monotonic() >= deadline:
            return seen
        time.sleep(0.1)


def test_leader_no_leader_and_the_epoch_grows_with_each_new_exclusive_writer(backend: Backend, topic: str) -> None:
    first = backend.acquire_writer(topic, mode=AcquireMode.FAIL_FAST, timeout=10, name="cand-a")
    seen = _one(backend, topic)
    assert (seen.leader, seen.access_mode, seen.has_leader) == ("cand-a", "Exclusive", True)
    assert seen.epoch is not None and seen.other_producers == () and seen.waiting_publishers == 0
    first.close()
    free = _one(backend, topic)
    assert (free.leader, free.access_mode, free.has_leader) == (None, None, False)
    assert free.epoch == seen.epoch  # the epoch outlives its holder

    second = backend.acquire_writer(topic, mode=AcquireMode.FAIL_FAST, timeout=10, name="cand-b")
    now = _one(backend, topic)
    assert now.leader == "cand-b" and now.epoch is not None and now.epoch > seen.epoch
    fenced = backend.acquire_writer(topic, mode=AcquireMode.FENCE, timeout=10, name="cand-c")
    took = _one(backend, topic)
    assert (took.leader, took.access_mode) == ("cand-c", "Exclusive")  # a takeover fences, then writes as Exclusive
    assert took.epoch is not None and took.epoch > now.epoch
    second.close()
    fenced.close()


def test_a_state_managers_writer_name_is_what_observers_see(backend: Backend, topic: str) -> None:
    with PulsarMap(backend, topic, writer_name="deployment-a", writer_idle_timeout=None) as named:
        named.put("k", 1)
        seen = _one(backend, topic)
        assert seen.writer_name == "deployment-a" and seen.leader.startswith("deployment-a~")  # type: ignore[union-attr]
        assert seen.as_json()["writer_name"] == "deployment-a"
    assert not _one(backend, topic).has_leader  # closing the map released the writer
    with PulsarMap(backend, topic, writer_idle_timeout=None) as anonymous:
        anonymous.put("k", 2)
        leader = _one(backend, topic).leader
        assert leader is not None and leader.startswith("pulsarstate-") and len(leader) == len("pulsarstate-") + 12


def test_two_acquisitions_under_one_chosen_writer_name_get_distinct_producer_names(
    backend: Backend, topic: str
) -> None:
    """A chosen name is not a producer name: each acquisition adds its own suffix, so an orphan
    left by one attempt (dropped by name) can never be confused with a live writer of another."""
    names = []
    for value in (1, 2):
        with PulsarMap(backend, topic, writer_name="deployment-a", writer_idle_timeout=None) as named:
            named.put("k", value)
            seen = _one(backend, topic)
            assert seen.writer_name == "deployment-a"
            names.append(seen.leader)
    assert len(set(names)) == 2, names


def test_a_partitioned_topic_answers_per_partition(backend: Backend, topic: str) -> None:
    create_topic(backend, topic, partitions=3)
    assert [(x.partition, x.has_leader) for x in read_leadership(backend, topic)] == [
        (0, False),
        (1, False),
        (2, False),
    ]
    writer = backend.acquire_writer(f"{topic}-partition-1", mode=AcquireMode.FAIL_FAST, timeout=10, name="p1-leader")
    found = read_leadership(backend, topic)
    assert [(x.topic, x.partition, x.leader) for x in found] == [
        (topic, 0, None),
        (topic, 1, "p1-leader"),
        (topic, 2, None),
    ]
    writer.close()


def test_an_unknown_topic_is_a_clear_error(backend: Backend, topic: str) -> None:
    with pytest.raises(LeadershipError, match=f"{topic}.*does not exist"):
        read_leadership(backend, topic)


def test_the_async_probe_sees_what_the_blocking_read_sees(
    backend: Backend, backend_config: ConnectionConfig, topic: str
) -> None:
    create_topic(backend, topic, partitions=2)
    writer = backend.acquire_writer(f"{topic}-partition-0", mode=AcquireMode.FAIL_FAST, timeout=10, name="async-seen")

    async def observe() -> tuple[list[Leadership], Exception]:
        probe = open_async_leadership_probe(backend_config)
        try:
            found = await probe.leadership(topic)
            try:
                await probe.leadership(topic + "-missing")
            except LeadershipError as exc:
                missing = exc
        finally:
            await probe.aclose()
            await probe.aclose()  # idempotent
        return found, missing

    found, missing = asyncio.run(observe())
    assert found == read_leadership(backend, topic)
    assert [(x.partition, x.leader) for x in found] == [(0, "async-seen"), (1, None)]
    assert f"{topic}-missing" in str(missing) and "does not exist" in str(missing)
    writer.close()


def test_leadership_json_round_trips_and_bad_values_are_refused() -> None:
    seen = Leadership("persistent://public/default/t", 2, "a", "Exclusive", 7, 1, ("standalone-0-3",))
    assert Leadership.from_json(seen.topic, seen.as_json()) == seen
    assert Leadership.from_json("t", Leadership("t", None, None, None, None).as_json()) == Leadership(
        "t", None, None, None, None
    )
    with pytest.raises(TypeError, match="epoch must be int"):
        Leadership.from_json("t", {**seen.as_json(), "epoch": "7"})
    with pytest.raises(TypeError, match="other_producers"):
        Leadership.from_json("t", {**seen.as_json(), "other_producers": "x"})
    with pytest.raises(KeyError):
        Leadership.from_json("t", {"leader": "a"})


def test_observing_never_makes_an_embedded_acquirer_fail(tmp_path: Any) -> None:
    """An observer probes the writer lock; that probe must never look like a holder to an acquirer."""
    backend = open_backend(ConnectionConfig(url=str(tmp_path / "state.db")))
    topic = "persistent://public/default/observed"
    backend.acquire_writer(topic, mode=AcquireMode.FAIL_FAST, timeout=5, name="first").close()
    stop = threading.Event()
    observed = [0]

    def observe() -> None:
        while not stop.is_set():
            read_leadership(backend, topic)
            observed[0] += 1

    observers = [threading.Thread(target=observe) for _ in range(3)]
    for t in observers:
        t.start()
    try:
        for i in range(300):
            backend.acquire_writer(topic, mode=AcquireMode.FAIL_FAST, timeout=5, name=f"w{i}").close()
    finally:
        stop.set()
        for t in observers:
            t.join()
        backend.close()
    assert observed[0] > 100


# ----------------------------------------------------------------------------- upstream traps (Pulsar)
@pytest.mark.pulsar
def test_a_creation_that_timed_out_leaves_no_orphan_that_wedges_election(
    pulsar_broker: Any, topic: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """apache/pulsar#25936: the caller gave up on a creation that then completed on the broker.

    The client-side time-out is simulated (the caller gets ``pulsar.Timeout`` while the real
    creation completes and its producer is dropped unclosed, as an abandoned future would leave
    it); the orphan it leaves on the real broker is real: without the clean-up it holds the topic
    until the connection dies, and the other candidate below waits in vain.
    """
    from tests.conftest import pulsar_config

    a = open_backend(pulsar_config(pulsar_broker, operation_timeout=5.0))
    b = open_backend(pulsar_config(pulsar_broker, operation_timeout=5.0))
    real_create = a.client.create_producer
    abandoned: list[str] = []

    def create_then_give_up(*args: Any, **kwargs: Any) -> Any:
        if kwargs.get("access_mode") != pulsar.ProducerAccessMode.Exclusive:
            return real_create(*args, **kwargs)
        real_create(*args, **kwargs)  # completes on the broker; the reference is dropped, never closed
        abandoned.append(kwargs["producer_name"])
        raise pulsar.Timeout("simulated: the caller stopped waiting for the producer")

    monkeypatch.setattr(a.client, "create_producer", create_then_give_up)
    try:
        with pytest.raises(BackendUnavailableError, match="creating the exclusive producer"):
            a.acquire_writer(topic, mode=AcquireMode.FAIL_FAST, timeout=5, name="cand-a")
        assert abandoned == ["cand-a"]
        started = time.monotonic()
        writer = b.acquire_writer(topic, mode=AcquireMode.WAIT, timeout=10, name="cand-b")
        took = time.monotonic() - started
        seen = _one(b, topic)
        assert seen.leader == "cand-b" and "cand-a" not in seen.other_producers
        assert took < 5, f"the other candidate needed {took:.1f}s"
        writer.close()
    finally:
        a.close()
        b.close()


@pytest.mark.pulsar
@pytest.mark.xdist_group("own-broker")
def test_a_real_client_timeout_during_creation_does_not_wedge_election(freezable_broker: Any, topic: str) -> None:
    """The same trap with real client-side time-outs: the broker is frozen (SIGSTOP) for 1.5 s
    while a candidate with a 1 s operation time-out creates its exclusive producer; afterwards
    another candidate must lead within a bound. The last round freezes it for 3.5 s, so that the
    broker creates the orphan well after the candidate gave up and stopped looking: only the
    background sweeper (backends/orphans.py) can drop it then."""
    from tests.conftest import pulsar_config

    pid = getattr(freezable_broker, "pid", None)
    assert pid, "this test freezes the broker: give its pid in PULSARSTATE_TEST_BROKER_PID"
    a = open_backend(pulsar_config(freezable_broker, operation_timeout=1.0))
    b = open_backend(pulsar_config(freezable_broker, operation_timeout=10.0))
    timeouts = 0
    try:
        b.admin.create_topic(topic)
        a.client.create_producer(topic).close()  # connection and lookup warm
        rounds = ((0.0, 1.5), (0.002, 1.5), (0.005, 1.5), (0.01, 1.5), (0.002, 3.5), (0.005, 3.5), (0.01, 3.5))
        for i, (pause_after, frozen) in enumerate(rounds):
            timer = threading.Timer(pause_after, os.kill, (pid, signal.SIGSTOP))
            timer.start()
            try:  # one name per attempt, as default_writer_name gives
                a.acquire_writer(topic, mode=AcquireMode.FAIL_FAST, timeout=1, name=f"cand-a{i}").close()
            except BackendUnavailableError:
                timeouts += 1
            finally:
                timer.join()
                time.sleep(max(0.0, frozen - pause_after))
                os.kill(pid, signal.SIGCONT)
            started = time.monotonic()
            writer = b.acquire_writer(topic, mode=AcquireMode.WAIT, timeout=15, name="cand-b")
            assert time.monotonic() - started < 10
            # The sweeper may unload the topic for an orphan of an earlier round just as cand-b is
            # created: unloading drops every producer and cand-b reconnects. It must stay the
            # leader with the epoch it acquired, and its writes must go through.
            writer.append([b"round %d" % i], timeout=10)
            leaders = _leaders_within(b, topic, seconds=5.0)
            assert leaders[-1] == ("cand-b", writer.epoch), leaders
            writer.close()
    finally:
        os.kill(pid, signal.SIGCONT)
        a.close()
        b.close()
    assert timeouts >= 1  # the freeze did provoke client-side time-outs


@pytest.mark.pulsar
def test_a_live_writer_survives_the_unload_that_drops_an_orphan(pulsar_broker: Any, topic: str) -> None:
    """Dropping an orphan unloads its topic, which disconnects every producer of the topic: the
    live writer reconnects by itself, keeps its epoch and leadership, and loses no write."""
    from tests.conftest import pulsar_config

    backend = open_backend(pulsar_config(pulsar_broker))
    try:
        writer = backend.acquire_writer(topic, mode=AcquireMode.FAIL_FAST, timeout=10, name="live")
        writer.append([b"before"], timeout=10)
        backend.admin.unload(topic)
        writer.append([b"after"], timeout=10)
        leaders = _leaders_within(backend, topic, seconds=5.0)
        assert leaders[-1] == ("live", writer.epoch), leaders
        assert backend.current_epoch(topic) == writer.epoch
        writer.close()
        reader = backend.create_reader(topic)
        assert [reader.read_next(timeout=10).payload for _ in range(2)] == [b"before", b"after"]
        assert not reader.has_next()
        reader.close()
    finally:
        backend.close()


@pytest.mark.pulsar
def test_a_waiting_acquire_beside_a_stray_shared_producer_stays_bounded(pulsar_broker: Any, topic: str) -> None:
    """apache/pulsar#24516: WaitForExclusive is never promoted while a Shared producer is connected.

    WAIT mode must give up at its time-out, name the producer in its way, leave no waiter behind,
    and win as soon as the stray producer is gone.
    """
    from tests.conftest import pulsar_config

    backend = open_backend(pulsar_config(pulsar_broker))
    stray = backend.open_shared_writer(topic)
    stray_name = read_leadership(backend, topic)[0].other_producers[0]
    started = time.monotonic()
    with pytest.raises(OperationTimeoutError, match=rf"waited 2\.0s.*held by '{stray_name}' \(Shared\)"):
        backend.acquire_writer(topic, mode=AcquireMode.WAIT, timeout=2.0, name="waiter")
    assert time.monotonic() - started < 4
    with pytest.raises(WriterBusyError, match=rf"'{stray_name}' \(Shared\)"):
        backend.acquire_writer(topic, mode=AcquireMode.FAIL_FAST, timeout=2.0, name="waiter")
    seen = _one(backend, topic)
    assert seen.waiting_publishers == 0 and not seen.has_leader and seen.other_producers == (stray_name,)

    def release_soon() -> None:
        time.sleep(1.0)
        stray.close()

    threading.Thread(target=release_soon).start()
    try:
        _writer = backend.acquire_writer(topic, mode=AcquireMode.WAIT, timeout=10, name="waiter")
        assert _one(backend, topic).leader == "waiter"
    finally:
        backend.close()


@pytest.mark.pulsar
def test_control_a_raw_wait_for_exclusive_producer_beside_a_shared_one(pulsar_broker: Any, topic: str) -> None:
    """Control for the test above: the upstream trap is real on this broker. A raw
    WaitForExclusive creation is never promoted while a Shared producer is connected; with
    pulsar-client 3.13 it gives up at the operation time-out, but leaves its waiter queued on the
    broker (``waitingPublishers`` stays 1), where it would later be promoted for nobody."""
    from tests.conftest import pulsar_config

    client = pulsar.Client(pulsar_broker.service_url, operation_timeout_seconds=2)
    backend = open_backend(pulsar_config(pulsar_broker))
    try:
        stray = client.create_producer(topic)
        started = time.monotonic()
        with pytest.raises(pulsar.Timeout):
            client.create_producer(
                topic, producer_name="raw-waiter", access_mode=pulsar.ProducerAccessMode.WaitForExclusive
            )
        assert time.monotonic() - started >= 1.9
        seen = _one(backend, topic)
        assert not seen.has_leader and seen.waiting_publishers == 1
        stray.close()
    finally:
        client.close()
        backend.close()


def test_lease_observers_of_one_log_share_one_read_per_poll(
    backend_config: ConnectionConfig, topic: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """N deferred sensors on one lease log cost one read of the log per poll, not N; without
    freshness every answer comes from a read started after the describe (a release is seen)."""
    from airflow_provider_pulsarstate.engine.leadership import AsyncLeaseObserver
    from airflow_provider_pulsarstate.engine.manager import SharedStateManager
    from airflow_provider_pulsarstate.engine.recipes.lease import Leases

    with open_backend(backend_config) as backend:
        leases = Leases(backend, topic)
        held = [leases.acquire(f"l{i}", holder="h", ttl=3600.0, timeout=30) for i in range(5)]
        leases.close()
    tail_reads = [0]
    original = SharedStateManager.read

    def counting(self: Any, reader: Any, *, latest: bool = False, **kwargs: Any) -> Any:
        if latest and self.topic == topic:
            tail_reads[0] += 1
        return original(self, reader, latest=latest, **kwargs)

    monkeypatch.setattr(SharedStateManager, "read", counting)

    from airflow_provider_pulsarstate.engine import turns
    from airflow_provider_pulsarstate.engine.worker_thread import WorkerThread

    turn, per_turn = [0], Counter()
    original_run = WorkerThread.run

    async def noting_turn(self: Any, fn: Any) -> Any:
        per_turn[turn[0]] += 1
        return await original_run(self, fn)

    monkeypatch.setattr(WorkerThread, "run", noting_turn)

    async def scenario() -> tuple[list[Any], int, Any]:
        loop = asyncio.get_running_loop()

        def count_turns() -> None:
            turn[0] += 1
            loop.call_soon(count_turns)

        loop.call_soon(count_turns)
        observers = [AsyncLeaseObserver(backend_config, topic, freshness=1.0) for _ in range(100)]
        plain = AsyncLeaseObserver(backend_config, topic)
        try:
            infos = await asyncio.gather(*(o.describe(f"l{i % 5}") for i, o in enumerate(observers)))
            # the hundred answered by one read go on a few per turn (1 more: the shared read)
            assert max(per_turn.values()) <= turns.STARTS_PER_TURN + 1, per_turn
            reads = tail_reads[0]
            with open_backend(backend_config) as backend:
                releaser = Leases(backend, topic)
                releaser.release(held[0])
                releaser.close()
            after = await plain.describe("l0")  # freshness 0: a read started after this call
            return infos, reads, after
        finally:
            await asyncio.gather(*(o.aclose() for o in [*observers, plain]))

    infos, reads, after = asyncio.run(scenario())
    assert [i.holder for i in infos] == ["h"] * 100 and all(i.held for i in infos)
    assert reads == 1, f"{reads} reads of the lease log for 100 observers polling together"
    assert after is not None and not after.held
