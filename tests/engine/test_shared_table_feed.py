"""Async table feeds share one reader of a table's log per process (both back ends): one reader
for many feeds, closed with the last; each feed gets exactly what a TableFeed of its own would
give it (its watermark, its prefix), also when it starts behind the others; polls share reads;
and a feed cancelled mid-read costs the others nothing."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from airflow_provider_pulsarstate.engine.backends.base import Backend
from airflow_provider_pulsarstate.engine.backends.embedded import EmbeddedBackend
from airflow_provider_pulsarstate.engine.backends.pulsar import PulsarBackend
from airflow_provider_pulsarstate.engine.config import ConnectionConfig
from airflow_provider_pulsarstate.engine.errors import CommitNotFoundError, TableNotFoundError
from airflow_provider_pulsarstate.engine.recipes import shared_table_feed
from airflow_provider_pulsarstate.engine.recipes.shared_table_feed import AsyncTableFeed, open_table_readers
from airflow_provider_pulsarstate.engine.recipes.table import StateTable
from airflow_provider_pulsarstate.engine.recipes.table_feed import TableFeed


@pytest.fixture
def table(backend: Backend, topic: str) -> Iterator[StateTable]:
    t = StateTable(backend, topic, acquire_timeout=30.0, writer_idle_timeout=0.1, checkpoint_after_bytes=None)
    yield t
    t.close()


class LiveReaders:
    """Readers of ``topic`` open now (and the most at once), on every back end but ``excluded``."""

    def __init__(self) -> None:
        self.now = 0
        self.most = 0
        self._lock = threading.Lock()

    def opened(self) -> None:
        with self._lock:
            self.now += 1
            self.most = max(self.most, self.now)

    def closed(self) -> None:
        with self._lock:
            self.now -= 1


@contextmanager
def live_readers(monkeypatch: pytest.MonkeyPatch, topic: str, excluded: Backend) -> Iterator[LiveReaders]:
    live = LiveReaders()
    for cls in (EmbeddedBackend, PulsarBackend):
        original = cls.create_reader

        def create_reader(self: Any, name: str, *args: Any, _original: Any = original, **kwargs: Any) -> Any:
            reader = _original(self, name, *args, **kwargs)
            if name == topic and self is not excluded:
                live.opened()
                close, done = reader.close, []

                def closing() -> None:
                    if not done:
                        done.append(True)
                        live.closed()
                    close()

                reader.close = closing
            return reader

        monkeypatch.setattr(cls, "create_reader", create_reader)
    yield live


async def until(predicate: Any, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


def own(commits: list[Any]) -> list[tuple[int, int | None, int | None]]:
    return [(c.offset, c.prefix_sets, c.prefix_deletes) for c in commits]


def test_feeds_of_one_table_share_one_reader_closed_with_the_last(
    backend_config: ConnectionConfig,
    backend: Backend,
    topic: str,
    table: StateTable,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    table.put("setup", {"v": 0})
    n = 20

    async def scenario() -> None:
        with live_readers(monkeypatch, topic, backend) as live:
            feeds = [AsyncTableFeed(backend_config, topic, after=None, key_prefix=f"p{i}-") for i in range(n)]
            starts = await asyncio.gather(*(f.start() for f in feeds))
            assert set(starts) == {table.manager.applied_offset}
            assert open_table_readers().get(topic) == 1 and live.now == 1 and live.most <= 2, (live.now, live.most)
            offsets = []
            for i in range(n):
                await asyncio.to_thread(table.put, f"p{i}-a", {"v": i})
                offsets.append(table.manager.applied_offset)
            polls = await asyncio.gather(*(f.poll() for f in feeds))
            for i, (commits, upto, more) in enumerate(polls):  # every commit, each feed's own counts
                assert own(commits) == [(o, int(j == i), 0) for j, o in enumerate(offsets)] and upto == offsets[-1]
                assert not more
            for f in feeds[::2]:  # half leave; the others go on, exactly as before
                await f.aclose()
            await asyncio.to_thread(table.delete, "p1-a")
            gone = table.manager.applied_offset
            for i, f in enumerate(feeds):
                if i % 2:
                    commits, _, _ = await f.poll()
                    assert own(commits) == [(gone, 0, int(i == 1))]
            assert open_table_readers().get(topic) == 1 and live.most <= 2
            for f in feeds[1::2]:
                await f.aclose()
            await until(
                lambda: topic not in open_table_readers() and live.now == 0,
                "the shared reader closed with the last feed",
            )

    asyncio.run(scenario())


def test_a_feed_starting_behind_the_others_gets_what_a_feed_of_its_own_would(
    backend_config: ConnectionConfig,
    backend: Backend,
    topic: str,
    table: StateTable,
) -> None:
    table.put("sku-0", {"p": 0})
    watermark = table.manager.applied_offset
    table.put("sku-1", {"p": 1})
    table.put("eur-1", {"p": 1})
    table.delete("sku-0")

    async def scenario() -> None:
        ahead = AsyncTableFeed(backend_config, topic, after=None)  # at the tail
        tail = await ahead.start()
        await asyncio.to_thread(table.put, "sku-2", {"p": 2})
        assert own((await ahead.poll()).commits) == [(table.manager.applied_offset, None, None)]
        behind = AsyncTableFeed(backend_config, topic, after=watermark, key_prefix="sku-")
        other = AsyncTableFeed(backend_config, topic, after=tail, key_prefix="eur-")
        assert await asyncio.gather(behind.start(), other.start()) == [watermark, tail]
        got_behind, got_other = await asyncio.gather(behind.poll(), other.poll())
        with TableFeed(backend, topic, after=watermark, key_prefix="sku-") as mine:
            assert got_behind.commits == mine.poll() and len(got_behind.commits) == 4
        with TableFeed(backend, topic, after=tail, key_prefix="eur-") as mine:
            assert got_other.commits == mine.poll()
        assert open_table_readers().get(topic) == 1
        # past the last commit: refused, as a TableFeed does; the others are not disturbed
        refused = AsyncTableFeed(backend_config, topic, after=tail + 100)
        with pytest.raises(CommitNotFoundError, match="lies past the last commit"):
            await refused.start()
        await refused.aclose()
        for f in (ahead, behind, other):
            await f.aclose()
        await until(lambda: topic not in open_table_readers(), "the reader closed")

    asyncio.run(scenario())


def test_a_backlog_comes_in_polls_of_at_most_limit(
    backend_config: ConnectionConfig, table: StateTable, topic: str
) -> None:
    table.put("k0", {"v": 0})
    start = table.manager.applied_offset
    for i in range(1, 8):
        table.put(f"k{i}", {"v": i})

    async def scenario() -> list[Any]:
        feed = AsyncTableFeed(backend_config, topic, after=start)
        await feed.start()
        polls = [await feed.poll(limit=3), await feed.poll(limit=3), await feed.poll(limit=3)]
        await feed.aclose()
        return polls

    first, second, third = asyncio.run(scenario())
    assert [len(p.commits) for p in (first, second, third)] == [3, 3, 1]
    assert (first.more, second.more, third.more) == (True, True, False)
    assert first.upto == first.commits[-1].offset and third.upto == table.manager.applied_offset


def test_polls_together_share_reads(
    backend_config: ConnectionConfig,
    table: StateTable,
    topic: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    table.put("k", {"v": 0})
    reads = []
    original = shared_table_feed._LogTap.read

    def counted(self: Any, prefixes: Any) -> Any:
        reads.append(1)
        time.sleep(0.05)  # a read takes a while: polls arriving meanwhile wait for the next one
        return original(self, prefixes)

    monkeypatch.setattr(shared_table_feed._LogTap, "read", counted)

    async def scenario() -> list[Any]:
        feeds = [AsyncTableFeed(backend_config, topic, after=None, key_prefix=f"p{i}-") for i in range(30)]
        await asyncio.gather(*(f.start() for f in feeds))
        started = len(reads)
        await asyncio.to_thread(table.put, "p3-x", {"v": 1})
        polls = await asyncio.gather(*(f.poll() for f in feeds))  # freshness 0: each needs a read after its call
        assert len(reads) - started <= 2, len(reads) - started
        for f in feeds:
            await f.aclose()
        return polls

    polls = asyncio.run(scenario())
    assert [sum(c.prefix_sets for c in p.commits) for p in polls] == [int(i == 3) for i in range(30)]


def test_a_feed_cancelled_mid_read_does_not_disturb_the_others(
    backend_config: ConnectionConfig,
    table: StateTable,
    topic: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    table.put("k", {"v": 0})
    gate, entered = threading.Event(), threading.Event()
    original = shared_table_feed._LogTap.read

    def gated(self: Any, prefixes: Any) -> Any:
        if not gate.is_set():
            entered.set()
            gate.wait(30)
        return original(self, prefixes)

    async def scenario() -> None:
        first = AsyncTableFeed(backend_config, topic, after=None, key_prefix="a-")
        second = AsyncTableFeed(backend_config, topic, after=None, key_prefix="b-")
        await asyncio.gather(first.start(), second.start())
        monkeypatch.setattr(shared_table_feed._LogTap, "read", gated)
        await asyncio.to_thread(table.put, "b-1", {"v": 1})
        asking = asyncio.ensure_future(first.poll())  # starts the shared read, which blocks
        assert await asyncio.to_thread(entered.wait, 30)
        waiting = asyncio.ensure_future(second.poll())
        await asyncio.sleep(0.1)
        asking.cancel()  # the trigger that asked for the read is cancelled mid-read and leaves
        await asyncio.gather(asking, return_exceptions=True)
        await first.aclose()
        gate.set()
        commits, upto, _ = await asyncio.wait_for(waiting, 30)
        assert own(commits) == [(table.manager.applied_offset, 1, 0)] and upto == table.manager.applied_offset
        assert open_table_readers().get(topic) == 1
        await asyncio.to_thread(table.put, "b-2", {"v": 2})
        assert own((await second.poll()).commits) == [(table.manager.applied_offset, 1, 0)]
        await second.aclose()
        await until(lambda: topic not in open_table_readers(), "the reader closed")

    asyncio.run(scenario())


def test_a_feed_refused_alone_closes_the_reader(
    backend_config: ConnectionConfig, table: StateTable, topic: str
) -> None:
    table.put("k", {"v": 0})

    async def scenario() -> None:
        refused = AsyncTableFeed(backend_config, topic, after=table.manager.applied_offset + 5)
        with pytest.raises(CommitNotFoundError):
            await refused.start()
        await refused.aclose()
        await until(lambda: topic not in open_table_readers(), "the reader closed with the only (refused) feed")

    asyncio.run(scenario())


def test_a_missing_table_is_reported_to_every_feed_starting_together(
    backend_config: ConnectionConfig, topic: str
) -> None:
    async def scenario() -> list[Any]:
        feeds = [AsyncTableFeed(backend_config, topic, after=None) for _ in range(5)]
        out = await asyncio.gather(*(f.start() for f in feeds), return_exceptions=True)
        for f in feeds:
            await f.aclose()
        return out

    assert all(isinstance(r, TableNotFoundError) for r in asyncio.run(scenario()))
    assert topic not in open_table_readers()
