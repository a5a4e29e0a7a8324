"""The Pulsar back end of the offset contract, on the real broker (its entry index interceptor on).

Each test names the reference implementation's bug it guards against where there is one.
"""

from __future__ import annotations

import asyncio
import math
import random
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pulsar
import pytest

from airflow_provider_pulsarstate import open_backend
from airflow_provider_pulsarstate.engine.backends.pulsar import PulsarBackend
from airflow_provider_pulsarstate.engine.errors import (
    ConfigurationError,
    OffsetIndexUnavailableError,
    OffsetOutOfRangeError,
    UnknownPartitionError,
    UnknownTopicError,
)
from airflow_provider_pulsarstate.engine.offsets import PullConsumer, create_topic, open_async_probe, open_publisher
from airflow_provider_pulsarstate.engine.offsets.pulsar import PulsarOffsetLog
from airflow_provider_pulsarstate.testing import wait_until
from tests.conftest import pulsar_config

pytestmark = pytest.mark.pulsar


@pytest.fixture
def backend(pulsar_broker: Any) -> Iterator[PulsarBackend]:
    b = open_backend(pulsar_config(pulsar_broker))
    yield b  # type: ignore[misc]
    b.close()


@pytest.fixture
def topic(backend: PulsarBackend) -> str:
    name = f"persistent://public/default/offsets-{uuid.uuid4().hex[:12]}"
    create_topic(backend, name)
    return name


@pytest.fixture
def consumers(backend: PulsarBackend) -> Iterator[Any]:
    made: list[PullConsumer] = []

    def make(topic: str, subscription: str | None = None, **options: Any) -> PullConsumer:
        c = PullConsumer(backend, topic, subscription, **options)
        made.append(c)
        return c

    yield make
    for c in made:
        c.close()


def publish(
    backend: PulsarBackend,
    topic: str,
    values: list[bytes],
    *,
    batching: bool,
    bursts: list[int] | None = None,
    keys: list[str] | None = None,
) -> None:
    """Publish ``values`` in order; with ``bursts``, flush after each burst (one batch per burst)."""
    with open_publisher(backend, topic, batching=batching) as pub:
        sizes = iter(bursts or [len(values)])
        left = next(sizes)
        for i, value in enumerate(values):
            pub.send(value, key=keys[i] if keys else None)
            left -= 1
            if left == 0:
                pub.flush(timeout=30)
                left = next(sizes, len(values))
        pub.flush(timeout=30)


def pull_all(
    consumer: PullConsumer, start: int, *, sizes: list[int] | None = None, partition: int | None = None
) -> list[Any]:
    out = []
    offset = start
    sizes = sizes or [500]
    i = 0
    while True:
        result = consumer.pull(offset, partition=partition, max_messages=sizes[i % len(sizes)])
        i += 1
        if not result.messages:
            assert result.next_offset == offset
            return out
        assert result.messages[0].offset >= offset
        out.extend(result.messages)
        offset = result.next_offset


def batch_entries(messages: list[Any]) -> dict[tuple[int, int], list[Any]]:
    entries: dict[tuple[int, int], list[Any]] = {}
    for m in messages:
        entries.setdefault(m.position[:2], []).append(m)
    return entries


# -- offsets of batched and unbatched messages ---------------------------------------------------
@pytest.mark.parametrize("batching", [True, False])
def test_offsets_are_the_broker_index(backend: PulsarBackend, topic: str, consumers: Any, batching: bool) -> None:
    values = [b"v%d" % i for i in range(60)]
    publish(backend, topic, values, batching=batching, bursts=[7, 1, 20, 3, 29])
    consumer = consumers(topic)
    assert consumer.beginning_offsets() == {0: 0}
    assert consumer.end_offsets() == {0: 60}
    got = pull_all(consumer, 0, sizes=[5, 11])
    assert [m.offset for m in got] == list(range(60))
    assert [m.value for m in got] == values
    entries = batch_entries(got)
    if batching:
        assert sorted(len(v) for v in entries.values()) == sorted([7, 1, 20, 3, 29])
    else:
        assert len(entries) == 60 and all(m.position[2] == -1 for m in got)


