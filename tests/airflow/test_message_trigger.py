"""PulsarMessageTrigger against the real broker: serialization, events from real messages, the
shared stream in ack mode (Airflow's own SharedStreamManager driving our producer, the runner's
persist confirmations simulated), rejects dead-lettered, the loop never blocked."""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any

import pulsar
import pytest
import requests

from airflow_provider_pulsarstate.engine.errors import ConfigurationError
from airflow_provider_pulsarstate.engine.topic_stream import PayloadTooLargeError, TopicMessage
from airflow_provider_pulsarstate.triggers.messages import PulsarMessageTrigger
from tests.airflow.trigger_driver import LOOP_LAG_LIMIT, LoopLag, close_shared_streams, drive

FUNCS = "tests.airflow.message_functions"


def _fresh(prefix: str = "msgs") -> str:
    return f"persistent://public/default/{prefix}-{uuid.uuid4().hex[:10]}"


@pytest.fixture
def broker_conn(request: pytest.FixtureRequest, env_connection: Any) -> tuple[str, Any]:
    broker = request.getfixturevalue("pulsar_broker")
    extra = {"service_url": broker.service_url, "admin_url": broker.admin_url, "operation_timeout": 15}
    return env_connection("ps_msgs", extra=extra), broker


def _create(broker: Any, topic: str, partitions: int = 0) -> None:
    path = topic.replace("persistent://", "persistent/")
    if partitions:
        resp = requests.put(f"{broker.admin_url}/admin/v2/{path}/partitions", json=partitions, timeout=10)
    else:
        resp = requests.put(f"{broker.admin_url}/admin/v2/{path}", timeout=10)
    assert resp.status_code in (204, 409), resp.text


def _publish(broker: Any, topic: str, payloads: list[bytes]) -> None:
    client = pulsar.Client(broker.service_url)
    try:
        producer = client.create_producer(topic, batching_enabled=False)
        for payload in payloads:
            producer.send(payload, partition_key="k")
    finally:
        client.close()


def _sub_stats(broker: Any, topic: str, subscription: str) -> dict[str, Any]:
    path = topic.replace("persistent://", "persistent/")
    stats = requests.get(f"{broker.admin_url}/admin/v2/{path}/stats", timeout=10).json()
    return stats["subscriptions"].get(subscription, {})


# ---------------------------------------------------------------------------- no broker needed
def test_serialize_round_trip_is_stable_and_does_no_io() -> None:
    from airflow.providers.common.messaging.triggers.msg_queue import MessageQueueTrigger
    from airflow.triggers.base import BaseEventTrigger

    kwargs = dict(
        topics="orders",
        subscription="orders-dag",
        batch_size=10,
        batch_wait=0.5,
        filter_function=f"{FUNCS}.only_b",
        payload_encoding="json",
        dead_letter_topic="orders-dlq",
        pulsarstate_conn_id="not_defined_anywhere",
    )  # no I/O: an undefined connection is fine here
    classpath, serialized = PulsarMessageTrigger(**kwargs).serialize()
    assert classpath == "airflow_provider_pulsarstate.triggers.messages.PulsarMessageTrigger"
    assert serialized["topics"] == ["orders"] and json.loads(json.dumps(serialized)) == serialized
    again = PulsarMessageTrigger(**serialized).serialize()
    assert again == (classpath, serialized)
    assert BaseEventTrigger.hash(*again) == BaseEventTrigger.hash(classpath, serialized)
    assert MessageQueueTrigger(scheme="pulsar", **kwargs).serialize() == (classpath, serialized)
    # watchers differing only in filter/apply/encoding share a consumer; other options do not
    base = PulsarMessageTrigger(**serialized)
    assert (
        base.shared_stream_key()
        == PulsarMessageTrigger(
            **{**serialized, "filter_function": None, "payload_encoding": "text"}
        ).shared_stream_key()
    )
    assert base.shared_stream_key() != PulsarMessageTrigger(**{**serialized, "subscription": "x"}).shared_stream_key()
    assert base.shared_stream_key() != PulsarMessageTrigger(**{**serialized, "batch_size": 1}).shared_stream_key()


