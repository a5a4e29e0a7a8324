"""The provider's CLI group, ``airflow pulsarstate`` (listed under ``cli`` in the provider info).

Every command runs in Airflow's server context, as ``airflow connections get`` does: connections
come from the metadata DB, the secrets backends and the environment, and a missing
``pulsarstate_default`` is an error (exit status 1, naming it and how to define it) instead of a
silent fallback to an embedded log nobody else uses.
"""

from __future__ import annotations

import argparse
import functools
from collections.abc import Callable
from types import ModuleType

from airflow.cli.cli_config import ActionCommand, GroupCommand

from airflow_provider_pulsarstate.cli import (
    fence_reset,
    state_store_cleanup,
    state_store_migrate,
    table_show,
    xcom_cleanup,
    xcom_show,
)

_COMMANDS: list[tuple[str, str, ModuleType, Callable[..., None]]] = [
    (
        "xcom-cleanup",
        "Remove the XCom maps of runs no longer in the metadata DB or finished longer ago than a retention",
        xcom_cleanup,
        xcom_cleanup.xcom_cleanup,
    ),
    (
        "state-store-cleanup",
        "Remove expired task and asset state (Airflow's own clean-up skips custom backends)",
        state_store_cleanup,
        state_store_cleanup.state_store_cleanup,
    ),
    (
        "state-store-migrate",
        "Move task and asset state of the earlier single-map layout into the per-run and per-asset maps",
        state_store_migrate,
        state_store_migrate.state_store_migrate,
    ),
    (
        "reset-fence",
        "Remove a lease fence from a table, with a record in its log (after a forged token)",
        fence_reset,
        fence_reset.reset_fence,
    ),
    ("table-show", "Print a table's committed rows as JSON (read-only)", table_show, table_show.table_show),
    (
        "xcom-show",
        "Print the XCom values of one DAG run from the provider's store as JSON (read-only)",
        xcom_show,
        xcom_show.xcom_show,
    ),
]


def server_side(name: str, func: Callable[[argparse.Namespace], None]) -> Callable[[argparse.Namespace], None]:
    """``func`` run in Airflow's server context; a configuration error exits with status 1 and
    its message (no traceback)."""

    @functools.wraps(func)
    def command(args: argparse.Namespace) -> None:
        from airflow_provider_pulsarstate.engine.errors import ConfigurationError
        from airflow_provider_pulsarstate.hooks.airflow_internals import server_context

        with server_context():
            try:
                func(args)
            except ConfigurationError as exc:
                raise SystemExit(f"airflow pulsarstate {name}: {exc}") from None

    return command


def get_cli_commands() -> list[GroupCommand]:
    """``airflow pulsarstate xcom-cleanup``, ``state-store-cleanup``, ``state-store-migrate``, ``reset-fence``,
    and the read-only ``table-show`` and ``xcom-show``."""
    return [
        GroupCommand(
            name="pulsarstate",
            help="Pulsar State provider commands",
            subcommands=[
                ActionCommand(
                    name=name,
                    help=help_text,
                    func=server_side(name, func),
                    args=module.ARGS,
                    description=module.__doc__,
                )
                for name, help_text, module, func in _COMMANDS
            ],
        )
    ]
