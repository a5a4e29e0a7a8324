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
