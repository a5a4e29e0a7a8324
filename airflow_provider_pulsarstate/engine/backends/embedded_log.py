"""The writer and the reader of one topic of the embedded log (see :mod:`.embedded` for how the
contract is kept): appends fenced inside their own transaction, and a polling cursor."""

from __future__ import annotations

import fcntl
import logging
import os
import sqlite3
import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from airflow_provider_pulsarstate.engine.backends.base import RawEntry, RawReader, RawWriter
from airflow_provider_pulsarstate.engine.backends.embedded_files import (
    close_quietly,
    open_private,
    release_flock,
    rollback_quietly,
)
from airflow_provider_pulsarstate.engine.errors import (
    BackendUnavailableError,
    ClosedError,
    UnknownOutcomeError,
    WriterFencedError,
)
from airflow_provider_pulsarstate.engine.retry import Backoff

if TYPE_CHECKING:
    from airflow_provider_pulsarstate.engine.backends.embedded import EmbeddedBackend

log = logging.getLogger(__name__)

READ_BATCH = 512
"""Entries a reader fetches per query."""


class EmbeddedWriter(RawWriter):
    """The exclusive writer of one topic in the embedded log (or, with epoch -1, a shared appender)."""

    def __init__(
        self, backend: EmbeddedBackend, conn: sqlite3.Connection, topic: str, epoch: int, fd: int | None
    ) -> None:
        self.backend = backend
        self.topic = topic
        self.epoch = epoch
        self._conn = conn
        self._fd: int | None = fd
        self._shared = epoch < 0
        self._lock = threading.Lock()
        self._waiting_fd: int | None = None  # the topic's .waiting file, opened by the first has_waiters

    def append(self, payloads: Sequence[bytes], *, timeout: float) -> list[Any]:
        with self._lock:
            if self._fd is None and not self._shared:
                raise WriterFencedError(
                    f"writer of {self.topic} at epoch {self.epoch} is closed", topic=self.topic, epoch=self.epoch
                )
            conn = self._conn
            try:
                conn.execute("BEGIN IMMEDIATE")
                current = self.epoch if self._shared else self.backend._current_epoch(conn, self.topic)
                if current != self.epoch:
                    rollback_quietly(conn)
                    self._release()
                    raise WriterFencedError(
                        f"writer of {self.backend.topic_url(self.topic)} at epoch {self.epoch} was fenced "
                        f"by epoch {current}",
                        topic=self.topic,
                        epoch=self.epoch,
                    )
                row = conn.execute("SELECT MAX(pos) FROM entries WHERE topic = ?", (self.topic,)).fetchone()
                first = (row[0] if row[0] is not None else -1) + 1
                now = time.time()
                conn.executemany(
                    "INSERT INTO entries(topic, pos, payload, publish_time) VALUES (?, ?, ?, ?)",
                    [(self.topic, first + i, p, now) for i, p in enumerate(payloads)],
                )
            except (sqlite3.Error, BackendUnavailableError) as exc:
                rollback_quietly(conn)
                raise BackendUnavailableError(
                    f"append to {self.backend.topic_url(self.topic)} failed, nothing was written: {exc}"
                ) from exc
            try:
                conn.execute("COMMIT")
            except sqlite3.Error as exc:
                if conn.in_transaction:  # still open: rolling it back leaves nothing written
                    rollback_quietly(conn)
                    raise BackendUnavailableError(
                        f"append to {self.backend.topic_url(self.topic)} failed, nothing was written: {exc}"
                    ) from exc
                raise UnknownOutcomeError(
                    f"committing an append to {self.backend.topic_url(self.topic)} failed ({exc}); "
                    "it may or may not have been written"
                ) from exc
            return list(range(first, first + len(payloads)))

    def has_waiters(self) -> bool:
        """Whether an acquirer holds the topic's waiting flag: our non-blocking exclusive lock on
        it fails then (and is dropped at once when it succeeds)."""
        with self._lock:
            if self._fd is None:
                return False
            try:
                if self._waiting_fd is None:
                    self._waiting_fd = open_private(self.backend.waiting_path(self.topic))
                fcntl.flock(self._waiting_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return True
            except OSError as exc:
                log.debug("checking %s for waiting writers: %s", self.backend.topic_url(self.topic), exc)
                return False
            fcntl.flock(self._waiting_fd, fcntl.LOCK_UN)
            return False

    def _release(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            release_flock(fd, self.backend.lock_path(self.topic, self.epoch))
        if self._waiting_fd is not None:
            fd, self._waiting_fd = self._waiting_fd, None
            os.close(fd)

    def close(self) -> None:
        with self._lock:
            self._release()
            close_quietly(self._conn)
        self.backend._untrack(self)


class EmbeddedReader(RawReader):
    """A polling cursor over one topic of the embedded log."""

    def __init__(self, backend: EmbeddedBackend, conn: sqlite3.Connection, topic: str, after: int) -> None:
        self.backend = backend
        self.topic = topic
        self._conn = conn
        self._after = after
        self._buffer: list[tuple[int, bytes, float]] = []
        self._closed = False

    def _fetch(self) -> None:
        if self._closed:
            raise ClosedError(f"reader of {self.topic} is closed")
        try:
            rows = self._conn.execute(
                "SELECT pos, payload, publish_time FROM entries WHERE topic = ? AND pos > ? ORDER BY pos LIMIT ?",
                (self.topic, self._after, READ_BATCH),
            ).fetchall()
        except sqlite3.Error as exc:
            raise BackendUnavailableError(
                f"reading {self.backend.topic_url(self.topic)} after position {self._after} failed: {exc}"
            ) from exc
        rows.reverse()
        self._buffer = rows

    def read_next(self, *, timeout: float) -> RawEntry | None:
        if not self._buffer:
            deadline = time.monotonic() + timeout
            backoff = Backoff(initial=0.001, maximum=self.backend.poll_interval)
            self._fetch()
            while not self._buffer and time.monotonic() < deadline:
                backoff.sleep(deadline)
                self._fetch()
            if not self._buffer:
                return None
        pos, payload, publish_time = self._buffer.pop()
        self._after = pos
        return RawEntry(pos, payload, publish_time)

    def has_next(self) -> bool:
        if self._buffer:
            return True
        self._fetch()
        return bool(self._buffer)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            close_quietly(self._conn)
        self.backend._untrack(self)
