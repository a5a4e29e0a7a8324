"""StateStore: task and asset state (Airflow's AIP-103 state store) kept in a PulsarMap.

No Airflow import: a plain Python process reads what tasks stored. Keys::

    <namespace>/task/<dag_id>/<run_id>/<task_id>/<map_index>/<key>
    <namespace>/asset/<asset name>/<key>

every segment percent-quoted (``quote(s, safe="")``), so a ``/`` inside a dag id, run id, task id,
asset name or key cannot forge another entry. A value is a record ``{"json": <JSON text>,
"expires_at": <epoch seconds or null>}``: the JSON text is what Airflow's API hands over, stored
verbatim; an entry past ``expires_at`` reads as absent (and :meth:`StateStore.remove_expired`
deletes it).

Reading a task's or an asset's state outside Airflow::

    from airflow_provider_pulsarstate import ConnectionConfig, PulsarMap, open_backend
    from airflow_provider_pulsarstate.engine.recipes.state_store import AssetStateScope, StateStore, TaskStateScope

    backend = open_backend(ConnectionConfig(url="pulsar://localhost:6650"))  # or the embedded file's path
    with PulsarMap(backend, "persistent://public/default/airflow-state-store") as table:
        store = StateStore(table, namespace="airflow")       # [pulsarstate] key_namespace
        store.get(TaskStateScope("my_dag", "manual__2026-01-01", "extract"), "job_id")
        store.entries(TaskStateScope("my_dag", "manual__2026-01-01", "extract"), all_map_indices=True)
        store.entries(AssetStateScope("s3://bucket/prices"))   # {key: value}
        store.update(AssetStateScope("prices"), "runs", lambda v: (v or 0) + 1)   # atomic

Concurrency: :meth:`StateStore.update` and :meth:`StateStore.compare_and_set` are evaluated by the
map's single writer on the latest state, so concurrent updaters in any number of processes lose
nothing (upstream's ``set(key, get(key) + 1)`` does). Reads use ``latest=True`` by default: they
see every write acknowledged before the call, from any process.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Callable, Union
from urllib.parse import quote, unquote

from airflow_provider_pulsarstate.engine.errors import PulsarStateError
from airflow_provider_pulsarstate.engine.recipes.map import PulsarMap

log = logging.getLogger(__name__)

DEFAULT_STATE_TOPIC = "airflow-state-store"


class StateStoreDataError(PulsarStateError, ValueError):
    """A stored entry is not a state record (``{"json": str, "expires_at": number|null}``) or its
    JSON text does not parse; the message names the key."""


@dataclass(frozen=True)
class TaskStateScope:
    """One task instance's state: ``map_index`` -1 for an unmapped task."""

    dag_id: str
    run_id: str
    task_id: str
    map_index: int = -1


@dataclass(frozen=True)
class AssetStateScope:
    """One asset's state, keyed by the asset's name (unique among active assets)."""

    name: str


StateScope = Union[TaskStateScope, AssetStateScope]


@dataclass(frozen=True)
class StateEntry:
    """One stored entry: its map key, the scope's key, the JSON text and when it expires (epoch s)."""

    map_key: str
    key: str
    json: str
    expires_at: float | None

    @property
    def value(self) -> Any:
        return json.loads(self.json)


def _q(segment: str) -> str:
    return quote(str(segment), safe="")


def _epoch(expires_at: datetime | float | None) -> float | None:
    if expires_at is None:
        return None
    if isinstance(expires_at, datetime):
        if expires_at.tzinfo is None:
            raise ValueError(f"expires_at must be timezone-aware (UTC), not naive {expires_at!r}")
        return expires_at.timestamp()
    return float(expires_at)


class _Keep:
    def __repr__(self) -> str:
        return "KEEP"


KEEP: Any = _Keep()
"""``expires_at=KEEP`` (the default of :meth:`StateStore.update`): keep the entry's expiry."""


