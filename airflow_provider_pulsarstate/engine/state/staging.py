"""A group of writes made into one record: generated from the latest state, applied, appended.

While ops are staged and the append is in flight the state lock is held and the replica is
BROKEN, so no read sees state that is not in the log, and a failed append rebuilds the state
from the log before anything else happens. A write that cannot be generated, serialized or
encoded fails alone: the others of its group land.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from airflow_provider_pulsarstate.engine.envelope import RecordKind
from airflow_provider_pulsarstate.engine.errors import (
    BackendUnavailableError,
    OperationTimeoutError,
    UnknownOutcomeError,
    WriterFencedError,
)
from airflow_provider_pulsarstate.engine.state.custody import WriterCustody
from airflow_provider_pulsarstate.engine.state.ops import OpCodec
from airflow_provider_pulsarstate.engine.state.replica import Replica, ReplicaState
from airflow_provider_pulsarstate.engine.state.support import Restage, describe
from airflow_provider_pulsarstate.engine.wal import LogWriter
from airflow_provider_pulsarstate.engine.writes import PendingWrite

O = TypeVar("O")


@dataclass(slots=True)
class _Staged(Generic[O]):
    w: PendingWrite
    ops: list[O]
    encoded: bytes
    sent: bool
    """It goes into the record (it has ops, or a fencing token the log has not seen)."""


class Stager(Generic[O]):
    """Turns writes into records against one replica; every method is called with the state lock held."""

    def __init__(
        self,
        replica: Replica[Any, O],
        custody: WriterCustody,
        codec: OpCodec[O],
        *,
        operation_timeout: float,
    ) -> None:
        self.replica = replica
        self.custody = custody
        self.codec = codec
        self.topic = replica.topic
        self.operation_timeout = operation_timeout

    def settle_without_writer(self, batch: list[PendingWrite]) -> list[PendingWrite]:
        """Complete, against the caught-up state, the writes that need no writer; return the rest.

        Going in order, a write whose generator or serializer fails is failed, and one with
        nothing to append completes, until the first write that needs the writer: it has ops
        (kept in ``prepared``), is a barrier or probe, or its earlier send is of unknown outcome.
        From there on every write must be generated after the earlier ones are applied, so
        the rest is left for the writer. So a rejected value never takes the writer.
        """
        replica = self.replica
        for i, w in enumerate(batch):
            if w.future.done():
                continue
            if w.needs_writer:
                return batch[i:]
            try:
                new_token = replica.fences.check(w)
                ops, payloads = self.codec.generate(w, replica.state)
            except Exception as exc:  # a stale lease, or the caller's generator or serializer: fail this write only
                w.fail(exc)
                continue
            if ops or new_token:
                w.prepared = (replica.applied_offset, ops, payloads)
                return batch[i:]
            try:
                w.result = replica.read_for(w)
            except Exception as exc:
                w.fail(exc)
                continue
            w.succeed()
        return []

    def stage_and_append(self, batch: list[PendingWrite]) -> None:
        """Generate, serialize and apply each write's ops, then append them as one record."""
        writer = self.custody.writer
        assert writer is not None
        if any(w.unknown for w in batch):  # cannot be right after adopting: a new epoch settles it first
            self.custody.drop()
            raise Restage()
        inflight = self.replica.inflight
        for w in batch:
            inflight.pop(w.seq, None)  # from an earlier attempt, proven absent: sent again below or failed
        staged = self._stage(batch)
        if not staged:
            return
        if any(s.sent for s in staged):
            self._append(staged, writer)
        elif any(s.w.barrier for s in staged):
            writer.append(RecordKind.BARRIER, timeout=self.operation_timeout)
        for s in staged:
            inflight.pop(s.w.seq, None)
            s.w.succeed()
        self.replica.stats.writes_committed += len(staged)

    def _stage(self, batch: list[PendingWrite]) -> list[_Staged[O]]:
        staged: list[_Staged[O]] = []
        dirty = False  # ops of this record were applied: prepared ops of later writes are stale
        for w in batch:
            entry = self._stage_one(w, dirty=dirty)
            if entry is not None:
                dirty = dirty or entry.sent
                staged.append(entry)
        return staged

    def _stage_one(self, w: PendingWrite, *, dirty: bool) -> _Staged[O] | None:
        """The write staged (its ops applied, its result read); None when it failed or was withdrawn."""
        if w.abandoned and not w.unknown:  # its caller gave up before it was sent: never send it
            w.fail(
                OperationTimeoutError(f"{self.topic}: write {w.seq} timed out before it was sent; nothing was appended")
            )
            return None
        if not w.claim():
            return None  # cancelled by its caller's timeout, or done
        replica = self.replica
        prepared, w.prepared = w.prepared, None
        try:
            new_token = replica.fences.check(w)
            if prepared is not None and not dirty and prepared[0] == replica.applied_offset:
                ops, payloads = prepared[1], prepared[2]  # the state did not move since they were made
            else:
                ops, payloads = self.codec.generate(w, replica.state)
            sent = bool(ops or new_token)
            encoded = self.codec.encode(w, payloads) if sent else b""
        except Exception as exc:  # a stale lease, the caller's generator or serializer, an unencodable write
            w.fail(exc)
            return None
        if sent:
            self._apply(w, ops)
        else:
            try:
                w.result = replica.read_for(w)
            except Exception as exc:
                w.fail(exc)
                return None
        return _Staged(w, ops, encoded, sent)

    def _apply(self, w: PendingWrite, ops: list[O]) -> None:
        """Apply a write's ops before its append (the replica is BROKEN until it is acknowledged)."""
        replica = self.replica
        replica.transition(ReplicaState.BROKEN)
        replica.applying_offset = replica.applied_offset + 1
        removed = replica.fences.take(w.fence) if w.fence is not None else {}
        try:
            for op in ops:
                replica.apply_op(op)
            w.result = replica.read_for(w)
            if w.fence is not None and w.fence[2] == 0:
                w.result = removed  # a reset answers with what it removed
        except Exception as exc:
            w.fail(exc)
            raise Restage() from exc

    def _append(self, staged: list[_Staged[O]], writer: LogWriter) -> None:
        replica = self.replica
        body = b"".join(s.encoded for s in staged if s.sent)
        offset = replica.applied_offset + 1
        for s in staged:
            if s.sent:
                replica.inflight[s.w.seq] = s.w
        try:
            position = writer.append(RecordKind.DATA, body, offset=offset, timeout=self.operation_timeout)
        except (WriterFencedError, BackendUnavailableError):
            raise  # the back end says none of it can land
        except BaseException as exc:
            for s in staged:
                if s.sent:
                    s.w.unknown, s.w.epoch = True, writer.epoch
            if isinstance(exc, UnknownOutcomeError) or not isinstance(exc, Exception):
                raise
            raise UnknownOutcomeError(
                f"{self.topic}: append failed ({describe(exc)}); it may or may not have landed"
            ) from exc
        replica.advance(offset, position, writer.epoch, len(body))
        replica.transition(ReplicaState.LIVE)
        replica.stats.records_appended += 1
        replica.listeners.notify(offset, [op for s in staged for op in s.ops], time.time())
