"""Acknowledgement bookkeeping of one partition: what is in flight, failed, and acknowledged above
the cumulative acknowledgement (kept as ranges), and when a cumulative acknowledgement is safe.

A partition's **floor** is its lowest message handed out and not yet acknowledged (in flight, or
failed and awaiting redelivery). A cumulative acknowledgement never reaches past the floor, so it
never covers a message that failed or is still being processed.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from typing import Any

from airflow_provider_pulsarstate.engine.streams.message import Position


class AckedRange:
    """Positions ``lo``..``hi`` of one partition, all acknowledged individually (no unsettled
    message between them); ``last`` is the received message at ``hi`` (a cumulative acknowledgement
    needs the client's own message object to cover a batch up to its index)."""

    __slots__ = ("hi", "last", "lo")

    def __init__(self, lo: Position, hi: Position, last: Any) -> None:
        self.lo, self.hi, self.last = lo, hi, last


class Lane:
    """Settlement bookkeeping of one partition (see the module docstring).

    Acknowledged positions above the cumulative one are kept as ranges, merged whenever no
    unsettled message lies between them: there are never more ranges than unsettled messages
    + 1, however many messages are acknowledged behind a slow or failing one.
    """

    __slots__ = ("acked", "cumulative", "failed", "inflight")

    def __init__(self) -> None:
        self.inflight: set[Position] = set()  # handed out, not settled
        self.failed: set[Position] = set()  # negatively acknowledged, awaiting redelivery
        self.acked: list[AckedRange] = []  # sorted, disjoint, all above ``cumulative``
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
            self.acked.insert(bisect.bisect_left(lows, pos), AckedRange(pos, pos, raw))
        merged: list[AckedRange] = []
        for rng in self.acked:
            if merged and nothing_between(pending, merged[-1].hi, rng.lo):
                if rng.hi > merged[-1].hi:
                    merged[-1].hi, merged[-1].last = rng.hi, rng.last
            else:
                merged.append(rng)
        self.acked = merged

    def take_cumulative(self) -> AckedRange | None:
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


def nothing_between(pending: list[Position], lo: Position, hi: Position) -> bool:
    """Whether no position of sorted ``pending`` lies strictly between ``lo`` and ``hi``."""
    return bisect.bisect_right(pending, lo) >= bisect.bisect_left(pending, hi)


__all__ = ["AckedRange", "Lane", "nothing_between"]
