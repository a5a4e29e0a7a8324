"""The contract both back ends implement: an exclusive fenced writer, readers, and the tail.

The contract is deliberately small and byte-oriented. Framing, offsets, epoch markers, zombie
filtering and atomic multi-part records live one level up (:mod:`airflow_provider_pulsarstate.engine.wal`)
and are shared by both back ends, so they behave the same by construction.

Guarantees every back end gives:

* at most one writer per topic holds an epoch at a time; epochs only grow;
* a writer whose epoch was superseded can never append again (its append raises
  :class:`~airflow_provider_pulsarstate.engine.errors.WriterFencedError`);
* :meth:`RawWriter.append` is all-or-nothing per call from the caller's point of view only when
  the back end is transactional (embedded); on Pulsar, frames of one call may land partially,
  which the framing layer makes harmless;
* readers see entries in append order, from the start or from a remembered position;
* the last entry of a topic can be read without reading the others (:meth:`Backend.read_last`),
  and positions survive a round trip through bytes (so they can be stored in a checkpoint);
* the writer lock is released when the holding process dies;
* a holder can tell cheaply whether another acquirer waits for its writer
  (:meth:`RawWriter.has_waiters`), and a waiter gets the writer promptly once it is released;
* the back end can tell the topic's current epoch (:meth:`Backend.current_epoch`);
* every failure surfaces as one of our errors (never a driver's own exception type), and a
  writer or reader that is closed is forgotten by its back end (no list grows with their number).
"""

from __future__ import annotations

import enum
import re
import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from airflow_provider_pulsarstate.engine.errors import ConfigurationError

if TYPE_CHECKING:
    from airflow_provider_pulsarstate.engine.config import ConnectionConfig
    from airflow_provider_pulsarstate.engine.leadership import AsyncLeadershipProbe, Leadership
    from airflow_provider_pulsarstate.engine.offsets.base import AsyncOffsetProbe, OffsetLog, TopicPublisher
    from airflow_provider_pulsarstate.engine.topic_stream import TopicMessage


class AcquireMode(str, enum.Enum):
    """How to get the exclusive writer of a topic."""

    FAIL_FAST = "fail_fast"
    """Fail with WriterBusyError at once when another writer holds it."""
    WAIT = "wait"
    """Wait, bounded by the caller's timeout, until it is free."""
    FENCE = "fence"
    """Take it over: the current holder is fenced and can never append again."""


EARLIEST = "earliest"
"""Start position: the first entry of the topic."""


def partition_topic_name(topic: str, partition: int) -> str:
    """The topic that stores partition ``partition`` of a partitioned ``topic`` (Pulsar's naming,
    which the embedded log follows)."""
    return f"{topic}-partition-{partition}"


def default_writer_name() -> str:
    """A unique writer name, for writers not given one (``pulsarstate-`` and 12 hex digits)."""
    return f"pulsarstate-{uuid.uuid4().hex[:12]}"


ATTEMPT_SEPARATOR = "~"
_ATTEMPT_SUFFIX = re.compile(r"~[0-9a-f]{8}\Z")


def attempt_writer_name(name: str | None) -> str | None:
    """``name`` with a suffix unique to this attempt (``name~`` and 8 hex digits); None stays None
    (the back end generates a unique name). Two writers, or two attempts of one, never share a
    producer name, so a sweep that drops an orphan by name cannot drop a live writer."""
    return None if name is None else f"{name}{ATTEMPT_SEPARATOR}{uuid.uuid4().hex[:8]}"


def writer_base_name(producer_name: str | None) -> str | None:
    """The name a writer was given, without the suffix :func:`attempt_writer_name` added."""
    return None if producer_name is None else _ATTEMPT_SUFFIX.sub("", producer_name)


def is_earliest(start: Any) -> bool:
    """Whether a start position is :data:`EARLIEST` (positions may refuse ``==`` with a str)."""
    return isinstance(start, str) and start == EARLIEST


@dataclass(frozen=True, slots=True)
class RawEntry:
    """An entry as stored: its back-end position, bytes and publish time (seconds)."""

    position: Any
    payload: bytes
    publish_time: float


