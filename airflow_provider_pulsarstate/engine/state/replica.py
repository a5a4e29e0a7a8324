"""The local replica: the state replayed from the log, its fences, its reader, and how far it got.

The replica is in one :class:`ReplicaState` at a time, changed only by :meth:`Replica.transition`:

* EMPTY: no state yet; the first use replays the log (from the newest usable checkpoint).
* LIVE: the state is the log's up to :attr:`Replica.applied_offset`.
* PAUSED: a bootstrap cut short by a caller's timeout; the state so far is a correct prefix of
  the log, and the next use goes on reading from there.
* BROKEN: the state may not be the log's (ops applied before their append was acknowledged, a
  corrupt entry, a failed bootstrap): the next use rebuilds it from the log.
* CLOSED: final; every use fails with ClosedError.

Everything else here is read and changed with :attr:`Replica.lock` held.
"""

from __future__ import annotations

import enum
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, wait
from typing import Any, Generic, TypeVar

from airflow_provider_pulsarstate.engine.backends.base import EARLIEST, Backend
from airflow_provider_pulsarstate.engine.checkpoint import CheckpointStore
from airflow_provider_pulsarstate.engine.envelope import FenceTag, RecordKind
from airflow_provider_pulsarstate.engine.errors import (
    ClosedError,
    CorruptEntryError,
    OperationTimeoutError,
    PulsarStateError,
)
from airflow_provider_pulsarstate.engine.genesis import parse_genesis, read_beginning
from airflow_provider_pulsarstate.engine.progress_report import Progress
from airflow_provider_pulsarstate.engine.state import bootstrap
from airflow_provider_pulsarstate.engine.state.fence_book import FenceBook
from airflow_provider_pulsarstate.engine.state.listeners import Listeners
from airflow_provider_pulsarstate.engine.state.ops import OpCodec
from airflow_provider_pulsarstate.engine.state.stats import ManagerStats
from airflow_provider_pulsarstate.engine.state.support import ReplayPaused, deadline_of, describe, time_left
from airflow_provider_pulsarstate.engine.wal import CorruptPolicy, LogReader, LogRecord
from airflow_provider_pulsarstate.engine.writes import OutcomeBook, PendingWrite

log = logging.getLogger(__name__)

S = TypeVar("S")
O = TypeVar("O")
R = TypeVar("R")


class ReplicaState(enum.Enum):
    """Where the replica stands (see the module docstring)."""

    EMPTY = "empty"
    LIVE = "live"
    PAUSED = "paused"
    BROKEN = "broken"
    CLOSED = "closed"


_NEXT: dict[ReplicaState, frozenset[ReplicaState]] = {
    ReplicaState.EMPTY: frozenset({ReplicaState.LIVE, ReplicaState.CLOSED}),
    ReplicaState.LIVE: frozenset({ReplicaState.PAUSED, ReplicaState.BROKEN, ReplicaState.CLOSED}),
    ReplicaState.PAUSED: frozenset({ReplicaState.LIVE, ReplicaState.BROKEN, ReplicaState.CLOSED}),
    ReplicaState.BROKEN: frozenset({ReplicaState.LIVE, ReplicaState.CLOSED}),
    ReplicaState.CLOSED: frozenset(),
}


