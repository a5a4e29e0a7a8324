"""``PulsarMessageTrigger``: schedule DAGs from messages on Pulsar topics (asset watchers).

In the triggerer every watcher of the same topics, subscription and batching shares one consumer
(Airflow 3.3's shared streams, ack mode): a message is acknowledged only after every watcher moved
past it and the asset events derived from it were stored in the metadata database. Until then it
holds its partition's floor (see :mod:`~airflow_provider_pulsarstate.engine.topic_stream`): a
later cumulative acknowledgement never covers it. A triggerer that dies in between leaves it
unacknowledged, and the broker delivers it again after the restart, so watchers see each message
at least once and, when the triggerer does not die, exactly once.

Events carry plain JSON::

    {"topic": "persistent://public/default/orders-partition-1", "partition": 1,
     "messages": [{"topic", "partition", "ledger_id", "entry_id", "batch_index",
                   "message_id" (base64 of the serialized MessageId), "key", "properties",
                   "publish_time", "event_time" (ms since the epoch), "redelivery_count",
                   "payload_size", "payload_encoding", "payload"}]}

``payload`` is decoded per ``payload_encoding``: ``auto`` (UTF-8 text when valid, else base64),
``text``, ``base64`` or ``json`` (parsed; parsing never executes anything). With an
``apply_function`` each entry of ``messages`` is what it returned for that message instead.

Events are bounded, since they are stored in the metadata database (``asset_event.extra``) and
built on the triggerer's event loop: a payload over ``max_payload_bytes`` is passed by reference
(``payload_encoding`` ``"reference"``, ``payload`` None; a task reads it with
``PulsarStateHook.read_message(entry)`` while the namespace's retention keeps it), or with
``oversized_payloads="reject"`` the message is rejected (dead-lettered). An event over
``max_event_bytes`` (its JSON) passes its largest payloads by reference until it fits; when even
that is not enough (large properties, or apply results) its messages are rejected. Payloads over
64 KiB are decoded in a worker thread, off the loop. Anything in a carried payload (secrets
included) ends up in the metadata database: pass references, or trim with an ``apply_function``.

Settling a message after the watchers resolved it:

* every watcher took it (filtered out, or its event stored): acknowledged;
* a watcher's filter or apply function raised on it, or its payload did not decode (a poison
  message): the watcher rejects it (``reject_shared_stream_event``) and it is dead-lettered to
  ``dead_letter_topic`` (without one: acknowledged and logged, never redelivered forever);
* a watcher failed on it (the event was not stored within ``[triggerer] shared_stream_ack_timeout``):
  negatively acknowledged and redelivered after ``redelivery_delay``; after ``max_redeliveries``
  such failures it is dead-lettered when a ``dead_letter_topic`` is set;
* no watcher was listening: negatively acknowledged (not counted as a failure).

Delivery is at least once per watcher: a message that comes again (the triggerer died before every
watcher's event was stored, or one watcher timed out) reaches every watcher of the stream again,
also those whose event for it was already stored; make downstream DAGs idempotent (the message id
is in the event). The subscription is ``Failover``: run the watchers of one subscription in one
triggerer (e.g. a trigger queue), since a second triggerer's consumer on it only stands by.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
import re
from collections.abc import AsyncIterator, Callable, Hashable, Sequence
from typing import Any

from airflow.triggers.base import BaseEventTrigger, TriggerEvent
from airflow.triggers.shared_stream import AdvanceItem, SharedStreamProducer, reject_shared_stream_event

from airflow_provider_pulsarstate.engine.errors import BackendUnavailableError, ClosedError, ConfigurationError
from airflow_provider_pulsarstate.engine.retry import Backoff
from airflow_provider_pulsarstate.hooks.pulsarstate import (
    INITIAL_POSITIONS,
    PAYLOAD_ENCODINGS,
    REFERENCE_ENCODING,
    PayloadTooLargeError,
    PulsarStateHook,
    TopicMessage,
    TopicStream,
)
from airflow_provider_pulsarstate.triggers.shared_config import shared_config
from airflow_provider_pulsarstate.triggers.shared_log import SharedLog
from airflow_provider_pulsarstate.triggers.start_gate import start_turn

log = logging.getLogger(__name__)
# a thousand watchers of a topic retry an unreachable broker together: one line each time, not a thousand
_shared_log = SharedLog(log)

OVERSIZED_PAYLOADS = ("reference", "reject")
DECODE_OFF_LOOP_BYTES = 64 * 1024
"""Payloads larger than this are decoded in a worker thread, not on the triggerer's event loop."""

