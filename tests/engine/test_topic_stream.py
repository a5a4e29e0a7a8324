"""TopicStream against the real broker: batching, the per-partition floor, redelivery after a
negative acknowledgement, dead letters, bad input. The embedded back end is refused (named)."""

from __future__ import annotations

import asyncio
import base64
import gc
import uuid
from pathlib import Path
from typing import Any

import pulsar
import pytest
import requests

from airflow_provider_pulsarstate import ConnectionConfig, open_backend
from airflow_provider_pulsarstate.engine.errors import ConfigurationError
from airflow_provider_pulsarstate.engine.offsets import create_topic
from airflow_provider_pulsarstate.engine.topic_stream import (
    DEAD_LETTER_PROPERTY_PREFIX,
    REFERENCE_ENCODING,
    MessageUnavailableError,
    PayloadDecodeError,
    TopicMessage,
    TopicStreamError,
    open_topic_stream,
    read_topic_message,
)
from tests.conftest import pulsar_config


def _fresh(prefix: str = "stream") -> str:
    return f"persistent://public/default/{prefix}-{uuid.uuid4().hex[:10]}"


@pytest.fixture
def config(pulsar_broker: object) -> ConnectionConfig:
    return pulsar_config(pulsar_broker, operation_timeout=10.0)


def _make_topic(config: ConnectionConfig, topic: str, partitions: int = 0) -> None:
    backend = open_backend(config)
    try:
        create_topic(backend, topic, partitions=partitions)
    finally:
        backend.close()


def _publish(config: ConnectionConfig, topic: str, payloads: list[bytes]) -> None:
    client = pulsar.Client(config.url)
    try:
        producer = client.create_producer(topic, batching_enabled=False)
        for i, payload in enumerate(payloads):
            producer.send(payload, properties={"i": str(i)}, partition_key=f"k{i}")
        producer.flush()
    finally:
        client.close()


def _subscription_backlog(config: ConnectionConfig, topic: str, subscription: str) -> int:
    path = topic.replace("persistent://", "persistent/")
    stats = requests.get(f"{config.admin_url}/admin/v2/{path}/stats", timeout=10).json()
    return int(stats["subscriptions"][subscription]["msgBacklog"])


def run(coro):  # noqa: ANN001, ANN201
    return asyncio.run(coro)


@pytest.mark.pulsar
def test_subscribing_leaves_no_garbage_in_reference_cycles(config: ConnectionConfig) -> None:
    """A triggerer subscribes a thousand watchers together; each subscription must not leave
    garbage that only the cycle collector frees (``pulsar.asyncio`` made a new schema per
    subscribe, ~30 such objects each: 1,000 subscriptions made a full collection of the whole
    process fall due while they started). Counted objects, not time."""
    topic = _fresh()
    _make_topic(config, topic)
    streams_per_run = 20

    async def go() -> int:
        holder = await open_topic_stream(config, topics=[topic], subscription="holder").open()  # the shared client
        streams = []
        try:
            gc.collect()
            gc.disable()
            try:
                for i in range(streams_per_run):
                    streams.append(await open_topic_stream(config, topics=[topic], subscription=f"s{i}").open())
                return gc.collect()
            finally:
                gc.enable()
        finally:
            for stream in streams:
                await stream.aclose()
            await holder.aclose()

    garbage = run(go())
    assert garbage / streams_per_run < 10, f"{garbage / streams_per_run:.1f} objects of cyclic garbage per subscribe"


