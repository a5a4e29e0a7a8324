"""``PullConsumer``: Kafka-style pulls and commits by numeric offset, on any topic, on both back ends."""

from __future__ import annotations

import threading
from typing import Literal

from airflow_provider_pulsarstate.engine.backends.base import Backend
from airflow_provider_pulsarstate.engine.errors import (
    ClosedError,
    ConfigurationError,
    OffsetOutOfRangeError,
)
from airflow_provider_pulsarstate.engine.offsets.base import OffsetLog, PullResult
from airflow_provider_pulsarstate.engine.offsets.checks import (
    check_log_options,
    check_offset,
    check_partition_arg,
    check_read_limits,
    check_subscription,
    check_timestamp,
    check_topic,
    partition_error,
    partition_needed,
)

AutoOffsetReset = Literal["earliest", "latest"]


class PullConsumer:
    """Pull messages by offset and commit offsets on a durable subscription, as a Kafka consumer does.

    Usage::

        with PullConsumer(backend, "prices-events", "price-table") as consumer:
            start = consumer.committed() or consumer.beginning_offsets()[0]
            result = consumer.pull(start, max_messages=500)
            for message in result.messages:
                handle(message.offset, message.value)
            consumer.commit(result.next_offset)

    Semantics (the same on a Pulsar broker and on the embedded log):

    * ``pull(offset)`` starts at ``offset`` inclusive, even inside a batch (lower offsets of that
      batch are dropped); ``next_offset`` continues without repeating or skipping; at the end it
      returns no messages; ``max_bytes`` is exceeded only by one message larger than it, returned alone.
    * ``commit(next_offset)`` makes ``next_offset`` the committed offset (the next to consume) and
      acknowledges exactly the messages below it, at message level.
    * An offset below the retained range, or past the end, raises :class:`OffsetOutOfRangeError`
      unless ``auto_offset_reset`` says where to go instead ("earliest": the beginning, "latest":
      the end). Nothing is silently restarted.
    * A non-partitioned topic is partition 0 (``partition=None`` means 0); a partitioned topic
      needs ``partition=``. The partition count is re-read, never cached for the consumer's life.

    :param backend: an open back end (not closed by this consumer).
    :param topic: the full topic name (``persistent://tenant/ns/name``; the hook resolves short names).
    :param subscription: the durable subscription for commits (None: pull only).
    :param auto_offset_reset: what an out-of-range offset does (None: raise).
    :param reader_pool_size: Pulsar readers kept per partition, keyed by next offset (a caller
        continuing where it stopped reuses one).
    :param reader_idle_timeout: seconds an unused pooled reader is kept.
    :param position_cache_size: offset-to-position answers cached per partition.

    Nothing is shared between consumers; :meth:`close` releases every reader it opened.
    """

    def __init__(
        self,
        backend: Backend,
        topic: str,
        subscription: str | None = None,
        *,
        auto_offset_reset: AutoOffsetReset | None = None,
        reader_pool_size: int = 8,
        reader_idle_timeout: float = 300.0,
        position_cache_size: int = 1000,
    ) -> None:
        if auto_offset_reset not in (None, "earliest", "latest"):
            raise ConfigurationError(
                f"auto_offset_reset must be 'earliest', 'latest' or None, got {auto_offset_reset!r}"
            )
        check_topic(topic)
        if subscription is not None:
            check_subscription(subscription, topic)
        check_log_options(
            topic,
            {
                "reader_pool_size": reader_pool_size,
                "reader_idle_timeout": reader_idle_timeout,
                "position_cache_size": position_cache_size,
            },
        )
        from airflow_provider_pulsarstate.engine.offsets import open_offset_log

        self.topic = topic
        self.subscription = subscription
        self.auto_offset_reset = auto_offset_reset
        self._log: OffsetLog = open_offset_log(
            backend,
            topic,
            reader_pool_size=reader_pool_size,
            reader_idle_timeout=reader_idle_timeout,
            position_cache_size=position_cache_size,
        )
        self._closed = False
        self._lock = threading.Lock()

    # -- partitions --------------------------------------------------------------------------
    def partitions(self) -> list[int]:
        """The partitions to address: ``[0]`` for a non-partitioned topic."""
        count = self._open().partitions()
        return [0] if count == 0 else list(range(count))

    def _partition(self, partition: int | None) -> int:
        count = self._open().partitions()
        if partition is None:
            if count:
                raise partition_needed(self.topic, count)
            return 0
        check_partition_arg(partition, self.topic)
        error = partition_error(self.topic, count, partition)
        if error is not None:
            raise error
        return partition

    # -- reading -----------------------------------------------------------------------------
    def pull(
        self,
        offset: int,
        *,
        partition: int | None = None,
        max_messages: int = 500,
        max_bytes: int = 1 << 20,
        timeout: float = 0.0,
    ) -> PullResult:
        """Messages from ``offset`` (inclusive); see the class docstring for the guarantees.

        :param timeout: seconds to wait for a first message when ``offset`` is the end.
        :raises OffsetOutOfRangeError: ``offset`` outside [beginning, end] and no auto reset.
        """
        check_offset(offset, "offset", self.topic)
        check_read_limits(self.topic, max_messages=max_messages, max_bytes=max_bytes, timeout=timeout)
        part = self._partition(partition)
        log = self._open()
        try:
            messages, end = log.read(part, offset, max_messages=max_messages, max_bytes=max_bytes, timeout=timeout)
        except OffsetOutOfRangeError:
            if self.auto_offset_reset is None:
                raise
            offset = log.beginning_offset(part) if self.auto_offset_reset == "earliest" else log.end_offset(part)
            messages, end = log.read(part, offset, max_messages=max_messages, max_bytes=max_bytes, timeout=timeout)
        next_offset = messages[-1].offset + 1 if messages else offset
        return PullResult(messages, part, offset, next_offset, max(end, next_offset))

    def beginning_offsets(self) -> dict[int, int]:
        """Each partition's first retained offset."""
        log = self._open()
        return {p: log.beginning_offset(p) for p in self.partitions()}

    def end_offsets(self) -> dict[int, int]:
        """Each partition's end offset (last + 1)."""
        log = self._open()
        return {p: log.end_offset(p) for p in self.partitions()}

    def offsets_for_times(self, timestamp: float) -> dict[int, int | None]:
        """Each partition's first offset published at or after ``timestamp`` (seconds since the
        epoch), or None where no message is that recent.

        :raises ConfigurationError: ``timestamp`` is not a number of seconds (a value past the year
            5000 is taken for Kafka's milliseconds and refused rather than answered with None).
        """
        check_timestamp(timestamp, self.topic)
        log = self._open()
        return {p: log.offset_for_time(p, timestamp) for p in self.partitions()}

    # -- committing --------------------------------------------------------------------------
    def commit(self, next_offset: int, *, partition: int | None = None) -> None:
        """Commit ``next_offset`` (the next offset to consume) for ``partition``; durable on return.

        :raises ConfigurationError: the consumer has no subscription.
        :raises OffsetOutOfRangeError: ``next_offset`` is outside [beginning, end].
        """
        check_offset(next_offset, "next_offset", self.topic)
        part = self._partition(partition)
        self._open().commit(self._subscription(), part, next_offset)

    def committed(self, *, partition: int | None = None) -> int | None:
        """The committed offset of ``partition`` (None: never committed)."""
        part = self._partition(partition)
        return self._open().committed(self._subscription(), part)

    def lag(self) -> dict[int, int]:
        """Each partition's ``end - committed`` (``end - beginning`` where never committed)."""
        log = self._open()
        sub = self._subscription()
        lags = {}
        for p in self.partitions():
            committed = log.committed(sub, p)
            start = committed if committed is not None else log.beginning_offset(p)
            lags[p] = max(0, log.end_offset(p) - start)
        return lags

    def _subscription(self) -> str:
        if self.subscription is None:
            raise ConfigurationError(
                f"this PullConsumer of {self.topic} has no subscription: pass subscription= to commit or read commits"
            )
        return self.subscription

    # -- lifecycle ---------------------------------------------------------------------------
    def _open(self) -> OffsetLog:
        if self._closed:
            raise ClosedError(f"PullConsumer of {self.topic} is closed")
        return self._log

    def close(self) -> None:
        """Release every reader and connection this consumer opened (idempotent)."""
        with self._lock:
            if not self._closed:
                self._closed = True
                self._log.close()

    def __enter__(self) -> PullConsumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
