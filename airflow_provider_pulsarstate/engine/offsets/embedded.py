"""Offset consumption on the embedded back end: an offset is the entry's position in its topic.

Positions are dense from 0 (the appenders number entries ``MAX(pos) + 1`` inside an IMMEDIATE
transaction), so offsets never skip. The tables (declared with the rest of the schema in
:mod:`~airflow_provider_pulsarstate.engine.backends.embedded`, created when missing so older
state files keep working):

* ``entries``: the messages, shared with state logs (any topic can be consumed by offset);
* ``entry_meta``: a message's key and properties (only for messages that have them);
* ``offset_topics``: topics created by :func:`create_embedded_topic` and their partition count.
  Partition ``K`` of a partitioned topic ``T`` is stored as topic ``T-partition-K``, as Pulsar names it;
* ``topic_trims``: the first retained offset after :func:`trim_embedded_topic`;
* ``subscriptions``: each subscription's committed offset (the next to consume) per partition.

A topic exists when it was created, or when it has (or had) entries. Every ``sqlite3`` or OS
error becomes one of our errors, as everywhere in the embedded back end.
"""

from __future__ import annotations

import contextlib
import json
import logging
import sqlite3
import threading
import time
import zlib
from collections.abc import Callable, Iterator, Mapping
from typing import Any, TypeVar

from airflow_provider_pulsarstate.engine.backends.base import partition_topic_name
from airflow_provider_pulsarstate.engine.backends.embedded import (
    _TOPIC_ROWS,
    EmbeddedBackend,
    _close_quietly,
    _rollback_quietly,
)
from airflow_provider_pulsarstate.engine.config import ConnectionConfig
from airflow_provider_pulsarstate.engine.errors import (
    BackendUnavailableError,
    ClosedError,
    ConfigurationError,
    CorruptEntryError,
    MessageNotFoundError,
    OperationTimeoutError,
    PulsarStateError,
    UnknownOutcomeError,
    UnknownPartitionError,
    UnknownTopicError,
)
from airflow_provider_pulsarstate.engine.offsets.base import (
    AsyncOffsetProbe,
    OffsetLog,
    PulledMessage,
    StoredMessage,
    TopicPublisher,
    format_address,
    parse_address,
)
from airflow_provider_pulsarstate.engine.offsets.checks import (
    check_log_options,
    check_offset,
    check_partition_count,
    check_topic,
    not_an_address,
    out_of_range,
    partition_error,
    publisher_closed,
    topic_exists_differently,
    unknown_topic,
)
from airflow_provider_pulsarstate.engine.retry import Backoff
from airflow_provider_pulsarstate.engine.worker_thread import WorkerThread

T = TypeVar("T")
log = logging.getLogger(__name__)

# A publisher writes its queue once it holds this many messages or bytes.
_QUEUE_MESSAGES = 1000
_QUEUE_BYTES = 1 << 20
_BUSY = frozenset({"SQLITE_BUSY", "SQLITE_LOCKED"})
EMBEDDED_ADDRESS = "e"
"""Addresses of the embedded log: ``e:<partition>:<position>`` (the position is the offset)."""


class _Store:
    """One connection to the state file and the queries offsets need (thread-safe: one lock)."""

    def __init__(self, backend: EmbeddedBackend) -> None:
        self.backend = backend
        self._conn: sqlite3.Connection | None = None
        self._lock = threading.Lock()
        self._closed = False

    @contextlib.contextmanager
    def transaction(self, what: str, *, write: bool = False) -> Iterator[sqlite3.Connection]:
        """A transaction (a consistent snapshot when reading); sqlite errors become ours."""
        with self._lock:
            if self._closed:
                raise ClosedError(f"offset log of {self.backend.path} is closed")
            if self._conn is None:
                self._conn = self.backend.connect()
            conn = self._conn
            try:
                conn.execute("BEGIN IMMEDIATE" if write else "BEGIN")
                yield conn
            except (sqlite3.Error, OSError) as exc:
                _rollback_quietly(conn)
                raise BackendUnavailableError(
                    f"{what} failed on embedded state file {self.backend.path}: {exc}"
                ) from exc
            except BaseException:
                _rollback_quietly(conn)
                raise
            try:
                conn.execute("COMMIT")
            except sqlite3.Error as exc:
                if conn.in_transaction or not write:
                    _rollback_quietly(conn)
                    raise BackendUnavailableError(
                        f"{what} failed on embedded state file {self.backend.path}, nothing was written: {exc}"
                    ) from exc
                raise UnknownOutcomeError(f"{what}: the commit failed ({exc}); it may or may not be recorded") from exc

    def close(self) -> None:
        with self._lock:
            self._closed = True
            if self._conn is not None:
                conn, self._conn = self._conn, None
                _close_quietly(conn)


