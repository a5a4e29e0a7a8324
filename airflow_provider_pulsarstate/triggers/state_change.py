"""``StateChangeTrigger``: schedule a DAG when a shared state table commits changes.

Use it in an :class:`~airflow.sdk.AssetWatcher`: every commit of the table that matches ``on``
(a view apply, and/or rows set or deleted under a key prefix) becomes one asset event whose
``extra["payload"]`` carries the commit offset, the applied view's id, and the set/delete counts
(also under the prefix). A downstream task reads exactly that commit's rows with
``PulsarStateHook().get_table_changes(table, offset)``.

How it reads the table: through the hook's async table feed
(:mod:`~airflow_provider_pulsarstate.engine.recipes.shared_table_feed`): one reader of the table's
log per triggerer process, shared by every trigger watching that table (each keeps its own
watermark and prefix), reading on the process-wide worker pool, so a poll (or a replay from a
checkpoint manifest) never blocks the triggerer's event loop nor asgiref's shared thread, and a
thousand triggers on a table cost one reader and about one read a second. A poll is answered from
a shared read started at most ``min(poll_interval / 2, 1 s)`` before it. The feed applies the log's
acceptance rules (epochs, fenced writes), so an event stands for a change every replica of the
table has.

The watermark, and why a restart neither misses nor repeats a change
--------------------------------------------------------------------

The watermark is the last commit offset whose events are *stored*. It lives in the watched
asset's state store (``self.asset_state_store``, Airflow 3.3), key
``pulsarstate.state_change:<connection>:<table>:<on>:<prefix>``, value ``{"offset": n, "table": topic}``
(several assets watched by one trigger each get it; a restart resumes from the lowest).

A plain ``run()`` cannot know when an event it yielded is stored: the triggerer queues the
event, resumes the generator at once and persists the event later from its supervisor. Writing
the watermark when the generator resumes (or before yielding) would lose the change if the
triggerer died in between. So the trigger uses Airflow 3.3's *ack mode* of shared streams, the
only place where the triggerer tells a trigger that its events are stored:

1. the stream's producer (:class:`StateChangeProducer`) polls the feed from the stored watermark
   and yields one raw batch per poll that read commits matching ``on`` (at most
   ``max_commits_per_batch``): those commits (counts only) and the offset read up to; commits that
   match nothing are only passed over by the next batch, or by an empty one at least every
   :data:`IDLE_WATERMARK_INTERVAL` seconds;
2. this trigger's ``filter_shared_stream`` turns each matching commit into a ``TriggerEvent``;
3. the triggerer stores those asset events, and only after its supervisor confirmed them
   persisted (and the filter moved on) does it call the producer's ``advance``, which writes the
   watermark: the offset of the last batch whose events are all stored.

A triggerer killed before step 3 completes (the event received from the table, perhaps queued,
not yet stored) has not moved the watermark: on restart the feed starts from the stored
watermark and the same commits come again, are stored once, and nothing is lost. The watermark is
written only for batches whose every event is confirmed; one that is not (ack time-out, a failed
subscriber) ends the stream with an error before anything after it is written, and the restarted
trigger delivers it again.

What is guaranteed, honestly: **at-least-once**, with duplicates confined to one window. An event
stored but whose watermark write did not land (a kill in the second or so between the supervisor's
confirmation and the state-store write) is delivered again after a restart: there is no way, from
a trigger, to store an asset event and a state-store value atomically, nor to read asset events
back. A downstream task that must not count a commit twice keys its work by the commit offset
(``extra["payload"]["offset"]``), which is the same for both copies. Two triggerers running the
same trigger at once (a hand-over) may both deliver a commit. Changes committed before the watcher
first ran are not events: on its first run (no watermark) the trigger starts at the table's last
commit and stores that as its watermark before it reports anything (a table that does not exist
yet is waited for, with watermark -1: its first commits are events).

Parse-time identity: the serialized arguments are plain JSON, normalized in ``__init__`` (no time,
uuid or I/O), so the trigger's hash is stable across parses.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
from collections.abc import AsyncIterator, Hashable, Sequence
from typing import Any

from airflow.triggers.base import BaseEventTrigger, TriggerEvent
from airflow.triggers.shared_stream import AdvanceItem, AdvanceOutcome, SharedStreamProducer

from airflow_provider_pulsarstate.engine.errors import ConfigurationError, PulsarStateError, TableNotFoundError
from airflow_provider_pulsarstate.engine.retry import Backoff
from airflow_provider_pulsarstate.hooks.airflow_internals import asset_state_accessors
from airflow_provider_pulsarstate.hooks.pulsarstate import PulsarStateHook
from airflow_provider_pulsarstate.triggers.polling import TRANSIENT, check_timing, retry_backoff
from airflow_provider_pulsarstate.triggers.shared_config import shared_config
from airflow_provider_pulsarstate.triggers.shared_log import SharedLog
from airflow_provider_pulsarstate.triggers.start_gate import start_turn

ON_CHOICES = ("keys", "view_apply")
"""What a commit must do to fire: apply a view, and/or set or delete rows under ``key_prefix``."""

DEFAULT_MAX_COMMITS_PER_BATCH = 500
"""Commits per delivered batch at most (a larger backlog comes in several batches)."""

MAX_FRESHNESS = 1.0
"""Seconds at most a poll may be answered from the table's shared read started before it (half
the ``poll_interval`` when shorter): a thousand triggers on a table cost about one read a second."""

IDLE_WATERMARK_INTERVAL = 60.0
"""Seconds at most between two watermark writes while the table's commits fire none of a trigger's
events (a restart then reads those commits again, and they fire nothing again)."""

MAX_COALESCED_VIEW_IDS = 100
"""View ids a coalesced event lists at most (``view_ids_total`` counts them all)."""

WATERMARK_KEY = "pulsarstate.state_change"
"""Prefix of the asset state-store key holding a trigger's watermark."""