class Replica(Generic[S, O]):
    """The state of one topic as this instance replayed it, with the writes of its own in doubt.

    :param on_rebuild: called before the state is rebuilt (the held writer must go: its epoch's
        reads are no longer this state's).
    """

    def __init__(
        self,
        backend: Backend,
        topic: str,
        *,
        lock: threading.RLock,
        writer_id: bytes,
        initializer: Callable[[], S],
        applier: Callable[[S, O], S | None],
        codec: OpCodec[O],
        listeners: Listeners[O],
        fences: FenceBook,
        stats: ManagerStats,
        checkpoints: CheckpointStore,
        state_deserializer: Callable[[bytes], S] | None,
        on_corrupt: CorruptPolicy,
        operation_timeout: float,
        progress_interval: float,
        on_rebuild: Callable[[], None],
    ) -> None:
        self.backend = backend
        self.topic = topic
        self.writer_id = writer_id
        self._initializer = initializer
        self._applier = applier
        self.codec = codec
        self.listeners = listeners
        self.fences = fences
        self.stats = stats
        self.checkpoints = checkpoints
        self.deserialize_state = state_deserializer
        self.on_corrupt: CorruptPolicy = on_corrupt
        self.operation_timeout = operation_timeout
        self.progress_interval = progress_interval
        self._on_rebuild = on_rebuild

        self.lock = lock  # state, reader, writer, offsets
        self.state: Any = None
        self.reader: LogReader | None = None
        self.applied_offset = -1
        self.applying_offset = -1
        self.applied_position: Any = EARLIEST
        self.applied_epoch = -1
        self.log_id: str | None = None  # the log's GENESIS id (None: empty or legacy log)
        self.bytes_since_checkpoint = 0
        self.last_checkpoint_size = 0
        self.inflight: dict[int, PendingWrite] = {}  # sent, not yet acknowledged or found in the log
        self.outcomes = OutcomeBook()  # writes reported unknown to their callers, until settled
        self._status = ReplicaState.EMPTY
        self._status_lock = threading.Lock()  # taken last: close() moves to CLOSED without the state lock

    # ------------------------------------------------------------------ state machine
    @property
    def status(self) -> ReplicaState:
        return self._status

    @property
    def closed(self) -> bool:
        return self._status is ReplicaState.CLOSED

    def transition(self, to: ReplicaState) -> bool:
        """Move to ``to``; False (nothing changes) once CLOSED: closing is final, and a step that
        ends after it leaves the replica closed. Any other move the machine has no edge for is a bug."""
        with self._status_lock:
            current = self._status
            if current is to:
                return True
            if current is ReplicaState.CLOSED:
                return False
            if to not in _NEXT[current]:
                raise PulsarStateError(f"{self.topic}: internal error: replica cannot go from {current} to {to}")
            self._status = to
            return True

    def ensure(self, *, deadline: float | None = None) -> None:
        """Make the state the log's: build it when there is none (or it is suspect), go on with a
        paused bootstrap. Call with the lock held.

        :param deadline: (monotonic) a replay still running then stops with OperationTimeoutError;
            what was replayed is kept and the next call goes on from there.
        """
        status = self._status
        if status is ReplicaState.LIVE:
            return
        if status is ReplicaState.CLOSED:
            raise ClosedError(f"state manager of {self.topic} is closed")
        if status is ReplicaState.PAUSED:
            self._resume(deadline)
        else:
            self._rebuild(deadline)

    def _rebuild(self, deadline: float | None) -> None:
        # Writes of unknown outcome would land right after the confirmed offset: a checkpoint
        # past it could hide them, and they would be sent twice. Replay from before them instead.
        limit = self.applied_offset if self.inflight or self.outcomes else None
        if self.reader is not None:
            self.reader.close()
            self.reader = None
            self.stats.rebuilds += 1
        self._on_rebuild()
        self.bytes_since_checkpoint = 0
        if not self.transition(ReplicaState.LIVE):
            raise ClosedError(f"state manager of {self.topic} is closed")
        try:
            bootstrap.ensure_durable(self.backend, self.topic, strict=False)
            beginning = read_beginning(self.backend, self.topic, timeout=self.operation_timeout)
            self.log_id = beginning.genesis.log_id if beginning.genesis is not None else None
            if beginning.empty:
                bootstrap.check_not_recreated(
                    self.backend, self.checkpoints, self.topic, timeout=self.operation_timeout
                )
            self._start(limit)
            self.catch_up(bootstrap=True, deadline=deadline)
        except ReplayPaused:
            self.transition(ReplicaState.PAUSED)  # the state so far is a correct prefix of the log
            raise
        except BaseException:
            self.transition(ReplicaState.BROKEN)
            raise

    def _start(self, limit: int | None) -> None:
        """Start from the newest usable checkpoint, or else from an empty state at the log's beginning."""
        loaded = None
        if self.deserialize_state is not None:
            loaded = bootstrap.load_checkpoint(
                self.checkpoints,
                topic=self.topic,
                log_id=self.log_id,
                limit=limit,
                deserialize=self.deserialize_state,
                open_reader=self.open_reader,
            )
        if loaded is None:
            self.reader = self.open_reader()
            self.state, self.fences.tokens = self._initializer(), {}
            self.applied_offset = -1
            self.applied_position, self.applied_epoch = EARLIEST, -1
            return
        info = loaded.info
        self.reader, self.state, self.fences.tokens = loaded.reader, loaded.state, dict(info.fences)
        self.applied_offset, self.applied_position, self.applied_epoch = info.offset, info.position, info.epoch
        self.listeners.skip_to(info.offset)
        self.last_checkpoint_size = info.size
        self.stats.checkpoint_loaded_offset = info.offset

    def _resume(self, deadline: float | None) -> None:
        self.transition(ReplicaState.LIVE)
        try:
            self.catch_up(bootstrap=True, deadline=deadline)
        except BaseException:
            if self._status is ReplicaState.LIVE:  # not found broken meanwhile: still a correct prefix
                self.transition(ReplicaState.PAUSED)
            raise

    def open_reader(self, **options: Any) -> LogReader:
        """A reader of the log with this replica's policies: a frame claiming an epoch the back end
        never granted is skipped as corrupt whatever ``on_corrupt`` says (it cannot belong to the log)."""
        return LogReader(
            self.backend,
            self.topic,
            on_corrupt=self.on_corrupt,
            on_forged_epoch="skip",
            on_skip=self._count_skip,
            **options,
        )

    def _count_skip(self, err: CorruptEntryError) -> None:
        self.stats.corrupt_skipped += 1

    def close_reader(self) -> None:
        if self.reader is not None:
            self.reader.close()
            self.reader = None

    def read(self, reader: Callable[[S], R], *, latest: bool, after: Future[Any] | None, timeout: float | None) -> R:
        """Run ``reader`` on the state once ``after`` (this instance's last write, if any) completed,
        built first if needed and, when ``latest``, caught up to the tail as of the call; the whole
        call within ``timeout`` (OperationTimeoutError, nothing changed). Call without the lock."""
        deadline = deadline_of(timeout)
        if after is not None and not after.done() and not wait([after], timeout=time_left(deadline)).done:
            raise OperationTimeoutError(
                f"{self.topic}: this instance's earlier writes did not complete within {timeout:.1f}s"
            )
        left = time_left(deadline)
        if not self.lock.acquire(timeout=-1 if left is None else left):
            raise OperationTimeoutError(
                f"{self.topic}: the local state stayed busy (an append or a catch-up) for {timeout:.1f}s"
            )
        try:
            self.ensure(deadline=deadline)
            if latest:
                self.catch_up(deadline=deadline)
            return reader(self.state)
        finally:
            self.lock.release()

    # ------------------------------------------------------------------ reading the log
    def catch_up(self, *, bootstrap: bool = False, deadline: float | None = None) -> None:
        """Read and apply everything up to the tail as it is now (stopping at ``deadline``, if given)."""
        reader = self.reader
        assert reader is not None
        progress = Progress(
            log,
            f"replaying {self.topic}" if bootstrap else f"catching up {self.topic}",
            interval=self.progress_interval,
            unit="records",
            quiet=not bootstrap,
        )
        wait_s = self.operation_timeout
        while True:
            if deadline is not None:
                wait_s = min(self.operation_timeout, deadline - time.monotonic())
                if wait_s <= 0:
                    raise self._paused()
            record = reader.read_next(timeout=wait_s, drain=True)
            if record is None:
                if deadline is not None and reader.has_next():
                    # the tail was not reached: the wait ended at the deadline (the top of the loop
                    # pauses) or before it (a back end rounds its wait down): never serve the prefix
                    # read so far as the whole log
                    continue
                break
            self.take_record(record)
            progress.tick(offset=self.applied_offset)
        progress.done(offset=self.applied_offset)

    def _paused(self) -> ReplayPaused:
        return ReplayPaused(
            f"{self.topic}: read up to offset {self.applied_offset}, not yet to the tail, within the timeout"
        )

    def take_record(self, record: LogRecord) -> None:
        """Apply a record read from the log, and settle what it proves about writes in doubt."""
        self._apply_record(record)
        if self.inflight or self.outcomes:
            self._settle_pending(record.epoch)

    def _settle_pending(self, epoch: int) -> None:
        """A record of ``epoch`` was read: writes sent at older epochs and not found so far never land
        (readers skip a frame of an older epoch after a newer one)."""
        for w in self.inflight.values():
            if w.unknown and w.epoch is not None and w.epoch < epoch:
                w.unknown = False  # proven absent: it may be generated and sent again
        if self.outcomes:
            for seq in self.outcomes.epoch_began(epoch):
                log.info(
                    "%s: write %d did not land (epoch %d began without it); it is safe to send again",
                    self.topic,
                    seq,
                    epoch,
                )

    def _apply_record(self, record: LogRecord) -> None:
        if record.kind is RecordKind.GENESIS and self.log_id is None and self.applied_offset < 0:
            self.log_id = parse_genesis(record, self.topic).log_id  # only the first GENESIS counts
            return
        if record.kind is not RecordKind.DATA or record.offset <= self.applied_offset:
            return
        writes = self._decode(record)
        if writes is None:
            return
        mine = record.writer_id == self.writer_id
        self.applying_offset = record.offset
        applied_ops: list[O] = []
        for seq, ops, fence in writes:
            refused = self.fences.admit_replayed(fence, seq, record.offset) if fence is not None else None
            if refused is None:
                self._apply_replayed(ops, record.offset)
                applied_ops.extend(ops)
            if mine:
                self._found_own(seq, refused, record.offset)
        self.record_applied(record)
        if self.listeners:
            self.listeners.notify(record.offset, applied_ops, record.publish_time)
        else:
            self.listeners.skip_to(record.offset)

    def _decode(self, record: LogRecord) -> list[tuple[int, list[O], FenceTag | None]] | None:
        """The record's writes; None when it is corrupt and skipped (``on_corrupt="skip"``)."""
        try:
            return self.codec.decode(record.body)
        except Exception as exc:  # FrameError or the op deserializer rejecting the entry
            err = CorruptEntryError(topic=self.topic, position=f"offset {record.offset}", cause=describe(exc))
            if self.on_corrupt == "raise":
                self.transition(ReplicaState.BROKEN)  # stop here; the next use replays again and stops again
                raise err from exc
            log.error("skipping %s (on_corrupt='skip')", err)
            self.stats.corrupt_skipped += 1
            self.record_applied(record)
            return None

    def _apply_replayed(self, ops: list[O], offset: int) -> None:
        try:
            for op in ops:
                self.apply_op(op)
        except Exception as exc:
            self.transition(ReplicaState.BROKEN)
            raise CorruptEntryError(
                topic=self.topic, position=f"offset {offset}", cause=f"applier failed: {describe(exc)}"
            ) from exc

    def _found_own(self, seq: int, refused: PulsarStateError | None, offset: int) -> None:
        """A write of this instance was read back from the log: complete it if still in flight."""
        w = self.inflight.pop(seq, None)
        if w is not None:  # our own write whose acknowledgement was lost: it did land
            log.info("%s: write %d found in the log at offset %d; not sending it again", self.topic, seq, offset)
            if refused is not None:
                w.fail(refused)
                return
            try:
                w.result = self.read_for(w)
                w.succeed()
            except Exception as exc:
                w.fail(exc)
        elif self.outcomes and self.outcomes.found(seq):
            log.info("%s: write %d, reported unknown, landed at offset %d", self.topic, seq, offset)

    def record_applied(self, record: LogRecord) -> None:
        self.advance(record.offset, record.position, record.epoch, len(record.body))
        self.stats.records_replayed += 1

    # ------------------------------------------------------------------ changing the state
    def apply_op(self, op: O) -> None:
        new_state = self._applier(self.state, op)
        if new_state is not None:
            self.state = new_state

    def read_for(self, w: PendingWrite) -> Any:
        """The write's result: its reader on the state now (None without one)."""
        return w.reader(self.state) if w.reader is not None else None

    def advance(self, offset: int, position: Any, epoch: int, size: int) -> None:
        """A DATA record is applied: where a checkpoint taken now would resume the log."""
        self.applied_offset = offset
        self.applied_position, self.applied_epoch = position, epoch
        self.bytes_since_checkpoint += size
