"""``airflow pulsarstate state-store-cleanup``: expired task and asset state out, maps of finished runs dropped.

Airflow's own ``airflow state-store cleanup`` skips custom backends, so nothing in Airflow removes
expired entries of :class:`~airflow_provider_pulsarstate.state_store.backend.PulsarStateStoreBackend`
(reads already treat them as absent). Run this periodically (cron, or a DAG's BashOperator) where
the metadata DB is reachable, with the same ``[pulsarstate]`` settings and connection as the
workers. A run the DB holds in a non-terminal state is never touched; expiry is judged on the
metadata DB's clock (see :mod:`~airflow_provider_pulsarstate.state_store.cleanup`)::

    airflow pulsarstate state-store-cleanup
    airflow pulsarstate state-store-cleanup --dry-run
"""

from __future__ import annotations

import argparse

from airflow.cli.cli_config import Arg

from airflow_provider_pulsarstate.cli.output import PrintLog


def state_store_cleanup(args: argparse.Namespace) -> None:
    """The command: clean this deployment's state maps and print what was done."""
    from airflow_provider_pulsarstate.state_store.backend import PulsarStateStoreBackend

    report = PulsarStateStoreBackend().cleanup_report(dry_run=args.dry_run, log_to=PrintLog())
    verb = "would remove" if args.dry_run else "removed"
    n = report.entries_deleted
    print(f"state-store-cleanup: {verb} {n} expired entr{'y' if n == 1 else 'ies'}")


ARGS = (Arg(("--dry-run",), action="store_true", help="Report what would be deleted, delete nothing"),)