@pytest.mark.parametrize(
    ("bad", "field"),
    [
        ({"topics": []}, "topics"),
        ({"topics": ["a", "a"]}, "topics"),
        ({"subscription": ""}, "subscription"),
        ({"batch_size": 0}, "batch_size"),
        ({"batch_size": True}, "batch_size"),
        ({"batch_wait": -1}, "batch_wait"),
        ({"filter_function": "lambda m: True"}, "filter_function"),
        ({"apply_function": "nodots"}, "apply_function"),
        ({"payload_encoding": "pickle"}, "payload_encoding"),
        ({"initial_position": "middle"}, "initial_position"),
        ({"max_redeliveries": -1}, "max_redeliveries"),
        ({"dead_letter_topic": " "}, "dead_letter_topic"),
        ({"max_payload_bytes": -1}, "max_payload_bytes"),
        ({"oversized_payloads": "drop"}, "oversized_payloads"),
        ({"max_event_bytes": 10}, "max_event_bytes"),
    ],
)
def test_bad_arguments_name_the_field(bad: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigurationError, match=field):
        PulsarMessageTrigger(**{"topics": "t", "subscription": "s", **bad})


def test_an_embedded_connection_is_refused_naming_it(env_connection: Any, tmp_path: Any) -> None:
    conn = env_connection("ps_embedded_msgs", extra={"service_url": str(tmp_path / "state.db")})
    trigger = PulsarMessageTrigger(topics="t", subscription="s", pulsarstate_conn_id=conn)

    async def first() -> Any:
        return await trigger.run().__anext__()

    with pytest.raises(ConfigurationError, match="connection 'ps_embedded_msgs' uses the embedded back end"):
        asyncio.run(first())


# ---------------------------------------------------------------------------- real broker
@pytest.mark.pulsar
def test_run_yields_events_from_real_messages_without_blocking_the_loop(broker_conn: tuple[str, Any]) -> None:
    conn, broker = broker_conn
    topic = _fresh()
    _create(broker, topic)
    _publish(broker, topic, [b'{"sku": "a", "price": 9.5}', b'{"sku": "b"}'])
    trigger = PulsarMessageTrigger(
        topics=topic,
        subscription="run",
        batch_size=5,
        batch_wait=0.3,
        payload_encoding="json",
        initial_position="earliest",
        pulsarstate_conn_id=conn,
    )
    event, worst, ticks = asyncio.run(drive(trigger))
    assert event.payload["topic"] == topic and event.payload["partition"] == -1
    assert [m["payload"] for m in event.payload["messages"]] == [{"sku": "a", "price": 9.5}, {"sku": "b"}]
    assert event.payload["messages"][0]["key"] == "k" and event.payload["messages"][0]["payload_encoding"] == "json"
    assert worst < LOOP_LAG_LIMIT and ticks > 10, (worst, ticks)


async def _runner(manager: Any, trigger_id: int, trigger: PulsarMessageTrigger, key: Any, out: list) -> None:
    """What the triggerer's run_trigger does with a shared-stream trigger's events."""
    stream = manager.subscribe(trigger_id=trigger_id, trigger=trigger, key=key)
    try:
        async for event in trigger.filter_shared_stream(stream):
            out.append((event, manager.bind_pending_event(trigger_id=trigger_id, key=key)))
    finally:
        await manager.unsubscribe(trigger_id, key)


