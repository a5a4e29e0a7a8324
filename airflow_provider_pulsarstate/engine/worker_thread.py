"""Blocking reads awaited on an event loop, each user on one worker thread of its own.

Async probes (triggers) read SQLite or replay a log with blocking calls. Run on asgiref's shared
thread, one read waiting on a locked file would stall every trigger of the process; run on the
loop, it would stall the loop. :class:`WorkerThread` gives each probe its own single thread and the
resource its reads use, opened there on first use and closed there after any read still running.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Generic, TypeVar

from airflow_provider_pulsarstate.engine.errors import ClosedError

R = TypeVar("R")
T = TypeVar("T")


class WorkerThread(Generic[R]):
    """One worker thread and the resource its calls use (no thread, no I/O before the first call).

    :param opener: opens the resource, on the worker thread, at the first call.
    :param closer: closes it, on the worker thread, after any call still running there.
    :param name: the thread's name prefix.
    :param what: how a call after :meth:`aclose` names the owner (``"this offset probe"``).
    """

    def __init__(self, opener: Callable[[], R], closer: Callable[[R], None], *, name: str, what: str) -> None:
        self._opener = opener
        self._closer = closer
        self._name = name
        self._what = what
        self._resource: R | None = None
        self._pool: ThreadPoolExecutor | None = None
        self._closed = False

    def _call(self, fn: Callable[[R], T]) -> T:  # on the worker thread
        if self._resource is None:
            self._resource = self._opener()
        return fn(self._resource)

    async def run(self, fn: Callable[[R], T]) -> T:
        """``fn(resource)`` on the worker thread, awaited.

        :raises ClosedError: after :meth:`aclose`.
        """
        if self._closed:
            raise ClosedError(f"{self._what} is closed")
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=self._name)
        return await asyncio.get_running_loop().run_in_executor(self._pool, self._call, fn)

    def _release(self) -> None:
        resource, self._resource = self._resource, None
        if resource is not None:
            self._closer(resource)

    async def aclose(self) -> None:
        """Close the resource after any call still running (a cancelled caller does not stop a
        blocking read; it ends within its own time-out). Idempotent; never waits on that call."""
        if self._closed:
            return
        self._closed = True
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.submit(self._release)
            pool.shutdown(wait=False)
