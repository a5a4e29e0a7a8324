"""StateStore: task and asset state (Airflow's AIP-103 state store), one PulsarMap per scope.

No Airflow import: a plain Python process reads what tasks stored. Each DAG run's task state is in
its own map, each asset's state in its own map (:mod:`.scope_topics`)::

    <state topic>-<namespace>-r<digest of namespace, dag id, run id>   task state of one DAG run
    <state topic>-<namespace>-a<digest of namespace, asset name>       state of one asset

so a process opens only the maps of the scopes it touches, and no map grows with the deployment.
Keys inside a map (the same layout as the earlier single map, which ``state-store-migrate`` moves
from)::

    <namespace>/task/<dag_id>/<run_id>/<task_id>/<map_index>/<key>
    <namespace>/asset/<asset name>/<key>

every segment percent-quoted (``quote(s, safe="")``), so a ``/`` inside a dag id, run id, task id,
asset name or key cannot forge another entry. A value is a record ``{"json": <JSON text>,
"expires_at": <epoch seconds or null>}``: the JSON text is what Airflow's API hands over, stored
verbatim; an entry past ``expires_at`` reads as absent on the reader's clock (and
:meth:`StateStore.remove_expired` deletes it on the clock it is given).

Reading a task's or an asset's state outside Airflow::

    from airflow_provider_pulsarstate import ConnectionConfig, open_backend
    from airflow_provider_pulsarstate.engine.recipes.state_store import (
        AssetStateScope, OwnedMaps, StateStore, TaskStateScope)

    backend = open_backend(ConnectionConfig(url="pulsar://localhost:6650"))  # or the embedded file's path
    with OwnedMaps(backend) as maps:
        store = StateStore(maps, "persistent://public/default/airflow-state-store",
                           namespace="prod")                       # [pulsarstate] key_namespace
        store.get(TaskStateScope("my_dag", "manual__2026-01-01", "extract"), "job_id")
        store.entries(TaskStateScope("my_dag", "manual__2026-01-01", "extract"), all_map_indices=True)
        store.entries(AssetStateScope("s3://bucket/prices"))   # {key: value}
        store.update(AssetStateScope("prices"), "runs", lambda v: (v or 0) + 1)   # atomic

Concurrency: :meth:`StateStore.update` and :meth:`StateStore.compare_and_set` are evaluated by the
scope map's single writer on the latest state, so concurrent updaters in any number of processes
lose nothing (upstream's ``set(key, get(key) + 1)`` does). Reads use ``latest=True`` by default:
they see every write acknowledged before the call, from any process.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from urllib.parse import unquote

from airflow_provider_pulsarstate.engine.recipes.map import PulsarMap
from airflow_provider_pulsarstate.engine.recipes.scope_topics import (
    ASSET_KIND,
    RUN_KIND,
    drop_map_if_unchanged,
    list_scope_topics,
    scope_topic,
    scope_topic_prefix,
)
from airflow_provider_pulsarstate.engine.recipes.state_keys import (
    KEEP,
    AssetStateScope,
    StateEntry,
    StateScope,
    StateScopeError,
    StateStoreDataError,
    TaskStateScope,
    expiry_epoch,
    parse_state_key,
    state_key_prefix,
    state_map_key,
)
from airflow_provider_pulsarstate.engine.recipes.state_maps import MapSource, OwnedMaps

log = logging.getLogger(__name__)

DEFAULT_STATE_TOPIC = "airflow-state-store"

__all__ = [
    "DEFAULT_STATE_TOPIC",
    "KEEP",
    "AssetStateScope",
    "MapSource",
    "OwnedMaps",
    "ScopeMap",
    "StateEntry",
    "StateScope",
    "StateScopeError",
    "StateStore",
    "StateStoreDataError",
    "TaskStateScope",
    "parse_state_key",
]


@dataclass(frozen=True)
class ScopeMap:
    """One scope map as listed: its topic, kind (``task`` or ``asset``), the scope it belongs to
    (None: a key of another namespace or scope is in it, so it is not this store's to touch) and
    its raw entries."""

    topic: str
    kind: str
    owner: TaskStateScope | AssetStateScope | None
    entries: dict[str, Any]


class StateStore:
    """Task and asset state in one :class:`PulsarMap` per scope (see the module docstring).

    :param maps: where the maps come from (:class:`OwnedMaps`, or the hook's process-wide pool).
    :param base_topic: the full state topic (``[pulsarstate] state_store_topic``); map topics derive from it.
    :param namespace: first key segment (``[pulsarstate] key_namespace``), part of every map topic too.
    :param clock: epoch seconds now (tests).
    """

    def __init__(
        self,
        maps: MapSource,
        base_topic: str,
        *,
        namespace: str,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if not namespace or "/" in namespace:
            raise ValueError(f"namespace must be non-empty without '/': {namespace!r}")
        self.maps = maps
        self.base_topic = base_topic
        self.namespace = namespace
        self._clock = clock

    # ------------------------------------------------------------------ keys and topics
    def scope_prefix(self, scope: StateScope, *, all_map_indices: bool = False) -> str:
        """The key prefix of every entry of ``scope`` (of every map index with ``all_map_indices``)."""
        return state_key_prefix(self.namespace, scope, all_map_indices=all_map_indices)

    def map_key(self, scope: StateScope, key: str) -> str:
        """The map key of ``key`` in ``scope``."""
        return state_map_key(self.namespace, scope, key)

    def parse_key(self, map_key: Any) -> tuple[StateScope, str]:
        """``(scope, key)`` of a map key of this namespace (:func:`parse_state_key`)."""
        return parse_state_key(self.namespace, map_key)

    def owns(self, map_key: str) -> bool:
        """Whether ``map_key`` is a well-formed state key of this namespace (e.g. a reference read from a DB)."""
        try:
            self.parse_key(map_key)
        except StateStoreDataError:
            return False
        return True

    def topic_of(self, scope: StateScope) -> str:
        """The topic of the map holding ``scope``: its DAG run's map, or its asset's."""
        if isinstance(scope, TaskStateScope):
            return scope_topic(self.base_topic, self.namespace, RUN_KIND, scope.dag_id, scope.run_id)
        if isinstance(scope, AssetStateScope):
            state_key_prefix(self.namespace, scope)  # checks the name
            return scope_topic(self.base_topic, self.namespace, ASSET_KIND, scope.name)
        raise TypeError(f"expected TaskStateScope or AssetStateScope, not {type(scope).__name__}")

    def table(self, scope: StateScope) -> AbstractContextManager[PulsarMap[str, Any]]:
        """The map of ``scope`` (borrowed while the ``with`` block runs)."""
        return self.maps.borrow(self.topic_of(scope))

    # ------------------------------------------------------------------ records
    def _record(self, map_key: str, raw: Any, topic: str = "") -> StateEntry:
        if (
            not isinstance(raw, dict)
            or set(raw) != {"json", "expires_at"}
            or not isinstance(raw["json"], str)
            or not (
                raw["expires_at"] is None
                or (isinstance(raw["expires_at"], (int, float)) and not isinstance(raw["expires_at"], bool))
            )
        ):
            raise StateStoreDataError(
                f"{topic}: state entry {map_key!r} is not a state record "
                f'{{"json": <text>, "expires_at": <epoch|null>}}: {str(raw)[:200]!r}'
            )
        try:
            json.loads(raw["json"])
        except ValueError as exc:
            raise StateStoreDataError(f"{topic}: state entry {map_key!r} holds text that is not JSON: {exc}") from None
        key = unquote(map_key.rsplit("/", 1)[-1])
        return StateEntry(map_key, key, raw["json"], None if raw["expires_at"] is None else float(raw["expires_at"]))

    def record(self, map_key: str, raw: Any) -> StateEntry:
        """The entry a raw map value holds.

        :raises StateStoreDataError: not a state record (names the key).
        """
        return self._record(map_key, raw)

    def _live(self, map_key: str, raw: Any, now: float, topic: str = "") -> StateEntry | None:
        if raw is None:
            return None
        entry = self._record(map_key, raw, topic)
        return None if entry.expires_at is not None and entry.expires_at <= now else entry

    @staticmethod
    def _raw(json_text: str, expires_at: float | None) -> dict[str, Any]:
        return {"json": json_text, "expires_at": expires_at}

    @staticmethod
    def _dumps(value: Any, map_key: str) -> str:
        try:
            return json.dumps(value)
        except (TypeError, ValueError) as exc:
            raise StateStoreDataError(
                f"the value for state entry {map_key!r} is not JSON-serializable: {exc}"
            ) from None

    # ------------------------------------------------------------------ reads
    def get_entry(self, scope: StateScope, key: str, *, latest: bool = True) -> StateEntry | None:
        """The live entry of ``key`` in ``scope`` (None when absent or expired)."""
        map_key = self.map_key(scope, key)
        with self.table(scope) as table:
            return self._live(map_key, table.get(map_key, latest=latest), self._clock(), table.topic)

    def get_entry_by_key(self, map_key: str, *, latest: bool = True) -> StateEntry | None:
        """The live entry under ``map_key`` of this namespace (None when absent or expired).

        :raises StateStoreDataError: not a state key of this namespace.
        """
        scope, key = self.parse_key(map_key)
        return self.get_entry(scope, key, latest=latest)

    def get_json(self, scope: StateScope, key: str, *, latest: bool = True) -> str | None:
        """The stored JSON text (as Airflow's API handed it over), or None when absent or expired."""
        entry = self.get_entry(scope, key, latest=latest)
        return None if entry is None else entry.json

    def get(self, scope: StateScope, key: str, default: Any = None, *, latest: bool = True) -> Any:
        """The decoded value, or ``default`` when absent or expired."""
        entry = self.get_entry(scope, key, latest=latest)
        return default if entry is None else entry.value

    def entries(self, scope: StateScope, *, all_map_indices: bool = False, latest: bool = True) -> dict[Any, Any]:
        """Live entries of ``scope`` as ``{key: value}``; with ``all_map_indices`` (tasks) as
        ``{(map_index, key): value}``."""
        prefix = self.scope_prefix(scope, all_map_indices=all_map_indices)
        out: dict[Any, Any] = {}
        now = self._clock()
        with self.table(scope) as table:

            def collect(map_key: str, raw: Any) -> None:
                entry = self._live(map_key, raw, now, table.topic)
                if entry is None:
                    return
                if all_map_indices and isinstance(scope, TaskStateScope):
                    index = int(map_key[len(prefix) :].split("/", 1)[0])
                    out[(index, entry.key)] = entry.value
                else:
                    out[entry.key] = entry.value

            table.scan(lambda k: k.startswith(prefix), collect, latest=latest)
        return out

    # ------------------------------------------------------------------ writes
    def set_json(
        self, scope: StateScope, key: str, json_text: str, *, expires_at: datetime | float | None = None
    ) -> None:
        """Store JSON text verbatim (checked to parse) until ``expires_at`` (None: never expires)."""
        map_key = self.map_key(scope, key)
        if not isinstance(json_text, str):
            raise StateStoreDataError(
                f"the value for state entry {map_key!r} must be JSON text, not {type(json_text).__name__}"
            )
        try:
            json.loads(json_text)
        except ValueError as exc:
            raise StateStoreDataError(f"the value for state entry {map_key!r} is not JSON text: {exc}") from None
        with self.table(scope) as table:
            table.put(map_key, self._raw(json_text, expiry_epoch(expires_at)))

    def set(self, scope: StateScope, key: str, value: Any, *, expires_at: datetime | float | None = None) -> None:
        """Store ``value`` (JSON-serializable) until ``expires_at`` (None: never expires)."""
        self.set_json(scope, key, self._dumps(value, self.map_key(scope, key)), expires_at=expires_at)

    def set_expiry(self, scope: StateScope, key: str, expires_at: datetime | float | None) -> bool:
        """Change a live entry's expiry, atomically; False when there is none."""
        map_key, when = self.map_key(scope, key), expiry_epoch(expires_at)
        found = False

        def op(_: str, raw: Any) -> Any:
            nonlocal found
            entry = self._live(map_key, raw, self._clock())
            found = entry is not None
            return None if entry is None else self._raw(entry.json, when)

        with self.table(scope) as table:
            table.update(map_key, op)
        return found

    def delete(self, scope: StateScope, key: str) -> None:
        """Remove one entry (no-op when absent)."""
        with self.table(scope) as table:
            table.delete(self.map_key(scope, key))

    def clear(self, scope: StateScope, *, all_map_indices: bool = False) -> int:
        """Remove every entry of ``scope`` (of every map index with ``all_map_indices``) in one
        atomic write; returns how many were removed."""
        prefix = self.scope_prefix(scope, all_map_indices=all_map_indices)
        with self.table(scope) as table:
            return table.update_multiple(lambda k: k.startswith(prefix), lambda k, v: None)

    def update(self, scope: StateScope, key: str, fn: Callable[[Any], Any], *, expires_at: Any = KEEP) -> Any:
        """Atomically replace the value with ``fn(current)`` (``current``: the decoded value, None
        when absent or expired); ``fn`` returning None deletes the entry. Returns the new value.

        ``fn`` runs under the scope map's single writer on the latest state (and may run more than
        once: keep it free of side effects), so concurrent updaters in any process lose nothing.
        ``expires_at``: KEEP (the entry's current expiry; none for a new entry), None or a time.
        """
        map_key = self.map_key(scope, key)
        result: Any = None

        def op(_: str, raw: Any) -> Any:
            nonlocal result
            entry = self._live(map_key, raw, self._clock())
            result = fn(None if entry is None else entry.value)
            if result is None:
                return None
            when = (entry.expires_at if entry is not None else None) if expires_at is KEEP else expiry_epoch(expires_at)
            return self._raw(self._dumps(result, map_key), when)

        with self.table(scope) as table:
            table.update(map_key, op)
        return result

    def compare_and_set(
        self, scope: StateScope, key: str, expected: Any, new: Any, *, expires_at: datetime | float | None = None
    ) -> bool:
        """Set the value to ``new`` (None: delete) only if it currently equals ``expected`` (None:
        absent or expired), atomically. Returns whether it was set."""
        map_key = self.map_key(scope, key)
        new_text = None if new is None else self._dumps(new, map_key)
        applied = False

        def op(_: str, raw: Any) -> Any:
            nonlocal applied
            entry = self._live(map_key, raw, self._clock())
            current = None if entry is None else entry.value
            applied = current == expected and (entry is not None or expected is None)
            if not applied:
                return raw if entry is not None else None
            return None if new_text is None else self._raw(new_text, expiry_epoch(expires_at))

        with self.table(scope) as table:
            table.update(map_key, op)
        return applied

    # ------------------------------------------------------------------ clean-up
    def _fresh(self, topic: str) -> PulsarMap[str, Any]:
        """A map of its own for the clean-up (closed after use), never one a pool keeps open: a
        map it deletes must have no reader left behind."""
        return PulsarMap(self.maps.backend, topic, writer_idle_timeout=0.2)

    def list_maps(self, *, kinds: tuple[str, ...] = ("task", "asset")) -> Iterator[ScopeMap]:
        """This namespace's scope maps with their raw entries (read at the tail), one at a time."""
        for kind in kinds:
            letter = RUN_KIND if kind == "task" else ASSET_KIND
            prefix = scope_topic_prefix(self.base_topic, self.namespace, letter)
            for topic in list_scope_topics(self.maps.backend, prefix):
                with self._fresh(topic) as table:
                    entries = table.to_dict(latest=True)
                yield ScopeMap(topic, kind, self._owner(topic, kind, entries), entries)

    def _owner(self, topic: str, kind: str, entries: dict[str, Any]) -> TaskStateScope | AssetStateScope | None:
        """The one run (as a task scope with task id ``""``) or asset every key of the map belongs
        to, when the map's topic is the one that scope gives; None for anything else."""
        owners = set()
        for map_key in entries:
            try:
                scope, _ = self.parse_key(map_key)
            except StateStoreDataError:
                return None
            owner = TaskStateScope(scope.dag_id, scope.run_id, "") if isinstance(scope, TaskStateScope) else scope
            owners.add(owner)
        if len(owners) != 1:
            return None
        owner = owners.pop()
        if (kind == "task") != isinstance(owner, TaskStateScope) or self.topic_of(owner) != topic:
            return None
        return owner

    def remove_expired_in(self, topic: str, *, now: float) -> int:
        """Delete the entries of one scope map past their expiry at ``now`` (judged under the map's
        writer on the latest state, so an entry re-written meanwhile is judged by its new expiry);
        entries that are not state records are left alone (and logged). Returns how many."""

        def op(map_key: str, raw: Any) -> Any:
            try:
                entry = self._record(map_key, raw, topic)
            except StateStoreDataError as exc:
                log.warning("remove_expired: leaving %s", exc)
                return raw
            return None if entry.expires_at is not None and entry.expires_at <= now else raw

        prefix = f"{self.namespace}/"
        with self._fresh(topic) as table:
            return table.update_multiple(lambda k: k.startswith(prefix), op)

    def drop_map(self, topic: str, *, expected: dict[str, Any], timeout: float) -> bool:
        """Delete a scope map whole only if it still holds exactly ``expected`` (compare-and-delete
        under the map's writer: a value written meanwhile keeps the map). Returns whether it was deleted."""
        backend = self.maps.backend

        def read() -> dict[str, Any]:
            with PulsarMap[str, Any](backend, topic, writer_idle_timeout=None) as fresh:  # the writer is ours
                return fresh.to_dict(latest=True, timeout=timeout)

        return drop_map_if_unchanged(backend, topic, read=read, expected=expected, timeout=timeout)

    def expired_at(self, entries: dict[str, Any], now: float) -> bool:
        """Whether every entry (state records) is past its expiry at ``now``; False for an empty map
        or one holding anything else."""
        try:
            records = [self._record(k, raw) for k, raw in entries.items()]
        except StateStoreDataError:
            return False
        return bool(records) and all(r.expires_at is not None and r.expires_at <= now for r in records)

    def remove_expired(self, *, now: float | None = None) -> int:
        """Delete every entry of this namespace past its expiry, map by map (each map in one atomic
        write); returns how many. Run state is not consulted here (the Airflow clean-up does)."""
        cutoff = self._clock() if now is None else now
        return sum(self.remove_expired_in(m.topic, now=cutoff) for m in self.list_maps() if m.owner is not None)
