"""Read-only views of a manager's parts: the options it was built with, and what its background parts are doing."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from airflow_provider_pulsarstate.engine.backends.base import AcquireMode
from airflow_provider_pulsarstate.engine.checkpoint import CheckpointStore
from airflow_provider_pulsarstate.engine.state.committer import Committer
from airflow_provider_pulsarstate.engine.state.custody import WriterCustody
from airflow_provider_pulsarstate.engine.state.replica import Replica, ReplicaState
from airflow_provider_pulsarstate.engine.state.workers import Checkpointer, Follower
from airflow_provider_pulsarstate.engine.wal import CorruptPolicy


class ManagerIntrospection:
    """Mixed into :class:`~airflow_provider_pulsarstate.engine.manager.SharedStateManager`: the
    constructor's options (read-only: they are the parts' settings), where the replica and the
    writer stand, and what its background parts are doing (listeners, follow thread), for tests
    and tools."""

    _replica: Replica[Any, Any]
    _custody: WriterCustody
    _committer: Committer
    _checkpointing: Checkpointer
    _following: Follower

    @property
    def checkpoints(self) -> CheckpointStore:
        """Where checkpoints are loaded from and stored; may be replaced before first use (a feed
        replaces it with one that reads manifests only)."""
        return self._replica.checkpoints

    @checkpoints.setter
    def checkpoints(self, store: CheckpointStore) -> None:
        self._replica.checkpoints = store
        self._checkpointing.store = store

    @property
    def acquire_mode(self) -> AcquireMode:
        return self._custody.mode

    @property
    def writer_name(self) -> str | None:
        """The name this instance's writer shows as leader of the topic (None: a generated one)."""
        return self._custody.name

    @property
    def operation_timeout(self) -> float:
        return self._replica.operation_timeout

    @property
    def acquire_timeout(self) -> float:
        return self._custody.acquire_timeout

    @property
    def max_frame_bytes(self) -> int:
        return self._custody.max_frame_bytes

    @property
    def writer_idle_timeout(self) -> float | None:
        return self._committer.writer_idle_timeout

    @property
    def handover_check_interval(self) -> float | None:
        return self._committer.handover_check_interval

    @property
    def max_retries(self) -> int:
        return self._committer.max_retries

    @property
    def max_group_writes(self) -> int:
        return self._committer.max_group_writes

    @property
    def on_corrupt(self) -> CorruptPolicy:
        return self._replica.on_corrupt

    @property
    def progress_interval(self) -> float:
        return self._replica.progress_interval

    @property
    def checkpoint_after_bytes(self) -> int | None:
        return self._checkpointing.after_bytes

    @property
    def state_serializer(self) -> Callable[[Any], bytes] | None:
        """The ``state_serializer`` checkpoint images are made with (None: no checkpoints);
        ``manager.read(manager.state_serializer)`` is the image a checkpoint taken now would hold."""
        return self._checkpointing.serializer

    # ------------------------------------------------------------------ where the replica and the writer stand
    @property
    def status(self) -> ReplicaState:
        """Where the local replica stands (EMPTY before the first replay, LIVE, PAUSED, BROKEN, CLOSED)."""
        return self._replica.status

    @property
    def applied_offset(self) -> int:
        """Offset of the last record applied to the local state (-1 before any)."""
        return self._replica.applied_offset

    @property
    def applying_offset(self) -> int:
        """While the applier runs: the offset of the record its op belongs to (for versioning)."""
        return self._replica.applying_offset

    @property
    def log_id(self) -> str | None:
        """The log's GENESIS id once replayed (None: not replayed yet, empty, or older than GENESIS records)."""
        return self._replica.log_id

    @property
    def holds_writer(self) -> bool:
        """Whether this instance currently holds the exclusive writer."""
        return self._custody.held

    # ------------------------------------------------------------------ what the background parts are doing
    @property
    def listener_count(self) -> int:
        """How many listeners are registered now (one per :meth:`add_listener` not yet removed)."""
        return len(self._replica.listeners.registered)

    @property
    def follower_alive(self) -> bool:
        """Whether the background follow thread (``follow_interval``) is running now; False before
        :meth:`start`, after :meth:`close`, or when it died and no call has replaced it yet."""
        thread = self._following.thread
        return thread is not None and thread.is_alive()

    # ------------------------------------------------------------------ internals, for benchmarks
    @property
    def _checkpointer(self) -> threading.Thread | None:
        return self._checkpointing.thread