class RawWriter(ABC):
    """The exclusive writer of one topic, holding one epoch."""

    topic: str
    epoch: int

    @abstractmethod
    def append(self, payloads: Sequence[bytes], *, timeout: float) -> list[Any]:
        """Append entries in order and wait until all are durable; returns their positions.

        :raises WriterFencedError: a newer epoch exists; this writer is dead for good (nothing of
            this call can complete a record: entries after the fencing never land).
        :raises BackendUnavailableError: the store failed before anything was written.
        :raises UnknownOutcomeError: some entries may or may not have landed.
        """

    def append_async(self, payloads: Sequence[bytes], *, timeout: float) -> Callable[[], list[Any]]:
        """Start appending entries; the returned function waits as :meth:`append` does and returns its positions.

        Entries of successive calls land in call order (a later call's entries never before an
        earlier call's). Nothing is durable until the returned function returned; call it exactly
        once. The errors of :meth:`append` may come from either call. The default appends at once.
        """
        positions = self.append(payloads, timeout=timeout)
        return lambda: positions

    def has_waiters(self) -> bool:
        """Whether another acquirer (WAIT or FENCE mode, any process) waits for this writer now.

        Cheap enough to ask every few tens of milliseconds while the writer is idle: a back end
        whose check costs more may answer from its last check. False when it cannot tell (the
        default, and a closed writer): the holder then keeps the writer, which is always safe.
        Never raises.
        """
        return False

    @abstractmethod
    def close(self) -> None:
        """Release the writer (idempotent)."""


class RawReader(ABC):
    """A cursor over one topic. Not thread-safe: one thread at a time."""

    topic: str

    @abstractmethod
    def read_next(self, *, timeout: float) -> RawEntry | None:
        """The next entry, or None when none arrives within ``timeout`` seconds."""

    @abstractmethod
    def has_next(self) -> bool:
        """Whether entries exist past this cursor, checked against the tail *now*."""

    @abstractmethod
    def close(self) -> None:
        """Release the cursor (idempotent)."""


