"""The Pulsar back end of the offset contract: offsets are the broker's entry index.

How offsets are found (facts checked on Pulsar 4.2, see :mod:`.pulsar_index`):

* **Start of a pull.** ``getMessageIdByIndex`` gives the entry containing the offset; its headers
  (``HEAD .../ledger/L/entry/E``) give the entry's last offset and message count, so the reader is
  created INCLUSIVE at that entry and the lower offsets of the batch are dropped. The broker answers
  ``-1:-1`` for the first entry and for trimmed offsets: the beginning offset tells them apart
  (below it: :class:`OffsetOutOfRangeError`, never a silent restart). Past the tail it answers
  404: a pull at the end offset waits on a reader placed at the last entry and returns nothing.
* **Offsets of what a reader returns.** The client exposes no index on a Message: an entry that
  directly follows the previous one in the same ledger starts at the previous entry's last offset
  + 1 and holds ``batch_size`` messages (read from the serialized MessageId); any other entry
  (first of a ledger, after a skipped system or chunk entry) has its headers fetched.
* **Reader pool.** Per partition, a bounded LRU of readers keyed by the next offset each would
  return: a caller continuing where it stopped reuses one; idle ones are closed after
  ``reader_idle_timeout`` (checked on every call). Readers are created without holding a lock.
  A bounded offset-to-entry cache per partition saves index look-ups. Like Kafka's fetch buffer,
  a pooled reader may still hand out messages it received before retention trimmed them; a new
  reader never starts below the beginning offset.
* **End offset of a pull.** Exact when the pull reached the tail; otherwise the end offset read
  at most ``END_TTL`` seconds earlier by this log (never below the pull's ``next_offset``).
* **Commits.** The committed offset (the next to consume) is stored exactly in the subscription's
  properties (``pulsarstate.next-offset``, durable on return, may move backwards), written before
  the cursor is moved with ``resetcursor``: every entry wholly below it is acknowledged; the entry
  holding it is acknowledged from the committed message on only while the topic stays loaded
  (the broker keeps a batch-index reset in memory), so after an unload a plain consumer may get the
  lower messages of that one batch again. A message at or after the committed offset is never
  acknowledged. No consumer is created: nothing is prefetched and left unread.
"""

from __future__ import annotations

import base64
import logging
import math
import threading
import time
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pulsar

from airflow_provider_pulsarstate.engine.backends import pulsar_compat
from airflow_provider_pulsarstate.engine.backends.base import partition_topic_name
from airflow_provider_pulsarstate.engine.backends.pulsar import PulsarBackend, unique_subscription
from airflow_provider_pulsarstate.engine.errors import (
    ClosedError,
    MessageNotFoundError,
    OffsetError,
    OffsetOutOfRangeError,
    OperationTimeoutError,
)
from airflow_provider_pulsarstate.engine.offsets.base import (
    OffsetLog,
    PulledMessage,
    StoredMessage,
    parse_address,
)
from airflow_provider_pulsarstate.engine.offsets.checks import (
    check_log_options,
    check_topic,
    log_closed,
    not_an_address,
    out_of_range,
    partition_error,
    unknown_topic,
)
from airflow_provider_pulsarstate.engine.offsets.pulsar_http import PULSAR_ADDRESS, PULSAR_ADDRESS_FORM
from airflow_provider_pulsarstate.engine.offsets.pulsar_index import (
    COMMITTED_PROPERTY,
    MESSAGE_ID_HEADER,
    EntryRef,
    batch_size_of,
    cursor_positions,
    index_unavailable,
    last_index_property,
    parse_committed,
    parse_entry_headers,
    parse_entry_id,
    parse_position,
    partition_topic,
)
from airflow_provider_pulsarstate.engine.offsets.pulsar_publisher import (
    PulsarTopicPublisher,
    close_quietly,
    create_pulsar_topic,
    delete_pulsar_topic_if_last,
)
from airflow_provider_pulsarstate.engine.retry import Backoff

log = logging.getLogger(__name__)

PARTITIONS_TTL = 2.0
"""Seconds a partition count is trusted (partitions can be added while consumers run)."""
END_TTL = 1.0
"""Seconds an end offset observed by a pull is reused by the next pulls (exact at the tail)."""
_RECEIVER_QUEUE = 1000
_TIME_SCAN_MESSAGES = 500
_TIME_SCAN_BYTES = 1 << 20


