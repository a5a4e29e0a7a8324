"""PulsarStateStoreBackend: Airflow's task and asset state store (AIP-103), one PulsarMap per scope.

Configure it on the server, on the workers, or (recommended) both::

    [state_store]
    backend = airflow_provider_pulsarstate.state_store.backend.PulsarStateStoreBackend
    [workers]
    state_store_backend = airflow_provider_pulsarstate.state_store.backend.PulsarStateStoreBackend

- **Server** (``[state_store] backend``): the execution API calls ``get``/``set``/``delete``/
  ``clear``; values live only in the maps (the DB's state tables stay empty). Asset scopes arrive
  with ``asset_id`` only: it is resolved to the asset's name through the request's DB session
  (cached), so the server, workers, the hook and plain readers agree on the key.
- **Workers** (``[workers] state_store_backend``): the task process writes the value to the map
  (``serialize_*_to_ref``) and the DB keeps ``{"__airflow_state_ref__": <map key>}``; reads
  resolve the reference in the map.
- **Both** (recommended): the worker writes the value, the server sees the reference to this
  very entry and only records ``expires_at`` on it; the server answers reads with its own
  reference to the entry asked for, so the worker reads the map and Airflow logs no "not written
  through the configured backend" warning, and values written by
  :meth:`PulsarStateHook.update_state` are what ``context["task_state_store"].get`` returns.

Guarantees:

* Bounded per-process cost: task state lives in one map per DAG run, asset state in one map per
  asset (:mod:`~airflow_provider_pulsarstate.engine.recipes.state_store`). A task process opens
  only its own run's map and the maps of the assets it touches; long-lived processes (API server,
  triggerer) keep a bounded number open, closing idle ones
  (:mod:`~airflow_provider_pulsarstate.hooks.shared_objects`).
* A stored value is never taken for a reference: the server hands out references it makes itself
  for the entry Airflow asked for, never a stored value that looks like one.
* A worker reference is bound to its row: it must name exactly the scope and key being read
  (task state: the running task instance's own scope), or :class:`StateScopeError` names the key
  and nothing is read.
* Task state follows Airflow's ``ti:self`` scoping: in a task process, a call for another task
  instance's scope is refused with :class:`StateScopeError` naming the key and both scopes
  (outside a task context, e.g. the API server, the execution API has already scoped the call).
* With ``[core] multi_team``, the backend refuses to start unless every team has its own key
  namespace and topics (:mod:`~airflow_provider_pulsarstate.hooks.teams`).
* An unreachable map raises :class:`StateStoreUnavailableError` (the task fails), never a fallback
  to the DB. Every call reads the live map (``latest=True``).

What it cannot isolate: every worker holds the connection's Pulsar role, so code running in a task
can open any topic that role may read and write (another run's map included), bypassing the
backend; the hook (:meth:`PulsarStateHook.update_state`) is a library API, not a boundary. Per-team
connections with Pulsar roles limited to the team's topics are the defence.

Expiry: Airflow computes ``expires_at`` on the writing worker (``now + retention``). Reads treat an
entry past it as absent on the reader's clock. Removing entries is the clean-up's job (Airflow
never calls it for a custom backend): ``airflow pulsarstate state-store-cleanup`` or
:meth:`PulsarStateStoreBackend.cleanup`, which judge expiry and run ends on the metadata DB's clock
and never touch a run the DB holds in a non-terminal state (:mod:`~airflow_provider_pulsarstate.state_store.cleanup`).
Worker-only mode leaves expiry to the DB row (the worker's write carries no expiry). An asset
reached only by URI (``AssetUriRef``) cannot be keyed by name on a worker and is refused there.

State written by the earlier single-map layout (``state_store_topic`` itself) is not read from
there: ``airflow pulsarstate state-store-migrate`` moves it into the per-scope maps once
(:mod:`~airflow_provider_pulsarstate.state_store.migrate`); references the DB keeps from then
(keys of namespace ``airflow``, the earlier default) still resolve.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any, TypeVar

from airflow.sdk.state import AssetScope, BaseStoreBackend

from airflow_provider_pulsarstate.engine.errors import BackendUnavailableError, ConfigurationError
from airflow_provider_pulsarstate.hooks.airflow_internals import (
    asset_state_accessor_name,
    caller_frames,
    task_state_accessor_scope,
)
from airflow_provider_pulsarstate.hooks.pulsarstate import (
    AssetStateScope,
    PulsarStateHook,
    StateScope,
    StateScopeError,
    StateStore,
    StateStoreDataError,
    TaskStateScope,
    parse_state_key,
    state_scope,
)
from airflow_provider_pulsarstate.hooks.teams import refuse_shared_team_settings
from airflow_provider_pulsarstate.provider_settings import LEGACY_KEY_NAMESPACE

if TYPE_CHECKING:
    from datetime import datetime

    from airflow_provider_pulsarstate.state_store.cleanup import StateCleanupReport

log = logging.getLogger(__name__)

T = TypeVar("T")

REF_KEY = "__airflow_state_ref__"
"""The marker the task SDK wraps a worker-side reference in (airflow.sdk.execution_time.context)."""

CLASS_PATH = "airflow_provider_pulsarstate.state_store.backend.PulsarStateStoreBackend"

try:  # the server checks against airflow-core's copy of BaseStoreBackend; workers may lack airflow-core
    from airflow.state import BaseStoreBackend as _CoreBaseStoreBackend

    _BASES: tuple[type, ...] = (BaseStoreBackend, _CoreBaseStoreBackend)
except ImportError:  # pragma: no cover - a task-SDK-only worker
    _BASES = (BaseStoreBackend,)


class StateStoreUnavailableError(BackendUnavailableError):
    """The state store's map could not be read or written (broker or file unreachable, time-out);
    the message names the connection and topic."""


def _running_task_scope() -> TaskStateScope | None:
    """The scope of the task instance whose context is active (None outside a task: the API server)."""
    try:
        from airflow.sdk import get_current_context

        ti = get_current_context()["ti"]
    except Exception:
        return None
    return TaskStateScope(ti.dag_id, ti.run_id, ti.task_id, -1 if ti.map_index is None else int(ti.map_index))


def _row_being_read(kind: str) -> tuple[StateScope | None, str] | None:
    """The (scope, key) the task SDK's accessor is reading when it hands a reference to
    ``deserialize_*_from_ref`` (which is given nothing else): the accessor's own ``self`` and
    ``key`` in the caller frames (``TaskStateStoreAccessor.get``,
    ``AssetStateStoreAccessor._extract_get_response`` of task SDK 1.3). None when not found.
    For an asset reached by URI only, the scope is None (its name is unknown to the worker)."""
    for frame in caller_frames(2, 6):
        owner, key = frame.f_locals.get("self"), frame.f_locals.get("key")
        name = type(owner).__name__
        if isinstance(key, str):
            if kind == "task" and name == "TaskStateStoreAccessor":
                return state_scope(task_state_accessor_scope(owner)), key
            if kind == "asset" and name == "AssetStateStoreAccessor":
                asset_name = asset_state_accessor_name(owner)
                return (AssetStateScope(asset_name) if asset_name else None), key
    return None


def _describe(scope: StateScope) -> str:
    if isinstance(scope, TaskStateScope):
        index = "" if scope.map_index == -1 else f"[{scope.map_index}]"
        return f"task {scope.dag_id}.{scope.task_id}{index} of run {scope.run_id!r}"
    return f"asset {scope.name!r}"


class PulsarStateStoreBackend(*_BASES):  # type: ignore[misc]
    """Task and asset state in one PulsarMap per DAG run and per asset (see the module docstring).

    Settings come from ``[pulsarstate]``: ``conn_id``, ``state_store_topic``, ``key_namespace``,
    ``state_store_max_value_bytes``, ``state_store_writer_idle_timeout``. Airflow makes one
    instance per process; the maps behind it are the process's pool
    (:meth:`PulsarStateHook.get_state_store`).

    :raises ConfigurationError: ``[core] multi_team`` is on and the teams do not each have their
        own namespace and topics (the message says what to configure).
    """

    def __init__(self) -> None:
        from airflow_provider_pulsarstate.provider_settings import settings

        refuse_shared_team_settings()
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
            store = self._hook.get_state_store()
            return fn(store)
        except (StateStoreDataError, StateScopeError, ConfigurationError, ValueError, TypeError):
            raise
        except Exception as exc:
            raise StateStoreUnavailableError(
                f"state store {what} failed: connection {settings.conn_id!r}, topic {settings.state_store_topic!r} "
                f"could not be reached ({type(exc).__name__}: {exc}); nothing was stored in the metadata DB instead"
            ) from exc

    def _scope(self, scope: Any, session: Any = None, *, key: str | None = None) -> StateScope:
        """The engine scope (a server-side asset_id resolved to the asset's name, cached), checked
        against the running task instance."""
        asset_id = getattr(scope, "asset_id", None)
        if asset_id is not None and not getattr(scope, "name", None):
            return AssetStateScope(self._asset_name(int(asset_id), session))
        return self._own_scope(state_scope(scope), key)

    @staticmethod
    def _own_scope(scope: StateScope, key: str | None) -> StateScope:
        """``scope``, unless a task context is active and it is another task instance's (``ti:self``)."""
        if isinstance(scope, TaskStateScope):
            running = _running_task_scope()
            if running is not None and running != scope:
                raise StateScopeError(
                    f"state key {key!r} of {_describe(scope)}: the running {_describe(running)} may reach only "
                    f"its own task state (Airflow's ti:self scoping); nothing was read or written"
                )
        return scope

    def _asset_name(self, asset_id: int, session: Any) -> str:
        with self._lock:
            name = self._asset_names.get(asset_id)
        if name is None:
            from airflow.models.asset import AssetModel
            from sqlalchemy import select

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

    async def _ascope(self, scope: Any, session: Any, *, key: str | None = None) -> StateScope:
        asset_id = getattr(scope, "asset_id", None)
        if asset_id is None or getattr(scope, "name", None):
            return self._own_scope(state_scope(scope), key)
        with self._lock:
            name = self._asset_names.get(int(asset_id))
        if name is not None:
            return AssetStateScope(name)
        if session is not None and asyncio.iscoroutinefunction(getattr(session, "scalar", None)):
            from airflow.models.asset import AssetModel
            from sqlalchemy import select

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
            from airflow.sdk.module_loading import import_string

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
        """The stored JSON text (or, when workers also use this backend, this backend's own
        reference to the entry asked for), None when absent or expired."""
        resolved = self._scope(scope, session, key=key)
        return self._run("get", lambda store: self._get(store, resolved, key))

    def _get(self, store: StateStore, scope: StateScope, key: str) -> str | None:
        text = store.get_json(scope, key)
        if text is None:
            return None
        if self._workers_use_this_backend():  # never the stored text, which may look like a reference
            return json.dumps({REF_KEY: store.map_key(scope, key)})
        return text

    def set(self, scope: Any, key: str, value: str, *, expires_at: datetime | None = None, session: Any = None) -> None:
        """Store ``value`` (JSON text) until ``expires_at``; when workers use this backend, their
        reference to this very entry only updates its expiry (the worker already stored the value)."""
        resolved = self._scope(scope, session, key=key)
        self._run("set", lambda store: self._set(store, resolved, key, value, expires_at))

    def _set(self, store: StateStore, scope: StateScope, key: str, value: str, expires_at: datetime | None) -> None:
        map_key = store.map_key(scope, key)
        if self._workers_use_this_backend() and self._reference_in(value) == map_key:
            if not store.set_expiry(scope, key, expires_at):
                raise StateStoreDataError(
                    f"{store.topic_of(scope)}: the worker's reference names state entry {map_key!r}, which is absent"
                )
            return
        store.set_json(scope, key, value, expires_at=expires_at)

    def delete(self, scope: Any, key: str, *, session: Any = None) -> None:
        resolved = self._scope(scope, session, key=key)
        self._run("delete", lambda store: store.delete(resolved, key))

    def clear(self, scope: Any, *, all_map_indices: bool = False, session: Any = None) -> None:
        resolved = self._scope(scope, session)
        self._run("clear", lambda store: store.clear(resolved, all_map_indices=all_map_indices))

    # Async twins: the blocking map call runs in the loop's default thread pool (asyncio.to_thread),
    # never in asgiref's single shared thread, so one slow broker call stalls no other coroutine.
    async def aget(self, scope: Any, key: str, *, session: Any = None) -> str | None:
        resolved = await self._ascope(scope, session, key=key)
        return await asyncio.to_thread(self._run, "get", partial(self._get, scope=resolved, key=key))

    async def aset(
        self, scope: Any, key: str, value: str, *, expires_at: datetime | None = None, session: Any = None
    ) -> None:
        resolved = await self._ascope(scope, session, key=key)
        await asyncio.to_thread(
            self._run, "set", partial(self._set, scope=resolved, key=key, value=value, expires_at=expires_at)
        )

    async def adelete(self, scope: Any, key: str, *, session: Any = None) -> None:
        resolved = await self._ascope(scope, session, key=key)
        await asyncio.to_thread(self._run, "delete", lambda store: store.delete(resolved, key))

    async def aclear(self, scope: Any, *, all_map_indices: bool = False, session: Any = None) -> None:
        resolved = await self._ascope(scope, session)
        await asyncio.to_thread(
            self._run, "clear", lambda store: store.clear(resolved, all_map_indices=all_map_indices)
        )

    def cleanup(self, *, dry_run: bool = False) -> int:
        """Remove this deployment's expired entries and the maps of finished runs whose state all
        expired, never touching a run the metadata DB holds in a non-terminal state; expiry is
        judged on the metadata DB's clock. Needs the metadata DB (API server, scheduler, CLI).
        Returns how many entries were removed."""
        return self.cleanup_report(dry_run=dry_run).entries_deleted

    def cleanup_report(self, *, dry_run: bool = False, log_to: Any = None) -> StateCleanupReport:
        """:meth:`cleanup`, returning the full report."""
        from airflow_provider_pulsarstate.state_store.cleanup import run_state_cleanup
        from airflow_provider_pulsarstate.xcom.metadata_db import db_now, run_statuses_in_db

        report = self._run(
            "cleanup",
            lambda store: run_state_cleanup(
                store,
                run_statuses=run_statuses_in_db,
                now=db_now(),
                dry_run=dry_run,
                timeout=max(30.0, self._hook.cached_config().operation_timeout),
                log=log_to,
            ),
        )
        log.info("PulsarStateStoreBackend.cleanup: %s", report)
        return report

    # ------------------------------------------------------------------ worker side
    def serialize_task_state_store_to_ref(self, *, value: Any, key: str, scope: Any) -> str:
        """Store ``value`` in the map; the DB keeps the returned reference (the entry's map key)."""
        return self._store_value(value, key, scope)

    def serialize_asset_state_store_to_ref(self, *, value: Any, key: str, scope: AssetScope) -> str:
        return self._store_value(value, key, scope)

    def _store_value(self, value: Any, key: str, scope: Any) -> str:
        resolved = self._scope(scope, key=key)

        def write(store: StateStore) -> str:
            store.set(resolved, key, value)
            return store.map_key(resolved, key)

        return self._run("set", write)

    def deserialize_task_state_store_from_ref(self, stored: str) -> Any:
        """The value the reference names (None when the entry is gone or expired), once the
        reference is checked to name the row being read (:class:`StateScopeError` otherwise)."""
        return self._load_value(stored, "task", _row_being_read("task"))

    def deserialize_asset_state_store_from_ref(self, stored: str) -> Any:
        return self._load_value(stored, "asset", _row_being_read("asset"))

    def _named(self, ref: Any, kind: str) -> tuple[StateScope, str]:
        """(scope, key) a reference names: a key of this namespace or, for references the DB kept
        from the earlier layout, of the earlier default namespace (read from the migrated maps)."""
        try:
            scope, key = parse_state_key(self._settings.key_namespace, ref)
        except StateStoreDataError:
            try:
                scope, key = parse_state_key(LEGACY_KEY_NAMESPACE, ref)
            except StateStoreDataError:
                raise StateStoreDataError(
                    f"state reference {ref!r} does not name a state entry of namespace "
                    f"{self._settings.key_namespace!r}: refusing to follow it"
                ) from None
        if (kind == "task") != isinstance(scope, TaskStateScope):
            raise StateScopeError(f"state reference {ref!r} does not name {kind} state: refusing to follow it")
        return scope, key

    def _load_value(self, ref: str, kind: str, row: tuple[StateScope | None, str] | None) -> Any:
        scope, key = self._named(ref, kind)
        if row is not None:
            asked_scope, asked_key = row
            if asked_key != key or (asked_scope is not None and asked_scope != scope):
                asked = "an asset reached by URI" if asked_scope is None else _describe(asked_scope)
                raise StateScopeError(
                    f"state reference {ref!r} is not bound to its row: it names key {key!r} of {_describe(scope)}, "
                    f"but key {asked_key!r} of {asked} is being read; refusing to follow it"
                )
        self._own_scope(scope, key)

        def read(store: StateStore) -> Any:
            entry = store.get_entry(scope, key)
            return None if entry is None else entry.value

        return self._run("get", read)
