"""Checkpoints: an image of a state at a log offset, so that bootstrap reads the image and the tail.

A checkpoint of log topic ``T`` at offset ``X`` is the serialized state after every DATA record
up to ``X``, plus what a reader needs to go on from there: the log position of record ``X``'s last
frame and the highest epoch seen up to it. It is derived data. Anyone may write one at any time;
a missing or damaged checkpoint costs time only (the log is replayed instead), never data.

Layout, over the ordinary back-end contract (so both back ends behave the same):

* ``T-checkpoint-<offset>-<id>`` holds one image, cut into CHECKPOINT frames (any size);
* ``T-checkpoints`` holds one small JSON manifest per checkpoint, appended only after its image is
  stored in full, so the last manifest always names a complete image. Finding the newest
  checkpoint reads one entry (:meth:`~airflow_provider_pulsarstate.engine.backends.base.Backend.read_last`),
  however long the log is.

Each manifest names its predecessor's image. Writing checkpoint N deletes the image of N-2, so
the two newest images exist at any time and a reader still loading N-1 is not cut off.
"""

from __future__ import annotations

import base64
import json
import logging
import time
import uuid
import zlib
from dataclasses import dataclass
from typing import Any

from airflow_provider_pulsarstate.engine.backends.base import Backend
from airflow_provider_pulsarstate.engine.envelope import RecordKind, encode_frames
from airflow_provider_pulsarstate.engine.errors import CheckpointError, CorruptEntryError, PulsarStateError
from airflow_provider_pulsarstate.engine.log import DEFAULT_MAX_FRAME_BYTES, LogReader

log = logging.getLogger(__name__)

FORMAT = 1


@dataclass(frozen=True, slots=True)
class CheckpointInfo:
    """What a manifest says about one checkpoint (the image itself is loaded separately)."""

    topic: str
    """The log topic the image summarizes."""
    offset: int
    """The last DATA offset included in the image."""
    epoch: int
    """The highest writer epoch seen up to that record."""
    position: Any
    """The log position of that record's last frame: replay resumes after it."""
    data_topic: str
    """Where the image is stored."""
    checkpoint_id: str
    size: int
    """Bytes of the image."""
    crc32: int
    created: float
    """Unix time the checkpoint was written."""
    previous: str | None
    """The predecessor's image topic (deleted when the next checkpoint is written)."""


