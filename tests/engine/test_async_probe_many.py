"""Many async offset probes on one event loop (a triggerer running hundreds of offset triggers)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from airflow_provider_pulsarstate import ConnectionConfig, open_backend
from airflow_provider_pulsarstate.engine.backends import admin_async
from airflow_provider_pulsarstate.engine.offsets import create_topic, open_async_probe, open_publisher
from airflow_provider_pulsarstate.engine.retry import within
from tests.conftest import pulsar_config


def test_starting_a_hundred_probes_at_once_never_stalls_the_loop(backend_config: ConnectionConfig, topic: str) -> None:
    """Each trigger opens its own probe; opening one must not do blocking work on the loop (a TLS
    context per probe cost ~40 ms each: 100 triggers starting together froze the loop ~4 s)."""
    with open_backend(backend_config) as backend:
        create_topic(backend, topic)
        with open_publisher(backend, topic) as pub:
            for i in range(5):
                pub.send(b"m%d" % i)
            pub.flush(timeout=30)

    async def scenario() -> tuple[float, float, list[dict[int, int]]]:
        # The loop thread's CPU time between two ticks is blocking work done on the loop; wall time
        # also counts the OS running other processes (a loaded CI machine), so it is only reported.
        worst_wall = worst_cpu = 0.0
        stop = asyncio.Event()

        async def ticker() -> None:
            nonlocal worst_wall, worst_cpu
            last, last_cpu = time.perf_counter(), time.thread_time()
            while not stop.is_set():
                await asyncio.sleep(0.005)
                now, now_cpu = time.perf_counter(), time.thread_time()
                worst_wall, worst_cpu = max(worst_wall, now - last), max(worst_cpu, now_cpu - last_cpu)
                last, last_cpu = now, now_cpu

        tick = asyncio.create_task(ticker())
        await asyncio.sleep(0.05)
        probes = [open_async_probe(backend_config) for _ in range(100)]
        try:
            # bounded, so a hang fails here in two minutes instead of at the suite's per-test limit
            ends = await within(asyncio.gather(*(p.end_offsets(topic) for p in probes)), 120)
        finally:
            await asyncio.gather(*(p.aclose() for p in probes))
            stop.set()
            await tick
        return worst_wall, worst_cpu, ends

    worst_wall, worst_cpu, ends = asyncio.run(scenario())
    assert all(sum(e.values()) == sum(ends[0].values()) and sum(e.values()) >= 5 for e in ends)
    print(f"worst loop stall while 100 probes started: {worst_wall * 1000:.0f} ms wall, {worst_cpu * 1000:.0f} ms CPU")
    assert worst_cpu < 1.0, f"the event loop did {worst_cpu:.2f}s of blocking work at once while 100 probes started"


@pytest.mark.pulsar
def test_probes_on_one_loop_share_http_clients_and_the_last_one_out_closes_each(pulsar_broker: object, topic: str) -> None:
    config = pulsar_config(pulsar_broker)
    per_client = admin_async.PROBES_PER_CLIENT
    with open_backend(config) as backend:
        create_topic(backend, topic)

    async def scenario() -> None:
        loop = asyncio.get_running_loop()

        def clients() -> list[tuple[Any, int]]:
            return [(c, n) for entries in admin_async._CLIENTS.get(loop, {}).values() for c, n in entries]

        probes = [open_async_probe(config) for _ in range(per_client + 1)]
        assert clients() == []  # no I/O, no client before first use
        for p in probes:
            assert await p.end_offsets(topic) == {0: 0}
        (first, n1), (second, n2) = clients()
        assert (n1, n2) == (per_client, 1)
        await probes[0].aclose()
        await probes[0].aclose()  # idempotent: does not release another probe's share
        assert clients() == [(first, per_client - 1), (second, 1)]
        assert not first.is_closed and await probes[1].end_offsets(topic) == {0: 0}
        late = open_async_probe(config)  # joins the client with room
        assert await late.end_offsets(topic) == {0: 0} and clients() == [(first, per_client), (second, 1)]
        await probes[-1].aclose()
        assert second.is_closed and clients() == [(first, per_client)]
        for p in [*probes[1:-1], late]:
            await p.aclose()
        assert first.is_closed and clients() == []
        other = open_async_probe(pulsar_config(pulsar_broker, auth_token="t0ken"))  # other credentials: own client
        d = open_async_probe(config)
        assert await d.end_offsets(topic) == {0: 0}
        assert await other.end_offsets(topic) == {0: 0}  # the test broker ignores tokens
        assert len(clients()) == 2
        await other.aclose()
        await d.aclose()
        assert clients() == []

    asyncio.run(scenario())