@pytest.mark.pulsar
def test_batches_respect_size_and_wait_and_carry_plain_data(config: ConnectionConfig) -> None:
    topic = _fresh()
    _make_topic(config, topic)
    _publish(config, topic, [f"m{i}".encode() for i in range(7)] + [b"\xff\xfe"])

    async def go() -> tuple[list[list[TopicMessage]], float]:
        async with open_topic_stream(config, topics=[topic], subscription="s", initial_position="earliest") as stream:
            batches = [await stream.receive_batch(max_messages=3, max_wait=2.0, timeout=10) for _ in range(3)]
            started = asyncio.get_running_loop().time()
            empty = await stream.receive_batch(max_messages=3, max_wait=0.2, timeout=0.3)
            waited = asyncio.get_running_loop().time() - started
            assert empty == []
            await stream.acknowledge([m for b in batches for m in b])
            return batches, waited

    batches, waited = run(go())
    assert [len(b) for b in batches] == [3, 3, 2]
    assert 0.25 <= waited < 2.0
    messages = [m for b in batches for m in b]
    assert [m.payload for m in messages[:7]] == [f"m{i}".encode() for i in range(7)]
    first = messages[0].as_json()
    assert first["topic"] == topic and first["partition"] == -1 and first["payload"] == "m0"
    assert first["payload_encoding"] == "text" and first["properties"] == {"i": "0"} and first["key"] == "k0"
    assert pulsar.MessageId.deserialize(base64.b64decode(first["message_id"])).entry_id() == messages[0].entry_id
    binary = messages[7].as_json()  # not UTF-8: base64 under "auto"
    assert binary["payload_encoding"] == "base64" and base64.b64decode(binary["payload"]) == b"\xff\xfe"
    with pytest.raises(PayloadDecodeError, match=messages[7].id_text):
        messages[7].decode_payload("text")
    with pytest.raises(PayloadDecodeError, match="not JSON"):
        messages[0].decode_payload("json")
    assert _subscription_backlog(config, topic, "s") == 0


@pytest.mark.pulsar
def test_a_failed_message_holds_the_floor_and_comes_again(config: ConnectionConfig) -> None:
    """m1 fails, m0 and m2..m4 succeed: the cumulative ack stops below m1 (m2.. are acked one by
    one); m1 is redelivered (only m1: duplicates of the in-flight rewind are dropped) and, once
    acknowledged, nothing is left. Without the floor a cumulative ack of m4 would drop m1."""
    topic = _fresh()
    _make_topic(config, topic)
    _publish(config, topic, [f"m{i}".encode() for i in range(5)])

    async def go() -> tuple[list[bytes], dict]:
        async with open_topic_stream(
            config, topics=[topic], subscription="s", initial_position="earliest", redelivery_delay=0.2
        ) as stream:
            batch = await stream.receive_batch(max_messages=5, max_wait=2.0, timeout=10)
            assert [m.payload for m in batch] == [f"m{i}".encode() for i in range(5)]
            await stream.fail([batch[1]])
            await stream.acknowledge([batch[0], *batch[2:]])
            stats = dict(stream.stats)
            again = [m.payload for m in await stream.receive_batch(max_messages=10, max_wait=1.0, timeout=10)]
            assert list(stream.unsettled().values()) == [{"inflight": [batch[1].position], "failed": []}]
            return again, stats

    again, stats = run(go())
    assert again == [b"m1"], again
    assert stats["cumulative_acks"] == 1 and stats["individual_acks"] == 3 and stats["negative_acks"] == 1
    # the consumer closed with m1 unacknowledged: the broker keeps exactly m1
    assert _subscription_backlog(config, topic, "s") == 1

    async def settle() -> list[bytes]:
        async with open_topic_stream(config, topics=[topic], subscription="s") as stream:
            batch = await stream.receive_batch(max_messages=10, max_wait=0.5, timeout=10)
            await stream.acknowledge(batch)
            return [m.payload for m in batch]

    assert run(settle()) == [b"m1"]
    assert _subscription_backlog(config, topic, "s") == 0


@pytest.mark.pulsar
def test_floor_is_per_partition(config: ConnectionConfig) -> None:
    """A failure on one partition does not hold back cumulative acks on the other."""
    topic = _fresh()
    _make_topic(config, topic, partitions=2)
    _publish(config, topic, [f"m{i}".encode() for i in range(20)])

    async def go() -> tuple[dict, dict]:
        async with open_topic_stream(
            config, topics=[topic], subscription="s", initial_position="earliest", redelivery_delay=30.0
        ) as stream:
            batch = await stream.receive_batch(max_messages=20, max_wait=3.0, timeout=10)
            assert len(batch) == 20
            lanes = sorted({m.lane for m in batch})
            assert len(lanes) == 2 and {m.partition for m in batch} == {0, 1}
            p0 = [m for m in batch if m.lane == lanes[0]]
            p1 = [m for m in batch if m.lane == lanes[1]]
            await stream.fail([p0[0]])
            await stream.acknowledge(p0[1:] + p1)
            return dict(stream.stats), stream.unsettled()

    stats, unsettled = run(go())
    assert stats["cumulative_acks"] == 1  # partition 1 only: partition 0's floor is its failed head
    assert list(unsettled) and all(v["failed"] and not v["inflight"] for v in unsettled.values())
    assert sum(_subscription_backlog(config, f"{topic}-partition-{p}", "s") for p in (0, 1)) == 1