# -- queries (inside a transaction) -------------------------------------------------------------
def _partition_count(conn: sqlite3.Connection, backend: EmbeddedBackend, topic: str) -> int:
    row = conn.execute("SELECT partitions FROM offset_topics WHERE name = ?", (topic,)).fetchone()
    if row is not None:
        return int(row[0])
    if _has_rows(conn, topic):
        return 0
    raise unknown_topic(backend.topic_url(topic))


def _has_rows(conn: sqlite3.Connection, stored: str) -> bool:
    return (
        conn.execute("SELECT 1 FROM entries WHERE topic = ? LIMIT 1", (stored,)).fetchone() is not None
        or conn.execute("SELECT 1 FROM topic_trims WHERE topic = ?", (stored,)).fetchone() is not None
    )


def _stored_topic(conn: sqlite3.Connection, backend: EmbeddedBackend, topic: str, partition: int) -> str:
    """The topic partition ``partition`` is stored under; UnknownTopic/PartitionError when absent."""
    count = _partition_count(conn, backend, topic)
    error = partition_error(topic, count, partition)
    if error is not None:
        raise error
    return topic if count == 0 else partition_topic_name(topic, partition)


def _offset_range(conn: sqlite3.Connection, stored: str) -> tuple[int, int]:
    """``(beginning, end)`` of a stored topic. A trim keeps the last entry (it numbers the next
    append), so ``topic_trims`` is what says where the retained range begins."""
    last = conn.execute("SELECT MAX(pos) FROM entries WHERE topic = ?", (stored,)).fetchone()[0]
    first = conn.execute("SELECT MIN(pos) FROM entries WHERE topic = ?", (stored,)).fetchone()[0]
    trim = conn.execute("SELECT beginning FROM topic_trims WHERE topic = ?", (stored,)).fetchone()
    trimmed = int(trim[0]) if trim else 0
    end = int(last) + 1 if last is not None else trimmed
    beginning = max(int(first) if first is not None else end, trimmed)
    return min(beginning, end), end


def _properties(raw: str | None, topic: str, pos: int) -> dict[str, str]:
    if raw is None:
        return {}
    try:
        value = json.loads(raw)
    except ValueError as exc:
        raise CorruptEntryError(topic=topic, position=pos, cause=f"message properties are not JSON: {exc}") from exc
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise CorruptEntryError(topic=topic, position=pos, cause="message properties are not a str -> str mapping")
    return value


