"""PulsarMap: a replicated key-value table on one topic (the PIP-137 PulsarMap, Pythonic)."""

from __future__ import annotations

from collections.abc import Callable, Hashable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Generic, Literal, TypeVar, overload

from airflow_provider_pulsarstate.engine.backends.base import Backend
from airflow_provider_pulsarstate.engine.checkpoint import CheckpointInfo
from airflow_provider_pulsarstate.engine.errors import SerializationError, ValueTooLargeError, WriteId
from airflow_provider_pulsarstate.engine.fencing import Fence
from airflow_provider_pulsarstate.engine.manager import Change, ListenerErrorHandler, SharedStateManager
from airflow_provider_pulsarstate.engine.recipes.base import Recipe
from airflow_provider_pulsarstate.engine.recipes.map_codec import (
    CHANGE_TYPES,
    CLEAR,
    DELETE,
    PUT,
    MapCodec,
    apply_op,
)
from airflow_provider_pulsarstate.engine.serde import JSON, STR, Serde
from airflow_provider_pulsarstate.engine.writes import WriteOutcome

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")

_PUT = PUT  # the op kind's earlier name here (tests build raw map ops with it)
DEFAULT_MAX_VALUE_BYTES = 4 * 1024 * 1024
DEFAULT_CHECKPOINT_AFTER_BYTES = 8 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class MapChange(Generic[K, V]):
    """One committed change, as listeners receive it."""

    type: Literal["set", "delete", "clear"]
    key: K | None
    value: V | None
    offset: int
    publish_time: float


