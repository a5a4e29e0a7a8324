"""Where the embedded default state log may serve: only executors that run every task on one host.

Without a ``pulsarstate_default`` connection, task code falls back to the embedded log under
``$AIRFLOW_HOME``; under an executor that runs tasks on several hosts each host would get its own
private "shared" file, so the fallback is refused there.
"""

from __future__ import annotations

from airflow_provider_pulsarstate.engine.errors import ConfigurationError
from airflow_provider_pulsarstate.hooks.connection_form import CONN_TYPE

LOCAL_EXECUTORS = frozenset({"LocalExecutor", "SequentialExecutor", "DebugExecutor"})
"""Executors that run every task on the scheduler's host (where the embedded default is shared)."""


def refuse_multi_host_executor(conn_id: str) -> None:
    """Raise ConfigurationError when ``[core] executor`` may run tasks on other hosts.

    ``[core] executor`` may list several executors (Airflow 3), each ``alias:module.Class`` or a name.
    """
    from airflow.configuration import conf

    configured = conf.get("core", "executor", fallback="LocalExecutor") or "LocalExecutor"
    remote = [
        name.strip()
        for name in configured.split(",")
        if name.strip() and name.strip().rpartition(":")[2].rpartition(".")[2] not in LOCAL_EXECUTORS
    ]
    if remote:
        raise ConfigurationError(
            f"Airflow connection {conn_id!r} is not defined, and the embedded default state log cannot be shared "
            f"by executor(s) {', '.join(remote)} that run tasks on several hosts (each host would get its own private "
            f"file, and a view applied from one would delete what the others staged). Configure a pulsarstate "
            f"connection: create {conn_id!r} (type {CONN_TYPE!r}) or set AIRFLOW_CONN_{conn_id.upper()}"
        )
