"""Every asyncio loop turn of a process that ran its callbacks longer than a limit, to a file.

For diagnosis in real Airflow processes (``bench_triggerer_gc.py --slow-turns``): installed from a
``sitecustomize`` of the triggerer, it appends one line per slow turn: the time, the process and
thread, the turn's time outside the selector's ``select`` (``busy``), the thread's CPU over it, its
wait for a CPU (Linux ``schedstat``: the machine's load), the callbacks ready at its start and its
slowest callback (a task's name and coroutine). ``busy`` with little CPU and no wait for a CPU is
the thread blocked: in a system call (a write to a full socket) or waiting for the GIL.
"""

from __future__ import annotations

import asyncio.base_events
import asyncio.events
import os
import selectors
import threading
import time
from typing import Any


def _cpu_wait() -> float:
    try:
        with open("/proc/thread-self/schedstat") as f:
            return int(f.read().split()[1]) / 1e9
    except (OSError, ValueError, IndexError):
        return 0.0


def _name(handle: Any) -> str:
    owner = getattr(handle._callback, "__self__", None)
    if hasattr(owner, "get_coro"):
        return f"{owner.get_name()} {owner.get_coro()!r}"[:160]
    return repr(handle._callback)[:160]


def install(path: str, *, limit: float = 0.05) -> None:
    """Patch every event loop of this process (and of processes forked from it) to log turns
    whose callbacks ran longer than ``limit`` seconds to ``path``."""
    run_once, select, run_handle = (
        asyncio.base_events.BaseEventLoop._run_once,  # type: ignore[attr-defined]
        selectors.EpollSelector.select,
        asyncio.events.Handle._run,
    )
    state = threading.local()

    def timed_select(self: Any, timeout: float | None = None) -> Any:
        t = time.perf_counter()
        try:
            return select(self, timeout)
        finally:
            state.select = getattr(state, "select", 0.0) + time.perf_counter() - t

    def timed_handle(self: Any) -> None:
        t = time.perf_counter()
        run_handle(self)
        took = time.perf_counter() - t
        if took > getattr(state, "slowest", (0.0, ""))[0]:
            state.slowest = (took, _name(self))

    def timed_turn(self: Any) -> None:
        state.select, state.slowest = 0.0, (0.0, "")
        t0, cpu0, wait0, ready = time.perf_counter(), time.thread_time(), _cpu_wait(), len(self._ready)
        run_once(self)
        busy = time.perf_counter() - t0 - state.select
        if busy > limit:
            now = time.time()
            with open(path, "a") as f:
                f.write(
                    f"{time.strftime('%H:%M:%S', time.gmtime(now))}.{int(now % 1 * 1000):03d} pid={os.getpid()} thread={threading.current_thread().name} busy={busy:.3f} "
                    f"cpu={time.thread_time() - cpu0:.3f} cpu_wait={_cpu_wait() - wait0:.3f} ready={ready} "
                    f"slowest={state.slowest[0]:.3f} {state.slowest[1]}\n"
                )

    asyncio.base_events.BaseEventLoop._run_once = timed_turn  # type: ignore[attr-defined]
    selectors.EpollSelector.select = timed_select  # type: ignore[method-assign]
    asyncio.events.Handle._run = timed_handle  # type: ignore[method-assign]