_DOTTED = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)+$")


def _fail(field: str, problem: str) -> ConfigurationError:
    return ConfigurationError(f"PulsarMessageTrigger {field}: {problem}")


def _topics(value: Any) -> list[str]:
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, (list, tuple)) or not items:
        raise _fail("topics", f"give a topic name or a non-empty list of them, got {value!r}")
    topics = []
    for item in items:
        if not isinstance(item, str) or not item.strip():
            raise _fail("topics", f"{item!r} is not a topic name")
        topics.append(item.strip())
    if len(set(topics)) != len(topics):
        raise _fail("topics", f"{topics} names a topic twice")
    return topics


def _dotted(field: str, value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not _DOTTED.match(value):
        raise _fail(field, f"must be the dotted import path of a function (module.function), got {value!r}")
    return value


def _number(field: str, value: Any, *, integer: bool, minimum: float) -> Any:
    ok = not isinstance(value, bool) and isinstance(value, int if integer else (int, float))
    if not ok or value < minimum or value != value or value == float("inf"):
        raise _fail(field, f"must be {'an integer' if integer else 'a number of seconds'} >= {minimum}, got {value!r}")
    return int(value) if integer else float(value)


def import_function(path: str, field: str) -> Callable[..., Any]:
    """The function at dotted ``path`` (imported in the triggerer; never taken from message content).

    :raises ConfigurationError: the module or attribute is missing, or it is not callable (names ``field``).
    """
    from airflow.sdk.module_loading import import_string

    try:
        fn = import_string(path)
    except (ImportError, AttributeError) as exc:
        raise _fail(field, f"cannot import {path!r}: {type(exc).__name__}: {exc}") from exc
    if not callable(fn):
        raise _fail(field, f"{path!r} is not callable")
    return fn


class PulsarMessageTrigger(BaseEventTrigger):
    """Fire events for messages on Pulsar ``topics`` (see the module docstring for payloads and settling).

    Usage::

        from airflow.sdk import DAG, Asset, AssetWatcher
        from airflow_provider_pulsarstate.triggers.messages import PulsarMessageTrigger

        orders = Asset("orders", watchers=[AssetWatcher(
            name="orders-topic",
            trigger=PulsarMessageTrigger(topics="orders", subscription="orders-dag", payload_encoding="json"),
        )])
        with DAG("on_orders", schedule=[orders]): ...

    Its arguments are plain JSON fixed at parse time (a watcher is identified by a hash of them).
    Watchers with equal ``pulsarstate_conn_id``, ``topics``, ``subscription``, batching, dead-letter
    and redelivery options share one consumer in a triggerer; filters, apply functions and the
    payload encoding may differ between them.

    :param topics: a topic or a list (short names use the connection's tenant/namespace). They must exist.
    :param subscription: the durable subscription (``Failover``: a second triggerer stands by).
    :param batch_size: messages per event (1: one event per message); a batch never mixes partitions.
    :param batch_wait: seconds a batch waits for more messages after its first.
    :param filter_function: dotted path of ``fn(message: dict) -> bool``; messages it refuses make no event.
    :param apply_function: dotted path of ``fn(message: dict) -> Any`` (JSON; may be ``async``); the
        event carries its results (None results are dropped). Both run in the triggerer's event
        loop: keep them quick and non-blocking.
    :param payload_encoding: ``auto``, ``text``, ``base64`` or ``json`` (see the module docstring).
    :param max_payload_bytes: larger payloads are not carried in events (see ``oversized_payloads``).
    :param oversized_payloads: ``reference`` (the entry locates the message: ``payload`` None,
        ``payload_encoding`` ``"reference"``) or ``reject`` (dead-lettered like a poison message).
    :param max_event_bytes: the most JSON bytes of one event (largest payloads passed by reference
        to fit; messages rejected when that is not enough).
    :param dead_letter_topic: where poison messages and messages failed ``max_redeliveries`` times go.
    :param max_redeliveries: failures of one message before it is dead-lettered.
    :param redelivery_delay: seconds before a negatively acknowledged message comes again.
    :param initial_position: where a new subscription starts: ``latest`` or ``earliest``.
    :param pulsarstate_conn_id: a ``pulsarstate`` connection to a Pulsar broker (the embedded back
        end has no subscriptions to consume: it is refused, naming the connection).
    """

    def __init__(
        self,
        *,
        topics: str | Sequence[str],
        subscription: str,
        batch_size: int = 1,
        batch_wait: float = 0.0,
        filter_function: str | None = None,
        apply_function: str | None = None,
        payload_encoding: str = "auto",
        max_payload_bytes: int = 64 * 1024,
        oversized_payloads: str = "reference",
        max_event_bytes: int = 256 * 1024,
        dead_letter_topic: str | None = None,
        max_redeliveries: int = 3,
        redelivery_delay: float = 1.0,
        initial_position: str = "latest",
        pulsarstate_conn_id: str = PulsarStateHook.default_conn_name,
    ) -> None:
        super().__init__()
        self.topics = _topics(topics)
        if not isinstance(subscription, str) or not subscription.strip():
            raise _fail("subscription", f"must be a non-empty name, got {subscription!r}")
        self.subscription = subscription.strip()
        self.batch_size = _number("batch_size", batch_size, integer=True, minimum=1)
        self.batch_wait = _number("batch_wait", batch_wait, integer=False, minimum=0.0)
        self.filter_function = _dotted("filter_function", filter_function)
        self.apply_function = _dotted("apply_function", apply_function)
        if payload_encoding not in PAYLOAD_ENCODINGS:
            raise _fail("payload_encoding", f"must be one of {', '.join(PAYLOAD_ENCODINGS)}, got {payload_encoding!r}")
        self.payload_encoding = payload_encoding
        self.max_payload_bytes = _number("max_payload_bytes", max_payload_bytes, integer=True, minimum=0)
        if oversized_payloads not in OVERSIZED_PAYLOADS:
            raise _fail(
                "oversized_payloads", f"must be one of {', '.join(OVERSIZED_PAYLOADS)}, got {oversized_payloads!r}"
            )
        self.oversized_payloads = oversized_payloads
        self.max_event_bytes = _number("max_event_bytes", max_event_bytes, integer=True, minimum=1024)
        if dead_letter_topic is not None and (not isinstance(dead_letter_topic, str) or not dead_letter_topic.strip()):
            raise _fail("dead_letter_topic", f"must be a topic name or None, got {dead_letter_topic!r}")
        self.dead_letter_topic = dead_letter_topic.strip() if dead_letter_topic else None
        self.max_redeliveries = _number("max_redeliveries", max_redeliveries, integer=True, minimum=0)
        self.redelivery_delay = _number("redelivery_delay", redelivery_delay, integer=False, minimum=0.0)
        if initial_position not in INITIAL_POSITIONS:
            raise _fail("initial_position", f"must be one of {', '.join(INITIAL_POSITIONS)}, got {initial_position!r}")
        self.initial_position = initial_position
        if not isinstance(pulsarstate_conn_id, str) or not pulsarstate_conn_id:
            raise _fail("pulsarstate_conn_id", f"must be a connection id, got {pulsarstate_conn_id!r}")
        self.pulsarstate_conn_id = pulsarstate_conn_id
        self._functions: tuple[Callable[..., Any] | None, Callable[..., Any] | None] | None = None

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "topics": list(self.topics),
                "subscription": self.subscription,
                "batch_size": self.batch_size,
                "batch_wait": self.batch_wait,
                "filter_function": self.filter_function,
                "apply_function": self.apply_function,
                "payload_encoding": self.payload_encoding,
                "max_payload_bytes": self.max_payload_bytes,
                "oversized_payloads": self.oversized_payloads,
                "max_event_bytes": self.max_event_bytes,
                "dead_letter_topic": self.dead_letter_topic,
                "max_redeliveries": self.max_redeliveries,
                "redelivery_delay": self.redelivery_delay,
                "initial_position": self.initial_position,
                "pulsarstate_conn_id": self.pulsarstate_conn_id,
            },
        )

    # ------------------------------------------------------------------ the consumer
    def _stream_key_fields(self) -> tuple[Any, ...]:
        return (
            self.pulsarstate_conn_id,
            tuple(self.topics),
            self.subscription,
            self.batch_size,
            self.batch_wait,
            self.dead_letter_topic,
            self.max_redeliveries,
            self.redelivery_delay,
            self.initial_position,
        )

    def shared_stream_key(self) -> Hashable | None:
        """Watchers with equal keys share one consumer (everything but filter, apply function, encoding and size limits)."""
        return ("pulsarstate-messages", *self._stream_key_fields())

    @classmethod
    def create_shared_stream_producer(cls, kwargs: dict[str, Any]) -> SharedStreamProducer:
        return PulsarMessageStreamProducer(cls(**kwargs))

    async def open_topic_stream(self) -> TopicStream:
        """Open this trigger's consumer (retrying an unreachable broker with back-off); the caller closes it."""
        hook = PulsarStateHook(pulsarstate_conn_id=self.pulsarstate_conn_id)
        backoff = Backoff(initial=0.5, maximum=10.0)
        while True:
            await start_turn()  # a thousand watchers subscribing together take turns
            config = await shared_config(hook)
            stream = hook.get_async_topic_stream(
                self.topics,
                self.subscription,
                config=config,
                dead_letter_topic=self.dead_letter_topic,
                max_redeliveries=self.max_redeliveries,
                redelivery_delay=self.redelivery_delay,
                initial_position=self.initial_position,
            )
            try:
                return await stream.open()
            except BackendUnavailableError as exc:
                delay = backoff.next_delay()
                _shared_log.warning(
                    ("open failed", tuple(self.topics), type(exc).__name__),
                    "opening %r failed (%s); retrying in %.1fs",
                    stream,
                    exc,
                    delay,
                )
                await asyncio.sleep(delay)

    # ------------------------------------------------------------------ events
    def _resolve_functions(self) -> tuple[Callable[..., Any] | None, Callable[..., Any] | None]:
        if self._functions is None:
            self._functions = (
                import_function(self.filter_function, "filter_function") if self.filter_function else None,
                import_function(self.apply_function, "apply_function") if self.apply_function else None,
            )
        return self._functions

    async def event_for(self, messages: Sequence[TopicMessage]) -> TriggerEvent | None:
        """This watcher's event for one raw event (None: every message filtered out), at most
        ``max_event_bytes`` of JSON.

        :raises Exception: what the payload decoding, filter or apply function raised, or
            :class:`PayloadTooLargeError` (the caller rejects).
        """
        keep, apply = self._resolve_functions()
        entries: list[Any] = []
        references: list[tuple[int, TopicMessage]] = []  # entries that are the message itself
        for message in messages:
            data = await self._message_json(message)
            if keep is not None:
                verdict = keep(data)
                if inspect.isawaitable(verdict):
                    verdict = await verdict
                if not verdict:
                    continue
            if apply is not None:
                data = apply(data)
                if inspect.isawaitable(data):
                    data = await data
                if data is None:
                    continue
            else:
                references.append((len(entries), message))
            entries.append(data)
        if not entries:
            return None
        first = messages[0]
        payload = {"topic": first.topic, "partition": first.partition, "messages": entries}
        await self._fit(payload, references, messages)
        return TriggerEvent(payload)

    async def _message_json(self, message: TopicMessage) -> dict[str, Any]:
        """The message as plain JSON; an oversized payload left out (or refused), a large one decoded off the loop."""
        if message.payload_size > self.max_payload_bytes and self.oversized_payloads == "reject":
            raise PayloadTooLargeError(
                f"message {message.id_text} of {message.topic}: payload of {message.payload_size} bytes is over "
                f"max_payload_bytes={self.max_payload_bytes}"
            )
        if min(message.payload_size, self.max_payload_bytes) > DECODE_OFF_LOOP_BYTES:
            return await asyncio.to_thread(
                message.as_json, self.payload_encoding, max_payload_bytes=self.max_payload_bytes
            )
        return message.as_json(self.payload_encoding, max_payload_bytes=self.max_payload_bytes)

    async def _fit(
        self, payload: dict[str, Any], references: list[tuple[int, TopicMessage]], messages: Sequence[TopicMessage]
    ) -> None:
        """Pass the largest carried payloads of ``payload`` by reference until its JSON is within
        ``max_event_bytes``.

        :raises PayloadTooLargeError: still too large with every payload passed by reference.
        """
        entries = payload["messages"]
        large = sum(m.payload_size for m in messages) > DECODE_OFF_LOOP_BYTES
        sizes = await _json_sizes(entries, off_loop=large)
        overhead = len(json.dumps({**payload, "messages": []}).encode()) + len(entries)
        total = overhead + sum(sizes)
        carried = [(i, m) for i, m in references if entries[i].get("payload_encoding") != REFERENCE_ENCODING]
        for i, _ in sorted(carried, key=lambda pair: -sizes[pair[0]]):
            if total <= self.max_event_bytes:
                break
            entries[i] = {**entries[i], "payload_encoding": REFERENCE_ENCODING, "payload": None}
            new_size = len(json.dumps(entries[i]).encode())
            total += new_size - sizes[i]
            sizes[i] = new_size
        if total > self.max_event_bytes:
            raise PayloadTooLargeError(
                f"the event for message(s) {', '.join(m.id_text for m in messages)} of "
                f"{payload['topic']} takes {total} bytes of JSON, over max_event_bytes={self.max_event_bytes}"
            )

    async def filter_shared_stream(self, shared_stream: AsyncIterator[Any]) -> AsyncIterator[TriggerEvent]:
        async for raw in shared_stream:
            try:
                event = await self.event_for(raw)
            except ConfigurationError:
                raise  # a filter/apply path that does not import: the watcher itself is broken
            except Exception as exc:
                log.warning(
                    "rejecting message(s) %s of %s: %s: %s",
                    ", ".join(m.id_text for m in raw),
                    raw[0].topic if raw else "?",
                    type(exc).__name__,
                    exc,
                )
                reject_shared_stream_event()
                continue
            if event is not None:
                yield event

    async def run(self) -> AsyncIterator[TriggerEvent]:
        """Without a shared stream (e.g. a direct call): a private consumer that acknowledges a
        message once its event was taken by the caller (not gated on the event being stored)."""
        stream = await self.open_topic_stream()
        try:
            while True:
                batch = await stream.receive_batch(max_messages=self.batch_size, max_wait=self.batch_wait)
                for group in group_by_partition(batch):
                    try:
                        event = await self.event_for(group)
                    except ConfigurationError:
                        raise
                    except Exception as exc:
                        await stream.dead_letter(group, reason=f"{type(exc).__name__}: {exc}")
                        continue
                    if event is not None:
                        yield event
                    await stream.acknowledge(group)
        finally:
            await stream.aclose()


