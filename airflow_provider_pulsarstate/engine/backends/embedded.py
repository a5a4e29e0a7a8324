"""The embedded back end: one SQLite file (WAL mode) shared by the processes of one host.

How the contract is kept:

* **Epochs.** ``topics.epoch`` is the topic's current epoch. Taking the writer bumps it with a
  compare-and-set in an IMMEDIATE transaction; every append re-reads it inside its own
  transaction and refuses to commit unless it still equals the writer's epoch (fencing is checked
  inside the append transaction, so a fenced writer can never append).
* **Liveness.** The holder of epoch ``E`` keeps an ``flock`` on ``<db>.locks/<topic>.<E>``. The
  kernel drops it when the process dies (SIGKILL included), which is how others learn the writer
  is free, just as Pulsar frees an exclusive producer when its connection drops. A FENCE takeover
  bumps the epoch without waiting for the old holder. ``writer_holders`` records the name and
  access mode of each epoch's writer in the same transaction as the epoch (:meth:`writer_lock`).
* **Handover.** An acquirer that waits (WAIT or FENCE) holds a shared ``flock`` on the topic's
  ``<db>.locks/<topic>.waiting`` file while it waits; the holder learns of it with a
  non-blocking exclusive ``flock`` (:meth:`EmbeddedWriter.has_waiters`: two system calls). A
  waiter sleeps in a blocking shared ``flock`` on the holder's epoch lock file (one thread per
  lock file and process), so the kernel wakes it the instant the holder lets go: no polling.
  Both locks vanish with their process, so a waiter can never hold a topic up.
* **Durability.** A committed append survives the crash of any process (WAL, ``synchronous=NORMAL``);
  pass ``synchronous="FULL"`` to also survive power loss.
* **Readers** poll the file; they see committed entries only, in append order.
* **Errors.** Every ``sqlite3`` or OS error becomes one of ours (BackendUnavailableError, or
  UnknownOutcomeError when a commit failed in a way that may have written it), so callers and the
  state manager's background threads never see a driver's exception.
"""

from __future__ import annotations

import fcntl
import logging
import os
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

from airflow_provider_pulsarstate.engine.backends.base import (
    EARLIEST,
    AcquireMode,
    Backend,
    RawEntry,
    RawReader,
    RawWriter,
    default_writer_name,
    is_earliest,
    partition_topic_name,
)
from airflow_provider_pulsarstate.engine.backends.children import C, Children
from airflow_provider_pulsarstate.engine.backends.embedded_files import (
    WaitingFlag,
    close_quietly,
    create_private,
    lock_is_held,
    release_flock,
    rollback_quietly,
    topic_digest,
    try_flock,
)
from airflow_provider_pulsarstate.engine.backends.embedded_log import EmbeddedReader, EmbeddedWriter
from airflow_provider_pulsarstate.engine.backends.embedded_offers import EmbeddedOffers
from airflow_provider_pulsarstate.engine.errors import (
    BackendUnavailableError,
    ClosedError,
    OperationTimeoutError,
    WriterBusyError,
)
from airflow_provider_pulsarstate.engine.retry import Backoff