class EmbeddedOffsetLog(OffsetLog):
    """One topic of the embedded log, addressed by offsets (= entry positions). Thread-safe.

    Reads go straight to the entry at an offset (no reader pool or position cache is needed:
    ``reader_pool_size``, ``reader_idle_timeout`` and ``position_cache_size`` are accepted and
    unused). Every call reads one consistent snapshot of the file. Commits are durable on return.
    """

    def __init__(self, backend: EmbeddedBackend, topic: str, **options: Any) -> None:
        check_topic(topic)
        check_log_options(topic, options)
        self.backend = backend
        self.topic = topic
        self._store = _Store(backend)
        backend._track(self)

    def _partition_count(self) -> int:
        with self._store.transaction(f"reading the partitions of {self.topic}") as conn:
            return _partition_count(conn, self.backend, self.topic)

    def _range(self, partition: int) -> tuple[int, int]:
        with self._store.transaction(f"reading the offsets of {self.topic} partition {partition}") as conn:
            return _offset_range(conn, _stored_topic(conn, self.backend, self.topic, partition))

    def _beginning_offset(self, partition: int) -> int:
        return self._range(partition)[0]

    def _end_offset(self, partition: int) -> int:
        return self._range(partition)[1]

    def _read(
        self, partition: int, offset: int, *, max_messages: int, max_bytes: int, timeout: float
    ) -> tuple[list[PulledMessage], int]:
        deadline = time.monotonic() + timeout
        backoff: Backoff | None = None
        while True:
            messages, end = self._read_once(partition, offset, max_messages=max_messages, max_bytes=max_bytes)
            if messages or time.monotonic() >= deadline:
                return messages, end
            backoff = backoff or Backoff(initial=0.001, maximum=self.backend.poll_interval)
            backoff.sleep(deadline)

    def _read_once(
        self, partition: int, offset: int, *, max_messages: int, max_bytes: int
    ) -> tuple[list[PulledMessage], int]:
        messages: list[PulledMessage] = []
        with self._store.transaction(f"reading {self.topic} partition {partition} from offset {offset}") as conn:
            stored = _stored_topic(conn, self.backend, self.topic, partition)
            beginning, end = _offset_range(conn, stored)
            if not beginning <= offset <= end:
                raise out_of_range(self.topic, partition, offset, beginning, end)
            rows = conn.execute(
                "SELECT e.pos, e.payload, e.publish_time, m.key, m.properties FROM entries e "
                "LEFT JOIN entry_meta m ON m.topic = e.topic AND m.pos = e.pos "
                "WHERE e.topic = ? AND e.pos >= ? ORDER BY e.pos LIMIT ?",
                (stored, offset, max_messages),
            )
            total = 0
            for pos, payload, publish_time, key, properties in rows:
                size = len(payload)
                if messages and total + size > max_bytes:
                    break
                messages.append(
                    PulledMessage(
                        offset=pos,
                        partition=partition,
                        value=bytes(payload),
                        key=key,
                        properties=_properties(properties, stored, pos),
                        publish_time=publish_time,
                        position=pos,
                    )
                )
                total += size
        return messages, end

    def _offset_for_time(self, partition: int, timestamp: float) -> int | None:
        with self._store.transaction(f"searching {self.topic} partition {partition} by time") as conn:
            stored = _stored_topic(conn, self.backend, self.topic, partition)
            beginning, end = _offset_range(conn, stored)

            def published(pos: int) -> float:
                return conn.execute(
                    "SELECT publish_time FROM entries WHERE topic = ? AND pos = ?", (stored, pos)
                ).fetchone()[0]

            if beginning == end or published(end - 1) < timestamp:
                return None
            # Publish times never decrease along positions (stamped inside the append transaction).
            low, high = beginning, end - 1
            while low < high:
                middle = (low + high) // 2
                if published(middle) >= timestamp:
                    high = middle
                else:
                    low = middle + 1
            return low

    def _read_at(self, address: str, *, timeout: float) -> StoredMessage:
        parsed = parse_address(address, EMBEDDED_ADDRESS)
        if parsed is None or not parsed[1].isdigit():
            raise not_an_address(address, "the embedded log", "e:<partition>:<position>")
        partition, position = parsed[0], int(parsed[1])
        with self._store.transaction(f"reading message {address} of {self.topic}") as conn:
            try:
                stored = _stored_topic(conn, self.backend, self.topic, partition)
            except (UnknownTopicError, UnknownPartitionError) as exc:
                raise MessageNotFoundError(
                    f"no message at {address} of {self.backend.topic_url(self.topic)}: {exc}",
                    topic=self.topic,
                    address=address,
                ) from exc
            row = conn.execute(
                "SELECT e.payload, e.publish_time, m.properties FROM entries e "
                "LEFT JOIN entry_meta m ON m.topic = e.topic AND m.pos = e.pos WHERE e.topic = ? AND e.pos = ?",
                (stored, position),
            ).fetchone()
        if row is None:
            raise MessageNotFoundError(
                f"no message at {address} of {self.backend.topic_url(self.topic)} (never written there, or trimmed)",
                topic=self.topic,
                address=address,
            )
        return StoredMessage(address, bytes(row[0]), _properties(row[2], stored, position), float(row[1]))

    def _commit_at(self, subscription: str, partition: int, next_offset: int) -> None:
        with self._store.transaction(
            f"committing offset {next_offset} of {self.topic} partition {partition} for subscription {subscription!r}",
            write=True,
        ) as conn:
            stored = _stored_topic(conn, self.backend, self.topic, partition)
            beginning, end = _offset_range(conn, stored)
            if not beginning <= next_offset <= end:
                raise out_of_range(self.topic, partition, next_offset, beginning, end, commit=True)
            conn.execute(
                "INSERT INTO subscriptions(topic, subscription, committed) VALUES (?, ?, ?) "
                "ON CONFLICT(topic, subscription) DO UPDATE SET committed = excluded.committed",
                (stored, subscription, next_offset),
            )

    def _committed(self, subscription: str, partition: int) -> int | None:
        with self._store.transaction(f"reading the committed offset of {subscription!r} on {self.topic}") as conn:
            stored = _stored_topic(conn, self.backend, self.topic, partition)
            row = conn.execute(
                "SELECT committed FROM subscriptions WHERE topic = ? AND subscription = ?", (stored, subscription)
            ).fetchone()
        return None if row is None else int(row[0])

    def close(self) -> None:
        self._closed = True
        self._store.close()
        self.backend._untrack(self)


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
                _partition_count(self._conn, backend, topic)
        except sqlite3.Error as exc:
            _close_quietly(self._conn)
            raise BackendUnavailableError(f"cannot open a publisher of {backend.topic_url(topic)}: {exc}") from exc
        except BaseException:
            _close_quietly(self._conn)
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
        url = self.backend.topic_url(self.topic)
        if self._conn is None:
            self._conn = self.backend.connect()
        conn = self._conn
        try:
            conn.execute(f"PRAGMA busy_timeout = {max(1, int(timeout * 1000))}")
            conn.execute("BEGIN IMMEDIATE")
            row = conn.execute("SELECT partitions FROM offset_topics WHERE name = ?", (self.topic,)).fetchone()
            if row is None and self._create:  # one write transaction for a pushing task, not two
                conn.execute("INSERT INTO offset_topics(name, partitions) VALUES (?, 0)", (self.topic,))
            count = int(row[0]) if row else 0
            routed: dict[str, list[int]] = {}  # stored topic -> indexes into the queue
            partitions: list[int] = []
            next_partition = self._next_partition
            for index, message in enumerate(self._queue):
                if count == 0:
                    partition = 0
                elif message[1] is not None:
                    partition = zlib.crc32(message[1].encode()) % count
                else:
                    partition = next_partition % count
                    next_partition += 1
                stored = self.topic if count == 0 else partition_topic_name(self.topic, partition)
                routed.setdefault(stored, []).append(index)
                partitions.append(partition)
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
        except sqlite3.Error as exc:
            _rollback_quietly(conn)
            if getattr(exc, "sqlite_errorname", None) in _BUSY:  # ProgrammingError has none
                raise OperationTimeoutError(
                    f"publishing {len(self._queue)} message(s) to {url}: the state file stayed locked for "
                    f"{timeout:.1f}s; nothing was written, they stay queued"
                ) from exc
            raise BackendUnavailableError(
                f"publishing {len(self._queue)} message(s) to {url} failed, nothing was written "
                f"(they stay queued): {exc}"
            ) from exc
        try:
            conn.execute("COMMIT")
        except sqlite3.Error as exc:
            if conn.in_transaction:
                _rollback_quietly(conn)
                raise BackendUnavailableError(
                    f"publishing {len(self._queue)} message(s) to {url} failed, nothing was written "
                    f"(they stay queued): {exc}"
                ) from exc
            count_lost = len(self._queue)
            self._queue.clear()
            self._queued_bytes = 0
            raise UnknownOutcomeError(
                f"committing {count_lost} message(s) to {url} failed ({exc}); they may or may not have been published"
            ) from exc
        self._next_partition = next_partition
        self._queue.clear()
        self._queued_bytes = 0
        return list(zip(partitions, placed))

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
                    _close_quietly(self._conn)
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


