"""``airflow pulsarstate xcom-cleanup``: remove the XCom maps of runs gone from the metadata DB or past a retention.

Runs where the metadata DB is (it reads the ``dag_run`` table directly), with the same
pulsarstate settings (section ``pulsarstate``) and connection as the workers::

    airflow pulsarstate xcom-cleanup                       # runs no longer in the DB
    airflow pulsarstate xcom-cleanup --older-than-days 30  # ... and finished runs that ended longer ago
    airflow pulsarstate xcom-cleanup --older-than-days 30 --keep-missing --dry-run --dag-id my_dag
"""

from __future__ import annotations

import argparse
import datetime
from typing import Any

from airflow.cli.cli_config import Arg

from airflow_provider_pulsarstate.cli.output import PrintLog

_BATCH = 500


def run_statuses_in_db(dag_id: str, run_ids: list[str]) -> dict[str, Any]:
    """State and end date (epoch s) of the runs among ``run_ids`` of ``dag_id`` the ``dag_run`` table holds."""
    from sqlalchemy import select

    from airflow.models.dagrun import DagRun
    from airflow.utils.session import create_session

    from airflow_provider_pulsarstate.xcom.cleanup import RunStatus

    found: dict[str, RunStatus] = {}
    with create_session() as session:
        for i in range(0, len(run_ids), _BATCH):
            batch = run_ids[i : i + _BATCH]
            query = select(DagRun.run_id, DagRun.state, DagRun.end_date).where(
                DagRun.dag_id == dag_id, DagRun.run_id.in_(batch)
            )
            for run_id, state, end_date in session.execute(query):
                found[run_id] = RunStatus.of(state, None if end_date is None else _epoch(end_date))
    return found


def db_now() -> float:
    """The metadata DB's clock now (epoch s): end dates are judged against it, not this host's."""
    from sqlalchemy import func, select

    from airflow.utils.session import create_session

    with create_session() as session:
        return _epoch(session.scalar(select(func.current_timestamp())))


def _epoch(value: Any) -> float:
    if isinstance(value, str):  # SQLite answers CURRENT_TIMESTAMP as text, in UTC
        value = datetime.datetime.fromisoformat(value)
    if value.tzinfo is None:
        value = value.replace(tzinfo=datetime.timezone.utc)
    return value.timestamp()


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
    Arg(("--older-than-days",), type=float, default=None, help="Also delete finished runs that ended more than this many days ago"),
    Arg(("--keep-missing",), action="store_true", help="Do not delete runs that are no longer in the metadata DB"),
    Arg(("--dag-id",), default=None, help="Only this DAG's entries"),
    Arg(("--dry-run",), action="store_true", help="Report what would be deleted, delete nothing"),
)
