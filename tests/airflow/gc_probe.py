"""A watcher that reports, from inside a real trigger runner, what its full garbage collections walk.

``GcProbeTrigger(report=path, expect=n)`` waits until ``n`` asyncio tasks run in its process (the
other triggers started), then writes JSON to ``report``: its pid and parent pid, the objects frozen
(``gc.get_freeze_count()``), the objects a full collection walks (every tracked object not frozen),
the running tasks, and the full collections seen since it started with the longest pause (CPU time
of the collecting thread). It never fires.
"""

from __future__ import annotations

import asyncio
import gc
import json
import os
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from airflow.triggers.base import BaseEventTrigger, TriggerEvent


class _FullCollections:
    def __init__(self) -> None:
        self.count, self.longest, self._started = 0, 0.0, 0.0

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if info.get("generation") != 2:
            return
        if phase == "start":
            self._started = time.thread_time()
        else:
            self.count += 1
            self.longest = max(self.longest, time.thread_time() - self._started)


class GcProbeTrigger(BaseEventTrigger):
    def __init__(self, *, report: str, expect: int) -> None:
        super().__init__()
        self.report, self.expect = report, expect

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return f"{type(self).__module__}.{type(self).__qualname__}", {"report": self.report, "expect": self.expect}

    async def run(self) -> AsyncIterator[TriggerEvent]:
        collections = _FullCollections()
        gc.callbacks.append(collections)
        try:
            deadline = time.monotonic() + 60
            while len(asyncio.all_tasks()) < self.expect and time.monotonic() < deadline:
                await asyncio.sleep(0.2)
            await asyncio.sleep(2)  # the last ones' first reads
            objects = gc.get_objects()  # the permanent generation is not listed
            walked = len(objects)
            kinds: dict[str, int] = {}
            for obj in objects:
                kinds[type(obj).__name__] = kinds.get(type(obj).__name__, 0) + 1
            del objects
            report = {
                "pid": os.getpid(),
                "ppid": os.getppid(),
                "frozen": gc.get_freeze_count(),
                "walked": walked,
                "tasks": len(asyncio.all_tasks()),
                "full_collections": collections.count,
                "longest_full_collection": collections.longest,
                "walked_types": dict(sorted(kinds.items(), key=lambda kv: -kv[1])[:12]),
            }
            tmp = Path(self.report + ".tmp")
            tmp.write_text(json.dumps(report))
            tmp.replace(self.report)
            await asyncio.Event().wait()
        finally:
            gc.callbacks.remove(collections)
        yield TriggerEvent(None)  # pragma: no cover - never reached
