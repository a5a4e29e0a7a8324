"""The lease log's codec: its ops and checkpoint image, checked field by field (pure).

Nothing read back from the log is trusted: :func:`parse_lease_op` and :func:`deserialize_image`
check every field and name the bad one. :class:`LeaseRecord` is one lease name's entry in the
replicated state.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeGuard

from airflow_provider_pulsarstate.engine.fencing import MAX_LEASE_NAME_BYTES, MAX_TOKEN, check_text

__all__ = [
    "ACQUIRE",
    "MAX_HOLDER_BYTES",
    "RELEASE",
    "RENEW",
    "LeaseRecord",
    "check_holder",
    "deserialize_image",
    "parse_lease_op",
    "positive",
    "serialize_image",
]

MAX_HOLDER_BYTES = 1024
ACQUIRE, RENEW, RELEASE = "acquire", "renew", "release"
_IMAGE_VERSION = 1


@dataclass(slots=True)
class LeaseRecord:
    """One name's entry in the replicated state (mutated in place by the applier)."""

    holder: str | None
    token: int
    ttl: float
    acquired_at: float
    renewed_at: float
    transitions: int
    offset: int  # of the last acquire or renew

    def fingerprint(self) -> tuple[int, int, float]:
        """Identifies the acquire/renew this record last took in (stable across replays)."""
        return (self.offset, self.token, self.renewed_at)


def parse_lease_op(data: bytes) -> dict[str, Any]:
    """A lease op read from the log, checked field by field (nothing read back is trusted).

    :raises ValueError: not a lease op; the message names the bad field (the manager reports the
        entry as corrupt, with its topic and offset).
    """
    try:
        op = json.loads(data)
    except ValueError as exc:
        raise ValueError(f"lease op is not JSON: {exc}") from None
    if not isinstance(op, dict):
        raise ValueError(f"lease op must be a JSON object, got {type(op).__name__}")
    return validate_op(op)


def validate_op(op: dict[str, Any]) -> dict[str, Any]:
    """``op`` checked field by field and normalized (numbers as floats).

    :raises ValueError: names the bad field.
    """
    kind = op.get("op")
    if kind not in (ACQUIRE, RENEW, RELEASE):
        raise ValueError(f"lease op field 'op' must be one of acquire, renew, release, got {kind!r}")
    name = op.get("name")
    if not isinstance(name, str) or not name or len(name.encode()) > MAX_LEASE_NAME_BYTES:
        raise ValueError(
            f"lease op field 'name' must be a non-empty string of at most {MAX_LEASE_NAME_BYTES} bytes, got {name!r:.80}"
        )
    holder = op.get("holder")
    if not isinstance(holder, str) or not holder or len(holder.encode()) > MAX_HOLDER_BYTES:
        raise ValueError(
            f"lease {name!r}: op field 'holder' must be a non-empty string of at most {MAX_HOLDER_BYTES} bytes, got {holder!r:.80}"
        )
    token = op.get("token")
    if isinstance(token, bool) or not isinstance(token, int) or not 1 <= token <= MAX_TOKEN:
        raise ValueError(f"lease {name!r}: op field 'token' must be an integer in 1 .. 2**64 - 1, got {token!r}")
    out = {"op": kind, "name": name, "holder": holder, "token": token, "at": _number(op, "at", name)}
    if kind != RELEASE:
        ttl = op.get("ttl")
        if not positive(ttl):
            raise ValueError(f"lease {name!r}: op field 'ttl' must be a positive number of seconds, got {ttl!r}")
        out["ttl"] = float(ttl)
    return out


def _number(op: Mapping[str, Any], field: str, name: str) -> float:
    value = op.get(field)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"lease {name!r}: field {field!r} must be a finite number, got {value!r}")
    return float(value)


def positive(value: object) -> TypeGuard[int | float]:
    """A finite number above zero (not a bool)."""
    return not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value) and value > 0


def check_holder(holder: object) -> str:
    """``holder`` if it is non-blank text of at most :data:`MAX_HOLDER_BYTES` UTF-8 bytes.

    :raises ConfigurationError: names the field and the problem.
    """
    return check_text(holder, what="lease holder", field="holder", limit=MAX_HOLDER_BYTES)


def serialize_image(state: dict[str, LeaseRecord]) -> bytes:
    """The checkpoint image of the lease log's state (JSON)."""
    leases = {
        name: [r.holder, r.token, r.ttl, r.acquired_at, r.renewed_at, r.transitions, r.offset]
        for name, r in state.items()
    }
    return json.dumps({"v": _IMAGE_VERSION, "leases": leases}, separators=(",", ":")).encode()


def deserialize_image(data: bytes) -> dict[str, LeaseRecord]:
    """The state an image holds, checked field by field.

    :raises ValueError: another image version, or a bad entry (names the lease and the field).
    """
    image = json.loads(data)
    if not isinstance(image, dict) or image.get("v") != _IMAGE_VERSION or not isinstance(image.get("leases"), dict):
        raise ValueError(f"not a version {_IMAGE_VERSION} lease image")
    state: dict[str, LeaseRecord] = {}
    for name, fields in image["leases"].items():
        if not isinstance(fields, list) or len(fields) != 7:
            raise ValueError(f"lease {name!r}: image entry must be a list of 7 fields")
        holder, token, ttl, acquired_at, renewed_at, transitions, offset = fields
        op = {"op": ACQUIRE, "name": name, "holder": holder or "-", "token": token, "ttl": ttl, "at": acquired_at}
        validate_op(op)
        _number({"renewed_at": renewed_at}, "renewed_at", name)
        for field, value in (("transitions", transitions), ("offset", offset)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"lease {name!r}: image field {field!r} must be an integer >= 0, got {value!r}")
        if holder is not None and (not isinstance(holder, str) or not holder):
            raise ValueError(f"lease {name!r}: image field 'holder' must be null or a non-empty string")
        state[name] = LeaseRecord(holder, token, float(ttl), float(acquired_at), float(renewed_at), transitions, offset)
    return state