# The stream key -> the watcher's asset state store. The triggerer builds the stream's producer
# from the serialized kwargs only (a classmethod); the trigger registers its store under its
# stream key when the triggerer asks for that key, right before it subscribes.
_STORES: dict[Hashable, Any] = {}

_log = logging.getLogger(__name__)
# a thousand streams of one table start, and fail, together: one line each time, not a thousand
_shared_log = SharedLog(_log)


class StateChangeError(PulsarStateError):
    """The stream stopped before a batch's events were all stored: it is delivered again."""


def _check_what(table: Any, on: Any, key_prefix: Any) -> None:
    """Refuse, at parse time, a table, ``on`` or ``key_prefix`` that cannot be watched (named)."""
    if not isinstance(table, str) or not table.strip():
        raise ConfigurationError(f"StateChangeTrigger: table must be a topic name, got {table!r}")
    if isinstance(on, str) or not isinstance(on, Sequence) or not on or any(o not in ON_CHOICES for o in on):
        raise ConfigurationError(
            f"StateChangeTrigger: on must be a non-empty list of {', '.join(map(repr, ON_CHOICES))}, got {on!r}"
        )
    if key_prefix is not None and not isinstance(key_prefix, str):
        raise ConfigurationError(f"StateChangeTrigger: key_prefix must be a str or None, got {key_prefix!r}")
    if "keys" in on and key_prefix is None:
        raise ConfigurationError('StateChangeTrigger: on "keys" needs a key_prefix ("" for any key)')