def test_consecutive_pulls_over_mixed_batches_never_repeat_or_skip(
    backend: PulsarBackend, topic: str, consumers: Any
) -> None:
    rng = random.Random(8)
    values: list[bytes] = []
    # Alternate a batching and a non-batching producer, bursts of 1..400 messages (batches of every size).
    for round_ in range(6):
        bursts = [rng.randint(1, 400) for _ in range(10)]
        chunk = [b"r%d-%d" % (round_, i) for i in range(sum(bursts))]
        publish(backend, topic, chunk, batching=round_ % 2 == 0, bursts=bursts)
        values.extend(chunk)
    assert len(values) > 10_000
    consumer = consumers(topic)
    got = pull_all(consumer, 0, sizes=[500, 1, 37, 1000, 499])
    assert [m.offset for m in got] == list(range(len(values)))
    assert [m.value for m in got] == values
    log = consumer._log
    assert isinstance(log, PulsarOffsetLog)
    assert log.readers_created == 1  # every continuation reused the pooled reader


@pytest.mark.parametrize("batching", [True, False])
def test_pull_inside_a_batch_starts_exactly_there_on_a_cold_cache(
    backend: PulsarBackend, topic: str, consumers: Any, batching: bool
) -> None:
    """Reference bugs: after a cache miss it started AFTER the resolved entry, and it did not drop
    the lower indexes of the batch."""
    values = [b"b%d" % i for i in range(40)]
    publish(backend, topic, values, batching=batching, bursts=[10, 10, 10, 10])
    everything = pull_all(consumers(topic), 0)
    for target in (0, 3, 9, 10, 17, 39):
        fresh = consumers(topic)  # cold cache, no pooled reader
        result = fresh.pull(target, max_messages=4)
        assert [m.offset for m in result.messages] == list(range(target, min(target + 4, 40)))
        assert [m.value for m in result.messages] == values[target : target + 4]
        assert result.messages[0].position == everything[target].position
        assert result.next_offset == min(target + 4, 40)


def test_pull_at_the_end_is_empty_and_waits_for_the_next_message(
    backend: PulsarBackend, topic: str, consumers: Any
) -> None:
    """Reference bug: a pull at the tail offset answered 404."""
    consumer = consumers(topic)
    empty = consumer.pull(0)  # a topic never written
    assert empty.messages == [] and empty.next_offset == 0 and empty.end_offset == 0
    publish(backend, topic, [b"a", b"b", b"c"], batching=True)
    at_end = consumer.pull(3)
    assert at_end.messages == [] and at_end.next_offset == 3 and at_end.end_offset == 3 and at_end.lag == 0
    with pytest.raises(OffsetOutOfRangeError) as info:
        consumer.pull(4)
    assert (info.value.beginning, info.value.end, info.value.offset) == (0, 3, 4)
    # A message published while a pull waits at the end is returned by that pull.
    timer = threading.Timer(0.5, publish, args=(backend, topic, [b"d"]), kwargs={"batching": False})
    timer.start()
    started = time.monotonic()
    waited = consumer.pull(3, timeout=10)
    timer.join()
    assert [(m.offset, m.value) for m in waited.messages] == [(3, b"d")]
    assert time.monotonic() - started < 8
    assert consumer.pull(4, timeout=0.2).messages == []


def test_max_bytes_is_exceeded_only_by_one_large_message(backend: PulsarBackend, topic: str, consumers: Any) -> None:
    values = [b"x" * 100, b"y" * 100, b"z" * 1000, b"w" * 10, b"v" * 10]
    publish(backend, topic, values, batching=True)
    consumer = consumers(topic)
    r1 = consumer.pull(0, max_bytes=250)
    assert [m.value for m in r1.messages] == values[:2]
    r2 = consumer.pull(r1.next_offset, max_bytes=250)
    assert [m.value for m in r2.messages] == [values[2]]  # larger than max_bytes: alone
    r3 = consumer.pull(r2.next_offset, max_bytes=250)
    assert [m.value for m in r3.messages] == values[3:]
    assert r3.next_offset == 5


