"""The commit thread: a queue of writes committed in groups through the exclusive writer, with retries.

Writes submitted while another is in flight share one writer acquisition and one record. After
fencing or an unknown outcome the state is rebuilt from the log and a write found there
completes without being sent again; only writes proven absent are regenerated and retried. A
write that may have landed never fails with an error that invites sending it again.

Locks: the state lock may be held while taking the queue's condition (:attr:`Committer.cv`),
never the other way round (a listener runs under the state lock and may queue a write).
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeoutError
from typing import Any

from airflow_provider_pulsarstate.engine.envelope import FenceTag
from airflow_provider_pulsarstate.engine.errors import (
    BackendUnavailableError,
    ClosedError,
    OperationTimeoutError,
    PulsarStateError,
    UnknownOutcomeError,
    WriteId,
    WriterFencedError,
)
from airflow_provider_pulsarstate.engine.state.custody import WriterCustody
from airflow_provider_pulsarstate.engine.state.replica import Replica
from airflow_provider_pulsarstate.engine.state.staging import Stager
from airflow_provider_pulsarstate.engine.state.support import Restage, describe
from airflow_provider_pulsarstate.engine.writes import PendingWrite

log = logging.getLogger(__name__)


class Committer:
    """The queue of writes of one manager and the thread that commits them (started by the next
    write whenever it is not running). Its options are the manager's of the same names."""

    def __init__(
        self,
        replica: Replica[Any, Any],
        custody: WriterCustody,
        stager: Stager[Any],
        *,
        max_group_writes: int,
        max_retries: int,
        writer_idle_timeout: float | None,
        handover_check_interval: float | None,
        after_commit: Callable[[], None],
    ) -> None:
        self.replica = replica
        self.custody = custody
        self.stager = stager
        self.topic = replica.topic
        self.stats = replica.stats
        self.max_group_writes = max_group_writes
        self.max_retries = max_retries
        self.writer_idle_timeout = writer_idle_timeout
        self.handover_check_interval = handover_check_interval
        self._after_commit = after_commit
        self.cv = threading.Condition()
        self.queue: deque[PendingWrite] = deque()
        self.thread: threading.Thread | None = None
        self.last_submitted: Future[Any] | None = None
        self._seq = itertools.count(1)
        self._last_write = time.monotonic()

    # ------------------------------------------------------------------ submitting
    def enqueue(
        self,
        generator: Any,
        reader: Any,
        *,
        retry: bool,
        barrier: bool = False,
        probe: bool = False,
        fence: FenceTag | None = None,
    ) -> PendingWrite:
        """Queue a write (its future's ``write_id`` names it); ClosedError once closed."""
        w = PendingWrite(next(self._seq), generator, reader, retry, barrier, probe, fence=fence)
        w.future.write_id = WriteId(self.replica.writer_id, w.seq)  # type: ignore[attr-defined]
        with self.cv:
            if self.replica.closed:
                raise ClosedError(f"state manager of {self.topic} is closed")
            self.queue.append(w)
            self.last_submitted = w.future
            if self.thread is None or not self.thread.is_alive():
                if self.thread is not None:
                    log.warning("%s: the commit thread had stopped; starting a new one", self.topic)
                self.thread = threading.Thread(target=self._run, name=f"pulsarstate-commit-{self.topic}", daemon=True)
                self.thread.start()
            self.cv.notify()
        return w

    def await_result(self, w: PendingWrite, timeout: float | None) -> Any:
        """The write's result, waiting at most ``timeout``; then cancel it, or report it unknown."""
        future = w.future
        if timeout is None:
            return future.result()
        try:
            return future.result(timeout=max(0.0, timeout))
        except (TimeoutError, FutureTimeoutError):
            if future.done():
                raise  # the write's own error
        if future.cancel():  # still queued or waiting for the writer: it will never be sent
            raise OperationTimeoutError(
                f"{self.topic}: write {w.seq} was not sent within {timeout:.1f}s (waiting for the writer or "
                "for earlier writes); nothing was appended"
            )
        if w.barrier or w.probe:
            raise OperationTimeoutError(f"{self.topic}: a linearizable read did not complete within {timeout:.1f}s")
        self.replica.outcomes.abandon(w)
        if future.done():
            return future.result()
        raise UnknownOutcomeError(
            f"{self.topic}: write {w.seq} was being sent when the {timeout:.1f}s timeout ran out; it may or may "
            "not land: ask outcome(write_id) before sending it again",
            writer_id=self.replica.writer_id,
            seq=w.seq,
        )

    def fail_queued(self) -> None:
        """Fail every queued write with ClosedError (the manager is closing)."""
        with self.cv:
            pending, self.queue = list(self.queue), deque()
        for w in pending:
            self.give_up(w, ClosedError(f"state manager of {self.topic} closed before the write was committed"))

    # ------------------------------------------------------------------ the thread
    def _run(self) -> None:
        batch: list[PendingWrite] = []
        try:
            next_check = 0.0  # the first check for waiters follows each commit at once
            while True:
                got = self._next_batch(next_check)
                if got is None:
                    return
                if not got:  # outside the condition (see "Locks" above): may ask the back end
                    self._look_at_idle_writer()
                    next_check = time.monotonic() + (self.handover_check_interval or 0.0)
                    continue
                batch = got
                self.commit(batch)
                batch = []
                self._last_write = time.monotonic()
                next_check = 0.0
                self._after_commit()
        except BaseException as exc:  # noqa: BLE001 - no write may wait forever on a dead thread
            self._thread_failed(exc, batch)
            if not isinstance(exc, Exception):
                raise

    def _next_batch(self, next_check: float) -> list[PendingWrite] | None:
        """The next group of writes; [] when it is time to look at the idle writer; None once closed."""
        with self.cv:
            look = False  # at the idle writer: release it after its idle timeout or for a waiter
            while not self.queue and not self.replica.closed:
                wait = self._idle_wait(next_check)
                if wait is not None and wait <= 0:
                    look = True
                    break
                self.cv.wait(timeout=wait)
            if self.replica.closed:
                return None
            if look:
                return []
            return [self.queue.popleft() for _ in range(min(len(self.queue), self.max_group_writes))]

    def _idle_wait(self, next_check: float) -> float | None:
        """With nothing queued: seconds to wait for work before looking at the held writer (0:
        now, its idle timeout ran out or a check for waiters is due; None: until work arrives, no
        writer is held or it is kept for good). Called under the queue's condition."""
        if not self.custody.held:
            return None
        due: list[float] = []
        if self.writer_idle_timeout is not None:
            due.append(self._last_write + self.writer_idle_timeout)
        if self.handover_check_interval is not None:
            due.append(next_check)
        return max(0.0, min(due) - time.monotonic()) if due else None

    def _look_at_idle_writer(self) -> None:
        idle = self.writer_idle_timeout
        if idle is not None and time.monotonic() >= self._last_write + idle:
            self._release_idle_writer(handover=False)
        elif self.handover_check_interval is not None and self.custody.wanted():
            self._release_idle_writer(handover=True)

    def _release_idle_writer(self, *, handover: bool) -> None:
        """Let go of the held writer unless writes were queued meanwhile."""
        with self.replica.lock:
            if not self.custody.held:
                return
            with self.cv:
                if self.queue:
                    return  # work arrived meanwhile: keep the writer
            self.custody.release(handover=handover)

    def _thread_failed(self, exc: BaseException, batch: list[PendingWrite]) -> None:
        """Fail the batch and every queued write with ``exc``; the next write starts a new thread."""
        self.stats.committer_errors += 1
        log.error(
            "%s: the commit thread failed (%s); failing the pending writes", self.topic, describe(exc), exc_info=exc
        )
        err = exc
        if not isinstance(exc, PulsarStateError):
            err = PulsarStateError(f"{self.topic}: the commit thread failed: {describe(exc)}")
            err.__cause__ = exc
        with self.cv:
            pending, self.queue = list(self.queue), deque()
            self.thread = None
        with contextlib.suppress(Exception), self.replica.lock:
            self.custody.drop()
        for w in [*batch, *pending]:
            with contextlib.suppress(Exception):
                self.give_up(w, err)

    # ------------------------------------------------------------------ committing
    def commit(self, batch: list[PendingWrite]) -> None:
        """Commit a group of writes, retrying after fencing or an unknown outcome; every write completes."""
        attempt = 0
        while True:
            batch = [w for w in batch if not w.future.done()]
            if not batch:
                return
            if self.replica.closed:
                for w in batch:
                    self.give_up(w, ClosedError(f"state manager of {self.topic} closed before the write was committed"))
                return
            try:
                self._commit_once(batch)
                return
            except Restage:
                continue  # the state was rebuilt: take the writer and stage the writes again
            except (WriterFencedError, UnknownOutcomeError) as exc:
                attempt += 1
                self._look_for(batch, exc, attempt)
            except BaseException as exc:  # noqa: BLE001 - every write must complete
                try:
                    with self.replica.lock:
                        self.custody.drop()
                finally:
                    for w in batch:
                        self.give_up(w, exc)
                if not isinstance(exc, Exception):
                    raise
                return

    def _look_for(self, batch: list[PendingWrite], exc: PulsarStateError, attempt: int) -> None:
        """After a failed attempt: rebuild from the log (finding writes that did land), give up on
        the writes that may not be retried."""
        self.stats.retries += 1
        log.warning("%s: write attempt %d failed (%s); looking for it in the log", self.topic, attempt, exc)
        try:
            with self.replica.lock:
                self.custody.drop()
                self.replica.ensure()  # rebuilds if ops were applied; finds writes that did land
        except Exception as rebuild_exc:  # noqa: BLE001 - settled on the next attempt or given up below
            log.warning("%s: could not re-read the log yet: %s", self.topic, rebuild_exc)
        for w in batch:
            if not w.retry or attempt > self.max_retries:
                self.give_up(w, exc)

    def _commit_once(self, batch: list[PendingWrite]) -> None:
        """One attempt: settle what needs no writer, take it (without the state lock), stage, append."""
        replica = self.replica
        writer = None
        if not self.custody.held:
            with replica.lock:
                replica.ensure()
                replica.catch_up()  # before taking the writer: only the short tail is read under it
                batch = self.stager.settle_without_writer(batch)
            if not batch:
                return
            # Without the state lock: local reads go on while another instance holds the writer.
            writer = self.custody.open()
        with replica.lock:
            try:
                replica.ensure()  # a rebuild here drops the old writer, not the new one
                if replica.closed:
                    raise ClosedError(f"state manager of {self.topic} closed before the write was committed")
                if writer is not None:
                    adopted, writer = writer, None
                    self.custody.adopt(adopted, replica)
            finally:
                if writer is not None:
                    writer.close()
            if not self.custody.held:
                raise Restage()
            self.stager.stage_and_append(batch)

    def give_up(self, w: PendingWrite, exc: BaseException) -> None:
        """Complete a write with an error for good.

        A write that may have landed fails with UnknownOutcomeError naming it and stays pending
        (later catch-ups settle it); one that certainly did not never fails with
        UnknownOutcomeError, so that error always means "ask outcome() before retrying".
        """
        replica = self.replica
        with replica.lock:
            replica.inflight.pop(w.seq, None)
            if w.future.done():
                return
            if w.unknown:
                replica.outcomes.unresolved(w)
                self.stats.unknown_outcomes += 1
                err: BaseException = UnknownOutcomeError(
                    f"{self.topic}: write {w.seq} was sent at epoch {w.epoch} and may or may not have landed; "
                    f"it could not be looked up ({describe(exc)}). Ask outcome(write_id) before sending it again",
                    writer_id=replica.writer_id,
                    seq=w.seq,
                )
                err.__cause__ = exc
            elif isinstance(exc, UnknownOutcomeError):  # e.g. the EPOCH record's: this write was never sent
                err = BackendUnavailableError(f"{self.topic}: write {w.seq} was not sent: {exc}")
                err.__cause__ = exc
            else:
                err = exc
            w.fail(err)
