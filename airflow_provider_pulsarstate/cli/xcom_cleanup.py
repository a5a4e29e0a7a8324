"""``airflow pulsarstate xcom-cleanup``: remove the XCom maps of runs gone from the metadata DB or past a retention.

Runs where the metadata DB is (it reads the ``dag_run`` table directly), with the same
pulsarstate settings (section ``pulsarstate``) and connection as the workers::

    airflow pulsarstate xcom-cleanup                       # runs no longer in the DB
    airflow pulsarstate xcom-cleanup --older-than-days 30  # ... and finished runs that ended longer ago
    airflow pulsarstate xcom-cleanup --older-than-days 30 --keep-missing --dry-run --dag-id my_dag
"""

from __future__ import annotations

import argparse

from airflow.cli.cli_config import Arg

from airflow_provider_pulsarstate.cli.output import PrintLog
from airflow_provider_pulsarstate.xcom.metadata_db import db_now, run_statuses_in_db


def xcom_cleanup(args: argparse.Namespace) -> None:
    """The command: print the table of stale runs and the counts."""
    from airflow_provider_pulsarstate.xcom.cleanup import run_cleanup

    if args.keep_missing and args.older_than_days is None:
        raise SystemExit("xcom-cleanup: --keep-missing needs --older-than-days (otherwise there is nothing to select)")

    run_cleanup(
        run_statuses=run_statuses_in_db,
        remove_missing_runs=not args.keep_missing,
        older_than_days=args.older_than_days,
        now=db_now(),
        dry_run=args.dry_run,
        dag_id=args.dag_id,
        log=PrintLog(),
    )


ARGS = (
    Arg(
        ("--older-than-days",),
        type=float,
        default=None,
        help="Also delete finished runs that ended more than this many days ago",
    ),
    Arg(("--keep-missing",), action="store_true", help="Do not delete runs that are no longer in the metadata DB"),
    Arg(("--dag-id",), default=None, help="Only this DAG's entries"),
    Arg(("--dry-run",), action="store_true", help="Report what would be deleted, delete nothing"),
)
