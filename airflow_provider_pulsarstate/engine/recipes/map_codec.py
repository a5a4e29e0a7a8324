"""The byte forms of a :class:`~airflow_provider_pulsarstate.engine.recipes.map.PulsarMap`: its ops
in the log, its checkpoint images, and how an op changes the replica (a dict of serialized values)."""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any, Generic, Literal, TypeVar

import msgspec

from airflow_provider_pulsarstate.engine.envelope import KEY_DELETE, KEY_SET, decode_key_op, encode_key_op
from airflow_provider_pulsarstate.engine.serde import STR, Serde

K = TypeVar("K", bound=Hashable)

PUT, DELETE, CLEAR = KEY_SET, KEY_DELETE, 3
CHANGE_TYPES: dict[int, Literal["set", "delete", "clear"]] = {PUT: "set", DELETE: "delete", CLEAR: "clear"}

# Checkpoint images: a tag byte, then MessagePack. String keys (the default key serde) are stored
# as a map, which decodes straight into the replica's dict; other keys as [key bytes, value] pairs.
_IMAGE_STR_KEYS, _IMAGE_PAIRS = b"s", b"p"
_STR_IMAGE = msgspec.msgpack.Decoder(dict[str, bytes])
_PAIRS_IMAGE = msgspec.msgpack.Decoder(list[tuple[bytes, bytes]])
_IMAGE_ENCODER = msgspec.msgpack.Encoder()


class MapCodec(Generic[K]):
    """Ops and checkpoint images of one map, given its key serde (values are bytes already).

    :param key_bytes: serializes a key of an op (raising the map's own SerializationError).
    """

    __slots__ = ("key_bytes", "key_serde")

    def __init__(self, key_serde: Serde[K], key_bytes: Callable[[K], bytes]) -> None:
        self.key_serde = key_serde
        self.key_bytes = key_bytes

    def serialize_op(self, op: tuple[int, Any, Any]) -> bytes:
        """An op as logged: its kind, then key and value bytes."""
        kind, key, value_bytes = op
        if kind == CLEAR:
            return bytes([CLEAR])
        return encode_key_op(kind, self.key_bytes(key), value_bytes or b"")

    def deserialize_op(self, data: bytes) -> tuple[int, Any, Any]:
        """(kind, key, serialized value): values stay bytes until read."""
        kind, key, value = decode_key_op(data)
        if kind in (PUT, DELETE):
            return (kind, self.key_serde.deserialize(key), value)
        if kind == CLEAR:
            return (CLEAR, None, None)
        raise ValueError(f"unknown map op type {kind}")

    def serialize_image(self, state: dict[K, bytes]) -> bytes:
        """A checkpoint image of the replica."""
        if is_default_str(self.key_serde):
            return _IMAGE_STR_KEYS + _IMAGE_ENCODER.encode(state)
        return _IMAGE_PAIRS + _IMAGE_ENCODER.encode([(self.key_serde.serialize(k), v) for k, v in state.items()])

    def deserialize_image(self, data: bytes) -> dict[K, bytes]:
        """The replica a checkpoint image holds; ValueError when its tag does not fit the key serde."""
        tag, body = data[:1], memoryview(data)[1:]
        if tag == _IMAGE_STR_KEYS and is_default_str(self.key_serde):
            return _STR_IMAGE.decode(body)  # type: ignore[return-value]
        if tag == _IMAGE_PAIRS:
            return {self.key_serde.deserialize(k): v for k, v in _PAIRS_IMAGE.decode(body)}
        raise ValueError(f"image tag {tag!r} does not match this map's key serde")


def is_default_str(serde: object) -> bool:
    """Whether ``serde`` is the default key serde (UTF-8 strings), whose images store keys as a map."""
    return serde is STR


def apply_op(state: dict[Any, Any], op: tuple[int, Any, Any]) -> None:
    kind, key, value = op
    if kind == PUT:
        state[key] = value
    elif kind == DELETE:
        state.pop(key, None)
    else:
        state.clear()
