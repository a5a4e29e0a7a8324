"""Consume Pulsar topics on a durable subscription from an event loop, acknowledging safely.

:class:`TopicStream` is the engine half of the message trigger (no Airflow import). It receives
messages with ``pulsar.asyncio`` (one pending ``receive`` in a background task feeding a bounded
queue, so a batch that stops waiting never drops a message a cancelled ``receive`` had taken),
hands them out as :class:`TopicMessage` (plain data), and settles them:

* :meth:`TopicStream.acknowledge`: per partition, a cumulative acknowledgement up to the highest
  acknowledged message below the partition's **floor** (its lowest message handed out and not yet
  acknowledged: in flight, or failed and awaiting redelivery); messages above the floor are
  acknowledged individually. A cumulative acknowledgement therefore never covers a message that
  failed or is still being processed. Acknowledged positions above the floor are kept as ranges
  (at most one more than the unsettled messages), and once the floor moves one cumulative
  acknowledgement covers them.
* :meth:`TopicStream.fail`: the message comes again after ``redelivery_delay``, handed out again
  by this stream from memory; after ``max_redeliveries`` failures of one message it is given up:
  published to the ``dead_letter_topic``, or dropped with an error log when there is none.
* :meth:`TopicStream.dead_letter`: give up on a message now (a terminal refusal). A dead-letter
  send that keeps failing is retried, then the message is logged and skipped: never a wedge.

Consumers use batch-index acknowledgement (the broker must enable
``acknowledgmentAtBatchIndexLevelEnabled``): acknowledging part of a batched entry survives a
restart, so only unacknowledged messages come again.

The subscription is ``Failover``: cumulative acknowledgement needs one active consumer per
partition, and a second process on the same subscription stands by instead of splitting messages.
On ``Failover``/``Exclusive`` subscriptions the broker answers a negative acknowledgement by
rewinding to the oldest unacknowledged message, so every message in flight or queued would come
again (a thousand or more per failure): so a failed message is never negatively acknowledged; the
stream keeps it and hands it out again itself (a restart gets it from the broker, unacknowledged).
Duplicates the broker still sends (after a reconnect, and messages of an entry acknowledged
earlier) are dropped here, never handed out twice.
pulsar-client's ``DeadLetterPolicy`` only works on ``Shared`` subscriptions, so dead letters are
published explicitly (failure counts are kept in memory: a restarted process starts them again).

A message too large to carry whole (see :meth:`TopicMessage.as_json`) is passed by reference:
:func:`read_topic_message` reads it back by topic and message id while retention keeps it.

Only Pulsar: the embedded back end has no subscription consumer with negative acknowledgements
(its topics are read by offset through :class:`~airflow_provider_pulsarstate.engine.offsets.PullConsumer`);
:func:`open_topic_stream` refuses it with a :class:`ConfigurationError`.
"""

from __future__ import annotations

import asyncio
import base64
import bisect
import functools
import json
import logging
import time
import weakref
from collections import defaultdict, deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from airflow_provider_pulsarstate.engine.config import ConnectionConfig, redact_url
from airflow_provider_pulsarstate.engine.errors import (
    BackendUnavailableError,
    ClosedError,
    ConfigurationError,
    PulsarStateError,
)
from airflow_provider_pulsarstate.engine.loop_shared import made_once
from airflow_provider_pulsarstate.engine.retry import Backoff

log = logging.getLogger(__name__)

_WAKE = object()  # queued to wake a waiting receive when a failed message is due again

Position = tuple[int, int, int]
"""(ledger id, entry id, batch index): the order of messages within one partition."""

PAYLOAD_ENCODINGS = ("auto", "text", "base64", "json")
INITIAL_POSITIONS = ("latest", "earliest")
DEAD_LETTER_PROPERTY_PREFIX = "pulsarstate-dead-letter-"
REFERENCE_ENCODING = "reference"
"""``payload_encoding`` of an entry whose payload was left out (read it with :func:`read_topic_message`)."""


class TopicStreamError(PulsarStateError):
    """The topic stream failed (subscription refused, consumer closed under it, dead letter not sent)."""


class PayloadDecodeError(TopicStreamError, ValueError):
    """A message payload does not decode with the chosen ``payload_encoding`` (names topic and message id)."""


