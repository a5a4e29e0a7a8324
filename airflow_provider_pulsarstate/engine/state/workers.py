"""Background work of a manager: the follow thread and checkpoints (on demand and automatic).

Neither fails silently: the follower logs and counts each failure (``stats["follower_errors"]``)
and keeps following; an automatic checkpoint that fails is logged (checkpoints are derived data:
the log and the state are unaffected).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

from airflow_provider_pulsarstate.engine.checkpoint import CheckpointInfo, CheckpointStore
from airflow_provider_pulsarstate.engine.errors import CheckpointError, ConfigurationError, PulsarStateError
from airflow_provider_pulsarstate.engine.fencing import FenceKey
from airflow_provider_pulsarstate.engine.state.custody import WriterCustody
from airflow_provider_pulsarstate.engine.state.replica import Replica, ReplicaState
from airflow_provider_pulsarstate.engine.state.support import describe

log = logging.getLogger(__name__)

CHECKPOINT_TAIL_RATIO = 4
"""Automatic checkpoints come after at least 1/4 of the last image's size in new log: the tail a
bootstrap replays stays small next to the image, and writing images costs at most ~4x the log."""

MAX_FOLLOW_BACKOFF = 5.0
"""Longest wait, in seconds, between the follower's attempts while catching up keeps failing."""


class Follower:
    """A thread that catches the replica up every ``interval`` seconds, so that the local state and
    change listeners follow other writers without a ``read(latest=True)``.

    :param lock: taken to start the thread; the manager closes under it, so no follower starts
        after the manager is closed.
    """

    def __init__(
        self,
        replica: Replica[Any, Any],
        *,
        interval: float | None,
        stop: threading.Event,
        lock: AbstractContextManager[Any],
    ) -> None:
        self.replica = replica
        self.interval = interval
        self.stop = stop
        self._lock = lock
        self.thread: threading.Thread | None = None

    def start(self) -> None:
        with self._lock:
            if self.replica.closed or (self.thread is not None and self.thread.is_alive()):
                return
            if self.thread is not None:
                log.warning("%s: the follow thread had stopped; starting a new one", self.replica.topic)
            self.thread = threading.Thread(
                target=self._run, name=f"pulsarstate-follow-{self.replica.topic}", daemon=True
            )
            self.thread.start()

    def ensure_alive(self) -> None:
        """Start the follow thread again if it was started and has died."""
        thread = self.thread
        if thread is not None and not thread.is_alive() and not self.replica.closed:
            self.start()

    def _run(self) -> None:
        replica = self.replica
        interval = self.interval or 0.1
        delay = interval
        while not self.stop.wait(delay):
            try:
                with replica.lock:
                    replica.ensure()
                    replica.catch_up()
                delay = interval
            except Exception as exc:  # noqa: BLE001 - a follower never dies silently
                if replica.closed:
                    return
                replica.stats.follower_errors += 1
                delay = min(max(2 * delay, interval), MAX_FOLLOW_BACKOFF)
                log.warning(
                    "%s: follower could not catch up (%s); trying again in %.1fs",
                    replica.topic,
                    describe(exc),
                    delay,
                    exc_info=exc if not isinstance(exc, PulsarStateError) else None,
                )


@dataclass(frozen=True, slots=True)
class _Image:
    """The state at one offset, serialized, with where the log resumes after it."""

    offset: int
    epoch: int
    position: Any
    data: bytes
    fences: dict[FenceKey, int]


class Checkpointer:
    """Stores images of the replica's state: on demand (:meth:`checkpoint`), and in the background
    after commits once ``after_bytes`` of log (and a quarter of the last image) were added."""

    def __init__(
        self,
        replica: Replica[Any, Any],
        custody: WriterCustody,
        store: CheckpointStore,
        *,
        serializer: Callable[[Any], bytes] | None,
        after_bytes: int | None,
    ) -> None:
        self.replica = replica
        self.custody = custody
        self.store = store
        self.serializer = serializer
        self.after_bytes = after_bytes
        self.thread: threading.Thread | None = None

    def checkpoint(self) -> CheckpointInfo | None:
        """Checkpoint the state as of the tail now; None when the log has no data yet."""
        replica = self.replica
        if self.serializer is None:
            raise ConfigurationError(f"{replica.topic}: checkpoints need a state_serializer")
        with replica.lock:
            replica.ensure()
            replica.catch_up()
            image = self._take_image()
        return None if image is None else self._store(image)

    def maybe_start(self) -> None:
        """After a commit: start a background checkpoint when enough log was added since the last."""
        replica = self.replica
        after = self.after_bytes
        if after is None or not self.custody.held:
            return
        if replica.bytes_since_checkpoint < max(after, replica.last_checkpoint_size // CHECKPOINT_TAIL_RATIO):
            return
        if self.thread is not None and self.thread.is_alive():
            return
        try:
            with replica.lock:
                # A close racing the commit still stores the image that came due: close() waits for
                # this thread, so a process that writes and exits leaves its checkpoint behind.
                if replica.status is ReplicaState.BROKEN or not self.custody.held:
                    return
                image = self._take_image()
        except CheckpointError as exc:
            log.warning("automatic %s", exc)
            return
        if image is None:
            return
        self.thread = threading.Thread(
            target=self._store_in_background, args=(image,), name=f"pulsarstate-checkpoint-{replica.topic}", daemon=True
        )
        self.thread.start()

    def _store_in_background(self, image: _Image) -> None:
        try:
            self._store(image)
        except Exception as exc:  # noqa: BLE001 - derived data: the log is unaffected
            log.warning(
                "%s: automatic checkpoint at offset %d failed: %s",
                self.replica.topic,
                image.offset,
                describe(exc),
                exc_info=not isinstance(exc, PulsarStateError),
            )

    def _take_image(self) -> _Image | None:
        """The state as of now, serialized; call with the state lock held."""
        replica = self.replica
        if replica.applied_offset < 0:
            return None
        assert self.serializer is not None  # checked by checkpoint() and the manager's constructor
        try:
            data = self.serializer(replica.state)
        except Exception as exc:
            raise CheckpointError(topic=replica.topic, cause=f"the state does not serialize: {describe(exc)}") from exc
        if not isinstance(data, (bytes, bytearray)):
            raise CheckpointError(
                topic=replica.topic, cause=f"state_serializer returned {type(data).__name__}, not bytes"
            )
        replica.bytes_since_checkpoint = 0
        return _Image(
            replica.applied_offset,
            replica.applied_epoch,
            replica.applied_position,
            bytes(data),
            dict(replica.fences.tokens),
        )

    def _store(self, image: _Image) -> CheckpointInfo:
        info = self.store.save(
            offset=image.offset,
            epoch=image.epoch,
            position=image.position,
            data=image.data,
            log_id=self.replica.log_id,
            fences=image.fences,
        )
        self.replica.last_checkpoint_size = info.size
        self.replica.stats.checkpoints_written += 1
        return info
