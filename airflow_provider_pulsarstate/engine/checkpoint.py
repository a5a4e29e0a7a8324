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

Nothing in a manifest is trusted unchecked (anyone who can append to ``T-checkpoints`` can write
one): every field is type-checked, the image topic must be exactly ``T-checkpoint-<offset>-<id>``
for the manifest's own offset and id, and only such a topic of this log is ever deleted. Before
an image is used, :meth:`CheckpointStore.verify` checks that the log holds, at the manifest's
position, the last frame of DATA record ``offset`` of ``epoch``, and :meth:`CheckpointStore.load`
that the image's frames carry the same id, offset and epoch.
"""

from __future__ import annotations

import base64
import json
import logging
import re
import time
import uuid
import zlib
from dataclasses import dataclass, field
from typing import Any

from airflow_provider_pulsarstate.engine.backends.base import Backend
from airflow_provider_pulsarstate.engine.envelope import FrameError, RecordKind, decode_frame, encode_frames
from airflow_provider_pulsarstate.engine.errors import CheckpointError, CorruptEntryError, PulsarStateError
from airflow_provider_pulsarstate.engine.wal import DEFAULT_MAX_FRAME_BYTES, LogReader

log = logging.getLogger(__name__)

FORMAT = 1
_IMAGE_SUFFIX = re.compile(r"-checkpoint-(0|[1-9][0-9]*)-[0-9a-f]{8}")
_HEX32 = re.compile(r"[0-9a-f]{32}")


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
    log_id: str | None = None
    """The log's GENESIS id (None: a log written before GENESIS records existed)."""
    fences: dict[tuple[str, str], int] = field(default_factory=dict)
    """The highest fencing token per (lease log, lease name) applied up to ``offset`` (part of
    the state). In the manifest, fences of lease log ``""`` (frames of earlier versions) are the
    name -> token object ``fences`` that earlier versions wrote; the others are
    ``lease_fences``, a list of ``[lease log, name, token]``."""


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

    def image_topic(self, offset: int, checkpoint_id: str) -> str:
        """The topic of the image at ``offset`` with id ``checkpoint_id`` (32 hex digits)."""
        return f"{self.topic}-checkpoint-{offset}-{checkpoint_id[:8]}"

    def is_own_image(self, name: object) -> bool:
        """Whether ``name`` is exactly an image topic of this log (never the log, the manifest
        topic or another table's topic): the only topics a checkpoint may delete."""
        return (
            isinstance(name, str)
            and name.startswith(self.topic)
            and _IMAGE_SUFFIX.fullmatch(name, len(self.topic)) is not None
        )

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
            if not isinstance(m, dict):
                raise ValueError(f"manifest is a JSON {type(m).__name__}, not an object")
            if m.get("format") != FORMAT:
                raise ValueError(f"unsupported manifest format {m.get('format')!r}")
            if m.get("topic") != self.topic:
                raise ValueError(f"manifest is for topic {m.get('topic')!r}")
            offset, epoch = _field(m, "offset", int, minimum=0), _field(m, "epoch", int, minimum=0)
            ckpt_id = _field(m, "id", str)
            if not _HEX32.fullmatch(ckpt_id):
                raise ValueError(f"id {ckpt_id!r} is not 32 hex digits")
            data_topic = _field(m, "data_topic", str)
            if data_topic != self.image_topic(offset, ckpt_id):
                raise ValueError(f"data_topic {data_topic!r} is not {self.image_topic(offset, ckpt_id)!r}")
            previous = m.get("previous")
            if previous is not None and (not self.is_own_image(previous) or previous == data_topic):
                raise ValueError(f"previous {previous!r} is not an earlier image topic of this log")
            log_id = m.get("log_id")
            if log_id is not None and not (isinstance(log_id, str) and _HEX32.fullmatch(log_id)):
                raise ValueError(f"log_id {log_id!r} is not 32 hex digits")
            fences = _parse_fences(m)
            try:
                position = self.backend.decode_position(base64.b64decode(_field(m, "position", str), validate=True))
            except Exception as exc:  # noqa: BLE001 - whatever the back end's decoder raises on foreign bytes
                raise ValueError(f"position does not decode: {type(exc).__name__}: {exc}") from exc
            return CheckpointInfo(
                topic=self.topic,
                offset=offset,
                epoch=epoch,
                position=position,
                data_topic=data_topic,
                checkpoint_id=ckpt_id,
                size=_field(m, "size", int, minimum=0),
                crc32=_field(m, "crc32", int, minimum=0),
                created=float(_field(m, "created", (int, float))),
                previous=previous,
                log_id=log_id,
                fences=fences,
            )
        except (ValueError, KeyError, TypeError, RecursionError) as exc:
            raise self._error(f"the last manifest in {self.index_topic} does not decode: {exc}") from exc

    def verify(self, info: CheckpointInfo) -> None:
        """Check a manifest against the log: the entry at its position must be the last frame of
        DATA record ``info.offset`` written at ``info.epoch``.

        :raises CheckpointError: it is not (a forged or foreign manifest), or it cannot be read.
        """
        try:
            entry = self.backend.read_at(self.topic, info.position, timeout=self.timeout)
        except PulsarStateError as exc:
            raise self._error(f"cannot read the log at the manifest's position {info.position}: {exc}") from exc
        if entry is None:
            raise self._error(f"the log has no entry at the manifest's position {info.position} (offset {info.offset})")
        try:
            frame = decode_frame(entry.payload)
        except FrameError as exc:
            raise self._error(
                f"the log entry at the manifest's position {info.position} does not decode: {exc}"
            ) from exc
        if (frame.kind, frame.offset, frame.epoch, frame.part_index + 1) != (
            RecordKind.DATA,
            info.offset,
            info.epoch,
            frame.part_count,
        ):
            raise self._error(
                f"the log entry at the manifest's position {info.position} is {frame.kind.name} offset {frame.offset} "
                f"epoch {frame.epoch} part {frame.part_index + 1}/{frame.part_count}; the manifest says the last "
                f"part of DATA offset {info.offset} epoch {info.epoch}"
            )

    def load(self, info: CheckpointInfo) -> bytes:
        """The image ``info`` names, checked against its id, offset, epoch, length and CRC-32."""
        try:
            reader = LogReader(
                self.backend, info.data_topic, epoch_topic=self.topic
            )  # its frames carry the log's epoch
            try:
                record = reader.read_next(timeout=self.timeout, drain=True)
            finally:
                reader.close()
        except CorruptEntryError as exc:
            raise self._error(f"image {info.data_topic} has a damaged frame: {exc.cause}") from exc
        except PulsarStateError as exc:
            raise self._error(f"image {info.data_topic} cannot be read: {exc}") from exc
        if record is None:
            raise self._error(f"image {info.data_topic} of offset {info.offset} is missing or incomplete")
        found = (record.kind, record.writer_id.hex(), record.offset, record.epoch)
        if found != (RecordKind.CHECKPOINT, info.checkpoint_id, info.offset, info.epoch):
            raise self._error(
                f"{info.data_topic} holds {record.kind.name} {record.writer_id.hex()} of offset {record.offset} epoch "
                f"{record.epoch}, not checkpoint {info.checkpoint_id} of offset {info.offset} epoch {info.epoch}"
            )
        if len(record.body) != info.size or zlib.crc32(record.body) != info.crc32:
            raise self._error(
                f"image {info.data_topic} is {len(record.body):,} bytes with CRC-32 {zlib.crc32(record.body):#010x}; "
                f"the manifest says {info.size:,} bytes, {info.crc32:#010x}"
            )
        return record.body

    # ------------------------------------------------------------------ writing
    def save(
        self,
        *,
        offset: int,
        epoch: int,
        position: Any,
        data: bytes,
        log_id: str | None = None,
        fences: dict[tuple[str, str], int] | None = None,
    ) -> CheckpointInfo:
        """Store ``data`` as the image at ``offset``, then publish its manifest.

        Not atomic across the two steps, and need not be: until the manifest is appended the
        image is invisible, so a writer dying half-way leaves only an unreferenced image topic.

        :param log_id: the log's GENESIS id, recorded in the manifest.
        :param fences: the highest fencing token per (lease log, lease name), recorded in the manifest.
        :raises CheckpointError: the image or its manifest could not be stored.
        """
        started = time.monotonic()
        previous = self._latest_or_none()
        ckpt_id = uuid.uuid4().bytes
        data_topic = self.image_topic(offset, ckpt_id.hex())
        frames = encode_frames(
            kind=RecordKind.CHECKPOINT,
            epoch=epoch,
            offset=offset,
            writer_id=ckpt_id,
            body=data,
            max_frame_bytes=self.max_frame_bytes,
        )
        info = CheckpointInfo(
            topic=self.topic,
            offset=offset,
            epoch=epoch,
            position=position,
            data_topic=data_topic,
            checkpoint_id=ckpt_id.hex(),
            size=len(data),
            crc32=zlib.crc32(data),
            created=time.time(),
            previous=previous.data_topic if previous is not None else None,
            log_id=log_id,
            fences=dict(fences or {}),
        )
        self._store(info, frames)
        if previous is not None:
            self._delete_stale_image(previous, data_topic)
        elapsed = time.monotonic() - started
        log.info(
            "%s: checkpoint at offset %d written: %s bytes in %d frames, %.2fs (%.1f MB/s)",
            self.topic,
            offset,
            f"{len(data):,}",
            len(frames),
            elapsed,
            len(data) / 1e6 / max(elapsed, 1e-9),
        )
        return info

    def _store(self, info: CheckpointInfo, frames: list[bytes]) -> None:
        """Append the image's frames to its topic, then the manifest to the index topic."""
        try:
            # Kept like the log: the manifests witness that the table existed (a deleted log is then
            # noticed), and an image the broker deletes while idle would make checkpoints useless.
            self.backend.ensure_durable(info.data_topic)
            self.backend.ensure_durable(self.index_topic)
            self._append(info.data_topic, frames, compress=True)
            self._append(self.index_topic, [self._manifest(info)])
        except PulsarStateError as exc:
            raise self._error(f"could not store the checkpoint at offset {info.offset}: {exc}") from exc

    def _latest_or_none(self) -> CheckpointInfo | None:
        """The newest checkpoint, or None (also when it cannot be read: a new one is written anyway)."""
        try:
            return self.latest()
        except PulsarStateError as exc:
            log.warning("%s; writing a new checkpoint anyway", exc)
            return None

    def _manifest(self, info: CheckpointInfo) -> bytes:
        """The manifest of ``info`` as appended to the index topic."""
        return json.dumps(
            {
                "format": FORMAT,
                "topic": self.topic,
                "offset": info.offset,
                "epoch": info.epoch,
                "position": base64.b64encode(self.backend.encode_position(info.position)).decode(),
                "data_topic": info.data_topic,
                "id": info.checkpoint_id,
                "size": info.size,
                "crc32": info.crc32,
                "created": info.created,
                "previous": info.previous,
                "log_id": info.log_id,
                "fences": {name: t for (ref, name), t in info.fences.items() if ref == ""},
                "lease_fences": sorted([ref, name, t] for (ref, name), t in info.fences.items() if ref != ""),
            }
        ).encode()

    def _delete_stale_image(self, previous: CheckpointInfo, data_topic: str) -> None:
        """Delete the image before ``previous`` (two are kept: the new one and ``previous``), when it
        is one of this table's own; a failure is logged, the new checkpoint stands."""
        stale = previous.previous
        if stale is not None and self.is_own_image(stale) and stale not in (data_topic, previous.data_topic):
            try:
                self.backend.delete_topic(stale)
            except PulsarStateError as exc:
                log.warning("%s: could not delete the old checkpoint image %s: %s", self.topic, stale, exc)

    def _append(self, topic: str, payloads: list[bytes], *, compress: bool = False) -> None:
        writer = self.backend.open_shared_writer(topic, compress=compress)
        try:
            writer.append(payloads, timeout=self.timeout)
        finally:
            writer.close()


