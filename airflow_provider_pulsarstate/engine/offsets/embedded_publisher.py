"""Publishing to a topic of the embedded log: a queue written in one transaction per flush."""

from __future__ import annotations

import contextlib
import json
import logging
import sqlite3
import threading
import time
import zlib
from collections.abc import Iterator, Mapping

from airflow_provider_pulsarstate.engine.backends.base import partition_topic_name
from airflow_provider_pulsarstate.engine.backends.embedded import EmbeddedBackend
from airflow_provider_pulsarstate.engine.backends.embedded_files import close_quietly, rollback_quietly
from airflow_provider_pulsarstate.engine.errors import (
    BackendUnavailableError,
    OperationTimeoutError,
    PulsarStateError,
    UnknownOutcomeError,
)
from airflow_provider_pulsarstate.engine.offsets.base import TopicPublisher, format_address
from airflow_provider_pulsarstate.engine.offsets.checks import check_topic, publisher_closed
from airflow_provider_pulsarstate.engine.offsets.embedded_store import EMBEDDED_ADDRESS, partition_count

log = logging.getLogger(__name__)

# A publisher writes its queue once it holds this many messages or bytes.
_QUEUE_MESSAGES = 1000
_QUEUE_BYTES = 1 << 20
_BUSY = frozenset({"SQLITE_BUSY", "SQLITE_LOCKED"})


