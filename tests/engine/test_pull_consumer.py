"""PullConsumer conformance: Kafka's pull/commit semantics, the same on both back ends.

Only the public contract is used (``create_topic``, ``open_publisher``, ``PullConsumer``), so this
suite runs unchanged against every OffsetLog. Offsets are not assumed dense or starting at 0 (a
Pulsar broker may give indexes to system messages): expectations come from the published values,
their order, and the offsets the back end reports.
"""

from __future__ import annotations

import random
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from airflow_provider_pulsarstate import ConnectionConfig, open_backend
from airflow_provider_pulsarstate.engine.backends.base import Backend
from airflow_provider_pulsarstate.engine.errors import (
    ClosedError,
    ConfigurationError,
    OffsetOutOfRangeError,
    UnknownPartitionError,
    UnknownTopicError,
)
from airflow_provider_pulsarstate.engine.offsets import (
    PullConsumer,
    PulledMessage,
    create_topic,
    open_publisher,
)

FLUSH = 30.0


@pytest.fixture
def consumers(backend: Backend, topic: str) -> Iterator[object]:
    """A factory of PullConsumers on the test topic (``on=`` another topic), closed at teardown."""
    made: list[PullConsumer] = []

    def make(subscription: str | None = "sub", *, on: str | None = None, **options: object) -> PullConsumer:
        consumer = PullConsumer(backend, on or topic, subscription, **options)  # type: ignore[arg-type]
        made.append(consumer)
        return consumer

    yield make
    for consumer in made:
        consumer.close()


def publish(
    backend: Backend,
    topic: str,
    values: list[bytes],
    *,
    batching: bool = True,
    keys: list[str | None] | None = None,
    properties: list[dict[str, str]] | None = None,
) -> None:
    with open_publisher(backend, topic, batching=batching) as publisher:
        for i, value in enumerate(values):
            publisher.send(value, key=keys[i] if keys else None, properties=properties[i] if properties else None)
        publisher.flush(timeout=FLUSH)


def values(n: int, prefix: str = "m") -> list[bytes]:
    return [f"{prefix}-{i:06d}".encode() for i in range(n)]


def drain(
    consumer: PullConsumer, start: int, *, size: int | list[int], partition: int | None = None, max_bytes: int = 1 << 20
) -> list[PulledMessage]:
    """Pull from ``start`` to the end, checking each pull's own guarantees on the way."""
    out: list[PulledMessage] = []
    offset = start
    sizes = iter(size) if isinstance(size, list) else None
    while True:
        n = next(sizes, 500) if sizes else size
        result = consumer.pull(offset, partition=partition, max_messages=n, max_bytes=max_bytes)  # type: ignore[arg-type]
        assert result.offset == offset
        assert len(result.messages) <= n
        assert result.end_offset >= result.next_offset
        if not result.messages:
            assert result.next_offset == offset
            return out
        assert result.messages[0].offset >= offset
        assert [m.offset for m in result.messages] == sorted({m.offset for m in result.messages})
        assert result.next_offset == result.messages[-1].offset + 1
        out.extend(result.messages)
        offset = result.next_offset


def assert_exact(messages: list[PulledMessage], expected: list[bytes]) -> None:
    """Every published value once, in order, with strictly increasing offsets."""
    assert [m.value for m in messages] == expected
    offsets = [m.offset for m in messages]
    assert all(a < b for a, b in zip(offsets, offsets[1:])), "offsets must strictly increase"


# -- reading ---------------------------------------------------------------------------------
@pytest.mark.parametrize("batching", [True, False], ids=["batched", "unbatched"])
def test_consecutive_pulls_never_repeat_or_skip(backend: Backend, topic: str, consumers, batching: bool) -> None:
    expected = values(3000)
    create_topic(backend, topic)
    publish(backend, topic, expected, batching=batching)
    consumer = consumers(None)
    begin, end = consumer.beginning_offsets()[0], consumer.end_offsets()[0]
    reference = drain(consumer, begin, size=5000)
    assert_exact(reference, expected)
    assert reference[0].offset == begin and end == reference[-1].offset + 1
    for size in (1, 7, 100, 499):
        assert drain(consumer, begin, size=size) == reference, f"pull size {size}"
    rng = random.Random(8)
    assert drain(consumer, begin, size=[rng.randint(1, 300) for _ in range(3000)]) == reference
    # Starting in the middle continues exactly as the full read does.
    middle = reference[1234].offset
    assert drain(consumer, middle, size=33) == reference[1234:]


