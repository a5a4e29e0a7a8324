"""Table feeds for async code: one reader of a table's log per process, shared by every feed.

A triggerer may run a thousand ``StateChangeTrigger`` streams on one table, each with its own key
prefix and watermark. Each with its own :class:`~.table_feed.TableFeed` would mean a thousand log
readers (a SQLite connection, or a Pulsar reader, each), a thousand replays at start and a
thousand reads per poll interval. Here, per (connection, table, event loop):

* **one reader** (a :class:`~.table_feed_taps.LogTap` on the process-wide worker pool) reads the
  log forward and keeps each new record in counts: over every key, and under each key prefix some
  feed watches (never rows). It is opened by the first :class:`AsyncTableFeed` that starts and
  closed with the last one (:func:`open_table_readers` counts them);
* each feed keeps only its **own watermark** (a cursor over the shared records) and gets exactly
  the commits :class:`~.table_feed.TableFeed` would give it: every committed record after its
  watermark, with its own prefix counts;
* **reads are shared**: a poll is answered from a read of the log that started at most
  ``freshness`` seconds before the poll was called (0: one that started after it), and polls that
  arrive together share one read; feeds that start together share one replay;
* a feed starting from a watermark older than the shared records (or with a prefix not counted
  that far back) is caught up by one extra replay from the newest checkpoint manifest at or
  before that watermark, shared by the feeds starting together, on the worker pool;
* every read runs on the pool and its result is kept even when the feed that asked for it was
  cancelled meanwhile: a cancelled feed never costs the others a record.

Records are kept until every feed's watermark passed them.
"""

from __future__ import annotations

import asyncio
import bisect
import weakref
from collections import Counter
from typing import Any, NamedTuple

from airflow_provider_pulsarstate.engine.config import ConnectionConfig
from airflow_provider_pulsarstate.engine.errors import ClosedError, CommitNotFoundError, ConfigurationError
from airflow_provider_pulsarstate.engine.recipes.table_feed import (
    TableCommit,
    _check_offset,
)
from airflow_provider_pulsarstate.engine.recipes.table_feed_taps import (
    CountedRecord,
    LogTap,
    TableTaps,
    open_table_readers,
)
from airflow_provider_pulsarstate.engine.worker_thread import (
    WorkerThread,
    close_on_shared_backend,
    open_on_shared_backend,
)

__all__ = ["AsyncTableFeed", "FeedPoll", "open_table_readers"]

_LogTap = LogTap  # the reader's class under its earlier name (tests count its reads)


class FeedPoll(NamedTuple):
    """One :meth:`AsyncTableFeed.poll`.

    :ivar commits: the commits after the feed's previous watermark, in offset order.
    :ivar upto: the feed's watermark now (every commit up to it was returned).
    :ivar more: ``limit`` cut the answer short: more commits are already read, poll again at once.
    """

    commits: list[TableCommit]
    upto: int
    more: bool