@pytest.mark.pulsar
def test_dead_letter_after_max_redeliveries_and_on_demand(config: ConnectionConfig) -> None:
    topic, dlq = _fresh(), _fresh("dlq")
    _make_topic(config, topic)
    _make_topic(config, dlq)
    _publish(config, topic, [b"poison", b"refused", b"fine"])

    async def go() -> dict:
        async with open_topic_stream(
            config,
            topics=[topic],
            subscription="s",
            initial_position="earliest",
            redelivery_delay=0.1,
            dead_letter_topic=dlq,
            max_redeliveries=1,
        ) as stream:
            poison, refused, fine = await stream.receive_batch(max_messages=3, max_wait=2.0, timeout=10)
            await stream.dead_letter([refused], reason="refused by the filter")
            await stream.acknowledge([fine])
            await stream.fail([poison], reason="boom")  # failure 1: redelivered
            again = await stream.receive(timeout=10)
            assert again is not None and again.payload == b"poison"
            await stream.fail([again], reason="boom")  # failure 2 > max_redeliveries: dead-lettered
            nothing = await stream.receive(timeout=0.8)
            assert nothing is None
            return dict(stream.stats)

    stats = run(go())
    assert stats["dead_lettered"] == 2 and stats["negative_acks"] == 1
    assert _subscription_backlog(config, topic, "s") == 0
    client = pulsar.Client(config.url)
    try:
        reader = client.create_reader(dlq, pulsar.MessageId.earliest)
        got = [reader.read_next(5000) for _ in range(2)]
    finally:
        client.close()
    by_payload = {m.data(): m.properties() for m in got}
    assert by_payload[b"refused"][f"{DEAD_LETTER_PROPERTY_PREFIX}reason"] == "refused by the filter"
    assert by_payload[b"poison"][f"{DEAD_LETTER_PROPERTY_PREFIX}topic"] == topic
    assert by_payload[b"poison"]["i"] == "0"  # the original properties are kept


@pytest.mark.pulsar
def test_bad_input_names_the_field(config: ConnectionConfig) -> None:
    topic = _fresh()
    cases = [
        ({"topics": ["short-name"], "subscription": "s"}, "topics"),
        ({"topics": [topic, topic], "subscription": "s"}, "names a topic twice"),
        ({"topics": [], "subscription": "s"}, "topics"),
        ({"topics": [topic], "subscription": " "}, "subscription"),
        ({"topics": [topic], "subscription": "s", "initial_position": "middle"}, "initial_position"),
        ({"topics": [topic], "subscription": "s", "redelivery_delay": -1}, "redelivery_delay"),
        ({"topics": [topic], "subscription": "s", "max_redeliveries": 1.5}, "max_redeliveries"),
        ({"topics": [topic], "subscription": "s", "receiver_queue_size": 0}, "receiver_queue_size"),
        ({"topics": [topic], "subscription": "s", "dead_letter_topic": topic}, "dead_letter_topic"),
        ({"topics": [topic], "subscription": "s", "dead_letter_topic": "x/y"}, "dead_letter_topic"),
    ]
    for kwargs, field in cases:
        with pytest.raises(ConfigurationError, match=field):
            open_topic_stream(config, **kwargs)

    async def unknown() -> None:
        async with open_topic_stream(config, topics=[topic], subscription="s"):
            pass

    with pytest.raises(ConfigurationError, match=f"topics: {topic} does not exist"):
        run(unknown())

    async def bad_batch() -> None:
        _make_topic(config, topic)
        async with open_topic_stream(config, topics=[topic], subscription="s") as stream:
            with pytest.raises(ConfigurationError, match="max_messages"):
                await stream.receive_batch(max_messages=0, max_wait=1)
            with pytest.raises(ConfigurationError, match="max_wait"):
                await stream.receive_batch(max_messages=1, max_wait=-1)

    run(bad_batch())


def test_embedded_back_end_is_refused_naming_the_connection(tmp_path: Path) -> None:
    config = ConnectionConfig(url=str(tmp_path / "state.db"))
    with pytest.raises(ConfigurationError, match=r"connection 'my_conn' uses the embedded back end .*pulsar://"):
        open_topic_stream(config, topics=["persistent://public/default/t"], subscription="s", conn_id="my_conn")