class PayloadTooLargeError(TopicStreamError, ValueError):
    """An event would exceed its byte limit even with every payload passed by reference (names the messages)."""


class MessageUnavailableError(TopicStreamError):
    """A referenced message cannot be read (trimmed by retention, or another topic's id); names topic and id."""


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
    def payload_size(self) -> int:
        return len(self.payload)

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
            raise ConfigurationError(
                f"payload_encoding must be one of {', '.join(PAYLOAD_ENCODINGS)}, got {encoding!r}"
            )
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
                raise PayloadDecodeError(
                    f"message {self.id_text} of {self.topic}: payload is not JSON ({exc})"
                ) from None
        return "text", text

    def as_json(self, payload_encoding: str = "auto", *, max_payload_bytes: int | None = None) -> dict[str, Any]:
        """Plain JSON: every field, ``message_id`` as base64, ``payload_size`` in bytes, the payload
        decoded per :meth:`decode_payload` (``payload_encoding`` says which rule applied).

        A payload over ``max_payload_bytes`` is neither decoded nor included: ``payload`` is None
        and ``payload_encoding`` is ``"reference"`` (the entry's ``topic`` and ``message_id``
        locate it for :func:`read_topic_message`).
        """
        if max_payload_bytes is not None and self.payload_size > max_payload_bytes:
            used, value = REFERENCE_ENCODING, None
        else:
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
            "payload_size": self.payload_size,
            "payload_encoding": used,
            "payload": value,
        }

    @classmethod
    def from_pulsar(cls, msg: Any) -> TopicMessage:
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
    :param redelivery_delay: seconds before a failed message comes again.
    :param dead_letter_topic: full topic name that takes messages given up on (None: never give up).
    :param max_redeliveries: failures of one message before it is given up: sent to
        ``dead_letter_topic``, or dropped with an error log without one.
    :param dead_letter_attempts: sends of one message to ``dead_letter_topic`` before it is
        skipped (logged, acknowledged, counted).
    :param dead_letter_retry_delay: seconds before the second send (doubling after each failure).
    :param consumer_name: the consumer's name on the broker (None: generated).
    """

    topics: tuple[str, ...]
    subscription: str
    initial_position: Literal["latest", "earliest"] = "latest"
    receiver_queue_size: int = 1000
    redelivery_delay: float = 1.0
    dead_letter_topic: str | None = None
    max_redeliveries: int = 3
    dead_letter_attempts: int = 3
    dead_letter_retry_delay: float = 1.0
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
        _check_int("dead_letter_attempts", self.dead_letter_attempts, minimum=1)
        _check_seconds("dead_letter_retry_delay", self.dead_letter_retry_delay, minimum=0.0)
        if self.dead_letter_topic is not None:
            _check_full_topic("dead_letter_topic", self.dead_letter_topic)
            if self.dead_letter_topic in self.topics:
                raise ConfigurationError(f"dead_letter_topic: {self.dead_letter_topic!r} is one of the consumed topics")


def _check_full_topic(name: str, topic: Any) -> None:
    if not isinstance(topic, str) or not topic.startswith("persistent://"):
        raise ConfigurationError(f"{name}: {topic!r} is not a full persistent://tenant/namespace/name topic")
    parts = topic[len("persistent://") :].split("/")
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


class _AckedRange:
    """Positions ``lo``..``hi`` of one partition, all acknowledged individually (no unsettled
    message between them); ``last`` is the received message at ``hi`` (a cumulative acknowledgement
    needs the client's own message object to cover a batch up to its index)."""

    __slots__ = ("hi", "last", "lo")

    def __init__(self, lo: Position, hi: Position, last: Any) -> None:
        self.lo, self.hi, self.last = lo, hi, last


class _Lane:
    """Settlement bookkeeping of one partition (see the module docstring).

    Acknowledged positions above the cumulative one are kept as ranges, merged whenever no
    unsettled message lies between them: there are never more ranges than unsettled messages
    + 1, however many messages are acknowledged behind a slow or failing one.
    """

    __slots__ = ("acked", "cumulative", "failed", "inflight")

    def __init__(self) -> None:
        self.inflight: set[Position] = set()  # handed out, not settled
        self.failed: set[Position] = set()  # negatively acknowledged, awaiting redelivery
        self.acked: list[_AckedRange] = []  # sorted, disjoint, all above ``cumulative``
        self.cumulative: Position | None = None  # highest position acknowledged cumulatively

    def floor(self) -> Position | None:
        pending = self.inflight | self.failed
        return min(pending) if pending else None

    def seen(self, pos: Position) -> bool:
        """Whether a received message is a duplicate (in flight, or already acknowledged)."""
        if pos in self.inflight or (self.cumulative is not None and pos <= self.cumulative):
            return True
        i = bisect.bisect_right([r.lo for r in self.acked], pos) - 1
        return i >= 0 and pos <= self.acked[i].hi

    def add_acked(self, positions: Sequence[tuple[Position, Any]]) -> None:
        """Record acknowledged ``(position, raw message)`` pairs (taken out of ``inflight`` first)."""
        pending = sorted(self.inflight | self.failed)
        for pos, raw in positions:
            lows = [r.lo for r in self.acked]
            self.acked.insert(bisect.bisect_left(lows, pos), _AckedRange(pos, pos, raw))
        merged: list[_AckedRange] = []
        for rng in self.acked:
            if merged and _nothing_between(pending, merged[-1].hi, rng.lo):
                if rng.hi > merged[-1].hi:
                    merged[-1].hi, merged[-1].last = rng.hi, rng.last
            else:
                merged.append(rng)
        self.acked = merged

    def take_cumulative(self) -> _AckedRange | None:
        """The lowest range when no unsettled message lies below its top (it can be acknowledged
        cumulatively): removed, and ``cumulative`` moved to its top. None otherwise."""
        if not self.acked:
            return None
        first = self.acked[0]
        floor = self.floor()
        if floor is not None and floor < first.hi:
            return None
        self.acked.pop(0)
        self.cumulative = first.hi if self.cumulative is None else max(self.cumulative, first.hi)
        return first

    def tracked(self) -> int:
        """Positions held in memory: unsettled messages and the ends of acknowledged ranges."""
        return len(self.inflight) + len(self.failed) + 2 * len(self.acked)


def _nothing_between(pending: list[Position], lo: Position, hi: Position) -> bool:
    """Whether no position of sorted ``pending`` lies strictly between ``lo`` and ``hi``."""
    return bisect.bisect_right(pending, lo) >= bisect.bisect_left(pending, hi)


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
        self._due: deque[Any] = deque()  # failed messages whose redelivery delay passed
        self._timers: set[asyncio.TimerHandle] = set()
        self._pump: asyncio.Task[None] | None = None
        self._lanes: dict[str, _Lane] = defaultdict(_Lane)
        self._failures: dict[tuple[str, Position], int] = {}
        self._closed = False
        self.stats = {
            "received": 0,
            "duplicates_dropped": 0,
            "acknowledged": 0,
            "cumulative_acks": 0,
            "individual_acks": 0,
            "negative_acks": 0,
            "dead_lettered": 0,
            "dropped": 0,
            "dead_letter_failures": 0,
        }

    def __repr__(self) -> str:
        return f"TopicStream({list(self.options.topics)}, subscription={self.options.subscription!r}, {redact_url(self.config.url)})"

    # ------------------------------------------------------------------ lifecycle
    async def open(self) -> TopicStream:
        """Subscribe (creating the durable subscription at ``initial_position`` when new).

        :raises ConfigurationError: a topic does not exist (asking never creates it).
        :raises BackendUnavailableError: the broker did not answer within the operation time-out.
        :raises TopicStreamError: the broker refused the subscription (e.g. another consumer holds it exclusively).
        """
        if self._closed:
            raise ClosedError(f"{self!r} is closed")
        if self._consumer is not None:
            return self
        opts = self.options
        self._client = await _acquire_client(self.config)
        if self._closed:  # closed while the client was being made
            await self._close_client()
            raise ClosedError(f"{self!r} is closed")
        import pulsar  # imported by _make_client, off the loop

        try:
            for topic in opts.topics:
                await self._require_topic(topic)
            self._consumer = await asyncio.wait_for(
                self._client.subscribe(
                    list(opts.topics),
                    opts.subscription,
                    consumer_type=pulsar.ConsumerType.Failover,
                    schema=_bytes_schema(),
                    receiver_queue_size=opts.receiver_queue_size,
                    negative_ack_redelivery_delay_ms=max(1, int(opts.redelivery_delay * 1000)),
                    initial_position=(
                        pulsar.InitialPosition.Earliest
                        if opts.initial_position == "earliest"
                        else pulsar.InitialPosition.Latest
                    ),
                    consumer_name=opts.consumer_name,
                    # without it, acknowledging part of a batch entry is forgotten on restart and
                    # its acknowledged messages come again (the broker must enable it too)
                    batch_index_ack_enabled=True,
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
        self._pump = asyncio.get_running_loop().create_task(
            self._receive_forever(), name=f"receive[{opts.subscription}]"
        )
        return self

    async def _require_topic(self, topic: str) -> None:
        """Refuse a topic that does not exist (a subscribe would create it). Streams of one loop
        share the check: a thousand watchers of one topic ask the admin API once, not a thousand
        times; a topic found is not asked about again for :data:`TOPIC_CHECK_TTL` seconds."""
        loop = asyncio.get_running_loop()
        key = (self.config, topic)
        found = _TOPICS_FOUND.setdefault(loop, {})
        if loop.time() - found.get(key, -TOPIC_CHECK_TTL) < TOPIC_CHECK_TTL:
            return
        checks = _TOPIC_CHECKS.setdefault(loop, {})
        check = checks.get(key)
        if check is None:
            check = checks[key] = loop.create_task(_check_topic(self.config, topic), name=f"check {topic}")
            check.add_done_callback(lambda done: _forget_check(checks, key, done))
        await asyncio.shield(check)  # a caller cancelled meanwhile leaves the check to the others
        found[key] = loop.time()

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
        for timer in self._timers:
            timer.cancel()
        self._timers.clear()
        self._due.clear()
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
        if client is not None and _release_client(self.config, client):
            try:
                await asyncio.wait_for(client.close(), self.config.operation_timeout)
            except Exception:
                log.debug("closing the pulsar client of %r failed", self, exc_info=True)

    async def __aenter__(self) -> TopicStream:
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
        if item is _WAKE:
            return None
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
            if self._due:
                item = self._due.popleft()
            else:
                try:
                    item = (
                        await asyncio.wait_for(self._queue.get(), remaining)
                        if remaining is not None
                        else await self._queue.get()
                    )
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
            while len(batch) < max_messages and (self._due or not self._queue.empty()):
                message = self._admit(self._due.popleft() if self._due else self._queue.get_nowait())
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
        if lane is None or (message.position not in lane.inflight and message.position not in lane.failed):
            raise TopicStreamError(
                f"message {message.id_text} of {message.topic} was not handed out by {self!r} or is already settled"
            )
        return lane

    async def acknowledge(self, messages: Iterable[TopicMessage]) -> None:
        """Acknowledge ``messages`` (processed). Per partition: messages above the floor (the lowest
        message still unsettled) individually, then cumulatively up to the highest acknowledged
        message below the floor (also those acknowledged individually earlier, once the floor moved).

        :raises TopicStreamError: a message this stream did not hand out or already settled.
        """
        self._require_open()
        by_lane: dict[str, list[TopicMessage]] = defaultdict(list)
        for message in messages:
            self._lane_of(message)
            by_lane[message.lane].append(message)
        for lane_name, group in by_lane.items():
            await self._acknowledge_lane(self._lanes[lane_name], lane_name, sorted(group, key=lambda m: m.position))

    async def _acknowledge_lane(self, lane: _Lane, lane_name: str, group: list[TopicMessage]) -> None:
        for message in group:
            lane.inflight.discard(message.position)
            self._failures.pop((lane_name, message.position), None)
        floor = lane.floor()
        for message in group:
            if floor is not None and message.position > floor:
                await self._consumer.acknowledge(message._raw)
                self.stats["individual_acks"] += 1
        lane.add_acked([(m.position, m._raw) for m in group])
        covered = lane.take_cumulative()
        if covered is not None:
            await self._consumer.acknowledge_cumulative(covered.last)
            self.stats["cumulative_acks"] += 1
        self.stats["acknowledged"] += len(group)

    async def fail(self, messages: Iterable[TopicMessage], *, reason: str = "", count: bool = True) -> None:
        """Fail ``messages``: each comes again after ``redelivery_delay`` (handed out again by this
        stream: never a negative acknowledgement, which rewinds every message in flight on a
        Failover subscription; counted in ``stats["negative_acks"]``) and holds its partition's
        floor until then. A message failed more than ``max_redeliveries`` times is
        given up instead: dead-lettered (see :meth:`dead_letter`), or dropped with an error log when
        there is no ``dead_letter_topic``, so one poison message never pins its partition's floor.
        ``count=False``: this failure is not the message's fault (e.g. nobody was listening) and is
        not counted.
        """
        self._require_open()
        for message in list(messages):
            lane = self._lane_of(message)
            key = (message.lane, message.position)
            failures = self._failures.get(key, 0) + (1 if count else 0)
            self._failures[key] = failures
            if failures > self.options.max_redeliveries:
                await self.dead_letter([message], reason=f"failed {failures} times" + (f": {reason}" if reason else ""))
                continue
            lane.inflight.discard(message.position)
            lane.failed.add(message.position)
            self._redeliver_later(message._raw)
            self.stats["negative_acks"] += 1

    def _redeliver_later(self, raw: Any) -> None:
        """Hand ``raw`` out again after ``redelivery_delay`` (a message settled meanwhile is then
        dropped as a duplicate)."""
        loop = asyncio.get_running_loop()

        def due() -> None:
            self._timers.discard(timer)
            if self._closed or self._queue is None:
                return
            self._due.append(raw)
            try:
                self._queue.put_nowait(_WAKE)  # wakes a receive waiting on the queue (a full queue wakes it anyway)
            except asyncio.QueueFull:
                pass

        timer = loop.call_later(self.options.redelivery_delay, due)
        self._timers.add(timer)

    async def dead_letter(self, messages: Iterable[TopicMessage], *, reason: str) -> None:
        """Give ``messages`` up, then acknowledge them: published to the dead-letter topic (payload,
        key, event time and properties kept; ``pulsarstate-dead-letter-{topic,message-id,reason}``
        added); without a dead-letter topic dropped, with an error log (counted in ``dropped``).

        A send that fails is retried ``dead_letter_attempts`` times, ``dead_letter_retry_delay``
        seconds apart (doubling); then the message is logged and skipped (acknowledged, counted in
        ``dead_letter_failures``): a missing or forbidden dead-letter topic never wedges the stream.
        """
        self._require_open()
        batch = list(messages)
        for message in batch:
            self._lane_of(message)
        for message in batch:
            if self.options.dead_letter_topic is None:
                log.error(
                    "dropping message %s of %s (no dead-letter topic): %s", message.id_text, message.topic, reason
                )
                self.stats["dropped"] += 1
            elif await self._send_dead_letter(message, reason):
                self.stats["dead_lettered"] += 1
            else:
                self.stats["dead_letter_failures"] += 1
        for message in batch:  # a redelivered copy may sit in "failed": make it in flight to settle it
            lane = self._lanes[message.lane]
            if message.position in lane.failed:
                lane.failed.discard(message.position)
                lane.inflight.add(message.position)
        await self.acknowledge(batch)

    async def _send_dead_letter(self, message: TopicMessage, reason: str) -> bool:
        """Publish ``message`` to the dead-letter topic, retrying; False (logged) when every attempt failed."""
        target = self.options.dead_letter_topic
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
        backoff = Backoff(initial=self.options.dead_letter_retry_delay, maximum=30.0)
        attempts = self.options.dead_letter_attempts
        for attempt in range(1, attempts + 1):
            try:
                producer = await self._dead_letter()
                await asyncio.wait_for(producer.send(message.payload, **kwargs), self.config.operation_timeout)
            except Exception as exc:
                await self._drop_dead_letter_producer()
                if attempt == attempts:
                    log.error(
                        "skipping message %s of %s: dead-lettering it to %s failed %d times (last: %s: %s); reason "
                        "it was given up: %s",
                        message.id_text,
                        message.topic,
                        target,
                        attempts,
                        type(exc).__name__,
                        exc,
                        reason,
                    )
                    return False
                delay = backoff.next_delay()
                log.warning(
                    "dead-lettering message %s of %s to %s failed (%s: %s); retrying in %.1fs",
                    message.id_text,
                    message.topic,
                    target,
                    type(exc).__name__,
                    exc,
                    delay,
                )
                await asyncio.sleep(delay)
            else:
                log.warning("dead-lettered message %s of %s to %s: %s", message.id_text, message.topic, target, reason)
                return True
        return False

    async def _drop_dead_letter_producer(self) -> None:
        producer, self._dead_letter_producer = self._dead_letter_producer, None
        if producer is not None:
            try:
                await asyncio.wait_for(producer.close(), self.config.operation_timeout)
            except Exception:
                log.debug("closing the dead-letter producer of %r failed", self, exc_info=True)

    async def _dead_letter(self) -> Any:
        if self._dead_letter_producer is None:
            assert self.options.dead_letter_topic is not None
            try:
                self._dead_letter_producer = await asyncio.wait_for(
                    self._client.create_producer(
                        self.options.dead_letter_topic, schema=_bytes_schema(), batching_enabled=False
                    ),
                    self.config.operation_timeout,
                )
            except Exception as exc:
                raise TopicStreamError(
                    f"dead_letter_topic: cannot publish to {self.options.dead_letter_topic}: {type(exc).__name__}: {exc}"
                ) from exc
        return self._dead_letter_producer

    def tracked_positions(self) -> dict[str, int]:
        """Per partition: positions held in memory (unsettled messages, ends of acknowledged ranges)."""
        return {name: lane.tracked() for name, lane in self._lanes.items()}

    def unsettled(self) -> dict[str, dict[str, list[Position]]]:
        """Per partition: positions in flight and failed (awaiting redelivery); for tests and logs."""
        return {
            name: {"inflight": sorted(lane.inflight), "failed": sorted(lane.failed)}
            for name, lane in self._lanes.items()
            if lane.inflight or lane.failed
        }


TOPIC_CHECK_TTL = 30.0
"""Seconds a topic found to exist is not asked about again by the streams of one loop."""

# event loop -> (connection, topic) -> when found to exist (loop time) / the check under way
_TOPICS_FOUND: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[tuple[ConnectionConfig, str], float]] = (
    weakref.WeakKeyDictionary()
)
_TOPIC_CHECKS: weakref.WeakKeyDictionary[
    asyncio.AbstractEventLoop, dict[tuple[ConnectionConfig, str], asyncio.Task[None]]
] = weakref.WeakKeyDictionary()


def _forget_check(checks: dict[Any, Any], key: Any, done: asyncio.Task[None]) -> None:
    if checks.get(key) is done:
        del checks[key]
    if not done.cancelled():
        done.exception()  # retrieved: its waiters raise it (or were all cancelled)


async def _check_topic(config: ConnectionConfig, topic: str) -> None:
    """Raise ConfigurationError when ``topic`` does not exist (asked of the admin API)."""
    from airflow_provider_pulsarstate.engine.backends.admin_async import AsyncPulsarAdmin
    from airflow_provider_pulsarstate.engine.offsets.pulsar_index import topic_path

    admin = AsyncPulsarAdmin(config, what="topic stream")
    try:
        partitioned = await admin.request("GET", f"{topic_path(topic)}/partitions", ok=(200, 404))
        if partitioned.status_code == 200 and int(partitioned.json().get("partitions", 0)) > 0:
            return
        stats = await admin.request("GET", f"{topic_path(topic)}/stats", ok=(200, 404))
        if stats.status_code == 404:
            raise ConfigurationError(
                f"topics: {topic} does not exist on {redact_url(config.url)} (create it first; "
                "subscribing never creates it)"
            )
    finally:
        await admin.aclose()


# event loop -> connection -> [client, streams using it]: one client (one broker connection, one
# set of client threads) per connection and loop, however many streams a triggerer runs.
_CLIENTS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[ConnectionConfig, list[Any]]] = (
    weakref.WeakKeyDictionary()
)


# event loop -> connection -> the client being made (the first stream's, awaited by the others)
_MAKING: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[ConnectionConfig, asyncio.Future[Any]]] = (
    weakref.WeakKeyDictionary()
)


