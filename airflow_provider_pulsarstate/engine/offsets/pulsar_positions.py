"""Where offsets are on a Pulsar topic: partition count, beginning and end offsets, and the entry
holding an offset, over the admin API, with the short-lived caches that save look-ups.

See :mod:`.pulsar` for how offsets are found and :mod:`.pulsar_index` for the broker's answers.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable

from airflow_provider_pulsarstate.engine.backends.pulsar import PulsarBackend
from airflow_provider_pulsarstate.engine.errors import OffsetError, OffsetOutOfRangeError
from airflow_provider_pulsarstate.engine.offsets.checks import out_of_range, stored_topic, unknown_topic
from airflow_provider_pulsarstate.engine.offsets.pulsar_index import (
    MESSAGE_ID_HEADER,
    EntryRef,
    index_unavailable,
    last_index_property,
    parse_entry_headers,
    parse_entry_id,
    parse_position,
)

log = logging.getLogger(__name__)

PARTITIONS_TTL = 2.0
"""Seconds a partition count is trusted (partitions can be added while consumers run)."""
END_TTL = 1.0
"""Seconds an end offset observed by a pull is reused by the next pulls (exact at the tail)."""


class Tail:
    """Marker: the offset is the end offset."""


TAIL = Tail()


class PositionIndex:
    """The offsets of one topic's partitions and the entries holding them. Thread-safe.

    :param check_open: raises ClosedError once the owning log is closed (called before any look-up).
    :param cache_size: offset-to-entry answers kept per partition (least recently used dropped).
    """

    def __init__(self, backend: PulsarBackend, topic: str, *, check_open: Callable[[], None], cache_size: int) -> None:
        self.topic = topic
        self._backend = backend
        self.admin = backend.admin
        self._check_open = check_open
        self._cache_size = cache_size
        self._lock = threading.Lock()
        self._positions: dict[int, OrderedDict[int, EntryRef]] = {}
        self._ends: dict[int, tuple[float, int]] = {}
        self._partitions: tuple[float, int] | None = None

    # -- topic and partitions -----------------------------------------------------------------
    def partition_count(self) -> int:
        self._check_open()
        now = time.monotonic()
        cached = self._partitions
        if cached is not None and now - cached[0] < PARTITIONS_TTL:
            return cached[1]
        count = self.admin.partition_count(self.topic)
        if count is None:
            raise unknown_topic(self._backend.topic_url(self.topic))
        self._partitions = (now, count)
        return count

    def ptopic(self, partition: int) -> str:
        """The topic holding ``partition`` (UnknownPartitionError when the topic has none)."""
        return stored_topic(self.topic, self.partition_count(), partition)

    # -- offsets --------------------------------------------------------------------------------
    def beginning(self, partition: int) -> int:
        pt = self.ptopic(partition)
        headers = self.admin.examine_message(pt, "earliest")
        if headers is None:
            return self._empty_end(pt)
        last, count = parse_entry_headers(headers, pt)
        return last - count + 1

    def end(self, partition: int) -> int:
        pt = self.ptopic(partition)
        headers = self.admin.examine_message(pt, "latest")
        end = self._empty_end(pt) if headers is None else parse_entry_headers(headers, pt)[0] + 1
        self.note_end(partition, end)
        return end

    def note_end(self, partition: int, end: int) -> None:
        """Remember an end offset observed now (reused for ``END_TTL`` by :meth:`recent_end`)."""
        self._ends[partition] = (time.monotonic(), end)

    def recent_end(self, partition: int, *, above: int) -> int:
        """An end offset observed at most ``END_TTL`` seconds ago, never below ``above``."""
        seen = self._ends.get(partition)
        if seen is not None and time.monotonic() - seen[0] < END_TTL and seen[1] > above:
            return seen[1]
        return max(self.end(partition), above)

    def _empty_end(self, pt: str) -> int:
        """No message retained: the offset after the last one ever written (0 for a new topic)."""
        return last_index_property(self.admin.internal_stats(pt)) + 1

    def out_of_range(self, partition: int, offset: int) -> OffsetOutOfRangeError:
        return out_of_range(self.topic, partition, offset, self.beginning(partition), self.end(partition))

    # -- entries --------------------------------------------------------------------------------
    def entry_ref(self, pt: str, ledger: int, entry: int) -> EntryRef | None:
        """The offsets held by one entry, or None when the broker has no such entry."""
        headers = self.admin.entry_headers(pt, ledger, entry)
        if headers is None:
            return None
        last, count = parse_entry_headers(headers, pt)
        return EntryRef(ledger, entry, last - count + 1, count)

    def _first_entry(self, pt: str) -> EntryRef | None:
        headers = self.admin.examine_message(pt, "earliest")
        if headers is None:
            return None
        last, count = parse_entry_headers(headers, pt)
        where = parse_entry_id(headers.get(MESSAGE_ID_HEADER))
        if where is None:
            raise OffsetError(f"the broker named no position for the first entry of {pt}")
        return EntryRef(where[0], where[1], last - count + 1, count)

    def locate(self, partition: int, pt: str, offset: int) -> EntryRef | Tail:
        """The entry holding ``offset`` (or the first entry after it when nobody holds that index),
        or ``TAIL`` when ``offset`` is the end offset.

        :raises OffsetOutOfRangeError: below the beginning or past the end.
        """
        cached = self._cached(partition, offset)
        if cached is not None:
            return cached
        for _attempt in range(3):
            resp = self.admin.message_id_by_index(pt, offset)
            if resp.status_code == 412:
                raise index_unavailable(pt, f"getMessageIdByIndex answered 412: {resp.text[:200]}")
            if resp.status_code == 200:
                found = self._entry_at(partition, pt, offset, parse_position(resp.json()))
                if found is not None:
                    return found
                continue  # trimmed in between: ask again
            # 404: past the tail or no message; 500: every ledger trimmed.
            beginning, end = self.beginning(partition), self.end(partition)
            if offset < beginning or offset > end:
                raise self.out_of_range(partition, offset)
            if offset == end:
                return TAIL
            # a message landed between the look-up and the range check: ask again
        raise OffsetError(f"could not locate offset {offset} of {pt}: the topic changed under three look-ups")

    def _entry_at(self, partition: int, pt: str, offset: int, pos: tuple[int, int] | None) -> EntryRef | None:
        """The entry to start reading ``offset`` from, given the broker's answer ``pos`` to
        ``getMessageIdByIndex``; None when the first entry was trimmed while looking."""
        # L:-1 (seen after a ledger rollover) names the start of ledger L.
        found = self.entry_ref(pt, pos[0], max(pos[1], 0)) if pos is not None else None
        if found is not None and found.first <= offset <= found.last:
            self._remember(partition, offset, found)
            return found
        # -1:-1 (the first entry, or a trimmed offset), or an index no delivered message holds.
        if offset < self.beginning(partition):
            raise self.out_of_range(partition, offset)
        if found is None:
            found = self._first_entry(pt)
            if found is None:
                return None
        if found.last < offset:
            # Not the entry holding it: starting earlier is safe (lower offsets are dropped).
            log.debug("offset %d of %s located in %s; reading forward from there", offset, pt, found)
        return found

    # -- the offset-to-entry cache ------------------------------------------------------------
    def _cached(self, partition: int, offset: int) -> EntryRef | None:
        with self._lock:
            cache = self._positions.get(partition)
            if cache is None:
                return None
            ref = cache.get(offset)
            if ref is not None:
                cache.move_to_end(offset)
            return ref

    def _remember(self, partition: int, offset: int, ref: EntryRef) -> None:
        with self._lock:
            cache = self._positions.setdefault(partition, OrderedDict())
            cache[offset] = ref
            cache.move_to_end(offset)
            while len(cache) > self._cache_size:
                cache.popitem(last=False)

    def remember_next(self, partition: int, next_offset: int, ref: EntryRef | None) -> None:
        """Cache where a reader stopped when the entry it last read also holds its next offset."""
        if ref is not None and ref.first <= next_offset <= ref.last:
            self._remember(partition, next_offset, ref)

    def clear(self) -> None:
        with self._lock:
            self._positions.clear()
