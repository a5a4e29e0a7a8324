"""XComCleanupOperator: remove XCom entries Airflow will never purge (deleted runs, retention).

Tasks in Airflow 3 have no metadata-DB access; what a task can ask is the execution API. The
operator asks it how many of a DAG's runs among given run ids exist (``ti.get_dr_count(dag_id,
run_ids=...)``, answered from the ``dag_run`` table) and narrows a batch down by halving when some
are gone, so it sees exactly which runs were deleted (UI, REST API, ``airflow db clean`` of
``dag_run``). It cannot see XCom rows deleted while their run remains (REST ``DELETE`` of one XCom,
``airflow db clean`` of the ``xcom`` table alone): ``older_than_days`` covers those, as does the CLI
(``airflow pulsarstate xcom-cleanup``), which runs where the DB is.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from airflow.sdk import BaseOperator

from airflow_provider_pulsarstate.xcom.cleanup import RunStatus, RunStatuses, run_cleanup

_BATCH = 50  # run ids per execution-API call (they travel in the query string)


class XComCleanupOperator(BaseOperator):
    """Delete the XCom entries of runs that are gone from the metadata DB or older than a retention.

    Example::

        XComCleanupOperator(task_id="xcom_cleanup", older_than_days=30)  # e.g. in a daily DAG

    :param older_than_days: also delete finished runs whose newest entry is older than this (None: keep
        them); runs that are not finished are never deleted.
    :param remove_missing_runs: delete runs the metadata DB no longer holds (default True).
    :param dry_run: report what would be deleted, delete nothing. Templated; kept as
        :attr:`report_only` (``BaseOperator.dry_run`` is a method).
    :param dag_id: only this DAG's entries (default: all DAGs of ``[pulsarstate] key_namespace``).
    :return: (XCom) the counts: ``runs_scanned``, ``entries_scanned``, ``runs_missing``,
        ``runs_expired``, ``runs_live``, ``runs_changed``, ``maps_foreign``, ``entries_deleted``,
        ``bytes_deleted``, ``dry_run``.
    """

    template_fields: Sequence[str] = ("older_than_days", "report_only", "dag_id_filter")

    def __init__(
        self,
        *,
        older_than_days: float | None = None,
        remove_missing_runs: bool = True,
        dry_run: bool = False,
        dag_id_filter: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.older_than_days = older_than_days
        self.remove_missing_runs = remove_missing_runs
        self.report_only = dry_run
        self.dag_id_filter = dag_id_filter

    def execute(self, context: Any) -> dict[str, Any]:
        ti = context["ti"]
        days = None if self.older_than_days in (None, "", "None") else float(self.older_than_days)
        report = run_cleanup(
            run_statuses=_run_statuses_via_api(ti.get_dr_count, ti.get_dagrun_state),
            remove_missing_runs=self.remove_missing_runs,
            older_than_days=days,
            dry_run=str(self.report_only) == "True",
            dag_id=self.dag_id_filter or None,
            log=self.log,
        )
        return report.as_dict()


def _run_statuses_via_api(count: Callable[..., int], state_of: Callable[[str, str], str]) -> RunStatuses:
    """``run_statuses`` for :func:`run_cleanup` from the execution API: which runs exist (counted,
    narrowed by halving) and their states. End dates are not given to tasks: retention then uses the
    newest value's write time."""
    existing = _existing_runs_via_api(count)

    def statuses(dag_id: str, run_ids: list[str]) -> dict[str, RunStatus]:
        return {run_id: RunStatus.of(state_of(dag_id, run_id)) for run_id in sorted(existing(dag_id, run_ids))}

    return statuses


def _existing_runs_via_api(count: Callable[..., int]) -> Callable[[str, list[str]], set[str]]:
    """``existing_runs`` for :func:`run_cleanup` from ``count(dag_id, run_ids=[...]) -> int``."""

    def present(dag_id: str, run_ids: list[str]) -> set[str]:
        if not run_ids:
            return set()
        n = count(dag_id, run_ids=run_ids)
        if n >= len(run_ids):
            return set(run_ids)
        if n == 0:
            return set()
        half = len(run_ids) // 2
        return present(dag_id, run_ids[:half]) | present(dag_id, run_ids[half:])

    def existing(dag_id: str, run_ids: list[str]) -> set[str]:
        found: set[str] = set()
        for i in range(0, len(run_ids), _BATCH):
            found |= present(dag_id, run_ids[i : i + _BATCH])
        return found

    return existing