class _Tail:
    """Marker: the offset is the end offset."""


_TAIL = _Tail()


@dataclass(eq=False)
class _Cursor:
    """A pooled reader of one partition, positioned at ``next_offset``."""

    partition: int
    topic: str
    reader: pulsar.Reader
    next_offset: int
    entry: EntryRef | None = None  # the entry of the last message read
    pending: PulledMessage | None = None  # read but not returned (max_bytes), offset >= next_offset
    idle_since: float = field(default_factory=time.monotonic)


class _PulsarMessage(PulledMessage):
    """A PulledMessage whose key, properties and publish time are read from the client's message
    only when asked (most consumers read the offset and value only: three fewer client calls per
    message). Equal to, and pickled as, a plain :class:`PulledMessage`."""

    __slots__ = ("_raw",)
    _raw: Any  # the client's message

    @property
    def key(self) -> str | None:
        return self._raw.partition_key() or None

    @property
    def properties(self) -> Mapping[str, str]:
        return self._raw.properties()

    @property
    def publish_time(self) -> float:
        return self._raw.publish_timestamp() / 1000.0

    def plain(self) -> PulledMessage:
        """The same message as a plain PulledMessage (detached from the client's message)."""
        return PulledMessage(*_fields_of(self))

    def __eq__(self, other: object) -> bool:
        return _fields_of(self) == _fields_of(other) if isinstance(other, PulledMessage) else NotImplemented

    __hash__ = None

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


