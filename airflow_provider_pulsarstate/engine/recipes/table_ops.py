"""The records of a StateTable's log, and the canonical bytes of a row.

A row is a dict of JSON scalar fields. The table keeps and compares rows as their *canonical*
bytes (:func:`canonical`: sorted fields, no spaces, integral floats as ints), so a view switch
compares bytes and never decodes a row that did not change.

Ops, as :func:`decode_op` returns them (one dict per op; several ops form one log record):

* ``{"o": "set", "k": key, "v": canonical bytes, "w": view id or None}``
* ``{"o": "del", "k": key, "w": view id or None}``
* ``{"o": "view", "id", "meta"}``, ``{"o": "seal", "id", "stagers", "sources"?}``,
  ``{"o": "view_end", "id", "status", "result"?, "sources"?}``: view life cycle (JSON).

Row ops are written in a binary layout (``kind | u16 view id length | view id | u32 key length |
key | value``), which costs no JSON encoding of a value that is canonical already; view ops are
JSON objects. Logs written before the binary layout (row ops as JSON with the record as an
object) stay readable: their records are canonicalized as they are read.
"""

from __future__ import annotations

import json
import struct
from typing import Any

from airflow_provider_pulsarstate.engine.errors import SerializationError

Record = dict[str, Any]
OPS = ("set", "del", "view", "view_end", "seal")

ROW_SET = 0x01
ROW_DELETE = 0x02
_VIEW_LEN = struct.Struct(">H")
_KEY_LEN = struct.Struct(">I")

_canonical_json = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode


def canonical(record: Record) -> bytes:
    """The canonical bytes of a record: sorted fields, no spaces, integral floats as ints."""
    for v in record.values():
        if type(v) is float and v.is_integer():
            record = {k: int(x) if type(x) is float and x.is_integer() else x for k, x in record.items()}
            break
    return _canonical_json(record).encode()


def check_record(key: str, record: Record) -> None:
    """Raise SerializationError unless ``key`` is a non-empty str and ``record`` a dict of JSON scalars."""
    if not isinstance(key, str) or not key:
        raise SerializationError(f"row key {key!r} must be a non-empty str")
    if not isinstance(record, dict):
        raise SerializationError(f"record of key {key!r} must be a dict of fields, got {type(record).__name__}")
    for name, value in record.items():
        if not isinstance(name, str):
            raise SerializationError(f"record of key {key!r}: field name {name!r} is not a str")
        if value is not None and not isinstance(value, (str, int, float, bool)):
            raise SerializationError(
                f"record of key {key!r}: field {name!r} holds {type(value).__name__}, not a JSON scalar"
            )


def check_canonical(key: str, value: bytes) -> None:
    """Raise ValueError unless ``value`` is the canonical JSON of a dict of JSON scalars."""
    try:
        record = json.loads(value)
        check_record(key, record)
    except SerializationError as exc:
        raise ValueError(str(exc)) from None
    if canonical(record) != value:
        raise ValueError("value is not canonical JSON")


def decode_row(key: str, value: bytes | None) -> Record | None:
    """A stored row's record (None stays None)."""
    return None if value is None else json.loads(value)


def set_op(key: str, value: bytes, view_id: str | None = None) -> dict[str, Any]:
    return {"o": "set", "k": key, "v": value, "w": view_id}


def del_op(key: str, view_id: str | None = None) -> dict[str, Any]:
    return {"o": "del", "k": key, "w": view_id}


def encode_op(op: dict[str, Any]) -> bytes:
    """The bytes of one op (binary for row ops whose value is canonical bytes, JSON otherwise)."""
    kind = op["o"]
    if kind == "set" or kind == "del":
        view = (op.get("w") or "").encode()
        key = op["k"].encode()
        head = bytes([ROW_SET if kind == "set" else ROW_DELETE]) + _VIEW_LEN.pack(len(view)) + view + _KEY_LEN.pack(len(key)) + key
        return head + op["v"] if kind == "set" else head
    try:
        return json.dumps(op, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()
    except (TypeError, ValueError) as exc:
        raise SerializationError(f"cannot serialize table op {kind!r} of view {op.get('id')!r}: {exc}") from exc


def decode_op(data: bytes) -> dict[str, Any]:
    """One op (see the module docstring).

    :raises ValueError: not an op of a table log (a truncated row op, an unknown kind).
    """
    if data[:1] in (b"\x01", b"\x02"):
        kind = data[0]
        if len(data) < 3:
            raise ValueError(f"table row op of {len(data)} bytes is truncated")
        (n,) = _VIEW_LEN.unpack_from(data, 1)
        at = 3 + n
        if len(data) < at + 4:
            raise ValueError("table row op is truncated in its view id or key length")
        view = data[3:at].decode() or None
        (k,) = _KEY_LEN.unpack_from(data, at)
        at += 4
        if len(data) < at + k or (kind == ROW_DELETE and len(data) != at + k):
            raise ValueError(f"table row op declares a {k}-byte key but holds {len(data) - at} bytes after it")
        key = data[at : at + k].decode()
        if kind == ROW_SET:
            return {"o": "set", "k": key, "v": data[at + k :], "w": view}
        return {"o": "del", "k": key, "w": view}
    op = json.loads(data)
    if not isinstance(op, dict) or op.get("o") not in OPS:
        raise ValueError(f"unknown table op type {op.get('o') if isinstance(op, dict) else op!r}")
    if op["o"] == "set" and isinstance(op.get("v"), dict):  # written before the binary layout
        op["v"] = canonical(op["v"])
    return op


def decode_checked_op(data: bytes) -> dict[str, Any]:
    """:func:`decode_op`, also refusing row ops without a str key or a set without a record
    (the deserializer every reader of a table log uses)."""
    op = decode_op(data)
    kind = op["o"]
    if (kind == "set" or kind == "del") and not isinstance(op.get("k"), str):
        raise ValueError(f"table {kind} op without a str key: {op.get('k')!r}")
    if kind == "set" and not isinstance(op.get("v"), bytes):
        raise ValueError(f"table set op of key {op['k']!r} holds no record")
    return op
