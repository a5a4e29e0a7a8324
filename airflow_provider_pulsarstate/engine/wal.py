"""The write-ahead log both back ends share: records over frames, epochs, offsets, zombie filtering.

Reading rules (applied identically on every back end):

* A record is delivered only when all its frames arrived, in order, from one writer and epoch;
  frames of a record its writer never finished are dropped when the next epoch begins.
* Epochs never go back: a frame whose epoch is lower than the highest seen so far comes from a
  fenced ("zombie") writer whose send landed late; it is skipped with a warning.
* Epochs come from the back end: a frame claiming an epoch above the back end's current epoch
  (:meth:`Backend.current_epoch`) was not written by a writer of the topic. It is corruption
  (``CorruptEntryError`` naming the epoch), never obeyed: it does not raise the epoch that later
  frames are held to, so it cannot turn every real writer into a "zombie". The back end is asked
  only when a frame claims more than the highest epoch already confirmed (once per new epoch).
* DATA records carry consecutive offsets from 0. A gap or repeat is reported as corruption.
* A frame that does not decode is corruption: the error names the topic and position; with
  ``on_corrupt="skip"`` it is logged and skipped instead.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from airflow_provider_pulsarstate.engine.backends.base import (
    EARLIEST,
    AcquireMode,
    Backend,
    RawEntry,
    RawReader,
    RawWriter,
    attempt_writer_name,
    is_earliest,
)
from airflow_provider_pulsarstate.engine.envelope import (
    NO_OFFSET,
    Frame,
    FrameError,
    RecordKind,
    decode_frame,
    encode_frames,
)
from airflow_provider_pulsarstate.engine.errors import CorruptEntryError

log = logging.getLogger(__name__)

CorruptPolicy = Literal["raise", "skip"]
DEFAULT_MAX_FRAME_BYTES = 1024 * 1024
_SAME_TOPIC = object()
_EPOCH_RECHECKS = (0.1, 0.4, 0.0)  # pauses between the looks at the back end's epoch (the last: none)


@dataclass(frozen=True, slots=True)
class LogRecord:
    """One complete record as a reader delivers it."""

    kind: RecordKind
    epoch: int
    offset: int
    """Consecutive from 0 for DATA records; ``-1`` for EPOCH and BARRIER records."""
    writer_id: bytes
    body: bytes
    publish_time: float
    position: Any
    """The back end's position of the record's last frame (resume a reader after it)."""


class LogWriter:
    """Appends records as frames through one exclusive :class:`RawWriter`."""

    def __init__(self, raw: RawWriter, *, writer_id: bytes, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> None:
        self.raw = raw
        self.writer_id = writer_id
        self.max_frame_bytes = max_frame_bytes

    @property
    def epoch(self) -> int:
        return self.raw.epoch

    def append(self, kind: RecordKind, body: bytes = b"", *, offset: int = NO_OFFSET, timeout: float) -> Any:
        """Append one record (all frames) and wait for it; returns the last frame's position."""
        frames = encode_frames(
            kind=kind,
            epoch=self.raw.epoch,
            offset=offset,
            writer_id=self.writer_id,
            body=body,
            max_frame_bytes=self.max_frame_bytes,
        )
        return self.raw.append(frames, timeout=timeout)[-1]

    def has_waiters(self) -> bool:
        """Whether another acquirer waits for this writer (:meth:`RawWriter.has_waiters`)."""
        return self.raw.has_waiters()

    def close(self) -> None:
        self.raw.close()


def open_writer(
    backend: Backend,
    topic: str,
    *,
    writer_id: bytes,
    mode: AcquireMode,
    timeout: float,
    max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
    name: str | None = None,
) -> LogWriter:
    """Take the exclusive writer of ``topic`` and announce the new epoch with an EPOCH record.

    ``name`` names the writer where leadership is observed (see :meth:`Backend.acquire_writer`),
    with a suffix unique to this call (:func:`attempt_writer_name`: ``name~1a2b3c4d``).

    The caller must then read up to that EPOCH record (see :meth:`LogReader.read_next`) before
    generating anything from the state: everything in the log before it is then known.
    """
    raw = backend.acquire_writer(topic, mode=mode, timeout=timeout, name=attempt_writer_name(name))
    writer = LogWriter(raw, writer_id=writer_id, max_frame_bytes=max_frame_bytes)
    try:
        writer.append(RecordKind.EPOCH, timeout=timeout)
    except BaseException:
        writer.close()
        raise
    return writer


