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
import logging
import time
from collections import defaultdict, deque
from collections.abc import Iterable, Sequence
from typing import Any

from airflow_provider_pulsarstate.engine.config import ConnectionConfig, redact_url
from airflow_provider_pulsarstate.engine.errors import (
    BackendUnavailableError,
    ClosedError,
    ConfigurationError,
    PulsarStateError,
)
from airflow_provider_pulsarstate.engine.streams.clients import (
    TOPIC_CHECK_TTL,
    acquire_client,
    bytes_schema,
    release_client,
    require_topic,
)
from airflow_provider_pulsarstate.engine.streams.dead_letters import DEAD_LETTER_PROPERTY_PREFIX, DeadLetterPublisher
from airflow_provider_pulsarstate.engine.streams.lanes import Lane
from airflow_provider_pulsarstate.engine.streams.message import (
    PAYLOAD_ENCODINGS,
    REFERENCE_ENCODING,
    MessageUnavailableError,
    PayloadDecodeError,
    PayloadTooLargeError,
    Position,
    TopicMessage,
    TopicStreamError,
    read_topic_message,
)
from airflow_provider_pulsarstate.engine.streams.options import (
    INITIAL_POSITIONS,
    TopicStreamOptions,
    check_int,
    check_seconds,
)

log = logging.getLogger(__name__)

_WAKE = object()  # queued to wake a waiting receive when a failed message is due again


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
        if not config.has_subscriptions:
            raise ConfigurationError("a topic stream needs a pulsar:// connection")
        self.config = config
        self.options = options
        self._client: Any = None
        self._consumer: Any = None
        self._dead_letters = DeadLetterPublisher(config, options, lambda: self._client)
        self._queue: asyncio.Queue[Any] | None = None
        self._due: deque[Any] = deque()  # failed messages whose redelivery delay passed
        self._timers: set[asyncio.TimerHandle] = set()
        self._pump: asyncio.Task[None] | None = None
        self._lanes: dict[str, Lane] = defaultdict(Lane)
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
        self._client = await acquire_client(self.config)
        if self._closed:  # closed while the client was being made
            await self._close_client()
            raise ClosedError(f"{self!r} is closed")
        import pulsar  # imported by _make_client, off the loop

        try:
            for topic in opts.topics:
                await require_topic(self.config, topic)
            self._consumer = await asyncio.wait_for(
                self._client.subscribe(
                    list(opts.topics),
                    opts.subscription,
                    consumer_type=pulsar.ConsumerType.Failover,
                    schema=bytes_schema(),
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
        if self._consumer is not None:
            try:
                await asyncio.wait_for(self._consumer.close(), self.config.operation_timeout)
            except Exception:
                log.debug("closing %r failed", self._consumer, exc_info=True)
        await self._dead_letters.aclose()
        await self._close_client()

    async def _close_client(self) -> None:
        client, self._client = self._client, None
        if client is not None and release_client(self.config, client):
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
        check_int("max_messages", max_messages, minimum=1)
        check_seconds("max_wait", max_wait, minimum=0.0)
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
    def _lane_of(self, message: TopicMessage) -> Lane:
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

    async def _acknowledge_lane(self, lane: Lane, lane_name: str, group: list[TopicMessage]) -> None:
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
            elif await self._dead_letters.send(message, reason):
                self.stats["dead_lettered"] += 1
            else:
                self.stats["dead_letter_failures"] += 1
        for message in batch:  # a redelivered copy may sit in "failed": make it in flight to settle it
            lane = self._lanes[message.lane]
            if message.position in lane.failed:
                lane.failed.discard(message.position)
                lane.inflight.add(message.position)
        await self.acknowledge(batch)

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
    if not config.has_subscriptions:
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
    "TOPIC_CHECK_TTL",
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
