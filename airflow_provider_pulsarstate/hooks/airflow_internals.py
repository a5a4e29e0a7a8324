"""The one module that relies on parts of Airflow (and its providers) with no public API.

Each function names what it relies on and why no public API serves; ``tests/airflow/test_airflow_internals.py``
checks those parts against the installed Airflow, so an upgrade that changes them fails there, loudly,
instead of silently changing behaviour here. ``tests/test_private_apis.py`` keeps every other module
of the package off other projects' private names.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from types import FrameType
from typing import Any

PROCESS_CONTEXT_ENV = "_AIRFLOW_PROCESS_CONTEXT"
"""Airflow 3.3's marker of a server process (``server``) or a task-side one (``client``): outside
a task, connections come from the metadata DB only when it says ``server``."""


BLOCKED_DB_URL_PREFIX = "airflow-db-not-allowed:"
"""What Airflow 3.3's supervisor puts in ``[database] sql_alchemy_conn`` of a task process
(``block_orm_access``): the metadata DB's address is hidden from tasks."""


def is_blocked_db_url(address: str) -> bool:
    """Whether ``address`` is the placeholder a task process sees instead of the metadata DB's URL."""
    return address.strip().startswith(BLOCKED_DB_URL_PREFIX)


def in_task_runner() -> bool:
    """Whether this process is a task runner talking to its supervisor (``SUPERVISOR_COMMS`` set in
    ``airflow.sdk.execution_time.task_runner``), which Airflow itself checks before the process
    context: a task forked from a server process (LocalExecutor under the scheduler) inherits
    ``_AIRFLOW_PROCESS_CONTEXT=server`` but is task-side."""
    import sys

    task_runner = sys.modules.get("airflow.sdk.execution_time.task_runner")
    return getattr(task_runner, "SUPERVISOR_COMMS", None) is not None


def in_server_context() -> bool:
    """Whether this process is an Airflow server process (API server, scheduler, a server-side CLI
    command), where connections are read from the metadata DB, secrets backends and environment;
    decided as Airflow's own secrets-backend choice does (a task runner is never server-side)."""
    return os.environ.get(PROCESS_CONTEXT_ENV) == "server" and not in_task_runner()


@contextlib.contextmanager
def server_context() -> Iterator[None]:
    """Resolve connections as ``airflow connections get`` does (metadata DB, secrets backends,
    environment) inside the block, as Airflow's own CLI commands do; the previous context is
    restored after it."""
    previous = os.environ.get(PROCESS_CONTEXT_ENV)
    os.environ[PROCESS_CONTEXT_ENV] = "server"
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop(PROCESS_CONTEXT_ENV, None)
        else:
            os.environ[PROCESS_CONTEXT_ENV] = previous


def is_masked_field_name(name: str) -> bool:
    """Whether Airflow's UI and API mask the value of a connection extra field named ``name``
    (its own check, with ``[core] sensitive_var_conn_names`` of this deployment).

    Private: the check lives only in ``airflow._shared.secrets_masker``; a copy of it would drift
    from what the REST API actually masks."""
    from airflow._shared.secrets_masker import should_hide_value_for_key

    return bool(should_hide_value_for_key(name))


def caller_frames(skip: int, limit: int) -> list[FrameType]:
    """Up to ``limit`` frames, innermost first, starting ``skip`` frames above the caller
    (``skip=1``: the caller's caller).

    Private (``sys._getframe``): Airflow hands a state-store or XCom backend neither the task
    instance pushing a return value (pushed by the task runner after the task context is left) nor
    the accessor a reference is read through; the caller frames hold them. Callers only read
    ``f_locals`` and fall back to "not found"."""
    frames: list[FrameType] = []
    frame: FrameType | None = sys._getframe(skip + 1)
    while frame is not None and len(frames) < limit:
        frames.append(frame)
        frame = frame.f_back
    return frames


def task_state_accessor_scope(accessor: Any) -> Any:
    """The task scope a ``TaskStateStoreAccessor`` (task SDK) reads, kept in its private ``_scope``
    (no public attribute names it)."""
    return accessor._scope


def asset_state_accessor_name(accessor: Any) -> str | None:
    """The asset name an ``AssetStateStoreAccessor`` (task SDK) reads, kept in its private ``_name``
    (None when the asset is reached by URI only)."""
    return getattr(accessor, "_name", None)


def asset_state_accessors(store: Any) -> list[Any] | None:
    """The per-asset accessors inside an ``AssetStateStoreAccessors`` (a trigger's
    ``asset_state_store``, one per watched asset, in its private ``_by_name`` / ``_by_uri`` dicts:
    the class offers item access by asset only, not iteration). None when ``store`` is not one."""
    by_name, by_uri = getattr(store, "_by_name", None), getattr(store, "_by_uri", None)
    if isinstance(by_name, dict) and isinstance(by_uri, dict):
        return [*by_name.values(), *by_uri.values()]
    return None


def spark_submit_command(hook: Any, application: str) -> list[str]:
    """The argv ``SparkSubmitHook`` (Spark provider) would run for ``application``, built by its
    private ``_build_spark_submit_command``: the only way to see, before submitting, whether the
    master puts ``env_vars`` on the command line (YARN and Kubernetes cluster modes do)."""
    return list(hook._build_spark_submit_command(application))


def spark_submit_master(hook: Any) -> str | None:
    """The master of a ``SparkSubmitHook``'s resolved connection (its private ``_connection`` dict),
    for error messages."""
    connection = getattr(hook, "_connection", None) or {}
    return connection.get("master")