def test_pulls_while_publishing_never_repeat_or_skip(backend: Backend, topic: str, consumers) -> None:
    create_topic(backend, topic)
    expected = values(1000)
    failures: list[BaseException] = []

    def produce() -> None:
        try:
            with open_publisher(backend, topic) as publisher:
                for i, value in enumerate(expected):
                    publisher.send(value)
                    if i % 50 == 49:
                        publisher.flush(timeout=FLUSH)
                        time.sleep(0.01)
        except BaseException as exc:  # noqa: BLE001 - reported below
            failures.append(exc)

    consumer = consumers(None)
    offset = consumer.beginning_offsets()[0]
    thread = threading.Thread(target=produce)
    thread.start()
    got: list[PulledMessage] = []
    deadline = time.monotonic() + 60
    try:
        while len(got) < len(expected) and time.monotonic() < deadline:
            result = consumer.pull(offset, max_messages=37, timeout=0.2)
            got.extend(result.messages)
            offset = result.next_offset
    finally:
        thread.join()
    assert not failures
    assert_exact(got, expected)
    assert consumer.pull(offset).messages == []


@pytest.mark.parametrize("batching", [True, False], ids=["batched", "unbatched"])
def test_start_is_inclusive_at_every_offset(backend: Backend, topic: str, consumers, batching: bool) -> None:
    expected = values(60)
    create_topic(backend, topic)
    publish(backend, topic, expected, batching=batching)
    consumer = consumers(None)
    reference = drain(consumer, consumer.beginning_offsets()[0], size=1000)
    assert_exact(reference, expected)
    for i, message in enumerate(reference):  # inside a batch too: lower offsets of it are dropped
        result = consumer.pull(message.offset, max_messages=3)
        assert result.messages == reference[i : i + 3], f"pull at offset {message.offset}"


def test_pull_at_the_end_is_empty_and_waits_for_a_message(backend: Backend, topic: str, consumers) -> None:
    create_topic(backend, topic)
    consumer = consumers(None)
    empty = consumer.pull(consumer.end_offsets()[0])
    assert empty.messages == [] and empty.next_offset == empty.offset == empty.end_offset
    publish(backend, topic, values(5))
    end = consumer.end_offsets()[0]
    result = consumer.pull(end)
    assert result.messages == [] and result.next_offset == end and result.end_offset == end and result.lag == 0
    start = time.monotonic()
    assert consumer.pull(end, timeout=0.5).messages == []
    assert time.monotonic() - start >= 0.4

    def later() -> None:
        time.sleep(0.5)
        publish(backend, topic, [b"late"])

    thread = threading.Thread(target=later)
    start = time.monotonic()
    thread.start()
    try:
        waited = consumer.pull(end, timeout=20)
    finally:
        thread.join()
    elapsed = time.monotonic() - start
    assert [m.value for m in waited.messages] == [b"late"] and waited.messages[0].offset >= end
    assert 0.3 <= elapsed < 15


def test_max_messages(backend: Backend, topic: str, consumers) -> None:
    create_topic(backend, topic)
    publish(backend, topic, values(20))
    consumer = consumers(None)
    begin = consumer.beginning_offsets()[0]
    end = consumer.end_offsets()[0]
    for n in (1, 5, 19, 20, 21):
        result = consumer.pull(begin, max_messages=n)
        assert len(result.messages) == min(n, 20)
        assert result.end_offset == end and result.lag == end - result.next_offset


