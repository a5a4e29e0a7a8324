"""Bounded exponential back-off used by every wait loop, and a cancellation-safe time bound for awaits."""

from __future__ import annotations

import asyncio
import random
import sys
import time
from collections.abc import Awaitable
from typing import TypeVar

T = TypeVar("T")


class Backoff:
    """Sleeps that grow from ``initial`` to ``maximum`` seconds, never past a deadline.

    Jittered so that processes that collided once do not collide again in lock-step.
    """

    def __init__(self, *, initial: float = 0.01, maximum: float = 1.0, factor: float = 2.0) -> None:
        self._delay = initial
        self._maximum = maximum
        self._factor = factor

    def next_delay(self) -> float:
        """The next jittered delay in seconds (and grow the one after); for async waits."""
        delay = self._delay * random.uniform(0.5, 1.0)
        self._delay = min(self._delay * self._factor, self._maximum)
        return delay

    def sleep(self, deadline: float | None = None) -> None:
        """Sleep for the next delay (cut short at ``deadline``, a ``time.monotonic`` value)."""
        delay = self.next_delay()
        if deadline is not None:
            delay = max(0.0, min(delay, deadline - time.monotonic()))
        time.sleep(delay)


async def within(awaitable: Awaitable[T], timeout: float | None) -> T:
    """Await ``awaitable`` for at most ``timeout`` seconds; cancel it and raise ``asyncio.TimeoutError`` after.

    Use this instead of ``asyncio.wait_for``: before Python 3.12 that returns the inner result when
    the caller is cancelled just as the inner await completes, swallowing the cancellation
    (CPython gh-86296), so a trigger the triggerer cancels could go on polling for ever. Here a
    cancellation of the caller always propagates.
    """
    if sys.version_info >= (3, 11):
        async with asyncio.timeout(timeout):
            return await awaitable
    task = asyncio.ensure_future(awaitable)
    try:
        done, _ = await asyncio.wait({task}, timeout=timeout)
    except BaseException:
        task.cancel()
        raise
    if not done:
        task.cancel()
        await asyncio.wait({task})
        raise asyncio.TimeoutError
    return task.result()
