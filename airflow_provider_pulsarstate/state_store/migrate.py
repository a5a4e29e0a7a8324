"""A one-shot move of the earlier single-map state layout into the per-run and per-asset maps.

Earlier versions kept all task and asset state in one map on ``[pulsarstate] state_store_topic``
(keys ``<namespace>/task/<dag>/<run>/<task>/<map_index>/<key>`` and ``<namespace>/asset/<name>/<key>``,
namespace ``airflow`` by default). Reading it on a miss would make every process replay the whole
deployment's state again, which the per-scope layout exists to avoid; so it is moved once, by
``airflow pulsarstate state-store-migrate``.

Guarantees:

* Each entry of the namespaces moved is written into its scope's map under this deployment's
  ``key_namespace`` (the value and its expiry unchanged), unless that map already has the key: a
  value written in the new layout is newer and is kept.
* An entry leaves the old map only after it is in its new map, and only if it is unchanged since it
  was read (compare-and-delete), so a crash or a concurrent writer of the old layout loses nothing;
  running it again moves what is left.
* Expired entries are dropped, not moved. Keys of other namespaces (another deployment's, when
  several shared the topic) and entries that are not state records stay where they are.
* References the metadata DB keeps from before (worker mode, keys of namespace ``airflow``) resolve
  to the moved entries (the backend reads them in this namespace).

When several deployments shared the old default namespace ``airflow`` on one topic, their entries
cannot be told apart: run the move from one of them only, or pass ``--from-namespace``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from airflow_provider_pulsarstate.hooks.pulsarstate import PulsarStateHook, StateStoreDataError, parse_state_key
from airflow_provider_pulsarstate.provider_settings import LEGACY_KEY_NAMESPACE, ProviderSettings
from airflow_provider_pulsarstate.provider_settings import settings as provider_settings


@dataclass(frozen=True)
class MigrationReport:
    """What the move saw and did."""

    legacy_topic: str
    namespace: str
    moved: int
    kept_newer: int
    expired: int
    other: int
    dry_run: bool


def migrate_legacy_state(
    hook: PulsarStateHook,
    *,
    from_namespaces: Iterable[str] | None = None,
    dry_run: bool = False,
    settings: ProviderSettings | None = None,
    now: float | None = None,
) -> MigrationReport:
    """Move the old map's entries of ``from_namespaces`` (default: this deployment's namespace and
    ``airflow``) into the per-scope maps (see the module docstring).

    :param now: epoch seconds expiry is judged by (default: this host's clock).
    """
    settings = settings or provider_settings()
    now = time.time() if now is None else now
    namespaces = list(dict.fromkeys(from_namespaces or (settings.key_namespace, LEGACY_KEY_NAMESPACE)))
    store = hook.get_state_store()
    legacy_topic = hook.cached_topic_name(settings.state_store_topic)
    legacy = hook.get_map(legacy_topic, max_value_bytes=settings.state_store_max_value_bytes)
    moved = kept = expired = other = 0
    for map_key, raw in legacy.to_dict(latest=True).items():
        named = _named(map_key, namespaces)
        try:
            is_expired = store.expired_at({map_key: raw}, now)
            store.record(map_key, raw)
        except StateStoreDataError:
            named = None
        if named is None:
            other += 1
            continue
        scope, key = named
        if is_expired:
            expired += 1
        elif dry_run:
            moved += 1
            continue
        else:
            if _put_if_absent(store, scope, key, raw):
                moved += 1
            else:
                kept += 1
        if not dry_run:
            legacy.update(map_key, _remove_if_unchanged(raw))
    return MigrationReport(legacy_topic, store.namespace, moved, kept, expired, other, dry_run)


def _remove_if_unchanged(raw: Any) -> Callable[[str, Any], Any]:
    """An update of a legacy entry that removes it only while it still holds ``raw`` (a value
    written meanwhile stays)."""

    def update(_key: str, current: Any) -> Any:
        return None if current == raw else current

    return update


def _named(map_key: str, namespaces: list[str]) -> tuple[Any, str] | None:
    for namespace in namespaces:
        try:
            return parse_state_key(namespace, map_key)
        except StateStoreDataError:
            continue
    return None


def _put_if_absent(store: Any, scope: Any, key: str, raw: Any) -> bool:
    """Write ``raw`` under ``key`` of ``scope`` unless the scope's map has it; whether it was written."""
    dest = store.map_key(scope, key)
    written = False

    def op(_: str, current: Any) -> Any:
        nonlocal written
        written = current is None
        return raw if current is None else current

    with store.table(scope) as table:
        table.update(dest, op)
    return written