def test_max_bytes_is_exceeded_only_by_one_larger_message(backend: Backend, topic: str, consumers) -> None:
    sizes = [10, 10, 10, 50, 10, 10]
    create_topic(backend, topic)
    publish(backend, topic, [bytes([65 + i]) * s for i, s in enumerate(sizes)])
    consumer = consumers(None)
    offsets = [m.offset for m in drain(consumer, consumer.beginning_offsets()[0], size=100)]

    def pulled(i: int, max_bytes: int) -> list[int]:
        return [len(m.value) for m in consumer.pull(offsets[i], max_bytes=max_bytes).messages]

    assert pulled(0, 25) == [10, 10]  # a third would exceed 25
    assert pulled(0, 30) == [10, 10, 10]  # exactly the limit is fine
    assert pulled(2, 25) == [10]  # the next (50) would exceed: not added
    assert pulled(3, 25) == [50]  # larger than the limit: returned alone
    assert pulled(3, 1) == [50]
    assert pulled(4, 1 << 20) == [10, 10]
    assert [len(m.value) for m in drain(consumer, offsets[0], size=100, max_bytes=25)] == sizes


def test_messages_keep_key_properties_and_publish_time(backend: Backend, topic: str, consumers) -> None:
    create_topic(backend, topic)
    before = time.time()
    publish(
        backend, topic, [b"a", b"b", b"c"], keys=["k1", None, "k3"], properties=[{"p": "1", "q": "x"}, {}, {"p": "3"}]
    )
    after = time.time()
    consumer = consumers(None)
    got = consumer.pull(consumer.beginning_offsets()[0]).messages
    assert [(m.value, m.key, dict(m.properties)) for m in got] == [
        (b"a", "k1", {"p": "1", "q": "x"}),
        (b"b", None, {}),
        (b"c", "k3", {"p": "3"}),
    ]
    assert all(before - 1 <= m.publish_time <= after + 1 for m in got)
    assert all(m.partition == 0 for m in got)


# -- partitions ------------------------------------------------------------------------------
def test_partitioned_topic_partitions_are_independent(backend: Backend, topic: str, consumers) -> None:
    create_topic(backend, topic, partitions=3)
    create_topic(backend, topic, partitions=3)  # identical: fine
    with pytest.raises(ConfigurationError, match="partitions"):
        create_topic(backend, topic, partitions=2)
    keys = [f"key-{i % 10}" for i in range(300)]
    expected = values(300)
    publish(backend, topic, expected, keys=keys)
    consumer = consumers("sub")
    assert consumer.partitions() == [0, 1, 2]
    with pytest.raises(UnknownPartitionError, match="3 partitions"):
        consumer.pull(0)
    with pytest.raises(UnknownPartitionError, match="3 partitions"):
        consumer.commit(0)
    with pytest.raises(UnknownPartitionError, match=r"no partition 3"):
        consumer.pull(0, partition=3)
    begins, ends = consumer.beginning_offsets(), consumer.end_offsets()
    assert set(begins) == set(ends) == {0, 1, 2}
    seen: dict[int, list[PulledMessage]] = {}
    for p in (0, 1, 2):
        seen[p] = drain(consumer, begins[p], size=17, partition=p)
        assert all(m.partition == p for m in seen[p])
        if seen[p]:
            assert ends[p] == seen[p][-1].offset + 1
        assert_exact(seen[p], [v for v, k in zip(expected, keys) if any(m.key == k for m in seen[p])])
    assert sorted(m.value for ms in seen.values() for m in ms) == expected
    partition_of = {m.key: p for p, ms in seen.items() for m in ms}
    assert len(partition_of) == 10  # one key, one partition
    assert sum(1 for ms in seen.values() if ms) >= 2  # ten keys spread over partitions
    # Committing one partition leaves the others untouched.
    busiest = max(seen, key=lambda p: len(seen[p]))
    consumer.commit(seen[busiest][5].offset, partition=busiest)
    assert consumer.committed(partition=busiest) == seen[busiest][5].offset
    assert all(consumer.committed(partition=p) is None for p in (0, 1, 2) if p != busiest)
    lag = consumer.lag()
    assert lag[busiest] == ends[busiest] - seen[busiest][5].offset
    assert all(lag[p] == ends[p] - begins[p] for p in (0, 1, 2) if p != busiest)


