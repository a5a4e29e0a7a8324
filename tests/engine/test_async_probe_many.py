"""Many async offset probes on one event loop (a triggerer running hundreds of offset triggers)."""

from __future__ import annotations

import asyncio
import time

import pytest

from airflow_provider_pulsarstate import ConnectionConfig, open_backend
from airflow_provider_pulsarstate.engine.offsets import create_topic, open_async_probe, open_publisher
from airflow_provider_pulsarstate.engine.backends import admin_async as pulsar_async
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
            # bounded, so a hang fails here in two minutes instead of at the suite's per-test limit
            ends = await within(asyncio.gather(*(p.end_offsets(topic) for p in probes)), 120)
        finally:
            await asyncio.gather(*(p.aclose() for p in probes))
            stop.set()
            await tick
        return worst, ends

    worst, ends = asyncio.run(scenario())
    assert all(sum(e.values()) == sum(ends[0].values()) and sum(e.values()) >= 5 for e in ends)
    print(f"worst loop stall while 100 probes started: {worst * 1000:.0f} ms")
    assert worst < 0.5, f"the event loop stalled {worst:.2f}s while 100 probes started"


@pytest.mark.pulsar
def test_probes_on_one_loop_share_one_http_client_and_the_last_one_out_closes_it(pulsar_broker: object, topic: str) -> None:
    config = pulsar_config(pulsar_broker)
    with open_backend(config) as backend:
        create_topic(backend, topic)

    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        a, b = open_async_probe(config), open_async_probe(config)
        assert loop not in pulsar_async._CLIENTS or not pulsar_async._CLIENTS[loop]  # no I/O before use
        assert await a.end_offsets(topic) == {0: 0} and await b.end_offsets(topic) == {0: 0}
        (client, users), = pulsar_async._CLIENTS[loop].values()
        assert users == 2
        await a.aclose()
        await a.aclose()  # idempotent: does not release b's share
        assert not client.is_closed and await b.end_offsets(topic) == {0: 0}
        await b.aclose()
        assert client.is_closed and not pulsar_async._CLIENTS[loop]
        c = open_async_probe(config)  # a later probe gets a fresh client
        assert await c.end_offsets(topic) == {0: 0}
        await c.aclose()
        other = open_async_probe(pulsar_config(pulsar_broker, auth_token="t0ken"))  # other credentials: own client
        d = open_async_probe(config)
        await d.end_offsets(topic)
        assert await other.end_offsets(topic) == {0: 0}  # the test broker ignores tokens
        assert len(pulsar_async._CLIENTS[loop]) == 2
        await other.aclose()
        await d.aclose()
        assert not pulsar_async._CLIENTS[loop]

    asyncio.run(scenario())
