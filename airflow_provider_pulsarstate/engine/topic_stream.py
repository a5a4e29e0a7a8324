"""Consume Pulsar topics on a durable subscription from an event loop, acknowledging safely.

:class:`TopicStream` is the engine half of the message trigger (no Airflow import). It receives
messages with ``pulsar.asyncio`` (one pending ``receive`` in a background task feeding a bounded
queue, so a batch that stops waiting never drops a message a cancelled ``receive`` had taken),
hands them out as :class:`TopicMessage` (plain data), and settles them:

* :meth:`TopicStream.acknowledge`: per partition, a cumulative acknowledgement up to the highest
  acknowledged message below the partition's **floor** (its lowest message handed out and not yet
  acknowledged: in flight, or failed and awaiting redelivery); messages above the floor are
  acknowledged individually. A cumulative acknowledgement therefore never covers a message that
  failed or is still being processed.
* :meth:`TopicStream.fail`: negative acknowledgement (redelivered after ``redelivery_delay``);
  after ``max_redeliveries`` failures of one message and with a ``dead_letter_topic``, the message
  is published there instead and acknowledged.
* :meth:`TopicStream.dead_letter`: publish to the dead-letter topic now (a terminal refusal).

The subscription is ``Failover``: cumulative acknowledgement needs one active consumer per
partition, and a second process on the same subscription stands by instead of splitting messages.
On ``Failover``/``Exclusive`` subscriptions the broker answers a negative acknowledgement by
rewinding to the oldest unacknowledged message, so messages still in flight come again: such
duplicates (and messages of an entry acknowledged earlier) are dropped here, never handed out twice.
pulsar-client's ``DeadLetterPolicy`` only works on ``Shared`` subscriptions, so dead letters are
published explicitly (failure counts are kept in memory: a restarted process starts them again).

Only Pulsar: the embedded back end has no subscription consumer with negative acknowledgements
(its topics are read by offset through :class:`~airflow_provider_pulsarstate.engine.offsets.PullConsumer`);
:func:`open_topic_stream` refuses it with a :class:`ConfigurationError`.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Iterable, Literal, Mapping, Sequence

from airflow_provider_pulsarstate.engine.config import ConnectionConfig, redact_url
from airflow_provider_pulsarstate.engine.errors import (
    BackendUnavailableError,
    ClosedError,
    ConfigurationError,
    PulsarStateError,
)

log = logging.getLogger(__name__)

Position = tuple[int, int, int]
"""(ledger id, entry id, batch index): the order of messages within one partition."""

PAYLOAD_ENCODINGS = ("auto", "text", "base64", "json")
INITIAL_POSITIONS = ("latest", "earliest")
DEAD_LETTER_PROPERTY_PREFIX = "pulsarstate-dead-letter-"


class TopicStreamError(PulsarStateError):
    """The topic stream failed (subscription refused, consumer closed under it, dead letter not sent)."""


class PayloadDecodeError(TopicStreamError, ValueError):
    """A message payload does not decode with the chosen ``payload_encoding`` (names topic and message id)."""


@dataclass(frozen=True)
class TopicMessage:
    """One received message, as plain data.

    :ivar topic: the (partition) topic it was read from, e.g. ``persistent://public/default/t-partition-0``.
    :ivar partition: the partition index (-1: a non-partitioned topic).
    :ivar ledger_id, entry_id, batch_index: its position in the partition.
    :ivar message_id: the serialized ``MessageId`` (``pulsar.MessageId.deserialize`` reads it).
    :ivar key: the partition key (None: none set).
    :ivar properties: the message properties.
    :ivar payload: the payload bytes, untouched.
    :ivar publish_time: milliseconds since the epoch, set by the producer's client.
    :ivar event_time: milliseconds since the epoch (None: not set).
    :ivar redelivery_count: how often the broker redelivered it (0 on Failover/Exclusive subscriptions).
    """

    topic: str
    partition: int
    ledger_id: int
    entry_id: int
    batch_index: int
    message_id: bytes
    key: str | None
    properties: Mapping[str, str]
    payload: bytes
    publish_time: int
    event_time: int | None
    redelivery_count: int
    _raw: Any = field(default=None, repr=False, compare=False, hash=False)

    @property
    def position(self) -> Position:
        return (self.ledger_id, self.entry_id, self.batch_index)

    @property
    def lane(self) -> str:
        """What orders acknowledgements: the partition's topic."""
        return self.topic

    @property
    def id_text(self) -> str:
        """``ledger:entry:batch`` (for messages and logs)."""
        return f"{self.ledger_id}:{self.entry_id}:{self.batch_index}"

    def decode_payload(self, encoding: str = "auto") -> tuple[str, Any]:
        """The payload per ``encoding``; returns ``(encoding used, value)``.

        * ``auto``: UTF-8 text when the bytes are valid UTF-8, else base64 text;
        * ``text``: UTF-8 text (invalid UTF-8 raises);
        * ``base64``: base64 text, always;
        * ``json``: the parsed JSON document (invalid JSON raises). Parsing never executes anything.

        :raises PayloadDecodeError: the payload does not decode (names topic and message).
        """
        if encoding not in PAYLOAD_ENCODINGS:
            raise ConfigurationError(f"payload_encoding must be one of {', '.join(PAYLOAD_ENCODINGS)}, got {encoding!r}")
        if encoding == "base64":
            return "base64", base64.b64encode(self.payload).decode("ascii")
        try:
            text = self.payload.decode("utf-8")
        except UnicodeDecodeError as exc:
            if encoding == "auto":
                return "base64", base64.b64encode(self.payload).decode("ascii")
            raise PayloadDecodeError(f"message {self.id_text} of {self.topic}: payload is not UTF-8 ({exc})") from None
        if encoding == "json":
            try:
                return "json", json.loads(text)
            except ValueError as exc:
                raise PayloadDecodeError(f"message {self.id_text} of {self.topic}: payload is not JSON ({exc})") from None
        return "text", text

    def as_json(self, payload_encoding: str = "auto") -> dict[str, Any]:
        """Plain JSON: every field, ``message_id`` as base64, the payload decoded per
        :meth:`decode_payload` (``payload_encoding`` says which rule applied)."""
        used, value = self.decode_payload(payload_encoding)
        return {
            "topic": self.topic,
            "partition": self.partition,
            "ledger_id": self.ledger_id,
            "entry_id": self.entry_id,
            "batch_index": self.batch_index,
            "message_id": base64.b64encode(self.message_id).decode("ascii"),
            "key": self.key,
            "properties": dict(self.properties),
            "publish_time": self.publish_time,
            "event_time": self.event_time,
            "redelivery_count": self.redelivery_count,
            "payload_encoding": used,
            "payload": value,
        }

    @classmethod
    def from_pulsar(cls, msg: Any) -> "TopicMessage":
        mid = msg.message_id()
        key = msg.partition_key() or None
        event_time = msg.event_timestamp()
        return cls(
            topic=msg.topic_name(),
            partition=int(mid.partition()),
            ledger_id=int(mid.ledger_id()),
            entry_id=int(mid.entry_id()),
            batch_index=int(mid.batch_index()),
            message_id=bytes(mid.serialize()),
            key=key,
            properties=dict(msg.properties()),
            payload=bytes(msg.data()),
            publish_time=int(msg.publish_timestamp()),
            event_time=int(event_time) if event_time else None,
            redelivery_count=int(msg.redelivery_count()),
            _raw=msg,
        )


