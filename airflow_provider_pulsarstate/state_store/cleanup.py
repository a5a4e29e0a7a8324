"""The state-store clean-up ``airflow pulsarstate state-store-cleanup`` and
``PulsarStateStoreBackend.cleanup()`` run: expired entries out, maps of finished runs dropped whole.

Airflow's own ``airflow state-store cleanup`` skips custom backends. Each DAG run's task state is
one map, each asset's state another; for each map of this deployment's ``key_namespace``:

* a run the metadata DB holds in a non-terminal state (queued, running, ...): nothing is touched,
  however old its entries or their expiry;
* a run the DB no longer holds (``missing``): the map is deleted whole;
* a finished run (success or failed), or an asset: a map whose every entry expired is deleted
  whole; otherwise its expired entries are deleted.

Guarantees:

* Compare-and-delete: a map is deleted only if it still holds exactly what was listed, checked
  while the clean-up holds the map's exclusive writer, so a value written during the clean-up is
  never lost (the map is kept and counted as ``changed``). Expired entries are deleted by one
  atomic write judged on the latest state, so an entry re-written meanwhile is judged by its new
  expiry.
* Only maps of this namespace are touched: their topic derives from the namespace, and every key
  in them must be of this namespace and of the one run or asset the topic derives from; a map
  holding anything else is left alone (``foreign``).
* One clock: expiry (``expires_at``, set by the writing worker as Airflow computes it) is judged
  against the ``now`` given: the metadata DB's clock for the CLI and ``cleanup()``, never the
  clean-up host's.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from airflow_provider_pulsarstate.hooks import shared_objects
from airflow_provider_pulsarstate.hooks.pulsarstate import StateStore, TaskStateScope
from airflow_provider_pulsarstate.xcom.cleanup import TERMINAL_STATES, RunStatus, RunStatuses


@dataclass(frozen=True)
class StateCleanupReport:
    """What a state clean-up saw and did."""

    maps_scanned: int
    runs_live: int
    runs_missing: int
    maps_dropped: int
    maps_changed: int
    maps_foreign: int
    entries_deleted: int
    dry_run: bool

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def run_state_cleanup(
    store: StateStore,
    *,
    run_statuses: RunStatuses,
    now: float,
    timeout: float,
    dry_run: bool = False,
    log: Any = None,
) -> StateCleanupReport:
    """Clean this namespace's state maps (see the module docstring) and report.

    :param run_statuses: how to read runs from the metadata DB (``(dag_id, run_ids) -> {run_id: RunStatus}``).
    :param now: epoch seconds on the clock expiry is judged by (the metadata DB's).
    :param timeout: seconds to wait for a map's writer before deleting it.
    """
    maps = list(store.list_maps())
    foreign = [m for m in maps if m.owner is None]
    owned = [m for m in maps if m.owner is not None]
    statuses = _statuses_of_runs(owned, run_statuses)
    live = missing = dropped = changed = deleted = 0
    for m in owned:
        verdict = _verdict(m.owner, statuses)
        if verdict == "live":
            live += 1
            continue
        missing += verdict == "missing"
        whole = verdict == "missing" or not m.entries or store.expired_at(m.entries, now)
        done = _clean_map(store, m, whole=whole, now=now, timeout=timeout, dry_run=dry_run)
        dropped += done.dropped
        changed += done.changed
        deleted += done.deleted
    report = StateCleanupReport(
        maps_scanned=len(maps),
        runs_live=live,
        runs_missing=missing,
        maps_dropped=dropped,
        maps_changed=changed,
        maps_foreign=len(foreign),
        entries_deleted=deleted,
        dry_run=dry_run,
    )
    if log is not None:
        _log_report(log, store, report)
    return report


def _statuses_of_runs(owned: list[Any], run_statuses: RunStatuses) -> dict[tuple[str, str], RunStatus]:
    """The metadata DB's status of every run owning one of ``owned``, one query per DAG;
    runs the DB no longer holds are absent."""
    by_dag: dict[str, list[str]] = {}
    for m in owned:
        if isinstance(m.owner, TaskStateScope):
            by_dag.setdefault(m.owner.dag_id, []).append(m.owner.run_id)
    statuses: dict[tuple[str, str], RunStatus] = {}
    for dag_id, run_ids in sorted(by_dag.items()):
        for run_id, status in run_statuses(dag_id, run_ids).items():
            statuses[(dag_id, run_id)] = status
    return statuses


def _verdict(owner: Any, statuses: dict[tuple[str, str], RunStatus]) -> str:
    """``live`` (its run not finished: keep), ``missing`` (run gone from the DB), ``finished`` or ``asset``."""
    if not isinstance(owner, TaskStateScope):
        return "asset"
    run = statuses.get((owner.dag_id, owner.run_id))
    return "missing" if run is None else ("finished" if str(run.state) in TERMINAL_STATES else "live")


@dataclass(frozen=True)
class _MapCleaned:
    """What cleaning one map did (or, dry, would do)."""

    dropped: int = 0
    changed: int = 0
    deleted: int = 0


def _clean_map(store: StateStore, m: Any, *, whole: bool, now: float, timeout: float, dry_run: bool) -> _MapCleaned:
    """Drop map ``m`` whole (compare-and-delete: ``changed`` when it moved) or delete its expired entries."""
    if dry_run:
        return _MapCleaned(
            dropped=int(whole), deleted=len(m.entries) if whole else _expired_count(store, m.entries, now)
        )
    if not whole:
        return _MapCleaned(deleted=store.remove_expired_in(m.topic, now=now))
    shared_objects.discard_topic(m.topic)  # no map of this process re-creates it
    if store.drop_map(m.topic, expected=m.entries, timeout=timeout):
        return _MapCleaned(dropped=1, deleted=len(m.entries))
    return _MapCleaned(changed=1)


def _log_report(log: Any, store: StateStore, report: StateCleanupReport) -> None:
    log.info(
        "state-store clean-up of %s (namespace %r)%s: scanned %d maps; kept %d runs not finished, %d maps changed "
        "during the clean-up, %d maps of another namespace; %s %d maps whole (%d runs missing from the metadata DB) "
        "and %d entries in all",
        store.base_topic,
        store.namespace,
        " [dry run]" if report.dry_run else "",
        report.maps_scanned,
        report.runs_live,
        report.maps_changed,
        report.maps_foreign,
        "would delete" if report.dry_run else "deleted",
        report.maps_dropped,
        report.runs_missing,
        report.entries_deleted,
    )


def _expired_count(store: StateStore, entries: dict[str, Any], now: float) -> int:
    return sum(1 for k, raw in entries.items() if store.expired_at({k: raw}, now))
