"""The XCom clean-up both the operator and the CLI run: select stale runs, delete their entries, report.

Airflow calls ``purge`` only when a worker deletes an XCom (a retried or re-run task); deleting a
run, clearing through the REST API and ``airflow db clean`` leave the entries in the map. A run is
stale when Airflow's metadata DB no longer has it (``missing``) or when its newest entry is older than
the retention (``expired``); all entries of a stale run are deleted in one atomic write.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Any, Callable, Iterable

from airflow_provider_pulsarstate.hooks.provider_config import ProviderSettings, load_settings

ExistingRuns = Callable[[str, list[str]], Iterable[str]]
"""``(dag_id, run_ids) -> the run ids among them that the metadata DB still holds``."""


@dataclass(frozen=True)
class CleanupReport:
    """What a clean-up saw and did (``asdict()`` is the operator's XCom)."""

    runs_scanned: int
    entries_scanned: int
    runs_missing: int
    runs_expired: int
    entries_deleted: int
    bytes_deleted: int
    dry_run: bool

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def run_cleanup(
    *,
    existing_runs: ExistingRuns | None,
    older_than_days: float | None,
    dry_run: bool = False,
    dag_id: str | None = None,
    settings: ProviderSettings | None = None,
    log: Any = None,
) -> CleanupReport:
    """Open the configured XCom store, delete the entries of stale runs (unless ``dry_run``) and
    log a table of the runs (dag, run, reason, entries, bytes, newest write) and the totals.

    :param existing_runs: how to tell which runs the metadata DB still holds (None: do not check).
    :param older_than_days: retention in days (None: no retention).
    """
    from airflow_provider_pulsarstate.hooks.pulsarstate import PulsarStateHook

    if existing_runs is None and older_than_days is None:
        raise ValueError("xcom clean-up needs a way to check runs against the metadata DB, or older_than_days, or both")
    if older_than_days is not None and older_than_days < 0:
        raise ValueError(f"older_than_days must be >= 0, not {older_than_days!r}")
    settings = settings or load_settings()
    cutoff = None if older_than_days is None else time.time() - older_than_days * 86400.0
    with PulsarStateHook(settings.conn_id) as hook:
        store = hook.get_xcom_store(settings.xcom_topic, namespace=settings.key_namespace, writer_idle_timeout=0.2)
        runs = store.list_runs(dag_id=dag_id, latest=True)
        stale = store.find_stale_runs(existing_runs=existing_runs, older_than=cutoff, dag_id=dag_id, runs=runs)
        deleted = 0 if dry_run else store.delete_runs(stale)
        topic = store.topic
    report = CleanupReport(
        runs_scanned=len(runs),
        entries_scanned=sum(r.entries for r in runs),
        runs_missing=sum(1 for s in stale if s.reason == "missing"),
        runs_expired=sum(1 for s in stale if s.reason == "expired"),
        entries_deleted=deleted,
        bytes_deleted=0 if dry_run else sum(s.run.bytes for s in stale),
        dry_run=dry_run,
    )
    if log is not None:
        log.info("%s", format_table(stale, report, topic=topic, namespace=settings.key_namespace))
    return report


def format_table(stale: list[Any], report: CleanupReport, *, topic: str, namespace: str, limit: int = 50) -> str:
    """A concise text table: one line per stale run (the first ``limit``), then the totals."""
    verb = "would delete" if report.dry_run else "deleted"
    lines = [f"XCom clean-up of {topic} (namespace {namespace!r}){' [dry run]' if report.dry_run else ''}"]
    if stale:
        lines.append(f"  {'dag_id':<30} {'run_id':<44} {'reason':<8} {'entries':>7} {'bytes':>10}  newest write (UTC)")
        for s in stale[:limit]:
            newest = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(s.run.newest_written_at))
            lines.append(
                f"  {s.run.dag_id[:30]:<30} {s.run.run_id[:44]:<44} {s.reason:<8} {s.run.entries:>7} {s.run.bytes:>10}  {newest}"
            )
        if len(stale) > limit:
            lines.append(f"  ... and {len(stale) - limit} more runs")
    entries = sum(s.run.entries for s in stale)
    lines.append(
        f"  scanned {report.runs_scanned} runs / {report.entries_scanned} entries; stale: {report.runs_missing} missing "
        f"from the metadata DB, {report.runs_expired} past retention; {verb} {entries if report.dry_run else report.entries_deleted} "
        f"entries ({sum(s.run.bytes for s in stale):,} bytes)"
    )
    return "\n".join(lines)
