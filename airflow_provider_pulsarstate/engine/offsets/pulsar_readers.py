"""The reader pool of a Pulsar offset log: per partition, a bounded LRU of readers keyed by the
next offset each would return, so that a caller continuing where it stopped reuses one.

The pool also owns the log's open/closed state: a reader is never added to a closed log, and
closing the log closes every reader it holds (pooled or in use).
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import pulsar

from airflow_provider_pulsarstate.engine.backends import pulsar_compat
from airflow_provider_pulsarstate.engine.offsets.base import PulledMessage
from airflow_provider_pulsarstate.engine.offsets.checks import log_closed
from airflow_provider_pulsarstate.engine.offsets.pulsar_index import EntryRef
from airflow_provider_pulsarstate.engine.offsets.pulsar_publisher import close_quietly


@dataclass(eq=False)
class Cursor:
    """A pooled reader of one partition, positioned at ``next_offset``."""

    partition: int
    topic: str
    reader: pulsar.Reader
    next_offset: int
    entry: EntryRef | None = None  # the entry of the last message read
    pending: PulledMessage | None = None  # read but not returned (max_bytes), offset >= next_offset
    idle_since: float = field(default_factory=time.monotonic)


class ReaderPool:
    """Readers of one topic, pooled per partition. Thread-safe; readers are created and closed
    without holding its lock.

    :param pool_size: readers kept per partition (least recently returned closed first).
    :param idle_timeout: seconds an unused pooled reader is kept (checked on every :meth:`take`).
    """

    def __init__(self, topic: str, *, pool_size: int, idle_timeout: float) -> None:
        self.topic = topic
        self._pool_size = pool_size
        self._idle_timeout = idle_timeout
        self._lock = threading.Lock()
        self._pools: dict[int, OrderedDict[int, Cursor]] = {}
        self._live: set[Cursor] = set()
        self._closed = False
        self.readers_created = 0

    def check_open(self) -> None:
        """:raises ClosedError: the log was closed."""
        with self._lock:
            if self._closed:
                raise log_closed(self.topic)

    def take(self, partition: int, offset: int) -> Cursor | None:
        """The pooled reader of ``partition`` positioned at ``offset`` (now the caller's), if any."""
        with self._lock:
            if self._closed:
                raise log_closed(self.topic)
            expired = self._sweep_locked(time.monotonic())
            pool = self._pools.get(partition)
            cursor = pool.pop(offset, None) if pool else None
        self.close_cursors(expired)
        return cursor

    def add(self, cursor: Cursor) -> None:
        """Count a reader the caller just created as held by this log; closes it and raises
        ClosedError when the log was closed meanwhile."""
        with self._lock:
            closed = self._closed
            if not closed:
                self._live.add(cursor)
                self.readers_created += 1
        if closed:
            close_quietly(cursor.reader)
            raise log_closed(self.topic)

    def give_back(self, cursor: Cursor) -> None:
        """Pool a reader after a successful pull (closed instead when the log was closed)."""
        cursor.idle_since = time.monotonic()
        evicted: list[Cursor] = []
        with self._lock:
            if self._closed or cursor not in self._live:
                evicted.append(cursor)
            else:
                pool = self._pools.setdefault(cursor.partition, OrderedDict())
                older = pool.pop(cursor.next_offset, None)
                if older is not None:
                    evicted.append(older)
                pool[cursor.next_offset] = cursor
                while len(pool) > self._pool_size:
                    evicted.append(pool.popitem(last=False)[1])
        self.close_cursors(evicted)

    def _sweep_locked(self, now: float) -> list[Cursor]:
        expired = []
        for pool in self._pools.values():
            for key in [k for k, c in pool.items() if now - c.idle_since >= self._idle_timeout]:
                expired.append(pool.pop(key))
        return expired

    def close_cursors(self, cursors: list[Cursor]) -> None:
        """Close evicted, expired or failed readers without making the caller's pull wait for the broker."""
        if not cursors:
            return
        with self._lock:
            for cursor in cursors:
                self._live.discard(cursor)
        for cursor in cursors:
            raw = pulsar_compat.raw_reader(cursor.reader)
            if raw is not None and hasattr(raw, "close_async"):
                try:
                    raw.close_async(_ignore)
                    continue
                except pulsar.PulsarException:
                    pass
            close_quietly(cursor.reader)

    def pooled(self) -> dict[int, list[int]]:
        """The pooled readers' next offsets per partition (oldest first)."""
        with self._lock:
            return {p: list(pool) for p, pool in self._pools.items() if pool}

    def open_count(self) -> int:
        """Readers held open (pooled or in use)."""
        with self._lock:
            return len(self._live)

    def close(self) -> bool:
        """Close every reader and refuse new ones; False when it was already closed."""
        with self._lock:
            if self._closed:
                return False
            self._closed = True
            cursors = list(self._live)
            self._live.clear()
            self._pools.clear()
        for cursor in cursors:
            close_quietly(cursor.reader)
        return True


def _ignore(*_args: Any) -> None:
    pass