def test_partitioned_topic_without_keys(backend: Backend, topic: str, consumers) -> None:
    create_topic(backend, topic, partitions=2)
    expected = values(100)
    publish(backend, topic, expected)
    consumer = consumers(None)
    got = [m for p in (0, 1) for m in drain(consumer, consumer.beginning_offsets()[p], size=30, partition=p)]
    assert sorted(m.value for m in got) == expected


def test_unknown_partition_of_a_non_partitioned_topic(backend: Backend, topic: str, consumers) -> None:
    create_topic(backend, topic)
    publish(backend, topic, values(3))
    consumer = consumers("sub")
    assert consumer.partitions() == [0]
    assert consumer.pull(0, partition=0).offset == consumer.pull(0).offset
    for bad in (1, -1):
        with pytest.raises(UnknownPartitionError, match=f"no partition {bad}"):
            consumer.pull(0, partition=bad)
    with pytest.raises(UnknownPartitionError):
        consumer.commit(1, partition=1)


def test_unknown_topic_is_a_clear_error_and_is_not_created(backend: Backend, consumers) -> None:
    missing = f"persistent://public/default/missing-{uuid.uuid4().hex[:12]}"
    consumer = consumers("sub", on=missing)
    for call in (
        lambda: consumer.pull(0),
        consumer.end_offsets,
        consumer.beginning_offsets,
        consumer.lag,
        lambda: consumer.committed(),
        lambda: consumer.commit(0),
        lambda: consumer.offsets_for_times(0.0),
    ):
        with pytest.raises(UnknownTopicError, match="missing-"):
            call()
    with pytest.raises(UnknownTopicError, match="create_topic"):  # a mistyped name never starts a topic
        open_publisher(backend, missing)
    with pytest.raises(UnknownTopicError):  # asking did not create it
        consumer.partitions()


# -- offsets: commit, lag, time --------------------------------------------------------------
def test_commit_committed_and_lag(backend_config: ConnectionConfig, backend: Backend, topic: str, consumers) -> None:
    create_topic(backend, topic)
    publish(backend, topic, values(50))
    consumer = consumers("sub")
    begin, end = consumer.beginning_offsets()[0], consumer.end_offsets()[0]
    assert consumer.committed() is None
    assert consumer.lag() == {0: end - begin}
    messages = drain(consumer, begin, size=10)
    consumer.commit(messages[20].offset)
    assert consumer.committed() == messages[20].offset
    assert consumer.lag() == {0: end - messages[20].offset}
    # Durable on return: another connection to the back end sees it.
    other = open_backend(backend_config)
    try:
        with PullConsumer(other, topic, "sub") as elsewhere:
            assert elsewhere.committed() == messages[20].offset
            assert elsewhere.lag() == {0: end - messages[20].offset}
    finally:
        other.close()
    consumer.commit(messages[5].offset)  # a commit may move back (rewind), as in Kafka
    assert consumer.committed() == messages[5].offset
    consumer.commit(end)
    assert consumer.committed() == end and consumer.lag() == {0: 0}
    with pytest.raises(OffsetOutOfRangeError) as caught:
        consumer.commit(end + 1)
    assert caught.value.offset == end + 1 and caught.value.end == end and caught.value.partition == 0
    assert consumer.committed() == end  # nothing committed
    publish(backend, topic, values(7, "more"))
    assert consumer.lag() == {0: consumer.end_offsets()[0] - end}
    assert consumer.lag()[0] >= 7
    # Another subscription is separate.
    assert consumers("another").committed() is None


def test_commit_without_subscription_is_a_clear_error(backend: Backend, topic: str, consumers) -> None:
    create_topic(backend, topic)
    publish(backend, topic, values(3))
    consumer = consumers(None)
    for call in (lambda: consumer.commit(1), lambda: consumer.committed(), consumer.lag):
        with pytest.raises(ConfigurationError, match="no subscription"):
            call()
    assert len(consumer.pull(consumer.beginning_offsets()[0]).messages) == 3  # pulling needs none