def _check_how(poll_interval: Any, max_commits_per_batch: Any, coalesce: Any, pulsarstate_conn_id: Any) -> None:
    """Refuse, at parse time, a poll interval, batch size, ``coalesce`` or connection id of the wrong kind (named)."""
    check_timing(poll_interval, None, ConfigurationError)
    if (
        isinstance(max_commits_per_batch, bool)
        or not isinstance(max_commits_per_batch, int)
        or not (1 <= max_commits_per_batch <= 100_000)
    ):
        raise ConfigurationError(
            f"StateChangeTrigger: max_commits_per_batch must be an int from 1 to 100000, got {max_commits_per_batch!r}"
        )
    if not isinstance(coalesce, bool):
        raise ConfigurationError(f"StateChangeTrigger: coalesce must be true or false, got {coalesce!r}")
    if not isinstance(pulsarstate_conn_id, str) or not pulsarstate_conn_id:
        raise ConfigurationError(f"StateChangeTrigger: pulsarstate_conn_id must be a str, got {pulsarstate_conn_id!r}")


class StateChangeTrigger(BaseEventTrigger):
    """Fire an asset event for every commit of ``table`` that matches ``on`` (see the module docstring).

    Example::

        from airflow.sdk import Asset, AssetWatcher, dag
        from airflow_provider_pulsarstate.triggers.state_change import StateChangeTrigger

        prices_applied = Asset("price-table-applies", watchers=[AssetWatcher(
            name="price-table-view-apply", trigger=StateChangeTrigger(table="price-table", on=["view_apply"]),
        )])

        @dag(schedule=[prices_applied])
        def price_changes(): ...

    Event payload (the asset event's ``extra["payload"]``, plain JSON): ``table`` (full topic),
    ``offset``, ``publish_time``, ``view_id`` / ``view_apply`` / ``applied_views``, ``sets``,
    ``deletes``, and with ``key_prefix`` also ``key_prefix``, ``prefix_sets``, ``prefix_deletes``;
    ``matched`` lists which of ``on`` the commit met.

    :param table: the table's topic (short name or full ``persistent://...``).
    :param on: ``"view_apply"`` (a commit that applies a view) and/or ``"keys"`` (a commit that
        sets or deletes a row under ``key_prefix``).
    :param key_prefix: the prefix for ``"keys"`` (``""``: any key); with ``view_apply`` alone it
        only adds prefix counts to the events.
    :param poll_interval: seconds between polls of the table's log.
    :param max_commits_per_batch: a backlog (e.g. after a triggerer outage) is delivered in batches
        of at most this many commits, the watermark moving after each stored batch, so no batch of
        events grows with the backlog and the event loop gets a turn between batches.
    :param coalesce: one event per batch instead of one per commit: ``first_offset`` /
        ``last_offset``, ``commits``, summed ``sets`` / ``deletes`` (and prefix counts), the applied
        ``view_ids`` (at most 100) and ``matched``; for DAGs that re-read the table anyway.
    :param pulsarstate_conn_id: the ``pulsarstate`` connection.
    :raises ConfigurationError: an invalid argument (at parse time).
    """

    def __init__(
        self,
        *,
        table: str,
        on: Sequence[str] = ("view_apply",),
        key_prefix: str | None = None,
        poll_interval: float = 5.0,
        max_commits_per_batch: int = DEFAULT_MAX_COMMITS_PER_BATCH,
        coalesce: bool = False,
        pulsarstate_conn_id: str = PulsarStateHook.default_conn_name,
    ) -> None:
        super().__init__()
        _check_what(table, on, key_prefix)
        _check_how(poll_interval, max_commits_per_batch, coalesce, pulsarstate_conn_id)
        self.table = table.strip()
        self.on = sorted(set(on))
        self.key_prefix = key_prefix
        self.poll_interval = float(poll_interval)
        self.max_commits_per_batch = max_commits_per_batch
        self.coalesce = coalesce
        self.pulsarstate_conn_id = pulsarstate_conn_id

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "table": self.table,
                "on": list(self.on),
                "key_prefix": self.key_prefix,
                "poll_interval": self.poll_interval,
                "max_commits_per_batch": self.max_commits_per_batch,
                "coalesce": self.coalesce,
                "pulsarstate_conn_id": self.pulsarstate_conn_id,
            },
        )

    # ------------------------------------------------------------------ shared stream (ack mode)
    @staticmethod
    def _stream_key(kwargs: dict[str, Any]) -> Hashable:
        return ("pulsarstate.StateChangeTrigger", json.dumps(kwargs, sort_keys=True))

    def shared_stream_key(self) -> Hashable:
        key = self._stream_key(self.serialize()[1])
        _STORES[key] = self.asset_state_store
        return key

    @classmethod
    def create_shared_stream_producer(cls, kwargs: dict[str, Any]) -> StateChangeProducer:
        return StateChangeProducer(kwargs, _STORES.get(cls._stream_key(kwargs)))

    async def filter_shared_stream(self, shared_stream: AsyncIterator[Any]) -> AsyncIterator[TriggerEvent]:
        async for batch in shared_stream:
            for event in self.events(batch):
                yield event

    async def run(self) -> AsyncIterator[TriggerEvent]:
        """Outside the triggerer's shared streams (never for a watcher in Airflow 3.3): the same
        events, with the watermark moved when the generator resumes, i.e. without waiting for the
        event to be stored."""
        producer = StateChangeProducer(self.serialize()[1], self.asset_state_store)
        try:
            async for batch, upto in producer.open_stream():
                for event in self.events(batch):
                    yield event
                await producer.advance([AdvanceItem(upto, AdvanceOutcome(acked=1, failed=0))])
        finally:
            await producer.aclose()

    def events(self, batch: dict[str, Any]) -> list[TriggerEvent]:
        """The events of one raw batch: one per commit that matches ``on`` (one for all of them
        with ``coalesce``)."""
        matching = [(commit, matched) for commit in batch["commits"] if (matched := self._matched(commit))]
        if not matching:
            return []
        if self.coalesce:
            return [TriggerEvent(_coalesced(batch["table"], matching))]
        return [TriggerEvent({"table": batch["table"], **commit, "matched": matched}) for commit, matched in matching]

    def _matched(self, commit: dict[str, Any]) -> list[str]:
        return _matches(self.on, commit["view_apply"], commit.get("prefix_sets"), commit.get("prefix_deletes"))


