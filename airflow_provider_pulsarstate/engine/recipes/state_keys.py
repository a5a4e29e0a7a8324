"""The keys of the state store: scopes, the map key layout (percent-quoted segments, one spelling
per entry), the stored entry and its expiry, and the errors naming a bad key or scope.

See :mod:`~airflow_provider_pulsarstate.engine.recipes.state_store` for the layout.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from urllib.parse import quote, unquote

from airflow_provider_pulsarstate.engine.errors import PulsarStateError

__all__ = [
    "KEEP",
    "AssetStateScope",
    "StateEntry",
    "StateScope",
    "StateScopeError",
    "StateStoreDataError",
    "TaskStateScope",
    "expiry_epoch",
    "parse_state_key",
    "state_key_prefix",
    "state_map_key",
]


class StateStoreDataError(PulsarStateError, ValueError):
    """A stored entry is not a state record (``{"json": str, "expires_at": number|null}``) or its
    JSON text does not parse; the message names the key."""


class StateScopeError(PulsarStateError, PermissionError):
    """A call or a reference names another scope or key than the one it may reach (another task
    instance's state, a reference not bound to the entry being read); the message names the key
    and the scope. Nothing was read or written."""


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


StateScope = TaskStateScope | AssetStateScope


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


def expiry_epoch(expires_at: datetime | float | None) -> float | None:
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
"""``expires_at=KEEP`` (the default of :meth:`~airflow_provider_pulsarstate.engine.recipes.state_store.StateStore.update`): keep the entry's expiry."""


def parse_state_key(namespace: str, map_key: Any) -> tuple[StateScope, str]:
    """``(scope, key)`` of a map key of namespace ``namespace``.

    :raises StateStoreDataError: not a state key of this namespace, malformed or not in canonical
        form (one spelling per entry); the message names the key.
    """

    def bad(why: str) -> StateStoreDataError:
        return StateStoreDataError(f"{map_key!r} does not name a state entry of namespace {namespace!r}: {why}")

    if not isinstance(map_key, str) or not map_key.startswith(f"{namespace}/"):
        raise bad("another namespace, or not a key")
    kind, _, rest = map_key[len(namespace) + 1 :].partition("/")
    parts = rest.split("/")
    scope: StateScope
    if kind == "task" and len(parts) == 5:
        dag_id, run_id, task_id, index, key = (unquote(p) for p in parts)
        try:
            scope = TaskStateScope(dag_id, run_id, task_id, int(index))
        except ValueError:
            raise bad(f"map index {index!r} is not an integer") from None
    elif kind == "asset" and len(parts) == 2:
        scope, key = AssetStateScope(unquote(parts[0])), unquote(parts[1])
    else:
        raise bad("expected <namespace>/task/<dag>/<run>/<task>/<map_index>/<key> or <namespace>/asset/<name>/<key>")
    try:
        canonical = state_map_key(namespace, scope, key)
    except (ValueError, TypeError) as exc:
        raise bad(str(exc)) from None
    if canonical != map_key:
        raise bad("not in canonical form")
    return scope, key


def state_key_prefix(namespace: str, scope: StateScope, *, all_map_indices: bool = False) -> str:
    if isinstance(scope, TaskStateScope):
        base = f"{namespace}/task/{_q(scope.dag_id)}/{_q(scope.run_id)}/{_q(scope.task_id)}/"
        return base if all_map_indices else f"{base}{int(scope.map_index)}/"
    if isinstance(scope, AssetStateScope):
        if not scope.name:
            raise ValueError("AssetStateScope needs the asset's name")
        return f"{namespace}/asset/{_q(scope.name)}/"
    raise TypeError(f"expected TaskStateScope or AssetStateScope, not {type(scope).__name__}")


def state_map_key(namespace: str, scope: StateScope, key: str) -> str:
    if not isinstance(key, str) or not key:
        raise ValueError(f"a state key must be a non-empty string, not {key!r}")
    return state_key_prefix(namespace, scope) + _q(key)
