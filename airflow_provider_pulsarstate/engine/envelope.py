"""The frame format every back end stores: a fixed binary header, then a slice of a record body.

A *record* is the unit of atomicity in the log. Large records are cut into *frames* (parts) that
fit the back end's message size; readers apply a record only once its last frame has arrived, so
a writer that dies half-way leaves frames nobody applies. Every frame carries the writer's epoch
(fencing on the read side), the writer's id and the record's offset.

Header layout (big-endian, 44 bytes)::

    magic "PS" | version u8 | kind u8 | epoch i64 | offset i64 | writer id 16 bytes
    | part index u32 | part count u32

The body of a DATA record is a sequence of writes, each ``seq u64 | op count u32`` followed by
``len u32 | op bytes`` per op (see :func:`encode_writes`). A write made under a lease has bit 30 of
its op count set and ``lease log length u16 | lease log (UTF-8) | name length u16 | lease name
(UTF-8) | token u64`` after its head; token 0 there resets that fence instead (no lease log is
ever granted token 0). Writes of earlier versions set the top bit instead and carry
``name length u16 | lease name | token u64`` (no lease log): they still decode, with the lease
log ``""``.
"""

from __future__ import annotations

import enum
import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

MAGIC = b"PS"
VERSION = 1
HEADER = struct.Struct(">2sBBqq16sII")
_WRITE_HEAD = struct.Struct(">QI")
_OP_LEN = struct.Struct(">I")
_FENCE_NAME_LEN = struct.Struct(">H")
_FENCE_TOKEN = struct.Struct(">Q")
_FENCED = 0x8000_0000  # earlier versions: name and token only
_LEASED = 0x4000_0000  # lease log, name and token (0: a reset)
_COUNT_MASK = 0x3FFF_FFFF
_MAX_U16 = 0xFFFF
NO_OFFSET = -1


class RecordKind(enum.IntEnum):
    """What a record is for."""

    EPOCH = 1
    """Written first by every new writer; readers that reach it know everything before it."""
    DATA = 2
    """A group of writes (each a list of ops); the only kind with an offset."""
    BARRIER = 3
    """An empty record that proves the writer still holds its epoch (linearizable reads)."""
    CHECKPOINT = 4
    """A state image, in a checkpoint topic of its own (never in the log it summarizes)."""
    GENESIS = 5
    """The log's birth certificate (log id, creation time), written before its first DATA record
    by the first writer that finds the log empty. Only the first one counts."""


@dataclass(frozen=True, slots=True)
class Frame:
    """One decoded frame: header fields plus its slice of the record body."""

    kind: RecordKind
    epoch: int
    offset: int
    writer_id: bytes
    part_index: int
    part_count: int
    chunk: bytes


class FrameError(ValueError):
    """A frame does not follow the format (the message says which field)."""


