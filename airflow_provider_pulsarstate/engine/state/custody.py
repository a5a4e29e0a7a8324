"""Custody of the topic's exclusive writer: taken, caught up to its own EPOCH record, handed over, dropped."""

from __future__ import annotations

import json
import logging
import time
from typing import Any

from airflow_provider_pulsarstate.engine.backends.base import AcquireMode, Backend
from airflow_provider_pulsarstate.engine.envelope import RecordKind
from airflow_provider_pulsarstate.engine.errors import OperationTimeoutError, WriterFencedError
from airflow_provider_pulsarstate.engine.genesis import new_genesis_body
from airflow_provider_pulsarstate.engine.state.bootstrap import ensure_durable
from airflow_provider_pulsarstate.engine.state.replica import Replica
from airflow_provider_pulsarstate.engine.state.stats import ManagerStats
from airflow_provider_pulsarstate.engine.state.support import describe
from airflow_provider_pulsarstate.engine.wal import LogWriter, open_writer

log = logging.getLogger(__name__)


class WriterCustody:
    """The writer this instance holds (None: none); held only with the replica's state lock, except
    :meth:`open`, which waits for it without the lock so that local reads go on meanwhile."""

    def __init__(
        self,
        backend: Backend,
        topic: str,
        *,
        writer_id: bytes,
        mode: AcquireMode,
        acquire_timeout: float,
        operation_timeout: float,
        max_frame_bytes: int,
        name: str | None,
        stats: ManagerStats,
    ) -> None:
        self.backend = backend
        self.topic = topic
        self.writer_id = writer_id
        self.mode = mode
        self.acquire_timeout = acquire_timeout
        self.operation_timeout = operation_timeout
        self.max_frame_bytes = max_frame_bytes
        self.name = name
        self.stats = stats
        self.writer: LogWriter | None = None

    @property
    def held(self) -> bool:
        return self.writer is not None

    def open(self) -> LogWriter:
        """Wait (at most ``acquire_timeout``) for the exclusive writer, after checking the store keeps the log."""
        ensure_durable(self.backend, self.topic, strict=True)
        return open_writer(
            self.backend,
            self.topic,
            writer_id=self.writer_id,
            mode=self.mode,
            timeout=self.acquire_timeout,
            max_frame_bytes=self.max_frame_bytes,
            name=self.name,
        )

    def adopt(self, writer: LogWriter, replica: Replica[Any, Any]) -> None:
        """Hold ``writer`` and read up to its own EPOCH record (the tail left since the catch-up).
        Call with the state lock held."""
        self.writer = writer
        self.stats.acquisitions += 1
        epoch = writer.epoch
        reader = replica.reader
        assert reader is not None
        reader.confirm_epoch(epoch)  # granted to us just now: no need to ask the back end
        deadline = time.monotonic() + self.operation_timeout
        while True:
            record = reader.read_next(timeout=max(0.001, deadline - time.monotonic()))
            if record is None and time.monotonic() < deadline:
                continue  # the back end's wait ended early (whole milliseconds): wait out the rest
            if record is None:
                self.drop()
                raise OperationTimeoutError(
                    f"{self.topic}: did not read back our own epoch {epoch} record within {self.operation_timeout:.1f}s"
                )
            replica.take_record(record)
            if reader.max_epoch > epoch:
                # The back end reported an epoch lower than one already in the log: our frames
                # would be skipped as a fenced writer's. Let go and take the writer again.
                self.drop()
                raise WriterFencedError(
                    f"{self.topic}: the writer was granted epoch {epoch}, but the log already holds epoch "
                    f"{reader.max_epoch}"
                )
            if record.kind is RecordKind.EPOCH and record.writer_id == self.writer_id and record.epoch == epoch:
                log.debug("%s: writer at epoch %d caught up to offset %d", self.topic, epoch, replica.applied_offset)
                break
        if replica.log_id is None and replica.applied_offset < 0:
            # The first writer of an empty log: the GENESIS record goes before any DATA. A
            # concurrent first writer's GENESIS, if any landed first, was read above.
            body = new_genesis_body()
            writer.append(RecordKind.GENESIS, body, timeout=self.operation_timeout)
            replica.log_id = json.loads(body)["log_id"]
            log.info("%s: new log %s started", self.topic, replica.log_id)

    def drop(self) -> None:
        """Let go of the writer, if one is held (closing it may fail: it is dropped either way).

        :attr:`held` turns False only once the writer is closed, so that another instance may take
        it as soon as this one says it no longer holds it.
        """
        writer = self.writer
        if writer is None:
            return
        try:
            writer.close()
        except Exception as exc:  # noqa: BLE001 - it is dropped either way
            log.warning("%s: closing the writer of epoch %d failed: %s", self.topic, writer.epoch, describe(exc))
        finally:
            self.writer = None

    def release(self, *, handover: bool) -> None:
        """Let go of the idle writer (``handover``: another instance waits for it)."""
        writer = self.writer
        if writer is None:
            return
        if handover:
            log.debug("%s: handing the writer (epoch %d) over to a waiting instance", self.topic, writer.epoch)
            self.stats.handovers += 1
        else:
            log.info("%s: releasing the idle writer (epoch %d)", self.topic, writer.epoch)
        self.drop()

    def wanted(self) -> bool:
        """Whether another instance waits for the writer we hold (never raises)."""
        writer = self.writer  # read without the state lock: a closed writer answers False
        if writer is None:
            return False
        try:
            return writer.has_waiters()
        except Exception as exc:  # noqa: BLE001 - keeping the writer is always safe
            log.debug("%s: checking for waiting writers failed: %s", self.topic, describe(exc))
            return False
