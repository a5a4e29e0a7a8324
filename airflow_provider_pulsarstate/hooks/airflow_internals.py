"""The one module that relies on parts of Airflow with no public API.

Each function names what it relies on; ``tests/airflow/test_airflow_internals.py`` checks those
parts against the installed Airflow, so an upgrade that changes them fails there, loudly, instead
of silently changing behaviour here.
"""

from __future__ import annotations

import contextlib
import os
from typing import Iterator

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
    (its own check, with ``[core] sensitive_var_conn_names`` of this deployment)."""
    from airflow._shared.secrets_masker import should_hide_value_for_key

    return bool(should_hide_value_for_key(name))