def _matches(on: Sequence[str], view_apply: bool, prefix_sets: int | None, prefix_deletes: int | None) -> list[str]:
    """Which of ``on`` a commit meets."""
    matched = []
    if "view_apply" in on and view_apply:
        matched.append("view_apply")
    if "keys" in on and (prefix_sets or prefix_deletes):
        matched.append("keys")
    return matched


def _coalesced(table: str, matching: list[tuple[dict[str, Any], list[str]]]) -> dict[str, Any]:
    """One event for the matching commits of a batch: their offset range and summed counts."""
    commits = [c for c, _ in matching]
    view_ids = [c["view_id"] for c in commits if c.get("view_id")]
    payload: dict[str, Any] = {
        "table": table,
        "coalesced": True,
        "commits": len(commits),
        "first_offset": commits[0]["offset"],
        "last_offset": commits[-1]["offset"],
        "publish_time": commits[-1]["publish_time"],
        "view_ids": view_ids[:MAX_COALESCED_VIEW_IDS],
        "view_ids_total": len(view_ids),
        "matched": sorted({m for _, matched in matching for m in matched}),
    }
    for field in ("sets", "deletes", "prefix_sets", "prefix_deletes"):
        payload[field] = sum(int(c.get(field) or 0) for c in commits)
    if commits[0].get("key_prefix") is not None:
        payload["key_prefix"] = commits[0]["key_prefix"]
    return payload


def watermark_key(kwargs: dict[str, Any]) -> str:
    """The state-store key of a trigger's watermark: what it watches, not how often it polls."""
    prefix = kwargs.get("key_prefix")
    return (
        f"{WATERMARK_KEY}:{kwargs['pulsarstate_conn_id']}:{kwargs['table']}:{','.join(kwargs['on'])}:"
        f"{'' if prefix is None else prefix}"
    )


