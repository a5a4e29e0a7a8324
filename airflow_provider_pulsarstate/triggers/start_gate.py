"""Staggered trigger starts: a triggerer (re)starting a thousand triggers never stalls its loop.

A trigger's start costs the event loop a millisecond or two of plain Python (reading the
connection through Airflow's secrets machinery, parsing it, logging, its first answers). asyncio
runs every task that is ready in one turn of the loop, so a thousand triggers started together
would hold the loop for a second or more, and every other trigger's timers with it. Here at most
:data:`MAX_STARTING` triggers per event loop are in their start phase at once; the others wait
their turn (in arrival order), so one turn of the loop runs at most that many start steps.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

MAX_STARTING = 16
"""Triggers of one event loop in their start phase at once."""

_gates: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore]" = weakref.WeakKeyDictionary()


@asynccontextmanager
async def starting() -> AsyncIterator[None]:
    """Hold one of the loop's start slots for the body (a trigger's start phase)."""
    loop = asyncio.get_running_loop()
    gate = _gates.get(loop)
    if gate is None:
        gate = _gates[loop] = asyncio.Semaphore(MAX_STARTING)
    async with gate:
        yield
