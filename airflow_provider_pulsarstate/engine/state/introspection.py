"""Read-only views of a manager's parts: the options it was built with, and what its background parts are doing."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from airflow_provider_pulsarstate.engine.checkpoint import CheckpointStore
from airflow_provider_pulsarstate.engine.state.committer import Committer
from airflow_provider_pulsarstate.engine.state.custody import WriterCustody
from airflow_provider_pulsarstate.engine.state.replica import Replica
from airflow_provider_pulsarstate.engine.state.workers import Checkpointer, Follower
from airflow_provider_pulsarstate.engine.wal import CorruptPolicy


class ManagerIntrospection:
    """Mixed into :class:`~airflow_provider_pulsarstate.engine.manager.SharedStateManager`: the
    constructor's options (read-only: they are the parts' settings), and what its background parts
    are doing (listeners, follow thread), for tests and tools."""

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