@dataclass(frozen=True, kw_only=True)
class TopicStreamOptions:
    """How a :class:`TopicStream` subscribes and settles (checked on construction, errors name the field).

    :param topics: full topic names (``persistent://tenant/namespace/name``), at least one.
    :param subscription: the durable subscription's name.
    :param initial_position: where a new subscription starts: ``latest`` or ``earliest``.
    :param receiver_queue_size: messages the client prefetches per partition.
    :param redelivery_delay: seconds before a negatively acknowledged message comes again.
    :param dead_letter_topic: full topic name that takes messages given up on (None: never give up).
    :param max_redeliveries: failures of one message before it goes to ``dead_letter_topic``.
    :param consumer_name: the consumer's name on the broker (None: generated).
    """

    topics: tuple[str, ...]
    subscription: str
    initial_position: Literal["latest", "earliest"] = "latest"
    receiver_queue_size: int = 1000
    redelivery_delay: float = 1.0
    dead_letter_topic: str | None = None
    max_redeliveries: int = 3
    consumer_name: str | None = None

    def __post_init__(self) -> None:
        if not self.topics:
            raise ConfigurationError("topics: give at least one topic")
        for topic in self.topics:
            _check_full_topic("topics", topic)
        if len(set(self.topics)) != len(self.topics):
            raise ConfigurationError(f"topics: {list(self.topics)} names a topic twice")
        if not isinstance(self.subscription, str) or not self.subscription.strip():
            raise ConfigurationError(f"subscription: must be a non-empty name, got {self.subscription!r}")
        if self.initial_position not in INITIAL_POSITIONS:
            raise ConfigurationError(
                f"initial_position: must be one of {', '.join(INITIAL_POSITIONS)}, got {self.initial_position!r}"
            )
        _check_int("receiver_queue_size", self.receiver_queue_size, minimum=1)
        _check_seconds("redelivery_delay", self.redelivery_delay, minimum=0.0)
        _check_int("max_redeliveries", self.max_redeliveries, minimum=0)
        if self.dead_letter_topic is not None:
            _check_full_topic("dead_letter_topic", self.dead_letter_topic)
            if self.dead_letter_topic in self.topics:
                raise ConfigurationError(f"dead_letter_topic: {self.dead_letter_topic!r} is one of the consumed topics")