class StateStore:
    """Task and asset state in one :class:`PulsarMap` (see the module docstring for the layout).

    :param table: the map (JSON values); the store does not close it.
    :param namespace: first key segment (``[pulsarstate] key_namespace``), so deployments can share a topic.
    :param clock: epoch seconds now (tests).
    """

    def __init__(self, table: PulsarMap[str, Any], *, namespace: str = "airflow", clock: Callable[[], float] = time.time) -> None:
        if not namespace or "/" in namespace:
            raise ValueError(f"namespace must be non-empty without '/': {namespace!r}")
        self.table = table
        self.namespace = namespace
        self._clock = clock

    # ------------------------------------------------------------------ keys
    def scope_prefix(self, scope: StateScope, *, all_map_indices: bool = False) -> str:
        """The key prefix of every entry of ``scope`` (of every map index with ``all_map_indices``)."""
        if isinstance(scope, TaskStateScope):
            base = f"{self.namespace}/task/{_q(scope.dag_id)}/{_q(scope.run_id)}/{_q(scope.task_id)}/"
            return base if all_map_indices else f"{base}{int(scope.map_index)}/"
        if isinstance(scope, AssetStateScope):
            if not scope.name:
                raise ValueError("AssetStateScope needs the asset's name")
            return f"{self.namespace}/asset/{_q(scope.name)}/"
        raise TypeError(f"expected TaskStateScope or AssetStateScope, not {type(scope).__name__}")

    def map_key(self, scope: StateScope, key: str) -> str:
        """The map key of ``key`` in ``scope``."""
        if not isinstance(key, str) or not key:
            raise ValueError(f"a state key must be a non-empty string, not {key!r}")
        return self.scope_prefix(scope) + _q(key)

    def owns(self, map_key: str) -> bool:
        """Whether ``map_key`` is a state entry of this namespace (e.g. a reference read from a DB)."""
        return isinstance(map_key, str) and (
            map_key.startswith(f"{self.namespace}/task/") or map_key.startswith(f"{self.namespace}/asset/")
        )

    # ------------------------------------------------------------------ records
    def _record(self, map_key: str, raw: Any) -> StateEntry:
        if not isinstance(raw, dict) or set(raw) != {"json", "expires_at"} or not isinstance(raw["json"], str) or not (
            raw["expires_at"] is None or (isinstance(raw["expires_at"], (int, float)) and not isinstance(raw["expires_at"], bool))
        ):
            raise StateStoreDataError(
                f"{self.table.topic}: state entry {map_key!r} is not a state record "
                f'{{"json": <text>, "expires_at": <epoch|null>}}: {str(raw)[:200]!r}'
            )
        try:
            json.loads(raw["json"])
        except ValueError as exc:
            raise StateStoreDataError(f"{self.table.topic}: state entry {map_key!r} holds text that is not JSON: {exc}") from None
        key = unquote(map_key.rsplit("/", 1)[-1])
        return StateEntry(map_key, key, raw["json"], None if raw["expires_at"] is None else float(raw["expires_at"]))

    def _live(self, map_key: str, raw: Any, now: float) -> StateEntry | None:
        if raw is None:
            return None
        entry = self._record(map_key, raw)
        return None if entry.expires_at is not None and entry.expires_at <= now else entry

    @staticmethod
    def _raw(json_text: str, expires_at: float | None) -> dict[str, Any]:
        return {"json": json_text, "expires_at": expires_at}

    @staticmethod
    def _dumps(value: Any, map_key: str) -> str:
        try:
            return json.dumps(value)
        except (TypeError, ValueError) as exc:
            raise StateStoreDataError(f"the value for state entry {map_key!r} is not JSON-serializable: {exc}") from None

    # ------------------------------------------------------------------ reads
    def get_entry_by_key(self, map_key: str, *, latest: bool = True) -> StateEntry | None:
        """The live entry under ``map_key`` (None when absent or expired)."""
        return self._live(map_key, self.table.get(map_key, latest=latest), self._clock())

    def get_json(self, scope: StateScope, key: str, *, latest: bool = True) -> str | None:
        """The stored JSON text (as Airflow's API handed it over), or None when absent or expired."""
        entry = self.get_entry_by_key(self.map_key(scope, key), latest=latest)
        return None if entry is None else entry.json

    def get(self, scope: StateScope, key: str, default: Any = None, *, latest: bool = True) -> Any:
        """The decoded value, or ``default`` when absent or expired."""
        entry = self.get_entry_by_key(self.map_key(scope, key), latest=latest)
        return default if entry is None else entry.value

    def entries(self, scope: StateScope, *, all_map_indices: bool = False, latest: bool = True) -> dict[str, Any]:
        """Live entries of ``scope`` as ``{key: value}``; with ``all_map_indices`` (tasks) as
        ``{(map_index, key): value}``."""
        prefix = self.scope_prefix(scope, all_map_indices=all_map_indices)
        out: dict[Any, Any] = {}
        now = self._clock()

        def collect(map_key: str, raw: Any) -> None:
            entry = self._live(map_key, raw, now)
            if entry is None:
                return
            if all_map_indices and isinstance(scope, TaskStateScope):
                index = int(map_key[len(prefix):].split("/", 1)[0])
                out[(index, entry.key)] = entry.value
            else:
                out[entry.key] = entry.value

        self.table.scan(lambda k: k.startswith(prefix), collect, latest=latest)
        return out

    # ------------------------------------------------------------------ writes
    def set_json(self, scope: StateScope, key: str, json_text: str, *, expires_at: datetime | float | None = None) -> None:
        """Store JSON text verbatim (checked to parse) until ``expires_at`` (None: never expires)."""
        map_key = self.map_key(scope, key)
        if not isinstance(json_text, str):
            raise StateStoreDataError(f"the value for state entry {map_key!r} must be JSON text, not {type(json_text).__name__}")
        try:
            json.loads(json_text)
        except ValueError as exc:
            raise StateStoreDataError(f"the value for state entry {map_key!r} is not JSON text: {exc}") from None
        self.table.put(map_key, self._raw(json_text, _epoch(expires_at)))

    def set(self, scope: StateScope, key: str, value: Any, *, expires_at: datetime | float | None = None) -> None:
        """Store ``value`` (JSON-serializable) until ``expires_at`` (None: never expires)."""
        self.set_json(scope, key, self._dumps(value, self.map_key(scope, key)), expires_at=expires_at)

    def set_expiry(self, scope: StateScope, key: str, expires_at: datetime | float | None) -> bool:
        """Change a live entry's expiry, atomically; False when there is none."""
        map_key, when = self.map_key(scope, key), _epoch(expires_at)
        found = [False]

        def op(_: str, raw: Any) -> Any:
            entry = self._live(map_key, raw, self._clock())
            found[0] = entry is not None
            return None if entry is None else self._raw(entry.json, when)

        self.table.update(map_key, op)
        return found[0]

    def delete(self, scope: StateScope, key: str) -> None:
        """Remove one entry (no-op when absent)."""
        self.table.delete(self.map_key(scope, key))

    def clear(self, scope: StateScope, *, all_map_indices: bool = False) -> int:
        """Remove every entry of ``scope`` (of every map index with ``all_map_indices``) in one
        atomic write; returns how many were removed."""
        prefix = self.scope_prefix(scope, all_map_indices=all_map_indices)
        return self.table.update_multiple(lambda k: k.startswith(prefix), lambda k, v: None)

    def update(
        self, scope: StateScope, key: str, fn: Callable[[Any], Any], *, expires_at: Any = KEEP
    ) -> Any:
        """Atomically replace the value with ``fn(current)`` (``current``: the decoded value, None
        when absent or expired); ``fn`` returning None deletes the entry. Returns the new value.

        ``fn`` runs under the map's single writer on the latest state (and may run more than once:
        keep it free of side effects), so concurrent updaters in any process lose nothing.
        ``expires_at``: KEEP (the entry's current expiry; none for a new entry), None or a time.
        """
        map_key = self.map_key(scope, key)
        result: list[Any] = [None]

        def op(_: str, raw: Any) -> Any:
            entry = self._live(map_key, raw, self._clock())
            new = fn(None if entry is None else entry.value)
            result[0] = new
            if new is None:
                return None
            when = (entry.expires_at if entry is not None else None) if expires_at is KEEP else _epoch(expires_at)
            return self._raw(self._dumps(new, map_key), when)

        self.table.update(map_key, op)
        return result[0]

    def compare_and_set(
        self, scope: StateScope, key: str, expected: Any, new: Any, *, expires_at: datetime | float | None = None
    ) -> bool:
        """Set the value to ``new`` (None: delete) only if it currently equals ``expected`` (None:
        absent or expired), atomically. Returns whether it was set."""
        map_key = self.map_key(scope, key)
        new_text = None if new is None else self._dumps(new, map_key)
        applied = [False]

        def op(_: str, raw: Any) -> Any:
            entry = self._live(map_key, raw, self._clock())
            current = None if entry is None else entry.value
            applied[0] = current == expected and (entry is not None or expected is None)
            if not applied[0]:
                return raw if entry is not None else None
            return None if new_text is None else self._raw(new_text, _epoch(expires_at))

        self.table.update(map_key, op)
        return applied[0]

    def remove_expired(self, *, now: float | None = None) -> int:
        """Delete every entry of this namespace past its expiry, in one atomic write; returns how many.
        Entries that are not state records are left alone (and logged)."""
        cutoff = self._clock() if now is None else now
        prefix = f"{self.namespace}/"

        def op(map_key: str, raw: Any) -> Any:
            try:
                entry = self._record(map_key, raw)
            except StateStoreDataError as exc:
                log.warning("remove_expired: leaving %s", exc)
                return raw
            return None if entry.expires_at is not None and entry.expires_at <= cutoff else raw

        return self.table.update_multiple(lambda k: k.startswith(prefix) and self.owns(k), op)
