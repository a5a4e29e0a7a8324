"""SharedStateManager: a shared in-memory object kept consistent through an op log (PIP-137).

Every instance replays the topic into its own copy of the state. Writes go through the topic's
single exclusive writer; an instance catches up, takes the writer, reads the short tail up to its
own EPOCH record, generates the ops from that state, appends them as one record, then applies them
locally.

Guarantees:

* **Atomic writes.** The ops of one write reach the log as one record (cut into frames when large);
  readers apply a record only when all of it arrived, so a write lands whole or not at all.
* **Ops from the latest state.** The ops that are appended were generated only after the instance
  held the writer and had read up to its own EPOCH record, i.e. after every earlier write was
  applied. Before taking the writer, the ops are generated once against the caught-up state: a
  write that fails there (its generator or serializer raises) or has nothing to append completes
  without the writer, as long as no earlier write of the same batch changes the state first.
* **No double application.** An appended record is applied once, locally, when its append is
  acknowledged; replay skips offsets already applied.
* **Exactly once.** Every write carries (writer id, sequence). After an unknown outcome (time-out,
  dropped connection) the state is rebuilt from the log and a write found there completes
  without being sent again; only writes proven absent (a newer epoch began without them, after
  which they can never land) are regenerated and retried.
* **Unknown stays unknown.** A write that may have landed never fails with an error that invites
  sending it again: when the manager cannot settle it (retries exhausted or off, the back end
  unreachable, the caller's ``timeout``), it fails with UnknownOutcomeError carrying its write id
  and stays pending; later catch-ups settle it, and :meth:`outcome` says what became of it.
* **Fencing.** A fenced writer never appends again. The write is retried on a new epoch with ops
  regenerated from the new state, or fails with WriterFencedError when ``retry=False``.
* **Fencing tokens.** A write may carry a lease (:mod:`~airflow_provider_pulsarstate.engine.fencing`).
  Its token is checked against the lease log that granted it before it is queued (a token never
  granted fails with LeaseNotGrantedError). The log keeps the highest token it has applied per
  (lease log, lease name) (in checkpoints too); a write whose token is lower fails with
  LeaseFencedError before anything is appended, and a record holding one anyway (forged, or
  written by a broken client) is skipped by every replica on replay. A write under a token the
  log has not seen is appended even with no ops, so the new token fences older holders from then
  on. :meth:`reset_fence` removes a fence with a record of its own.
* **Reads.** ``read(latest=False)`` answers from local state and never waits for the writer to be
  taken (the writer is acquired without the state lock); ``latest=True`` first reads up to the
  tail as of the call; ``linearizable=True`` goes through the writer and appends a BARRIER record
  (the PIP's "dummy write"), proving no newer writer exists.
* **Group commit.** Writes submitted while another is in flight share one writer acquisition and
  one record; each still gets its own result, computed right after its own ops are applied. A
  write that cannot be generated, serialized or encoded fails alone: the others land.
* **Bounded waits.** Taking the writer waits at most ``acquire_timeout``; an idle writer is
  released after ``writer_idle_timeout`` so other instances are not starved. ``read``, ``write``
  and :meth:`outcome` take a ``timeout`` for the whole call.
* **Handover.** A writer with nothing queued is released as soon as another instance (of any
  process) waits for it, checked every ``handover_check_interval`` while it is idle
  (:meth:`~airflow_provider_pulsarstate.engine.backends.base.RawWriter.has_waiters`); a writer
  with writes queued commits them first, in groups as always. So writes of many processes to
  one topic take turns instead of waiting for ``writer_idle_timeout``.
* **No silent background failures.** The commit thread fails every pending write with the error
  that stopped it and is started again by the next write; the follow thread logs and counts
  (``stats["follower_errors"]``) each failure and keeps following; listener exceptions are
  logged with topic and offset and counted (``stats["listener_errors"]``).
* **Checkpoints** (when given a state serializer and deserializer). Bootstrap loads the newest
  checkpoint (:mod:`~airflow_provider_pulsarstate.engine.checkpoint`) and replays only the records after
  it, so its cost follows the size of the state, not the length of the history. A checkpoint is
  used only after its manifest was checked against the log; a missing, damaged, forged or
  unreadable one is logged and the whole log is replayed: checkpoints never decide the state.
  With ``checkpoint_after_bytes`` the writer checkpoints by itself; :meth:`checkpoint` does it
  on demand from any instance.

* **A lost log is never served as an empty table.** The first writer of a log writes a GENESIS
  record (:mod:`~airflow_provider_pulsarstate.engine.genesis`); a bootstrap that finds the log's
  beginning gone, an empty log under a table that has checkpoints, or a checkpoint of another
  log id raises LogLostError. On Pulsar, first use also checks the topic's retention and
  inactive-topic policies (:meth:`~airflow_provider_pulsarstate.engine.backends.base.Backend.ensure_durable`).

While ops are staged and the append is in flight, the lock that readers take is held, so no
read ever sees state that is not in the log. If an append fails after ops were applied locally,
the state is rebuilt from the log before anything else happens.

The parts, one job each, live in :mod:`airflow_provider_pulsarstate.engine.state`: the replica and
its state machine, the committer (queue, group commit, retries) with the writer's custody and the
staging of records, listeners, background workers (follower, checkpoints), op (de)serialization;
:mod:`~airflow_provider_pulsarstate.engine.state.assembly` checks the options and wires the parts
together. This class holds the public API.

Locks: the state lock may be held while taking the commit queue's condition, never the other way
round (a listener runs under the state lock and may call :meth:`write_async`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Generic, TypeVar

from airflow_provider_pulsarstate.engine.backends.base import AcquireMode, Backend
from airflow_provider_pulsarstate.engine.checkpoint import CheckpointInfo
from airflow_provider_pulsarstate.engine.errors import (
    PulsarStateError,
    WriteId,
)
from airflow_provider_pulsarstate.engine.fencing import (
    ANY_LEASE_LOG,
    Fence,
    FenceKey,
    check_lease_log,
    check_lease_name,
)
from airflow_provider_pulsarstate.engine.state.assembly import ManagerOptions, assemble
from airflow_provider_pulsarstate.engine.state.introspection import ManagerIntrospection
from airflow_provider_pulsarstate.engine.state.listeners import Change, ListenerErrorHandler
from airflow_provider_pulsarstate.engine.state.ops import json_op_deserializer, json_op_serializer
from airflow_provider_pulsarstate.engine.state.replica import Replica, ReplicaState
from airflow_provider_pulsarstate.engine.state.stats import ManagerStats
from airflow_provider_pulsarstate.engine.state.support import deadline_of, time_left
from airflow_provider_pulsarstate.engine.wal import DEFAULT_MAX_FRAME_BYTES, CorruptPolicy
from airflow_provider_pulsarstate.engine.writes import PendingWrite, WriteOutcome

__all__ = [
    "Change",
    "ListenerErrorHandler",
    "ManagerStats",
    "ReplicaState",
    "SharedStateManager",
    "json_op_deserializer",
    "json_op_serializer",
]

log = logging.getLogger(__name__)

S = TypeVar("S")
O = TypeVar("O")
R = TypeVar("R")


class SharedStateManager(ManagerIntrospection, Generic[S, O]):
    """Read and write a shared object through an op log on one topic.

    Example::

        backend = open_backend(ConnectionConfig(url="pulsar://localhost:6650"))
        counters = SharedStateManager(
            backend, "persistent://public/default/counters",
            initializer=dict,
            applier=lambda state, op: state.__setitem__(op["k"], op["v"]),
        )
        counters.write(lambda s: [{"k": "runs", "v": s.get("runs", 0) + 1}])
        counters.read(lambda s: s.get("runs"), latest=True)

    Construction does no I/O: the log is replayed on first use (or :meth:`start`).

    :param backend: where the log lives (:func:`~airflow_provider_pulsarstate.engine.backends.open_backend`).
    :param topic: the fully qualified topic.
    :param initializer: returns a new empty state.
    :param applier: applies one op to the state; returns the new state, or None when it
        mutated the state in place. It must not fail on an op the deserializer accepted.
    :param op_serializer: op -> bytes (JSON by default).
    :param op_deserializer: bytes -> op; raise to reject an entry (it is reported as corrupt).
    :param acquire_mode: how to take the writer (wait by default; FENCE takes it over).
    :param acquire_timeout: seconds to wait for the writer.
    :param operation_timeout: seconds a single append or catch-up may take.
    :param writer_idle_timeout: release the writer after this many idle seconds (None: keep it).
    :param handover_check_interval: seconds between checks, while the writer is held with nothing
        queued, whether another instance waits for it; it is released at once when one does (the
        first check follows each commit at once). None: never hand over, keep the writer until
        ``writer_idle_timeout``.
    :param max_retries: retries of a write after fencing or an unknown outcome.
    :param max_group_writes: most writes committed together in one record.
    :param max_frame_bytes: largest frame sent to the back end.
    :param on_corrupt: "raise" stops on an undecodable entry; "skip" logs it and goes on.
    :param follow_interval: when set, a background thread reads new entries this often, so
        the local state and change listeners follow other writers without a read(latest=True).
    :param progress_interval: seconds between progress lines while replaying a long log.
    :param state_serializer: state -> bytes, for checkpoints (None: no checkpoints are written).
    :param state_deserializer: bytes -> state, to load checkpoints (None: always replay the log).
    :param checkpoint_after_bytes: the writer checkpoints once this many bytes of records were
        appended or read since the last checkpoint, and at least a quarter of that checkpoint's
        size (:data:`~airflow_provider_pulsarstate.engine.state.workers.CHECKPOINT_TAIL_RATIO`), so image writes stay proportional to the log. The image
        is taken under the state lock (a consistent state at one offset) and stored on a
        background thread. None: only :meth:`checkpoint` writes them.
    :param use_checkpoints: load the newest checkpoint at bootstrap (False: replay everything).
    :param writer_name: the name this instance's writer shows as leader of the topic
        (:func:`~airflow_provider_pulsarstate.engine.leadership.read_leadership`; on Pulsar the
        exclusive producer's name, which must be unique on the broker). None: a unique generated one.

    A frame that claims an epoch the back end never granted (a foreign producer's) is logged as
    corrupt, counted in ``stats["corrupt_skipped"]`` and skipped whatever ``on_corrupt`` says: it
    cannot belong to any record of the log, so skipping it loses nothing, while stopping on it
    would let anyone able to append one message halt every instance.
    """

    def __init__(
        self,
        backend: Backend,
        topic: str,
        *,
        initializer: Callable[[], S],
        applier: Callable[[S, O], S | None],
        op_serializer: Callable[[O], bytes] = json_op_serializer,
        op_deserializer: Callable[[bytes], O] = json_op_deserializer,
        acquire_mode: AcquireMode | str = AcquireMode.WAIT,
        acquire_timeout: float = 30.0,
        operation_timeout: float = 30.0,
        writer_idle_timeout: float | None = 10.0,
        handover_check_interval: float | None = 0.02,
        max_retries: int = 5,
        max_group_writes: int = 1000,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
        on_corrupt: CorruptPolicy = "raise",
        follow_interval: float | None = None,
        progress_interval: float = 5.0,
        state_serializer: Callable[[S], bytes] | None = None,
        state_deserializer: Callable[[bytes], S] | None = None,
        checkpoint_after_bytes: int | None = None,
        use_checkpoints: bool = True,
        writer_name: str | None = None,
    ) -> None:
        options: ManagerOptions[S, O] = ManagerOptions(
            initializer=initializer,
            applier=applier,
            op_serializer=op_serializer,
            op_deserializer=op_deserializer,
            acquire_mode=acquire_mode,
            acquire_timeout=acquire_timeout,
            operation_timeout=operation_timeout,
            writer_idle_timeout=writer_idle_timeout,
            handover_check_interval=handover_check_interval,
            max_retries=max_retries,
            max_group_writes=max_group_writes,
            max_frame_bytes=max_frame_bytes,
            on_corrupt=on_corrupt,
            follow_interval=follow_interval,
            progress_interval=progress_interval,
            state_serializer=state_serializer,
            state_deserializer=state_deserializer,
            checkpoint_after_bytes=checkpoint_after_bytes,
            use_checkpoints=use_checkpoints,
            writer_name=writer_name,
        )
        parts = assemble(backend, topic, options)
        self.backend = backend
        self.topic = topic
        self.writer_id = parts.custody.writer_id
        self.stats = parts.stats
        self._parts = parts
        self._custody = parts.custody
        self._replica: Replica[S, O] = parts.replica
        self._checkpointing = parts.checkpointing
        self._committer = parts.committer
        self._following = parts.following
        self._read_pool: ThreadPoolExecutor | None = None

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> SharedStateManager[S, O]:
        """Replay the log now (otherwise it happens on first use) and start following if asked."""
        with self._replica.lock:
            self._replica.ensure()
        if self._following.interval is not None:
            self._following.start()
        return self

    def close(self) -> None:
        """Stop background threads, fail queued writes with ClosedError, release writer and reader."""
        self._parts.close(join_timeout=self.operation_timeout + self.acquire_timeout, read_pool=lambda: self._read_pool)

    def __enter__(self) -> SharedStateManager[S, O]:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def add_listener(
        self, listener: Callable[[Change[O]], None], *, on_error: ListenerErrorHandler | None = None
    ) -> Callable[[Change[O]], None]:
        """Call ``listener`` once per op applied from now on, in log order, after it is committed.

        Listeners run on the thread that applied the op, with the state lock held: keep them short.
        They may call :meth:`write_async` (not wait on it) and local reads; a blocking
        :meth:`write` from a listener would wait for the thread it runs on.

        An exception from a listener is logged with the topic and offset, counted in
        ``stats["listener_errors"]`` and passed to ``on_error(exc, change)`` when given; the other
        listeners and later changes are not affected.

        :returns: ``listener``, to pass to :meth:`remove_listener`.
        """
        self._replica.listeners.add(listener, on_error)
        return listener

    def remove_listener(self, listener: Callable[[Change[O]], None]) -> bool:
        """Stop calling ``listener`` (one registration of it); False if it was not registered.

        Once this returns, the listener sees no op applied afterwards (it waits for an op being
        applied on another thread to finish).
        """
        return self._replica.listeners.remove(listener)

    # ------------------------------------------------------------------ reads
    def read(
        self,
        reader: Callable[[S], R],
        *,
        latest: bool = False,
        linearizable: bool = False,
        timeout: float | None = None,
    ) -> R:
        """Run ``reader`` on the state and return its result.

        A local read (``latest=False``) never waits for this instance to take the writer; it
        waits only while ops are being applied (an append in flight, a catch-up).

        :param latest: first read up to the tail as it is at the time of the call, after this
            instance's own earlier writes (even un-awaited ``write_async`` ones) completed:
            read-your-writes.
        :param linearizable: go through the exclusive writer (appends a BARRIER record): the
            answer reflects every write acknowledged to anyone before the call.
        :param timeout: seconds the whole call may take (None: each wait is bounded by
            ``operation_timeout`` / ``acquire_timeout`` only). A first replay cut short by it is
            resumed, not restarted, by the next call.
        :raises OperationTimeoutError: ``timeout`` ran out (nothing was changed).
        :raises CorruptEntryError: a log entry could not be applied (``on_corrupt="raise"``).
        """
        self._following.ensure_alive()
        if linearizable:
            result: R = self._submit(None, reader, retry=True, barrier=True, timeout=timeout)
            return result
        # writes complete in submission order; their outcome is the writer's business
        last = self._committer.last_submitted if latest else None
        return self._replica.read(reader, latest=latest, after=last, timeout=timeout)

    def read_async(self, reader: Callable[[S], R], *, latest: bool = False, linearizable: bool = False) -> Future[Any]:
        """:meth:`read` on a helper thread; returns a Future of the result."""
        if linearizable:
            return self._enqueue(None, reader, retry=True, barrier=True).future
        with self._committer.cv:
            if self._read_pool is None:
                self._read_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="pulsarstate-read")
        return self._read_pool.submit(self.read, reader, latest=latest)

    # ------------------------------------------------------------------ writes
    def write(
        self,
        ops_generator: Callable[[S], Iterable[O]],
        reader: Callable[[S], R] | None = None,
        *,
        retry: bool = True,
        timeout: float | None = None,
        lease: Fence | None = None,
    ) -> R | None:
        """Generate ops from the latest state, append them atomically, apply them; return ``reader(state)``.

        ``ops_generator`` may run more than once (after fencing or an unknown outcome, and once
        against the caught-up state before the writer is taken); it must not have side effects
        other than capturing values for the caller.

        :param retry: retry on a new epoch after fencing (default); False raises WriterFencedError.
        :param timeout: seconds to wait for the result (None: until the write completes; each
            step is bounded by ``acquire_timeout`` / ``operation_timeout``).
        :param lease: the lease (any :class:`~airflow_provider_pulsarstate.engine.fencing.Fence`)
            the write is made under: refused if its lease log never granted its token, or the log
            has seen a newer token of that lease. Checked against the lease log before the write
            is queued (without I/O once this instance's replica of the lease log shows the token).
        :raises LeaseNotGrantedError: the lease log never granted ``lease``'s token; nothing was queued.
        :raises LeaseFencedError: the log has seen a higher token of ``lease``; nothing was appended.
        :raises ConfigurationError: ``lease`` is malformed (names the field); nothing was queued.
        :raises WriterFencedError: fenced and ``retry=False`` (or retries exhausted).
        :raises WriterBusyError: FAIL_FAST mode and another instance holds the writer.
        :raises OperationTimeoutError: the writer did not come free within ``acquire_timeout``, or
            ``timeout`` ran out before the write was sent; nothing was appended.
        :raises UnknownOutcomeError: the write may or may not have been appended and this could
            not be settled (``err.write_id``): call :meth:`outcome` before sending it again.
        :raises SerializationError: an op could not be serialized; nothing was appended.
        """
        result: R | None = self._submit(ops_generator, reader, retry=retry, lease=lease, timeout=timeout)
        return result

    def write_async(
        self,
        ops_generator: Callable[[S], Iterable[O]],
        reader: Callable[[S], R] | None = None,
        *,
        retry: bool = True,
        lease: Fence | None = None,
    ) -> Future[Any]:
        """:meth:`write` without waiting: returns a Future (its ``write_id`` attribute names the write).

        Writes queued together share one record.
        """
        return self._enqueue(ops_generator, reader, retry=retry, lease=lease).future

    @property
    def fences(self) -> dict[FenceKey, int]:
        """The highest fencing token applied per (lease log, lease name), as of the local state (a
        copy). The lease log is its topic and GENESIS id (``topic#id``); ``""`` for fences of frames
        written by earlier versions, which named none."""
        with self._replica.lock:
            return dict(self._replica.fences.tokens)

    def reset_fence(
        self, name: str, *, lease_log: str | None = None, timeout: float | None = None
    ) -> dict[FenceKey, int]:
        """Remove the fence of lease ``name`` with a record of its own in the log (an administrator's tool).

        For a fence raised by a token no lease log granted: a frame forged with a writer of its
        own, or one written by a version that did not check grants. Every replica removes it at
        the record's offset, and checkpoints after it do not hold it. Until the next guarded write
        under ``name`` sets the fence again, holders of older tokens are not fenced: reset while
        no stale holder can write.

        :param lease_log: the lease log whose fence goes (its topic, or a ``topic#id`` key of
            :attr:`fences`); None: every lease log's fence of that name, the ``""`` one included.
        :returns: the fences removed, as of the record (empty: there were none; the reset is
            recorded anyway).
        :raises ConfigurationError: a bad name or lease log (names the field).
        """
        name = check_lease_name(name)
        scope = ANY_LEASE_LOG if lease_log is None else check_lease_log(lease_log, name=name, field="lease_log")
        log.warning("%s: resetting the fence of lease %r (lease log %s)", self.topic, name, scope)
        removed: dict[FenceKey, int] | None = self._submit(
            None, None, retry=True, fence_tag=(scope, name, 0), timeout=timeout
        )
        return removed or {}

    def outcome(self, write_id: WriteId | tuple[bytes, int], *, timeout: float | None = None) -> WriteOutcome:
        """What became of a write whose caller got UnknownOutcomeError (``err.write_id``).

        Without ``timeout`` it answers from what this instance knows now (no I/O). With one, a
        PENDING write is settled if the log can be read: a catch-up finds it (LANDED) or shows a
        newer epoch without it; failing that, the writer is taken, and its EPOCH record proves
        that the write, not found before it, can never land (NOT_LANDED).

        Retrying safely after UnknownOutcomeError: send the write again only on NOT_LANDED; on
        LANDED it is applied already; on PENDING ask again later (the back end is unreachable or
        the timeout too short). Sending it again while PENDING may apply it twice.

        :returns: LANDED, NOT_LANDED, PENDING, or UNKNOWN (not a write of this instance that
            was reported unknown, or forgotten).
        """
        writer_id, seq = write_id
        if writer_id != self.writer_id:
            return WriteOutcome.UNKNOWN
        outcomes = self._replica.outcomes
        state = outcomes.known(seq)
        if state is not WriteOutcome.PENDING or timeout is None:
            return state
        deadline = deadline_of(timeout)
        try:
            self.read(lambda s: None, latest=True, timeout=timeout)
            if outcomes.known(seq) is WriteOutcome.PENDING:
                self._submit(None, None, retry=True, probe=True, timeout=time_left(deadline))
        except PulsarStateError as exc:
            log.info("%s: write %d not settled yet: %s", self.topic, seq, exc)
        return outcomes.known(seq)

    def checkpoint(self) -> CheckpointInfo | None:
        """Checkpoint the state as of the tail now; returns the manifest (None: the log has no data yet).

        Any instance may call it, writer or not: the image is taken under the state lock, so it
        is the state at exactly one offset. Blocks until the image and its manifest are stored.

        :raises ConfigurationError: the manager has no ``state_serializer``.
        :raises CheckpointError: it could not be stored (the log and the state are unaffected).
        """
        return self._checkpointing.checkpoint()

    def _enqueue(
        self,
        generator: Any,
        reader: Any,
        *,
        retry: bool,
        barrier: bool = False,
        probe: bool = False,
        lease: Fence | None = None,
        fence_tag: tuple[str, str, int] | None = None,
    ) -> PendingWrite:
        fence = self._resolve_fence(lease) if lease is not None else fence_tag
        w = self._committer.enqueue(generator, reader, retry=retry, barrier=barrier, probe=probe, fence=fence)
        self._following.ensure_alive()
        return w

    def _resolve_fence(self, lease: Fence) -> tuple[str, str, int]:
        return self._replica.fences.resolve(lease)

    def _submit(self, generator: Any, reader: Any, *, timeout: float | None, **options: Any) -> Any:
        """Queue a write and wait (at most ``timeout``) for its result."""
        return self._committer.await_result(self._enqueue(generator, reader, **options), timeout)
