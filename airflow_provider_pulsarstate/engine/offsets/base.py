"""What a back end provides for offset-based consumption of any topic (not only state logs).

:class:`OffsetLog` is one topic on one back end, seen as Kafka sees a topic: partitions (a
non-partitioned topic is partition 0), and in each partition messages numbered by increasing
offsets. :class:`~airflow_provider_pulsarstate.engine.offsets.consumer.PullConsumer` adds the
Kafka semantics users bring (auto offset reset, validation, result shaping) on top of it, the same
for both back ends.

Offsets:

* Pulsar: the broker's entry index (``AppendIndexMetadataInterceptor``), per partition, starting at
  0 when the interceptor was enabled. An entry carries the index of its LAST message; a batch of
  ``n`` messages in an entry with index ``i`` holds offsets ``i-n+1 .. i``. Offsets increase but may
  skip numbers (system and chunked messages take indexes), exactly as Kafka documents.
* Embedded: the entry's position in the topic (0, 1, 2, ...).

``end`` is the offset after the last message (last + 1; ``beginning`` when empty); ``beginning``
is the first retained offset. A committed offset is the NEXT offset to consume.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from airflow_provider_pulsarstate.engine.offsets.checks import (
    check_log_options,
    check_message,
    check_offset,
    check_partition_arg,
    check_read_limits,
    check_subscription,
    check_timestamp,
    check_topic,
    log_closed,
)


@dataclass(frozen=True, slots=True)
class PulledMessage:
    """One message and its offset.

    :ivar offset: the message's offset in its partition.
    :ivar partition: 0 for a non-partitioned topic.
    :ivar value: the payload as published.
    :ivar key: the partition key, or None.
    :ivar properties: the message properties (empty when none).
    :ivar publish_time: seconds since the epoch, as stamped at publish time.
    :ivar position: the back end's own position (Pulsar: ``(ledger, entry, batch_index)``;
        embedded: the entry position); informational.
    """

    offset: int
    partition: int
    value: bytes
    key: str | None = None
    properties: Mapping[str, str] = field(default_factory=dict)
    publish_time: float = 0.0
    position: Any = None

    @property
    def size(self) -> int:
        """Bytes counted against ``max_bytes``: the payload's length."""
        return len(self.value)


@dataclass(frozen=True, slots=True)
class PullResult:
    """What one pull returned.

    :ivar messages: in offset order, each with an offset >= the requested one.
    :ivar partition: the partition pulled.
    :ivar offset: the offset the pull started at (after any auto reset).
    :ivar next_offset: where the next pull continues: last message's offset + 1, or ``offset``
        when nothing was returned. Consecutive pulls from ``next_offset`` never repeat or skip a message.
    :ivar end_offset: the partition's end offset (last + 1) as observed by this pull; never below
        ``next_offset``.
    """

    messages: list[PulledMessage]
    partition: int
    offset: int
    next_offset: int
    end_offset: int

    @property
    def lag(self) -> int:
        """Offsets left after this pull (``end_offset - next_offset``)."""
        return self.end_offset - self.next_offset

    def as_dict(self) -> dict[str, int]:
        """The offsets (not the messages), e.g. for XCom or a log line."""
        return {
            "partition": self.partition,
            "offset": self.offset,
            "count": len(self.messages),
            "next_offset": self.next_offset,
            "end_offset": self.end_offset,
        }


@dataclass(frozen=True, slots=True)
class StoredMessage:
    """One message read by its address (:meth:`OffsetLog.read_at`).

    :ivar address: the address it was read at (as :meth:`TopicPublisher.publish` returned it).
    :ivar value: the payload as published.
    :ivar properties: the message properties (empty when none).
    :ivar publish_time: seconds since the epoch, as stamped at publish time.
    """

    address: str
    value: bytes
    properties: Mapping[str, str] = field(default_factory=dict)
    publish_time: float = 0.0


def format_address(kind: str, partition: int, position: str) -> str:
    """An address as text: ``<kind>:<partition>:<position>`` (``kind`` names the back end: ``e``
    embedded, ``p`` Pulsar, so an address is never read on the other one)."""
    return f"{kind}:{partition}:{position}"


def parse_address(address: object, kind: str) -> tuple[int, str] | None:
    """``(partition, position)`` of an address of back end ``kind``; None when it is not one."""
    if not isinstance(address, str):
        return None
    parts = address.split(":", 2)
    if len(parts) != 3 or parts[0] != kind or not parts[1].isdigit() or not parts[2]:
        return None
    return int(parts[1]), parts[2]