@pytest.mark.pulsar
def test_settling_a_message_twice_or_from_elsewhere_is_refused(config: ConnectionConfig) -> None:
    topic = _fresh()
    _make_topic(config, topic)
    _publish(config, topic, [b"a"])

    async def go() -> None:
        async with open_topic_stream(config, topics=[topic], subscription="s", initial_position="earliest") as stream:
            message = await stream.receive(timeout=10)
            assert message is not None
            await stream.acknowledge([message])
            with pytest.raises(TopicStreamError, match="already settled"):
                await stream.acknowledge([message])

    run(go())


def _publish_batched(config: ConnectionConfig, topic: str, payloads: list[bytes]) -> None:
    """One producer batch per call (up to 1,000 messages): entries hold many messages."""
    client = pulsar.Client(config.url)
    try:
        producer = client.create_producer(
            topic,
            batching_enabled=True,
            batching_max_messages=1000,
            batching_max_publish_delay_ms=50,
            block_if_queue_full=True,
        )
        failures: list[object] = []
        for payload in payloads:
            producer.send_async(payload, lambda res, _mid: failures.append(res) if res != pulsar.Result.Ok else None)
        producer.flush()
        assert not failures, failures[:3]
    finally:
        client.close()


@pytest.mark.pulsar
def test_acknowledged_messages_of_a_batch_do_not_come_again_after_a_restart(config: ConnectionConfig) -> None:
    """30 messages in one batched entry, m10 left unacknowledged: after a clean restart only m10
    comes again (batch-index acknowledgement; without it the whole entry would be redelivered)."""
    topic = _fresh()
    _make_topic(config, topic)
    _publish_batched(config, topic, [f"m{i}".encode() for i in range(30)])

    async def first_run() -> int:
        async with open_topic_stream(config, topics=[topic], subscription="s", initial_position="earliest") as stream:
            batch = await stream.receive_batch(max_messages=30, max_wait=3.0, timeout=10)
            assert len(batch) == 30 and len({m.entry_id for m in batch}) < 30, "not batched"
            await stream.acknowledge([m for m in batch if m.payload != b"m10"])
            await asyncio.sleep(0.5)  # the client groups acknowledgements for up to 100 ms
            return len(batch)

    async def second_run() -> list[bytes]:
        async with open_topic_stream(config, topics=[topic], subscription="s") as stream:
            again = await stream.receive_batch(max_messages=100, max_wait=1.5, timeout=10)
            await stream.acknowledge(again)
            return [m.payload for m in again]

    assert run(first_run()) == 30
    assert run(second_run()) == [b"m10"]


@pytest.mark.pulsar
@pytest.mark.parametrize("dead_letter", [False, True], ids=["no-dead-letter-topic", "dead-letter-topic"])
def test_a_poison_message_is_given_up_and_later_acks_stay_bounded(config: ConnectionConfig, dead_letter: bool) -> None:
    """A message failing every time, ahead of 3,000 good ones: after max_redeliveries it is given up
    (dead-lettered, or dropped with an error log without a dead-letter topic), cumulative
    acknowledgements resume, and positions kept in memory stay a handful, never one per message."""
    topic, dlq = _fresh(), _fresh("dlq")
    _make_topic(config, topic)
    if dead_letter:
        _make_topic(config, dlq)
    later = 3000
    _publish(config, topic, [b"poison"])
    _publish_batched(config, topic, [f"m{i}".encode() for i in range(later)])

    async def go() -> tuple[dict, int, int, dict]:
        async with open_topic_stream(
            config,
            topics=[topic],
            subscription="s",
            initial_position="earliest",
            redelivery_delay=0.1,
            max_redeliveries=2,
            dead_letter_topic=dlq if dead_letter else None,
        ) as stream:
            good, worst = 0, 0
            deadline = asyncio.get_running_loop().time() + 60
            while good < later or stream.unsettled():
                assert asyncio.get_running_loop().time() < deadline, (good, stream.stats, stream.tracked_positions())
                batch = await stream.receive_batch(max_messages=200, max_wait=0.05, timeout=1.0)
                await stream.fail([m for m in batch if m.payload == b"poison"], reason="boom")
                fine = [m for m in batch if m.payload != b"poison"]
                await stream.acknowledge(fine)
                good += len(fine)
                worst = max(worst, sum(stream.tracked_positions().values()))
            return dict(stream.stats), good, worst, stream.tracked_positions()

    stats, good, worst, tracked = run(go())
    assert good == later
    assert stats["negative_acks"] == 2 and stats["dropped" if not dead_letter else "dead_lettered"] == 1, stats
    assert worst <= 5, worst  # the poison message and the ends of one acknowledged range
    assert sum(tracked.values()) == 0, tracked
    assert stats["cumulative_acks"] >= 1, stats  # one cumulative ack covered the acknowledged range once it was gone
    assert _subscription_backlog(config, topic, "s") == 0