class _Watermark:
    """The stored watermark in every watched asset's state store (in memory without one)."""

    def __init__(self, store: Any, key: str) -> None:
        self.key = key
        self.value: int | None = None
        if store is None:
            self._accessors: tuple[Any, ...] = ()
        else:  # AssetStateStoreAccessors keeps one accessor per watched asset; anything else is one accessor
            self._accessors = tuple(asset_state_accessors(store) or (store,))

    async def read(self, topic: str) -> int | None:
        found = []
        for accessor in self._accessors:
            stored = await accessor.aget(self.key)
            if stored is None:
                continue
            if (
                not isinstance(stored, dict)
                or isinstance(stored.get("offset"), bool)
                or not isinstance(stored.get("offset"), int)
            ):
                raise ConfigurationError(
                    f"asset state {self.key!r} of {accessor!r} holds {stored!r}, not a StateChangeTrigger watermark "
                    '{"offset": int, "table": str}: delete it to start again from the table\'s tail'
                )
            if stored.get("table") != topic:
                raise ConfigurationError(
                    f"asset state {self.key!r} of {accessor!r} is the watermark of table {stored.get('table')!r}, "
                    f"not {topic!r} (the connection's namespace changed?): delete it to start again from the tail"
                )
            found.append(stored["offset"])
        if found:
            self.value = min(found)
        return self.value

    async def write(self, offset: int, topic: str) -> None:
        for accessor in self._accessors:
            await accessor.aset(self.key, {"offset": offset, "table": topic})
        self.value = offset