def _make_client(config: ConnectionConfig) -> Any:
    """A ``pulsar.asyncio`` client of ``config``. Blocking (importing the client library takes ~0.5 s
    of CPU, making a client tens of ms): run off the loop."""
    import pulsar.asyncio as pa

    from airflow_provider_pulsarstate.engine.backends.pulsar import client_options

    return pa.Client(config.url, **client_options(config))


@functools.cache
def _bytes_schema() -> Any:
    """The one bytes schema every consumer and producer of the process passes: without it,
    ``pulsar.asyncio`` makes one per call, ~30 objects of garbage in reference cycles each (its
    JSON encoding), 30,000 for a thousand watchers subscribing together, which bring the process's
    next full garbage collection closer. It holds no per-consumer state."""
    import pulsar.schema

    return pulsar.schema.BytesSchema()


async def _acquire_client(config: ConnectionConfig) -> Any:
    """The running loop's ``pulsar.asyncio`` client of ``config`` (made off the loop by the first
    stream, the others waiting for it); one more user."""
    loop = asyncio.get_running_loop()
    clients = _CLIENTS.setdefault(loop, {})
    entry = await made_once(
        clients, _MAKING.setdefault(loop, {}), config, lambda: _make_client(config), lambda c: [c, 0]
    )
    entry[1] += 1
    return entry[0]


