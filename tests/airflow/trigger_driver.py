"""Drive a trigger to its first event on a real asyncio loop, and measure whether it blocked the loop."""

from __future__ import annotations

import asyncio
from typing import Any

LOOP_LAG_LIMIT = 0.6
"""Worst ticker lateness (s) a non-blocking trigger may show: above what a loaded 2-vCPU CI machine
adds, below the 1 s a blocking control call costs (see test_the_ticker_detects_a_blocking_probe)."""


async def drive(trigger: Any, *, during: Any = None, tick: float = 0.01, limit: float = 120) -> tuple[Any, float, int]:
    """Run ``trigger`` to its first event while ``during()`` runs and a coroutine ticks every
    ``tick`` seconds; return the event, the ticker's worst lateness and its tick count."""
    worst, ticks, stop = 0.0, 0, asyncio.Event()

    async def ticker() -> None:
        nonlocal worst, ticks
        loop = asyncio.get_running_loop()
        while not stop.is_set():
            before = loop.time()
            await asyncio.sleep(tick)
            worst = max(worst, loop.time() - before - tick)
            ticks += 1

    ticking = asyncio.create_task(ticker())
    side = asyncio.create_task(during()) if during else None
    try:
        runner = trigger.run()
        event = await asyncio.wait_for(runner.__anext__(), limit)
        await runner.aclose()
        if side:
            await side
    finally:
        stop.set()
        await ticking
    return event, worst, ticks


async def cancel_midway(trigger: Any, *, after: float = 0.5) -> None:
    """Start ``trigger``, cancel it after ``after`` seconds (a triggerer shutting down), expect the cancellation."""
    runner = trigger.run()
    task = asyncio.ensure_future(runner.__anext__())
    await asyncio.sleep(after)
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        pass
    else:
        raise AssertionError("the trigger fired instead of being cancelled")
    await runner.aclose()
