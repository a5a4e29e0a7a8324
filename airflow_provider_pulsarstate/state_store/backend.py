"""PulsarStateStoreBackend: Airflow's task and asset state store (AIP-103) in a PulsarMap.

Configure it on the server, on the workers, or (recommended) both::

    [state_store]
    backend = airflow_provider_pulsarstate.state_store.backend.PulsarStateStoreBackend
    [workers]
    state_store_backend = airflow_provider_pulsarstate.state_store.backend.PulsarStateStoreBackend

- **Server** (``[state_store] backend``): the execution API calls ``get``/``set``/``delete``/
  ``clear``; values live only in the map (the DB's state tables stay empty). Asset scopes arrive
  with ``asset_id`` only: it is resolved to the asset's name through the request's DB session
  (cached), so the server, workers, the hook and plain readers agree on the key.
- **Workers** (``[workers] state_store_backend``): the task process writes the value to the map
  (``serialize_*_to_ref``) and the DB keeps ``{"__airflow_state_ref__": <map key>}``; reads
  resolve the reference in the map.
- **Both** (recommended): the worker writes the value, the server sees the reference to this
  very entry and only records ``expires_at`` on it (it never overwrites the value with the
  reference); the server answers reads with the reference, so the worker reads the map and
  Airflow logs no "not written through the configured backend" warning, and values written by
  :meth:`PulsarStateHook.update_state` are what ``context["task_state_store"].get`` returns.

Expired entries read as absent at once; removing them is :meth:`cleanup`'s job, which Airflow
itself never calls for a custom backend (``airflow state-store clean`` handles only the
metastore): run ``PulsarStateStoreBackend().cleanup()`` from a periodic task or cron. Worker-only
mode leaves expiry to the DB row (the worker's write carries no expiry; Airflow's GC removes the
reference, not the map entry). An asset reached only by URI (``AssetUriRef``) cannot
be keyed by name on a worker and is refused with a clear error there.

Every call reads the live map (``latest=True``); a broker that cannot be reached raises
:class:`StateStoreUnavailableError` (the task fails), never a fallback to the DB.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from functools import partial
from typing import TYPE_CHECKING, Any, Callable, TypeVar

from airflow.sdk.state import AssetScope, BaseStoreBackend

from airflow_provider_pulsarstate.engine.errors import BackendUnavailableError, ConfigurationError
from airflow_provider_pulsarstate.hooks.pulsarstate import (
    AssetStateScope,
    PulsarStateHook,
    StateScope,
    StateStore,
    StateStoreDataError,
    state_scope,
)

if TYPE_CHECKING:
    from datetime import datetime

log = logging.getLogger(__name__)

T = TypeVar("T")

REF_KEY = "__airflow_state_ref__"
"""The marker the task SDK wraps a worker-side reference in (airflow.sdk.execution_time.context)."""

CLASS_PATH = "airflow_provider_pulsarstate.state_store.backend.PulsarStateStoreBackend"

try:  # the server checks against airflow-core's copy of BaseStoreBackend; workers may lack airflow-core
    from airflow._shared.state import BaseStoreBackend as _CoreBaseStoreBackend

    _BASES: tuple[type, ...] = (BaseStoreBackend, _CoreBaseStoreBackend)
except ImportError:  # pragma: no cover - a task-SDK-only worker
    _BASES = (BaseStoreBackend,)


class StateStoreUnavailableError(BackendUnavailableError):
    """The state store's map could not be read or written (broker or file unreachable, time-out);
    the message names the connection and topic."""


class PulsarStateStoreBackend(*_BASES):  # type: ignore[misc]
    """Task and asset state in a PulsarMap (see the module docstring for the configurations).

    Settings come from ``[pulsarstate]``: ``conn_id``, ``state_store_topic``, ``key_namespace``,
    ``state_store_max_value_bytes``. Airflow makes one instance per process; the map behind it is
    shared by the whole process (:meth:`PulsarStateHook.get_state_store`).
    """

    def __init__(self) -> None:
        from airflow_provider_pulsarstate.hooks.provider_config import settings

        self._settings = settings()  # the same once-per-process read the hook's state store uses
        self._hook = PulsarStateHook(self._settings.conn_id)
        self._asset_names: dict[int, str] = {}
        self._lock = threading.Lock()
        self._refs: bool | None = None

    # ------------------------------------------------------------------ plumbing
    def _run(self, what: str, fn: Callable[[StateStore], T]) -> T:
        """``fn(store)``; failures to reach the map become StateStoreUnavailableError."""
        settings = self._settings
        try:
            store = self._hook.get_state_store()  # the connection is read on each call; the map is shared
            return fn(store)
        except (StateStoreDataError, ConfigurationError, ValueError, TypeError):
            raise
        except Exception as exc:
            raise StateStoreUnavailableError(
                f"state store {what} failed: connection {settings.conn_id!r}, topic {settings.state_store_topic!r} "
                f"could not be reached ({type(exc).__name__}: {exc}); nothing was stored in the metadata DB instead"
            ) from exc

    def _scope(self, scope: Any, session: Any = None) -> StateScope:
        """The engine scope; a server-side asset_id is resolved to the asset's name (cached)."""
        asset_id = getattr(scope, "asset_id", None)
        if asset_id is not None and not getattr(scope, "name", None):
            return AssetStateScope(self._asset_name(int(asset_id), session))
        return state_scope(scope)

    def _asset_name(self, asset_id: int, session: Any) -> str:
        with self._lock:
            name = self._asset_names.get(asset_id)
        if name is None:
            from sqlalchemy import select

            from airflow.models.asset import AssetModel

            query = select(AssetModel.name).where(AssetModel.id == asset_id)
            if session is not None:
                name = session.scalar(query)
            else:
                from airflow.utils.session import create_session

                with create_session() as own:
                    name = own.scalar(query)
            if name is None:
                raise ValueError(f"asset_id {asset_id} is not an asset in the metadata DB")
            with self._lock:
                self._asset_names[asset_id] = name
        return name

    async def _ascope(self, scope: Any, session: Any) -> StateScope:
        asset_id = getattr(scope, "asset_id", None)
        if asset_id is None or getattr(scope, "name", None):
            return state_scope(scope)
        with self._lock:
            name = self._asset_names.get(int(asset_id))
        if name is not None:
            return AssetStateScope(name)
        if session is not None and asyncio.iscoroutinefunction(getattr(session, "scalar", None)):
            from sqlalchemy import select

            from airflow.models.asset import AssetModel

            name = await session.scalar(select(AssetModel.name).where(AssetModel.id == int(asset_id)))
            if name is None:
                raise ValueError(f"asset_id {asset_id} is not an asset in the metadata DB")
            with self._lock:
                self._asset_names[int(asset_id)] = name
            return AssetStateScope(name)
        return await asyncio.to_thread(self._scope, scope, None)

    def _workers_use_this_backend(self) -> bool:
        """Whether ``[workers] state_store_backend`` names this class (then the server hands out
        references, which workers resolve in the map); read once per instance."""
        if self._refs is None:
            self._refs = self._read_workers_setting()
        return self._refs

    @staticmethod
    def _read_workers_setting() -> bool:
        from airflow.sdk.configuration import conf

        configured = (conf.get("workers", "state_store_backend", fallback="") or "").strip()
        if not configured:
            return False
        if configured == CLASS_PATH:
            return True
        try:
            from airflow.sdk._shared.module_loading import import_string

            cls = import_string(configured)
        except Exception:
            return False
        return isinstance(cls, type) and issubclass(cls, PulsarStateStoreBackend)

    @staticmethod
    def _reference_in(value: str) -> str | None:
        """The map key a worker-side reference ``{"__airflow_state_ref__": key}`` names, if ``value`` is one."""
        try:
            decoded = json.loads(value)
        except (TypeError, ValueError):
            return None
        if isinstance(decoded, dict) and set(decoded) == {REF_KEY} and isinstance(decoded[REF_KEY], str):
            return decoded[REF_KEY]
        return None

    # ------------------------------------------------------------------ BaseStoreBackend
    def get(self, scope: Any, key: str, *, session: Any = None) -> str | None:
        """The stored JSON text (or, when workers also use this backend, a reference to the entry),
        None when absent or expired."""
        resolved = self._scope(scope, session)
        return self._run("get", lambda store: self._get(store, resolved, key))

    def _get(self, store: StateStore, scope: StateScope, key: str) -> str | None:
        text = store.get_json(scope, key)
        if text is None:
            return None
        if self._workers_use_this_backend() and self._reference_in(text) is None:
            return json.dumps({REF_KEY: store.map_key(scope, key)})
        return text

    def set(self, scope: Any, key: str, value: str, *, expires_at: datetime | None = None, session: Any = None) -> None:
        """Store ``value`` (JSON text) until ``expires_at``; a worker's reference to this entry only
        updates its expiry (the worker already stored the value)."""
        resolved = self._scope(scope, session)
        self._run("set", lambda store: self._set(store, resolved, key, value, expires_at))

    def _set(self, store: StateStore, scope: StateScope, key: str, value: str, expires_at: datetime | None) -> None:
        map_key = store.map_key(scope, key)
        if self._reference_in(value) == map_key:
            if not store.set_expiry(scope, key, expires_at):
                raise StateStoreDataError(
                    f"{store.table.topic}: the worker's reference names state entry {map_key!r}, which is absent"
                )
            return
        store.set_json(scope, key, value, expires_at=expires_at)

    def delete(self, scope: Any, key: str, *, session: Any = None) -> None:
        resolved = self._scope(scope, session)
        self._run("delete", lambda store: store.delete(resolved, key))

    def clear(self, scope: Any, *, all_map_indices: bool = False, session: Any = None) -> None:
        resolved = self._scope(scope, session)
        self._run("clear", lambda store: store.clear(resolved, all_map_indices=all_map_indices))

    # Async twins: the blocking map call runs in the loop's default thread pool (asyncio.to_thread),
    # never in asgiref's single shared thread, so one slow broker call stalls no other coroutine.
    async def aget(self, scope: Any, key: str, *, session: Any = None) -> str | None:
        resolved = await self._ascope(scope, session)
        return await asyncio.to_thread(self._run, "get", partial(self._get, scope=resolved, key=key))

    async def aset(
        self, scope: Any, key: str, value: str, *, expires_at: datetime | None = None, session: Any = None
    ) -> None:
        resolved = await self._ascope(scope, session)
        await asyncio.to_thread(
            self._run, "set", partial(self._set, scope=resolved, key=key, value=value, expires_at=expires_at)
        )

    async def adelete(self, scope: Any, key: str, *, session: Any = None) -> None:
        resolved = await self._ascope(scope, session)
        await asyncio.to_thread(self._run, "delete", lambda store: store.delete(resolved, key))

    async def aclear(self, scope: Any, *, all_map_indices: bool = False, session: Any = None) -> None:
        resolved = await self._ascope(scope, session)
        await asyncio.to_thread(
            self._run, "clear", lambda store: store.clear(resolved, all_map_indices=all_map_indices)
        )

    def cleanup(self) -> int:  # type: ignore[override]
        """Remove every expired entry of this deployment's namespace; returns how many."""
        removed = self._run("cleanup", lambda store: store.remove_expired())
        log.info("PulsarStateStoreBackend.cleanup removed %d expired state entries", removed)
        return removed

    # ------------------------------------------------------------------ worker side
    def serialize_task_state_store_to_ref(self, *, value: Any, key: str, scope: Any) -> str:
        """Store ``value`` in the map; the DB keeps the returned reference (the entry's map key)."""
        return self._store_value(value, key, scope)

    def serialize_asset_state_store_to_ref(self, *, value: Any, key: str, scope: AssetScope) -> str:
        return self._store_value(value, key, scope)

    def _store_value(self, value: Any, key: str, scope: Any) -> str:
        resolved = self._scope(scope)

        def write(store: StateStore) -> str:
            store.set(resolved, key, value)
            return store.map_key(resolved, key)

        return self._run("set", write)

    def deserialize_task_state_store_from_ref(self, stored: str) -> Any:
        """The value the reference names (None when the entry is gone or expired)."""
        return self._load_value(stored)

    def deserialize_asset_state_store_from_ref(self, stored: str) -> Any:
        return self._load_value(stored)

    def _load_value(self, ref: str) -> Any:
        def read(store: StateStore) -> Any:
            if not store.owns(ref):
                raise StateStoreDataError(
                    f"state reference {ref!r} does not name a state entry of namespace {store.namespace!r} "
                    f"on {store.table.topic}"
                )
            entry = store.get_entry_by_key(ref)
            return None if entry is None else entry.value

        return self._run("get", read)
