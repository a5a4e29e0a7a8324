"""Offsets by publish time on Pulsar: the broker's time search says where to start, reading
forward finds the answer."""

from __future__ import annotations

import math
from typing import Protocol

from airflow_provider_pulsarstate.engine.errors import OffsetOutOfRangeError
from airflow_provider_pulsarstate.engine.offsets.base import PulledMessage
from airflow_provider_pulsarstate.engine.offsets.pulsar_index import parse_position
from airflow_provider_pulsarstate.engine.offsets.pulsar_positions import PositionIndex

_TIME_SCAN_MESSAGES = 500
_TIME_SCAN_BYTES = 1 << 20


class Read(Protocol):
    """The log's :meth:`~.base.OffsetLog.read`."""

    def __call__(
        self, partition: int, offset: int, *, max_messages: int, max_bytes: int, timeout: float
    ) -> tuple[list[PulledMessage], int]: ...


def offset_for_time(index: PositionIndex, read: Read, partition: int, timestamp: float) -> int | None:
    """The first offset whose ``publish_time`` is >= ``timestamp``, or None past the end.

    The broker's ``messageid/{ms}`` searches by its own entry timestamp, which is later than the
    client's ``publish_time`` (stamped when the batch was created): its answer is where the search
    starts, never the answer itself. From there messages are read forward (with ``read``, the log's
    :meth:`~.base.OffsetLog.read`) until the first one published at or after ``timestamp`` (within
    the entry and across entries), as the embedded back end answers. Exact as long as producers'
    clocks are not ahead of the broker's (a message stamped later than the broker received it could
    sit before the broker's answer).
    """
    start = _time_search_start(index, partition, timestamp)
    return None if start is None else _first_published_from(read, partition, start, timestamp)


def _time_search_start(index: PositionIndex, partition: int, timestamp: float) -> int | None:
    """The first offset of the first entry the broker stamped at or after ``timestamp`` (no
    message before it was published that late), or None when none was."""
    pt = index.ptopic(partition)
    pos = parse_position(index.admin.message_id_by_time(pt, math.ceil(timestamp * 1000)))
    if pos is None:  # the broker's "earliest": every retained entry was stamped that late
        beginning, end = index.beginning(partition), index.end(partition)
        return beginning if beginning < end else None
    ref = index.entry_ref(pt, pos[0], max(pos[1], 0))
    return None if ref is None else ref.first  # a position past the last entry: none is that recent


def _first_published_from(read: Read, partition: int, offset: int, timestamp: float) -> int | None:
    """Read from ``offset`` to the tail; the offset of the first message published at or after
    ``timestamp``, None when the tail comes first. Restarts at the beginning offset when
    retention trims the messages under the scan."""
    while True:
        try:
            messages, _end = read(
                partition, offset, max_messages=_TIME_SCAN_MESSAGES, max_bytes=_TIME_SCAN_BYTES, timeout=0.0
            )
        except OffsetOutOfRangeError as exc:
            if exc.beginning <= offset:
                raise
            offset = exc.beginning
            continue
        if not messages:
            return None
        for message in messages:
            if message.publish_time >= timestamp:
                return message.offset
        offset = messages[-1].offset + 1