@pytest.mark.pulsar
def test_a_failing_dead_letter_topic_never_wedges_the_stream(config: ConnectionConfig) -> None:
    """The dead-letter topic is in a namespace that does not exist: each send is retried, then the
    message is logged, skipped and counted; the stream goes on to the next message, also after a restart."""
    topic = _fresh()
    _make_topic(config, topic)
    _publish(config, topic, [b"poison", b"fine"])
    broken = f"persistent://public/no-such-namespace-{uuid.uuid4().hex[:6]}/dlq"

    async def go() -> tuple[dict, list[bytes]]:
        async with open_topic_stream(
            config,
            topics=[topic],
            subscription="s",
            initial_position="earliest",
            dead_letter_topic=broken,
            max_redeliveries=0,  # default retries: 3 sends, about 1 + 2 s apart
        ) as stream:
            poison = await stream.receive(timeout=10)
            assert poison is not None and poison.payload == b"poison"
            await stream.fail([poison], reason="boom")
            rest = await stream.receive_batch(max_messages=10, max_wait=1.0, timeout=10)
            await stream.acknowledge(rest)
            return dict(stream.stats), [m.payload for m in rest]

    stats, rest = run(go())
    assert rest == [b"fine"]
    assert stats["dead_letter_failures"] == 1 and stats["dead_lettered"] == 0, stats
    assert _subscription_backlog(config, topic, "s") == 0


@pytest.mark.pulsar
def test_read_topic_message_reads_a_referenced_message_also_inside_a_batch(config: ConnectionConfig) -> None:
    topic = _fresh()
    _make_topic(config, topic, partitions=2)
    _publish_batched(config, f"{topic}-partition-1", [f"m{i}".encode() for i in range(20)])

    async def take() -> list[TopicMessage]:
        async with open_topic_stream(config, topics=[topic], subscription="s", initial_position="earliest") as stream:
            batch = await stream.receive_batch(max_messages=20, max_wait=2.0, timeout=10)
            await stream.acknowledge(batch)
            return batch

    batch = run(take())
    assert len(batch) == 20
    entry = batch[7].as_json(max_payload_bytes=1)
    assert entry["payload"] is None and entry["payload_encoding"] == REFERENCE_ENCODING and entry["payload_size"] == 2
    client = pulsar.Client(config.url)
    try:
        got = read_topic_message(client, entry["topic"], base64.b64decode(entry["message_id"]), timeout=10)
        assert got.payload == b"m7" and got.position == batch[7].position
        elsewhere = f"{topic}-partition-0"  # the id is not one of that (empty) partition's messages
        with pytest.raises(MessageUnavailableError, match="partition-0"):
            read_topic_message(client, elsewhere, batch[7].message_id, timeout=1)
    finally:
        client.close()


@pytest.mark.pulsar
def test_streams_of_one_connection_share_one_client(config: ConnectionConfig) -> None:
    from airflow_provider_pulsarstate.engine.streams import clients as stream_clients

    topics = [_fresh() for _ in range(3)]
    for topic in topics:
        _make_topic(config, topic)
        _publish(config, topic, [b"x"])

    async def go() -> list[int]:
        streams = [open_topic_stream(config, topics=[t], subscription="s", initial_position="earliest") for t in topics]
        for stream in streams:
            await stream.open()
        clients = stream_clients._CLIENTS[asyncio.get_running_loop()]
        assert len(clients) == 1 and clients[config][1] == 3  # one client for the three streams
        assert len({id(s._client) for s in streams}) == 1
        await streams[0].aclose()  # the others go on with the shared client
        got = [len(await s.receive_batch(max_messages=5, max_wait=0.5, timeout=10)) for s in streams[1:]]
        for stream in streams[1:]:
            await stream.aclose()
        assert config not in stream_clients._CLIENTS[asyncio.get_running_loop()]  # closed with the last
        return got

    assert run(go()) == [1, 1]


