"""Pure helpers on the Pulsar broker's offset index, shared by the blocking and the async clients.

No I/O here: admin paths, and the parsing of what the admin API answers (entry headers, message
positions, subscription properties, internal stats). See REFERENCE §3 and §8, verified on 4.2:

* an entry's ``X-Pulsar-Broker-Entry-METADATA-index`` is the offset of its LAST message and
  ``X-Pulsar-num-batch-message`` (absent when not batched) how many messages it holds;
* ``getMessageIdByIndex`` answers the entry CONTAINING an offset, ``-1:-1`` (earliest) for offsets
  in the first entry and for trimmed ones, 404 past the tail, 412 without the interceptor, and a
  500 when the topic's ledgers were all trimmed;
* ``examinemessage`` answers 412 when no message is retained; the last offset then lives in the
  managed ledger's ``index`` property (written when a ledger is closed).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from airflow_provider_pulsarstate.engine.backends.admin import PulsarAdmin
from airflow_provider_pulsarstate.engine.backends.base import partition_topic_name
from airflow_provider_pulsarstate.engine.errors import OffsetIndexUnavailableError

INDEX_HEADER = "X-Pulsar-Broker-Entry-METADATA-index"
BATCH_HEADER = "X-Pulsar-num-batch-message"
MESSAGE_ID_HEADER = "X-Pulsar-Message-ID"
COMMITTED_PROPERTY = "pulsarstate.next-offset"
"""Subscription property holding the committed offset (the next to consume), exactly as committed."""

INTERCEPTOR_SETTINGS = (
    "brokerEntryMetadataInterceptors=org.apache.pulsar.common.intercept.AppendIndexMetadataInterceptor "
    "and exposingBrokerEntryMetadataToClientEnabled=true"
)


def index_unavailable(topic: str, detail: str) -> OffsetIndexUnavailableError:
    return OffsetIndexUnavailableError(
        f"the broker gives no offset index for {topic} ({detail}): set {INTERCEPTOR_SETTINGS} in broker.conf "
        "and restart the broker; only entries written after that carry an index"
    )


def partition_topic(topic: str, partitions: int, partition: int) -> str:
    """The topic holding ``partition``: ``topic`` itself when not partitioned, else ``topic-partition-K``."""
    return topic if partitions == 0 else partition_topic_name(topic, partition)


def topic_path(topic: str) -> str:
    """``persistent://t/ns/name`` -> ``persistent/t/ns/name`` (URL-quoted)."""
    return PulsarAdmin.topic_path(topic)


def subscription_path(topic: str, subscription: str) -> str:
    return f"{topic_path(topic)}/subscription/{quote(subscription, safe='')}"


@dataclass(frozen=True, slots=True)
class EntryRef:
    """One entry and the offsets it holds (``first`` .. ``last``)."""

    ledger: int
    entry: int
    first: int
    count: int

    @property
    def last(self) -> int:
        return self.first + self.count - 1

    def batch_index(self, offset: int) -> int:
        """Position of ``offset`` inside the entry."""
        return offset - self.first


def parse_entry_headers(headers: Mapping[str, str], topic: str) -> tuple[int, int]:
    """``(last offset, message count)`` of an entry from its admin response headers.

    :raises OffsetIndexUnavailableError: the entry carries no index.
    """
    raw = headers.get(INDEX_HEADER)
    if raw is None:
        where = headers.get(MESSAGE_ID_HEADER, "?")
        raise index_unavailable(topic, f"entry {where} has no {INDEX_HEADER} header")
    count = int(headers.get(BATCH_HEADER) or 1)
    return int(raw), max(1, count)


def parse_entry_id(header: str | None) -> tuple[int, int] | None:
    """``"L:E"`` -> ``(L, E)``."""
    if not header:
        return None
    ledger, _, entry = header.split()[0].partition(":")  # "5:1 (ackSet with ...)" after a batch reset
    try:
        return int(ledger), int(entry)
    except ValueError:
        return None


def parse_position(body: Mapping[str, Any]) -> tuple[int, int] | None:
    """A ``{ledgerId, entryId}`` answer; None for ``-1:-1`` (the broker's "earliest")."""
    ledger, entry = int(body.get("ledgerId", -1)), int(body.get("entryId", -1))
    if ledger < 0:
        return None
    return ledger, entry


def last_index_property(internal_stats: Mapping[str, Any]) -> int:
    """The last offset the managed ledger recorded (``-1``: none), for a topic with no retained entry."""
    raw = (internal_stats.get("properties") or {}).get("index")
    try:
        return int(raw) if raw is not None else -1
    except ValueError:
        return -1


def cursor_positions(
    internal_stats: Mapping[str, Any], subscription: str
) -> tuple[tuple[int, int] | None, tuple[int, int] | None]:
    """A subscription's ``(markDeletePosition, readPosition)`` entries from internal stats; each None
    when absent or before a ledger's first entry (``L:-1``)."""
    cursor = (internal_stats.get("cursors") or {}).get(subscription) or {}
    mark = parse_entry_id(cursor.get("markDeletePosition"))
    read = parse_entry_id(cursor.get("readPosition"))
    return (mark if mark and mark[1] >= 0 else None), (read if read and read[1] >= 0 else None)


def parse_committed(properties: Mapping[str, Any]) -> int | None:
    """The committed offset recorded in subscription properties, or None."""
    raw = properties.get(COMMITTED_PROPERTY)
    if raw is None:
        return None
    try:
        value = int(raw)
    except (TypeError, ValueError):
        return None
    return value if value >= 0 else None


def batch_size_of(serialized_id: bytes) -> int:
    """The ``batch_size`` field (6) of a serialized ``MessageIdData`` (0 when absent).

    pulsar-client-python exposes no batch size on a MessageId; its serialized form carries it.
    """
    data = serialized_id
    i, n = 0, len(data)
    while i < n:
        key, i = read_varint(data, i)
        field, wire = key >> 3, key & 7
        if wire == 0:
            value, i = read_varint(data, i)
            if field == 6:
                return value
        elif wire == 2:
            length, i = read_varint(data, i)
            i += length
        elif wire == 1:
            i += 8
        elif wire == 5:
            i += 4
        else:
            return 0
    return 0


def read_varint(data: bytes, i: int) -> tuple[int, int]:
    """The protobuf varint at ``data[i:]`` and the index after it.

    :raises IndexError: truncated, or longer than 64 bits.
    """
    shift = result = 0
    while True:
        b = data[i]
        i += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, i
        shift += 7
        if shift > 63:
            raise IndexError("varint longer than 64 bits")
