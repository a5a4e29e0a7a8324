"""Pulls from a Pulsar topic by offset: a pooled or new reader, and the read loop that numbers what
the reader hands out (see :mod:`.pulsar` for how offsets are counted inside and across entries).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import pulsar

from airflow_provider_pulsarstate.engine.backends import pulsar_compat
from airflow_provider_pulsarstate.engine.backends.pulsar import PulsarBackend
from airflow_provider_pulsarstate.engine.errors import ClosedError, OffsetError
from airflow_provider_pulsarstate.engine.offsets.base import PulledMessage
from airflow_provider_pulsarstate.engine.offsets.pulsar_index import EntryRef, batch_size_of
from airflow_provider_pulsarstate.engine.offsets.pulsar_positions import PositionIndex, Tail
from airflow_provider_pulsarstate.engine.offsets.pulsar_readers import Cursor, ReaderPool

_RECEIVER_QUEUE = 1000


class _PulsarMessage(PulledMessage):
    """A PulledMessage whose key, properties and publish time are read from the client's message
    only when asked (most consumers read the offset and value only: three fewer client calls per
    message). Equal to, and pickled as, a plain :class:`PulledMessage`."""

    __slots__ = ("_raw",)
    _raw: Any  # the client's message

    @property
    def key(self) -> str | None:
        key: str = self._raw.partition_key()
        return key or None

    @property
    def properties(self) -> Mapping[str, str]:
        properties: Mapping[str, str] = self._raw.properties()
        return properties

    @property
    def publish_time(self) -> float:
        return float(self._raw.publish_timestamp()) / 1000.0

    def plain(self) -> PulledMessage:
        """The same message as a plain PulledMessage (detached from the client's message)."""
        return PulledMessage(*_fields_of(self))

    def __eq__(self, other: object) -> bool:
        return _fields_of(self) == _fields_of(other) if isinstance(other, PulledMessage) else NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __reduce__(self) -> tuple[Any, ...]:
        return (PulledMessage, _fields_of(self))


def _fields_of(m: PulledMessage) -> tuple[Any, ...]:
    return (m.offset, m.partition, m.value, m.key, m.properties, m.publish_time, m.position)


# Built field by field in the read loop (a third of the cost of a frozen dataclass's __init__).
_new_message = object.__new__
_set_offset = PulledMessage.__dict__["offset"].__set__
_set_partition = PulledMessage.__dict__["partition"].__set__
_set_value = PulledMessage.__dict__["value"].__set__
_set_position = PulledMessage.__dict__["position"].__set__
_set_raw = _PulsarMessage.__dict__["_raw"].__set__


class Fetcher:
    """Pulls messages of one topic by offset through a :class:`ReaderPool`. Thread-safe (a reader
    is used by one pull at a time: taken from the pool, given back after)."""

    def __init__(self, backend: PulsarBackend, topic: str, index: PositionIndex, pool: ReaderPool) -> None:
        self.topic = topic
        self._backend = backend
        self._index = index
        self._pool = pool

    def pull(
        self, partition: int, offset: int, *, max_messages: int, max_bytes: int, timeout: float
    ) -> tuple[list[PulledMessage], int]:
        """:meth:`OffsetLog.read` (arguments checked)."""
        pt = self._index.ptopic(partition)
        cursor = self._pool.take(partition, offset)
        if cursor is None:
            cursor = self._open_cursor(partition, pt, offset)
        try:
            messages, at_tail = self.fill(cursor, max_messages=max_messages, max_bytes=max_bytes, timeout=timeout)
        except BaseException:
            self._pool.close_cursors([cursor])
            raise
        self._index.remember_next(cursor.partition, cursor.next_offset, cursor.entry)
        self._pool.give_back(cursor)
        if at_tail:
            end = cursor.next_offset
            self._index.note_end(partition, end)
        else:
            end = self._index.recent_end(partition, above=cursor.next_offset)
        return messages, end

    def _open_cursor(self, partition: int, pt: str, offset: int) -> Cursor:
        where = self._index.locate(partition, pt, offset)
        start: EntryRef | Tail | None
        if isinstance(where, Tail):
            # At the end: wait on the last entry (inclusive, its offsets dropped), so that a message
            # appended between the range check and the subscription is not missed.
            start = self._index.locate(partition, pt, offset - 1) if offset > self._index.beginning(partition) else None
            if isinstance(start, Tail):
                start = None
        else:
            start = where
        start_id = pulsar.MessageId.earliest if start is None else pulsar.MessageId(-1, start.ledger, start.entry, -1)
        try:
            reader = self._backend.client.create_reader(
                pt, start_id, start_message_id_inclusive=True, receiver_queue_size=_RECEIVER_QUEUE
            )
        except pulsar.PulsarException as exc:
            raise self._backend._unreachable("creating a reader of", pt, exc) from exc
        cursor = Cursor(partition, pt, reader, offset, entry=start)
        self._pool.add(cursor)
        return cursor

    def fill(
        self, cursor: Cursor, *, max_messages: int, max_bytes: int, timeout: float
    ) -> tuple[list[PulledMessage], bool]:
        """Read into a list until ``max_messages``, ``max_bytes`` or the tail; True when the tail stopped it.

        The deliberate hot loop of a pull, kept flat (it is most of a pull's cost): the client's own
        reader object, offsets computed inline while the entry does not change.
        """
        deadline = time.monotonic() + timeout
        messages: list[PulledMessage] = []
        append = messages.append
        raw_reader = pulsar_compat.raw_reader(cursor.reader, cursor.reader)  # skips pulsar.Message wrapping
        partition = cursor.partition
        next_offset = cursor.next_offset
        ref = cursor.entry
        ledger_now, entry_now, first, in_entry = (
            (ref.ledger, ref.entry, ref.first, ref.count) if ref else (-2, -2, 0, 0)
        )
        batch_now = remaining = 0
        size = count = 0
        at_tail = False
        try:
            while count < max_messages:
                pm = cursor.pending
                if pm is not None:
                    cursor.pending = None
                else:
                    try:
                        msg = raw_reader.read_next(0)  # what the client already received
                    except pulsar.Timeout:
                        msg = self._wait_next(cursor, deadline, first=not count)
                        if msg is None:
                            at_tail = True
                            break
                    if remaining:
                        # The client hands out every message of a batch in order: no id to read.
                        remaining -= 1
                        batch_now += 1
                        offset = first + batch_now
                    else:
                        mid = msg.message_id()
                        ledger, entry, batch_now = mid.ledger_id(), mid.entry_id(), mid.batch_index()
                        if entry != entry_now or ledger != ledger_now:
                            cursor.entry = ref = self._next_entry(cursor, mid, ledger, entry, batch_now)
                            ledger_now, entry_now, first, in_entry = ledger, entry, ref.first, ref.count
                        if batch_now >= 0:
                            offset = first + batch_now
                            remaining = in_entry - 1 - batch_now
                        else:
                            offset = first
                    if offset < next_offset:
                        continue  # below the requested offset, inside the entry holding it
                    pm = _new_message(_PulsarMessage)
                    _set_offset(pm, offset)
                    _set_partition(pm, partition)
                    _set_value(pm, msg.data())
                    _set_position(pm, (ledger_now, entry_now, batch_now))
                    _set_raw(pm, msg)
                if pm.offset > next_offset and self._skipped_trimmed(cursor, pm, next_offset, bool(count)):
                    break
                length = len(pm.value)
                if count and size + length > max_bytes:
                    cursor.pending = pm
                    break
                append(pm)
                count += 1
                size += length
                next_offset = pm.offset + 1
                if size >= max_bytes:
                    break
            last = messages[-1] if count else None
            if isinstance(last, _PulsarMessage):
                self._check_position(cursor, last)
        finally:
            cursor.next_offset = next_offset
        return messages, at_tail

    def _check_position(self, cursor: Cursor, last: _PulsarMessage) -> None:
        """Inside a batch offsets are counted, not read: once per pull, check the count against the
        last message's own id (a mismatch would mean the client skipped messages of a batch)."""
        mid = last._raw.message_id()
        actual = (mid.ledger_id(), mid.entry_id(), mid.batch_index())
        if actual != last.position:
            raise OffsetError(
                f"offsets of {cursor.topic} drifted: the message counted at {last.position} is at {actual}; "
                "its reader is discarded"
            )

    def _next_entry(self, cursor: Cursor, mid: Any, ledger: int, entry: int, batch: int) -> EntryRef:
        """The offsets of a new entry: from the previous one when it directly follows it in the same
        ledger (nothing can hide between them), else from the entry's headers."""
        ref = cursor.entry
        if ref is not None and ref.ledger == ledger and ref.entry + 1 == entry:
            count = batch_size_of(mid.serialize()) if batch >= 0 else 1
            if count > 0:
                return EntryRef(ledger, entry, ref.last + 1, count)
        found = self._index.entry_ref(cursor.topic, ledger, entry)
        if found is None:
            raise OffsetError(f"entry {ledger}:{entry} of {cursor.topic} was delivered but has no headers")
        return found

    def _skipped_trimmed(self, cursor: Cursor, pm: PulledMessage, expected: int, have_some: bool) -> bool:
        """A jump in offsets is fine when nobody held the skipped indexes; not when they were trimmed
        under the reader (then the offsets are gone: stop here, or raise when nothing was returned)."""
        beginning = self._index.beginning(cursor.partition)
        if beginning <= expected:
            return False
        if have_some:
            cursor.pending = pm
            return True
        raise self._index.out_of_range(cursor.partition, expected)

    def _wait_next(self, cursor: Cursor, deadline: float, *, first: bool) -> Any:
        """The next message when the client's queue is empty: one in flight, or (for a pull that has
        nothing yet) one arriving before ``deadline``; None at the tail."""
        try:
            in_flight = cursor.reader.has_message_available()
        except pulsar.PulsarException as exc:
            raise self._backend._unreachable("checking the tail of", cursor.topic, exc) from exc
        if in_flight:
            msg = self._read_cursor(cursor, max(1, int(self._backend.config.operation_timeout * 1000)))
            if msg is not None:
                return msg
        if first:
            remaining = deadline - time.monotonic()
            if remaining > 0:
                return self._read_cursor(cursor, max(1, int(remaining * 1000)))
        return None

    def _read_cursor(self, cursor: Cursor, timeout_ms: int) -> Any:
        raw_reader = pulsar_compat.raw_reader(cursor.reader, cursor.reader)
        try:
            return raw_reader.read_next(timeout_ms)
        except pulsar.Timeout:
            return None
        except pulsar.AlreadyClosed as exc:
            raise ClosedError(f"offset log of {self.topic} was closed during a read") from exc
        except pulsar.PulsarException as exc:
            raise self._backend._unreachable("reading", cursor.topic, exc) from exc
