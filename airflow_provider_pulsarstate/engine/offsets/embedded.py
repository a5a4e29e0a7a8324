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

import sqlite3
import time
from collections.abc import Callable
from typing import Any, TypeVar

from airflow_provider_pulsarstate.engine.backends.embedded import _TOPIC_ROWS, EmbeddedBackend
from airflow_provider_pulsarstate.engine.backends.embedded_files import close_quietly, rollback_quietly
from airflow_provider_pulsarstate.engine.config import ConnectionConfig
from airflow_provider_pulsarstate.engine.errors import (
    BackendUnavailableError,
    ConfigurationError,
    UnknownPartitionError,
    UnknownTopicError,
)
from airflow_provider_pulsarstate.engine.offsets.base import (
    AsyncOffsetProbe,
    OffsetLog,
    PulledMessage,
    StoredMessage,
    parse_address,
)
from airflow_provider_pulsarstate.engine.offsets.checks import (
    NOTHING_THERE,
    check_commit_range,
    check_offset,
    check_partition_count,
    check_topic,
    message_not_found,
    not_an_address,
    out_of_range,
    topic_exists_differently,
)
from airflow_provider_pulsarstate.engine.offsets.embedded_publisher import EmbeddedTopicPublisher
from airflow_provider_pulsarstate.engine.offsets.embedded_store import (
    EMBEDDED_ADDRESS,
    Store,
    has_rows,
    offset_range,
    partition_count,
    properties_of,
    stored_partition,
)
from airflow_provider_pulsarstate.engine.retry import Backoff
from airflow_provider_pulsarstate.engine.worker_thread import WorkerThread

T = TypeVar("T")


class EmbeddedOffsetLog(OffsetLog):
    """One topic of the embedded log, addressed by offsets (= entry positions). Thread-safe.

    Reads go straight to the entry at an offset (no reader pool or position cache is needed:
    ``reader_pool_size``, ``reader_idle_timeout`` and ``position_cache_size`` are accepted and
    unused). Every call reads one consistent snapshot of the file. Commits are durable on return.
    """

    def __init__(self, backend: EmbeddedBackend, topic: str, **options: Any) -> None:
        super().__init__(topic, options)
        self.backend = backend
        self._store = Store(backend)
        backend._track(self)

    def _partition_count(self) -> int:
        with self._store.transaction(f"reading the partitions of {self.topic}") as conn:
            return partition_count(conn, self.backend, self.topic)

    def _range(self, partition: int) -> tuple[int, int]:
        with self._store.transaction(f"reading the offsets of {self.topic} partition {partition}") as conn:
            return offset_range(conn, stored_partition(conn, self.backend, self.topic, partition))

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
            stored = stored_partition(conn, self.backend, self.topic, partition)
            beginning, end = offset_range(conn, stored)
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
                        properties=properties_of(properties, stored, pos),
                        publish_time=publish_time,
                        position=pos,
                    )
                )
                total += size
        return messages, end

    def _offset_for_time(self, partition: int, timestamp: float) -> int | None:
        with self._store.transaction(f"searching {self.topic} partition {partition} by time") as conn:
            stored = stored_partition(conn, self.backend, self.topic, partition)
            beginning, end = offset_range(conn, stored)

            def published(pos: int) -> float:
                row = conn.execute("SELECT publish_time FROM entries WHERE topic = ? AND pos = ?", (stored, pos))
                return float(row.fetchone()[0])

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
                stored = stored_partition(conn, self.backend, self.topic, partition)
            except (UnknownTopicError, UnknownPartitionError) as exc:
                raise message_not_found(self.topic, address, self.backend.topic_url(self.topic), str(exc)) from exc
            row = conn.execute(
                "SELECT e.payload, e.publish_time, m.properties FROM entries e "
                "LEFT JOIN entry_meta m ON m.topic = e.topic AND m.pos = e.pos WHERE e.topic = ? AND e.pos = ?",
                (stored, position),
            ).fetchone()
        if row is None:
            raise message_not_found(self.topic, address, self.backend.topic_url(stored), NOTHING_THERE)
        return StoredMessage(address, bytes(row[0]), properties_of(row[2], stored, position), float(row[1]))

    def _commit_at(self, subscription: str, partition: int, next_offset: int) -> None:
        with self._store.transaction(
            f"committing offset {next_offset} of {self.topic} partition {partition} for subscription {subscription!r}",
            write=True,
        ) as conn:
            stored = stored_partition(conn, self.backend, self.topic, partition)
            beginning, end = offset_range(conn, stored)
            check_commit_range(self.topic, partition, next_offset, beginning, end)
            conn.execute(
                "INSERT INTO subscriptions(topic, subscription, committed) VALUES (?, ?, ?) "
                "ON CONFLICT(topic, subscription) DO UPDATE SET committed = excluded.committed",
                (stored, subscription, next_offset),
            )

    def _committed(self, subscription: str, partition: int) -> int | None:
        with self._store.transaction(f"reading the committed offset of {subscription!r} on {self.topic}") as conn:
            stored = stored_partition(conn, self.backend, self.topic, partition)
            row = conn.execute(
                "SELECT committed FROM subscriptions WHERE topic = ? AND subscription = ?", (stored, subscription)
            ).fetchone()
        return None if row is None else int(row[0])

    def close(self) -> None:
        self._closed = True
        self._store.close()
        self.backend._untrack(self)


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
        rollback_quietly(conn)
        raise BackendUnavailableError(f"cannot delete {backend.topic_url(topic)}: {exc}") from exc
    finally:
        close_quietly(conn)


