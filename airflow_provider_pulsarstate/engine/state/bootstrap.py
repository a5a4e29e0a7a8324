"""Where a replica starts: the store's durability checked, a lost log refused, the newest usable checkpoint.

A checkpoint never decides the state: any defect of a manifest or image (or no access to them)
means a full replay, logged, never an exception and never an unchecked image. Only a checkpoint
of another log (the topic was recreated) fails, with LogLostError.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from airflow_provider_pulsarstate.engine.backends.base import Backend
from airflow_provider_pulsarstate.engine.checkpoint import CheckpointInfo, CheckpointStore
from airflow_provider_pulsarstate.engine.errors import (
    BackendUnavailableError,
    CheckpointError,
    LogLostError,
    PulsarStateError,
)
from airflow_provider_pulsarstate.engine.state.support import describe, gc_paused
from airflow_provider_pulsarstate.engine.wal import LogReader

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class LoadedCheckpoint:
    """A checked checkpoint: its manifest, the state it holds, a reader positioned right after it."""

    info: CheckpointInfo
    state: Any
    reader: LogReader


def ensure_durable(backend: Backend, topic: str, *, strict: bool) -> None:
    """Check (once per topic and back end) that the store keeps the log; a reader that cannot
    reach the admin API goes on with a warning, a writer (``strict``) does not."""
    try:
        backend.ensure_durable(topic)
    except BackendUnavailableError as exc:
        if strict:
            raise
        log.warning("%s: could not check its retention policies (%s); reading it anyway", topic, exc)


def check_not_recreated(backend: Backend, checkpoints: CheckpointStore, topic: str, *, timeout: float) -> None:
    """An empty log whose table has checkpoints was deleted (or recreated): fail loudly."""
    index = checkpoints.index_topic
    try:
        entry = backend.read_last(index, timeout=timeout)
    except PulsarStateError as exc:
        log.warning("%s: the log is empty and %s cannot be read (%s); treating it as a new table", topic, index, exc)
        return
    if entry is not None:
        raise LogLostError(
            topic=topic,
            found=f"the log is empty or missing, but {index} holds checkpoint manifests: the topic was deleted "
            "(retention or inactive-topic deletion) or recreated; restore it, or delete the checkpoint topics "
            "to start a new table",
        )


def load_checkpoint(
    checkpoints: CheckpointStore,
    *,
    topic: str,
    log_id: str | None,
    limit: int | None,
    deserialize: Callable[[bytes], Any],
    open_reader: Callable[..., LogReader],
) -> LoadedCheckpoint | None:
    """The newest usable checkpoint; None (after logging why) to replay everything.

    :param limit: the highest offset a usable checkpoint may have (None: any).
    :raises LogLostError: the checkpoint belongs to another log of the same name (its log id
        differs from the log's GENESIS): the topic was recreated.
    """
    started = time.monotonic()
    try:
        info = checkpoints.latest()
    except Exception as exc:  # noqa: BLE001 - a checkpoint never stops a bootstrap
        _replay_instead(topic, exc)
        return None
    if info is None or not _usable(info, topic=topic, log_id=log_id, limit=limit):
        return None
    try:
        checkpoints.verify(info)
        image = checkpoints.load(info)
        try:
            with gc_paused():
                state = deserialize(image)
        except Exception as exc:
            raise CheckpointError(
                topic=topic, cause=f"image {info.data_topic} does not deserialize: {describe(exc)}"
            ) from exc
        reader = open_reader(start=info.position, next_offset=info.offset + 1, max_epoch=info.epoch)
    except Exception as exc:  # noqa: BLE001 - a checkpoint never stops a bootstrap
        _replay_instead(topic, exc)
        return None
    elapsed = time.monotonic() - started
    log.info(
        "%s: loaded the checkpoint at offset %d (%s bytes, %.1f MB/s) in %.2fs; replaying the records after it",
        topic,
        info.offset,
        f"{info.size:,}",
        info.size / 1e6 / max(elapsed, 1e-9),
        elapsed,
    )
    return LoadedCheckpoint(info, state, reader)


def _usable(info: CheckpointInfo, *, topic: str, log_id: str | None, limit: int | None) -> bool:
    if info.log_id != log_id:
        raise LogLostError(
            topic=topic,
            found=f"its GENESIS log id is {log_id or 'absent'}, but the newest checkpoint "
            f"({info.data_topic}, offset {info.offset}) is of log {info.log_id or 'without a log id'}: the "
            "topic was recreated or lost its beginning; restore it, or delete the checkpoint topics to start "
            "a new table",
        )
    if limit is not None and info.offset > limit:
        log.info(
            "%s: not loading the checkpoint at offset %d: a write of unknown outcome may lie after offset %d; "
            "replaying the whole log to find it",
            topic,
            info.offset,
            limit,
        )
        return False
    return True


def _replay_instead(topic: str, exc: Exception) -> None:
    cause = exc if isinstance(exc, PulsarStateError) else f"checkpoint: {describe(exc)}"
    log.warning("%s; replaying the whole log of %s instead", cause, topic)