class PulsarOffsetLog(OffsetLog):
    """One Pulsar topic addressed by the broker's entry index (see the module docstring).

    :param backend: an open :class:`PulsarBackend` (its client and admin API are used, not closed).
    :param topic: the full topic name.
    :param reader_pool_size: readers kept per partition.
    :param reader_idle_timeout: seconds an unused pooled reader is kept.
    :param position_cache_size: offset-to-entry answers kept per partition.
    """

    def __init__(
        self,
        backend: PulsarBackend,
        topic: str,
        *,
        reader_pool_size: int = 8,
        reader_idle_timeout: float = 300.0,
        position_cache_size: int = 1000,
        **unknown: Any,
    ) -> None:
        check_topic(topic)
        check_log_options(
            topic,
            {
                "reader_pool_size": reader_pool_size,
                "reader_idle_timeout": reader_idle_timeout,
                "position_cache_size": position_cache_size,
                **unknown,
            },
        )
        self.topic = topic
        self._backend = backend
        self._admin = backend.admin
        self._pool_size = reader_pool_size
        self._idle_timeout = reader_idle_timeout
        self._cache_size = position_cache_size
        self._lock = threading.Lock()
        self._pools: dict[int, OrderedDict[int, _Cursor]] = {}
        self._live: set[_Cursor] = set()
        self._positions: dict[int, OrderedDict[int, EntryRef]] = {}
        self._ends: dict[int, tuple[float, int]] = {}
        self._partitions: tuple[float, int] | None = None
        self._commit_locks: dict[tuple[str, int], threading.Lock] = {}
        self._closed = False
        self.readers_created = 0
        """How many readers this log created (pool reuse shows as a count that does not grow)."""

    def __repr__(self) -> str:
        return f"PulsarOffsetLog({self.topic!r})"

    # -- topic and partitions -----------------------------------------------------------------
    def _partition_count(self) -> int:
        self._check_open()
        now = time.monotonic()
        cached = self._partitions
        if cached is not None and now - cached[0] < PARTITIONS_TTL:
            return cached[1]
        count = self._admin.partition_count(self.topic)
        if count is None:
            raise unknown_topic(self._backend.topic_url(self.topic))
        self._partitions = (now, count)
        return count

    def _ptopic(self, partition: int) -> str:
        count = self.partitions()
        error = partition_error(self.topic, count, partition)
        if error is not None:
            raise error
        return partition_topic(self.topic, count, partition)

    # -- offsets --------------------------------------------------------------------------------
    def _beginning_offset(self, partition: int) -> int:
        pt = self._ptopic(partition)
        headers = self._admin.examine_message(pt, "earliest")
        if headers is None:
            return self._empty_end(pt)
        last, count = parse_entry_headers(headers, pt)
        return last - count + 1

    def _end_offset(self, partition: int) -> int:
        pt = self._ptopic(partition)
        headers = self._admin.examine_message(pt, "latest")
        end = self._empty_end(pt) if headers is None else parse_entry_headers(headers, pt)[0] + 1
        self._ends[partition] = (time.monotonic(), end)
        return end

    def _empty_end(self, pt: str) -> int:
        """No message retained: the offset after the last one ever written (0 for a new topic)."""
        return last_index_property(self._admin.internal_stats(pt)) + 1

    def _out_of_range(self, partition: int, offset: int) -> OffsetOutOfRangeError:
        beginning, end = self.beginning_offset(partition), self.end_offset(partition)
        return out_of_range(self.topic, partition, offset, beginning, end)

    def _entry_ref(self, pt: str, ledger: int, entry: int) -> EntryRef | None:
        headers = self._admin.entry_headers(pt, ledger, entry)
        if headers is None:
            return None
        last, count = parse_entry_headers(headers, pt)
        return EntryRef(ledger, entry, last - count + 1, count)

    def _first_entry(self, pt: str) -> EntryRef | None:
        headers = self._admin.examine_message(pt, "earliest")
        if headers is None:
            return None
        last, count = parse_entry_headers(headers, pt)
        where = parse_entry_id(headers.get(MESSAGE_ID_HEADER))
        if where is None:
            raise OffsetError(f"the broker named no position for the first entry of {pt}")
        return EntryRef(where[0], where[1], last - count + 1, count)

    def _locate(self, partition: int, pt: str, offset: int) -> EntryRef | _Tail:
        """The entry holding ``offset`` (or the first entry after it when nobody holds that index),
        or ``_TAIL`` when ``offset`` is the end offset.

        :raises OffsetOutOfRangeError: below the beginning or past the end.
        """
        with self._lock:
            cache = self._positions.get(partition)
            ref = cache.get(offset) if cache is not None else None
            if ref is not None:
                cache.move_to_end(offset)  # type: ignore[union-attr]
                return ref
        for _attempt in range(3):
            resp = self._admin.message_id_by_index(pt, offset)
            if resp.status_code == 412:
                raise index_unavailable(pt, f"getMessageIdByIndex answered 412: {resp.text[:200]}")
            if resp.status_code == 200:
                pos = parse_position(resp.json())
                # L:-1 (seen after a ledger rollover) names the start of ledger L.
                found = self._entry_ref(pt, pos[0], max(pos[1], 0)) if pos is not None else None
                if found is not None and found.first <= offset <= found.last:
                    self._remember(partition, offset, found)
                    return found
                # -1:-1 (the first entry, or a trimmed offset), or an index no delivered message holds.
                beginning = self.beginning_offset(partition)
                if offset < beginning:
                    raise self._out_of_range(partition, offset)
                if found is None:
                    found = self._first_entry(pt)
                    if found is None:
                        continue  # trimmed in between: ask again
                if found.last < offset:
                    # Not the entry holding it: starting earlier is safe (lower offsets are dropped).
                    log.debug("offset %d of %s located in %s; reading forward from there", offset, pt, found)
                return found
            # 404: past the tail or no message; 500: every ledger trimmed.
            beginning, end = self.beginning_offset(partition), self.end_offset(partition)
            if offset < beginning or offset > end:
                raise self._out_of_range(partition, offset)
            if offset == end:
                return _TAIL
            # a message landed between the look-up and the range check: ask again
        raise OffsetError(f"could not locate offset {offset} of {pt}: the topic changed under three look-ups")

    def _remember(self, partition: int, offset: int, ref: EntryRef) -> None:
        with self._lock:
            cache = self._positions.setdefault(partition, OrderedDict())
            cache[offset] = ref
            cache.move_to_end(offset)
            while len(cache) > self._cache_size:
                cache.popitem(last=False)

    # -- reading --------------------------------------------------------------------------------
    def _read(
        self, partition: int, offset: int, *, max_messages: int, max_bytes: int, timeout: float
    ) -> tuple[list[PulledMessage], int]:
        pt = self._ptopic(partition)
        cursor = self._take(partition, offset)
        if cursor is None:
            cursor = self._open_cursor(partition, pt, offset)
        ok = False
        try:
            messages, at_tail = self._fill(cursor, max_messages=max_messages, max_bytes=max_bytes, timeout=timeout)
            ok = True
        finally:
            if ok:
                self._give_back(cursor)
            else:
                self._discard(cursor)
        if at_tail:
            end = cursor.next_offset
            self._ends[partition] = (time.monotonic(), end)
        else:
            end = self._recent_end(partition, above=cursor.next_offset)
        return messages, end

    def _recent_end(self, partition: int, *, above: int) -> int:
        seen = self._ends.get(partition)
        if seen is not None and time.monotonic() - seen[0] < END_TTL and seen[1] > above:
            return seen[1]
        return max(self.end_offset(partition), above)

    def _open_cursor(self, partition: int, pt: str, offset: int) -> _Cursor:
        where = self._locate(partition, pt, offset)
        start: EntryRef | None
        if isinstance(where, _Tail):
            # At the end: wait on the last entry (inclusive, its offsets dropped), so that a message
            # appended between the range check and the subscription is not missed.
            start = self._locate(partition, pt, offset - 1) if offset > self.beginning_offset(partition) else None
            if isinstance(start, _Tail):
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
        cursor = _Cursor(partition, pt, reader, offset, entry=start)
        with self._lock:
            closed = self._closed
            if not closed:
                self._live.add(cursor)
                self.readers_created += 1
        if closed:
            close_quietly(reader)
            raise log_closed(self.topic)
        return cursor

    def _fill(
        self, cursor: _Cursor, *, max_messages: int, max_bytes: int, timeout: float
    ) -> tuple[list[PulledMessage], bool]:
        """Read into a list until ``max_messages``, ``max_bytes`` or the tail; True when the tail stopped it.

        The per-message path is kept flat (it is most of a pull's cost): the client's own reader
        object, offsets computed inline while the entry does not change.
        """
        deadline = time.monotonic() + timeout
        messages: list[PulledMessage] = []
        append = messages.append
        raw_reader = pulsar_compat.raw_reader(cursor.reader, cursor.reader)  # skips pulsar.Message wrapping
        partition = cursor.partition
        next_offset = cursor.next_offset
        ref = cursor.entry
        ledger_now, entry_now, first = (ref.ledger, ref.entry, ref.first) if ref is not None else (-2, -2, 0)
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
                            ledger_now, entry_now, first = ledger, entry, ref.first
                        if batch_now >= 0:
                            offset = first + batch_now
                            remaining = ref.count - 1 - batch_now  # type: ignore[union-attr]
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
            if count and type(messages[-1]) is _PulsarMessage:
                self._check_position(cursor, messages[-1])
        finally:
            cursor.next_offset = next_offset
        return messages, at_tail

    def _check_position(self, cursor: _Cursor, last: _PulsarMessage) -> None:
        """Inside a batch offsets are counted, not read: once per pull, check the count against the
        last message's own id (a mismatch would mean the client skipped messages of a batch)."""
        mid = last._raw.message_id()
        actual = (mid.ledger_id(), mid.entry_id(), mid.batch_index())
        if actual != last.position:
            raise OffsetError(
                f"offsets of {cursor.topic} drifted: the message counted at {last.position} is at {actual}; "
                "its reader is discarded"
            )

    def _next_entry(self, cursor: _Cursor, mid: Any, ledger: int, entry: int, batch: int) -> EntryRef:
        """The offsets of a new entry: from the previous one when it directly follows it in the same
        ledger (nothing can hide between them), else from the entry's headers."""
        ref = cursor.entry
        if ref is not None and ref.ledger == ledger and ref.entry + 1 == entry:
            count = batch_size_of(mid.serialize()) if batch >= 0 else 1
            if count > 0:
                return EntryRef(ledger, entry, ref.last + 1, count)
        found = self._entry_ref(cursor.topic, ledger, entry)
        if found is None:
            raise OffsetError(f"entry {ledger}:{entry} of {cursor.topic} was delivered but has no headers")
        return found

    def _skipped_trimmed(self, cursor: _Cursor, pm: PulledMessage, expected: int, have_some: bool) -> bool:
        """A jump in offsets is fine when nobody held the skipped indexes; not when they were trimmed
        under the reader (then the offsets are gone: stop here, or raise when nothing was returned)."""
        beginning = self.beginning_offset(cursor.partition)
        if beginning <= expected:
            return False
        if have_some:
            cursor.pending = pm
            return True
        raise self._out_of_range(cursor.partition, expected)

    def _wait_next(self, cursor: _Cursor, deadline: float, *, first: bool) -> Any:
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

    def _read_cursor(self, cursor: _Cursor, timeout_ms: int) -> Any:
        raw_reader = pulsar_compat.raw_reader(cursor.reader, cursor.reader)
        try:
            return raw_reader.read_next(timeout_ms)
        except pulsar.Timeout:
            return None
        except pulsar.AlreadyClosed as exc:
            raise ClosedError(f"offset log of {self.topic} was closed during a read") from exc
        except pulsar.PulsarException as exc:
            raise self._backend._unreachable("reading", cursor.topic, exc) from exc

    # -- the reader pool --------------------------------------------------------------------
    def _take(self, partition: int, offset: int) -> _Cursor | None:
        with self._lock:
            self._check_open_locked()
            expired = self._sweep_locked(time.monotonic())
            pool = self._pools.get(partition)
            cursor = pool.pop(offset, None) if pool else None
        self._close_cursors(expired)
        return cursor

    def _give_back(self, cursor: _Cursor) -> None:
        cursor.idle_since = time.monotonic()
        ref = cursor.entry
        if ref is not None and ref.first <= cursor.next_offset <= ref.last:
            self._remember(cursor.partition, cursor.next_offset, ref)
        evicted: list[_Cursor] = []
        with self._lock:
            if self._closed or cursor not in self._live:
                evicted.append(cursor)
            else:
                pool = self._pools.setdefault(cursor.partition, OrderedDict())
                older = pool.pop(cursor.next_offset, None)
                if older is not None:
                    evicted.append(older)
                pool[cursor.next_offset] = cursor
                while len(pool) > self._pool_size:
                    evicted.append(pool.popitem(last=False)[1])
        self._close_cursors(evicted)

    def _discard(self, cursor: _Cursor) -> None:
        self._close_cursors([cursor])

    def _sweep_locked(self, now: float) -> list[_Cursor]:
        expired = []
        for pool in self._pools.values():
            for key in [k for k, c in pool.items() if now - c.idle_since >= self._idle_timeout]:
                expired.append(pool.pop(key))
        return expired

    def _close_cursors(self, cursors: list[_Cursor]) -> None:
        """Close evicted, expired or failed readers without making the caller's pull wait for the broker."""
        if not cursors:
            return
        with self._lock:
            for cursor in cursors:
                self._live.discard(cursor)
        for cursor in cursors:
            raw = pulsar_compat.raw_reader(cursor.reader)
            if raw is not None and hasattr(raw, "close_async"):
                try:
                    raw.close_async(_ignore)
                    continue
                except pulsar.PulsarException:
                    pass
            close_quietly(cursor.reader)

    def pooled_readers(self) -> dict[int, list[int]]:
        """The pooled readers' next offsets per partition (oldest first), for tests and debugging."""
        with self._lock:
            return {p: list(pool) for p, pool in self._pools.items() if pool}

    def open_readers(self) -> int:
        """Readers this log holds open (pooled or in use)."""
        with self._lock:
            return len(self._live)

    # -- time search ----------------------------------------------------------------------------
    def _offset_for_time(self, partition: int, timestamp: float) -> int | None:
        """The first offset whose ``publish_time`` is >= ``timestamp``, or None past the end.

        The broker's ``messageid/{ms}`` searches by its own entry timestamp, which is later than the
        client's ``publish_time`` (stamped when the batch was created): its answer is where the search
        starts, never the answer itself. From there messages are read forward until the first one
        published at or after ``timestamp`` (within the entry and across entries), as the embedded
        back end answers. Exact as long as producers' clocks are not ahead of the broker's (a
        message stamped later than the broker received it could sit before the broker's answer).
        """
        pt = self._ptopic(partition)
        start = self._time_search_start(partition, pt, timestamp)
        return None if start is None else self._first_published_from(partition, start, timestamp)

    def _time_search_start(self, partition: int, pt: str, timestamp: float) -> int | None:
        """The first offset of the first entry the broker stamped at or after ``timestamp`` (no
        message before it was published that late), or None when none was."""
        pos = parse_position(self._admin.message_id_by_time(pt, math.ceil(timestamp * 1000)))
        if pos is None:  # the broker's "earliest": every retained entry was stamped that late
            beginning, end = self.beginning_offset(partition), self.end_offset(partition)
            return beginning if beginning < end else None
        ref = self._entry_ref(pt, pos[0], max(pos[1], 0))
        return None if ref is None else ref.first  # a position past the last entry: none is that recent

    def _first_published_from(self, partition: int, offset: int, timestamp: float) -> int | None:
        """Read from ``offset`` to the tail; the offset of the first message published at or after
        ``timestamp``, None when the tail comes first. Restarts at the beginning offset when
        retention trims the messages under the scan."""
        while True:
            try:
                messages, _end = self.read(
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

    # -- commits --------------------------------------------------------------------------------
    def _commit_at(self, subscription: str, partition: int, next_offset: int) -> None:
        pt = self._ptopic(partition)
        beginning, end = self.beginning_offset(partition), self.end_offset(partition)
        if not beginning <= next_offset <= end:
            raise out_of_range(self.topic, partition, next_offset, beginning, end, commit=True)
        target = self._cursor_target(partition, pt, next_offset, beginning, end)
        with self._commit_lock(subscription, partition):
            deadline = time.monotonic() + self._backend.config.operation_timeout
            backoff = Backoff(initial=0.02, maximum=0.5)
            # The exact offset first, then the cursor: a crash in between leaves the cursor behind the
            # committed offset (messages kept and redelivered), never ahead of it. Another process
            # updating the same cursor makes the broker answer "busy": retry until the time-out.
            while not self._try_commit(pt, subscription, next_offset, target):
                if time.monotonic() >= deadline:
                    raise OperationTimeoutError(
                        f"committing {next_offset} on {self.topic} partition {partition} subscription {subscription}: "
                        f"the subscription stayed busy for {self._backend.config.operation_timeout:.0f}s"
                    )
                backoff.sleep(deadline)
        log.debug(
            "committed %s partition %d subscription %s at %d (%s)",
            self.topic,
            partition,
            subscription,
            next_offset,
            target,
        )

    def _try_commit(self, pt: str, subscription: str, next_offset: int, target: dict[str, Any]) -> bool:
        properties = self._admin.subscription_properties(pt, subscription)
        if properties is None:
            # The committed offset goes in with the creation: the broker creates the cursor at the
            # latest entry before moving it, and a probe must not see that as committed.
            self._admin.create_subscription(
                pt,
                subscription,
                ledger=target["ledger"],
                entry=target["entry"],
                properties={COMMITTED_PROPERTY: str(next_offset)},
            )
            properties = self._admin.subscription_properties(pt, subscription)
            if properties is None:
                return False  # another process is creating it: try again
        properties[COMMITTED_PROPERTY] = str(next_offset)
        return self._admin.set_subscription_properties(pt, subscription, properties) and self._admin.reset_cursor(
            pt, subscription, **target
        )

    def _commit_lock(self, subscription: str, partition: int) -> threading.Lock:
        with self._lock:
            return self._commit_locks.setdefault((subscription, partition), threading.Lock())

    def _cursor_target(self, partition: int, pt: str, next_offset: int, beginning: int, end: int) -> dict[str, Any]:
        """Where ``resetcursor`` puts the cursor so that exactly the offsets below ``next_offset`` are acknowledged."""
        if beginning == end:
            return {"ledger": -1, "entry": -1}  # nothing retained: nothing to acknowledge
        if next_offset == beginning:
            ref = self._locate(partition, pt, next_offset)
            assert isinstance(ref, EntryRef)
            return {"ledger": ref.ledger, "entry": ref.entry, "batch_index": max(0, next_offset - ref.first)}
        ref = self._locate(partition, pt, next_offset - 1)
        assert isinstance(ref, EntryRef)
        if next_offset - 1 >= ref.last:
            return {"ledger": ref.ledger, "entry": ref.entry, "excluded": True}
        return {"ledger": ref.ledger, "entry": ref.entry, "batch_index": next_offset - ref.first}

    def _committed(self, subscription: str, partition: int) -> int | None:
        pt = self._ptopic(partition)
        properties = self._admin.subscription_properties(pt, subscription)
        if properties is None:
            return None
        value = parse_committed(properties)
        if value is not None:
            return value
        return self._cursor_offset(partition, pt, subscription)

    def _cursor_offset(self, partition: int, pt: str, subscription: str) -> int:
        """The offset after a subscription's mark-delete position (a subscription this class did not
        commit on): conservative, individually acknowledged messages past it are not counted."""
        mark, read = cursor_positions(self._admin.internal_stats(pt), subscription)
        if mark is not None and (ref := self._entry_ref(pt, *mark)) is not None:
            return ref.last + 1
        if read is not None and (ref := self._entry_ref(pt, *read)) is not None:
            return ref.first
        return self.beginning_offset(partition)

    # -- one message by address ------------------------------------------------------------
    def _read_at(self, address: str, *, timeout: float) -> StoredMessage:
        """A short-lived reader placed inclusively at the message id (no index look-up, nothing
        before it is read); an id nothing is at answers at once (the reader's tail check), not
        after ``timeout``."""
        wanted = _message_id_of(address)
        partition = wanted.partition()
        pt = partition_topic_name(self.topic, partition) if partition >= 0 else self.topic
        where = (int(wanted.ledger_id()), int(wanted.entry_id()), int(wanted.batch_index()))
        self._check_open()
        try:
            reader = self._backend.client.create_reader(
                pt, wanted, start_message_id_inclusive=True, receiver_queue_size=1, **unique_subscription()
            )
        except pulsar.PulsarException as exc:
            raise self._backend._unreachable("creating a reader of", pt, exc) from exc
        try:
            if not reader.has_message_available():
                raise self._not_found(address, pt, "nothing there (never written, topic deleted, or trimmed)")
            msg = reader.read_next(max(1, int(timeout * 1000)))
        except pulsar.Timeout as exc:
            raise self._not_found(address, pt, f"nothing arrived within {timeout:.1f}s") from exc
        except pulsar.PulsarException as exc:
            raise self._backend._unreachable("reading", pt, exc) from exc
        finally:
            close_quietly(reader)
        got = msg.message_id()
        if (got.ledger_id(), got.entry_id()) != where[:2] or (where[2] >= 0 and got.batch_index() != where[2]):
            raise self._not_found(address, pt, f"the message there is gone (read {got} instead: trimmed?)")
        return StoredMessage(address, msg.data(), dict(msg.properties()), msg.publish_timestamp() / 1000.0)

    def _not_found(self, address: str, pt: str, why: str) -> MessageNotFoundError:
        return MessageNotFoundError(f"no message at {address} of {pt}: {why}", topic=self.topic, address=address)

    # -- lifecycle ----------------------------------------------------------------------------
    def _check_open(self) -> None:
        with self._lock:
            self._check_open_locked()

    def _check_open_locked(self) -> None:
        if self._closed:
            raise log_closed(self.topic)

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            cursors = list(self._live)
            self._live.clear()
            self._pools.clear()
            self._positions.clear()
        for cursor in cursors:
            close_quietly(cursor.reader)


def _message_id_of(address: str) -> Any:
    parsed = parse_address(address, PULSAR_ADDRESS)
    try:
        if parsed is None:
            raise ValueError("not p:<partition>:<base64>")
        return pulsar.MessageId.deserialize(base64.b64decode(parsed[1], validate=True))
    except Exception as exc:
        raise not_an_address(address, "Pulsar", PULSAR_ADDRESS_FORM) from exc


def _ignore(*_args: Any) -> None:
    pass


__all__ = ["PulsarOffsetLog", "PulsarTopicPublisher", "create_pulsar_topic", "delete_pulsar_topic_if_last"]
