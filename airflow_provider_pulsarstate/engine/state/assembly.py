"""A manager's options, checked once, the parts wired from them, and their shut-down in order."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Generic, TypeVar

from airflow_provider_pulsarstate.engine.backends.base import AcquireMode, Backend
from airflow_provider_pulsarstate.engine.checkpoint import CheckpointStore
from airflow_provider_pulsarstate.engine.errors import ConfigurationError
from airflow_provider_pulsarstate.engine.grants import LeaseGrants
from airflow_provider_pulsarstate.engine.state.committer import Committer
from airflow_provider_pulsarstate.engine.state.custody import WriterCustody
from airflow_provider_pulsarstate.engine.state.fence_book import FenceBook
from airflow_provider_pulsarstate.engine.state.listeners import Listeners
from airflow_provider_pulsarstate.engine.state.ops import OpCodec
from airflow_provider_pulsarstate.engine.state.replica import Replica, ReplicaState
from airflow_provider_pulsarstate.engine.state.staging import Stager
from airflow_provider_pulsarstate.engine.state.stats import ManagerStats
from airflow_provider_pulsarstate.engine.state.workers import Checkpointer, Follower
from airflow_provider_pulsarstate.engine.wal import CorruptPolicy

S = TypeVar("S")
O = TypeVar("O")


@dataclass(frozen=True, kw_only=True)
class ManagerOptions(Generic[S, O]):
    """The constructor options of :class:`~airflow_provider_pulsarstate.engine.manager.SharedStateManager`
    (documented there); construction refuses inconsistent ones with ConfigurationError."""

    initializer: Callable[[], S]
    applier: Callable[[S, O], S | None]
    op_serializer: Callable[[O], bytes]
    op_deserializer: Callable[[bytes], O]
    acquire_mode: AcquireMode | str
    acquire_timeout: float
    operation_timeout: float
    writer_idle_timeout: float | None
    handover_check_interval: float | None
    max_retries: int
    max_group_writes: int
    max_frame_bytes: int
    on_corrupt: CorruptPolicy
    follow_interval: float | None
    progress_interval: float
    state_serializer: Callable[[S], bytes] | None
    state_deserializer: Callable[[bytes], S] | None
    checkpoint_after_bytes: int | None
    use_checkpoints: bool
    writer_name: str | None

    def __post_init__(self) -> None:
        if self.handover_check_interval is not None and self.handover_check_interval <= 0:
            raise ConfigurationError(
                f"handover_check_interval must be positive or None, got {self.handover_check_interval!r}"
            )
        after_bytes = self.checkpoint_after_bytes
        if after_bytes is not None and (self.state_serializer is None or after_bytes <= 0):
            raise ConfigurationError(
                "checkpoint_after_bytes needs a state_serializer and a positive size, got "
                f"{after_bytes!r} with state_serializer={self.state_serializer!r}"
            )


@dataclass(frozen=True)
class ManagerParts(Generic[S, O]):
    """The parts of one manager, wired together by :func:`assemble`."""

    stats: ManagerStats
    custody: WriterCustody
    replica: Replica[S, O]
    checkpointing: Checkpointer
    committer: Committer
    following: Follower
    stop: threading.Event

    def close(self, *, join_timeout: float, read_pool: Callable[[], ThreadPoolExecutor | None]) -> None:
        """Move the replica to CLOSED (once: later calls do nothing), stop the background threads
        (each joined at most ``join_timeout``), fail the queued writes with ClosedError, release
        writer, reader and the pool ``read_pool()`` returns then."""
        with self.committer.cv:
            if self.replica.closed:
                return
            self.replica.transition(ReplicaState.CLOSED)
            self.committer.cv.notify_all()
        self.stop.set()
        threads: list[Callable[[], threading.Thread | None]] = [
            lambda: self.committer.thread,
            lambda: self.following.thread,
            lambda: self.checkpointing.thread,  # read after the committer stopped: it may start one
        ]
        for current in threads:
            thread = current()
            if thread is not None and thread is not threading.current_thread():
                thread.join(timeout=join_timeout)
        self.committer.fail_queued()
        with self.replica.lock:
            self.custody.drop()
            self.replica.close_reader()
        pool = read_pool()
        if pool is not None:
            pool.shutdown(wait=False)
        self.replica.fences.grants.close()


def assemble(backend: Backend, topic: str, options: ManagerOptions[S, O]) -> ManagerParts[S, O]:
    """Build the parts of a manager of ``topic`` (no I/O), under a new unique writer id."""
    stats = ManagerStats()
    mode = AcquireMode(options.acquire_mode)  # a bad mode fails before anything is built
    checkpoints = CheckpointStore(
        backend, topic, max_frame_bytes=options.max_frame_bytes, timeout=options.operation_timeout
    )
    custody = WriterCustody(
        backend,
        topic,
        writer_id=uuid.uuid4().bytes,
        mode=mode,
        acquire_timeout=options.acquire_timeout,
        operation_timeout=options.operation_timeout,
        max_frame_bytes=options.max_frame_bytes,
        name=options.writer_name,
        stats=stats,
    )
    replica = _replica(backend, topic, options, custody, checkpoints, stats)
    checkpointing = Checkpointer(
        replica,
        custody,
        checkpoints,
        serializer=options.state_serializer,
        after_bytes=options.checkpoint_after_bytes,
    )
    committer = Committer(
        replica,
        custody,
        Stager(replica, custody, replica.codec, operation_timeout=options.operation_timeout),
        max_group_writes=options.max_group_writes,
        max_retries=options.max_retries,
        writer_idle_timeout=options.writer_idle_timeout,
        handover_check_interval=options.handover_check_interval,
        after_commit=checkpointing.maybe_start,
    )
    stop = threading.Event()
    following = Follower(replica, interval=options.follow_interval, stop=stop, lock=committer.cv)
    return ManagerParts(stats, custody, replica, checkpointing, committer, following, stop)


def _replica(
    backend: Backend,
    topic: str,
    options: ManagerOptions[S, O],
    custody: WriterCustody,
    checkpoints: CheckpointStore,
    stats: ManagerStats,
) -> Replica[S, O]:
    lock = threading.RLock()  # the state lock: state, reader, writer, offsets
    grants = LeaseGrants(backend, topic, operation_timeout=options.operation_timeout)
    return Replica(
        backend,
        topic,
        lock=lock,
        writer_id=custody.writer_id,
        initializer=options.initializer,
        applier=options.applier,
        codec=OpCodec(topic, options.op_serializer, options.op_deserializer),
        listeners=Listeners(topic, stats, lock),
        fences=FenceBook(topic, grants, stats),
        stats=stats,
        checkpoints=checkpoints,
        state_deserializer=options.state_deserializer if options.use_checkpoints else None,
        on_corrupt=options.on_corrupt,
        operation_timeout=options.operation_timeout,
        progress_interval=options.progress_interval,
        on_rebuild=custody.drop,
    )