class Backend(ABC):
    """A connection to one store of topics."""

    @abstractmethod
    def acquire_writer(self, topic: str, *, mode: AcquireMode, timeout: float, name: str | None = None) -> RawWriter:
        """Get the exclusive writer of ``topic`` with a new, higher epoch.

        ``name`` names the writer where leadership is observed (Pulsar: the exclusive producer's
        ``producer_name``, which must be unique on the broker; embedded: recorded with the epoch).
        None: a unique ``pulsarstate-<hex>`` name (:func:`default_writer_name`).

        :raises WriterBusyError: FAIL_FAST and another writer holds it.
        :raises OperationTimeoutError: WAIT and it did not come free within ``timeout``.
        :raises BackendUnavailableError: the store cannot be reached.
        """

    @abstractmethod
    def current_epoch(self, topic: str) -> int:
        """The highest epoch the back end ever granted an exclusive writer of ``topic`` (-1 or 0: none).

        Readers check frame epochs against it: a frame claiming a higher epoch was not written by
        a writer of this topic and must not be obeyed.

        :raises BackendUnavailableError: the store cannot be reached.
        """

    @abstractmethod
    def open_shared_writer(self, topic: str, *, compress: bool = False, batching: bool = True) -> RawWriter:
        """A non-exclusive appender (many at once, from many processes; ``epoch`` is -1).

        For staging and checkpoint topics, whose entries are not ordered by a single writer.
        Never use it on a topic that has an exclusive writer.

        :param compress: the payloads are large and compressible; the back end may compress
            them in transit and at rest (readers see the same bytes).
        :param batching: the back end may hold payloads back briefly to send several together
            (many small payloads per append); False sends each at once (one large payload per
            append, where waiting for company only adds latency).
        """

    @abstractmethod
    def delete_topic(self, topic: str) -> None:
        """Delete the topic and its entries (a missing topic is fine)."""

    @abstractmethod
    def list_topics(self, prefix: str) -> list[str]:
        """The full names of the existing topics whose name starts with ``prefix`` (a full
        ``persistent://tenant/namespace/...`` prefix), sorted; asking creates nothing."""

    @abstractmethod
    def create_reader(self, topic: str, *, start: Any = EARLIEST) -> RawReader:
        """A cursor positioned before ``start`` (EARLIEST or a position from a RawEntry, exclusive)."""

    @abstractmethod
    def read_last(self, topic: str, *, timeout: float) -> RawEntry | None:
        """The topic's last entry as of now, or None when the topic is empty or missing."""

    @abstractmethod
    def read_at(self, topic: str, position: Any, *, timeout: float) -> RawEntry | None:
        """The entry stored exactly at ``position``, or None when the topic has no entry there.

        Used to check a position read from elsewhere (a checkpoint manifest) against the log.
        """

    def ensure_durable(self, topic: str) -> None:
        """Make sure the store keeps every entry of ``topic`` and never deletes it while unused.

        Called at the first use of a state log (bootstrap, writer acquisition); cheap after the
        first call per topic. The embedded back end keeps everything and deletes nothing by
        itself: it needs nothing and this default does nothing. On Pulsar, the applied retention
        must be infinite (-1/-1) and inactive-topic deletion off; they are set at topic level
        when not.

        :raises RetentionPolicyError: the policies would lose the log and could not be changed
            (the message names the setting and the command that fixes it).
        """

    def underlying(self) -> Backend:
        """The back end that stores the topics: itself, or what a wrapper (fault injection,
        access control in tests) forwards to. Features outside this contract (offsets) use it."""
        return self

    # -- what callers ask of a back end instead of testing its type ---------------------------
    # Each one is answered by the back end that stores the topics: a wrapper (see :meth:`underlying`)
    # forwards it there.
    @classmethod
    def from_config(cls, config: ConnectionConfig) -> Backend:
        """This back end for ``config`` (no I/O here)."""
        raise NotImplementedError(f"{cls.__name__} is not opened from a connection config")

    @classmethod
    def check_reachable(cls, config: ConnectionConfig) -> tuple[bool, str]:
        """One cheap round trip to the store ``config`` names that creates and changes nothing
        (the connection form's Test button): ``(True, what was reached)`` or ``(False, what failed,
        naming the field)``; never raises."""
        return False, f"{cls.__name__} offers no reachability check"

    @classmethod
    def open_async_offset_probe(cls, config: ConnectionConfig, *, freshness: float = 0.0) -> AsyncOffsetProbe:
        """An offset probe for the store ``config`` names, for event loops (no I/O until first use)."""
        raise ConfigurationError(f"{cls.__name__} offers no async offset probe")

    @classmethod
    def open_async_leadership_probe(cls, config: ConnectionConfig, *, freshness: float = 0.0) -> AsyncLeadershipProbe:
        """A leadership probe for the store ``config`` names, for event loops (no I/O until first use)."""
        raise ConfigurationError(f"{cls.__name__} offers no async leadership probe")

    @classmethod
    def open_http_messages(cls, config: ConnectionConfig) -> Any | None:
        """This store's HTTP path to small topic messages, or None when it has none (no I/O here)."""
        return None

    def _answering(self, what: str) -> Backend:
        store = self.underlying()
        if store is self:
            raise ConfigurationError(f"{type(self).__name__} offers no {what}")
        return store

    def open_offset_log(self, topic: str, **options: Any) -> OffsetLog:
        """The :class:`~airflow_provider_pulsarstate.engine.offsets.base.OffsetLog` of ``topic``
        (no I/O until first use); ``options`` as :func:`~airflow_provider_pulsarstate.engine.offsets.open_offset_log`."""
        return self._answering("offset log").open_offset_log(topic, **options)

    def open_publisher(
        self, topic: str, *, batching: bool = True, chunking: bool = False, create: bool = False
    ) -> TopicPublisher:
        """A publisher of plain messages to ``topic``; options as
        :func:`~airflow_provider_pulsarstate.engine.offsets.open_publisher`."""
        return self._answering("publisher").open_publisher(topic, batching=batching, chunking=chunking, create=create)

    def create_topic(self, topic: str, *, partitions: int = 0) -> None:
        """Create ``topic`` (``partitions`` > 0: partitioned); an identical existing one is fine.

        :raises ConfigurationError: it exists with another partition count.
        """
        self._answering("topic creation").create_topic(topic, partitions=partitions)

    def delete_topic_if_last(self, topic: str, last: bytes | None, *, timeout: float) -> bool:
        """Delete non-partitioned ``topic`` only if its last entry is still at ``last`` (encoded;
        None: empty); returns whether it was deleted. See
        :func:`~airflow_provider_pulsarstate.engine.offsets.delete_topic_if_unchanged`."""
        return self._answering("compare-and-delete").delete_topic_if_last(topic, last, timeout=timeout)

    def read_leadership(self, topic: str) -> list[Leadership]:
        """Who holds ``topic``'s exclusive writer now, per partition; see
        :func:`~airflow_provider_pulsarstate.engine.leadership.read_leadership`."""
        return self._answering("leadership").read_leadership(topic)

    def read_topic_message(self, topic: str, message_id: bytes, *, timeout: float) -> TopicMessage:
        """The message ``message_id`` of ``topic`` (a store that keeps message ids: Pulsar).

        :raises MessageUnavailableError: it is gone, or did not come within ``timeout`` seconds.
        :raises ConfigurationError: this store keeps no message ids.
        """
        return self._answering("topic messages by id").read_topic_message(topic, message_id, timeout=timeout)

    @abstractmethod
    def encode_position(self, position: Any) -> bytes:
        """A position from a RawEntry (or an append) as bytes, for storing elsewhere."""

    @abstractmethod
    def decode_position(self, data: bytes) -> Any:
        """Inverse of :meth:`encode_position`; raises ValueError on bytes it did not produce."""

    @abstractmethod
    def topic_url(self, topic: str) -> str:
        """A human-readable address of the topic (for messages and logs)."""

    @abstractmethod
    def close(self) -> None:
        """Close every writer, reader and connection (idempotent)."""

    def __enter__(self) -> Backend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
