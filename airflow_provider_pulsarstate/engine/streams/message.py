"""A received topic message as plain data, its payload decoding and bounding, and reading one back by id.

A message too large to carry whole (see :meth:`TopicMessage.as_json`) is passed by reference:
:func:`read_topic_message` reads it back by topic and message id while retention keeps it.
"""

from __future__ import annotations

import base64
import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from airflow_provider_pulsarstate.engine.errors import ConfigurationError, PulsarStateError

log = logging.getLogger(__name__)

Position = tuple[int, int, int]
"""(ledger id, entry id, batch index): the order of messages within one partition."""

PAYLOAD_ENCODINGS = ("auto", "text", "base64", "json")
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


__all__ = [
    "PAYLOAD_ENCODINGS",
    "REFERENCE_ENCODING",
    "MessageUnavailableError",
    "PayloadDecodeError",
    "PayloadTooLargeError",
    "Position",
    "TopicMessage",
    "TopicStreamError",
    "read_topic_message",
]
