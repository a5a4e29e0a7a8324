"""Many async offset probes on one event loop (a triggerer running hundreds of offset triggers)."""

from __future__ import annotations

import asyncio
import time

from airflow_provider_pulsarstate import ConnectionConfig, open_backend
from airflow_provider_pulsarstate.engine.offsets import create_topic, open_async_probe, open_publisher


def test_starting_a_hundred_probes_at_once_never_stalls_the_loop(backend_config: ConnectionConfig, topic: str) -> None:
    """Each trigger opens its own probe; opening one must not do blocking work on the loop (a TLS
    context per probe cost ~40 ms each: 100 triggers starting together froze the loop ~4 s)."""
    with open_backend(backend_config) as backend:
        create_topic(backend, topic)
        with open_publisher(backend, topic) as pub:
            for i in range(5):
                pub.send(b"m%d" % i)
            pub.flush(timeout=30)

    async def scenario() -> tuple[float, list[dict[int, int]]]:
        worst = 0.0
        stop = asyncio.Event()

        async def ticker() -> None:
            nonlocal worst
            last = time.perf_counter()
            while not stop.is_set():
                await asyncio.sleep(0.005)
                now = time.perf_counter()
                worst = max(worst, now - last)
                last = now

        tick = asyncio.create_task(ticker())
        await asyncio.sleep(0.05)
        probes = [open_async_probe(backend_config) for _ in range(100)]
        try:
            ends = await asyncio.gather(*(p.end_offsets(topic) for p in probes))
        finally:
            await asyncio.gather(*(p.aclose() for p in probes))
            stop.set()
            await tick
        return worst, ends

    worst, ends = asyncio.run(scenario())
    assert all(sum(e.values()) == sum(ends[0].values()) and sum(e.values()) >= 5 for e in ends)
    assert worst < 0.5, f"the event loop stalled {worst:.2f}s while 100 probes started"