def encode_frames(
    *, kind: RecordKind, epoch: int, offset: int, writer_id: bytes, body: bytes, max_frame_bytes: int
) -> list[bytes]:
    """Cut ``body`` into frames of at most ``max_frame_bytes`` (header included)."""
    room = max_frame_bytes - HEADER.size
    if room <= 0:
        raise ValueError(f"max_frame_bytes must exceed the {HEADER.size}-byte header")
    count = max(1, -(-len(body) // room))
    view = memoryview(body)
    return [
        HEADER.pack(MAGIC, VERSION, kind, epoch, offset, writer_id, i, count) + bytes(view[i * room : (i + 1) * room])
        for i in range(count)
    ]


def decode_frame(payload: bytes) -> Frame:
    """Decode one frame; raises :class:`FrameError` naming the bad field."""
    if len(payload) < HEADER.size:
        raise FrameError(f"frame of {len(payload)} bytes is shorter than the {HEADER.size}-byte header")
    magic, version, kind, epoch, offset, writer_id, index, count = HEADER.unpack_from(payload)
    if magic != MAGIC:
        raise FrameError(f"bad magic {magic!r} (not written by airflow_provider_pulsarstate)")
    if version != VERSION:
        raise FrameError(f"unsupported frame version {version}")
    try:
        record_kind = RecordKind(kind)
    except ValueError:
        raise FrameError(f"unknown record kind {kind}") from None
    if count < 1 or index >= count:
        raise FrameError(f"part index {index} out of range for part count {count}")
    return Frame(record_kind, epoch, offset, writer_id, index, count, payload[HEADER.size :])


FenceTag = tuple[str, str, int]
"""What a write carries about its lease: ``(lease log, lease name, token)``; token 0 is a reset."""


def encode_writes(
    writes: Iterable[tuple[int, Sequence[bytes]] | tuple[int, Sequence[bytes], tuple[Any, ...] | None]],
) -> bytes:
    """Encode ``[(seq, [op bytes, ...]), ...]`` as a DATA record body; a third item marks a write
    made under a lease: ``(lease log, lease name, token)`` (see :func:`encode_write`)."""
    return b"".join(encode_write(seq, ops, rest[0] if rest else None) for seq, ops, *rest in writes)


def encode_write(seq: int, ops: Sequence[bytes], fence: tuple[Any, ...] | None = None) -> bytes:
    """One write of a DATA record body.

    ``fence`` is ``(lease log, lease name, token)`` (token 0: a reset of that fence), or the
    ``(lease name, token)`` of earlier versions (for tests of old logs).

    :raises FrameError: a field does not fit the format (names it); nothing is returned.
    """
    if len(ops) > _COUNT_MASK:
        raise FrameError(f"write {seq} has {len(ops)} ops; at most {_COUNT_MASK} fit a write")
    try:
        out = bytearray(_WRITE_HEAD.pack(seq, len(ops) | _fence_flag(fence)))
        if fence is not None:
            out += _encode_fence(fence)
        for op in ops:
            out += _OP_LEN.pack(len(op))
            out += op
    except struct.error as exc:
        raise FrameError(f"write {seq} does not fit the frame format: {exc}") from None
    return bytes(out)


def _fence_flag(fence: tuple[Any, ...] | None) -> int:
    if fence is None:
        return 0
    return _FENCED if len(fence) == 2 else _LEASED


def _encode_fence(fence: tuple[Any, ...]) -> bytes:
    *texts, token = fence
    if isinstance(token, bool) or not isinstance(token, int) or not 0 <= token < 2**64:
        raise FrameError(f"fencing token {token!r} of lease {texts[-1]!r} is not a u64")
    out = bytearray()
    for field, text in zip(("lease log", "lease name")[-len(texts) :], texts):
        try:
            data = text.encode()
        except (UnicodeEncodeError, AttributeError) as exc:
            raise FrameError(f"{field} {text!r:.60} is not UTF-8 text: {exc}") from None
        if len(data) > _MAX_U16:
            raise FrameError(f"{field} {text[:40]!r}... is longer than {_MAX_U16} bytes")
        out += _FENCE_NAME_LEN.pack(len(data)) + data
    return bytes(out + _FENCE_TOKEN.pack(token))


def decode_fenced_writes(body: bytes) -> list[tuple[int, list[bytes], FenceTag | None]]:
    """Inverse of :func:`encode_writes`: ``(seq, ops, (lease log, lease name, token) or None)`` per
    write; a write of an earlier version (lease name only) has the lease log ``""``.

    :raises FrameError: a truncated body, or a lease log or name that is not UTF-8.
    """
    writes: list[tuple[int, list[bytes], FenceTag | None]] = []
    pos, end = 0, len(body)
    view = memoryview(body)
    try:
        while pos < end:
            seq, n = _WRITE_HEAD.unpack_from(body, pos)
            pos += _WRITE_HEAD.size
            fence: FenceTag | None = None
            if n & _FENCED:
                n &= ~_FENCED
                name, pos = _decode_text(body, view, pos, "lease name")
                (token,) = _FENCE_TOKEN.unpack_from(body, pos)
                pos += _FENCE_TOKEN.size
                if token == 0:  # never written by those versions; would read as a reset here
                    raise FrameError(f"write {seq} carries token 0 of lease {name!r}")
                fence = ("", name, token)
            elif n & _LEASED:
                n &= _COUNT_MASK
                lease_log, pos = _decode_text(body, view, pos, "lease log")
                name, pos = _decode_text(body, view, pos, "lease name")
                (token,) = _FENCE_TOKEN.unpack_from(body, pos)
                pos += _FENCE_TOKEN.size
                fence = (lease_log, name, token)
            ops = []
            for _ in range(n):
                (length,) = _OP_LEN.unpack_from(body, pos)
                pos += _OP_LEN.size
                if pos + length > end:
                    raise FrameError(f"op of {length} bytes runs past the end of the record body")
                ops.append(bytes(view[pos : pos + length]))
                pos += length
            writes.append((seq, ops, fence))
    except struct.error as exc:
        raise FrameError(f"truncated record body at byte {pos}: {exc}") from None
    return writes


def _decode_text(body: bytes, view: memoryview, pos: int, field: str) -> tuple[str, int]:
    (length,) = _FENCE_NAME_LEN.unpack_from(body, pos)
    pos += _FENCE_NAME_LEN.size
    if pos + length > len(body):
        raise FrameError(f"{field} of {length} bytes runs past the end of the record body")
    try:
        return bytes(view[pos : pos + length]).decode(), pos + length
    except UnicodeDecodeError:
        raise FrameError(f"{field} at byte {pos} is not UTF-8") from None


def decode_writes(body: bytes) -> list[tuple[int, list[bytes]]]:
    """``[(seq, ops), ...]`` of a body without lease writes (staged view rows).

    :raises FrameError: a truncated body, or a write made under a lease (not expected here).
    """
    writes = []
    for seq, ops, fence in decode_fenced_writes(body):
        if fence is not None:
            raise FrameError(f"write {seq} carries lease {fence[1]!r}, not expected here")
        writes.append((seq, ops))
    return writes


KEY_SET = 1
"""Keyed op: set ``key`` to ``value`` (``kind | key length u32 | key | value``)."""
KEY_DELETE = 2
"""Keyed op: remove ``key`` (``kind | key``)."""


def encode_key_op(kind: int, key: bytes, value: bytes = b"") -> bytes:
    """The keyed-op layout shared by PulsarMap ops and staged view rows."""
    if kind == KEY_SET:
        return bytes([KEY_SET]) + _OP_LEN.pack(len(key)) + key + value
    return bytes([kind]) + key


def decode_key_op(data: bytes) -> tuple[int, bytes, bytes | None]:
    """``(kind, key, value)``; value is None for anything but KEY_SET, key empty past a bare kind byte.

    :raises FrameError: a set op whose key length field is missing or larger than the op.
    """
    if not data:
        raise FrameError("empty keyed op")
    kind = data[0]
    if kind == KEY_SET:
        if len(data) < 1 + _OP_LEN.size:
            raise FrameError(f"keyed set op of {len(data)} bytes is shorter than its key length field")
        (n,) = _OP_LEN.unpack_from(data, 1)
        if 5 + n > len(data):
            raise FrameError(f"keyed set op declares a key length of {n} bytes but holds only {len(data) - 5}")
        return kind, data[5 : 5 + n], data[5 + n :]
    return kind, data[1:], None