def test_two_consumers_of_one_subscription_see_each_others_commits(backend: Backend, topic: str, consumers) -> None:
    create_topic(backend, topic)
    publish(backend, topic, values(30))
    first, second = consumers("shared"), consumers("shared")
    messages = drain(first, first.beginning_offsets()[0], size=100)
    first.commit(messages[10].offset)
    assert second.committed() == messages[10].offset
    second.commit(messages[25].offset)
    assert first.committed() == messages[25].offset
    assert first.lag() == second.lag() == {0: first.end_offsets()[0] - messages[25].offset}


def test_offsets_for_times(backend: Backend, topic: str, consumers) -> None:
    create_topic(backend, topic)
    consumer = consumers(None)
    assert consumer.offsets_for_times(0.0) == {0: None}  # empty
    publish(backend, topic, values(5, "early"))
    time.sleep(0.3)
    between = time.time()
    time.sleep(0.3)
    publish(backend, topic, values(5, "late"))
    messages = drain(consumer, consumer.beginning_offsets()[0], size=100)
    assert consumer.offsets_for_times(0.0) == {0: messages[0].offset}
    assert consumer.offsets_for_times(between) == {0: messages[5].offset}
    assert consumer.offsets_for_times(messages[0].publish_time) == {0: messages[0].offset}
    assert consumer.offsets_for_times(time.time() + 3600) == {0: None}  # past the end


def test_offsets_for_times_match_a_scan_at_every_publish_time(backend: Backend, topic: str, consumers) -> None:
    """Two batched publishers interleaved in bursts a millisecond or two apart: a query at each
    message's exact publish time (and half a millisecond later) answers what a scan of the
    partition answers, the first offset published at or after it; 1 ms after the last, None.
    (Pulsar's own look-up goes by the broker's timestamp, later than ``publish_time``: it answered
    early.)"""
    create_topic(backend, topic)
    publishers = [open_publisher(backend, topic, batching=True) for _ in range(2)]
    try:
        for burst in range(40):
            for i in range(7):
                publishers[(burst + i) % 2].send(f"b{burst:02d}-{i}".encode())
            time.sleep(0.001 + 0.001 * (burst % 3))
        for publisher in publishers:
            publisher.flush(timeout=FLUSH)
    finally:
        for publisher in publishers:
            publisher.close()
    consumer = consumers(None)
    messages = drain(consumer, consumer.beginning_offsets()[0], size=500)
    assert len(messages) == 280

    def scan(ts: float) -> int | None:
        return next((m.offset for m in messages if m.publish_time >= ts), None)

    stamps = sorted({m.publish_time for m in messages})
    queries = stamps + [ts + 0.0005 for ts in stamps] + [stamps[-1] + 0.001]
    wrong = {ts: (got, scan(ts)) for ts in queries if (got := consumer.offsets_for_times(ts)[0]) != scan(ts)}
    assert not wrong, f"{len(wrong)} of {len(queries)} queries differ from the scan (got, scan): {wrong}"
    assert consumer.offsets_for_times(stamps[-1] + 0.001) == {0: None}


# -- out of range ----------------------------------------------------------------------------
def test_offset_past_the_end_is_out_of_range(backend: Backend, topic: str, consumers) -> None:
    create_topic(backend, topic)
    publish(backend, topic, values(10))
    strict = consumers(None)
    begin, end = strict.beginning_offsets()[0], strict.end_offsets()[0]
    with pytest.raises(OffsetOutOfRangeError) as caught:
        strict.pull(end + 5)
    error = caught.value
    assert (error.topic, error.partition, error.offset, error.beginning, error.end) == (topic, 0, end + 5, begin, end)
    assert str(end + 5) in str(error) and topic in str(error)
    latest = consumers(None, auto_offset_reset="latest").pull(end + 5)
    assert latest.messages == [] and latest.offset == latest.next_offset == end
    earliest = consumers(None, auto_offset_reset="earliest").pull(end + 5, max_messages=100)
    assert earliest.offset == begin and [m.value for m in earliest.messages] == values(10)


