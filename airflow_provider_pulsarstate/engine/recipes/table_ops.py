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

import msgspec

from airflow_provider_pulsarstate.engine.errors import SerializationError

Record = dict[str, Any]
OPS = ("set", "del", "view", "view_end", "seal")

ROW_SET = 0x01
ROW_DELETE = 0x02
_VIEW_LEN = struct.Struct(">H")
_KEY_LEN = struct.Struct(">I")

_canonical_json = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode
_SORTED_JSON = msgspec.json.Encoder(order="sorted")
_INT_LOW, _INT_HIGH = -(2**63), 2**63
_FLOAT_PLAIN = (1e-4, 1e16)  # where msgspec and repr() spell a non-integral float alike (no exponent)


def canonical(record: Record) -> bytes:
    """The canonical bytes of a record: sorted fields, no spaces, integral floats as ints."""
    for v in record.values():
        if type(v) is float and v.is_integer():
            record = {k: int(x) if type(x) is float and x.is_integer() else x for k, x in record.items()}
            break
    return _canonical_json(record).encode()


def fast_canonical(record: Record) -> bytes | None:
    """``canonical(record)``, byte for byte, for the common record; None for any other.

    The common record: a plain dict of str fields whose values are exactly ``str``, ``bool``,
    ``None``, ``int`` within 64 bits, or ``float`` that is integral (within 64 bits) or has a
    magnitude in [1e-4, 1e16) -- where msgspec's sorted JSON spells everything as
    ``json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False)`` does. Anything
    else (subclasses, NaN, infinities, tiny floats spelled with an exponent, huge ints, lone
    surrogates) returns None: the caller then checks and encodes it the slow, exact way.
    """
    integral = False
    for name, value in record.items():
        kind = type(value)
        if kind is float:
            if value.is_integer():
                if not _INT_LOW <= value < _INT_HIGH:
                    return None
                integral = True
            elif not _FLOAT_PLAIN[0] <= abs(value) < _FLOAT_PLAIN[1]:  # NaN fails this too
                return None
        elif kind is int:
            if not _INT_LOW <= value < _INT_HIGH:
                return None
        elif kind is not str and kind is not bool and value is not None:
            return None
        if type(name) is not str:
            return None
    if integral:
        record = {k: int(v) if type(v) is float and v.is_integer() else v for k, v in record.items()}
    try:
        return _SORTED_JSON.encode(record)
    except (UnicodeEncodeError, TypeError, ValueError, OverflowError):
        return None


def record_bytes(key: str, record: Record, *, where: str) -> bytes:
    """The canonical bytes of a row about to be written (staged or put): the fast spelling for
    the common record, the checked exact one for any other.

    :raises SerializationError: ``key`` is not a non-empty str or ``record`` not a dict of JSON
        scalars (finite numbers); the message starts with ``where`` and names the key.
    """
    value = fast_canonical(record) if type(key) is str and key and type(record) is dict else None
    if value is None:
        check_record(key, record)
        try:
            value = canonical(record)
        except (TypeError, ValueError) as exc:
            raise SerializationError(f"{where}: record of key {key!r} is not JSON: {exc}") from exc
    return value


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
        key, view_id = op["k"], op.get("w") or ""
        value = op["v"] if kind == "set" else b""
        if not (isinstance(key, str) and isinstance(view_id, str) and isinstance(value, bytes)):
            raise SerializationError(
                f"table row op {kind!r} of key {key!r}: key and view id must be str and the value canonical bytes "
                f"(got {type(key).__name__}, {type(view_id).__name__}, {type(value).__name__})"
            )
        view = view_id.encode()
        key_bytes = key.encode()
        head = (
            bytes([ROW_SET if kind == "set" else ROW_DELETE])
            + _VIEW_LEN.pack(len(view))
            + view
            + _KEY_LEN.pack(len(key_bytes))
            + key_bytes
        )
        return head + value
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