def test_partitioned_topic(backend: PulsarBackend, consumers: Any) -> None:
    topic = f"persistent://public/default/offsets-part-{uuid.uuid4().hex[:8]}"
    create_topic(backend, topic, partitions=3)
    create_topic(backend, topic, partitions=3)  # identical: fine
    with pytest.raises(ConfigurationError):
        create_topic(backend, topic, partitions=2)
    keys = [f"k{i % 17}" for i in range(300)]
    values = [f"{k}:{i}".encode() for i, k in enumerate(keys)]
    publish(backend, topic, values, batching=True, keys=keys, bursts=[50] * 6)
    consumer = consumers(topic, "part-sub")
    assert consumer.partitions() == [0, 1, 2]
    with pytest.raises(UnknownPartitionError):
        consumer.pull(0)
    with pytest.raises(UnknownPartitionError):
        consumer.pull(0, partition=3)
    ends = consumer.end_offsets()
    seen = []
    for p in range(3):
        got = pull_all(consumer, 0, partition=p, sizes=[33])
        assert [m.offset for m in got] == list(range(ends[p]))
        assert all(m.partition == p for m in got)
        seen.extend(m.value for m in got)
        # one key, one partition, in order
        per_key: dict[str, list[int]] = {}
        for m in got:
            per_key.setdefault(m.key, []).append(int(m.value.split(b":")[1]))
        assert all(v == sorted(v) for v in per_key.values())
    assert sorted(seen) == sorted(values)
    consumer.commit(ends[1] // 2, partition=1)
    assert consumer.committed(partition=1) == ends[1] // 2
    assert consumer.committed(partition=0) is None
    assert consumer.lag() == {0: ends[0], 1: ends[1] - ends[1] // 2, 2: ends[2]}


# -- out of range, no index, unknown ---------------------------------------------------------------
def test_offsets_below_the_retained_range_raise_or_follow_auto_reset(
    backend: PulsarBackend, topic: str, consumers: Any
) -> None:
    """Reference bug: an expired offset silently restarted from the earliest message."""
    admin = backend.admin
    publish(backend, topic, [b"old%d" % i for i in range(10)], batching=True, bursts=[4, 6])
    consumer = consumers(topic)
    pulled = consumer.pull(0, max_messages=3)  # a pooled reader at offset 3, a cached position
    admin.unload(topic)  # closes the ledger; the next load writes to a new one
    publish(backend, topic, [b"new%d" % i for i in range(5)], batching=False)
    assert admin.set_policy(topic, "retention", {"retentionTimeInMinutes": 0, "retentionSizeInMB": 0})
    wait_until(lambda: (admin.trim(topic), consumer.beginning_offsets()[0] == 10)[1], timeout=30)
    assert consumer.end_offsets() == {0: 15}
    # 0: a cached position of a trimmed entry; 3, 9: cold look-ups (the broker answers "earliest").
    # (The pooled reader at 3 may still hand out what it received before the trim, as Kafka's fetch
    # buffer does.)
    for c, offset in ((consumer, 0), (consumers(topic), 3), (consumers(topic), 9)):
        with pytest.raises(OffsetOutOfRangeError) as info:
            c.pull(offset)
        assert (info.value.beginning, info.value.end) == (10, 15)
        assert "below the first retained offset (trimmed): the retained range is [10, 15]" in str(info.value)
    assert pulled.next_offset == 3
    earliest = consumers(topic, auto_offset_reset="earliest").pull(2)
    assert (earliest.offset, [m.value for m in earliest.messages]) == (10, [b"new%d" % i for i in range(5)])
    latest = consumers(topic, auto_offset_reset="latest").pull(2)
    assert (latest.offset, latest.messages) == (15, [])
    sub = consumers(topic, "trimmed-sub")
    with pytest.raises(OffsetOutOfRangeError):
        sub.commit(5)
    sub.commit(12)
    assert sub.committed() == 12


def test_everything_trimmed_keeps_the_offsets(backend: PulsarBackend, topic: str, consumers: Any) -> None:
    admin = backend.admin
    publish(backend, topic, [b"a%d" % i for i in range(6)], batching=True)
    admin.unload(topic)
    assert admin.set_policy(topic, "retention", {"retentionTimeInMinutes": 0, "retentionSizeInMB": 0})
    consumer = consumers(topic)
    wait_until(lambda: (admin.trim(topic), consumer.beginning_offsets()[0] == 6)[1], timeout=30)
    assert consumer.end_offsets() == {0: 6}
    assert consumer.pull(6).messages == []
    with pytest.raises(OffsetOutOfRangeError):
        consumer.pull(5)
    publish(backend, topic, [b"b0", b"b1"], batching=True)
    assert [(m.offset, m.value) for m in consumer.pull(6).messages] == [(6, b"b0"), (7, b"b1")]


@pytest.mark.xdist_group("stock-broker")  # the broker of tests/engine/test_default_policies.py
def test_a_broker_without_the_index_interceptor_is_named(pulsar_stock_broker: Any) -> None:
    backend = open_backend(pulsar_config(pulsar_stock_broker))
    try:
        topic = f"persistent://public/default/noindex-{uuid.uuid4().hex[:8]}"
        create_topic(backend, topic)
        publish(backend, topic, [b"a", b"b"], batching=True)  # type: ignore[arg-type]
        with PullConsumer(backend, topic, "s") as consumer:
            for call in (
                lambda: consumer.pull(0),
                consumer.beginning_offsets,
                consumer.end_offsets,
                lambda: consumer.commit(1),
            ):
                with pytest.raises(OffsetIndexUnavailableError) as info:
                    call()
                message = str(info.value)
                assert (
                    "brokerEntryMetadataInterceptors=org.apache.pulsar.common.intercept.AppendIndexMetadataInterceptor"
                    in message
                )
                assert "exposingBrokerEntryMetadataToClientEnabled=true" in message
    finally:
        backend.close()


def test_unknown_topic_is_an_error_and_never_created(backend: PulsarBackend, consumers: Any) -> None:
    missing = f"persistent://public/default/missing-{uuid.uuid4().hex[:8]}"
    consumer = consumers(missing, "s")
    for call in (
        lambda: consumer.pull(0),
        consumer.end_offsets,
        consumer.beginning_offsets,
        consumer.committed,
        lambda: consumer.commit(0),
        consumer.lag,
        lambda: consumer.offsets_for_times(0),
    ):
        with pytest.raises(UnknownTopicError) as info:
            call()
        assert missing in str(info.value)
    with pytest.raises(UnknownTopicError):
        open_publisher(backend, missing)
    assert backend.admin.partition_count(missing) is None  # asking did not create it


def test_unknown_partition_of_a_plain_topic(topic: str, consumers: Any) -> None:
    with pytest.raises(UnknownPartitionError, match="no partition 1"):
        consumers(topic).pull(0, partition=1)


# -- rollover, time search ---------------------------------------------------------------------------
def test_offsets_across_ledger_rollovers(backend: PulsarBackend, topic: str, consumers: Any) -> None:
    values: list[bytes] = []
    for ledger in range(3):
        chunk = [b"L%d-%d" % (ledger, i) for i in range(25)]
        publish(backend, topic, chunk, batching=ledger != 1, bursts=[10, 15])
        values.extend(chunk)
        backend.admin.unload(topic)  # the next write opens a new ledger
    consumer = consumers(topic)
    assert consumer.end_offsets() == {0: 75}  # the current ledger is empty (L:-1)
    got = pull_all(consumer, 0, sizes=[7])
    assert [m.offset for m in got] == list(range(75)) and [m.value for m in got] == values
    assert len({m.position[0] for m in got}) == 3
    for target in (0, 24, 25, 26, 49, 50, 74):  # cold look-ups on both sides of each boundary
        result = consumers(topic).pull(target, max_messages=2)
        assert [m.value for m in result.messages] == values[target : target + 2]
    assert consumers(topic).pull(75).messages == []
    for ts in sorted({m.publish_time for m in got}) + [got[-1].publish_time + 0.001]:  # the scan crosses ledgers
        assert consumer.offsets_for_times(ts) == {0: next((m.offset for m in got if m.publish_time >= ts), None)}
    publish(backend, topic, [b"after"], batching=False)
    assert [(m.offset, m.value) for m in consumer.pull(75).messages] == [(75, b"after")]


def test_offsets_for_times(backend: PulsarBackend, topic: str, consumers: Any) -> None:
    consumer = consumers(topic)
    assert consumer.offsets_for_times(time.time()) == {0: None}
    stamps = []
    for i in range(4):
        stamps.append(math.floor(time.time() * 1000) / 1000)  # publish times are whole milliseconds
        publish(backend, topic, [b"t%d-%d" % (i, j) for j in range(3)], batching=True)
        time.sleep(0.05)
    got = pull_all(consumer, 0)
    assert consumer.offsets_for_times(0) == {0: 0}
    for i, ts in enumerate(stamps):
        first = consumer.offsets_for_times(ts)[0]
        assert first == 3 * i, (i, first)
        assert got[first].publish_time >= ts
        assert first == 0 or got[first - 1].publish_time < ts
    assert consumer.offsets_for_times(time.time() + 60) == {0: None}


# -- commits --------------------------------------------------------------------------------------------
def receive_all(backend: PulsarBackend, topic: str, subscription: str) -> list[bytes]:
    consumer = backend.client.subscribe(
        topic, subscription, consumer_type=pulsar.ConsumerType.Shared, batch_index_ack_enabled=True
    )
    got = []
    try:
        while True:
            try:
                msg = consumer.receive(1500)
            except pulsar.Timeout:
                return got
            got.append(msg.data())
    finally:
        consumer.close()


def test_commit_inside_a_batch_acknowledges_exactly_the_messages_below(
    backend: PulsarBackend, topic: str, consumers: Any
) -> None:
    """Reference bug: cumulative acks per entry acknowledged a whole batch."""
    values = [b"c%d" % i for i in range(30)]
    publish(backend, topic, values, batching=True, bursts=[10, 10, 10])
    consumer = consumers(topic, "sub-a")
    assert consumer.committed() is None
    assert consumer.lag() == {0: 30}
    consumer.commit(14)  # inside the second batch
    assert consumer.committed() == 14
    assert consumer.lag() == {0: 16}
    assert receive_all(backend, topic, "sub-a") == values[14:]  # a plain consumer on the subscription
    # backwards, to a batch boundary, to the end, to the beginning
    for offset in (3, 10, 30, 0, 21):
        consumer.commit(offset)
        assert consumer.committed() == offset
        assert receive_all(backend, topic, "sub-a") == values[offset:]
    with pytest.raises(OffsetOutOfRangeError):
        consumer.commit(31)
    # The committed offset survives an unload exactly; the cursor keeps every message at or after it.
    backend.admin.unload(topic)
    assert consumers(topic, "sub-a").committed() == 21
    after = receive_all(backend, topic, "sub-a")
    assert after[-9:] == values[21:] and set(after) <= set(values[20:])


def test_commit_on_an_empty_topic_and_a_foreign_subscription(
    backend: PulsarBackend, topic: str, consumers: Any
) -> None:
    consumer = consumers(topic, "sub-e")
    consumer.commit(0)
    assert consumer.committed() == 0
    publish(backend, topic, [b"e0", b"e1", b"e2"], batching=False)
    assert receive_all(backend, topic, "sub-e") == [b"e0", b"e1", b"e2"]
    # A subscription a plain consumer acknowledged: committed() derives from its cursor.
    plain = backend.client.subscribe(topic, "plain", initial_position=pulsar.InitialPosition.Earliest)
    for _ in range(2):
        plain.acknowledge(plain.receive(5000))
    plain.close()
    assert consumers(topic, "plain").committed() == 2


# -- the reader pool -------------------------------------------------------------------------------------
def test_reader_pool_reuse_bounds_and_close(backend: PulsarBackend, topic: str, consumers: Any) -> None:
    publish(backend, topic, [b"p%d" % i for i in range(100)], batching=True, bursts=[10] * 10)
    consumer = PullConsumer(backend, topic, reader_pool_size=2, reader_idle_timeout=4.0)
    log = consumer._log
    assert isinstance(log, PulsarOffsetLog)
    r = consumer.pull(0, max_messages=10)
    r = consumer.pull(r.next_offset, max_messages=10)
    assert log.readers_created == 1 and log.pooled_readers() == {0: [20]}
    consumer.pull(50, max_messages=5)
    consumer.pull(70, max_messages=5)  # a third reader: the least recently used (at 20) is closed
    assert log.readers_created == 3 and log.pooled_readers() == {0: [55, 75]} and log.open_readers() == 2
    consumer.pull(55, max_messages=5)
    assert log.readers_created == 3 and log.pooled_readers() == {0: [75, 60]}
    time.sleep(4.2)
    consumer.pull(0, max_messages=1)  # the idle ones are closed on the next call
    assert log.pooled_readers() == {0: [1]} and log.open_readers() == 1
    stats = backend.admin.topic_stats(topic)
    assert len(stats["subscriptions"]) == 1  # one reader subscription on the broker
    consumer.close()
    assert log.open_readers() == 0
    wait_until(lambda: not backend.admin.topic_stats(topic)["subscriptions"], timeout=10)


def test_two_consumers_share_nothing(backend: PulsarBackend, topic: str, consumers: Any) -> None:
    publish(backend, topic, [b"s%d" % i for i in range(20)], batching=True)
    a, b = consumers(topic), consumers(topic)
    a.pull(0, max_messages=5)
    b.pull(0, max_messages=5)
    a.close()  # closing one leaves the other's readers and caches alone
    assert [m.offset for m in b.pull(5, max_messages=5).messages] == list(range(5, 10))
    assert b._log.readers_created == 1  # type: ignore[attr-defined]


# -- the async probe --------------------------------------------------------------------------------------
def test_async_probe_reads_ends_and_commits_without_blocking(
    backend: PulsarBackend, topic: str, consumers: Any, pulsar_broker: Any
) -> None:
    part = f"persistent://public/default/offsets-aprobe-{uuid.uuid4().hex[:8]}"
    create_topic(backend, part, partitions=2)
    publish(backend, topic, [b"a%d" % i for i in range(7)], batching=True)
    publish(backend, part, [b"b%d" % i for i in range(10)], batching=False)
    consumers(topic, "probe-sub").commit(4)
    part_consumer = consumers(part, "probe-sub")
    ends = part_consumer.end_offsets()
    part_consumer.commit(1, partition=1)
    missing = f"persistent://public/default/missing-{uuid.uuid4().hex[:8]}"

    async def probe() -> tuple[Any, ...]:
        p = open_async_probe(pulsar_config(pulsar_broker))
        ticks = 0
        stop = asyncio.Event()

        async def ticker() -> None:  # the loop keeps running while the probe waits on the broker
            nonlocal ticks
            while not stop.is_set():
                ticks += 1
                await asyncio.sleep(0.001)

        t = asyncio.create_task(ticker())
        try:
            results = (
                await p.end_offsets(topic),
                await p.committed(topic, "probe-sub"),
                await p.committed(topic, "nobody"),
                await p.end_offsets(part),
                await p.committed(part, "probe-sub"),
            )
            with pytest.raises(UnknownTopicError):
                await p.end_offsets(missing)
        finally:
            stop.set()
            await t
            await p.aclose()
            await p.aclose()
        return results + (ticks,)

    end, committed, nobody, part_end, part_committed, ticks = asyncio.run(probe())
    assert end == {0: 7} and committed == {0: 4} and nobody == {0: None}
    assert part_end == ends and part_committed == {0: None, 1: 1}
    assert ticks > 0


def test_concurrent_commits_from_two_consumers_retry_until_done(
    backend: PulsarBackend, topic: str, consumers: Any
) -> None:
    """The broker answers "Subscription Busy" / BadVersion to concurrent cursor updates: each commit
    retries, and the subscription ends at one of the committed offsets."""
    publish(backend, topic, [b"x%d" % i for i in range(50)], batching=True, bursts=[10] * 5)
    a, b = consumers(topic, "shared-sub"), consumers(topic, "shared-sub")
    errors: list[BaseException] = []

    def work(consumer: PullConsumer, offsets: list[int]) -> None:
        try:
            for offset in offsets:
                consumer.commit(offset)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [
        threading.Thread(target=work, args=(a, list(range(0, 50, 3)))),
        threading.Thread(target=work, args=(b, list(range(1, 50, 3)))),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]
    assert a.committed() in (48, 49)


@pytest.mark.xdist_group("own-broker")
def test_offsets_and_commits_survive_a_broker_restart(restartable_broker: Any) -> None:
    """A broker of its own, restarted: the index continues, the committed offset is exact, and the
    cursor never acknowledged a message at or after it."""
    broker = restartable_broker
    topic = f"persistent://public/default/restarted-{uuid.uuid4().hex[:8]}"
    values = [b"r%d" % i for i in range(30)]
    backend = open_backend(pulsar_config(broker))
    try:
        create_topic(backend, topic)
        publish(backend, topic, values, batching=True, bursts=[10, 10, 10])  # type: ignore[arg-type]
        with PullConsumer(backend, topic, "durable") as consumer:
            consumer.commit(14)
    finally:
        backend.close()
    broker.restart()
    backend = open_backend(pulsar_config(broker))
    try:
        with PullConsumer(backend, topic, "durable") as consumer:
            assert consumer.committed() == 14
            assert consumer.beginning_offsets() == {0: 0} and consumer.end_offsets() == {0: 30}
            publish(backend, topic, [b"after"], batching=False)  # type: ignore[arg-type]
            got = pull_all(consumer, 0, sizes=[9])
            assert [(m.offset, m.value) for m in got] == list(enumerate(values + [b"after"]))
            assert [m.value for m in consumer.pull(12, max_messages=3).messages] == values[12:15]
        received = receive_all(backend, topic, "durable")  # type: ignore[arg-type]
        assert received[-17:] == values[14:] + [b"after"] and set(received) <= set(values[10:] + [b"after"])
    finally:
        backend.close()


def test_pulled_messages_pickle_and_compare_as_plain_ones(backend: PulsarBackend, topic: str, consumers: Any) -> None:
    import pickle

    from airflow_provider_pulsarstate.engine.offsets import PulledMessage

    publish(backend, topic, [b"a", b"b"], batching=True, keys=["k", "k"])
    message = consumers(topic).pull(1).messages[0]
    plain = PulledMessage(1, 0, b"b", "k", {}, message.publish_time, message.position)
    assert message == plain and plain == message and message.publish_time > 0
    copy = pickle.loads(pickle.dumps(message))
    assert type(copy) is PulledMessage and copy == plain


def test_async_probe_sends_the_token_and_hides_credentials() -> None:
    admin_url = "http://user:s3cret@127.0.0.1:9"  # nothing listens there
    from airflow_provider_pulsarstate import ConnectionConfig
    from airflow_provider_pulsarstate.engine.errors import BackendUnavailableError

    config = ConnectionConfig(
        url="pulsar://127.0.0.1:6650", admin_url=admin_url, auth_token="tok", operation_timeout=2.0
    )

    async def probe() -> None:
        p = open_async_probe(config)
        assert (await p._admin._http()).client.headers["Authorization"] == "Bearer tok"  # type: ignore[attr-defined]
        with pytest.raises(BackendUnavailableError) as info:
            await p.end_offsets("persistent://public/default/x")
        assert "s3cret" not in str(info.value) and "127.0.0.1:9" in str(info.value)
        await p.aclose()

    asyncio.run(probe())


def test_offsets_counted_inside_a_batch_are_checked_against_the_message_ids() -> None:
    """Edge case (a stand-in client): if a client ever skipped a message inside a batch, counting
    offsets would drift; the pull fails instead of mislabelling messages."""
    from types import SimpleNamespace

    from airflow_provider_pulsarstate.engine.errors import OffsetError
    from airflow_provider_pulsarstate.engine.offsets.pulsar_index import EntryRef
    from airflow_provider_pulsarstate.engine.offsets.pulsar_readers import Cursor

    class Id:
        def __init__(self, e: int, b: int) -> None:
            self.e, self.b = e, b

        def ledger_id(self) -> int:
            return 7

        def entry_id(self) -> int:
            return self.e

        def batch_index(self) -> int:
            return self.b

        def serialize(self) -> bytes:
            return bytes([0x08, 7, 0x10, self.e, 0x20, self.b, 0x30, 3])  # batch_size 3

    class Msg:
        def __init__(self, e: int, b: int) -> None:
            self.id = Id(e, b)

        def message_id(self) -> Id:
            return self.id

        def data(self) -> bytes:
            return b"%d-%d" % (self.id.e, self.id.b)

    class Reader:
        def __init__(self, msgs: list[Msg]) -> None:
            self.msgs = msgs

        def read_next(self, _timeout: int) -> Msg:
            if not self.msgs:
                raise pulsar.Timeout()
            return self.msgs.pop(0)

        def has_message_available(self) -> bool:
            return False

    fake_backend = SimpleNamespace(admin=None, config=SimpleNamespace(operation_timeout=1.0))
    log = PulsarOffsetLog(fake_backend, "persistent://public/default/fake")  # type: ignore[arg-type]
    whole = Cursor(0, "t", Reader([Msg(0, 0), Msg(0, 1), Msg(0, 2), Msg(1, 0)]), 0, entry=EntryRef(7, 0, 0, 3))  # type: ignore[arg-type]
    messages, _ = log._fetcher.fill(whole, max_messages=10, max_bytes=1 << 20, timeout=0)
    assert [(m.offset, m.value) for m in messages] == [(0, b"0-0"), (1, b"0-1"), (2, b"0-2"), (3, b"1-0")]
    skipped = Cursor(0, "t", Reader([Msg(0, 0), Msg(0, 2), Msg(1, 0)]), 0, entry=EntryRef(7, 0, 0, 3))  # type: ignore[arg-type]
    with pytest.raises(OffsetError, match="drifted"):
        log._fetcher.fill(skipped, max_messages=10, max_bytes=1 << 20, timeout=0)