async def _until(predicate: Any, timeout: float = 20.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("timed out")
        await asyncio.sleep(0.05)


@pytest.mark.pulsar
def test_shared_stream_one_consumer_two_watchers_acks_only_after_persistence(broker_conn: tuple[str, Any]) -> None:
    """Two watchers of one topic (different filters) share one consumer; nothing is acknowledged
    before both resolved and the runner confirmed the events stored; a poison message rejected by
    one watcher goes to the dead-letter topic; the loop is never blocked."""
    from airflow.triggers.shared_stream import SharedStreamManager

    conn, broker = broker_conn
    topic, dlq = _fresh(), _fresh("dlq")
    _create(broker, topic, partitions=2)
    _create(broker, dlq)
    common = dict(
        topics=[topic],
        subscription="watchers",
        initial_position="earliest",
        dead_letter_topic=dlq,
        redelivery_delay=0.2,
        pulsarstate_conn_id=conn,
    )
    everything = PulsarMessageTrigger(**common, apply_function=f"{FUNCS}.explode_on_poison")
    only_b = PulsarMessageTrigger(**common, filter_function=f"{FUNCS}.only_b", apply_function=f"{FUNCS}.upper")
    key = everything.shared_stream_key()
    assert key == only_b.shared_stream_key()

    async def scenario() -> tuple[list, list, float, dict]:
        manager = SharedStreamManager(ack_timeout=30)
        got_a: list = []
        got_b: list = []
        lag = LoopLag()
        await lag.__aenter__()
        tasks = [
            asyncio.create_task(_runner(manager, 1, everything, key, got_a)),
            asyncio.create_task(_runner(manager, 2, only_b, key, got_b)),
        ]
        try:
            await asyncio.to_thread(_publish, broker, f"{topic}-partition-0", [b"a1", b"b2", b"poison"])
            await asyncio.to_thread(_publish, broker, f"{topic}-partition-1", [b"b3"])
            await _until(lambda: len(got_a) == 3 and len(got_b) == 2)
            stats0 = await asyncio.to_thread(_sub_stats, broker, f"{topic}-partition-0", "watchers")
            stats1 = await asyncio.to_thread(_sub_stats, broker, f"{topic}-partition-1", "watchers")
            consumers = [len(s.get("consumers", [])) for s in (stats0, stats1)]
            await asyncio.sleep(0.5)  # time for a (wrong) early acknowledgement
            before = [
                (await asyncio.to_thread(_sub_stats, broker, f"{topic}-partition-{p}", "watchers"))["msgBacklog"]
                for p in (0, 1)
            ]
            manager.confirm_persisted([seq for _, seq in got_a + got_b])
            await _until(
                lambda: all(_sub_stats(broker, f"{topic}-partition-{p}", "watchers")["msgBacklog"] == 0 for p in (0, 1))
            )
        finally:
            await lag.__aexit__()
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await manager.stop_all()
        return got_a, got_b, lag.worst, {"consumers": consumers, "backlog_before_confirm": before}

    got_a, got_b, worst, seen = asyncio.run(scenario())
    assert seen["consumers"] == [1, 1], seen  # one consumer (per partition) for both watchers
    # a1, b2 (and the poison message behind them in its partition's order) | b3: nothing acknowledged
    # before the events were stored
    assert seen["backlog_before_confirm"] == [3, 1], seen
    assert sorted(m["payload"] for e, _ in got_a for m in e.payload["messages"]) == ["a1", "b2", "b3"]
    assert sorted(m["payload"] for e, _ in got_b for m in e.payload["messages"]) == ["B2", "B3"]
    assert all(seq is not None for _, seq in got_a + got_b)  # every event was bound for ack mode
    assert worst < LOOP_LAG_LIMIT, worst
    client = pulsar.Client(broker.service_url)
    try:
        dead = client.create_reader(dlq, pulsar.MessageId.earliest).read_next(5000)
    finally:
        client.close()
    assert dead.data() == b"poison" and "rejected" in dead.properties()["pulsarstate-dead-letter-reason"]


@pytest.mark.pulsar
def test_an_event_never_stored_is_negatively_acknowledged_and_comes_again(broker_conn: tuple[str, Any]) -> None:
    """Watcher 1's event is never confirmed stored: the ack timeout fails it, the producer nacks the
    message instead of acknowledging it (watcher 2 had stored its event), and it comes again."""
    from airflow.triggers.shared_stream import AckTimeout, SharedStreamManager

    conn, broker = broker_conn
    topic = _fresh()
    _create(broker, topic)
    common = dict(
        topics=[topic],
        subscription="timeouts",
        initial_position="earliest",
        redelivery_delay=0.2,
        pulsarstate_conn_id=conn,
    )
    never_stored = PulsarMessageTrigger(**common, payload_encoding="text")
    stored = PulsarMessageTrigger(**common, payload_encoding="base64")
    key = stored.shared_stream_key()

    async def scenario() -> tuple[list, list, Any]:
        manager = SharedStreamManager(ack_timeout=1.0)
        got_1: list = []
        got_2: list = []

        async def confirming() -> None:
            stream = manager.subscribe(trigger_id=2, trigger=stored, key=key)
            try:
                async for event in stored.filter_shared_stream(stream):
                    got_2.append(event)
                    manager.confirm_persisted([manager.bind_pending_event(trigger_id=2, key=key)])
            finally:
                await manager.unsubscribe(2, key)

        first = asyncio.create_task(_runner(manager, 1, never_stored, key, got_1))
        second = asyncio.create_task(confirming())
        try:
            await asyncio.to_thread(_publish, broker, topic, [b"once"])
            await _until(lambda: first.done())  # force-failed by the ack timeout
            await _until(lambda: len(got_2) == 2)  # redelivered after the nack
            await _until(lambda: _sub_stats(broker, topic, "timeouts")["msgBacklog"] == 0)
        finally:
            second.cancel()
            await asyncio.gather(first, second, return_exceptions=True)
            await manager.stop_all()
        return got_1, got_2, first.exception()

    got_1, got_2, failure = asyncio.run(scenario())
    assert isinstance(failure, AckTimeout), failure
    assert len(got_1) == 1
    ids = [e.payload["messages"][0]["message_id"] for e in got_2]
    assert ids[0] == ids[1] and got_2[0].payload["messages"][0]["payload"] == "b25jZQ=="


# ---------------------------------------------------------------------------- bounded events
def _message(i: int, payload: bytes, topic: str = "persistent://public/default/t") -> TopicMessage:
    return TopicMessage(
        topic=topic,
        partition=-1,
        ledger_id=7,
        entry_id=i,
        batch_index=-1,
        message_id=b"id%d" % i,
        key=None,
        properties={},
        payload=payload,
        publish_time=0,
        event_time=None,
        redelivery_count=0,
    )


def test_an_event_stays_within_max_event_bytes_passing_its_largest_payloads_by_reference() -> None:
    """Eight 60 KB payloads (each under max_payload_bytes) in one batch: the event passes its
    largest payloads by reference until its JSON fits max_event_bytes; a payload over
    max_payload_bytes is never carried; with oversized_payloads="reject" it is refused (rejected)."""
    sizes = [60_000 + i for i in range(8)] + [70_000]
    batch = [_message(i, b"x" * n) for i, n in enumerate(sizes)]
    trigger = PulsarMessageTrigger(topics="t", subscription="s", batch_size=9, max_event_bytes=200_000)
    event = asyncio.run(trigger.event_for(batch))
    entries = event.payload["messages"]
    assert len(json.dumps(event.payload).encode()) <= 200_000
    carried = [e for e in entries if e["payload_encoding"] == "text"]
    assert len(carried) == 3 and all(e["payload"] == "x" * e["payload_size"] for e in carried)
    references = [e for e in entries if e["payload_encoding"] == "reference"]
    assert all(e["payload"] is None and e["message_id"] for e in references)
    assert entries[8]["payload_encoding"] == "reference"  # over max_payload_bytes (64 KiB)
    assert sorted(e["payload_size"] for e in carried) == sizes[:3]  # the largest went by reference first

    strict = PulsarMessageTrigger(topics="t", subscription="s", oversized_payloads="reject")
    with pytest.raises(PayloadTooLargeError, match="max_payload_bytes=65536"):
        asyncio.run(strict.event_for(batch[8:]))
    huge_results = PulsarMessageTrigger(
        topics="t", subscription="s", apply_function=f"{FUNCS}.upper", max_event_bytes=50_000
    )
    with pytest.raises(PayloadTooLargeError, match="max_event_bytes=50000"):
        asyncio.run(huge_results.event_for(batch[:1]))  # apply results cannot be passed by reference


@pytest.mark.pulsar
def test_large_payloads_go_by_reference_without_stalling_the_loop_and_a_task_reads_them(
    broker_conn: tuple[str, Any],
) -> None:
    """12 JSON messages of 4 MB, batches of 4: each event stays within max_event_bytes (payloads
    passed by reference, never decoded on the loop), the loop is not stalled, and the hook reads
    a referenced message back whole."""
    from airflow_provider_pulsarstate.hooks.pulsarstate import PulsarStateHook

    conn, broker = broker_conn
    topic = _fresh()
    _create(broker, topic)
    docs = [json.dumps({"i": i, "rows": ["r" * 100] * 40_000}).encode() for i in range(12)]
    assert all(len(d) > 4_000_000 for d in docs)
    _publish(broker, topic, docs)
    trigger = PulsarMessageTrigger(
        topics=topic,
        subscription="big",
        batch_size=4,
        batch_wait=2.0,
        payload_encoding="json",
        initial_position="earliest",
        pulsarstate_conn_id=conn,
    )

    async def three_events() -> tuple[list[Any], LoopLag]:
        events = []
        async with LoopLag() as lag:
            runner = trigger.run()
            while sum(len(e.payload["messages"]) for e in events) < 12:
                events.append(await asyncio.wait_for(runner.__anext__(), 120))
            await runner.aclose()
        return events, lag

    events, lag = asyncio.run(three_events())
    assert max(len(json.dumps(e.payload).encode()) for e in events) <= trigger.max_event_bytes
    entries = [m for e in events for m in e.payload["messages"]]
    assert all(m["payload_encoding"] == "reference" and m["payload"] is None for m in entries)
    assert [m["payload_size"] for m in entries] == [len(d) for d in docs]
    assert lag.worst < LOOP_LAG_LIMIT and lag.ticks > 10, (lag.worst, lag.ticks)
    with PulsarStateHook(pulsarstate_conn_id=conn) as hook:
        message = hook.read_message(entries[5])
        assert message.payload == docs[5] and message.decode_payload("json")[1]["i"] == 5
        with pytest.raises(ConfigurationError, match="message_id"):
            hook.read_message({"topic": topic, "message_id": "not base64!"})


def test_a_running_stream_keeps_no_trigger_of_its_own(broker_conn: tuple[str, Any]) -> None:
    """The producer Airflow builds from a watcher's kwargs makes a trigger only to open the consumer;
    a running stream (a thousand live as long as the triggerer) keeps none, since every kept object
    counts towards the process's next full garbage collection. Counted objects, not time."""
    import gc

    conn, broker = broker_conn
    topic, n = _fresh(), 12
    _create(broker, topic)
    kwargs = [
        PulsarMessageTrigger(topics=[topic], subscription=f"keep-{i}", pulsarstate_conn_id=conn).serialize()[1]
        for i in range(n)
    ]

    async def scenario() -> int:
        producers = [PulsarMessageTrigger.create_shared_stream_producer(k) for k in kwargs]
        streams = [p.open_stream() for p in producers]  # type: ignore[attr-defined]
        tasks = [asyncio.ensure_future(s.__anext__()) for s in streams]
        try:
            deadline = asyncio.get_running_loop().time() + 60
            while not all(p._stream is not None for p in producers):  # type: ignore[attr-defined]
                assert asyncio.get_running_loop().time() < deadline, "the consumers did not open"
                await asyncio.sleep(0.05)
            await asyncio.sleep(0.2)  # every stream waiting for its first message
            gc.collect()
            return sum(1 for o in gc.get_objects() if type(o) is PulsarMessageTrigger)
        finally:
            await close_shared_streams(tasks, streams, producers)

    alive = asyncio.run(scenario())
    assert alive < n / 2, f"{alive} triggers alive for {n} running streams"


def test_watchers_retrying_an_unreachable_broker_together_write_one_warning_not_one_each(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A triggerer's log lines are blocking writes on its event loop (into the socket its
    supervisor reads): a thousand watchers of a topic retrying an unreachable broker together
    write one warning, not one each. The back end is a stand-in that refuses twice per watcher;
    the retry loop is the trigger's own. Counted log records, not time."""
    import logging

    from airflow_provider_pulsarstate.engine.errors import BackendUnavailableError
    from airflow_provider_pulsarstate.hooks.pulsarstate import PulsarStateHook
    from airflow_provider_pulsarstate.triggers import messages

    n, topic, opened = 30, f"msg-{uuid.uuid4().hex[:8]}", object()

    class RefusingTwice:
        def __init__(self) -> None:
            self.tries = 0

        async def open(self) -> object:
            self.tries += 1
            if self.tries <= 2:
                raise BackendUnavailableError("broker pulsar://127.0.0.1:1 unreachable (stand-in)")
            return opened

    streams: dict[str, RefusingTwice] = {}

    def stream_for(self: Any, topics: Any, subscription: str, **_: Any) -> RefusingTwice:
        return streams.setdefault(subscription, RefusingTwice())

    async def no_lookup(hook: Any) -> None:
        return None

    monkeypatch.setattr(PulsarStateHook, "get_async_topic_stream", stream_for)
    monkeypatch.setattr(messages, "shared_config", no_lookup)
    triggers = [PulsarMessageTrigger(topics=topic, subscription=f"s{i}") for i in range(n)]

    async def scenario() -> list[object]:
        return await asyncio.gather(*(t.open_topic_stream() for t in triggers))

    with caplog.at_level(logging.INFO, logger=messages.__name__):
        assert asyncio.run(scenario()) == [opened] * n
    assert all(s.tries == 3 for s in streams.values()) and len(streams) == n
    warnings = [
        r for r in caplog.records if r.levelno == logging.WARNING and "unreachable (stand-in)" in r.getMessage()
    ]
    assert len(warnings) == 1, caplog.text[-3000:]
