"""The embedded offset tables as the offset API reads them: one connection with its transactions,
and the queries (run inside a transaction). See :mod:`.embedded` for the tables.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
import threading
from collections.abc import Iterator

from airflow_provider_pulsarstate.engine.backends.embedded import EmbeddedBackend
from airflow_provider_pulsarstate.engine.backends.embedded_files import close_quietly, rollback_quietly
from airflow_provider_pulsarstate.engine.errors import (
    BackendUnavailableError,
    ClosedError,
    CorruptEntryError,
    UnknownOutcomeError,
)
from airflow_provider_pulsarstate.engine.offsets.checks import stored_topic, unknown_topic

EMBEDDED_ADDRESS = "e"
"""Addresses of the embedded log: ``e:<partition>:<position>`` (the position is the offset)."""


class Store:
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
                rollback_quietly(conn)
                raise BackendUnavailableError(
                    f"{what} failed on embedded state file {self.backend.path}: {exc}"
                ) from exc
            except BaseException:
                rollback_quietly(conn)
                raise
            try:
                conn.execute("COMMIT")
            except sqlite3.Error as exc:
                if conn.in_transaction or not write:
                    rollback_quietly(conn)
                    raise BackendUnavailableError(
                        f"{what} failed on embedded state file {self.backend.path}, nothing was written: {exc}"
                    ) from exc
                raise UnknownOutcomeError(f"{what}: the commit failed ({exc}); it may or may not be recorded") from exc

    def close(self) -> None:
        with self._lock:
            self._closed = True
            if self._conn is not None:
                conn, self._conn = self._conn, None
                close_quietly(conn)


# -- queries (inside a transaction) -------------------------------------------------------------
def partition_count(conn: sqlite3.Connection, backend: EmbeddedBackend, topic: str) -> int:
    row = conn.execute("SELECT partitions FROM offset_topics WHERE name = ?", (topic,)).fetchone()
    if row is not None:
        return int(row[0])
    if has_rows(conn, topic):
        return 0
    raise unknown_topic(backend.topic_url(topic))


def has_rows(conn: sqlite3.Connection, stored: str) -> bool:
    return (
        conn.execute("SELECT 1 FROM entries WHERE topic = ? LIMIT 1", (stored,)).fetchone() is not None
        or conn.execute("SELECT 1 FROM topic_trims WHERE topic = ?", (stored,)).fetchone() is not None
    )


def stored_partition(conn: sqlite3.Connection, backend: EmbeddedBackend, topic: str, partition: int) -> str:
    """The topic partition ``partition`` is stored under; UnknownTopic/PartitionError when absent."""
    return stored_topic(topic, partition_count(conn, backend, topic), partition)


def offset_range(conn: sqlite3.Connection, stored: str) -> tuple[int, int]:
    """``(beginning, end)`` of a stored topic. A trim keeps the last entry (it numbers the next
    append), so ``topic_trims`` is what says where the retained range begins."""
    last = conn.execute("SELECT MAX(pos) FROM entries WHERE topic = ?", (stored,)).fetchone()[0]
    first = conn.execute("SELECT MIN(pos) FROM entries WHERE topic = ?", (stored,)).fetchone()[0]
    trim = conn.execute("SELECT beginning FROM topic_trims WHERE topic = ?", (stored,)).fetchone()
    trimmed = int(trim[0]) if trim else 0
    end = int(last) + 1 if last is not None else trimmed
    beginning = max(int(first) if first is not None else end, trimmed)
    return min(beginning, end), end


def properties_of(raw: str | None, topic: str, pos: int) -> dict[str, str]:
    if raw is None:
        return {}
    try:
        value = json.loads(raw)
    except ValueError as exc:
        raise CorruptEntryError(topic=topic, position=pos, cause=f"message properties are not JSON: {exc}") from exc
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise CorruptEntryError(topic=topic, position=pos, cause="message properties are not a str -> str mapping")
    return value