class OffsetLog(ABC):
    """One topic on one back end, addressed by offsets. Thread-safe unless noted.

    Implementations: :mod:`.pulsar` (broker entry index over the admin API, a bounded reader pool
    keyed by next offset and a bounded offset-to-position cache) and :mod:`.embedded`. The public
    methods are template methods: they check their arguments and that the log is open (the same
    errors, with the same texts, on every back end: :mod:`.checks`), then call the back end's
    ``_``-prefixed method.

    Every method raises :class:`~airflow_provider_pulsarstate.engine.errors.UnknownTopicError` for
    a topic that does not exist, :class:`~airflow_provider_pulsarstate.engine.errors.UnknownPartitionError`
    for a partition it does not have (or one that is not a non-negative int),
    :class:`~airflow_provider_pulsarstate.engine.errors.ConfigurationError` for another bad argument,
    :class:`~airflow_provider_pulsarstate.engine.errors.ClosedError` once closed, and
    :class:`~airflow_provider_pulsarstate.engine.errors.BackendUnavailableError` when the store cannot
    be reached. Nothing here creates a topic.
    """

    topic: str
    _closed: bool = False

    def __init__(self, topic: str, options: Mapping[str, Any]) -> None:
        """Check ``topic`` and the ``options`` every back end accepts (:data:`.checks.LOG_OPTIONS`;
        any other is refused by name)."""
        check_topic(topic)
        check_log_options(topic, options)
        self.topic = topic

    def _check_open(self) -> None:
        if self._closed:
            raise log_closed(self.topic)

    def _checked_partition(self, partition: int) -> int:
        self._check_open()
        check_partition_arg(partition, self.topic)
        return partition

    def partitions(self) -> int:
        """How many partitions the topic has now (0: a non-partitioned topic). Never cached for long:
        a topic's partitions can be added while consumers run."""
        self._check_open()
        return self._partition_count()

    def beginning_offset(self, partition: int) -> int:
        """The first retained offset (the end offset when the partition is empty).

        :raises OffsetIndexUnavailableError: the broker gives no index (names the setting).
        """
        return self._beginning_offset(self._checked_partition(partition))

    def end_offset(self, partition: int) -> int:
        """The last offset + 1, exact as of the call (the beginning offset when empty)."""
        return self._end_offset(self._checked_partition(partition))

    def read(
        self, partition: int, offset: int, *, max_messages: int, max_bytes: int, timeout: float
    ) -> tuple[list[PulledMessage], int]:
        """Messages from ``offset`` (inclusive) on, and the end offset as observed.

        * the first message returned is the first with an offset >= ``offset`` (lower offsets of
          the entry or batch that holds ``offset`` are dropped);
        * at most ``max_messages``; their payloads total at most ``max_bytes``, except that a
          single message larger than ``max_bytes`` at the start is returned alone;
        * at the end of the partition: an empty list, after waiting up to ``timeout`` seconds for
          a message to arrive;
        * a continuation (``offset`` equal to where a previous read stopped) reuses that read's
          cursor when it is still pooled.

        :raises OffsetOutOfRangeError: ``offset`` is below the beginning or above the end (the
            caller applies any auto reset).
        """
        self._checked_partition(partition)
        check_offset(offset, "offset", self.topic)
        check_read_limits(self.topic, max_messages=max_messages, max_bytes=max_bytes, timeout=timeout)
        return self._read(partition, offset, max_messages=max_messages, max_bytes=max_bytes, timeout=timeout)

    def offset_for_time(self, partition: int, timestamp: float) -> int | None:
        """The first offset whose publish time is >= ``timestamp`` (seconds), or None when none is."""
        self._checked_partition(partition)
        check_timestamp(timestamp, self.topic)
        return self._offset_for_time(partition, timestamp)

    def commit(self, subscription: str, partition: int, next_offset: int) -> None:
        """Record ``next_offset`` as the subscription's committed offset of ``partition``.

        Durable before it returns. Acknowledges exactly the messages below ``next_offset``, at
        message level: never a message at or after it, even inside a batch. The subscription is
        created when missing.

        :raises OffsetOutOfRangeError: ``next_offset`` is outside [beginning, end].
        """
        check_subscription(subscription, self.topic)
        self._checked_partition(partition)
        check_offset(next_offset, "next_offset", self.topic)
        self._commit_at(subscription, partition, next_offset)

    def committed(self, subscription: str, partition: int) -> int | None:
        """The subscription's committed offset (next to consume), or None when it never committed
        and does not exist."""
        check_subscription(subscription, self.topic)
        return self._committed(subscription, self._checked_partition(partition))

    def read_at(self, address: str, *, timeout: float) -> StoredMessage:
        """The one message at ``address`` (what :meth:`TopicPublisher.publish` returned for this
        topic), without reading anything before it.

        :raises MessageNotFoundError: nothing is there (never written, topic deleted, trimmed) or it
            did not arrive within ``timeout`` seconds.
        :raises ConfigurationError: ``address`` is not an address of this back end (named).
        """
        self._check_open()
        return self._read_at(address, timeout=timeout)

    @abstractmethod
    def close(self) -> None:
        """Release readers, consumers and connections this object opened (idempotent). The
        back end passed in stays open."""

    # -- what a back end implements (arguments checked, the log open) ----------------------------
    @abstractmethod
    def _partition_count(self) -> int: ...

    @abstractmethod
    def _beginning_offset(self, partition: int) -> int: ...

    @abstractmethod
    def _end_offset(self, partition: int) -> int: ...

    @abstractmethod
    def _read(
        self, partition: int, offset: int, *, max_messages: int, max_bytes: int, timeout: float
    ) -> tuple[list[PulledMessage], int]: ...

    @abstractmethod
    def _offset_for_time(self, partition: int, timestamp: float) -> int | None: ...

    @abstractmethod
    def _commit_at(self, subscription: str, partition: int, next_offset: int) -> None: ...

    @abstractmethod
    def _committed(self, subscription: str, partition: int) -> int | None: ...

    @abstractmethod
    def _read_at(self, address: str, *, timeout: float) -> StoredMessage: ...