class EmbeddedTopicPublisher(TopicPublisher):
    """Publishes messages to a topic of the embedded log; they become durable at :meth:`flush`.

    Queued messages are written in one transaction (when the queue holds 1000 messages or 1 MiB,
    at :meth:`flush` and at :meth:`close`). On a partitioned topic a message goes to partition
    ``crc32(key) % partitions`` (so one key always lands in one partition), round robin without a
    key. Publish times are stamped in the write and never decrease along a partition.

    :raises UnknownTopicError: the topic does not exist (create it with ``create_topic``), as on
        Pulsar: a mistyped name never silently starts a new topic. With ``create=True`` a missing
        topic is created (non-partitioned) in the transaction of the first write instead.
    """

    def __init__(self, backend: EmbeddedBackend, topic: str, *, create: bool = False) -> None:
        check_topic(topic)
        self.backend = backend
        self.topic = topic
        self._queue: list[tuple[bytes, str | None, str | None]] = []
        self._queued_bytes = 0
        self._next_partition = 0
        self._lock = threading.Lock()
        self._create = create
        self._conn: sqlite3.Connection | None = backend.connect()
        try:
            if not create:
                partition_count(self._conn, backend, topic)
        except sqlite3.Error as exc:
            close_quietly(self._conn)
            raise BackendUnavailableError(f"cannot open a publisher of {backend.topic_url(topic)}: {exc}") from exc
        except BaseException:
            close_quietly(self._conn)
            raise
        self._closed = False
        self._tracked = _OnBackendClose(self)
        backend._track(self._tracked)

    def _send(self, value: bytes, *, key: str | None, properties: Mapping[str, str] | None) -> None:
        with self._enqueued(value, key, properties):
            if len(self._queue) >= _QUEUE_MESSAGES or self._queued_bytes >= _QUEUE_BYTES:
                self._write(timeout=self.backend.busy_timeout)

    @contextlib.contextmanager
    def _enqueued(self, value: bytes, key: str | None, properties: Mapping[str, str] | None) -> Iterator[None]:
        """Queue one (checked) message, then run the body under the publisher's lock."""
        encoded = json.dumps(dict(properties), sort_keys=True) if properties else None
        with self._lock:
            if self._closed:
                raise publisher_closed(self.topic)
            self._queue.append((bytes(value), key, encoded))
            self._queued_bytes += len(value)
            yield

    def flush(self, *, timeout: float) -> None:
        with self._lock:
            if self._closed:
                raise publisher_closed(self.topic)
            self._write(timeout=timeout)

    def _write(self, *, timeout: float) -> list[tuple[int, int]]:
        """Write the queue in one transaction; returns ``(partition, position)`` of each queued
        message, in queue order. On a definite failure the queue is kept (flush again)."""
        if not self._queue:
            return []
        if self._conn is None:
            self._conn = self.backend.connect()
        conn = self._conn
        try:
            conn.execute(f"PRAGMA busy_timeout = {max(1, int(timeout * 1000))}")
            conn.execute("BEGIN IMMEDIATE")
            count = self._partition_count_for_write(conn)
            partitions, next_partition = self._route(count)
            placed = self._insert(conn, count, partitions)
        except sqlite3.Error as exc:
            rollback_quietly(conn)
            raise self._write_failed(exc, timeout) from exc
        self._commit(conn)
        self._next_partition = next_partition
        self._clear_queue()
        return list(zip(partitions, placed))

    def _partition_count_for_write(self, conn: sqlite3.Connection) -> int:
        """The topic's partition count, read inside the write transaction (with ``create``, a
        missing topic is created there: one write transaction for a pushing task, not two)."""
        row = conn.execute("SELECT partitions FROM offset_topics WHERE name = ?", (self.topic,)).fetchone()
        if row is None and self._create:
            conn.execute("INSERT INTO offset_topics(name, partitions) VALUES (?, 0)", (self.topic,))
        return int(row[0]) if row else 0

    def _route(self, count: int) -> tuple[list[int], int]:
        """The partition of each queued message (by key's crc32, round robin without a key), and
        the round robin's next partition."""
        partitions: list[int] = []
        next_partition = self._next_partition
        for _value, key, _properties in self._queue:
            if count == 0:
                partition = 0
            elif key is not None:
                partition = zlib.crc32(key.encode()) % count
            else:
                partition = next_partition % count
                next_partition += 1
            partitions.append(partition)
        return partitions, next_partition

    def _insert(self, conn: sqlite3.Connection, count: int, partitions: list[int]) -> list[int]:
        """Append the queued messages to their partitions; the position of each, in queue order.
        Publish times are stamped here and never decrease along a partition."""
        routed: dict[str, list[int]] = {}  # stored topic -> indexes into the queue
        for index, partition in enumerate(partitions):
            stored = self.topic if count == 0 else partition_topic_name(self.topic, partition)
            routed.setdefault(stored, []).append(index)
        placed = [0] * len(self._queue)
        now = time.time()
        for stored, indexes in routed.items():
            last = conn.execute(
                "SELECT pos, publish_time FROM entries WHERE topic = ? ORDER BY pos DESC LIMIT 1", (stored,)
            ).fetchone()
            first = last[0] + 1 if last else 0
            stamp = max(now, last[1]) if last else now
            messages = [self._queue[i] for i in indexes]
            for i, index in enumerate(indexes):
                placed[index] = first + i
            conn.executemany(
                "INSERT INTO entries(topic, pos, payload, publish_time) VALUES (?, ?, ?, ?)",
                [(stored, first + i, m[0], stamp) for i, m in enumerate(messages)],
            )
            conn.executemany(
                "INSERT OR REPLACE INTO entry_meta(topic, pos, key, properties) VALUES (?, ?, ?, ?)",
                [(stored, first + i, m[1], m[2]) for i, m in enumerate(messages) if m[1] is not None or m[2]],
            )
        return placed

    def _write_failed(self, exc: sqlite3.Error, timeout: float) -> PulsarStateError:
        """The error of a write that failed before its commit (nothing written, the queue kept)."""
        url = self.backend.topic_url(self.topic)
        if getattr(exc, "sqlite_errorname", None) in _BUSY:  # ProgrammingError has none
            return OperationTimeoutError(
                f"publishing {len(self._queue)} message(s) to {url}: the state file stayed locked for "
                f"{timeout:.1f}s; nothing was written, they stay queued"
            )
        return BackendUnavailableError(
            f"publishing {len(self._queue)} message(s) to {url} failed, nothing was written (they stay queued): {exc}"
        )

    def _commit(self, conn: sqlite3.Connection) -> None:
        """Commit the write; a commit that fails after the transaction ended may have landed: the
        queue is dropped (UnknownOutcomeError), else it is kept (BackendUnavailableError)."""
        try:
            conn.execute("COMMIT")
        except sqlite3.Error as exc:
            url = self.backend.topic_url(self.topic)
            if conn.in_transaction:
                rollback_quietly(conn)
                raise BackendUnavailableError(
                    f"publishing {len(self._queue)} message(s) to {url} failed, nothing was written "
                    f"(they stay queued): {exc}"
                ) from exc
            count_lost = len(self._queue)
            self._clear_queue()
            raise UnknownOutcomeError(
                f"committing {count_lost} message(s) to {url} failed ({exc}); they may or may not have been published"
            ) from exc

    def _clear_queue(self) -> None:
        self._queue.clear()
        self._queued_bytes = 0

    def _publish(self, value: bytes, *, key: str | None, properties: Mapping[str, str] | None, timeout: float) -> str:
        with self._enqueued(value, key, properties):
            try:
                placed = self._write(timeout=timeout)
            except BaseException:
                self._drop_last_if_queued()
                raise
        partition, position = placed[-1]  # appended last, so written last
        return format_address(EMBEDDED_ADDRESS, partition, str(position))

    def _drop_last_if_queued(self) -> None:
        """A failed publish leaves nothing queued for a later flush: the caller was told it failed."""
        if self._queue:
            value = self._queue.pop()[0]
            self._queued_bytes -= len(value)

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            try:
                self._write(timeout=self.backend.busy_timeout)
            finally:
                self._closed = True
                if self._conn is not None:
                    close_quietly(self._conn)
                    self._conn = None
                self.backend._untrack(self._tracked)


class _OnBackendClose:
    """Closes a publisher when its back end closes; a failing last flush is logged, not raised
    (the back end must close everything else too)."""

    def __init__(self, publisher: EmbeddedTopicPublisher) -> None:
        self.publisher = publisher

    def close(self) -> None:
        queued = len(self.publisher._queue)
        try:
            self.publisher.close()
        except PulsarStateError as exc:
            log.error(
                "closing the back end: %d queued message(s) to %s were not published: %s",
                queued,
                self.publisher.topic,
                exc,
            )
