"""Metadata-DB look-ups the cleanups judge runs by: their states and end dates, and the DB's clock."""

from __future__ import annotations

import datetime
from typing import Any

_BATCH = 500


def run_statuses_in_db(dag_id: str, run_ids: list[str]) -> dict[str, Any]:
    """State and end date (epoch s) of the runs among ``run_ids`` of ``dag_id`` the ``dag_run`` table holds."""
    from airflow.models.dagrun import DagRun
    from airflow.utils.session import create_session
    from sqlalchemy import select

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
    from airflow.utils.session import create_session
    from sqlalchemy import func, select

    with create_session() as session:
        return _epoch(session.scalar(select(func.current_timestamp())))


def _epoch(value: Any) -> float:
    if isinstance(value, str):  # SQLite answers CURRENT_TIMESTAMP as text, in UTC
        value = datetime.datetime.fromisoformat(value)
    if value.tzinfo is None:
        value = value.replace(tzinfo=datetime.timezone.utc)
    return value.timestamp()


def recent_runs(dag_id: str, *, limit: int, before_id: int | None = None) -> list[dict[str, Any]]:
    """The newest runs of ``dag_id`` in the ``dag_run`` table (by row id, newest first), at most
    ``limit``, older than row ``before_id`` when given: id, run id, state and run-after time (epoch s)."""
    from airflow.models.dagrun import DagRun
    from airflow.utils.session import create_session
    from sqlalchemy import select

    query = select(DagRun.id, DagRun.run_id, DagRun.state, DagRun.run_after).where(DagRun.dag_id == dag_id)
    if before_id is not None:
        query = query.where(DagRun.id < before_id)
    query = query.order_by(DagRun.id.desc()).limit(limit)
    with create_session() as session:
        return [
            {
                "id": row_id,
                "run_id": run_id,
                "state": None if state is None else str(state),
                "run_after": None if run_after is None else _epoch(run_after),
            }
            for row_id, run_id, state, run_after in session.execute(query)
        ]
