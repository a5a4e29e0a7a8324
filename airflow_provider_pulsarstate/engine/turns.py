"""Turns of an event loop: many tasks that become ready together go on a few per turn.

A thousand triggers woken together (created together, or answered by one shared read) each doing
a fraction of a millisecond of plain Python before their next await would hold the loop for a
second or more in one turn, and every other task's timers with it. A task awaits
:func:`take_turn` before such a step: at most :data:`STARTS_PER_TURN` steps pass per turn of its
event loop, the others go on in the next turns, in arrival order. Nothing is held across I/O.
"""

from __future__ import annotations

import asyncio
import weakref
from collections import deque

STARTS_PER_TURN = 4
"""Steps (trigger starts, wake-ups answered by one shared read) of one event loop let through per turn of the loop."""


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


async def take_turn() -> None:
    """Wait until this loop lets one more step through (at once when few are taking turns)."""
    loop = asyncio.get_running_loop()
    turns = _turns.get(loop)
    if turns is None:
        turns = _turns[loop] = _Turns(loop)
    await turns.take()
