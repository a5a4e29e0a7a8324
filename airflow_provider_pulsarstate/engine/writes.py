"""A write on its way through the state manager, and the book of writes whose outcome was in doubt.

A write's outcome is in doubt once an append carrying it may or may not have landed. It stays in
doubt until the log settles it: the write is found there (LANDED), or a record of a newer epoch is
read without it before (NOT_LANDED: readers skip any frame of an older epoch after a newer one, so
it can never land). A caller told "unknown" asks :meth:`OutcomeBook.known` through
:meth:`~airflow_provider_pulsarstate.engine.manager.SharedStateManager.outcome`.
"""

from __future__ import annotations

import contextlib
import enum
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass, field
from typing import Any

from airflow_provider_pulsarstate.engine.errors import UnknownOutcomeError

MAX_TRACKED_OUTCOMES = 10_000
"""How many settled outcomes of writes whose callers were told "unknown" are remembered."""


class WriteOutcome(str, enum.Enum):
    """What became of a write whose caller was told its outcome was unknown."""

    LANDED = "landed"
    """It is in the log and applied (or it completed with nothing to append): do not send it again."""
    NOT_LANDED = "not_landed"
    """It is not in the log and never will be (a newer epoch began without it): safe to send again."""
    PENDING = "pending"
    """Not found so far, and it may still land: do not send it again yet."""
    UNKNOWN = "unknown"
    """No such write is tracked: another instance's id, a write whose outcome was never in doubt,
    or one forgotten (only the newest :data:`MAX_TRACKED_OUTCOMES` settled outcomes are kept)."""


@dataclass(eq=False)
class PendingWrite:
    """One write from submission to completion (its ``future`` carries the result)."""

    seq: int
    generator: Callable[[Any], Iterable[Any]] | None
    reader: Callable[[Any], Any] | None
    retry: bool
    barrier: bool = False
    probe: bool = False
    """Takes the writer and appends nothing (its EPOCH record settles earlier unknown outcomes)."""
    future: Future[Any] = field(default_factory=Future)
    result: Any = None
    prepared: tuple[int, list[Any], list[bytes]] | None = None
    """(applied offset, ops, payloads) generated before the writer was taken; reused if still current."""
    epoch: int | None = None
    """Epoch of the writer that last sent it."""
    unknown: bool = False
    """That send's outcome is not known: it may land until a newer epoch begins without it."""
    abandoned: bool = False
    """Its caller's timeout ran out while it was being sent; its outcome goes to the book."""
    fence: tuple[str, str, int] | None = None
    """(lease log ref, lease name, fencing token) it was made under, checked against the log's
    fences; token 0: a reset of the fences of that name and lease log."""

    @property
    def needs_writer(self) -> bool:
        return self.barrier or self.probe or self.unknown

    def claim(self) -> bool:
        """Mark it as being sent, so its caller can no longer cancel it; False if cancelled or done."""
        try:
            return self.future.running() or (not self.future.done() and self.future.set_running_or_notify_cancel())
        except RuntimeError:  # completed meanwhile
            return False

    def fail(self, exc: BaseException) -> None:
        with contextlib.suppress(InvalidStateError):  # cancelled meanwhile by its caller's timeout
            if not self.future.done():
                self.future.set_exception(exc)

    def succeed(self) -> None:
        with contextlib.suppress(InvalidStateError):
            if not self.future.done():
                self.future.set_result(self.result)


class OutcomeBook:
    """Writes reported "unknown" to their callers, until the log settles them, and their outcomes.

    Thread-safe; its lock is taken last (never around another lock), so it may be used while
    holding the manager's state lock.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._unresolved: dict[int, PendingWrite] = {}  # failed to their callers as unknown
        self._abandoned: set[int] = set()  # callers timed out; the committer still has them
        self._outcomes: OrderedDict[int, WriteOutcome] = OrderedDict()

    def __bool__(self) -> bool:
        """Whether some write awaits settling by the log."""
        return bool(self._unresolved)

    def known(self, seq: int) -> WriteOutcome:
        with self._lock:
            if seq in self._unresolved or seq in self._abandoned:
                return WriteOutcome.PENDING
            return self._outcomes.get(seq, WriteOutcome.UNKNOWN)

    def unresolved(self, w: PendingWrite) -> None:
        """``w`` fails to its caller as unknown; the log settles it later."""
        with self._lock:
            self._unresolved[w.seq] = w

    def found(self, seq: int) -> bool:
        """The log holds write ``seq``: LANDED if it was awaiting settling (returns whether it was)."""
        with self._lock:
            if self._unresolved.pop(seq, None) is None:
                return False
            self._record(seq, WriteOutcome.LANDED)
            return True

    def epoch_began(self, epoch: int) -> list[int]:
        """A record of ``epoch`` was read: writes sent at older epochs never land (NOT_LANDED)."""
        with self._lock:
            gone = [seq for seq, w in self._unresolved.items() if w.epoch is not None and w.epoch < epoch]
            for seq in gone:
                del self._unresolved[seq]
                self._record(seq, WriteOutcome.NOT_LANDED)
        return gone

    def abandon(self, w: PendingWrite) -> None:
        """``w``'s caller stops waiting while it is being sent: record how it ends."""
        w.abandoned = True
        with self._lock:
            self._abandoned.add(w.seq)

        def settle(future: Future[Any]) -> None:
            outcome: WriteOutcome | None
            if future.cancelled():
                outcome = WriteOutcome.NOT_LANDED
            else:
                exc = future.exception()
                if exc is None:
                    outcome = WriteOutcome.LANDED
                elif isinstance(exc, UnknownOutcomeError):
                    outcome = None  # in _unresolved: the log settles it
                else:
                    outcome = WriteOutcome.NOT_LANDED
            with self._lock:
                if outcome is not None:
                    self._record(w.seq, outcome)
                self._abandoned.discard(w.seq)

        w.future.add_done_callback(settle)

    def _record(self, seq: int, outcome: WriteOutcome) -> None:
        self._outcomes[seq] = outcome
        self._outcomes.move_to_end(seq)
        while len(self._outcomes) > MAX_TRACKED_OUTCOMES:
            self._outcomes.popitem(last=False)