def _field(manifest: dict[str, Any], name: str, kind: type | tuple[type, ...], *, minimum: int | None = None) -> Any:
    """``manifest[name]``, which must be of ``kind`` (never a bool for numbers) and >= ``minimum``."""
    value = manifest[name]
    if not isinstance(value, kind) or isinstance(value, bool):
        raise TypeError(f"{name} {value!r} is a {type(value).__name__}, not {getattr(kind, '__name__', kind)}")
    if minimum is not None and isinstance(value, (int, float)) and value < minimum:
        raise ValueError(f"{name} {value!r} is below {minimum}")
    return value


def _parse_fences(manifest: dict[str, Any]) -> dict[tuple[str, str], int]:
    """The manifest's fences: ``fences`` (lease name -> token, lease log ``""``; all that earlier
    versions wrote) and ``lease_fences`` (``[lease log, name, token]`` lists)."""
    legacy = manifest.get("fences", {})
    if not isinstance(legacy, dict) or not all(_is_fence("", k, v) for k, v in legacy.items()):
        raise ValueError("fences is not an object of lease name -> positive integer token")
    keyed = manifest.get("lease_fences", [])
    if not isinstance(keyed, list) or not all(isinstance(e, list) and len(e) == 3 and _is_fence(*e) for e in keyed):
        raise ValueError("lease_fences is not a list of [lease log, lease name, positive integer token]")
    fences = {("", name): token for name, token in legacy.items()}
    fences.update({(ref, name): token for ref, name, token in keyed})
    return fences


def _is_fence(ref: Any, name: Any, token: Any) -> bool:
    return isinstance(ref, str) and isinstance(name, str) and bool(name) and type(token) is int and 0 < token < 2**64