class CheckpointStore:
    """Writes and finds the checkpoints of one log topic.

    Example::

        store = CheckpointStore(backend, "persistent://public/default/assignments")
        store.save(offset=41, epoch=3, position=pos, data=image)   # pos: record 41's position
        info = store.latest()                                       # -> CheckpointInfo(offset=41, ...)
        image = store.load(info)

    :param backend: where the log and its checkpoints live.
    :param topic: the log topic.
    :param max_frame_bytes: largest frame of an image.
    :param timeout: seconds each read or append may take.
    :raises CheckpointError: a manifest or image is damaged or incomplete (names topic and cause).
    """

    def __init__(
        self, backend: Backend, topic: str, *, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES, timeout: float = 30.0
    ) -> None:
        self.backend = backend
        self.topic = topic
        self.max_frame_bytes = max_frame_bytes
        self.timeout = timeout

    @property
    def index_topic(self) -> str:
        """The topic of the manifests."""
        return f"{self.topic}-checkpoints"

    def _error(self, cause: str) -> CheckpointError:
        return CheckpointError(topic=self.topic, cause=cause)

    # ------------------------------------------------------------------ reading
    def latest(self) -> CheckpointInfo | None:
        """The newest checkpoint's manifest, or None when there is none (one entry is read)."""
        entry = self.backend.read_last(self.index_topic, timeout=self.timeout)
        return None if entry is None else self._parse(entry.payload)

    def _parse(self, payload: bytes) -> CheckpointInfo:
        try:
            m = json.loads(payload)
            if m.get("format") != FORMAT:
                raise ValueError(f"unsupported manifest format {m.get('format')!r}")
            if m["topic"] != self.topic:
                raise ValueError(f"manifest is for topic {m['topic']!r}")
            return CheckpointInfo(
                topic=m["topic"], offset=int(m["offset"]), epoch=int(m["epoch"]),
                position=self.backend.decode_position(base64.b64decode(m["position"])),
                data_topic=m["data_topic"], checkpoint_id=m["id"], size=int(m["size"]), crc32=int(m["crc32"]),
                created=float(m["created"]), previous=m.get("previous"),
            )
        except (ValueError, KeyError, TypeError) as exc:
            raise self._error(f"the last manifest in {self.index_topic} does not decode: {exc}") from exc

    def load(self, info: CheckpointInfo) -> bytes:
        """The image ``info`` names, checked against its length and CRC-32."""
        try:
            reader = LogReader(self.backend, info.data_topic, epoch_topic=self.topic)  # its frames carry the log's epoch
            try:
                record = reader.read_next(timeout=self.timeout, drain=True)
            finally:
                reader.close()
        except CorruptEntryError as exc:
            raise self._error(f"image {info.data_topic} has a damaged frame: {exc.cause}") from exc
        if record is None:
            raise self._error(f"image {info.data_topic} of offset {info.offset} is missing or incomplete")
        if record.kind is not RecordKind.CHECKPOINT or record.writer_id.hex() != info.checkpoint_id:
            raise self._error(f"{info.data_topic} does not hold checkpoint {info.checkpoint_id}")
        if len(record.body) != info.size or zlib.crc32(record.body) != info.crc32:
            raise self._error(
                f"image {info.data_topic} is {len(record.body):,} bytes with CRC-32 {zlib.crc32(record.body):#010x}; "
                f"the manifest says {info.size:,} bytes, {info.crc32:#010x}"
            )
        return record.body

    # ------------------------------------------------------------------ writing
    def save(self, *, offset: int, epoch: int, position: Any, data: bytes) -> CheckpointInfo:
        """Store ``data`` as the image at ``offset``, then publish its manifest.

        Not atomic across the two steps, and need not be: until the manifest is appended the
        image is invisible, so a writer dying half-way leaves only an unreferenced image topic.

        :raises CheckpointError: the image or its manifest could not be stored.
        """
        started = time.monotonic()
        try:
            previous = self.latest()
        except CheckpointError as exc:
            log.warning("%s; writing a new checkpoint anyway", exc)
            previous = None
        ckpt_id = uuid.uuid4().bytes
        data_topic = f"{self.topic}-checkpoint-{offset}-{ckpt_id.hex()[:8]}"
        frames = encode_frames(
            kind=RecordKind.CHECKPOINT, epoch=epoch, offset=offset, writer_id=ckpt_id, body=data,
            max_frame_bytes=self.max_frame_bytes,
        )
        info = CheckpointInfo(
            topic=self.topic, offset=offset, epoch=epoch, position=position, data_topic=data_topic,
            checkpoint_id=ckpt_id.hex(), size=len(data), crc32=zlib.crc32(data), created=time.time(),
            previous=previous.data_topic if previous is not None else None,
        )
        manifest = json.dumps({
            "format": FORMAT, "topic": self.topic, "offset": offset, "epoch": epoch,
            "position": base64.b64encode(self.backend.encode_position(position)).decode(),
            "data_topic": data_topic, "id": info.checkpoint_id, "size": info.size, "crc32": info.crc32,
            "created": info.created, "previous": info.previous,
        }).encode()
        try:
            self._append(data_topic, frames, compress=True)
            self._append(self.index_topic, [manifest])
        except PulsarStateError as exc:
            raise self._error(f"could not store the checkpoint at offset {offset}: {exc}") from exc
        if previous is not None and previous.previous:
            try:
                self.backend.delete_topic(previous.previous)
            except PulsarStateError as exc:
                log.warning("%s: could not delete the old checkpoint image %s: %s", self.topic, previous.previous, exc)
        elapsed = time.monotonic() - started
        log.info(
            "%s: checkpoint at offset %d written: %s bytes in %d frames, %.2fs (%.1f MB/s)",
            self.topic, offset, f"{len(data):,}", len(frames), elapsed, len(data) / 1e6 / max(elapsed, 1e-9),
        )
        return info

    def _append(self, topic: str, payloads: list[bytes], *, compress: bool = False) -> None:
        writer = self.backend.open_shared_writer(topic, compress=compress)
        try:
            writer.append(payloads, timeout=self.timeout)
        finally:
            writer.close()