def delete_embedded_topic_if_last(backend: EmbeddedBackend, topic: str, last: bytes | None) -> bool:
    """Delete a non-partitioned topic only if its last entry is still ``last`` (None: empty), in
    one transaction: no append can land between the check and the deletion. Returns whether deleted."""
    conn = backend.connect()
    try:
        conn.execute("BEGIN IMMEDIATE")
        row = conn.execute("SELECT MAX(pos) FROM entries WHERE topic = ?", (topic,)).fetchone()
        now = None if row is None or row[0] is None else backend.encode_position(int(row[0]))
        if now != last:
            conn.execute("ROLLBACK")
            return False
        for table, column in _TOPIC_ROWS:
            conn.execute(f"DELETE FROM {table} WHERE {column} = ?", (topic,))
        conn.execute("COMMIT")
        return True
    except sqlite3.Error as exc:
        _rollback_quietly(conn)
        raise BackendUnavailableError(f"cannot delete {backend.topic_url(topic)}: {exc}") from exc
    finally:
        _close_quietly(conn)


def create_embedded_topic(backend: EmbeddedBackend, topic: str, *, partitions: int) -> None:
    """Create ``topic`` on the embedded log (``partitions`` > 0: a partitioned topic whose
    partition ``K`` is stored as ``<topic>-partition-K``). An identical existing topic is fine.

    :raises ConfigurationError: ``partitions`` is negative, or the topic exists with another count
        (a topic that has entries but was never created is non-partitioned).
    """
    check_topic(topic)
    check_partition_count(partitions, topic)
    store = _Store(backend)
    try:
        with store.transaction(f"creating topic {topic}", write=True) as conn:
            row = conn.execute("SELECT partitions FROM offset_topics WHERE name = ?", (topic,)).fetchone()
            existing = int(row[0]) if row else (0 if _has_rows(conn, topic) else None)
            if existing is not None and existing != partitions:
                raise topic_exists_differently(topic, existing, partitions)
            if row is None:
                conn.execute("INSERT INTO offset_topics(name, partitions) VALUES (?, ?)", (topic, partitions))
    finally:
        store.close()