log = logging.getLogger(__name__)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS topics (
    name  TEXT PRIMARY KEY,
    epoch INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS entries (
    topic        TEXT    NOT NULL,
    pos          INTEGER NOT NULL,
    payload      BLOB    NOT NULL,
    publish_time REAL    NOT NULL,
    PRIMARY KEY (topic, pos)
) WITHOUT ROWID;
-- Offset consumption (engine/offsets/embedded.py); added later, so an older file gains them here.
CREATE TABLE IF NOT EXISTS offset_topics (
    name       TEXT    PRIMARY KEY,
    partitions INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS entry_meta (
    topic      TEXT    NOT NULL,
    pos        INTEGER NOT NULL,
    key        TEXT,
    properties TEXT,
    PRIMARY KEY (topic, pos)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS topic_trims (
    topic     TEXT    PRIMARY KEY,
    beginning INTEGER NOT NULL
);
-- The writer of each epoch (added later: an older file gains it here; its epochs have no row).
CREATE TABLE IF NOT EXISTS writer_holders (
    topic       TEXT    PRIMARY KEY,
    epoch       INTEGER NOT NULL,
    holder      TEXT,
    access_mode TEXT    NOT NULL
);
CREATE TABLE IF NOT EXISTS subscriptions (
    topic        TEXT    NOT NULL,
    subscription TEXT    NOT NULL,
    committed    INTEGER NOT NULL,
    PRIMARY KEY (topic, subscription)
) WITHOUT ROWID;
"""
_RECHECK = 0.25
"""Longest a waiting acquirer sleeps before it reads the topic's epoch again (a FENCE takeover
moves the writer to a new epoch without the old holder letting go of its lock)."""
# Every row that belongs to one topic (delete_topic removes them all).
_TOPIC_ROWS = (
    ("entries", "topic"),
    ("topics", "name"),
    ("offset_topics", "name"),
    ("entry_meta", "topic"),
    ("topic_trims", "topic"),
    ("subscriptions", "topic"),
    ("writer_holders", "topic"),
)


def _is_busy(exc: sqlite3.OperationalError) -> bool:
    """Whether ``exc`` is SQLite's "locked"/"busy" answer, which passes once the other holder is done."""
    text = str(exc).lower()
    return "locked" in text or "busy" in text


class EmbeddedBackend(EmbeddedOffers, Backend):
    """The embedded single-host log.

    :param path: the SQLite file (created with its folder when missing).
    :param busy_timeout: seconds a transaction waits for another process's lock.
    :param synchronous: SQLite ``synchronous`` pragma: NORMAL (process-crash safe) or FULL.
    :param poll_interval: longest sleep of a reader waiting for new entries.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        busy_timeout: float = 30.0,
        synchronous: str = "NORMAL",
        poll_interval: float = 0.02,
    ) -> None:
        if synchronous.upper() not in ("NORMAL", "FULL", "EXTRA"):
            raise ValueError(f"synchronous must be NORMAL, FULL or EXTRA, got {synchronous!r}")
        self.path = Path(path)
        self.busy_timeout = busy_timeout
        self.synchronous = synchronous.upper()
        self.poll_interval = poll_interval
        self._lock_dir = self.path.with_name(self.path.name + ".locks")
        self._closed = False
        self._children = Children()
        self._watch_lock = threading.Lock()
        self._initialized = False
        self._release_watches: dict[Path, threading.Event] = {}  # lock file -> set once its holder let go

    # -- connections ------------------------------------------------------------------------
    def connect(self) -> sqlite3.Connection:
        """A new connection to the file, schema ensured (one per writer or reader)."""
        if self._closed:
            raise ClosedError(f"embedded back end {self.path} is closed")
        deadline = time.monotonic() + self.busy_timeout
        backoff = Backoff(initial=0.005, maximum=0.2)
        while True:
            conn = None
            try:
                create_private(self.path)
                conn = sqlite3.connect(
                    self.path, timeout=self.busy_timeout, isolation_level=None, check_same_thread=False
                )
                self._set_up(conn)
                return conn
            except sqlite3.OperationalError as exc:
                if conn is not None:
                    conn.close()
                # WAL recovery and the journal-mode switch answer "locked" without calling the busy
                # handler, so a connection opened while another process recovers the file retries here
                if not _is_busy(exc) or time.monotonic() >= deadline:
                    raise BackendUnavailableError(f"cannot open embedded state file {self.path}: {exc}") from exc
                backoff.sleep(deadline)
            except (sqlite3.Error, OSError) as exc:
                if conn is not None:
                    conn.close()
                raise BackendUnavailableError(f"cannot open embedded state file {self.path}: {exc}") from exc

    def _set_up(self, conn: sqlite3.Connection) -> None:
        (mode,) = conn.execute("PRAGMA journal_mode").fetchone()
        if str(mode).lower() != "wal":
            conn.execute("PRAGMA journal_mode=WAL")
        conn.execute(f"PRAGMA synchronous={self.synchronous}")
        if not self._initialized:
            conn.executescript(_SCHEMA)
            self._initialized = True

    def _track(self, child: C) -> C:
        return self._children.track(child)

    def _untrack(self, child: object) -> None:
        self._children.untrack(child)

    def topic_url(self, topic: str) -> str:
        return f"{topic} (embedded {self.path})"

    def lock_path(self, topic: str, epoch: int) -> Path:
        return self._lock_dir / f"{topic_digest(topic)}.{epoch}.lock"

    def waiting_path(self, topic: str) -> Path:
        """The file waiting acquirers of ``topic`` hold a shared lock on (see "Handover" above)."""
        return self._lock_dir / f"{topic_digest(topic)}.waiting"

    # -- writer -----------------------------------------------------------------------------
    def acquire_writer(self, topic: str, *, mode: AcquireMode, timeout: float, name: str | None = None) -> RawWriter:
        mode = AcquireMode(mode)
        deadline = time.monotonic() + timeout
        backoff = Backoff(initial=0.002, maximum=0.02)
        name = name or default_writer_name()
        conn = self.connect()
        waiting = WaitingFlag(self.waiting_path(topic))
        try:
            while True:
                writer = self._try_acquire(conn, topic, fence=mode is AcquireMode.FENCE, name=name)
                if writer is not None:
                    log.debug("acquired writer of %s at epoch %d", topic, writer.epoch)
                    return self._track(writer)
                if mode is AcquireMode.FAIL_FAST:
                    raise WriterBusyError(f"another process holds the writer of {self.topic_url(topic)}")
                if time.monotonic() >= deadline:
                    raise OperationTimeoutError(
                        f"waited {timeout:.1f}s for the writer of {self.topic_url(topic)}; it is still held"
                    )
                waiting.raise_flag()
                # FENCE lost a race with a concurrent acquirer, which it fences at the next try;
                # WAIT sleeps until the holder lets go, or briefly when one is only mid-way in.
                if mode is AcquireMode.FENCE or not self._await_release(conn, topic, deadline):
                    backoff.sleep(deadline)
        except BaseException:
            close_quietly(conn)
            raise
        finally:
            waiting.lower()

    def _await_release(self, conn: sqlite3.Connection, topic: str, deadline: float) -> bool:
        """Sleep until whoever is in the way lets go of its lock (the holder of the current epoch,
        or an acquirer that took the next epoch's lock and is about to publish it), at most
        :data:`_RECHECK` seconds and never past ``deadline``. False at once when neither holds one."""
        epoch = self._current_epoch(conn, topic)
        for path in (self.lock_path(topic, epoch), self.lock_path(topic, epoch + 1)):
            try:
                event = self._release_watch(path)
            except OSError as exc:
                raise BackendUnavailableError(
                    f"cannot watch the writer lock of {self.topic_url(topic)}: {exc}"
                ) from exc
            if event is not None:
                event.wait(max(0.0, min(_RECHECK, deadline - time.monotonic())))
                return True
        return False

    def _release_watch(self, path: Path) -> threading.Event | None:
        """An event set when the holder of lock file ``path`` lets go (None: nobody holds it now).

        A daemon thread per lock file sleeps in a blocking shared ``flock`` on it, shared by every
        waiter of this process; it ends when the holder releases the lock or dies. A thread whose
        waiters all gave up stays until then (at most one per held lock file).
        """
        with self._watch_lock:
            event = self._release_watches.get(path)
            if event is not None:
                return event
            if not lock_is_held(path):
                return None
            try:
                fd = os.open(path, os.O_RDONLY)
            except FileNotFoundError:
                return None
            event = self._release_watches[path] = threading.Event()
        threading.Thread(
            target=self._watch_release, args=(path, fd, event), name="pulsarstate-writer-watch", daemon=True
        ).start()
        return event

    def _watch_release(self, path: Path, fd: int, event: threading.Event) -> None:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH)  # granted once the holder's exclusive lock is gone
        except OSError as exc:
            log.debug("watching the writer lock %s: %s", path, exc)
        finally:
            os.close(fd)  # also drops our shared lock: never seen as a holder
            with self._watch_lock:
                self._release_watches.pop(path, None)
            event.set()

    def _current_epoch(self, conn: sqlite3.Connection, topic: str) -> int:
        try:
            row = conn.execute("SELECT epoch FROM topics WHERE name = ?", (topic,)).fetchone()
        except sqlite3.Error as exc:
            raise BackendUnavailableError(f"cannot read the epoch of {self.topic_url(topic)}: {exc}") from exc
        return row[0] if row else 0

    def current_epoch(self, topic: str) -> int:
        conn = self.connect()
        try:
            return self._current_epoch(conn, topic)
        finally:
            close_quietly(conn)

    def writer_lock(self, topic: str) -> tuple[int, str | None, str | None, bool]:
        """``(epoch, holder, access_mode, held)`` of ``topic``'s writer lock: the current epoch
        (0: never taken), the name and access mode its writer recorded (None when it recorded
        none, e.g. a file written by an older version), and whether that epoch's lock is held now.

        :raises BackendUnavailableError: the file cannot be read.
        """
        conn = self.connect()
        try:
            epoch = self._current_epoch(conn, topic)
            try:
                row = conn.execute(
                    "SELECT holder, access_mode FROM writer_holders WHERE topic = ? AND epoch = ?", (topic, epoch)
                ).fetchone()
            except sqlite3.Error as exc:
                raise BackendUnavailableError(f"cannot read the writer of {self.topic_url(topic)}: {exc}") from exc
        finally:
            close_quietly(conn)
        try:
            held = epoch > 0 and lock_is_held(self.lock_path(topic, epoch))
        except OSError as exc:
            raise BackendUnavailableError(f"cannot check the writer lock of {self.topic_url(topic)}: {exc}") from exc
        return epoch, (row[0] if row else None), (row[1] if row else None), held

    def _try_acquire(self, conn: sqlite3.Connection, topic: str, *, fence: bool, name: str) -> EmbeddedWriter | None:
        current = self._current_epoch(conn, topic)
        # Hold the next epoch's liveness lock before publishing that epoch, so nobody ever sees
        # an epoch whose lock is free while its holder is alive.
        new_epoch = current + 1
        try:
            self._lock_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
            if not fence and current > 0 and lock_is_held(self.lock_path(topic, current)):
                return None
            fd = try_flock(self.lock_path(topic, new_epoch))
        except OSError as exc:
            raise BackendUnavailableError(f"cannot lock the writer of {self.topic_url(topic)}: {exc}") from exc
        if fd is None:
            return None  # a concurrent acquirer is taking this very epoch
        try:
            conn.execute("BEGIN IMMEDIATE")
            if self._current_epoch(conn, topic) != current:
                conn.execute("ROLLBACK")
                release_flock(fd, self.lock_path(topic, new_epoch))
                return None
            conn.execute(
                "INSERT INTO topics(name, epoch) VALUES (?, ?) ON CONFLICT(name) DO UPDATE SET epoch = excluded.epoch",
                (topic, new_epoch),
            )
            conn.execute(
                "INSERT INTO writer_holders(topic, epoch, holder, access_mode) VALUES (?, ?, ?, ?) "
                "ON CONFLICT(topic) DO UPDATE SET epoch = excluded.epoch, holder = excluded.holder, "
                "access_mode = excluded.access_mode",
                (topic, new_epoch, name, "Exclusive"),  # a takeover ends as an Exclusive writer, as on Pulsar
            )
            conn.execute("COMMIT")
        except sqlite3.Error as exc:
            rollback_quietly(conn)
            release_flock(fd, self.lock_path(topic, new_epoch))
            raise BackendUnavailableError(f"cannot take the writer of {self.topic_url(topic)}: {exc}") from exc
        try:
            for stale in self._lock_dir.glob(self.lock_path(topic, 0).name.rsplit(".", 2)[0] + ".*.lock"):
                if stale.name != self.lock_path(topic, new_epoch).name and not lock_is_held(stale):
                    stale.unlink(missing_ok=True)
        except OSError as exc:  # only tidying: the writer is taken
            log.warning("removing stale writer locks of %s: %s", self.topic_url(topic), exc)
        return EmbeddedWriter(self, conn, topic, new_epoch, fd)

    def open_shared_writer(self, topic: str, *, compress: bool = False, batching: bool = True) -> RawWriter:
        # A local file: compressing would cost more CPU than the disk reads it saves.
        return self._track(EmbeddedWriter(self, self.connect(), topic, -1, None))

    def delete_topic(self, topic: str) -> None:
        conn = self.connect()
        try:
            conn.execute("BEGIN IMMEDIATE")
            row = conn.execute("SELECT partitions FROM offset_topics WHERE name = ?", (topic,)).fetchone()
            for name in [topic] + [partition_topic_name(topic, k) for k in range(row[0] if row else 0)]:
                for table, column in _TOPIC_ROWS:
                    conn.execute(f"DELETE FROM {table} WHERE {column} = ?", (name,))
            conn.execute("COMMIT")
        except sqlite3.Error as exc:
            rollback_quietly(conn)
            raise BackendUnavailableError(f"cannot delete {self.topic_url(topic)}: {exc}") from exc
        finally:
            close_quietly(conn)

    def list_topics(self, prefix: str) -> list[str]:
        conn = self.connect()
        try:
            rows = conn.execute(
                "SELECT name FROM topics WHERE substr(name, 1, ?) = ? "
                "UNION SELECT name FROM offset_topics WHERE substr(name, 1, ?) = ? ORDER BY 1",
                (len(prefix), prefix, len(prefix), prefix),
            ).fetchall()
        except sqlite3.Error as exc:
            raise BackendUnavailableError(f"cannot list the topics under {self.topic_url(prefix)}: {exc}") from exc
        finally:
            close_quietly(conn)
        return [r[0] for r in rows]

    # -- readers ----------------------------------------------------------------------------
    def create_reader(self, topic: str, *, start: Any = EARLIEST) -> RawReader:
        after = -1 if is_earliest(start) else int(start)
        return self._track(EmbeddedReader(self, self.connect(), topic, after))

    def read_last(self, topic: str, *, timeout: float) -> RawEntry | None:
        conn = self.connect()
        try:
            row = conn.execute(
                "SELECT pos, payload, publish_time FROM entries WHERE topic = ? ORDER BY pos DESC LIMIT 1", (topic,)
            ).fetchone()
        except sqlite3.Error as exc:
            raise BackendUnavailableError(f"cannot read the last entry of {self.topic_url(topic)}: {exc}") from exc
        finally:
            close_quietly(conn)
        return RawEntry(row[0], row[1], row[2]) if row else None

    def read_at(self, topic: str, position: Any, *, timeout: float) -> RawEntry | None:
        conn = self.connect()
        try:
            row = conn.execute(
                "SELECT pos, payload, publish_time FROM entries WHERE topic = ? AND pos = ?", (topic, int(position))
            ).fetchone()
        except sqlite3.Error as exc:
            raise BackendUnavailableError(f"cannot read {self.topic_url(topic)} at {position}: {exc}") from exc
        finally:
            conn.close()
        return RawEntry(row[0], row[1], row[2]) if row else None

    def encode_position(self, position: Any) -> bytes:
        return str(int(position)).encode()

    def decode_position(self, data: bytes) -> Any:
        try:
            position = int(data.decode("ascii"))
        except (UnicodeDecodeError, ValueError) as exc:
            raise ValueError(f"not an embedded log position: {data!r}") from exc
        if position < 0:
            raise ValueError(f"not an embedded log position: {data!r}")
        return position

    def close(self) -> None:
        if self._closed:
            return
        self._children.close_all()
        self._closed = True