# -- arguments and lifecycle -----------------------------------------------------------------
def test_bad_arguments_are_clear_errors(backend: Backend, topic: str, consumers) -> None:
    create_topic(backend, topic)
    publish(backend, topic, values(3))
    consumer = consumers("sub")
    cases = [
        (lambda: consumer.pull(-1), "offset must be a non-negative int, got -1"),
        (lambda: consumer.pull("3"), "offset must be a non-negative int, got '3'"),  # type: ignore[arg-type]
        (lambda: consumer.pull(True), "offset must be a non-negative int"),  # type: ignore[arg-type]
        (lambda: consumer.pull(0, max_messages=0), "max_messages must be at least 1, got 0"),
        (lambda: consumer.pull(0, max_bytes=0), "max_bytes must be at least 1, got 0"),
        (lambda: consumer.pull(0, timeout=-1), "timeout must not be negative"),
        (lambda: consumer.commit(-2), "next_offset must be a non-negative int, got -2"),
        (lambda: PullConsumer(backend, topic, "sub", auto_offset_reset="none"), "auto_offset_reset"),  # type: ignore[arg-type]
        (lambda: PullConsumer(backend, topic, " "), "subscription must not be empty"),
        (lambda: PullConsumer(backend, topic, reader_pool_size=0), "reader_pool_size must be at least 1"),
        (lambda: create_topic(backend, topic, partitions=-1), "partitions"),
        (lambda: consumer.offsets_for_times(time.time() * 1000), "looks like milliseconds"),
        (lambda: consumer.offsets_for_times("2026-01-01"), "timestamp must be seconds"),  # type: ignore[arg-type]
        (lambda: consumer.offsets_for_times(float("nan")), "timestamp must be seconds"),
    ]
    with open_publisher(backend, topic) as publisher:
        cases += [
            (lambda: publisher.send("text"), "bytes"),  # type: ignore[arg-type]
            (lambda: publisher.send(b"v", key=7), "key"),  # type: ignore[arg-type]
            (lambda: publisher.send(b"v", properties={"n": 1}), "properties"),  # type: ignore[dict-item]
            (lambda: publisher.send(b"v", properties=[("a", "b")]), "properties"),  # type: ignore[arg-type]
        ]
        for call, message in cases:
            with pytest.raises(ConfigurationError, match=message):
                call()
    assert consumer.committed() is None  # nothing was committed by the bad calls
    assert consumer.end_offsets() == {0: consumer.beginning_offsets()[0] + 3}  # nor published


def test_close_releases_and_a_closed_consumer_raises(backend: Backend, topic: str) -> None:
    create_topic(backend, topic)
    publish(backend, topic, values(10))
    with PullConsumer(backend, topic, "sub") as consumer:
        result = consumer.pull(consumer.beginning_offsets()[0], max_messages=4)
        consumer.pull(result.next_offset, max_messages=4)  # a pooled continuation to release
        consumer.commit(result.next_offset)
    for call in (
        lambda: consumer.pull(0),
        consumer.end_offsets,
        consumer.beginning_offsets,
        consumer.lag,
        lambda: consumer.commit(0),
        lambda: consumer.committed(),
        consumer.partitions,
        lambda: consumer.offsets_for_times(0.0),
    ):
        with pytest.raises(ClosedError, match="closed"):
            call()
    consumer.close()  # idempotent
    # The back end stays open and the commit stayed.
    with PullConsumer(backend, topic, "sub") as again:
        assert again.committed() == result.next_offset


