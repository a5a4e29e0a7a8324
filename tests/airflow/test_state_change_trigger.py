"""StateChangeTrigger on both back ends, through Airflow's real shared-stream manager in ack mode
(the triggerer's own machinery), with its watermark in the provider's real state-store backend:
events from real view applies, a watermark written only after the events are stored, a restart
that neither misses nor repeats, a stable serialized form, and a loop that never stalls."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections import Counter
from types import SimpleNamespace
from typing import Any
from unittest.mock import ANY

import pytest
from airflow.sdk.state import AssetScope
from airflow.triggers.base import BaseEventTrigger
from airflow.triggers.shared_stream import SharedStreamManager

from airflow_provider_pulsarstate.engine.errors import ConfigurationError
from airflow_provider_pulsarstate.hooks.pulsarstate import PulsarStateHook
from airflow_provider_pulsarstate.state_store.backend import PulsarStateStoreBackend
from airflow_provider_pulsarstate.triggers.state_change import StateChangeTrigger, watermark_key
from tests.airflow.trigger_driver import LOOP_LAG_LIMIT, LoopLag, close_shared_streams


class BackendAccessor:
    """What Airflow's ``AssetStateStoreAccessor`` does in a triggerer (aget/aset of one asset's
    JSON values), over the provider's real state-store backend instead of the supervisor's API."""

    def __init__(self, name: str) -> None:
        self.scope = AssetScope(name=name)
        self.backend = PulsarStateStoreBackend()
        self.writes: list[Any] = []

    async def aget(self, key: str, default: Any = None) -> Any:
        stored = await self.backend.aget(self.scope, key)
        return default if stored is None else json.loads(stored)

    async def aset(self, key: str, value: Any) -> None:
        self.writes.append(value)
        await self.backend.aset(self.scope, key, json.dumps(value))


def apply_view(table_name: str, rows: dict[str, dict]) -> Any:
    with PulsarStateHook() as hook, hook.get_table(table_name, writer_idle_timeout=0.1) as table:
        view = table.create_view(scope_prefix="sku-")
        with table.stager(view.view_id) as stager:
            for key, record in rows.items():
                stager.set(key, record)
        table.seal(view.view_id, stagers=[stager])
        return table.apply(view.view_id, max_delete_fraction=None)


class Watcher:
    """One subscription as the triggerer runs it: subscribe, filter, bind each event, confirm it
    persisted when the test says so (the supervisor's role)."""

    def __init__(self, manager: SharedStreamManager, trigger: StateChangeTrigger, trigger_id: int) -> None:
        self.manager, self.trigger, self.id = manager, trigger, trigger_id
        self.key = trigger.shared_stream_key()
        self.events = trigger.filter_shared_stream(
            manager.subscribe(trigger_id=trigger_id, trigger=trigger, key=self.key)
        )
        self.seqs: list[int] = []

    async def next(self, timeout: float = 60) -> Any:
        event = await asyncio.wait_for(self.events.__anext__(), timeout)
        self.seqs.append(self.manager.bind_pending_event(trigger_id=self.id, key=self.key))
        return event

    async def stop(self, pending: Any = None) -> None:
        """Leave as the triggerer does when it cancels the trigger (``pending``: its ``next()``)."""
        if pending is not None:
            pending.cancel()
            await asyncio.gather(pending, return_exceptions=True)
        await self.events.aclose()
        await self.manager.unsubscribe(self.id, self.key)


async def wait_for(predicate: Any, what: str, timeout: float = 30) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


def test_serialized_form_is_plain_json_and_stable() -> None:
    trigger = StateChangeTrigger(
        table=" price-table ", on=["view_apply", "keys", "view_apply"], key_prefix="sku-", poll_interval=2
    )
    path, kwargs = trigger.serialize()
    assert path == "airflow_provider_pulsarstate.triggers.state_change.StateChangeTrigger"
    assert kwargs == {
        "table": "price-table",
        "on": ["keys", "view_apply"],
        "key_prefix": "sku-",
        "poll_interval": 2.0,
        "max_commits_per_batch": 500,
        "coalesce": False,
        "pulsarstate_conn_id": "pulsarstate_default",
    }
    assert json.loads(json.dumps(kwargs)) == kwargs
    again = StateChangeTrigger(**kwargs)
    assert again.serialize() == (path, kwargs)
    assert BaseEventTrigger.hash(path, kwargs) == BaseEventTrigger.hash(*again.serialize())
    assert watermark_key(kwargs) == "pulsarstate.state_change:pulsarstate_default:price-table:keys,view_apply:sku-"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"table": ""}, "table must be a topic name"),
        ({"table": "t", "on": "view_apply"}, "on must be a non-empty list"),
        ({"table": "t", "on": ["rows"]}, "on must be a non-empty list"),
        ({"table": "t", "on": ["keys"]}, 'on "keys" needs a key_prefix'),
        ({"table": "t", "poll_interval": 0}, "poll_interval must be a positive number"),
        ({"table": "t", "max_commits_per_batch": 0}, "max_commits_per_batch must be an int"),
        ({"table": "t", "max_commits_per_batch": True}, "max_commits_per_batch must be an int"),
        ({"table": "t", "coalesce": "yes"}, "coalesce must be true or false"),
    ],
)
def test_bad_arguments_fail_at_parse_time(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        StateChangeTrigger(**kwargs)


def test_events_come_from_real_applies_and_the_watermark_follows_storage(state_backend: str) -> None:
    table = f"state-change-{uuid.uuid4().hex[:8]}"
    apply_view(table, {"sku-1": {"p": 1}, "sku-2": {"p": 2}})  # before the watcher: never an event
    store = BackendAccessor(f"prices-{uuid.uuid4().hex[:6]}")
    kwargs = StateChangeTrigger(table=table, on=["view_apply"], key_prefix="sku-", poll_interval=0.1).serialize()[1]
    key = watermark_key(kwargs)

    async def scenario() -> tuple[float, int]:
        async with LoopLag() as lag:
            # 1. first run: the tail is stored as the watermark before any event
            manager = SharedStreamManager(ack_timeout=60)
            trigger = StateChangeTrigger(**kwargs)
            trigger.asset_state_store = store
            watcher = Watcher(manager, trigger, 1)
            pending = asyncio.ensure_future(watcher.next())
            await wait_for(lambda: store.writes, "the first watermark")
            start = store.writes[0]["offset"]
            # 2. an apply (blocking work off the loop) -> one event, carrying its commit
            applied = await asyncio.to_thread(
                apply_view, table, {"sku-1": {"p": 1}, "sku-2": {"p": 20}, "sku-3": {"p": 3}}
            )
            event = await pending
            payload = event.payload
            assert payload["offset"] == applied.commit_offset > start
            assert (payload["view_id"], payload["view_apply"], payload["sets"], payload["deletes"]) == (
                applied.view_id,
                True,
                2,
                0,
            )
            assert (payload["prefix_sets"], payload["matched"]) == (2, ["view_apply"])
            assert payload["table"].endswith(table)
            # 3. received, not yet stored: the watermark stays; a triggerer dying now (the group
            #    dropped without confirmation) must deliver the commit again
            nxt = asyncio.ensure_future(watcher.next())  # the filter moves past the event
            await asyncio.sleep(1.0)
            # (commits that fire nothing, e.g. the view's create, may move it: their batch is stored)
            assert store.writes[-1]["offset"] < applied.commit_offset and await store.aget(key) == store.writes[-1]
            await watcher.stop(nxt)

            manager = SharedStreamManager(ack_timeout=60)
            trigger = StateChangeTrigger(**kwargs)
            trigger.asset_state_store = store
            watcher = Watcher(manager, trigger, 2)
            again = await watcher.next()
            assert again.payload["offset"] == applied.commit_offset  # not lost
            # 4. stored (the supervisor confirms): the watermark moves past it, once the filter moved on
            nxt = asyncio.ensure_future(watcher.next())
            manager.confirm_persisted(watcher.seqs)
            await wait_for(lambda: store.writes[-1]["offset"] >= applied.commit_offset, "the watermark after storage")
            await watcher.stop(nxt)

            # 5. a restart after storage: no repeat, and the next apply is the next event
            manager = SharedStreamManager(ack_timeout=60)
            trigger = StateChangeTrigger(**kwargs)
            trigger.asset_state_store = store
            watcher = Watcher(manager, trigger, 3)
            pending = asyncio.ensure_future(watcher.next())
            await asyncio.sleep(0.5)
            assert not pending.done()
            later = await asyncio.to_thread(apply_view, table, {"sku-1": {"p": 1}, "sku-2": {"p": 20}})
            assert (await pending).payload["offset"] == later.commit_offset
            assert (await pending).payload["deletes"] == 1
            await watcher.stop()
        return lag.worst, lag.ticks

    worst, ticks = asyncio.run(scenario())
    # the ticker ran throughout (its count follows the CPU share it got); blocking is judged by worst
    assert ticks > 10 and worst < LOOP_LAG_LIMIT, (ticks, worst)


class MemoryAccessor:
    """An asset state-store accessor holding its values in memory."""

    def __init__(self, values: dict[str, Any]) -> None:
        self.values = values
        self.writes: list[Any] = []

    async def aget(self, key: str, default: Any = None) -> Any:
        return self.values.get(key, default)

    async def aset(self, key: str, value: Any) -> None:
        self.writes.append(value)
        self.values[key] = value


@pytest.mark.parametrize("coalesce", [False, True])
def test_a_backlog_comes_in_bounded_batches_each_moving_the_watermark(state_backend: str, coalesce: bool) -> None:
    from airflow.triggers.shared_stream import AdvanceItem, AdvanceOutcome

    from airflow_provider_pulsarstate.triggers.state_change import StateChangeProducer

    table, n = f"state-change-{uuid.uuid4().hex[:8]}", 1_200
    with PulsarStateHook() as hook, hook.get_table(table, writer_idle_timeout=0.1) as t:
        t.put("sku-0", {"p": 0})
        first = t.manager.applied_offset
        for i in range(1, n + 1):  # one commit each: a backlog the watcher has not seen
            t.put(f"sku-{i}", {"p": i})
        last = t.manager.applied_offset
    trigger = StateChangeTrigger(
        table=table, on=["keys"], key_prefix="sku-", poll_interval=0.1, max_commits_per_batch=500, coalesce=coalesce
    )
    kwargs = trigger.serialize()[1]
    store = MemoryAccessor({watermark_key(kwargs): {"offset": first, "table": hook.topic_name(table)}})

    async def scenario() -> tuple[list[tuple[int, list[Any]]], float]:
        producer = StateChangeProducer(kwargs, store)
        batches: list[tuple[int, list[Any]]] = []
        async with LoopLag() as lag:
            stream = producer.open_stream()
            while not batches or batches[-1][0] < last:
                batch, upto = await asyncio.wait_for(stream.__anext__(), 60)
                batches.append((upto, trigger.events(batch)))
                await producer.advance([AdvanceItem(upto, AdvanceOutcome(acked=1, failed=0))])
                assert store.values[watermark_key(kwargs)]["offset"] == upto  # moved per stored batch
            await stream.aclose()
            await producer.aclose()
        return batches, lag.worst

    batches, worst = asyncio.run(scenario())
    assert [len(b[1]) for b in batches] == ([500, 500, 200] if not coalesce else [1, 1, 1]), [
        len(b[1]) for b in batches
    ]
    assert batches[-1][0] == last and batches[0][0] < batches[1][0] < last
    if coalesce:
        payloads = [events[0].payload for _, events in batches]
        assert [p["commits"] for p in payloads] == [500, 500, 200]
        assert sum(p["prefix_sets"] for p in payloads) == n and payloads[-1]["last_offset"] == last
        assert payloads[1]["first_offset"] > payloads[0]["last_offset"]
    else:
        offsets = [e.payload["offset"] for _, events in batches for e in events]
        assert len(offsets) == n and offsets == sorted(set(offsets)) and offsets[-1] == last
    assert worst < LOOP_LAG_LIMIT, worst


def test_keys_under_a_prefix_fire_and_other_commits_only_move_the_watermark(state_backend: str) -> None:
    table = f"state-change-{uuid.uuid4().hex[:8]}"  # does not exist yet: waited for, its first commits count
    trigger = StateChangeTrigger(table=table, on=["keys"], key_prefix="sku-", poll_interval=0.1)

    async def scenario() -> tuple[Any, Any]:
        runner = trigger.run()  # the plain path (no store: the watermark lives in memory)
        first = asyncio.ensure_future(runner.__anext__())
        await asyncio.sleep(1.0)

        def writes() -> None:
            with PulsarStateHook() as hook, hook.get_table(table, writer_idle_timeout=0.1) as t:
                t.put("eur-1", {"p": 1})
                t.put("sku-1", {"p": 1})
                t.delete("sku-1")

        await asyncio.to_thread(writes)
        one = await asyncio.wait_for(first, 60)
        two = await asyncio.wait_for(runner.__anext__(), 60)
        await runner.aclose()
        return one, two

    one, two = asyncio.run(scenario())
    assert (one.payload["offset"], one.payload["prefix_sets"], one.payload["matched"], one.payload["view_apply"]) == (
        1,
        1,
        ["keys"],
        False,
    )
    assert (two.payload["prefix_deletes"], two.payload["offset"]) == (1, 2)


def test_the_hook_hands_out_the_feed_and_one_commits_changes(state_backend: str) -> None:
    table = f"state-change-{uuid.uuid4().hex[:8]}"
    applied = apply_view(table, {"sku-1": {"p": 1}, "sku-2": {"p": 2}})
    with PulsarStateHook() as hook:
        feed = hook.get_table_feed(table, after=-1, key_prefix="sku-")
        commits = feed.poll()
        assert [c.offset for c in commits][-1] == applied.commit_offset and commits[-1].prefix_sets == 2
        changes = hook.get_table_changes(table, applied.commit_offset)
        assert sorted((c.type, c.key, c.value) for c in changes.changes) == [
            ("set", "sku-1", {"p": 1}),
            ("set", "sku-2", {"p": 2}),
        ]
    assert feed.stats == {}  # closed with the hook


def test_a_batch_not_stored_stops_the_watermark_before_it() -> None:
    """An ack time-out or failed subscriber: nothing from that batch on is written; the stream
    ends with an error and the restarted trigger delivers it again (an edge of Airflow's ack mode,
    driven directly with outcomes as the manager reports them)."""
    from airflow.triggers.shared_stream import AdvanceItem, AdvanceOutcome

    from airflow_provider_pulsarstate.triggers.state_change import StateChangeError, StateChangeProducer

    class Memory:
        def __init__(self) -> None:
            self.values: dict[str, Any] = {}

        async def aget(self, key: str, default: Any = None) -> Any:
            return self.values.get(key, default)

        async def aset(self, key: str, value: Any) -> None:
            self.values[key] = value

    kwargs = StateChangeTrigger(table="t").serialize()[1]
    store = Memory()
    producer = StateChangeProducer(kwargs, store)
    producer._topic = "persistent://public/default/t"
    ok, failed = AdvanceOutcome(acked=1, failed=0), AdvanceOutcome(acked=0, failed=1)
    asyncio.run(producer.advance([AdvanceItem(3, ok), AdvanceItem(4, ok)]))
    assert store.values[watermark_key(kwargs)]["offset"] == 4
    with pytest.raises(StateChangeError, match="up to offset 6 were not all stored .*stays at 5"):
        asyncio.run(producer.advance([AdvanceItem(5, ok), AdvanceItem(6, failed), AdvanceItem(7, ok)]))
    assert store.values[watermark_key(kwargs)]["offset"] == 5
    with pytest.raises(StateChangeError):
        asyncio.run(producer.advance([AdvanceItem(8, ok)]))
    assert store.values[watermark_key(kwargs)]["offset"] == 5


def test_the_example_dag_parses_without_a_broker_and_watches_view_applies() -> None:
    import importlib.util

    from tests.airflow.dagruns import EXAMPLE_DAGS

    spec = importlib.util.spec_from_file_location("price_table_changes", EXAMPLE_DAGS / "price_table_changes.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # what the dag-processor does: no broker, no I/O
    (watcher,) = module.price_table_applies.watchers
    assert isinstance(watcher.trigger, StateChangeTrigger)
    assert watcher.trigger.serialize()[1]["on"] == ["view_apply"]
    events = {
        "asset": [
            SimpleNamespace(extra={"payload": {"table": "t", "offset": 7}}),
            SimpleNamespace(extra={"payload": {"table": "t", "offset": 7}}),  # delivered twice
            SimpleNamespace(extra={"payload": {"table": "t", "offset": 5}}),
            SimpleNamespace(extra={"from_rest_api": True}),
        ]
    }
    assert module.commits_of(events) == [("t", 5), ("t", 7)]


def test_provider_info_lists_the_trigger() -> None:
    from airflow_provider_pulsarstate.provider_info import provider_info

    assert "airflow_provider_pulsarstate.triggers.state_change" in provider_info()["triggers"][0]["python-modules"]


def test_triggers_on_one_table_share_one_reader_and_each_gets_its_own_events(state_backend: str) -> None:
    """What a triggerer with many watchers of one table holds: one reader of the table's log,
    closed with the last trigger; each trigger still gets exactly its own events, also after
    others were cancelled (one mid-read)."""
    from airflow_provider_pulsarstate.engine.recipes.shared_table_feed import open_table_readers

    table, n = f"state-change-{uuid.uuid4().hex[:8]}", 12
    with PulsarStateHook() as hook, hook.get_table(table, writer_idle_timeout=0.1) as t:
        t.put("setup", {"v": 0})
        topic = hook.topic_name(table)

    def put_each(keys: list[str]) -> dict[str, int]:
        offsets = {}
        with PulsarStateHook() as hook, hook.get_table(table, writer_idle_timeout=0.1) as t:
            for key in keys:
                t.put(key, {"v": 1})
                offsets[key] = t.manager.applied_offset
        return offsets

    async def scenario() -> float:
        async with LoopLag() as lag:
            manager = SharedStreamManager(ack_timeout=60)
            stores = [MemoryAccessor({}) for _ in range(n)]
            watchers = []
            for i in range(n):
                trigger = StateChangeTrigger(table=table, on=["keys"], key_prefix=f"p{i}-", poll_interval=0.2)
                trigger.asset_state_store = stores[i]
                watchers.append(Watcher(manager, trigger, i + 1))
            pending = [asyncio.ensure_future(w.next()) for w in watchers]
            await wait_for(lambda: all(s.writes for s in stores), "every trigger's first watermark")
            assert open_table_readers().get(topic) == 1
            offsets = await asyncio.to_thread(put_each, [f"p{i}-a" for i in range(n)])
            for i, w in enumerate(watchers):
                event = await asyncio.wait_for(pending[i], 60)
                assert (event.payload["offset"], event.payload["prefix_sets"]) == (offsets[f"p{i}-a"], 1)
                manager.confirm_persisted(w.seqs)
            pending = [asyncio.ensure_future(w.next()) for w in watchers]
            for i in range(0, n, 2):  # half are cancelled (waiting on the shared feed), the others go on
                await watchers[i].stop(pending[i])
            offsets = await asyncio.to_thread(put_each, [f"p{i}-b" for i in range(n)])
            for i in range(1, n, 2):
                event = await asyncio.wait_for(pending[i], 60)
                assert (event.payload["offset"], event.payload["prefix_sets"]) == (offsets[f"p{i}-b"], 1)
            assert open_table_readers().get(topic) == 1
            for i in range(1, n, 2):
                await watchers[i].stop()
            await wait_for(lambda: topic not in open_table_readers(), "the reader closed with the last trigger")
        return lag.worst

    assert asyncio.run(scenario()) < LOOP_LAG_LIMIT


def test_commits_that_fire_nothing_move_the_watermark_now_and_then(
    state_backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each commit of a busy table would otherwise cost every trigger watching it a batch and a
    watermark write; commits outside the trigger's prefix are passed over by the next batch."""
    from airflow.triggers.shared_stream import AdvanceItem, AdvanceOutcome

    from airflow_provider_pulsarstate.triggers import state_change

    monkeypatch.setattr(state_change, "IDLE_WATERMARK_INTERVAL", 1.5)
    table = f"state-change-{uuid.uuid4().hex[:8]}"

    def put(key: str) -> int:
        with PulsarStateHook() as hook, hook.get_table(table, writer_idle_timeout=0.1) as t:
            t.put(key, {"v": 1})
            return t.manager.applied_offset

    put("setup")
    kwargs = StateChangeTrigger(table=table, on=["keys"], key_prefix="sku-", poll_interval=0.1).serialize()[1]
    store = MemoryAccessor({})

    async def scenario() -> None:
        producer = state_change.StateChangeProducer(kwargs, store)
        stream = producer.open_stream()
        first = asyncio.ensure_future(stream.__anext__())
        await wait_for(lambda: store.writes, "the first watermark")
        other = await asyncio.to_thread(put, "eur-1")
        await asyncio.sleep(0.5)
        assert not first.done()  # nothing fires: no batch yet, the watermark stays
        mine = await asyncio.to_thread(put, "sku-1")
        batch, upto = await asyncio.wait_for(first, 30)
        assert [c["offset"] for c in batch["commits"]] == [mine] and upto == mine > other
        await producer.advance([AdvanceItem(upto, AdvanceOutcome(acked=1, failed=0))])
        late = await asyncio.to_thread(put, "eur-2")
        batch, upto = await asyncio.wait_for(stream.__anext__(), 30)  # the quiet interval passed
        assert batch["commits"] == [] and upto == late
        await stream.aclose()
        await producer.aclose()

    asyncio.run(scenario())


def test_triggers_starting_together_take_turns(monkeypatch: pytest.MonkeyPatch) -> None:
    """A triggerer (re)starting many triggers: at most STARTS_PER_TURN start steps (connection
    read, ...) per turn of the loop, the others in the next turns; nothing held across I/O, so
    a start waiting on the broker keeps no other from starting."""
    from airflow_provider_pulsarstate.triggers import start_gate, state_change
    from airflow_provider_pulsarstate.triggers.state_change import StateChangeProducer

    turn, per_turn, inside, most = 0, Counter(), 0, 0

    async def slow_config(hook: Any) -> Any:
        nonlocal inside, most
        per_turn[turn] += 1
        inside += 1
        most = max(most, inside)
        await asyncio.sleep(0.2)  # I/O
        inside -= 1
        raise ConfigurationError("stop here")

    monkeypatch.setattr(state_change, "shared_config", slow_config)

    async def scenario() -> list[Any]:
        loop = asyncio.get_running_loop()

        def count_turns() -> None:
            nonlocal turn
            turn += 1
            loop.call_soon(count_turns)

        loop.call_soon(count_turns)
        producers = [StateChangeProducer(StateChangeTrigger(table=f"t{i}").serialize()[1], None) for i in range(60)]
        return await asyncio.gather(*(p.open_stream().__anext__() for p in producers), return_exceptions=True)

    outcomes = asyncio.run(scenario())
    assert all(isinstance(o, ConfigurationError) for o in outcomes)
    assert max(per_turn.values()) <= start_gate.STARTS_PER_TURN < 60 == most, (per_turn, most)


def test_a_running_stream_keeps_no_hook_or_back_off_of_its_own(state_backend: str) -> None:
    """A triggerer runs a thousand of these streams for as long as it lives: each keeps only what
    its polls need, never a hook of its own (its lock, list and logger) nor a back-off between
    failures; fewer live objects per trigger put off the full garbage collections of the process.
    Counted objects, not time."""
    import gc

    from airflow_provider_pulsarstate.engine.retry import Backoff
    from airflow_provider_pulsarstate.triggers.state_change import StateChangeProducer

    table, n = f"state-change-{uuid.uuid4().hex[:8]}", 20
    with PulsarStateHook() as hook, hook.get_table(table, writer_idle_timeout=0.1) as t:
        t.put("setup", {"v": 0})

    def alive(cls: type) -> int:
        return sum(1 for o in gc.get_objects() if type(o) is cls)

    async def scenario() -> tuple[int, int]:
        producers = [
            StateChangeProducer(StateChangeTrigger(table=table, on=["keys"], key_prefix=f"p{i}-").serialize()[1], None)
            for i in range(n)
        ]
        streams = [p.open_stream() for p in producers]
        tasks = [asyncio.ensure_future(s.__anext__()) for s in streams]
        try:
            await wait_for(
                lambda: all(p._feed is not None and p._feed.after is not None for p in producers), "every feed"
            )
            await asyncio.sleep(0.2)  # every stream past its first poll, sleeping until the next
            gc.collect()
            return alive(PulsarStateHook), alive(Backoff)
        finally:
            await close_shared_streams(tasks, streams, producers)

    hooks, backoffs = asyncio.run(scenario())
    assert hooks < n / 2 and backoffs < n / 2, f"{hooks} hooks and {backoffs} back-offs alive for {n} running streams"


def test_streams_starting_or_failing_together_write_one_log_line_not_one_each(
    state_backend: str, caplog: pytest.LogCaptureFixture
) -> None:
    """In a triggerer every log line is a blocking write, on the event loop, into the socket its
    supervisor reads; a thousand lines at once fill it and hold the loop until the supervisor
    reads (measured: the loop blocked 0.5 s inside one of these warnings). Streams of one table
    that start together, or retry a table that is not there yet, write one line, not one each.
    Counted log records, not time."""
    import logging

    from airflow_provider_pulsarstate.triggers.state_change import StateChangeProducer

    n = 60
    missing, table = f"state-change-{uuid.uuid4().hex[:8]}", f"state-change-{uuid.uuid4().hex[:8]}"
    with PulsarStateHook() as hook, hook.get_table(table, writer_idle_timeout=0.1) as t:
        t.put("setup", {"v": 0})

    def records(level: int, text: str) -> int:
        return sum(1 for r in caplog.records if r.levelno == level and text in r.getMessage())

    async def run_streams(name: str, until: Any) -> None:
        stores = [MemoryAccessor({}) for _ in range(n)]
        producers = [
            StateChangeProducer(
                StateChangeTrigger(table=name, on=["keys"], key_prefix=f"p{i}-", poll_interval=0.2).serialize()[1],
                stores[i],
            )
            for i in range(n)
        ]
        streams = [p.open_stream() for p in producers]
        tasks = [asyncio.ensure_future(s.__anext__()) for s in streams]
        try:
            await wait_for(lambda: until(producers, stores), f"{n} streams of {name}")
        finally:
            await close_shared_streams(tasks, streams, producers)

    logger = "airflow_provider_pulsarstate.triggers.state_change"
    with caplog.at_level(logging.INFO, logger=logger):
        # a stream writes watermark -1 right after its first failed read of a missing table
        asyncio.run(
            run_streams(missing, lambda _, stores: all(s.writes == [{"offset": -1, "table": ANY}] for s in stores))
        )
        asyncio.run(
            run_streams(table, lambda ps, _: all(p._feed is not None and p._feed.after is not None for p in ps))
        )
    with PulsarStateHook() as hook:
        missing_topic, topic = hook.topic_name(missing), hook.topic_name(table)
    assert records(logging.WARNING, f"reading table {missing_topic} failed (TableNotFoundError") == 1, caplog.text[
        -3000:
    ]
    assert records(logging.INFO, f"watching table {topic} after commit offset") == 1, caplog.text[-3000:]
