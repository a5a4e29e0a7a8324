"""Drive a trigger to its first event on a real asyncio loop, and measure whether it blocked the loop."""

from __future__ import annotations

import asyncio
import os
from typing import Any

BLOCKING_CONTROL_SECONDS = 2.0
"""How long the control tests' probe blocks the loop (``time.sleep``): what the ticker must catch."""
LOOP_LAG_LIMIT = 1.5
"""Worst ticker lateness (s) a non-blocking trigger may show: above what a 2-vCPU CI machine with
every CPU busy was seen to add (1.24 s once, at load 12, beyond the time spent waiting for a CPU),
below the :data:`BLOCKING_CONTROL_SECONDS` a blocking control call costs
(see test_the_ticker_detects_a_blocking_probe)."""


def _runnable_wait() -> float:
    """Seconds the threads of this process have spent runnable but waiting for a CPU (Linux
    ``schedstat``; 0 elsewhere). All threads, not only the loop's: a thread holding the GIL that
    the machine's load keeps off a CPU holds up the loop's thread too (it waits for the GIL)."""
    total = 0.0
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return 0.0
    for tid in tasks:
        try:
            with open(f"/proc/self/task/{tid}/schedstat") as f:
                total += int(f.read().split()[1]) / 1e9
        except (OSError, ValueError, IndexError):
            continue  # a thread that ended meanwhile
    return total


class LoopLag:
    """``async with LoopLag() as lag:`` ticks every ``tick`` seconds on the running loop meanwhile;
    ``lag.worst`` is the largest lateness of a tick (blocking work on the loop shows up there).

    The time the process's threads spent waiting for a CPU while runnable is not counted: that is the
    machine's load, not the loop being blocked (a blocking call, sleeping or computing, still counts).
    """

    def __init__(self, tick: float = 0.01) -> None:
        self.tick, self.worst, self.ticks = tick, 0.0, 0
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while not self._stop.is_set():
            before, queued = loop.time(), _runnable_wait()
            await asyncio.sleep(self.tick)
            late = loop.time() - before - self.tick - (_runnable_wait() - queued)
            self.worst = max(self.worst, late)
            self.ticks += 1

    async def __aenter__(self) -> LoopLag:
        self._task = asyncio.create_task(self._run())
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._stop.set()
        assert self._task is not None
        await self._task


async def drive(trigger: Any, *, during: Any = None, tick: float = 0.01, limit: float = 120) -> tuple[Any, float, int]:
    """Run ``trigger`` to its first event while ``during()`` runs and a coroutine ticks every
    ``tick`` seconds; return the event, the ticker's worst lateness and its tick count."""
    async with LoopLag(tick) as lag:
        side = asyncio.create_task(during()) if during else None
        runner = trigger.run()
        event = await asyncio.wait_for(runner.__anext__(), limit)
        await runner.aclose()
        if side:
            await side
    return event, lag.worst, lag.ticks


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


async def close_shared_streams(tasks: list[asyncio.Future[Any]], streams: list[Any], producers: list[Any]) -> None:
    """Cancel the tasks waiting on shared streams, then close each stream and its producer."""
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    for stream, producer in zip(streams, producers, strict=True):
        await stream.aclose()
        await producer.aclose()