@pytest.mark.pulsar
def test_a_failed_message_comes_again_without_rewinding_the_messages_in_flight(config: ConnectionConfig) -> None:
    """A negative acknowledgement on a Failover subscription makes the broker rewind to the oldest
    unacknowledged message: every message in flight or queued came again (1,400-2,200 per failure
    measured). A failed message is redelivered by the stream itself: only it comes again."""
    topic = _fresh()
    _make_topic(config, topic)
    total = 1500
    _publish_batched(config, topic, [f"m{i}".encode() for i in range(total)])

    async def go() -> tuple[dict, list[bytes]]:
        async with open_topic_stream(
            config,
            topics=[topic],
            subscription="s",
            initial_position="earliest",
            redelivery_delay=0.1,
        ) as stream:
            seen: list[bytes] = []
            failed_once = False
            deadline = asyncio.get_running_loop().time() + 60
            while len(set(seen)) < total or stream.unsettled():
                assert asyncio.get_running_loop().time() < deadline, (len(seen), stream.stats)
                batch = await stream.receive_batch(max_messages=100, max_wait=0.05, timeout=2.0)
                seen.extend(m.payload for m in batch)
                bad = [m for m in batch if m.payload == b"m50" and not failed_once]
                if bad:
                    failed_once = True
                    await stream.fail(bad)
                await stream.acknowledge([m for m in batch if m not in bad])
            return dict(stream.stats), seen

    stats, seen = run(go())
    assert sorted(seen) == sorted([f"m{i}".encode() for i in range(total)] + [b"m50"])
    assert stats["duplicates_dropped"] == 0 and stats["negative_acks"] == 1, stats
    assert _subscription_backlog(config, topic, "s") == 0


@pytest.mark.pulsar
def test_streams_subscribing_together_check_their_topic_once(
    config: ConnectionConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A thousand watchers of one topic starting together asked the admin API twice each whether
    the topic exists (a new HTTP client and connection each, ~12 s of CPU in all): one check now."""
    from airflow_provider_pulsarstate.engine.backends.admin_async import AsyncPulsarAdmin

    topic, missing = _fresh(), _fresh()
    _make_topic(config, topic)
    asked: list[str] = []
    original = AsyncPulsarAdmin.request

    async def counted(self: Any, method: str, path: str, **kwargs: Any) -> Any:
        asked.append(path)
        return await original(self, method, path, **kwargs)

    monkeypatch.setattr(AsyncPulsarAdmin, "request", counted)

    async def go() -> list[Any]:
        streams = [open_topic_stream(config, topics=[topic], subscription=f"s{i}") for i in range(20)]
        await asyncio.gather(*(s.open() for s in streams))
        for s in streams:
            await s.aclose()
        refused = [open_topic_stream(config, topics=[missing], subscription=f"s{i}") for i in range(3)]
        return await asyncio.gather(*(s.open() for s in refused), return_exceptions=True)

    outcomes = run(go())
    assert len([p for p in asked if topic.rsplit("/", 1)[1] in p]) <= 2, asked
    assert all(isinstance(o, ConfigurationError) and "does not exist" in str(o) for o in outcomes), outcomes


@pytest.mark.pulsar
def test_the_shared_client_is_made_off_the_loop_once_for_streams_opening_together(
    config: ConnectionConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Importing the client library and making a client block for ~0.5 s: never on the loop."""
    import threading

    from airflow_provider_pulsarstate.engine.streams import clients as stream_clients

    topic = _fresh()
    _make_topic(config, topic)
    made_on: list[int] = []
    original = stream_clients._make_client

    def recording(cfg: ConnectionConfig) -> Any:
        made_on.append(threading.get_ident())
        return original(cfg)

    monkeypatch.setattr(stream_clients, "_make_client", recording)

    async def go() -> int:
        streams = [open_topic_stream(config, topics=[topic], subscription=f"s{i}") for i in range(20)]
        await asyncio.gather(*(s.open() for s in streams))
        users = stream_clients._CLIENTS[asyncio.get_running_loop()][config][1]
        await asyncio.gather(*(s.aclose() for s in streams))
        return users

    assert run(go()) == 20
    assert len(made_on) == 1 and made_on[0] != threading.get_ident()  # once, on another thread
