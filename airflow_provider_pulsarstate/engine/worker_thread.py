"""Blocking reads awaited on an event loop: a bounded pool of threads, resources shared by key.

Async probes (triggers) read SQLite or replay a log with blocking calls. Run on asgiref's shared
thread, one read waiting on a locked file would stall every trigger of the process; run on the
loop, it would stall the loop. A thread and a client per probe do not scale either: a triggerer
runs up to a thousand triggers. So every :class:`WorkerThread` runs its calls on one process-wide
pool of at most :data:`MAX_THREADS` threads, one call of a given worker at a time, and workers
that read through the same resource (one back end per connection, one lease-log replica per lease
log) share it: :class:`SharedResources` opens it for the first user and closes it after the last.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Callable, Hashable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar, cast

from airflow_provider_pulsarstate.engine.errors import ClosedError

R = TypeVar("R")
T = TypeVar("T")

MAX_THREADS = 8
"""Threads of the process-wide pool at most: as many blocking reads run at once, whatever the
number of triggers (a read is bounded by its connection's ``operation_timeout``)."""

_pool_lock = threading.Lock()
_pool: list[tuple[int, ThreadPoolExecutor]] = []  # [(pid, executor)]


def shared_pool() -> ThreadPoolExecutor:
    """This process's pool (a forked child makes its own)."""
    with _pool_lock:
        if not _pool or _pool[0][0] != os.getpid():
            _pool[:] = [(os.getpid(), ThreadPoolExecutor(max_workers=MAX_THREADS, thread_name_prefix="pulsarstate-io"))]
        return _pool[0][1]


@dataclass(eq=False)
class _Held:
    """One key's resource in a process: opened by the first user, closed after the last."""

    pid: int
    resource: object = None  # None until opened
    users: int = 0
    opening: threading.Lock = field(default_factory=threading.Lock)  # one opener per key


class SharedResources:
    """Resources opened once per key and process, counted by users, closed after the last one.

    Thread-safe; openers and closers run on the caller's thread (a pool thread).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: dict[Hashable, _Held] = {}

    def acquire(self, key: Hashable, opener: Callable[[], R]) -> R:
        """The resource of ``key``, opened by ``opener`` if no one holds it; one more user."""
        pid = os.getpid()
        with self._lock:
            entry = self._held.get(key)
            if entry is None or entry.pid != pid:
                entry = self._held[key] = _Held(pid)
            entry.users += 1
        try:
            with entry.opening:  # the others wait for the first opener's resource
                if entry.resource is None:
                    entry.resource = opener()
                # The registry holds resources of many types; a key's resource is what its opener returned.
                return cast("R", entry.resource)
        except BaseException:
            self._drop(key, entry)
            raise

    def release(self, key: Hashable, closer: Callable[[Any], None]) -> None:
        """One user fewer; the last one closes the resource with ``closer``."""
        with self._lock:
            entry = self._held.get(key)
            if entry is None:
                return
            entry.users -= 1
            if entry.users > 0:
                return
            del self._held[key]
        if entry.resource is not None:
            closer(entry.resource)

    def users(self, key: Hashable) -> int:
        """How many hold ``key`` now (for tests)."""
        with self._lock:
            entry = self._held.get(key)
            return 0 if entry is None else entry.users

    def _drop(self, key: Hashable, entry: _Held) -> None:
        with self._lock:
            entry.users -= 1
            if entry.users <= 0 and self._held.get(key) is entry:
                del self._held[key]


RESOURCES = SharedResources()
"""The process-wide registry every :class:`WorkerThread` with a ``share_key`` uses."""


class WorkerThread(Generic[R]):
    """Calls on the shared pool and the resource they use (no thread, no I/O before the first call).

    Calls of one worker run one at a time, in order of arrival on the pool.

    :param opener: opens the resource, on a pool thread, at the first call.
    :param closer: closes it, on a pool thread, after any call still running.
    :param name: names the owner in logs (kept for compatibility; threads are the pool's).
    :param what: how a call after :meth:`aclose` names the owner (``"this offset probe"``).
    :param share_key: workers with the same key share one resource (opened by the first, closed
        after the last); None: a resource of this worker's own.
    """

    def __init__(
        self,
        opener: Callable[[], R],
        closer: Callable[[R], None],
        *,
        name: str,
        what: str,
        share_key: Hashable | None = None,
    ) -> None:
        self._opener = opener
        self._closer = closer
        self._name = name
        self._what = what
        self._share_key = share_key
        self._resource: R | None = None
        self._serial = threading.Lock()
        self._closed = False

    def _call(self, fn: Callable[[R], T]) -> T:  # on a pool thread
        with self._serial:
            if self._closed and self._resource is None:
                raise ClosedError(f"{self._what} is closed")
            if self._resource is None:
                self._resource = (
                    RESOURCES.acquire(self._share_key, self._opener) if self._share_key is not None else self._opener()
                )
            return fn(self._resource)

    async def run(self, fn: Callable[[R], T]) -> T:
        """``fn(resource)`` on a pool thread, awaited.

        :raises ClosedError: after :meth:`aclose`.
        """
        if self._closed:
            raise ClosedError(f"{self._what} is closed")
        return await asyncio.get_running_loop().run_in_executor(shared_pool(), self._call, fn)

    def _release(self) -> None:  # on a pool thread, after any call of this worker
        with self._serial:
            resource, self._resource = self._resource, None
        if resource is None:
            return
        if self._share_key is not None:
            RESOURCES.release(self._share_key, self._closer)
        else:
            self._closer(resource)

    async def aclose(self) -> None:
        """Close (or give back) the resource after any call still running (a cancelled caller does
        not stop a blocking read; it ends within its own time-out). Idempotent; never waits on that call."""
        if self._closed:
            return
        self._closed = True
        shared_pool().submit(self._release)


def shared_backend_key(config: Any) -> tuple[str, Any]:
    """The share key of a connection's back end (see :func:`acquire_backend`)."""
    return ("backend", config)


def acquire_backend(config: Any) -> Any:
    """This process's back end of ``config``, shared by every async reader (one client, one broker
    connection per connection); give it back with :func:`release_backend`."""
    from airflow_provider_pulsarstate.engine.backends import open_backend

    return RESOURCES.acquire(shared_backend_key(config), lambda: open_backend(config))


def release_backend(config: Any) -> None:
    """One user of :func:`acquire_backend`'s back end fewer; the last one closes it."""
    RESOURCES.release(shared_backend_key(config), _close_quietly)


def open_on_shared_backend(config: Any, make: Callable[[Any], T]) -> tuple[T, Any]:
    """``(make(backend), config)`` on the connection's shared back end (:func:`acquire_backend`);
    the back end is given back if ``make`` fails. Close the pair with :func:`close_on_shared_backend`."""
    backend = acquire_backend(config)
    try:
        return make(backend), config
    except BaseException:
        release_backend(config)
        raise


def close_on_shared_backend(opened: tuple[Any, Any]) -> None:
    """Close what :func:`open_on_shared_backend` made, then give the back end back."""
    made, config = opened
    _close_quietly(made)
    release_backend(config)


def _close_quietly(closable: Any) -> None:
    try:
        closable.close()
    except Exception:  # closing is best effort; nothing was written
        pass