class StateChangeProducer(SharedStreamProducer):
    """The shared stream's producer: polls the table's feed from the stored watermark and writes
    the watermark in :meth:`advance`, i.e. once the triggerer stored the batch's events.

    :param kwargs: the trigger's serialized kwargs.
    :param store: the watcher's ``asset_state_store`` (None: the watermark lives in memory).
    """

    def __init__(self, kwargs: dict[str, Any], store: Any) -> None:
        self.kwargs = kwargs
        self._watermark = _Watermark(store, watermark_key(kwargs))
        self._feed: Any = None
        self._topic: str | None = None
        self._broken: str | None = None

    async def open_stream(self) -> AsyncIterator[tuple[dict[str, Any], int]]:
        # a thousand of these run for as long as the triggerer does: the frame keeps no hook and
        # no back-off between failures, only what each poll needs (fewer objects for the
        # process's garbage collector to walk)
        kw = self.kwargs
        poll_interval = float(kw["poll_interval"])
        await start_turn()  # a thousand triggers starting together take turns
        config = await shared_config(PulsarStateHook(kw["pulsarstate_conn_id"]))
        topic = self._topic = config.topic_name(kw["table"])
        start = await self._watermark.read(topic)
        backoff: Backoff | None = None  # made at the first failure, dropped at the next success
        batch_size = int(kw.get("max_commits_per_batch") or DEFAULT_MAX_COMMITS_PER_BATCH)
        loop = asyncio.get_running_loop()
        quiet_since = loop.time()  # when a batch was last handed out (or the stream started)
        sent: int | None = None  # the offset read up to (None: the feed is not started)
        handed = -1  # the offset of the last batch handed out
        while True:
            try:
                if self._feed is None:
                    self._feed = self._open_feed(config, topic, after=start)
                if sent is None:
                    sent = await self._feed.start()
                    await self._feed_started(topic, sent, start)
                    handed = sent
                commits, upto, more = await self._feed.poll(limit=batch_size)
            except (*TRANSIENT, TableNotFoundError) as exc:
                backoff = backoff or retry_backoff(poll_interval)
                delay = backoff.next_delay()
                start = await self._after_read_failure(exc, topic, start, delay)
                if sent is not None:  # the feed opens again after what was handed out
                    start, sent = sent, None
                await asyncio.sleep(delay)
                continue
            backoff = None
            firing = [c for c in commits if _matches(kw["on"], c.view_apply, c.prefix_sets, c.prefix_deletes)]
            sent = max(sent, upto)
            # commits that fire nothing move the stored watermark now and then, not each time: a
            # thousand triggers on a table would otherwise write a thousand watermarks per commit
            if firing or (sent > handed and loop.time() - quiet_since >= IDLE_WATERMARK_INTERVAL):
                yield {"table": topic, "commits": [c.as_json() for c in firing], "upto": sent}, sent
                handed, quiet_since = sent, loop.time()
            if more:  # a backlog: the next batch at once, the loop's other tasks getting a turn first
                await asyncio.sleep(0)
                continue
            await asyncio.sleep(poll_interval * random.uniform(0.75, 1.0))

    def _open_feed(self, config: Any, topic: str, *, after: int | None) -> Any:
        """The table's async feed after commit offset ``after`` (None: from its tail), sharing
        reads started at most ``min(poll_interval / 2, MAX_FRESHNESS)`` before a poll."""
        kw = self.kwargs
        return PulsarStateHook(kw["pulsarstate_conn_id"]).get_async_table_feed(
            topic,
            after=after,
            key_prefix=kw["key_prefix"],
            config=config,
            freshness=min(float(kw["poll_interval"]) / 2, MAX_FRESHNESS),
        )

    async def _feed_started(self, topic: str, sent: int, start: int | None) -> None:
        """The feed started after commit offset ``sent``. On a first run (``start`` None: no stored
        watermark) that offset is stored as the watermark before any event."""
        await start_turn()  # the triggers the feed's first read woke take turns
        if start is None:  # first run: the tail is the watermark, stored before any event
            await self._watermark.write(sent, topic)
        watching = ("watching table %s after commit offset %d (stored watermark: %s)", topic, sent, start)
        if not _shared_log.info(("watching", topic), *watching):
            _log.debug(*watching)

    async def _after_read_failure(self, exc: Exception, topic: str, start: int | None, delay: float) -> int | None:
        """Log a failed read (once across the table's streams), drop the feed; the offset to start from
        again (a table not found before any watermark: -1, stored, as its first commits are changes)."""
        _shared_log.warning(
            ("read failed", topic, type(exc).__name__),
            "reading table %s failed (%s: %s); retrying in %.1fs",
            topic,
            type(exc).__name__,
            exc,
            delay,
        )
        if isinstance(exc, TableNotFoundError) and start is None:
            # nothing committed yet: the table's first commits are changes too
            start = -1
            await self._watermark.write(start, topic)
        # each read is bounded by the connection's operation time-out on the feed's thread
        await self._drop_feed()
        return start

    async def advance(self, batch: Sequence[AdvanceItem]) -> None:
        """Write the watermark of the batch's last item whose events were all stored, in order;
        stop at the first that was not (and for good: a later batch never writes past it)."""
        if self._broken is not None:
            raise StateChangeError(self._broken)
        upto: int | None = None
        failed: AdvanceItem | None = None
        for item in batch:
            if not item.outcome.is_clean:
                failed = item
                break
            upto = item.broker_payload
        if upto is not None and self._topic is not None:
            await self._watermark.write(upto, self._topic)
        if failed is not None:
            outcome = failed.outcome
            self._broken = (
                f"the events of table {self._topic} commits up to offset {failed.broker_payload} were not all stored "
                f"(acked {outcome.acked}, failed {outcome.failed}, rejected {outcome.rejected}); the watermark "
                f"stays at {self._watermark.value} and they are delivered again"
            )
            raise StateChangeError(self._broken)

    async def _drop_feed(self) -> None:
        feed, self._feed = self._feed, None
        if feed is not None:
            await feed.aclose()

    async def aclose(self) -> None:
        await self._drop_feed()