def create_embedded_topic(backend: EmbeddedBackend, topic: str, *, partitions: int) -> None:
    """Create ``topic`` on the embedded log (``partitions`` > 0: a partitioned topic whose
    partition ``K`` is stored as ``<topic>-partition-K``). An identical existing topic is fine.

    :raises ConfigurationError: ``partitions`` is negative, or the topic exists with another count
        (a topic that has entries but was never created is non-partitioned).
    """
    check_topic(topic)
    check_partition_count(partitions, topic)
    store = Store(backend)
    try:
        with store.transaction(f"creating topic {topic}", write=True) as conn:
            row = conn.execute("SELECT partitions FROM offset_topics WHERE name = ?", (topic,)).fetchone()
            existing = int(row[0]) if row else (0 if has_rows(conn, topic) else None)
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
    store = Store(backend)
    try:
        what = f"trimming {topic} partition {partition} below offset {before_offset}"
        with store.transaction(what, write=True) as conn:
            stored = stored_partition(conn, backend, topic, partition)
            beginning, end = offset_range(conn, stored)
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
        self._worker: WorkerThread[Store] = WorkerThread(
            lambda: Store(EmbeddedBackend(config.embedded_path, busy_timeout=config.operation_timeout)),
            _close_store,
            name="pulsarstate-offset-probe",
            what="this offset probe",
            share_key=("embedded-offset-probe", config),  # one locked connection per file, thread-safe
        )

    async def _run(self, fn: Callable[[Store], T]) -> T:
        return await self._worker.run(fn)

    async def end_offsets(self, topic: str) -> dict[int, int]:
        def read(store: Store) -> dict[int, int]:
            with store.transaction(f"reading the end offsets of {topic}") as conn:
                count = partition_count(conn, store.backend, topic)
                return {
                    p: offset_range(conn, stored_partition(conn, store.backend, topic, p))[1]
                    for p in range(max(count, 1))
                }

        return await self._run(read)

    async def committed(self, topic: str, subscription: str) -> dict[int, int | None]:
        def read(store: Store) -> dict[int, int | None]:
            with store.transaction(f"reading the committed offsets of {subscription!r} on {topic}") as conn:
                count = partition_count(conn, store.backend, topic)
                committed: dict[int, int | None] = {}
                for p in range(max(count, 1)):
                    row = conn.execute(
                        "SELECT committed FROM subscriptions WHERE topic = ? AND subscription = ?",
                        (stored_partition(conn, store.backend, topic, p), subscription),
                    ).fetchone()
                    committed[p] = None if row is None else int(row[0])
                return committed

        return await self._run(read)

    async def aclose(self) -> None:
        await self._worker.aclose()


def _close_store(store: Store) -> None:
    store.close()
    store.backend.close()


__all__ = [
    "EmbeddedAsyncOffsetProbe",
    "EmbeddedOffsetLog",
    "EmbeddedTopicPublisher",
    "create_embedded_topic",
    "trim_embedded_topic",
]
