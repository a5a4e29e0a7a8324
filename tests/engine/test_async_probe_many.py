"""Many async offset probes on one event loop (a triggerer running hundreds of offset triggers)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from pathlib import Path
from typing import Any

import httpx
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


def _admin_connections(admin_url: str) -> int:
    """Established TCP connections of this process to the admin port."""
    port = int(admin_url.rsplit(":", 1)[1].split("/")[0])
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            target = os.readlink(f"/proc/self/fd/{fd}")
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    count = 0
    for table in ("/proc/self/net/tcp", "/proc/self/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            cols = line.split()
            if cols[3] == "01" and cols[9] in inodes and int(cols[2].rsplit(":", 1)[1], 16) == port:
                count += 1
    return count


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str]]:
    """Every admin HTTP request sent by this process (method, path)."""
    requests: list[tuple[str, str]] = []
    original = httpx.AsyncClient.request

    async def counting(self: httpx.AsyncClient, method: str, url: Any, **kwargs: Any) -> httpx.Response:
        requests.append((method, str(url)))
        return await original(self, method, url, **kwargs)

    monkeypatch.setattr(httpx.AsyncClient, "request", counting)
    return requests


@pytest.mark.pulsar
def test_a_thousand_probes_share_one_client_two_connections_and_their_requests(
    pulsar_broker: Any, topic: str, sent: list[tuple[str, str]]
) -> None:
    config = pulsar_config(pulsar_broker)
    with open_backend(config) as backend:
        create_topic(backend, topic)

    async def scenario() -> tuple[list[dict[int, int]], int]:
        probes = [open_async_probe(config, freshness=1.0) for _ in range(1000)]
        try:
            ends = await within(asyncio.gather(*(p.end_offsets(topic) for p in probes)), 120)
            return ends, _admin_connections(config.resolved_admin_url)
        finally:
            await asyncio.gather(*(p.aclose() for p in probes))
            assert admin_async._CLIENTS.get(asyncio.get_running_loop()) == {}  # closed with the last probe

    ends, connections = asyncio.run(scenario())
    assert ends == [{0: 0}] * 1000
    # one partitions lookup and one end-of-topic read, whoever asked (each probe: 2 requests before)
    assert len(sent) <= 4, sent[:6]
    assert connections <= admin_async.CONNECTIONS_PER_CLIENT == 2


@pytest.mark.pulsar
def test_without_freshness_every_answer_is_sent_after_the_request(
    pulsar_broker: Any, topic: str, sent: list[tuple[str, str]]
) -> None:
    config = pulsar_config(pulsar_broker)
    with open_backend(config) as backend:
        create_topic(backend, topic)

    async def scenario() -> list[dict[int, int]]:
        probes = [open_async_probe(config) for _ in range(3)]
        try:
            seen = [await probes[0].end_offsets(topic)]
            sent.clear()
            with open_backend(config) as backend, open_publisher(backend, topic) as pub:
                pub.send(b"one")
                pub.flush(timeout=30)
            seen += await asyncio.gather(*(p.end_offsets(topic) for p in probes))  # asked together: shared
            return seen
        finally:
            await asyncio.gather(*(p.aclose() for p in probes))

    assert asyncio.run(scenario()) == [{0: 0}, {0: 1}, {0: 1}, {0: 1}]
    assert len(sent) == 2, sent  # the partitions and the end, asked after the publish, shared by the three


@pytest.mark.pulsar
def test_a_cancelled_probe_never_cancels_a_shared_request(pulsar_broker: Any, topic: str) -> None:
    config = pulsar_config(pulsar_broker)
    with open_backend(config) as backend:
        create_topic(backend, topic)

    async def scenario() -> dict[int, int]:
        first, second = open_async_probe(config, freshness=1.0), open_async_probe(config, freshness=1.0)
        try:
            asked = asyncio.ensure_future(first.end_offsets(topic))
            other = asyncio.ensure_future(second.end_offsets(topic))
            await asyncio.sleep(0)
            asked.cancel()
            return await within(other, 60)
        finally:
            await first.aclose()
            await second.aclose()

    assert asyncio.run(scenario()) == {0: 0}


@pytest.mark.pulsar
def test_a_probe_arriving_as_the_shared_client_is_made_joins_it(pulsar_broker: Any, topic: str) -> None:
    """A probe asking in the very turn the client's making completes (before any callback of it
    ran) gets the client: it once spun the loop forever waiting for a callback that never ran."""
    config = pulsar_config(pulsar_broker)
    with open_backend(config) as backend:
        create_topic(backend, topic)

    async def scenario() -> list[dict[int, int]]:
        first, second = open_async_probe(config), open_async_probe(config)
        try:
            asked = asyncio.ensure_future(first.end_offsets(topic))
            making = admin_async._MAKING.setdefault(asyncio.get_running_loop(), {})
            while not making:
                await asyncio.sleep(0)
            future = next(iter(making.values()))
            while not future.done():
                await asyncio.sleep(0)
            return [await within(second.end_offsets(topic), 60), await within(asked, 60)]
        finally:
            await first.aclose()
            await second.aclose()

    assert asyncio.run(scenario()) == [{0: 0}, {0: 0}]
