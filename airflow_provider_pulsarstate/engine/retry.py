"""Bounded exponential back-off used by every wait loop."""

from __future__ import annotations

import random
import time


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