# ================================================================================ sharing (event loop)
class _Hub:
    """The shared reader of one (connection, table) on one event loop, and the feeds' cursors.

    All its state is touched on the loop only; reads run on the pool, one at a time, as *cycles*
    driven by a task of the hub's own (so a cancelled caller never loses a read's records).
    """

    def __init__(self, config: ConnectionConfig, topic: str, registry: dict[Any, _Hub]) -> None:
        self.config, self.topic = config, topic
        self._registry = registry
        self._worker: WorkerThread[tuple[TableTaps, ConnectionConfig]] = WorkerThread(
            lambda: open_on_shared_backend(config, lambda backend: TableTaps(backend, config, topic)),
            close_on_shared_backend,
            name="pulsarstate-table-feed",
            what=f"the shared table feed of {topic}",
        )
        self.members: set[AsyncTableFeed] = set()  # entered and not left (the hub closes after the last)
        self.feeds: set[AsyncTableFeed] = set()  # started: each has its watermark
        self.joining: set[AsyncTableFeed] = set()
        self._prefix_users: Counter[str] = Counter()
        self._records: list[CountedRecord] = []  # (base, position], in offset order
        self._position: int | None = None
        self._base: int | None = None
        self._since: dict[str, int] = {}  # prefix -> records after this offset carry its counts
        self._done_started: float | None = None  # when the last completed read started
        self._done_error: BaseException | None = None
        self._inflight: asyncio.Future[BaseException | None] | None = None
        self._inflight_started = 0.0
        self._next: asyncio.Future[BaseException | None] | None = None
        self._pump: asyncio.Task[None] | None = None
        self._closed = False

    # ------------------------------------------------------------------ users
    def enter(self, feed: AsyncTableFeed) -> None:
        self.members.add(feed)
        self.joining.add(feed)
        if feed.key_prefix is not None:
            self._prefix_users[feed.key_prefix] += 1

    async def leave(self, feed: AsyncTableFeed) -> None:
        if feed not in self.members:
            return
        self.members.discard(feed)
        self.feeds.discard(feed)
        self.joining.discard(feed)
        if feed.key_prefix is not None:
            self._prefix_users[feed.key_prefix] -= 1
            if self._prefix_users[feed.key_prefix] <= 0:
                del self._prefix_users[feed.key_prefix]
                self._since.pop(feed.key_prefix, None)
        if not self.members:
            self._closed = True
            if self._registry.get((self.config, self.topic)) is self:
                del self._registry[(self.config, self.topic)]
            if self._pump is not None:
                self._pump.cancel()
            await self._worker.aclose()

    # ------------------------------------------------------------------ cycles
    def _fresh(self, since: float) -> bool:
        return self._done_started is not None and self._done_started >= since

    def _cycle_after(self, since: float) -> asyncio.Future[BaseException | None]:
        """The outcome of a cycle whose read starts at or after ``since`` (loop time)."""
        if self._inflight is not None and self._inflight_started >= since:
            return self._inflight
        loop = asyncio.get_running_loop()
        if self._next is None:
            self._next = loop.create_future()
        if self._pump is None or self._pump.done():
            self._pump = loop.create_task(self._run_cycles(), name=f"pulsarstate-table-feed {self.topic}")
        return self._next

    async def _wait(self, since: float) -> None:
        """Until a read that started at or after ``since`` completed; raise its error."""
        while not self._fresh(since):
            if self._closed:
                raise ClosedError(f"the shared table feed of {self.topic} is closed")
            await asyncio.shield(self._cycle_after(since))
        if self._done_error is not None:
            raise self._done_error.with_traceback(None)

    async def _run_cycles(self) -> None:
        loop = asyncio.get_running_loop()
        while self._next is not None and not self._closed:
            future, self._next = self._next, None
            self._inflight, self._inflight_started = future, loop.time()
            error: BaseException | None = None
            try:
                await self._cycle()
            except asyncio.CancelledError:
                error = ClosedError(f"the shared table feed of {self.topic} is closed")
                raise
            except Exception as exc:
                error = exc
            finally:
                self._done_started, self._done_error = self._inflight_started, error
                self._inflight = None
                if not future.done():
                    future.set_result(error)

    async def _cycle(self) -> None:
        """One read to the tail (opening the reader if needed), then the joining feeds admitted,
        caught up first when they start before what the shared records cover."""
        joiners = [f for f in self.joining if not f._join_done]
        prefixes = frozenset(self._prefix_users)
        if self._position is None:
            starts = [f._after for f in joiners if f._after is not None]
            start: int | None = min(starts) if starts else None
        else:
            start = self._position
        records, position = await self._worker.run(lambda held: held[0].read(start, prefixes))
        read_from = self._position if self._position is not None else (start if start is not None else position)
        for prefix in prefixes:
            if prefix in self._prefix_users:  # a prefix whose feeds all left meanwhile is not counted on
                self._since.setdefault(prefix, read_from)
        if self._base is None:
            self._base = read_from
        self._records.extend(records)
        self._position = position
        self._trim()
        behind: list[AsyncTableFeed] = []
        for feed in joiners:
            if feed in self.joining and not self._admit(feed):
                behind.append(feed)
        if behind:
            await self._catch_up(behind)

    def _covered_from(self, prefix: str | None) -> int:
        assert self._base is not None
        return self._base if prefix is None else max(self._base, self._since.get(prefix, self._position or 0))

    def _admit(self, feed: AsyncTableFeed) -> bool:
        """Start ``feed`` on the shared records (False: it needs catching up). Loop-side, no I/O."""
        assert self._position is not None
        if feed.key_prefix is not None and feed.key_prefix not in self._since:
            return False  # not counted yet: the next read counts it
        if feed._after is None:
            feed._after = self._position
        elif feed._after > self._position:
            feed._join_error = CommitNotFoundError(
                f"the feed's watermark {feed._after} lies past the last commit {self._position} of table {self.topic!r}: "
                "the table was recreated, or the watermark belongs to another table",
                topic=self.topic,
                offset=feed._after,
                last_offset=self._position,
            )
        elif feed._after < self._covered_from(feed.key_prefix):
            return False
        self.joining.discard(feed)
        feed._join_done = True
        if feed._join_error is None:
            self.feeds.add(feed)
        return True

    async def _catch_up(self, feeds: list[AsyncTableFeed]) -> None:
        marks = [f._after for f in feeds if f._after is not None]
        if not marks:  # nothing to read back: the next cycle admits them
            return
        after = min(marks)
        prefixes = frozenset(f.key_prefix for f in feeds if f.key_prefix is not None)
        try:
            records, _ = await self._worker.run(lambda held: held[0].catch_up(after, prefixes))
        except Exception as exc:
            for feed in feeds:
                if feed in self.joining:
                    self.joining.discard(feed)
                    feed._join_done, feed._join_error = True, exc
            return
        self._merge_older(records, prefixes)
        assert self._base is not None
        self._base = min(self._base, after)
        for prefix in prefixes:
            self._since[prefix] = min(self._since.get(prefix, after), after)
        for feed in feeds:
            if feed in self.joining:
                self._admit(feed)

    def _merge_older(self, records: list[CountedRecord], prefixes: frozenset[str]) -> None:
        """Put the records a catch-up read before the shared ones in front of them, and its counts
        under ``prefixes`` into the shared records it read again."""
        assert self._position is not None and self._base is not None
        for prefix in self._since:  # what the shared records already covered, before the base moves down
            self._since[prefix] = max(self._since[prefix], self._base)
        older: list[CountedRecord] = []
        for record in records:
            if record.offset > self._position:
                break
            if record.offset <= self._base:
                older.append(record)
                continue
            i = bisect.bisect_left(self._records, record.offset, key=lambda r: r.offset)
            if i < len(self._records) and self._records[i].offset == record.offset:
                under = self._records[i].under
                for prefix in prefixes:
                    if prefix in record.under:
                        under[prefix] = record.under[prefix]
                    else:
                        under.pop(prefix, None)
        self._records[0:0] = older

    def _trim(self) -> None:
        """Drop the records every feed's watermark passed."""
        marks = [f._after for f in (*self.feeds, *self.joining) if f._after is not None]
        if not marks or self._base is None:
            return
        low = min(marks)
        if low > self._base:
            cut = bisect.bisect_right(self._records, low, key=lambda r: r.offset)
            del self._records[:cut]
            self._base = low

    # ------------------------------------------------------------------ feeds
    async def join(self, feed: AsyncTableFeed, freshness: float) -> int:
        since = asyncio.get_running_loop().time() - freshness
        while not feed._join_done:
            await self._wait(since)
            if not feed._join_done and not self._admit(feed):
                since = asyncio.get_running_loop().time()  # caught up (or counted) by the next cycle
        if feed._join_error is not None:
            raise feed._join_error.with_traceback(None)
        assert feed._after is not None
        return feed._after

    async def poll(self, feed: AsyncTableFeed, freshness: float, limit: int | None) -> FeedPoll:
        await self._wait(asyncio.get_running_loop().time() - freshness)
        assert feed._after is not None and self._position is not None
        start = bisect.bisect_right(self._records, feed._after, key=lambda r: r.offset)
        stop = len(self._records) if limit is None else min(len(self._records), start + limit)
        picked = self._records[start:stop]
        more = stop < len(self._records)
        upto = picked[-1].offset if more else max(feed._after, self._position)
        feed._after = upto
        return FeedPoll([r.commit(feed.key_prefix) for r in picked], upto, more)