def _check_full_topic(name: str, topic: Any) -> None:
    if not isinstance(topic, str) or not topic.startswith("persistent://"):
        raise ConfigurationError(f"{name}: {topic!r} is not a full persistent://tenant/namespace/name topic")
    parts = topic[len("persistent://"):].split("/")
    if len(parts) != 3 or not all(parts):
        raise ConfigurationError(f"{name}: {topic!r} is not persistent://tenant/namespace/name")


def _check_int(name: str, value: Any, *, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigurationError(f"{name}: must be an integer >= {minimum}, got {value!r}")


def _check_seconds(name: str, value: Any, *, minimum: float, exclusive: bool = False) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value or value == float("inf"):
        raise ConfigurationError(f"{name}: must be a number of seconds, got {value!r}")
    if value < minimum or (exclusive and value == minimum):
        raise ConfigurationError(f"{name}: must be {'>' if exclusive else '>='} {minimum} seconds, got {value!r}")


class _Lane:
    """Settlement bookkeeping of one partition (see the module docstring)."""

    __slots__ = ("inflight", "failed", "acked_above", "cumulative")

    def __init__(self) -> None:
        self.inflight: set[Position] = set()  # handed out, not settled
        self.failed: set[Position] = set()  # negatively acknowledged, awaiting redelivery
        self.acked_above: set[Position] = set()  # acknowledged individually above the floor
        self.cumulative: Position | None = None  # highest position acknowledged cumulatively

    def floor(self) -> Position | None:
        pending = self.inflight | self.failed
        return min(pending) if pending else None

    def seen(self, pos: Position) -> bool:
        """Whether a received message is a duplicate (in flight, or already acknowledged)."""
        if pos in self.inflight or pos in self.acked_above:
            return True
        return self.cumulative is not None and pos <= self.cumulative


class TopicStream:
    """An async consumer of Pulsar topics on a durable ``Failover`` subscription.

    Usage::

        async with open_topic_stream(config, topics=[topic], subscription="my-dag") as stream:
            batch = await stream.receive_batch(max_messages=100, max_wait=0.2)
            ok, bad = split(batch)
            await stream.acknowledge(ok)     # never acknowledges past a message of ``bad``
            await stream.fail(bad)           # redelivered (or dead-lettered after max_redeliveries)

    Constructing it does no I/O; :meth:`open` subscribes. Every call awaits without blocking the
    loop. One stream per event loop; not thread-safe.

    :param config: a ``pulsar://`` connection (auth token, TLS, operation time-out apply).
    :param options: see :class:`TopicStreamOptions`.
    """

    def __init__(self, config: ConnectionConfig, options: TopicStreamOptions) -> None:
        if config.kind != "pulsar":
            raise ConfigurationError("a topic stream needs a pulsar:// connection")
        self.config = config
        self.options = options
        self._client: Any = None
        self._consumer: Any = None
        self._dead_letter_producer: Any = None
        self._queue: asyncio.Queue[Any] | None = None
        self._pump: asyncio.Task[None] | None = None
        self._lanes: dict[str, _Lane] = defaultdict(_Lane)
        self._failures: dict[tuple[str, Position], int] = {}
        self._closed = False
        self.stats = {"received": 0, "duplicates_dropped": 0, "acknowledged": 0, "cumulative_acks": 0,
                      "individual_acks": 0, "negative_acks": 0, "dead_lettered": 0}

    def __repr__(self) -> str:
        return f"TopicStream({list(self.options.topics)}, subscription={self.options.subscription!r}, {redact_url(self.config.url)})"

    # ------------------------------------------------------------------ lifecycle
    async def open(self) -> "TopicStream":
        """Subscribe (creating the durable subscription at ``initial_position`` when new).

        :raises ConfigurationError: a topic does not exist (asking never creates it).
        :raises BackendUnavailableError: the broker did not answer within the operation time-out.
        :raises TopicStreamError: the broker refused the subscription (e.g. another consumer holds it exclusively).
        """
        if self._closed:
            raise ClosedError(f"{self!r} is closed")
        if self._consumer is not None:
            return self
        import pulsar
        import pulsar.asyncio as pa

        from airflow_provider_pulsarstate.engine.backends.pulsar import client_options

        opts = self.options
        self._client = pa.Client(self.config.url, **client_options(self.config))
        try:
            for topic in opts.topics:
                await self._require_topic(topic)
            self._consumer = await asyncio.wait_for(
                self._client.subscribe(
                    list(opts.topics),
                    opts.subscription,
                    consumer_type=pulsar.ConsumerType.Failover,
                    receiver_queue_size=opts.receiver_queue_size,
                    negative_ack_redelivery_delay_ms=max(1, int(opts.redelivery_delay * 1000)),
                    initial_position=(
                        pulsar.InitialPosition.Earliest if opts.initial_position == "earliest"
                        else pulsar.InitialPosition.Latest
                    ),
                    consumer_name=opts.consumer_name,
                ),
                self.config.operation_timeout,
            )
        except BaseException as exc:
            await self._close_client()
            if isinstance(exc, PulsarStateError) or not isinstance(exc, Exception):
                raise
            if isinstance(exc, asyncio.TimeoutError):
                raise BackendUnavailableError(
                    f"subscribing {opts.subscription!r} to {list(opts.topics)} on {redact_url(self.config.url)} "
                    f"took over {self.config.operation_timeout:.0f}s"
                ) from exc
            raise TopicStreamError(
                f"subscribing {opts.subscription!r} to {list(opts.topics)} on {redact_url(self.config.url)} failed: "
                f"{type(exc).__name__}: {exc}"
            ) from exc
        self._queue = asyncio.Queue(maxsize=opts.receiver_queue_size)
        self._pump = asyncio.get_running_loop().create_task(self._receive_forever(), name=f"receive[{opts.subscription}]")
        return self

    async def _require_topic(self, topic: str) -> None:
        """Refuse a topic that does not exist (a subscribe would create it)."""
        from airflow_provider_pulsarstate.engine.backends.admin_async import AsyncPulsarAdmin
        from airflow_provider_pulsarstate.engine.offsets.pulsar_index import topic_path

        admin = AsyncPulsarAdmin(self.config, what="topic stream")
        try:
            partitioned = await admin.request("GET", f"{topic_path(topic)}/partitions", ok=(200, 404))
            if partitioned.status_code == 200 and int(partitioned.json().get("partitions", 0)) > 0:
                return
            stats = await admin.request("GET", f"{topic_path(topic)}/stats", ok=(200, 404))
            if stats.status_code == 404:
                raise ConfigurationError(
                    f"topics: {topic} does not exist on {redact_url(self.config.url)} (create it first; "
                    "subscribing never creates it)"
                )
        finally:
            await admin.aclose()

    async def _receive_forever(self) -> None:
        assert self._queue is not None
        while True:
            try:
                msg = await self._consumer.receive()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the consumer closed or failed: surface it to the reader
                await self._queue.put(exc)
                return
            await self._queue.put(msg)

    async def aclose(self) -> None:
        """Close the consumer and client (idempotent). Unsettled messages are redelivered later."""
        if self._closed:
            return
        self._closed = True
        if self._pump is not None:
            self._pump.cancel()
            try:
                await self._pump
            except (asyncio.CancelledError, Exception):
                pass
        for closable in (self._consumer, self._dead_letter_producer):
            if closable is not None:
                try:
                    await asyncio.wait_for(closable.close(), self.config.operation_timeout)
                except Exception:
                    log.debug("closing %r failed", closable, exc_info=True)
        await self._close_client()

    async def _close_client(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            try:
                await asyncio.wait_for(client.close(), self.config.operation_timeout)
            except Exception:
                log.debug("closing the pulsar client of %r failed", self, exc_info=True)

    async def __aenter__(self) -> "TopicStream":
        return await self.open()

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # ------------------------------------------------------------------ receiving
    def _require_open(self) -> None:
        if self._closed:
            raise ClosedError(f"{self!r} is closed")
        if self._queue is None:
            raise TopicStreamError(f"{self!r} is not open: await stream.open() (or use it as an async context manager)")

    def _admit(self, item: Any) -> TopicMessage | None:
        """The message to hand out, or None for a duplicate (raises what the receive loop raised)."""
        if isinstance(item, BaseException):
            raise TopicStreamError(f"receiving from {self!r} failed: {type(item).__name__}: {item}") from item
        message = TopicMessage.from_pulsar(item)
        lane = self._lanes[message.lane]
        pos = message.position
        if lane.seen(pos):
            self.stats["duplicates_dropped"] += 1
            return None
        lane.failed.discard(pos)
        lane.inflight.add(pos)
        self.stats["received"] += 1
        return message

    async def receive(self, *, timeout: float | None = None) -> TopicMessage | None:
        """The next message (None when ``timeout`` seconds pass first; None: wait forever)."""
        self._require_open()
        assert self._queue is not None
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                return None
            try:
                item = await asyncio.wait_for(self._queue.get(), remaining) if remaining is not None else await self._queue.get()
            except asyncio.TimeoutError:
                return None
            message = self._admit(item)
            if message is not None:
                return message

    async def receive_batch(
        self, *, max_messages: int, max_wait: float, timeout: float | None = None
    ) -> list[TopicMessage]:
        """Up to ``max_messages``: waits for the first (at most ``timeout`` seconds; None: forever),
        then at most ``max_wait`` seconds more for the rest. Empty only when ``timeout`` passed.

        :raises ConfigurationError: ``max_messages`` < 1 or a negative ``max_wait``.
        """
        _check_int("max_messages", max_messages, minimum=1)
        _check_seconds("max_wait", max_wait, minimum=0.0)
        first = await self.receive(timeout=timeout)
        if first is None:
            return []
        batch = [first]
        assert self._queue is not None
        deadline = time.monotonic() + max_wait
        while len(batch) < max_messages:
            # take what is already queued without waiting
            while len(batch) < max_messages and not self._queue.empty():
                message = self._admit(self._queue.get_nowait())
                if message is not None:
                    batch.append(message)
            if len(batch) >= max_messages:
                break
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            message = await self.receive(timeout=remaining)
            if message is None:
                break
            batch.append(message)
        return batch

    # ------------------------------------------------------------------ settling
    def _lane_of(self, message: TopicMessage) -> _Lane:
        lane = self._lanes.get(message.lane)
        if lane is None or message.position not in lane.inflight | lane.failed:
            raise TopicStreamError(
                f"message {message.id_text} of {message.topic} was not handed out by {self!r} or is already settled"
            )
        return lane

    async def acknowledge(self, messages: Iterable[TopicMessage]) -> None:
        """Acknowledge ``messages`` (processed). Per partition: cumulatively up to the highest of them
        below the floor (the lowest message still unsettled), individually above it.

        :raises TopicStreamError: a message this stream did not hand out or already settled.
        """
        self._require_open()
        by_lane: dict[str, list[TopicMessage]] = defaultdict(list)
        for message in messages:
            self._lane_of(message)
            by_lane[message.lane].append(message)
        for lane_name, group in by_lane.items():
            lane = self._lanes[lane_name]
            group.sort(key=lambda m: m.position)
            for message in group:
                lane.inflight.discard(message.position)
                self._failures.pop((lane_name, message.position), None)
            floor = lane.floor()
            below = [m for m in group if floor is None or m.position < floor]
            above = [m for m in group if floor is not None and m.position > floor]
            if below:
                last = below[-1]
                await self._consumer.acknowledge_cumulative(last._raw)
                lane.cumulative = last.position if lane.cumulative is None else max(lane.cumulative, last.position)
                lane.acked_above = {p for p in lane.acked_above if p > lane.cumulative}
                self.stats["cumulative_acks"] += 1
            for message in above:
                await self._consumer.acknowledge(message._raw)
                lane.acked_above.add(message.position)
                self.stats["individual_acks"] += 1
            self.stats["acknowledged"] += len(group)

    async def fail(self, messages: Iterable[TopicMessage], *, reason: str = "", count: bool = True) -> None:
        """Negatively acknowledge ``messages``: each comes again after ``redelivery_delay`` and holds
        its partition's floor until then. With a ``dead_letter_topic``, a message failed more than
        ``max_redeliveries`` times is dead-lettered instead (``count=False``: this failure is not
        the message's fault, e.g. nobody was listening, and is not counted).
        """
        self._require_open()
        for message in list(messages):
            lane = self._lane_of(message)
            key = (message.lane, message.position)
            failures = self._failures.get(key, 0) + (1 if count else 0)
            self._failures[key] = failures
            if self.options.dead_letter_topic is not None and failures > self.options.max_redeliveries:
                await self.dead_letter([message], reason=reason or f"failed {failures} times")
                continue
            lane.inflight.discard(message.position)
            lane.failed.add(message.position)
            await self._consumer.negative_acknowledge(message._raw)
            self.stats["negative_acks"] += 1

    async def dead_letter(self, messages: Iterable[TopicMessage], *, reason: str) -> None:
        """Publish ``messages`` to the dead-letter topic (payload, key, event time and properties
        kept; ``pulsarstate-dead-letter-{topic,message-id,reason}`` added), then acknowledge them.
        Without a dead-letter topic they are only acknowledged (dropped), with a warning.

        :raises TopicStreamError: the dead-letter topic refused the message (nothing acknowledged).
        """
        self._require_open()
        batch = list(messages)
        for message in batch:
            self._lane_of(message)
        target = self.options.dead_letter_topic
        if target is None:
            for message in batch:
                log.warning("dropping message %s of %s (no dead-letter topic): %s", message.id_text, message.topic, reason)
        else:
            producer = await self._dead_letter()
            for message in batch:
                properties = {
                    **message.properties,
                    f"{DEAD_LETTER_PROPERTY_PREFIX}topic": message.topic,
                    f"{DEAD_LETTER_PROPERTY_PREFIX}message-id": message.id_text,
                    f"{DEAD_LETTER_PROPERTY_PREFIX}reason": reason[:1000],
                }
                kwargs: dict[str, Any] = {"properties": properties}
                if message.key is not None:
                    kwargs["partition_key"] = message.key
                if message.event_time is not None:
                    kwargs["event_timestamp"] = message.event_time
                try:
                    await asyncio.wait_for(producer.send(message.payload, **kwargs), self.config.operation_timeout)
                except Exception as exc:
                    raise TopicStreamError(
                        f"dead-lettering message {message.id_text} of {message.topic} to {target} failed: "
                        f"{type(exc).__name__}: {exc}"
                    ) from exc
                log.warning("dead-lettered message %s of %s to %s: %s", message.id_text, message.topic, target, reason)
        self.stats["dead_lettered"] += len(batch) if target is not None else 0
        for message in batch:  # a redelivered copy may sit in "failed": make it in flight to settle it
            lane = self._lanes[message.lane]
            if message.position in lane.failed:
                lane.failed.discard(message.position)
                lane.inflight.add(message.position)
        await self.acknowledge(batch)

    async def _dead_letter(self) -> Any:
        if self._dead_letter_producer is None:
            assert self.options.dead_letter_topic is not None
            try:
                self._dead_letter_producer = await asyncio.wait_for(
                    self._client.create_producer(self.options.dead_letter_topic, batching_enabled=False),
                    self.config.operation_timeout,
                )
            except Exception as exc:
                raise TopicStreamError(
                    f"dead_letter_topic: cannot publish to {self.options.dead_letter_topic}: {type(exc).__name__}: {exc}"
                ) from exc
        return self._dead_letter_producer

    def unsettled(self) -> dict[str, dict[str, list[Position]]]:
        """Per partition: positions in flight and failed (awaiting redelivery); for tests and logs."""
        return {
            name: {"inflight": sorted(lane.inflight), "failed": sorted(lane.failed)}
            for name, lane in self._lanes.items() if lane.inflight or lane.failed
        }


def open_topic_stream(
    config: ConnectionConfig,
    *,
    topics: Sequence[str],
    subscription: str,
    conn_id: str | None = None,
    **options: Any,
) -> TopicStream:
    """A :class:`TopicStream` (no I/O until ``open``); ``options`` as :class:`TopicStreamOptions`.

    :raises ConfigurationError: an embedded connection (named, with ``conn_id`` when given), or a
        bad option (named).
    """
    if config.kind != "pulsar":
        where = f"connection {conn_id!r}" if conn_id else "the connection"
        raise ConfigurationError(
            f"{where} uses the embedded back end ({config.embedded_path}), which has no subscription "
            "consumer to take messages from (no negative acknowledgements, no dead letters): consuming topic "
            "messages needs a pulsar:// connection. On the embedded log read topics by offset with PullConsumer."
        )
    return TopicStream(config, TopicStreamOptions(topics=tuple(topics), subscription=subscription, **options))


__all__ = [
    "DEAD_LETTER_PROPERTY_PREFIX", "INITIAL_POSITIONS", "PAYLOAD_ENCODINGS", "PayloadDecodeError",
    "TopicMessage", "TopicStream", "TopicStreamError", "TopicStreamOptions", "open_topic_stream",
]
