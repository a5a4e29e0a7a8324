"""Ops of a write: generated from a state, serialized, encoded into a record body, and decoded back.

Pure: nothing here touches the log, the locks or the replica.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from airflow_provider_pulsarstate.engine.envelope import FenceTag, decode_fenced_writes, encode_write
from airflow_provider_pulsarstate.engine.errors import SerializationError
from airflow_provider_pulsarstate.engine.state.support import describe
from airflow_provider_pulsarstate.engine.writes import PendingWrite

O = TypeVar("O")


def json_op_serializer(op: Any) -> bytes:
    """Default op serializer: compact JSON with sorted keys."""
    return json.dumps(op, separators=(",", ":"), sort_keys=True).encode()


def json_op_deserializer(data: bytes) -> Any:
    """Default op deserializer."""
    return json.loads(data)


class OpCodec(Generic[O]):
    """The caller's op serializer and deserializer, checked, for one topic (named in every error)."""

    def __init__(self, topic: str, serializer: Callable[[O], bytes], deserializer: Callable[[bytes], O]) -> None:
        self.topic = topic
        self.serializer = serializer
        self.deserializer = deserializer

    def generate(self, w: PendingWrite, state: Any) -> tuple[list[O], list[bytes]]:
        """The write's ops from ``state``, and their bytes (raises what the caller's code raises)."""
        ops = list(w.generator(state)) if w.generator is not None else []
        return ops, [self.serialize(op) for op in ops]

    def serialize(self, op: O) -> bytes:
        """The op's bytes; SerializationError when the serializer fails or returns no bytes."""
        try:
            data = self.serializer(op)
        except SerializationError:
            raise
        except Exception as exc:
            raise SerializationError(f"cannot serialize op {op!r} for {self.topic}: {exc}") from exc
        if not isinstance(data, (bytes, bytearray)):
            raise SerializationError(f"op serializer returned {type(data).__name__}, not bytes, for {op!r}")
        return bytes(data)

    def encode(self, w: PendingWrite, payloads: list[bytes]) -> bytes:
        """The write as it goes into the record body; SerializationError if it does not fit the format."""
        try:
            return encode_write(w.seq, payloads, w.fence)
        except Exception as exc:
            raise SerializationError(f"{self.topic}: write {w.seq} cannot be encoded: {describe(exc)}") from exc

    def decode(self, body: bytes) -> list[tuple[int, list[O], FenceTag | None]]:
        """The writes of a DATA record body, their ops deserialized (raises FrameError or what the
        deserializer raises: the caller reports the record as corrupt)."""
        return [(seq, [self.deserializer(p) for p in ops], fence) for seq, ops, fence in decode_fenced_writes(body)]
