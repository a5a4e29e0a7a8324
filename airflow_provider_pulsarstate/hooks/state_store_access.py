"""The hook's task and asset state: Airflow's scopes mapped onto the engine's, and the state
store's maps borrowed from the process-wide pool (:mod:`~airflow_provider_pulsarstate.hooks.shared_objects`)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from airflow_provider_pulsarstate import provider_settings
from airflow_provider_pulsarstate.engine.backends import Backend
from airflow_provider_pulsarstate.engine.config import ConnectionConfig
from airflow_provider_pulsarstate.engine.recipes.map import PulsarMap
from airflow_provider_pulsarstate.engine.recipes.state_store import (
    KEEP,
    AssetStateScope,
    StateScope,
    StateStore,
    TaskStateScope,
)
from airflow_provider_pulsarstate.hooks import shared_objects


class _PooledStateMaps:
    """The state store's :class:`~airflow_provider_pulsarstate.engine.recipes.state_store.MapSource`:
    maps borrowed from this process's pool, one per topic."""

    def __init__(self, config: ConnectionConfig, options: dict[str, Any]) -> None:
        self._config = config
        self._options = options

    @property
    def backend(self) -> Backend:
        return shared_objects.backend_for(self._config)

    @contextlib.contextmanager
    def borrow(self, topic: str) -> Iterator[PulsarMap[str, Any]]:
        key = ("state-map", topic, tuple(sorted(self._options.items())))
        with shared_objects.borrow(
            self._config, key, lambda backend: PulsarMap(backend, topic, **self._options)
        ) as table:
            yield table

    def list_topics(self, prefix: str) -> list[str]:
        return self.backend.list_topics(prefix)


def state_scope(scope: Any) -> StateScope:
    """The engine scope of Airflow's ``TaskScope`` / ``AssetScope`` (worker or server flavour, or
    anything with their fields, e.g. a ``ti``), or an engine scope as is.

    :raises ValueError: an asset scope without a ``name`` (a server-side ``asset_id`` is resolved
        by the state-store backend, which has the DB session; a ``uri`` alone cannot be keyed by name).
    """
    if isinstance(scope, (TaskStateScope, AssetStateScope)):
        return scope
    if all(hasattr(scope, f) for f in ("dag_id", "run_id", "task_id")):
        map_index = getattr(scope, "map_index", -1)
        return TaskStateScope(scope.dag_id, scope.run_id, scope.task_id, -1 if map_index is None else int(map_index))
    name = getattr(scope, "name", None)
    if isinstance(name, str) and name:
        return AssetStateScope(name)
    raise ValueError(
        f"cannot key state by {scope!r}: a task scope needs dag_id, run_id, task_id (and map_index); "
        "an asset scope needs the asset's name (use Asset/AssetNameRef, not AssetUriRef)"
    )


class StateStoreMethods:
    """The task and asset state methods of :class:`~airflow_provider_pulsarstate.hooks.pulsarstate.PulsarStateHook`."""

    if TYPE_CHECKING:

        def cached_config(self) -> ConnectionConfig: ...

    def get_state_store(self, *, topic: str | None = None, namespace: str | None = None) -> StateStore:
        """The task/asset :class:`~airflow_provider_pulsarstate.engine.recipes.state_store.StateStore`
        the state-store backend uses (``[pulsarstate] state_store_topic`` and ``key_namespace`` by
        default): one map per DAG run (task state) and one per asset.

        The maps come from the process-wide pool (:mod:`~airflow_provider_pulsarstate.hooks.shared_objects`):
        opened when a scope is first touched (opening a map replays its log, which holds one run's or
        one asset's state), shared by every hook of the process, closed when idle or evicted, never
        while in use. The connection is read once per process (:meth:`cached_config`).
        """
        provider = provider_settings.settings()
        config = self.cached_config()
        base = config.topic_name(topic or provider.state_store_topic)
        maps = _PooledStateMaps(
            config,
            {
                "max_value_bytes": provider.state_store_max_value_bytes,
                "operation_timeout": config.operation_timeout,
                "writer_idle_timeout": provider.state_store_writer_idle_timeout,
            },
        )
        return StateStore(maps, base, namespace=namespace or provider.key_namespace)

    def get_state(self, scope: Any, key: str, default: Any = None, **store: Any) -> Any:
        """The current value of ``key`` in ``scope`` (see :meth:`update_state`), read at the tail
        of the log, or ``default`` when absent or expired."""
        return self.get_state_store(**store).get(state_scope(scope), key, default)

    def update_state(self, scope: Any, key: str, fn: Any, *, expires_at: Any = KEEP, **store: Any) -> Any:
        """Atomically replace a state value with ``fn(current)`` and return the new value.

        Airflow's state-store API has only get/set, and its own example
        (``set(key, get(key) + 1)``) loses increments when tasks run at once. This does not:
        ``fn`` (free of side effects: it may run more than once) gets the decoded current value
        (None when absent or expired) and runs under the map's single writer on the latest state;
        returning None deletes the key. ``context["task_state_store"].get`` /
        ``context["asset_state_store"].get`` see the result when PulsarStateStoreBackend is the
        configured backend::

            PulsarStateHook().update_state(AssetScope(name="prices"), "runs", lambda n: (n or 0) + 1)
            PulsarStateHook().update_state(TaskScope(dag_id, run_id, task_id, map_index), "tries", ...)

        :param scope: Airflow's ``TaskScope`` / ``AssetScope`` (by ``name``; ``ti`` fields or a
            context's ``ti`` also work), or the engine's ``TaskStateScope`` / ``AssetStateScope``.
        :param expires_at: KEEP (the entry's expiry), None (never) or an aware datetime.
        :param store: ``topic`` / ``namespace`` of :meth:`get_state_store`.
        """
        return self.get_state_store(**store).update(state_scope(scope), key, fn, expires_at=expires_at)

    def compare_and_set_state(
        self, scope: Any, key: str, expected: Any, new: Any, *, expires_at: Any = None, **store: Any
    ) -> bool:
        """Set a state value to ``new`` (None: delete) only when it equals ``expected`` (None:
        absent), atomically; returns whether it was set. ``scope`` as :meth:`update_state`."""
        return self.get_state_store(**store).compare_and_set(
            state_scope(scope), key, expected, new, expires_at=expires_at
        )