def trim_embedded_topic(backend: EmbeddedBackend, topic: str, before_offset: int, *, partition: int = 0) -> int:
    """Drop the messages of ``topic``'s ``partition`` below ``before_offset`` (retention on the
    embedded log). Returns the new first retained offset: ``before_offset`` capped at the end, never
    below the current beginning. Committed offsets are kept: a subscription that had not reached
    the new beginning then gets :class:`OffsetOutOfRangeError` (or its consumer's auto reset).

    :raises UnknownTopicError, UnknownPartitionError: no such topic or partition.
    """
    check_offset(before_offset, "before_offset", topic)
    store = _Store(backend)
    try:
        what = f"trimming {topic} partition {partition} below offset {before_offset}"
        with store.transaction(what, write=True) as conn:
            stored = _stored_topic(conn, backend, topic, partition)
            beginning, end = _offset_range(conn, stored)
            new_beginning = max(beginning, min(before_offset, end))
            # The last entry stays (trimmed or not): the next append numbers itself after it.
            drop_below = min(new_beginning, end - 1)
            conn.execute("DELETE FROM entries WHERE topic = ? AND pos < ?", (stored, drop_below))
            conn.execute("DELETE FROM entry_meta WHERE topic = ? AND pos < ?", (stored, drop_below))
            conn.execute(
                "INSERT INTO topic_trims(topic, beginning) VALUES (?, ?) "
                "ON CONFLICT(topic) DO UPDATE SET beginning = excluded.beginning",
                (stored, new_beginning),
            )
    finally:
        store.close()
    return new_beginning


class EmbeddedAsyncOffsetProbe(AsyncOffsetProbe):
    """Offsets of the embedded log read without blocking the event loop.

    Every read runs on the process-wide pool of :mod:`~airflow_provider_pulsarstate.engine.worker_thread`
    (never asgiref's shared thread, where a read waiting on a locked file would stall every trigger
    of the process), through one connection per file shared by the probes of the process. Waiting on a locked file is bounded by the connection's ``operation_timeout``;
    a caller may cancel its await sooner (``asyncio.wait_for``), and :meth:`aclose` returns at once.
    """

    def __init__(self, config: ConnectionConfig) -> None:
        if config.kind != "embedded":
            raise ConfigurationError(f"EmbeddedAsyncOffsetProbe needs an embedded connection, got {config.url!r}")
        self._worker: WorkerThread[_Store] = WorkerThread(
            lambda: _Store(EmbeddedBackend(config.embedded_path, busy_timeout=config.operation_timeout)),
            _close_store,
            name="pulsarstate-offset-probe",
            what="this offset probe",
            share_key=("embedded-offset-probe", config),  # one locked connection per file, thread-safe
        )

    async def _run(self, fn: Callable[[_Store], T]) -> T:
        return await self._worker.run(fn)

    async def end_offsets(self, topic: str) -> dict[int, int]:
        def read(store: _Store) -> dict[int, int]:
            with store.transaction(f"reading the end offsets of {topic}") as conn:
                count = _partition_count(conn, store.backend, topic)
                return {
                    p: _offset_range(conn, _stored_topic(conn, store.backend, topic, p))[1]
                    for p in range(max(count, 1))
                }

        return await self._run(read)

    async def committed(self, topic: str, subscription: str) -> dict[int, int | None]:
        def read(store: _Store) -> dict[int, int | None]:
            with store.transaction(f"reading the committed offsets of {subscription!r} on {topic}") as conn:
                count = _partition_count(conn, store.backend, topic)
                committed: dict[int, int | None] = {}
                for p in range(max(count, 1)):
                    row = conn.execute(
                        "SELECT committed FROM subscriptions WHERE topic = ? AND subscription = ?",
                        (_stored_topic(conn, store.backend, topic, p), subscription),
                    ).fetchone()
                    committed[p] = None if row is None else int(row[0])
                return committed

        return await self._run(read)

    async def aclose(self) -> None:
        await self._worker.aclose()


def _close_store(store: _Store) -> None:
    store.close()
    store.backend.close()


__all__ = [
    "EmbeddedAsyncOffsetProbe",
    "EmbeddedOffsetLog",
    "EmbeddedTopicPublisher",
    "create_embedded_topic",
    "trim_embedded_topic",
]
