"""The embedded log's files beside SQLite: the state file created private, quiet rollback and close
of a connection, and the per-topic lock files (a writer's ``flock`` on its epoch's file, the shared
``flock`` of acquirers waiting on the topic's ``.waiting`` file)."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
import sqlite3
import time
from pathlib import Path

log = logging.getLogger(__name__)


def rollback_quietly(conn: sqlite3.Connection) -> None:
    """Roll back the open transaction, if any; a failing rollback is logged (SQLite undoes it anyway)."""
    try:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
    except sqlite3.Error as exc:
        log.warning("rollback failed: %s", exc)


def close_quietly(conn: sqlite3.Connection) -> None:
    try:
        conn.close()
    except sqlite3.Error as exc:
        log.warning("closing an embedded state connection failed: %s", exc)


def create_private(path: Path) -> None:
    """Create the state file 0600 (its folder 0700) before SQLite opens it.

    SQLite gives the ``-wal`` and ``-shm`` files the mode of the database file, so they are
    private too. An existing file or folder keeps its mode, and is never opened here: closing any
    descriptor of a database file drops every POSIX lock this process holds on it, including
    those of open SQLite connections (which corrupts the database under concurrent writers).
    """
    if path.exists():
        return
    if not path.parent.exists():
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return  # created by another process or thread just now
    os.close(fd)


def topic_digest(topic: str) -> str:
    """The topic's part of its lock file names."""
    return hashlib.sha1(topic.encode()).hexdigest()[:16]


def open_private(path: Path) -> int:
    # 0600: another local user who could open a lock file could also flock it and block writers.
    return os.open(path, os.O_RDWR | os.O_CREAT, 0o600)


class WaitingFlag:
    """A shared ``flock`` on a topic's waiting file, held while an acquirer waits for its writer."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._fd: int | None = None
        self._raised = False

    def raise_flag(self) -> None:
        """Hold the shared lock (idempotent). Non-blocking: a holder's probe holds the file
        exclusively for microseconds, so a few quick tries get it; failing that, the next call
        tries again. Best effort: a failure only costs the holder's prompt release."""
        if self._raised:
            return
        try:
            if self._fd is None:
                self._fd = open_private(self._path)
            for _ in range(5):
                try:
                    fcntl.flock(self._fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
                except BlockingIOError:
                    time.sleep(0.0005)
                    continue
                self._raised = True
                return
        except OSError as exc:
            log.debug("announcing a waiting writer on %s: %s", self._path, exc)

    def lower(self) -> None:
        if self._fd is not None:
            fd, self._fd, self._raised = self._fd, None, False
            with contextlib.suppress(OSError):
                os.close(fd)  # drops the lock


def try_flock(path: Path) -> int | None:
    fd = open_private(path)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def release_flock(fd: int, path: Path) -> None:
    """Unlock and close; an error is logged (closing the descriptor drops the lock anyway)."""
    try:
        path.unlink(missing_ok=True)
        fcntl.flock(fd, fcntl.LOCK_UN)
    except OSError as exc:
        log.warning("releasing the lock file %s: %s", path, exc)
    finally:
        with contextlib.suppress(OSError):
            os.close(fd)


def lock_is_held(path: Path) -> bool:
    """Whether a writer holds the lock file. Probed with a SHARED lock: probes (observers polling
    leadership, acquirers checking the current epoch) never look like a holder to each other."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # also drops the shared lock
    return False
