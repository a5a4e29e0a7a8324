"""The GENESIS record: every log starts with one, so a log that lost its beginning is noticed.

The first writer that finds a log without records writes a GENESIS record (a random log id and
the creation time) right after its EPOCH record, before any DATA. Only the first GENESIS record
read counts; later ones (a concurrent first writer that was fenced) are ignored by every reader.
Checkpoint manifests record the log id, so an image of one log is never applied to another log
that took its name (a topic deleted and recreated).

What a bootstrap accepts (:func:`read_beginning`):

* a GENESIS record before the first DATA record: the log is whole;
* no GENESIS but a first DATA record of offset 0: a log written before GENESIS existed (legacy),
  accepted as whole;
* nothing but EPOCH/BARRIER records, or nothing at all: an empty log (see :class:`Beginning`);
* a first DATA record of another offset without a GENESIS before it: the beginning was deleted
  (retention): :class:`~airflow_provider_pulsarstate.engine.errors.LogLostError`.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass

from airflow_provider_pulsarstate.engine.backends.base import Backend
from airflow_provider_pulsarstate.engine.envelope import RecordKind
from airflow_provider_pulsarstate.engine.errors import CorruptEntryError, LogLostError
from airflow_provider_pulsarstate.engine.wal import LogReader, LogRecord


@dataclass(frozen=True, slots=True)
class Genesis:
    """What a GENESIS record says."""

    log_id: str
    """32 hex digits, random per log."""
    created: float
    """Unix time the log was started."""


def new_genesis_body() -> bytes:
    """The body of a new log's GENESIS record."""
    return json.dumps({"log_id": uuid.uuid4().hex, "created": time.time()}).encode()


def parse_genesis(record: LogRecord, topic: str) -> Genesis:
    """Decode a GENESIS record; a malformed one is a corrupt entry (never silently replaced)."""
    try:
        body = json.loads(record.body)
        log_id, created = body["log_id"], body["created"]
        if not (isinstance(log_id, str) and len(log_id) == 32 and int(log_id, 16) >= 0):
            raise ValueError(f"log_id {log_id!r} is not 32 hex digits")
        if not isinstance(created, (int, float)) or isinstance(created, bool):
            raise ValueError(f"created {created!r} is not a time")
    except (ValueError, KeyError, TypeError) as exc:
        raise CorruptEntryError(
            topic=topic, position=record.position, cause=f"GENESIS record does not decode: {exc}"
        ) from exc
    return Genesis(log_id, float(created))


@dataclass(frozen=True, slots=True)
class Beginning:
    """How a log starts."""

    genesis: Genesis | None
    """The first GENESIS record (None: empty or legacy log)."""
    has_data: bool
    """Whether a DATA record exists (for a legacy log: one of offset 0)."""

    @property
    def empty(self) -> bool:
        """No GENESIS and no DATA: nothing was ever written, or everything was deleted."""
        return self.genesis is None and not self.has_data


def read_beginning(backend: Backend, topic: str, *, timeout: float) -> Beginning:
    """Read the first records of ``topic`` up to its GENESIS or first DATA record.

    Reads a handful of entries, whatever the log's length.

    :raises LogLostError: the first DATA record has an offset other than 0 and no GENESIS precedes it.
    :raises CorruptEntryError: the GENESIS record, or an entry before it, does not decode.
    """
    reader = LogReader(backend, topic, epoch_topic=None)  # only the first records matter; the replay checks epochs
    reader.next_offset = None  # take the first DATA offset as it is: judged below, not as a gap
    try:
        while (record := reader.read_next(timeout=timeout, drain=True)) is not None:
            if record.kind is RecordKind.GENESIS:
                return Beginning(parse_genesis(record, topic), has_data=reader.has_next())
            if record.kind is RecordKind.DATA:
                if record.offset != 0:
                    raise LogLostError(
                        topic=topic,
                        found=f"its first record is DATA offset {record.offset} at {record.position}, with no GENESIS "
                        "record before it: the beginning of the log was deleted (check the topic's retention)",
                    )
                return Beginning(None, has_data=True)
        return Beginning(None, has_data=False)
    finally:
        reader.close()