class LogReader:
    """Turns a :class:`RawReader`'s frames into records, enforcing the reading rules above."""

    def __init__(
        self,
        backend: Backend,
        topic: str,
        *,
        start: Any = EARLIEST,
        on_corrupt: CorruptPolicy = "raise",
        next_offset: int | None = None,
        max_epoch: int = -1,
        epoch_topic: Any = _SAME_TOPIC,
        on_forged_epoch: CorruptPolicy | None = None,
        on_skip: Callable[[CorruptEntryError], None] | None = None,
    ) -> None:
        """
        :param start: EARLIEST, or the position of an entry to resume after.
        :param next_offset: the DATA offset expected next (0 from EARLIEST; when resuming, the one
            after the last record read, so that gaps are still detected).
        :param max_epoch: the highest epoch seen before ``start`` (frames of lower epochs after it
            are zombie frames and are skipped).
        :param epoch_topic: the topic whose back-end epoch bounds the frames' epochs (this topic by
            default; a checkpoint image names its log; None: do not check).
        :param on_forged_epoch: policy for a frame claiming an epoch the back end never granted
            (``on_corrupt`` by default).
        :param on_skip: called with the error of every corrupt frame skipped.
        """
        if on_corrupt not in ("raise", "skip") or on_forged_epoch not in (None, "raise", "skip"):
            raise ValueError(f"on_corrupt must be 'raise' or 'skip', got {on_corrupt!r} / {on_forged_epoch!r}")
        self.backend = backend
        self.topic = topic
        self.on_corrupt = on_corrupt
        self.on_forged_epoch: CorruptPolicy = on_forged_epoch or on_corrupt
        self.epoch_topic: str | None = topic if epoch_topic is _SAME_TOPIC else epoch_topic
        self.on_skip = on_skip
        self.raw: RawReader = backend.create_reader(topic, start=start)
        self.max_epoch = max_epoch
        self.next_offset: int | None = next_offset if next_offset is not None else (0 if is_earliest(start) else None)
        self.skipped = 0
        self._parts: list[Frame] = []
        self._confirmed_epoch = -1  # frames up to this epoch are known to come from granted epochs
        self._held: RawEntry | None = None  # read, not yet handled (the epoch check failed to answer)

    def confirm_epoch(self, epoch: int) -> None:
        """Tell the reader an epoch is real (e.g. the one the back end just granted this instance's writer)."""
        self._confirmed_epoch = max(self._confirmed_epoch, epoch)

    def _corrupt(self, where: Any, cause: str, *, epoch: int | None = None) -> None:
        err = CorruptEntryError(topic=self.topic, position=where, cause=cause, epoch=epoch)
        if (self.on_forged_epoch if epoch is not None else self.on_corrupt) == "raise":
            raise err
        self.skipped += 1
        log.error("skipping %s", err)
        if self.on_skip is not None:
            self.on_skip(err)

    def _epoch_granted(self, epoch: int) -> bool:
        """Whether the back end ever granted ``epoch`` (asked only above the highest confirmed)."""
        if epoch <= self._confirmed_epoch or self.epoch_topic is None:
            return True
        # Asked again before a frame is judged forged: the broker's reported epoch can lag one
        # just granted (concurrent takeovers), and skipping a genuine frame would fork the state.
        for pause in _EPOCH_RECHECKS:
            self._confirmed_epoch = max(self._confirmed_epoch, self.backend.current_epoch(self.epoch_topic))
            if epoch <= self._confirmed_epoch:
                return True
            time.sleep(pause)
        return False

    def _where(self, position: Any) -> str:
        return f"position {position} (next offset {self.next_offset})"

    def read_next(self, *, timeout: float, drain: bool = False) -> LogRecord | None:
        """The next complete record, or None when nothing completes within ``timeout``.

        :param drain: return None as soon as the tail is reached (checked now), instead of
            waiting; frames of a record still being written stay buffered for the next call.
        :raises CorruptEntryError: an entry does not decode or breaks the offset sequence,
            unless ``on_corrupt="skip"``.
        """
        while True:
            entry = self._held
            if entry is None:
                if drain and not self.raw.has_next():
                    return None
                entry = self.raw.read_next(timeout=timeout)
                if entry is None:
                    return None
            self._held = None
            try:
                frame = decode_frame(entry.payload)
            except FrameError as exc:
                self._corrupt(self._where(entry.position), str(exc))
                continue
            if frame.epoch > self.max_epoch:
                self._held = entry  # kept if the back end cannot answer now: read again next call
                granted = self._epoch_granted(frame.epoch)
                self._held = None
                if not granted:
                    self._corrupt(
                        self._where(entry.position),
                        f"frame claims epoch {frame.epoch}, above the back end's current epoch "
                        f"{self._confirmed_epoch}: no writer of {self.epoch_topic} wrote it; it is not obeyed",
                        epoch=frame.epoch,
                    )
                    continue
            if frame.epoch < self.max_epoch:
                log.warning(
                    "%s: ignoring a late frame of fenced epoch %d (current epoch %d) at %s",
                    self.topic,
                    frame.epoch,
                    self.max_epoch,
                    entry.position,
                )
                continue
            if frame.epoch > self.max_epoch:
                if self._parts:
                    log.warning("%s: dropping an unfinished record of epoch %d", self.topic, self._parts[0].epoch)
                    self._parts = []
                self.max_epoch = frame.epoch
            record = self._assemble(frame, entry.position, entry.publish_time)
            if record is not None:
                return record

    def _assemble(self, frame: Frame, position: Any, publish_time: float) -> LogRecord | None:
        if frame.part_count > 1:
            head = self._parts[0] if self._parts else None
            if frame.part_index == 0:
                if head is not None:
                    log.warning("%s: dropping an unfinished record at offset %d", self.topic, head.offset)
                self._parts = [frame]
            elif head is None:
                return None  # the reader started inside a record; its head is behind us
            elif (frame.writer_id, frame.offset, frame.part_count) != (
                head.writer_id,
                head.offset,
                head.part_count,
            ) or (frame.part_index != len(self._parts)):
                self._parts = []
                self._corrupt(
                    self._where(position), f"frame {frame.part_index} does not continue the record in progress"
                )
                return None
            else:
                self._parts.append(frame)
            if len(self._parts) < frame.part_count:
                return None
            body = b"".join(p.chunk for p in self._parts)
            self._parts = []
        else:
            if self._parts:
                log.warning("%s: dropping an unfinished record at offset %d", self.topic, self._parts[0].offset)
                self._parts = []
            body = frame.chunk
        if frame.kind is RecordKind.DATA:
            if self.next_offset is None:
                self.next_offset = frame.offset
            if frame.offset < self.next_offset:
                self._corrupt(
                    self._where(position), f"record offset {frame.offset} repeats (expected {self.next_offset})"
                )
                return None
            if frame.offset > self.next_offset:
                # Records are missing. With on_corrupt="skip" the gap is logged and reading goes on.
                self._corrupt(self._where(position), f"record offset {frame.offset}, expected {self.next_offset}")
            self.next_offset = frame.offset + 1
        return LogRecord(frame.kind, frame.epoch, frame.offset, frame.writer_id, body, publish_time, position)

    def has_next(self) -> bool:
        """Whether entries exist past this reader, checked against the tail now."""
        return self._held is not None or self.raw.has_next()

    def close(self) -> None:
        self.raw.close()