class TopicPublisher(ABC):
    """Publishes plain messages to any topic (the upstream system in examples and tests).

    Messages of one publisher land in send order per partition. Not for state logs: those have
    one exclusive writer. :meth:`send` and :meth:`publish` check the message (the same errors on
    every back end) before calling the back end's ``_send`` / ``_publish``.
    """

    topic: str

    def send(self, value: bytes, *, key: str | None = None, properties: Mapping[str, str] | None = None) -> None:
        """Queue one message (a partitioned topic routes by ``key``, round robin without one).

        :raises ConfigurationError: ``value`` is not bytes, ``key`` not a str, or ``properties``
            not a mapping of str to str (nothing is queued).
        :raises ClosedError: the publisher is closed.
        """
        check_message(self.topic, value, key, properties)
        self._send(value, key=key, properties=properties)

    def publish(
        self, value: bytes, *, key: str | None = None, properties: Mapping[str, str] | None = None, timeout: float
    ) -> str:
        """Publish one message and wait until it is durable; returns its address, which
        :meth:`OffsetLog.read_at` of the same topic reads back (messages queued by :meth:`send`
        before it are written too). Safe to call from several threads and several processes at once
        (no exclusive writer).

        :raises ConfigurationError: as :meth:`send` (nothing is published).
        :raises OperationTimeoutError: not acknowledged within ``timeout`` (it may still land).
        """
        check_message(self.topic, value, key, properties)
        return self._publish(value, key=key, properties=properties, timeout=timeout)

    @abstractmethod
    def _send(self, value: bytes, *, key: str | None, properties: Mapping[str, str] | None) -> None: ...

    @abstractmethod
    def _publish(
        self, value: bytes, *, key: str | None, properties: Mapping[str, str] | None, timeout: float
    ) -> str: ...

    @abstractmethod
    def flush(self, *, timeout: float) -> None:
        """Wait until every queued message is durable.

        :raises OperationTimeoutError: not all were acknowledged within ``timeout``.
        """

    @abstractmethod
    def close(self) -> None:
        """Flush (bounded by the operation timeout) and release (idempotent)."""

    def __enter__(self) -> TopicPublisher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncOffsetProbe(ABC):
    """Offsets read without blocking an event loop (for triggers): one per triggerer task.

    Pulsar: an async HTTP client on the admin API. Embedded: SQLite reads on a private thread pool
    (never asgiref's single shared thread, where one blocking call stalls every trigger).
    """

    @abstractmethod
    async def end_offsets(self, topic: str) -> dict[int, int]:
        """Each partition's end offset (partition 0 for a non-partitioned topic)."""

    @abstractmethod
    async def committed(self, topic: str, subscription: str) -> dict[int, int | None]:
        """Each partition's committed offset of ``subscription`` (None where never committed)."""

    @abstractmethod
    async def aclose(self) -> None:
        """Release connections (idempotent)."""