class PulsarMap(Recipe, Generic[K, V]):
    """A key-value table every instance replicates from the log; writes go through one writer.

    Example::

        from airflow_provider_pulsarstate import ConnectionConfig, PulsarMap, open_backend

        backend = open_backend(ConnectionConfig(url="pulsar://localhost:6650"))
        with PulsarMap(backend, "persistent://public/default/assignments") as assignments:
            assignments.put("shard-1", {"owner": "worker-a"})
            assignments.update("runs", lambda k, v: (v or 0) + 1)  # atomic read-modify-write
            assignments.get("shard-1", latest=True)                 # -> {"owner": "worker-a"}

    Consistency: ``get``/``scan`` answer from the local replica (``latest=True`` first reads up
    to the tail; ``linearizable=True`` also proves no newer writer exists). Every write is a
    read-modify-write on the latest state under the exclusive writer, so ``update`` is atomic
    across instances. Return values follow the PIP: a single-key write returns the key's value
    after the write (None when absent); :meth:`pop` returns the value before.

    A write whose result equals the current value (same serialized bytes) appends nothing. Keys
    and given values are serialized when the method is called, values computed by an
    ``operation`` when it runs; either way a key or value that does not serialize or is too large
    fails before the writer is taken and appends nothing.

    Every write takes ``lease``: a :class:`~airflow_provider_pulsarstate.engine.recipes.lease.Lease`
    the write is made under; the log refuses it (LeaseFencedError) once it has seen a newer token
    of that lease. Every blocking method takes ``timeout`` (seconds for the whole call; see
    :meth:`SharedStateManager.write` and :meth:`SharedStateManager.read`). A write that times
    out while being sent raises UnknownOutcomeError: ask :meth:`outcome` with ``err.write_id``
    before sending it again.

    Checkpoints: the writer stores an image of the table once ``checkpoint_after_bytes`` of log
    (and at least a quarter of the last image's size) accumulated, so a new instance loads the
    image and replays only the records after it. :meth:`checkpoint` writes one on demand.

    The replica keeps values serialized and decodes them when read, so replaying a long log
    costs no value decoding and holds compact bytes; a stored value that no longer decodes
    raises SerializationError naming the key when it is read.

    :param backend: where the log lives.
    :param topic: the fully qualified topic.
    :param key_serde: keys <-> bytes (UTF-8 strings by default).
    :param value_serde: values <-> bytes (JSON by default).
    :param max_value_bytes: larger serialized values are refused with ValueTooLargeError
        before anything is appended.
    :param checkpoint_after_bytes: log bytes between automatic checkpoints (None: only explicit).
    :param manager_options: passed to :class:`SharedStateManager` (acquire_mode, timeouts,
        ``use_checkpoints``, ...).
    :raises SerializationError: a key or value cannot be serialized (nothing is appended).
    :raises CorruptEntryError: the log holds an entry that is not a valid map op.
    """

    def __init__(
        self,
        backend: Backend,
        topic: str,
        *,
        key_serde: Serde[K] = STR,  # type: ignore[assignment]
        value_serde: Serde[V] = JSON,
        max_value_bytes: int = DEFAULT_MAX_VALUE_BYTES,
        checkpoint_after_bytes: int | None = DEFAULT_CHECKPOINT_AFTER_BYTES,
        **manager_options: Any,
    ) -> None:
        self.topic = topic
        self.key_serde = key_serde
        self.value_serde = value_serde
        self.max_value_bytes = max_value_bytes
        self._listeners: list[tuple[Callable[..., None], Callable[..., None]]] = []
        codec = MapCodec(key_serde, self._key_bytes)
        self._serialize_op, self._deserialize_op = codec.serialize_op, codec.deserialize_op
        self.manager: SharedStateManager[dict[K, bytes], tuple[int, Any, Any]] = SharedStateManager(
            backend,
            topic,
            initializer=dict,
            applier=apply_op,
            op_serializer=self._serialize_op,
            op_deserializer=self._deserialize_op,
            state_serializer=codec.serialize_image,
            state_deserializer=codec.deserialize_image,
            checkpoint_after_bytes=checkpoint_after_bytes,
            **manager_options,
        )

    # ------------------------------------------------------------------ op codec
    def _encode(self, key: K, value: V) -> bytes:
        """Serialize a value (before anything is appended); enforces ``max_value_bytes``."""
        try:
            data = self.value_serde.serialize(value)
        except Exception as exc:
            raise SerializationError(f"{self.topic}: cannot serialize the value of key {key!r}: {exc}") from exc
        if len(data) > self.max_value_bytes:
            raise ValueTooLargeError(
                f"{self.topic}: value of key {key!r} is {len(data):,} bytes, over the "
                f"{self.max_value_bytes:,}-byte limit (max_value_bytes)"
            )
        return data

    @overload
    def _decode(self, key: K, data: bytes) -> V: ...

    @overload
    def _decode(self, key: K, data: bytes | None) -> V | None: ...

    def _decode(self, key: K, data: bytes | None) -> V | None:
        if data is None:
            return None
        try:
            return self.value_serde.deserialize(data)
        except Exception as exc:
            raise SerializationError(f"{self.topic}: the stored value of key {key!r} does not decode: {exc}") from exc

    def _key_bytes(self, key: K) -> bytes:
        try:
            return self.key_serde.serialize(key)
        except Exception as exc:
            raise SerializationError(f"{self.topic}: cannot serialize key {key!r}: {exc}") from exc

    # ------------------------------------------------------------------ reads
    def get(
        self, key: K, *, latest: bool = False, linearizable: bool = False, timeout: float | None = None
    ) -> V | None:
        """The value of ``key``, or None."""
        return self.get_or_default(key, None, latest=latest, linearizable=linearizable, timeout=timeout)

    def get_or_default(
        self,
        key: K,
        default: V | None,
        *,
        latest: bool = False,
        linearizable: bool = False,
        timeout: float | None = None,
    ) -> V | None:
        """The value of ``key``, or ``default``."""
        data = self.manager.read(lambda m: m.get(key), latest=latest, linearizable=linearizable, timeout=timeout)
        return default if data is None else self._decode(key, data)

    def scan(
        self,
        filter: Callable[[K], bool],
        processor: Callable[[K, V], None],
        *,
        latest: bool = False,
        timeout: float | None = None,
    ) -> int:
        """Call ``processor(key, value)`` for every key that ``filter`` accepts; returns how many.

        Runs on one consistent snapshot (no write is applied in the middle of a scan).
        """

        def run(m: dict[K, bytes]) -> int:
            n = 0
            for k, v in m.items():
                if filter(k):
                    processor(k, self._decode(k, v))
                    n += 1
            return n

        return self.manager.read(run, latest=latest, timeout=timeout)

    def list_keys(self, *, latest: bool = False, timeout: float | None = None) -> list[K]:
        """All keys, in insertion order."""
        return self.manager.read(lambda m: list(m), latest=latest, timeout=timeout)

    def to_dict(self, *, latest: bool = False, timeout: float | None = None) -> dict[K, V]:
        """A shallow copy of the whole table."""
        return self.manager.read(
            lambda m: {k: self._decode(k, v) for k, v in m.items()},
            latest=latest,
            timeout=timeout,
        )

    def size(self, *, latest: bool = False, timeout: float | None = None) -> int:
        """Number of keys."""
        return self.manager.read(len, latest=latest, timeout=timeout)

    # ------------------------------------------------------------------ writes
    def update(
        self,
        key: K,
        operation: Callable[[K, V | None], V | None],
        *,
        retry: bool = True,
        timeout: float | None = None,
        lease: Fence | None = None,
    ) -> V | None:
        """Atomically set ``key`` to ``operation(key, current)``; None deletes it. Returns the new value.

        ``operation`` may run more than once (after fencing, and once before the writer is
        taken); it must be free of side effects.
        """
        return self.manager.write(*self._update(key, operation), retry=retry, timeout=timeout, lease=lease)

    def update_async(
        self, key: K, operation: Callable[[K, V | None], V | None], *, retry: bool = True, lease: Fence | None = None
    ) -> Future[Any]:
        """:meth:`update` returning a Future; concurrent updates share one commit."""
        return self.manager.write_async(*self._update(key, operation), retry=retry, lease=lease)

    def _update(
        self, key: K, operation: Callable[[K, V | None], V | None]
    ) -> tuple[Callable[..., Any], Callable[..., Any]]:
        self._key_bytes(key)  # a bad key fails now, not in the committer

        def ops(m: dict[K, bytes]) -> list[tuple[int, Any, Any]]:
            stored = m.get(key)
            new = operation(key, self._decode(key, stored))
            if new is None:
                return [(DELETE, key, None)] if stored is not None else []
            data = self._encode(key, new)
            return [] if data == stored else [(PUT, key, data)]

        return ops, lambda m: self._decode(key, m.get(key))

    def _set(
        self, key: K, value: V | None, when: Callable[[V | None], bool]
    ) -> tuple[Callable[..., Any], Callable[..., Any]]:
        """Set ``key`` to ``value`` (None: delete) if ``when(current)``; key and value serialized now."""
        self._key_bytes(key)
        data = None if value is None else self._encode(key, value)

        def ops(m: dict[K, bytes]) -> list[tuple[int, Any, Any]]:
            stored = m.get(key)
            if stored == data or (when is not _always and not when(self._decode(key, stored))):
                return []
            return [(DELETE, key, None)] if data is None else [(PUT, key, data)]

        return ops, lambda m: self._decode(key, m.get(key))

    def update_multiple(
        self,
        filter: Callable[[K], bool],
        operation: Callable[[K, V], V | None],
        *,
        retry: bool = True,
        timeout: float | None = None,
        lease: Fence | None = None,
    ) -> int:
        """Apply ``operation`` to every key ``filter`` accepts, all in one atomic write.

        None deletes the key. Returns the number of keys changed.
        """
        changed: list[int] = [0]

        def ops(m: dict[K, bytes]) -> list[tuple[int, Any, Any]]:
            out: list[tuple[int, K, bytes | None]] = []
            for k, stored in m.items():
                if not filter(k):
                    continue
                new = operation(k, self._decode(k, stored))
                if new is None:
                    out.append((DELETE, k, None))
                elif (data := self._encode(k, new)) != stored:
                    out.append((PUT, k, data))
            changed[0] = len(out)
            return out

        self.manager.write(ops, retry=retry, timeout=timeout, lease=lease)
        return changed[0]

    def put(
        self, key: K, value: V, *, retry: bool = True, timeout: float | None = None, lease: Fence | None = None
    ) -> V | None:
        """Set ``key`` to ``value``; returns the value after the write (``value``)."""
        return self.manager.write(*self._set(key, value, _always), retry=retry, timeout=timeout, lease=lease)

    def put_async(self, key: K, value: V, *, retry: bool = True, lease: Fence | None = None) -> Future[Any]:
        """:meth:`put` returning a Future."""
        return self.manager.write_async(*self._set(key, value, _always), retry=retry, lease=lease)

    def put_if_absent(
        self, key: K, value: V, *, retry: bool = True, timeout: float | None = None, lease: Fence | None = None
    ) -> V | None:
        """Set ``key`` only when it has no value; returns the value after (existing or ``value``)."""
        return self.manager.write(*self._set(key, value, _is_none), retry=retry, timeout=timeout, lease=lease)

    def replace(
        self,
        key: K,
        expected: V | None,
        value: V,
        *,
        retry: bool = True,
        timeout: float | None = None,
        lease: Fence | None = None,
    ) -> V | None:
        """Compare-and-set: set ``key`` to ``value`` only when it currently equals ``expected``
        (None: absent). Returns the value after the write."""
        return self.manager.write(
            *self._set(key, value, lambda v: v == expected), retry=retry, timeout=timeout, lease=lease
        )

    def delete(self, key: K, *, retry: bool = True, timeout: float | None = None, lease: Fence | None = None) -> None:
        """Remove ``key`` (PIP semantics: returns the value after, i.e. None)."""
        self.manager.write(*self._set(key, None, _always), retry=retry, timeout=timeout, lease=lease)

    def pop(self, key: K, *, retry: bool = True, timeout: float | None = None, lease: Fence | None = None) -> V | None:
        """Remove ``key`` and return the value it had."""
        self._key_bytes(key)
        before: V | None = None

        def ops(m: dict[K, bytes]) -> list[tuple[int, Any, Any]]:
            nonlocal before
            before = self._decode(key, m.get(key))
            return [(DELETE, key, None)] if key in m else []

        self.manager.write(ops, retry=retry, timeout=timeout, lease=lease)
        return before

    def clear(self, *, retry: bool = True, timeout: float | None = None, lease: Fence | None = None) -> int:
        """Remove every key in one atomic write; returns how many there were."""
        count: list[int] = [0]

        def ops(m: dict[K, bytes]) -> list[tuple[int, Any, Any]]:
            count[0] = len(m)
            return [(CLEAR, None, None)] if m else []

        self.manager.write(ops, retry=retry, timeout=timeout, lease=lease)
        return count[0]

    def outcome(self, write_id: WriteId | tuple[bytes, int], *, timeout: float | None = None) -> WriteOutcome:
        """What became of a write that raised UnknownOutcomeError (``err.write_id``); see
        :meth:`SharedStateManager.outcome`. Send it again only on NOT_LANDED."""
        return self.manager.outcome(write_id, timeout=timeout)

    def checkpoint(self) -> CheckpointInfo | None:
        """Store an image of the table as of the tail now (see :meth:`SharedStateManager.checkpoint`)."""
        return self.manager.checkpoint()

    # ------------------------------------------------------------------ listeners & lifecycle
    def add_listener(
        self,
        listener: Callable[[MapChange[K, V]], None],
        *,
        on_error: Callable[[BaseException, MapChange[K, V] | None], None] | None = None,
    ) -> Callable[[MapChange[K, V]], None]:
        """Call ``listener`` for every committed change from now on (like TableView's listen).

        Changes by other instances arrive on the next read with ``latest=True``, or by
        themselves when the map was created with ``follow_interval``. An exception from the
        listener is logged (topic, offset), counted in ``manager.stats["listener_errors"]`` and
        passed to ``on_error(exc, change)`` (change None when the stored value does not decode).
        See :meth:`SharedStateManager.add_listener` for what a listener may do.

        :returns: ``listener``, to pass to :meth:`remove_listener`.
        """

        def on_change(change: Change[tuple[int, Any, Any]]) -> None:
            listener(self._map_change(change))

        handler: ListenerErrorHandler | None = None
        if on_error is not None:

            def handler(exc: BaseException, change: Change[Any]) -> None:
                try:
                    mapped: MapChange[K, V] | None = self._map_change(change)
                except SerializationError:
                    mapped = None
                on_error(exc, mapped)

        self.manager.add_listener(on_change, on_error=handler)
        self._listeners.append((listener, on_change))
        return listener

    def remove_listener(self, listener: Callable[[MapChange[K, V]], None]) -> bool:
        """Stop calling ``listener`` (one registration of it); False if it was not registered."""
        for i, (registered, wrapper) in enumerate(self._listeners):
            if registered is listener or registered == listener:
                del self._listeners[i]
                return self.manager.remove_listener(wrapper)
        return False

    def _map_change(self, change: Change[tuple[int, Any, Any]]) -> MapChange[K, V]:
        kind, key, data = change.op
        value = self._decode(key, data) if kind == PUT else None
        return MapChange(CHANGE_TYPES[kind], key, value, change.offset, change.publish_time)


def _always(current: Any) -> bool:
    return True


def _is_none(current: Any) -> bool:
    return current is None
