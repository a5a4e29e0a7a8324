"""``airflow pulsarstate xcom-cleanup``: remove XCom entries of runs gone from the metadata DB or past a retention.

Runs where the metadata DB is (it reads the ``dag_run`` table directly), with the same
pulsarstate settings (section ``pulsarstate``) and connection as the workers::

    airflow pulsarstate xcom-cleanup                       # runs no longer in the DB
    airflow pulsarstate xcom-cleanup --older-than-days 30  # ... and runs whose newest value is older
    airflow pulsarstate xcom-cleanup --older-than-days 30 --keep-missing --dry-run --dag-id my_dag
"""

from __future__ import annotations

import argparse
from typing import Any

from airflow.cli.cli_config import Arg

_BATCH = 500


def existing_runs_in_db(dag_id: str, run_ids: list[str]) -> set[str]:
    """The run ids among ``run_ids`` of ``dag_id`` that the ``dag_run`` table holds."""
    from sqlalchemy import select

    from airflow.models.dagrun import DagRun
    from airflow.utils.session import create_session

    found: set[str] = set()
    with create_session() as session:
        for i in range(0, len(run_ids), _BATCH):
            batch = run_ids[i : i + _BATCH]
            found.update(session.scalars(select(DagRun.run_id).where(DagRun.dag_id == dag_id, DagRun.run_id.in_(batch))))
    return found


def xcom_cleanup(args: argparse.Namespace) -> None:
    """The command: print the table of stale runs and the counts."""
    from airflow_provider_pulsarstate.xcom.cleanup import run_cleanup

    if args.keep_missing and args.older_than_days is None:
        raise SystemExit("xcom-cleanup: --keep-missing needs --older-than-days (otherwise there is nothing to select)")
    class _Print:
        def info(self, fmt: str, *values: Any) -> None:
            print(fmt % values)

    run_cleanup(
        existing_runs=None if args.keep_missing else existing_runs_in_db,
        older_than_days=args.older_than_days,
        dry_run=args.dry_run,
        dag_id=args.dag_id,
        log=_Print(),
    )


ARGS = (
    Arg(("--older-than-days",), type=float, default=None, help="Also delete runs whose newest XCom is older than this many days"),
    Arg(("--keep-missing",), action="store_true", help="Do not delete runs that are no longer in the metadata DB"),
    Arg(("--dag-id",), default=None, help="Only this DAG's entries"),
    Arg(("--dry-run",), action="store_true", help="Report what would be deleted, delete nothing"),
)
