"""Staggered trigger starts: a triggerer (re)starting a thousand triggers never stalls its loop.

A trigger's start costs the event loop a millisecond or two of plain Python (reading the
connection through Airflow's secrets machinery, parsing it, logging, its first answers). asyncio
runs every task that is ready in one turn of the loop: a thousand triggers whose start steps
become ready together (created together, or woken by one shared read) would hold the loop for a
second or more, and every other trigger's timers with it. A trigger calls :func:`start_turn`
before each such step: at most :data:`STARTS_PER_TURN` steps pass per turn of its event loop, the
others go on in the next turns, in arrival order. Nothing is held across I/O: a start waiting on
the broker never keeps another from starting.
"""

from __future__ import annotations

import asyncio
import weakref
from collections import deque

STARTS_PER_TURN = 4
"""Start steps of one event loop let through per turn of the loop."""


class _Turns:
    """Lets :data:`STARTS_PER_TURN` callers through per turn of one loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._left = STARTS_PER_TURN
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._refill_scheduled = False

    async def take(self) -> None:
        if self._left > 0 and not self._waiters:
            self._left -= 1
            self._schedule_refill()
            return
        waiter = self._loop.create_future()
        self._waiters.append(waiter)
        self._schedule_refill()
        await waiter

    def _schedule_refill(self) -> None:
        if not self._refill_scheduled:
            self._refill_scheduled = True
            self._loop.call_soon(self._refill)

    def _refill(self) -> None:  # the next turn: a new allowance, handed to the longest waiting
        self._refill_scheduled = False
        self._left = STARTS_PER_TURN
        while self._left > 0 and self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():  # a cancelled waiter takes no slot
                waiter.set_result(None)
                self._left -= 1
        if self._waiters:
            self._schedule_refill()


_turns: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Turns] = weakref.WeakKeyDictionary()


async def start_turn() -> None:
    """Wait until this loop lets one more start step through (at once when few are starting)."""
    loop = asyncio.get_running_loop()
    turns = _turns.get(loop)
    if turns is None:
        turns = _turns[loop] = _Turns(loop)
    await turns.take()