async def _json_sizes(entries: list[Any], *, off_loop: bool) -> list[int]:
    """Bytes of each entry's JSON (measured in a worker thread when ``off_loop``)."""

    def measure() -> list[int]:
        return [len(json.dumps(entry).encode()) for entry in entries]

    return await asyncio.to_thread(measure) if off_loop else measure()


def group_by_partition(batch: Sequence[TopicMessage]) -> list[tuple[TopicMessage, ...]]:
    """``batch`` split per partition, each in receipt order (the partitions in order of first appearance)."""
    groups: dict[str, list[TopicMessage]] = {}
    for message in batch:
        groups.setdefault(message.lane, []).append(message)
    return [tuple(group) for group in groups.values()]


class PulsarMessageStreamProducer(SharedStreamProducer):
    """The broker side of a shared :class:`PulsarMessageTrigger` stream: one consumer, advanced per partition."""

    def __init__(self, trigger: PulsarMessageTrigger) -> None:
        self._trigger: PulsarMessageTrigger | None = trigger
        self._stream: TopicStream | None = None

    async def open_stream(self) -> AsyncIterator[tuple[Any, Any]]:
        # the trigger built from the kwargs only opens the consumer: a running stream keeps none
        # (a thousand streams live as long as the triggerer, each kept object counts towards the
        # process's next full garbage collection)
        trigger, self._trigger = self._trigger, None
        if trigger is None:
            raise ClosedError("a PulsarMessageStreamProducer opens its stream once; it was opened before")
        batch_size, batch_wait = trigger.batch_size, trigger.batch_wait
        self._stream = await trigger.open_topic_stream()
        del trigger
        while True:
            batch = await self._stream.receive_batch(max_messages=batch_size, max_wait=batch_wait)
            for group in group_by_partition(batch):
                yield group, group

    def get_advance_lane(self, broker_payload: Any) -> Hashable:
        return broker_payload[0].lane

    async def advance(self, batch: Sequence[AdvanceItem]) -> None:
        assert self._stream is not None
        clean: list[TopicMessage] = []
        for item in batch:
            messages, outcome = item.broker_payload, item.outcome
            if outcome.rejected:
                await self._stream.dead_letter(messages, reason=f"rejected by {outcome.rejected} watcher(s)")
            elif outcome.failed:
                await self._stream.fail(messages, reason=f"failed in {outcome.failed} watcher(s)")
            elif not outcome.acked:
                await self._stream.fail(messages, count=False)  # nobody listened: not the message's fault
            else:
                clean.extend(messages)
        if clean:
            await self._stream.acknowledge(clean)

    async def aclose(self) -> None:
        if self._stream is not None:
            await self._stream.aclose()
