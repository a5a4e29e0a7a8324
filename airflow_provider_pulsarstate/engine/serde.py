"""Pluggable key and value serdes (bytes <-> objects) for recipes."""

from __future__ import annotations

import json
from typing import Any, Generic, Protocol, TypeVar, cast

T = TypeVar("T")


class Serde(Protocol[T]):
    """Turns objects into bytes and back. ``deserialize(serialize(x)) == x`` must hold."""

    def serialize(self, obj: T) -> bytes: ...

    def deserialize(self, data: bytes) -> T: ...


class JsonSerde(Generic[T]):
    """JSON with sorted keys and no spaces: equal objects give equal bytes (canonical form)."""

    def serialize(self, obj: T) -> bytes:
        return json.dumps(obj, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()

    def deserialize(self, data: bytes) -> T:
        # json.loads is typed Any; the round-trip contract makes it the T that serialize was given.
        return cast("T", json.loads(data))


class StrSerde:
    """UTF-8 strings."""

    def serialize(self, obj: str) -> bytes:
        if not isinstance(obj, str):
            raise TypeError(f"expected str, got {type(obj).__name__}")
        return obj.encode()

    def deserialize(self, data: bytes) -> str:
        return data.decode()


class BytesSerde:
    """Raw bytes, unchanged."""

    def serialize(self, obj: bytes) -> bytes:
        if not isinstance(obj, (bytes, bytearray)):
            raise TypeError(f"expected bytes, got {type(obj).__name__}")
        return bytes(obj)

    def deserialize(self, data: bytes) -> bytes:
        return data


JSON: Serde[Any] = JsonSerde()
STR = StrSerde()
BYTES = BytesSerde()
