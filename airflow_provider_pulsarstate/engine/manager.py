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

Locks: the state lock (``_lock``) may be held while taking the queue's condition (``_cv``), never
the other way round (a listener runs under the state lock and may call :meth:`write_async`).
"""

from __future__ import annotations

import contextlib
import gc
import itertools
import json
import logging
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor, wait
from concurrent.futures import TimeoutError as FutureTimeoutError
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from airflow_provider_pulsarstate.engine.backends.base import EARLIEST, AcquireMode, Backend
from airflow_provider_pulsarstate.engine.checkpoint import CheckpointInfo, CheckpointStore
from airflow_provider_pulsarstate.engine.envelope import FenceTag, RecordKind, decode_fenced_writes, encode_write
from airflow_provider_pulsarstate.engine.errors import (
    BackendUnavailableError,
    CheckpointError,
    ClosedError,
    ConfigurationError,
    CorruptEntryError,
    LeaseFencedError,
    LogLostError,
    OperationTimeoutError,
    PulsarStateError,
    SerializationError,
    UnknownOutcomeError,
    WriteId,
    WriterFencedError,
)
from airflow_provider_pulsarstate.engine.fencing import (
    ANY_LEASE_LOG,
    Fence,
    FenceKey,
    check_fence,
    check_lease_log,
    check_lease_name,
    reset_matches,
)
from airflow_provider_pulsarstate.engine.genesis import new_genesis_body, parse_genesis, read_beginning
from airflow_provider_pulsarstate.engine.grants import LeaseGrants
from airflow_provider_pulsarstate.engine.progress_report import Progress
from airflow_provider_pulsarstate.engine.wal import (
    DEFAULT_MAX_FRAME_BYTES,
    CorruptPolicy,
    LogReader,
    LogRecord,
    LogWriter,
    open_writer,
)
from airflow_provider_pulsarstate.engine.writes import OutcomeBook, PendingWrite, WriteOutcome

log = logging.getLogger(__name__)

CHECKPOINT_TAIL_RATIO = 4
"""Automatic checkpoints come after at least 1/4 of the last image's size in new log: the tail a
bootstrap replays stays small next to the image, and writing images costs at most ~4x the log."""

S = TypeVar("S")
O = TypeVar("O")
R = TypeVar("R")


@dataclass(frozen=True, slots=True)
class Change(Generic[O]):
    """One applied op, as change listeners receive it."""

    offset: int
    op: O
    publish_time: float


ListenerErrorHandler = Callable[[BaseException, "Change[Any]"], None]


def json_op_serializer(op: Any) -> bytes:
    """Default op serializer: compact JSON with sorted keys."""
    return json.dumps(op, separators=(",", ":"), sort_keys=True).encode()


def json_op_deserializer(data: bytes) -> Any:
    """Default op deserializer."""
    return json.loads(data)


class SharedStateManager(Generic[S, O]):
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
        size (:data:`CHECKPOINT_TAIL_RATIO`), so image writes stay proportional to the log. The image
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
        if handover_check_interval is not None and handover_check_interval <= 0:
            raise ConfigurationError(
                f"handover_check_interval must be positive or None, got {handover_check_interval!r}"
            )
        if checkpoint_after_bytes is not None and (state_serializer is None or checkpoint_after_bytes <= 0):
            raise ConfigurationError(
                "checkpoint_after_bytes needs a state_serializer and a positive size, got "
                f"{checkpoint_after_bytes!r} with state_serializer={state_serializer!r}"
            )
        self.backend = backend
        self.topic = topic
        self.writer_id = uuid.uuid4().bytes
        self._initializer = initializer
        self._applier = applier
        self._serialize_op = op_serializer
        self._deserialize_op = op_deserializer
        self.acquire_mode = AcquireMode(acquire_mode)
        self.acquire_timeout = acquire_timeout
        self.operation_timeout = operation_timeout
        self.writer_idle_timeout = writer_idle_timeout
        self.handover_check_interval = handover_check_interval
        self.max_retries = max_retries
        self.max_group_writes = max_group_writes
        self.max_frame_bytes = max_frame_bytes
        self.on_corrupt = on_corrupt
        self.progress_interval = progress_interval
        self.writer_name = writer_name

        self._lock = threading.RLock()  # state, reader, writer, offsets
        self._state: Any = None
        self._fences: dict[FenceKey, int] = {}  # (lease log, lease name) -> highest token applied (part of the state)
        self._grants = LeaseGrants(backend, topic, operation_timeout=operation_timeout)
        self._reader: LogReader | None = None
        self._writer: LogWriter | None = None
        self._applied_offset = -1
        self._applying_offset = -1
        self._notified_offset = -1
        self._broken = True  # no state yet: (re)build on first use
        self._inflight: dict[int, PendingWrite] = {}  # sent, not yet acknowledged or found in the log
        self._outcomes = OutcomeBook()  # writes reported unknown to their callers, until settled
        self._listeners: list[tuple[Callable[[Change[O]], None], ListenerErrorHandler | None]] = []
        self._listeners_lock = threading.Lock()
        self._replay_paused = False  # a bootstrap cut short by a caller's timeout; the next use goes on

        self._seq = itertools.count(1)
        self._queue: deque[PendingWrite] = deque()
        self._last_submitted: Future[Any] | None = None
        self._cv = threading.Condition()
        self._committer: threading.Thread | None = None
        self._last_write = time.monotonic()
        self._closed = False
        self._read_pool: ThreadPoolExecutor | None = None
        self._follow_interval = follow_interval
        self._follower: threading.Thread | None = None
        self._stop = threading.Event()
        self._serialize_state = state_serializer
        self._deserialize_state = state_deserializer if use_checkpoints else None
        self.checkpoint_after_bytes = checkpoint_after_bytes
        self.checkpoints = CheckpointStore(backend, topic, max_frame_bytes=max_frame_bytes, timeout=operation_timeout)
        self._applied_position: Any = EARLIEST
        self._applied_epoch = -1
        self._log_id: str | None = None  # the log's GENESIS id (None: empty or legacy log)
        self._bytes_since_checkpoint = 0
        self._last_checkpoint_size = 0
        self._checkpointer: threading.Thread | None = None
        self.stats = {
            "records_appended": 0,
            "writes_committed": 0,
            "acquisitions": 0,
            "rebuilds": 0,
            "retries": 0,
            "records_replayed": 0,
            "checkpoints_written": 0,
            "checkpoint_loaded_offset": -1,
            "corrupt_skipped": 0,
            "fenced_skipped": 0,
            "unknown_outcomes": 0,
            "listener_errors": 0,
            "follower_errors": 0,
            "committer_errors": 0,
            "handovers": 0,
        }

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> SharedStateManager[S, O]:
        """Replay the log now (otherwise it happens on first use) and start following if asked."""
        with self._lock:
            self._ensure_state()
        if self._follow_interval is not None:
            self._start_follower()
        return self

    def close(self) -> None:
        """Stop background threads, fail queued writes with ClosedError, release writer and reader."""
        with self._cv:
            if self._closed:
                return
            self._closed = True
            self._cv.notify_all()
        self._stop.set()
        for name in ("_committer", "_follower", "_checkpointer"):  # the committer may start a checkpoint
            thread = getattr(self, name)
            if thread is not None and thread is not threading.current_thread():
                thread.join(timeout=self.operation_timeout + self.acquire_timeout)
        with self._cv:
            pending, self._queue = list(self._queue), deque()
        for w in pending:
            self._give_up(w, ClosedError(f"state manager of {self.topic} closed before the write was committed"))
        with self._lock:
            self._drop_writer()
            if self._reader is not None:
                self._reader.close()
                self._reader = None
        if self._read_pool is not None:
            self._read_pool.shutdown(wait=False)
        self._grants.close()

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
        with self._listeners_lock:
            self._listeners = [*self._listeners, (listener, on_error)]  # copied: _notify iterates the old list
        return listener

    def remove_listener(self, listener: Callable[[Change[O]], None]) -> bool:
        """Stop calling ``listener`` (one registration of it); False if it was not registered.

        Once this returns, the listener sees no op applied afterwards (it waits for an op being
        applied on another thread to finish).
        """
        with self._lock, self._listeners_lock:
            for i, (registered, _) in enumerate(self._listeners):
                if registered is listener or registered == listener:
                    self._listeners = self._listeners[:i] + self._listeners[i + 1 :]
                    return True
        return False

    @property
    def applied_offset(self) -> int:
        """Offset of the last record applied to the local state (-1 before any)."""
        return self._applied_offset

    @property
    def applying_offset(self) -> int:
        """While the applier runs: the offset of the record its op belongs to (for versioning)."""
        return self._applying_offset

    @property
    def log_id(self) -> str | None:
        """The log's GENESIS id once replayed (None: not replayed yet, empty, or older than GENESIS records)."""
        return self._log_id

    @property
    def holds_writer(self) -> bool:
        """Whether this instance currently holds the exclusive writer."""
        return self._writer is not None

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
        self._ensure_follower()
        if linearizable:
            return self._await(self._enqueue(None, reader, retry=True, barrier=True), timeout)
        deadline = _deadline(timeout)
        # writes complete in submission order; their outcome is the writer's business
        last = self._last_submitted if latest else None
        if last is not None and not last.done() and not wait([last], timeout=_left(deadline)).done:
            raise OperationTimeoutError(
                f"{self.topic}: this instance's earlier writes did not complete within {timeout:.1f}s"
            )
        left = _left(deadline)
        if not self._lock.acquire(timeout=-1 if left is None else left):
            raise OperationTimeoutError(
                f"{self.topic}: the local state stayed busy (an append or a catch-up) for {timeout:.1f}s"
            )
        try:
            self._ensure_state(deadline=deadline)
            if latest:
                self._catch_up(deadline=deadline)
            return reader(self._state)
        finally:
            self._lock.release()

    def read_async(self, reader: Callable[[S], R], *, latest: bool = False, linearizable: bool = False) -> Future[Any]:
        """:meth:`read` on a helper thread; returns a Future of the result."""
        if linearizable:
            return self._enqueue(None, reader, retry=True, barrier=True).future
        with self._cv:
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
        return self._await(self._enqueue(ops_generator, reader, retry=retry, lease=lease), timeout)

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
        with self._lock:
            return dict(self._fences)

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
        removed = self._await(self._enqueue(None, None, retry=True, fence_tag=(scope, name, 0)), timeout)
        return removed or {}

    def _resolve_fence(self, lease: Fence) -> FenceTag:
        """``(lease log ref, name, token)`` of a lease whose lease log granted its token.

        A token below this log's fence may come from a recreated lease log that this instance's
        replica predates: it is checked again on a fresh replica before the write is refused.
        """
        lease_log, name, token = check_fence(lease)
        ref = self._grants.verify(lease_log, name, token)
        if token < self._fences.get((ref, name), 0):
            ref = self._grants.verify(lease_log, name, token, fresh=True)
        return ref, name, token

    def _fence_check(self, w: PendingWrite) -> bool | None:
        """None: not under a lease; True: a token the log has not seen, or a reset (append it);
        False: the current token. Raises LeaseFencedError for an older token. Call with the state
        lock held."""
        if w.fence is None:
            return None
        ref, name, token = w.fence
        if token == 0:
            return True
        seen = self._fences.get((ref, name), 0)
        if token < seen:
            raise LeaseFencedError(topic=self.topic, lease=name, token=token, newer_token=seen)
        return token > seen

    def _take_fence(self, fence: FenceTag) -> dict[FenceKey, int]:
        """Record an admitted token, or apply a reset (token 0); returns the fences a reset removed."""
        ref, name, token = fence
        if token:
            self._fences[(ref, name)] = token
            return {}
        removed = {key: t for key, t in self._fences.items() if reset_matches(key, lease_log=ref, name=name)}
        for key in removed:
            del self._fences[key]
        log.warning("%s: fence of lease %r reset (lease log %s); removed %s", self.topic, name, ref, removed or "none")
        return removed

    def _admit_replayed(self, fence: FenceTag, seq: int, offset: int) -> LeaseFencedError | None:
        """The replay rule, the same on every replica: None (admitted, fence taken) or the refusal."""
        ref, name, token = fence
        seen = self._fences.get((ref, name), 0) if token else 0
        if token and token < seen:
            self.stats["fenced_skipped"] += 1
            refused = LeaseFencedError(topic=self.topic, lease=name, token=token, newer_token=seen)
            log.warning("%s: skipping write %d at offset %d: %s", self.topic, seq, offset, refused)
            return refused
        self._take_fence(fence)
        return None

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
        state = self._outcomes.known(seq)
        if state is not WriteOutcome.PENDING or timeout is None:
            return state
        deadline = _deadline(timeout)
        try:
            self.read(lambda s: None, latest=True, timeout=timeout)
            if self._outcomes.known(seq) is WriteOutcome.PENDING:
                self._await(self._enqueue(None, None, retry=True, probe=True), _left(deadline))
        except PulsarStateError as exc:
            log.info("%s: write %d not settled yet: %s", self.topic, seq, exc)
        return self._outcomes.known(seq)

    def _enqueue(
        self,
        generator: Any,
        reader: Any,
        *,
        retry: bool,
        barrier: bool = False,
        probe: bool = False,
        lease: Fence | None = None,
        fence_tag: FenceTag | None = None,
    ) -> PendingWrite:
        fence = self._resolve_fence(lease) if lease is not None else fence_tag
        w = PendingWrite(next(self._seq), generator, reader, retry, barrier, probe, fence=fence)
        w.future.write_id = WriteId(self.writer_id, w.seq)  # type: ignore[attr-defined]
        with self._cv:
            if self._closed:
                raise ClosedError(f"state manager of {self.topic} is closed")
            self._queue.append(w)
            self._last_submitted = w.future
            if self._committer is None or not self._committer.is_alive():
                if self._committer is not None:
                    log.warning("%s: the commit thread had stopped; starting a new one", self.topic)
                self._committer = threading.Thread(
                    target=self._commit_loop, name=f"pulsarstate-commit-{self.topic}", daemon=True
                )
                self._committer.start()
            self._cv.notify()
        self._ensure_follower()
        return w

    def _await(self, w: PendingWrite, timeout: float | None) -> Any:
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
        self._outcomes.abandon(w)
        if future.done():
            return future.result()
        raise UnknownOutcomeError(
            f"{self.topic}: write {w.seq} was being sent when the {timeout:.1f}s timeout ran out; it may or may "
            "not land: ask outcome(write_id) before sending it again",
            writer_id=self.writer_id,
            seq=w.seq,
        )

    # ------------------------------------------------------------------ committer
    def _commit_loop(self) -> None:
        batch: list[PendingWrite] = []
        try:
            next_check = 0.0  # the first check for waiters follows each commit at once
            while True:
                look = False  # at the idle writer: release it after its idle timeout or for a waiter
                with self._cv:
                    while not self._queue and not self._closed:
                        wait = self._idle_wait(next_check)
                        if wait is not None and wait <= 0:
                            look = True
                            break
                        self._cv.wait(timeout=wait)
                    if self._closed:
                        return
                    if not look:
                        batch = [self._queue.popleft() for _ in range(min(len(self._queue), self.max_group_writes))]
                if look:  # outside the condition (see "Locks" in the module docstring): may ask the back end
                    if self._writer_idle_too_long():
                        self._release_idle_writer()
                    elif self._writer_wanted():
                        self._release_idle_writer(handover=True)
                    next_check = time.monotonic() + (self.handover_check_interval or 0.0)
                    continue
                self._commit(batch)
                batch = []
                self._last_write = time.monotonic()
                next_check = 0.0
                self._maybe_checkpoint()
        except BaseException as exc:  # noqa: BLE001 - no write may wait forever on a dead thread
            self._commit_thread_failed(exc, batch)
            if not isinstance(exc, Exception):
                raise

    def _idle_wait(self, next_check: float) -> float | None:
        """With nothing queued: seconds to wait for work before looking at the held writer (0:
        now, its idle timeout ran out or a check for waiters is due; None: until work arrives, no
        writer is held or it is kept for good). Called under the queue's condition."""
        if self._writer is None:
            return None
        due: list[float] = []
        if self.writer_idle_timeout is not None:
            due.append(self._last_write + self.writer_idle_timeout)
        if self.handover_check_interval is not None:
            due.append(next_check)
        return max(0.0, min(due) - time.monotonic()) if due else None

    def _writer_idle_too_long(self) -> bool:
        idle = self.writer_idle_timeout
        return idle is not None and time.monotonic() >= self._last_write + idle

    def _writer_wanted(self) -> bool:
        """Whether another instance waits for the writer we hold (never raises)."""
        writer = self._writer  # read without the state lock: a closed writer answers False
        if writer is None or self.handover_check_interval is None:
            return False
        try:
            return writer.has_waiters()
        except Exception as exc:  # noqa: BLE001 - keeping the writer is always safe
            log.debug("%s: checking for waiting writers failed: %s", self.topic, _describe(exc))
            return False

    def _commit_thread_failed(self, exc: BaseException, batch: list[PendingWrite]) -> None:
        """Fail the batch and every queued write with ``exc``; the next write starts a new thread."""
        self.stats["committer_errors"] += 1
        log.error(
            "%s: the commit thread failed (%s); failing the pending writes", self.topic, _describe(exc), exc_info=exc
        )
        err = exc
        if not isinstance(exc, PulsarStateError):
            err = PulsarStateError(f"{self.topic}: the commit thread failed: {_describe(exc)}")
            err.__cause__ = exc
        with self._cv:
            pending, self._queue = list(self._queue), deque()
            self._committer = None
        with contextlib.suppress(Exception), self._lock:
            self._drop_writer()
        for w in [*batch, *pending]:
            with contextlib.suppress(Exception):
                self._give_up(w, err)

    def _release_idle_writer(self, *, handover: bool = False) -> None:
        """Let go of the held writer unless writes were queued meanwhile (``handover``: because
        another instance waits for it, rather than after ``writer_idle_timeout``)."""
        with self._lock:
            if self._writer is None:
                return
            with self._cv:
                if self._queue:
                    return  # work arrived meanwhile: keep the writer
            if handover:
                log.debug(
                    "%s: handing the writer (epoch %d) over to a waiting instance", self.topic, self._writer.epoch
                )
                self.stats["handovers"] += 1
            else:
                log.info("%s: releasing the idle writer (epoch %d)", self.topic, self._writer.epoch)
            self._drop_writer()

    def _commit(self, batch: list[PendingWrite]) -> None:
        attempt = 0
        while True:
            batch = [w for w in batch if not w.future.done()]
            if not batch:
                return
            if self._closed:
                for w in batch:
                    self._give_up(
                        w, ClosedError(f"state manager of {self.topic} closed before the write was committed")
                    )
                return
            try:
                self._commit_once(batch)
                return
            except _Restage:
                continue  # the state was rebuilt: take the writer and stage the writes again
            except (WriterFencedError, UnknownOutcomeError) as exc:
                attempt += 1
                self.stats["retries"] += 1
                log.warning("%s: write attempt %d failed (%s); looking for it in the log", self.topic, attempt, exc)
                try:
                    with self._lock:
                        self._drop_writer()
                        self._ensure_state()  # rebuilds if ops were applied; finds writes that did land
                except Exception as rebuild_exc:  # noqa: BLE001 - settled on the next attempt or given up below
                    log.warning("%s: could not re-read the log yet: %s", self.topic, rebuild_exc)
                for w in batch:
                    if not w.retry or attempt > self.max_retries:
                        self._give_up(w, exc)
            except BaseException as exc:  # noqa: BLE001 - every write must complete
                try:
                    with self._lock:
                        self._drop_writer()
                finally:
                    for w in batch:
                        self._give_up(w, exc)
                if not isinstance(exc, Exception):
                    raise
                return

    def _give_up(self, w: PendingWrite, exc: BaseException) -> None:
        """Complete a write with an error for good.

        A write that may have landed fails with UnknownOutcomeError naming it and stays pending
        (later catch-ups settle it); one that certainly did not never fails with
        UnknownOutcomeError, so that error always means "ask :meth:`outcome` before retrying".
        """
        with self._lock:
            self._inflight.pop(w.seq, None)
            if w.future.done():
                return
            if w.unknown:
                self._outcomes.unresolved(w)
                self.stats["unknown_outcomes"] += 1
                err: BaseException = UnknownOutcomeError(
                    f"{self.topic}: write {w.seq} was sent at epoch {w.epoch} and may or may not have landed; "
                    f"it could not be looked up ({_describe(exc)}). Ask outcome(write_id) before sending it again",
                    writer_id=self.writer_id,
                    seq=w.seq,
                )
                err.__cause__ = exc
            elif isinstance(exc, UnknownOutcomeError):  # e.g. the EPOCH record's: this write was never sent
                err = BackendUnavailableError(f"{self.topic}: write {w.seq} was not sent: {exc}")
                err.__cause__ = exc
            else:
                err = exc
            w.fail(err)

    def _commit_once(self, batch: list[PendingWrite]) -> None:
        """One attempt: settle what needs no writer, take it (without the state lock), stage, append."""
        writer: LogWriter | None = None
        if self._writer is None:
            with self._lock:
                self._ensure_state()
                self._catch_up()  # before taking the writer: only the short tail is read under it
                batch = self._settle_without_writer(batch)
            if not batch:
                return
            self._ensure_durable(strict=True)
            # Without the state lock: local reads go on while another instance holds the writer.
            writer = open_writer(
                self.backend,
                self.topic,
                writer_id=self.writer_id,
                mode=self.acquire_mode,
                timeout=self.acquire_timeout,
                max_frame_bytes=self.max_frame_bytes,
                name=self.writer_name,
            )
        with self._lock:
            try:
                self._ensure_state()  # a rebuild here drops the old writer, not the new one
                if self._closed:
                    raise ClosedError(f"state manager of {self.topic} closed before the write was committed")
                if writer is not None:
                    adopted, writer = writer, None
                    self._adopt_writer(adopted)
            finally:
                if writer is not None:
                    writer.close()
            if self._writer is None:
                raise _Restage()
            self._stage_and_append(batch)

    def _settle_without_writer(self, batch: list[PendingWrite]) -> list[PendingWrite]:
        """Complete, against the caught-up state, the writes that need no writer; return the rest.

        Going in order, a write whose generator or serializer fails is failed, and one with
        nothing to append completes, until the first write that needs the writer: it has ops
        (kept in ``prepared``), is a barrier or probe, or its earlier send is of unknown outcome.
        From there on every write must be generated after the earlier ones are applied, so
        the rest is left for the writer. So a rejected value never takes the writer.
        """
        for i, w in enumerate(batch):
            if w.future.done():
                continue
            if w.needs_writer:
                return batch[i:]
            try:
                new_token = self._fence_check(w)
                ops, payloads = self._generate(w)
            except Exception as exc:  # a stale lease, or the caller's generator or serializer: fail this write only
                w.fail(exc)
                continue
            if ops or new_token:
                w.prepared = (self._applied_offset, ops, payloads)
                return batch[i:]
            try:
                w.result = w.reader(self._state) if w.reader is not None else None
            except Exception as exc:
                w.fail(exc)
                continue
            w.succeed()
        return []

    def _stage_and_append(self, batch: list[PendingWrite]) -> None:
        """Generate, serialize and apply each write's ops, then append them as one record."""
        staged: list[tuple[PendingWrite, list[O], bytes, bool]] = []  # (write, ops, encoded write, sent)
        writer = self._writer
        assert writer is not None
        dirty = False  # ops of this record were applied: prepared ops of later writes are stale
        if any(w.unknown for w in batch):  # cannot be after _adopt_writer: a new epoch settles it first
            self._drop_writer()
            raise _Restage()
        for w in batch:
            self._inflight.pop(w.seq, None)  # from an earlier attempt, proven absent: sent again below or failed
        for w in batch:
            if w.abandoned and not w.unknown:  # its caller gave up before it was sent: never send it
                w.fail(
                    OperationTimeoutError(
                        f"{self.topic}: write {w.seq} timed out before it was sent; nothing was appended"
                    )
                )
                continue
            if not w.claim():
                continue  # cancelled by its caller's timeout, or done
            prepared, w.prepared = w.prepared, None
            try:
                new_token = self._fence_check(w)
                if prepared is not None and not dirty and prepared[0] == self._applied_offset:
                    ops, payloads = prepared[1], prepared[2]  # the state did not move since they were made
                else:
                    ops, payloads = self._generate(w)
                encoded = self._encode(w, payloads) if ops or new_token else b""
            except (
                Exception
            ) as exc:  # a stale lease, the caller's generator or serializer, an unencodable write: fail it only
                w.fail(exc)
                continue
            if ops or new_token:
                dirty = True
                self._broken = True  # until the append is acknowledged
                self._applying_offset = self._applied_offset + 1
                removed = self._take_fence(w.fence) if w.fence is not None else {}
                try:
                    for op in ops:
                        self._apply_op(op)
                    w.result = w.reader(self._state) if w.reader is not None else None
                    if w.fence is not None and w.fence[2] == 0:
                        w.result = removed  # a reset answers with what it removed
                except Exception as exc:
                    w.fail(exc)
                    raise _Restage() from exc
            else:
                try:
                    w.result = w.reader(self._state) if w.reader is not None else None
                except Exception as exc:
                    w.fail(exc)
                    continue
            staged.append((w, ops, encoded, bool(ops or new_token)))
        if not staged:
            return
        body = b"".join(encoded for _, _, encoded, sent in staged if sent)
        if any(sent for _, _, _, sent in staged):
            offset = self._applied_offset + 1
            for w, _, _, sent in staged:
                if sent:
                    self._inflight[w.seq] = w
            try:
                position = writer.append(RecordKind.DATA, body, offset=offset, timeout=self.operation_timeout)
            except (WriterFencedError, BackendUnavailableError):
                raise  # the back end says none of it can land
            except BaseException as exc:
                for w, _, _, sent in staged:
                    if sent:
                        w.unknown, w.epoch = True, writer.epoch
                if isinstance(exc, UnknownOutcomeError) or not isinstance(exc, Exception):
                    raise
                raise UnknownOutcomeError(
                    f"{self.topic}: append failed ({_describe(exc)}); it may or may not have landed"
                ) from exc
            self._advance(offset, position, writer.epoch, len(body))
            self._broken = False
            self.stats["records_appended"] += 1
            now = time.time()
            self._notify(offset, [op for _, ops, _, _ in staged for op in ops], now)
        elif any(w.barrier for w, _, _, _ in staged):
            writer.append(RecordKind.BARRIER, timeout=self.operation_timeout)
        for w, _, _, _ in staged:
            self._inflight.pop(w.seq, None)
            w.succeed()
        self.stats["writes_committed"] += len(staged)

    def _encode(self, w: PendingWrite, payloads: list[bytes]) -> bytes:
        """The write as it goes into the record body; SerializationError if it does not fit the format."""
        try:
            return encode_write(w.seq, payloads, w.fence)
        except Exception as exc:
            raise SerializationError(f"{self.topic}: write {w.seq} cannot be encoded: {_describe(exc)}") from exc

    def _generate(self, w: PendingWrite) -> tuple[list[O], list[bytes]]:
        """The write's ops from the current state, and their bytes (raises what the caller's code raises)."""
        ops = list(w.generator(self._state)) if w.generator is not None else []
        return ops, [self._serialize(op) for op in ops]

    def _serialize(self, op: O) -> bytes:
        try:
            data = self._serialize_op(op)
        except SerializationError:
            raise
        except Exception as exc:
            raise SerializationError(f"cannot serialize op {op!r} for {self.topic}: {exc}") from exc
        if not isinstance(data, (bytes, bytearray)):
            raise SerializationError(f"op serializer returned {type(data).__name__}, not bytes, for {op!r}")
        return bytes(data)

    # ------------------------------------------------------------------ state & log
    def _apply_op(self, op: O) -> None:
        new_state = self._applier(self._state, op)
        if new_state is not None:
            self._state = new_state

    def _ensure_state(self, *, deadline: float | None = None) -> None:
        """Build the state by replaying the log from the start when there is none (or it is suspect).

        :param deadline: (monotonic) a replay still running then stops with OperationTimeoutError;
            what was replayed is kept and the next call goes on from there.
        """
        if self._closed:
            raise ClosedError(f"state manager of {self.topic} is closed")
        if not self._broken:
            if self._replay_paused:
                self._resume_replay(deadline)
            return
        # Writes of unknown outcome would land right after the confirmed offset: a checkpoint
        # past it could hide them, and they would be sent twice. Replay from before them instead.
        limit = self._applied_offset if self._inflight or self._outcomes else None
        if self._reader is not None:
            self._reader.close()
            self._reader = None
            self.stats["rebuilds"] += 1
        self._drop_writer()
        self._bytes_since_checkpoint = 0
        self._broken = self._replay_paused = False
        try:
            self._ensure_durable(strict=False)
            beginning = read_beginning(self.backend, self.topic, timeout=self.operation_timeout)
            self._log_id = beginning.genesis.log_id if beginning.genesis is not None else None
            if beginning.empty:
                self._check_not_recreated()
            if not self._load_checkpoint(limit):
                self._reader = self._open_reader()
                self._state, self._fences = self._initializer(), {}
                self._applied_offset = -1
                self._applied_position, self._applied_epoch = EARLIEST, -1
            self._catch_up(bootstrap=True, deadline=deadline)
        except _ReplayPaused:
            self._replay_paused = True  # the state so far is a correct prefix of the log
            raise
        except BaseException:
            self._broken = True
            raise

    def _resume_replay(self, deadline: float | None) -> None:
        self._replay_paused = False
        try:
            self._catch_up(bootstrap=True, deadline=deadline)
        except BaseException:
            self._replay_paused = not self._broken
            raise

    def _open_reader(self, **options: Any) -> LogReader:
        """A reader of the log with this manager's policies (see the class docstring on forged epochs)."""
        return LogReader(
            self.backend,
            self.topic,
            on_corrupt=self.on_corrupt,
            on_forged_epoch="skip",
            on_skip=self._count_skip,
            **options,
        )

    def _count_skip(self, err: CorruptEntryError) -> None:
        self.stats["corrupt_skipped"] += 1

    def _ensure_durable(self, *, strict: bool) -> None:
        """Check (once per topic and back end) that the store keeps the log; a reader that cannot
        reach the admin API goes on with a warning, a writer does not."""
        try:
            self.backend.ensure_durable(self.topic)
        except BackendUnavailableError as exc:
            if strict:
                raise
            log.warning("%s: could not check its retention policies (%s); reading it anyway", self.topic, exc)

    def _check_not_recreated(self) -> None:
        """An empty log whose table has checkpoints was deleted (or recreated): fail loudly."""
        index = self.checkpoints.index_topic
        try:
            entry = self.backend.read_last(index, timeout=self.operation_timeout)
        except PulsarStateError as exc:
            log.warning(
                "%s: the log is empty and %s cannot be read (%s); treating it as a new table", self.topic, index, exc
            )
            return
        if entry is not None:
            raise LogLostError(
                topic=self.topic,
                found=f"the log is empty or missing, but {index} holds checkpoint manifests: the topic was deleted "
                "(retention or inactive-topic deletion) or recreated; restore it, or delete the checkpoint topics "
                "to start a new table",
            )

    def _load_checkpoint(self, limit: int | None) -> bool:
        """Start from the newest usable checkpoint; False (after logging why) to replay everything.

        Any defect of a manifest or image (or no access to them) means a full replay, never an
        exception and never an unchecked image.

        :raises LogLostError: the checkpoint belongs to another log of the same name (its log id
            differs from the log's GENESIS): the topic was recreated.
        """
        if self._deserialize_state is None:
            return False
        started = time.monotonic()
        try:
            info = self.checkpoints.latest()
        except Exception as exc:  # noqa: BLE001 - a checkpoint never stops a bootstrap
            return self._replay_instead(exc)
        if info is None:
            return False
        if info.log_id != self._log_id:
            raise LogLostError(
                topic=self.topic,
                found=f"its GENESIS log id is {self._log_id or 'absent'}, but the newest checkpoint "
                f"({info.data_topic}, offset {info.offset}) is of log {info.log_id or 'without a log id'}: the "
                "topic was recreated or lost its beginning; restore it, or delete the checkpoint topics to start "
                "a new table",
            )
        if limit is not None and info.offset > limit:
            log.info(
                "%s: not loading the checkpoint at offset %d: a write of unknown outcome may lie after offset %d; "
                "replaying the whole log to find it",
                self.topic,
                info.offset,
                limit,
            )
            return False
        try:
            self.checkpoints.verify(info)
            image = self.checkpoints.load(info)
            try:
                with _gc_paused():
                    state = self._deserialize_state(image)
            except Exception as exc:
                raise CheckpointError(
                    topic=self.topic, cause=f"image {info.data_topic} does not deserialize: {_describe(exc)}"
                ) from exc
            reader = self._open_reader(start=info.position, next_offset=info.offset + 1, max_epoch=info.epoch)
        except Exception as exc:  # noqa: BLE001 - a checkpoint never stops a bootstrap
            return self._replay_instead(exc)
        self._reader, self._state, self._fences = reader, state, dict(info.fences)
        self._applied_offset, self._applied_position, self._applied_epoch = info.offset, info.position, info.epoch
        self._notified_offset = max(self._notified_offset, info.offset)
        self._last_checkpoint_size = info.size
        self.stats["checkpoint_loaded_offset"] = info.offset
        elapsed = time.monotonic() - started
        log.info(
            "%s: loaded the checkpoint at offset %d (%s bytes, %.1f MB/s) in %.2fs; replaying the records after it",
            self.topic,
            info.offset,
            f"{info.size:,}",
            info.size / 1e6 / max(elapsed, 1e-9),
            elapsed,
        )
        return True

    def _replay_instead(self, exc: Exception) -> bool:
        cause = exc if isinstance(exc, PulsarStateError) else f"checkpoint: {_describe(exc)}"
        log.warning("%s; replaying the whole log of %s instead", cause, self.topic)
        return False

    # ------------------------------------------------------------------ checkpoints
    def checkpoint(self) -> CheckpointInfo | None:
        """Checkpoint the state as of the tail now; returns the manifest (None: the log has no data yet).

        Any instance may call it, writer or not: the image is taken under the state lock, so it
        is the state at exactly one offset. Blocks until the image and its manifest are stored.

        :raises ConfigurationError: the manager has no ``state_serializer``.
        :raises CheckpointError: it could not be stored (the log and the state are unaffected).
        """
        if self._serialize_state is None:
            raise ConfigurationError(f"{self.topic}: checkpoints need a state_serializer")
        with self._lock:
            self._ensure_state()
            self._catch_up()
            image = self._take_image()
        return None if image is None else self._store_image(image)

    def _take_image(self) -> tuple[int, int, Any, bytes, dict[FenceKey, int]] | None:
        """(offset, epoch, position, serialized state, fences); call with the state lock held."""
        if self._applied_offset < 0:
            return None
        assert self._serialize_state is not None  # checked by checkpoint() and __init__
        try:
            data = self._serialize_state(self._state)
        except Exception as exc:
            raise CheckpointError(topic=self.topic, cause=f"the state does not serialize: {_describe(exc)}") from exc
        if not isinstance(data, (bytes, bytearray)):
            raise CheckpointError(topic=self.topic, cause=f"state_serializer returned {type(data).__name__}, not bytes")
        self._bytes_since_checkpoint = 0
        return self._applied_offset, self._applied_epoch, self._applied_position, bytes(data), dict(self._fences)

    def _store_image(self, image: tuple[int, int, Any, bytes, dict[FenceKey, int]]) -> CheckpointInfo:
        offset, epoch, position, data, fences = image
        info = self.checkpoints.save(
            offset=offset, epoch=epoch, position=position, data=data, log_id=self._log_id, fences=fences
        )
        self._last_checkpoint_size = info.size
        self.stats["checkpoints_written"] += 1
        return info

    def _maybe_checkpoint(self) -> None:
        """After a commit: start a background checkpoint when enough log was added since the last."""
        after = self.checkpoint_after_bytes
        if after is None or self._writer is None:
            return
        if self._bytes_since_checkpoint < max(after, self._last_checkpoint_size // CHECKPOINT_TAIL_RATIO):
            return
        if self._checkpointer is not None and self._checkpointer.is_alive():
            return
        try:
            with self._lock:
                if self._broken or self._writer is None:
                    return
                image = self._take_image()
        except CheckpointError as exc:
            log.warning("automatic %s", exc)
            return
        if image is None:
            return

        def store() -> None:
            try:
                self._store_image(image)
            except Exception as exc:  # noqa: BLE001 - derived data: the log is unaffected
                log.warning(
                    "%s: automatic checkpoint at offset %d failed: %s",
                    self.topic,
                    image[0],
                    _describe(exc),
                    exc_info=not isinstance(exc, PulsarStateError),
                )

        self._checkpointer = threading.Thread(target=store, name=f"pulsarstate-checkpoint-{self.topic}", daemon=True)
        self._checkpointer.start()

    def _adopt_writer(self, writer: LogWriter) -> None:
        """Hold ``writer`` and read up to its own EPOCH record (the tail left since the catch-up)."""
        self._writer = writer
        self.stats["acquisitions"] += 1
        epoch = writer.epoch
        reader = self._reader
        assert reader is not None
        reader.confirm_epoch(epoch)  # granted to us just now: no need to ask the back end
        deadline = time.monotonic() + self.operation_timeout
        while True:
            record = reader.read_next(timeout=max(0.001, deadline - time.monotonic()))
            if record is None:
                self._drop_writer()
                raise OperationTimeoutError(
                    f"{self.topic}: did not read back our own epoch {epoch} record within {self.operation_timeout:.1f}s"
                )
            self._take_record(record)
            if reader.max_epoch > epoch:
                # The back end reported an epoch lower than one already in the log: our frames
                # would be skipped as a fenced writer's. Let go and take the writer again.
                self._drop_writer()
                raise WriterFencedError(
                    f"{self.topic}: the writer was granted epoch {epoch}, but the log already holds epoch "
                    f"{reader.max_epoch}"
                )
            if record.kind is RecordKind.EPOCH and record.writer_id == self.writer_id and record.epoch == epoch:
                log.debug("%s: writer at epoch %d caught up to offset %d", self.topic, epoch, self._applied_offset)
                break
        if self._log_id is None and self._applied_offset < 0:
            # The first writer of an empty log: the GENESIS record goes before any DATA. A
            # concurrent first writer's GENESIS, if any landed first, was read above.
            body = new_genesis_body()
            writer.append(RecordKind.GENESIS, body, timeout=self.operation_timeout)
            self._log_id = json.loads(body)["log_id"]
            log.info("%s: new log %s started", self.topic, self._log_id)

    def _drop_writer(self) -> None:
        writer, self._writer = self._writer, None
        if writer is not None:
            try:
                writer.close()
            except Exception as exc:  # noqa: BLE001 - it is dropped either way
                log.warning("%s: closing the writer of epoch %d failed: %s", self.topic, writer.epoch, _describe(exc))

    def _catch_up(self, *, bootstrap: bool = False, deadline: float | None = None) -> None:
        """Read and apply everything up to the tail as it is now (stopping at ``deadline``, if given)."""
        reader = self._reader
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
                    raise _ReplayPaused(
                        f"{self.topic}: read up to offset {self._applied_offset}, not yet to the tail, within the timeout"
                    )
            record = reader.read_next(timeout=wait_s, drain=True)
            if record is None:
                if deadline is not None and time.monotonic() >= deadline and reader.has_next():
                    # the deadline cut the wait short, the tail was not reached: never serve the
                    # prefix read so far as the whole log
                    raise _ReplayPaused(
                        f"{self.topic}: read up to offset {self._applied_offset}, not yet to the tail, within the timeout"
                    )
                break
            self._take_record(record)
            progress.tick(offset=self._applied_offset)
        progress.done(offset=self._applied_offset)

    def _take_record(self, record: LogRecord) -> None:
        self._apply_record(record)
        if self._inflight or self._outcomes:
            self._settle_pending(record.epoch)

    def _settle_pending(self, epoch: int) -> None:
        """A record of ``epoch`` was read: writes sent at older epochs and not found so far never land
        (readers skip a frame of an older epoch after a newer one)."""
        for w in self._inflight.values():
            if w.unknown and w.epoch is not None and w.epoch < epoch:
                w.unknown = False  # proven absent: it may be generated and sent again
        if self._outcomes:
            for seq in self._outcomes.epoch_began(epoch):
                log.info(
                    "%s: write %d did not land (epoch %d began without it); it is safe to send again",
                    self.topic,
                    seq,
                    epoch,
                )

    def _apply_record(self, record: LogRecord) -> None:
        if record.kind is RecordKind.GENESIS and self._log_id is None and self._applied_offset < 0:
            self._log_id = parse_genesis(record, self.topic).log_id  # only the first GENESIS counts
            return
        if record.kind is not RecordKind.DATA or record.offset <= self._applied_offset:
            return
        try:
            writes = [
                (seq, [self._deserialize_op(p) for p in ops], fence)
                for seq, ops, fence in decode_fenced_writes(record.body)
            ]
        except Exception as exc:  # FrameError or the op deserializer rejecting the entry
            err = CorruptEntryError(topic=self.topic, position=f"offset {record.offset}", cause=_describe(exc))
            if self.on_corrupt == "raise":
                self._broken = True  # stop here; the next use replays again and stops again
                raise err from exc
            log.error("skipping %s (on_corrupt='skip')", err)
            self.stats["corrupt_skipped"] += 1
            self._record_applied(record)
            return
        mine = record.writer_id == self.writer_id
        self._applying_offset = record.offset
        applied_ops: list[O] = []
        for seq, ops, fence in writes:
            refused = self._admit_replayed(fence, seq, record.offset) if fence is not None else None
            if refused is None:
                try:
                    for op in ops:
                        self._apply_op(op)
                except Exception as exc:
                    self._broken = True
                    raise CorruptEntryError(
                        topic=self.topic, position=f"offset {record.offset}", cause=f"applier failed: {_describe(exc)}"
                    ) from exc
                applied_ops.extend(ops)
            if not mine:
                continue
            w = self._inflight.pop(seq, None)
            if w is not None:  # our own write whose acknowledgement was lost: it did land
                log.info(
                    "%s: write %d found in the log at offset %d; not sending it again", self.topic, seq, record.offset
                )
                if refused is not None:
                    w.fail(refused)
                    continue
                try:
                    w.result = w.reader(self._state) if w.reader is not None else None
                    w.succeed()
                except Exception as exc:
                    w.fail(exc)
            elif self._outcomes and self._outcomes.found(seq):
                log.info("%s: write %d, reported unknown, landed at offset %d", self.topic, seq, record.offset)
        self._record_applied(record)
        if self._listeners:
            self._notify(record.offset, applied_ops, record.publish_time)
        else:
            self._notified_offset = max(self._notified_offset, record.offset)

    def _record_applied(self, record: LogRecord) -> None:
        self._advance(record.offset, record.position, record.epoch, len(record.body))
        self.stats["records_replayed"] += 1

    def _advance(self, offset: int, position: Any, epoch: int, size: int) -> None:
        """A DATA record is applied: where a checkpoint taken now would resume the log."""
        self._applied_offset = offset
        self._applied_position, self._applied_epoch = position, epoch
        self._bytes_since_checkpoint += size

    def _notify(self, offset: int, ops: list[O], publish_time: float) -> None:
        if offset <= self._notified_offset:
            return
        self._notified_offset = offset
        for listener, on_error in self._listeners:
            for op in ops:
                change = Change(offset, op, publish_time)
                try:
                    listener(change)
                except Exception as exc:
                    self.stats["listener_errors"] += 1
                    log.error(
                        "%s: change listener %r failed at offset %d: %s",
                        self.topic,
                        listener,
                        offset,
                        _describe(exc),
                        exc_info=exc,
                    )
                    if on_error is not None:
                        try:
                            on_error(exc, change)
                        except Exception:
                            log.exception(
                                "%s: the error handler of listener %r failed at offset %d", self.topic, listener, offset
                            )

    # ------------------------------------------------------------------ follower
    def _start_follower(self) -> None:
        with self._cv:
            if self._closed or (self._follower is not None and self._follower.is_alive()):
                return
            if self._follower is not None:
                log.warning("%s: the follow thread had stopped; starting a new one", self.topic)
            self._follower = threading.Thread(target=self._follow, name=f"pulsarstate-follow-{self.topic}", daemon=True)
            self._follower.start()

    def _ensure_follower(self) -> None:
        """Start the follow thread again if it was started and has died."""
        follower = self._follower
        if follower is not None and not follower.is_alive() and not self._closed:
            self._start_follower()

    def _follow(self) -> None:
        interval = self._follow_interval or 0.1
        delay = interval
        while not self._stop.wait(delay):
            try:
                with self._lock:
                    self._ensure_state()
                    self._catch_up()
                delay = interval
            except Exception as exc:  # noqa: BLE001 - a follower never dies silently
                if self._closed:
                    return
                self.stats["follower_errors"] += 1
                delay = min(max(2 * delay, interval), 5.0)
                log.warning(
                    "%s: follower could not catch up (%s); trying again in %.1fs",
                    self.topic,
                    _describe(exc),
                    delay,
                    exc_info=exc if not isinstance(exc, PulsarStateError) else None,
                )


class _Restage(PulsarStateError):
    """Internal: the state was rebuilt (or the applier failed on a fresh op); take the writer and stage again."""


class _ReplayPaused(OperationTimeoutError):
    """Internal: a catch-up reached its caller's deadline; what was applied stays applied."""


def _deadline(timeout: float | None) -> float | None:
    return None if timeout is None else time.monotonic() + max(0.0, timeout)


def _left(deadline: float | None) -> float | None:
    return None if deadline is None else max(0.0, deadline - time.monotonic())


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    """No cyclic GC while building a large state: the objects made are not garbage, and CPython
    would otherwise traverse the young heap again and again (it doubled the load time of a
    1M-key image)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"