_HUBS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[Any, _Hub]] = weakref.WeakKeyDictionary()


def _hub(config: ConnectionConfig, topic: str) -> _Hub:
    registry = _HUBS.setdefault(asyncio.get_running_loop(), {})
    hub = registry.get((config, topic))
    if hub is None:
        hub = registry[(config, topic)] = _Hub(config, topic, registry)
    return hub


class AsyncTableFeed:
    """:class:`~.table_feed.TableFeed`'s commits, awaited without blocking an event loop, through
    the table's reader shared by every feed of the process (see the module docstring). Each feed
    has its own watermark and prefix; no I/O before :meth:`start`.

    Example::

        feed = AsyncTableFeed(config, topic, after=41, key_prefix="sku-", freshness=1.0)
        await feed.start()
        commits, upto, more = await feed.poll(limit=500)
        await feed.aclose()

    :param config: the connection.
    :param topic: the table's topic (full name).
    :param after: report commits after this offset (-1: every commit; None: after the table's
        last commit when the feed starts).
    :param key_prefix: also count the rows set and deleted under this prefix.
    :param freshness: seconds a poll may be answered from a read of the log started before it was
        called (shared with the other feeds of the table); 0: a read started after the call.
    :raises ConfigurationError: a bad ``after``, ``key_prefix`` or ``freshness``.
    """

    def __init__(
        self,
        config: ConnectionConfig,
        topic: str,
        *,
        after: int | None,
        key_prefix: str | None = None,
        freshness: float = 0.0,
    ) -> None:
        if after is not None:
            _check_offset("after", after, -1)
        if key_prefix is not None and not isinstance(key_prefix, str):
            raise ConfigurationError(f"key_prefix must be a str or None, got {key_prefix!r}")
        if isinstance(freshness, bool) or not isinstance(freshness, (int, float)) or not freshness >= 0:
            raise ConfigurationError(f"freshness must be seconds >= 0, got {freshness!r}")
        self.config, self.topic, self.key_prefix = config, topic, key_prefix
        self.freshness = float(freshness)
        self._after = after
        self._hub: _Hub | None = None
        self._join_done = False
        self._join_error: BaseException | None = None
        self._closed = False

    @property
    def after(self) -> int | None:
        """The watermark: every commit up to it was returned (None before :meth:`start` when
        starting at the tail)."""
        return self._after

    async def start(self) -> int:
        """Join the table's shared reader (opening it if this is the first feed) and return the
        watermark this feed starts from.

        :raises TableNotFoundError: the table's log is empty.
        :raises CommitNotFoundError: ``after`` lies past the table's last commit.
        :raises ClosedError: after :meth:`aclose`.
        """
        if self._closed:
            raise ClosedError(f"the table feed of {self.topic} is closed")
        if self._hub is None:
            self._hub = _hub(self.config, self.topic)
            self._hub.enter(self)
        return await self._hub.join(self, self.freshness)

    async def poll(self, *, limit: int | None = None) -> FeedPoll:
        """The commits after the watermark up to the tail (as read at most ``freshness`` seconds
        before the call), at most ``limit`` of them; the watermark moves to the last one returned,
        or to the offset read to (also past records that changed nothing) when all were returned.

        :raises OperationTimeoutError, BackendUnavailableError: the shared read failed; nothing is
            lost, the next poll goes on from the watermark.
        """
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
            raise ConfigurationError(f"limit must be an int >= 1 or None, got {limit!r}")
        await self.start()
        assert self._hub is not None
        return await self._hub.poll(self, self.freshness, limit)

    async def aclose(self) -> None:
        """Leave the shared reader; the last feed of the table closes it (idempotent, never waits
        on a read still running)."""
        if self._closed:
            return
        self._closed = True
        hub, self._hub = self._hub, None
        if hub is not None:
            await hub.leave(self)