def _release_client(config: ConnectionConfig, client: Any) -> bool:
    """One user of ``client`` fewer; True when it was the last (the caller closes it)."""
    try:
        clients = _CLIENTS.get(asyncio.get_running_loop(), {})
    except RuntimeError:  # no running loop: nobody else can use it
        return True
    entry = clients.get(config)
    if entry is None or entry[0] is not client:
        return True
    entry[1] -= 1
    if entry[1] > 0:
        return False
    del clients[config]
    return True


def read_topic_message(client: Any, topic: str, message_id: bytes, *, timeout: float) -> TopicMessage:
    """The message ``message_id`` (a serialized ``MessageId``) of ``topic`` (a partition's topic for
    a partitioned one), read with a short-lived reader on ``client`` (a blocking ``pulsar.Client``).
    Acknowledged messages stay readable only while the namespace's retention keeps them.

    :raises MessageUnavailableError: it is gone, or no message comes within ``timeout`` seconds.
    """
    import pulsar

    wanted = pulsar.MessageId.deserialize(message_id)
    position = (int(wanted.ledger_id()), int(wanted.entry_id()), int(wanted.batch_index()))
    what = f"message {':'.join(map(str, position))} of {topic}"
    try:
        reader = client.create_reader(topic, wanted, start_message_id_inclusive=True)
    except Exception as exc:
        raise MessageUnavailableError(f"{what}: cannot open a reader: {type(exc).__name__}: {exc}") from exc
    try:
        got = TopicMessage.from_pulsar(reader.read_next(max(1, int(timeout * 1000))))
    except Exception as exc:
        raise MessageUnavailableError(
            f"{what}: nothing to read within {timeout:.0f}s ({type(exc).__name__}; trimmed by retention?)"
        ) from exc
    finally:
        try:
            reader.close()
        except Exception:
            log.debug("closing the reader of %s failed", what, exc_info=True)
    if got.position[:2] != position[:2] or (position[2] >= 0 and got.batch_index != position[2]):
        raise MessageUnavailableError(f"{what} is gone (read {got.id_text} instead: trimmed by retention?)")
    return got


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
    "DEAD_LETTER_PROPERTY_PREFIX",
    "INITIAL_POSITIONS",
    "PAYLOAD_ENCODINGS",
    "REFERENCE_ENCODING",
    "MessageUnavailableError",
    "PayloadDecodeError",
    "PayloadTooLargeError",
    "TopicMessage",
    "TopicStream",
    "TopicStreamError",
    "TopicStreamOptions",
    "open_topic_stream",
    "read_topic_message",
]