def test_two_consumers_never_share_caches(backend: Backend, topic: str, consumers) -> None:
    create_topic(backend, topic)
    expected = values(200)
    publish(backend, topic, expected)
    first, second = consumers(None), consumers(None)
    reference = drain(first, first.beginning_offsets()[0], size=1000)
    # Interleaved continuations from different places never cross.
    a, b = first.pull(reference[0].offset, max_messages=10), second.pull(reference[100].offset, max_messages=10)
    for _ in range(5):
        assert a.messages == reference[reference.index(a.messages[0]) :][:10]
        assert b.messages == reference[reference.index(b.messages[0]) :][:10]
        a, b = first.pull(a.next_offset, max_messages=10), second.pull(b.next_offset, max_messages=10)
    first.close()  # closing one leaves the other's readers and caches intact
    rest = drain(second, b.offset, size=13)
    assert rest == reference[150:]
    rng = random.Random(3)
    for i in rng.sample(range(200), 20):
        assert second.pull(reference[i].offset, max_messages=1).messages == [reference[i]]


def test_one_consumer_shared_by_threads(backend: Backend, topic: str, consumers) -> None:
    create_topic(backend, topic)
    publish(backend, topic, values(300))
    consumer = consumers("sub")
    reference = drain(consumer, consumer.beginning_offsets()[0], size=1000)
    failures: list[BaseException] = []

    def work(seed: int) -> None:
        rng = random.Random(seed)
        try:
            for _ in range(40):
                i, n = rng.randrange(300), rng.randint(1, 20)
                result = consumer.pull(reference[i].offset, max_messages=n)
                assert result.messages == reference[i : i + n]
                if rng.random() < 0.5:  # continuations too
                    assert consumer.pull(result.next_offset, max_messages=n).messages == reference[i + n : i + 2 * n]
                consumer.commit(result.next_offset)
        except BaseException as exc:  # noqa: BLE001 - reported below
            failures.append(exc)

    threads = [threading.Thread(target=work, args=(seed,)) for seed in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures, failures[0]
    assert consumer.committed() in {m.offset + 1 for m in reference}


# -- below the retained range (needs trimming: embedded here) -----------------------------------
@pytest.fixture
def embedded(tmp_path: Path) -> Iterator[Backend]:
    b = open_backend(ConnectionConfig(url=str(tmp_path / "state.db"), operation_timeout=15.0))
    yield b
    b.close()


def test_offset_below_the_retained_range_on_embedded(embedded: Backend, topic: str) -> None:
    from airflow_provider_pulsarstate.engine.offsets.embedded import trim_embedded_topic

    create_topic(embedded, topic)
    publish(embedded, topic, values(20))
    with PullConsumer(embedded, topic, "sub") as strict:
        strict.commit(3)
        assert trim_embedded_topic(embedded, topic, 8) == 8  # type: ignore[arg-type]
        assert strict.beginning_offsets() == {0: 8} and strict.end_offsets() == {0: 20}
        with pytest.raises(OffsetOutOfRangeError) as caught:
            strict.pull(strict.committed())  # type: ignore[arg-type]
        error = caught.value
        assert (error.topic, error.partition, error.offset, error.beginning, error.end) == (topic, 0, 3, 8, 20)
        assert "[8, 20]" in str(error) and "partition 0" in str(error) and topic in str(error)
        assert strict.committed() == 3  # an expired commit is never silently moved
        with pytest.raises(OffsetOutOfRangeError):
            strict.commit(7)
        assert strict.pull(8, max_messages=1).messages[0].value == values(20)[8]
    with PullConsumer(embedded, topic, "sub", auto_offset_reset="earliest") as earliest:
        result = earliest.pull(3, max_messages=100)
        assert result.offset == 8 and [m.value for m in result.messages] == values(20)[8:]
    with PullConsumer(embedded, topic, "sub", auto_offset_reset="latest") as latest:
        result = latest.pull(3)
        assert result.offset == 20 and result.messages == []
    # Trimming everything keeps the numbering: the next message is offset 20.
    assert trim_embedded_topic(embedded, topic, 1000) == 20  # type: ignore[arg-type]
    assert trim_embedded_topic(embedded, topic, 5) == 20  # type: ignore[arg-type]  # never moves back
    publish(embedded, topic, [b"after"])
    with PullConsumer(embedded, topic) as consumer:
        assert consumer.beginning_offsets() == {0: 20}
        assert [(m.offset, m.value) for m in consumer.pull(20).messages] == [(20, b"after")]
