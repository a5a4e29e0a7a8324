"""The XCom clean-up both the operator and the CLI run: select stale runs, delete their topics, report.

Airflow calls ``purge`` only when a worker deletes an XCom (a retried or re-run task); deleting a
run, clearing through the REST API and ``airflow db clean`` leave the run's values behind. Each DAG
run has its own topic: a map (``<xcom_topic>-<namespace>-r<digest>``, ``xcom_layout = map``) or a
topic of immutable messages (``...-m<digest>``, ``xcom_layout = messages``); the clean-up lists
this namespace's run topics of both kinds and deletes a run's topic whole when:

* the metadata DB no longer holds the run (``missing``), or
* the run is finished (success or failed) and ended longer ago than the retention (``expired``).

Guarantees:

* A run the DB holds in any other state (queued, running, ...) is never deleted, however old its
  values are; a finished run within the retention neither.
* Compare-and-delete: a topic is deleted only if it still holds exactly what was listed, so a value
  pushed during the clean-up is never lost (the run is kept and counted as ``changed``). A map is
  checked while the clean-up holds its exclusive writer; a message topic by its last entry, in the
  same transaction as the deletion (embedded), or before a deletion that Pulsar refuses while any
  process still has a producer or reader on it (a process that just pushed keeps its producer).
* Only topics of this deployment's ``key_namespace`` are touched: their name is derived from the
  namespace, and every entry in them must carry it and name the one run the name is derived from;
  a topic with anything else is left alone.
* One clock: the CLI judges retention by the run's end date against the metadata DB's own clock,
  never a worker's; the operator (a task cannot read run end dates) by the newest value's time
  (map: its write time; messages: the log's own publish time) against its own clock.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from airflow_provider_pulsarstate.hooks import shared_objects
from airflow_provider_pulsarstate.hooks.pulsarstate import (
    RunScan,
    XComMessageLog,
    XComRecord,
    XComStore,
    delete_topic_if_unchanged,
    drop_run_map,
    is_message_topic,
    is_run_topic,
    message_topic,
    message_topic_prefix,
    run_topic,
    run_topic_prefix,
)
from airflow_provider_pulsarstate.provider_settings import ProviderSettings, load_settings

TERMINAL_STATES = frozenset({"success", "failed"})


@dataclass(frozen=True)
class RunStatus:
    """A run as the metadata DB holds it: its state and, once finished, when it ended (epoch s)."""

    state: str
    ended_at: float | None = None

    @classmethod
    def of(cls, state: Any, ended_at: float | None = None) -> RunStatus:
        """From a state as Airflow gives it (a ``DagRunState`` or its value)."""
        return cls(str(getattr(state, "value", state)).lower(), ended_at)


RunStatuses = Callable[[str, list[str]], dict[str, RunStatus]]
"""``(dag_id, run_ids) -> {run_id: RunStatus}`` for the runs the metadata DB still holds."""


@dataclass(frozen=True)
class CleanupReport:
    """What a clean-up saw and did (``asdict()`` is the operator's XCom)."""

    runs_scanned: int
    entries_scanned: int
    runs_missing: int
    runs_expired: int
    runs_live: int
    runs_changed: int
    maps_foreign: int
    entries_deleted: int
    bytes_deleted: int
    dry_run: bool

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class _RunMap:
    """One run's topic as listed: a map's entries, or (``last`` set) a message topic's messages as
    records keyed by their place in the topic, timed by the log's publish time."""

    topic: str
    dag_id: str
    run_id: str
    entries: dict[str, XComRecord]
    last: bytes | None = None

    @property
    def size(self) -> int:
        return sum(r.size for r in self.entries.values())

    @property
    def newest_written_at(self) -> float:
        return max((r.written_at for r in self.entries.values()), default=0.0)


def run_cleanup(
    *,
    run_statuses: RunStatuses,
    older_than_days: float | None,
    remove_missing_runs: bool = True,
    now: float | None = None,
    dry_run: bool = False,
    dag_id: str | None = None,
    settings: ProviderSettings | None = None,
    log: Any = None,
) -> CleanupReport:
    """Delete the run maps of stale runs (unless ``dry_run``) and log a table of them and the totals.

    :param run_statuses: how to read runs from the metadata DB (see :data:`RunStatuses`).
    :param older_than_days: retention in days after a run ended (None: finished runs are kept).
    :param remove_missing_runs: delete the maps of runs the metadata DB no longer holds.
    :param now: the time retention is measured to, on the clock that gave the end dates
        (default: this host's clock).
    """
    from airflow_provider_pulsarstate.hooks.pulsarstate import PulsarStateHook

    _check_selection(remove_missing_runs=remove_missing_runs, older_than_days=older_than_days)
    settings = settings or load_settings()
    now = time.time() if now is None else now
    cutoff = None if older_than_days is None else now - older_than_days * 86400.0
    with PulsarStateHook(settings.conn_id) as hook:
        backend = hook.get_conn()
        base = hook.topic_name(settings.xcom_topic)
        found, foreign = _list_run_maps(backend, base, settings.key_namespace, dag_id, log)
        verdicts = _judge(found, run_statuses, cutoff, remove_missing_runs)
        stale = [(m, r) for m, r in verdicts if r in ("missing", "expired")]
        deleted: list[_RunMap] = []
        changed = 0
        if not dry_run:
            for run_map, _ in stale:
                timeout = max(30.0, hook.get_config().operation_timeout)
                if _delete_run_topic(backend, run_map, namespace=settings.key_namespace, timeout=timeout):
                    deleted.append(run_map)
                else:
                    changed += 1
    report = _report(found, verdicts, deleted, changed=changed, foreign=foreign, dry_run=dry_run)
    if log is not None:
        log.info("%s", format_table(stale, report, topic=base, namespace=settings.key_namespace))
    return report


def _report(
    found: list[_RunMap],
    verdicts: list[tuple[_RunMap, str]],
    deleted: list[_RunMap],
    *,
    changed: int,
    foreign: int,
    dry_run: bool,
) -> CleanupReport:
    """The report of a clean-up that listed ``found``, judged them and deleted ``deleted``."""
    return CleanupReport(
        runs_scanned=len(found),
        entries_scanned=sum(len(m.entries) for m in found),
        runs_missing=sum(1 for _, r in verdicts if r == "missing"),
        runs_expired=sum(1 for _, r in verdicts if r == "expired"),
        runs_live=sum(1 for _, r in verdicts if r == "live"),
        runs_changed=changed,
        maps_foreign=foreign,
        entries_deleted=sum(len(m.entries) for m in deleted),
        bytes_deleted=sum(m.size for m in deleted),
        dry_run=dry_run,
    )


def _check_selection(*, remove_missing_runs: bool, older_than_days: float | None) -> None:
    """Refuse a clean-up that selects nothing, or a negative retention."""
    if not remove_missing_runs and older_than_days is None:
        raise ValueError("xcom clean-up needs remove_missing_runs or older_than_days, or both")
    if older_than_days is not None and older_than_days < 0:
        raise ValueError(f"older_than_days must be >= 0, not {older_than_days!r}")


def _delete_run_topic(backend: Any, run_map: _RunMap, *, namespace: str, timeout: float) -> bool:
    """Compare-and-delete a stale run's topic: False (kept) when it changed since it was listed."""
    shared_objects.discard_topic(run_map.topic)  # no map or publisher of this process re-creates it
    if run_map.last is not None:
        return bool(delete_topic_if_unchanged(backend, run_map.topic, last=run_map.last, timeout=timeout))
    return bool(drop_run_map(backend, run_map.topic, namespace=namespace, expected=run_map.entries, timeout=timeout))


def _list_run_maps(backend: Any, base: str, namespace: str, dag_id: str | None, log: Any) -> tuple[list[_RunMap], int]:
    """The run topics of ``namespace`` of both layouts (of ``dag_id`` only, when given) and how
    many topics under their prefixes were not this namespace's."""
    prefix, messages_prefix = run_topic_prefix(base, namespace), message_topic_prefix(base, namespace)
    topics = [t for t in backend.list_topics(prefix) if is_run_topic(t, prefix)]
    topics += [t for t in backend.list_topics(messages_prefix) if is_message_topic(t, messages_prefix)]
    found: list[_RunMap] = []
    foreign = 0
    started = time.monotonic()
    for i, topic in enumerate(topics, 1):
        if is_message_topic(topic, messages_prefix):
            with XComMessageLog(backend, topic, namespace=namespace) as messages:
                scan = messages.scan()
            run_map = _message_run(scan, topic, base, namespace)
            listed = bool(scan.messages)
        else:
            with XComStore(backend, topic, namespace=namespace, writer_idle_timeout=0.2) as store:
                entries = store.entries(latest=True)
                owner = _owner(store, topic, base, entries)
            run_map = None if owner is None else _RunMap(topic, owner[0], owner[1], entries)
            listed = bool(entries)
        if run_map is None:
            foreign += listed
        elif dag_id is None or run_map.dag_id == dag_id:
            found.append(run_map)
        if log is not None and (i % 100 == 0 or i == len(topics)) and time.monotonic() - started > 2:
            log.info("xcom clean-up: read %d of %d run maps", i, len(topics))
    return found, foreign


def _owner(store: XComStore, topic: str, base: str, entries: dict[str, XComRecord]) -> tuple[str, str] | None:
    """``(dag_id, run_id)`` of a run map whose every key is of this namespace and of the one run
    its topic is derived from; None for anything else (never touched)."""
    runs = set()
    for key in entries:
        try:
            dag, run, *_ = store.parse_key(key)
        except Exception:
            return None
        runs.add((dag, run))
    if len(runs) != 1:
        return None
    dag, run = runs.pop()
    return (dag, run) if run_topic(base, store.namespace, dag, run) == topic else None


def _message_run(scan: RunScan, topic: str, base: str, namespace: str) -> _RunMap | None:
    """A message topic as a listed run, when every message in it is an XCom message of this
    namespace and of the one run its name is derived from; None for anything else (never touched)."""
    runs = {
        (m.message.identity.dag_id, m.message.identity.run_id)
        if m.message is not None and m.message.identity.namespace == namespace
        else None
        for m in scan.messages
    }
    if len(runs) != 1 or None in runs:
        return None
    dag, run = runs.pop()  # type: ignore[misc]
    if message_topic(base, namespace, dag, run) != topic:
        return None
    entries = {
        f"{i}": XComRecord(
            "", m.publish_time, m.message.record.size, m.message.record.type_name, m.message.record.try_number
        )
        for i, m in enumerate(scan.messages)
        if m.message is not None
    }
    return _RunMap(topic, dag, run, entries, last=scan.last)


def _judge(
    found: list[_RunMap], run_statuses: RunStatuses, cutoff: float | None, remove_missing: bool
) -> list[tuple[_RunMap, str]]:
    """Each run map with its verdict: ``missing``, ``expired``, ``live`` (not finished) or ``kept``."""
    by_dag: dict[str, list[_RunMap]] = {}
    for run_map in found:
        by_dag.setdefault(run_map.dag_id, []).append(run_map)
    verdicts: list[tuple[_RunMap, str]] = []
    for dag, maps in sorted(by_dag.items()):
        statuses = run_statuses(dag, [m.run_id for m in maps])
        for run_map in sorted(maps, key=lambda m: m.run_id):
            status = statuses.get(run_map.run_id)
            if status is None:
                verdicts.append((run_map, "missing" if remove_missing else "kept"))
            elif status.state not in TERMINAL_STATES:
                verdicts.append((run_map, "live"))
            else:
                ended = status.ended_at if status.ended_at is not None else run_map.newest_written_at
                verdicts.append((run_map, "expired" if cutoff is not None and ended < cutoff else "kept"))
    return verdicts


def format_table(
    stale: list[tuple[Any, str]], report: CleanupReport, *, topic: str, namespace: str, limit: int = 50
) -> str:
    """A concise text table: one line per stale run (the first ``limit``), then the totals."""
    verb = "would delete" if report.dry_run else "deleted"
    lines = [f"XCom clean-up of {topic} (namespace {namespace!r}){' [dry run]' if report.dry_run else ''}"]
    if stale:
        lines.append(f"  {'dag_id':<30} {'run_id':<44} {'reason':<8} {'entries':>7} {'bytes':>10}  newest write (UTC)")
        for run_map, reason in stale[:limit]:
            newest = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(run_map.newest_written_at))
            lines.append(
                f"  {run_map.dag_id[:30]:<30} {run_map.run_id[:44]:<44} {reason:<8} {len(run_map.entries):>7} "
                f"{run_map.size:>10}  {newest}"
            )
        if len(stale) > limit:
            lines.append(f"  ... and {len(stale) - limit} more runs")
    entries = sum(len(m.entries) for m, _ in stale)
    lines.append(
        f"  scanned {report.runs_scanned} runs / {report.entries_scanned} entries; stale: {report.runs_missing} missing "
        f"from the metadata DB, {report.runs_expired} past retention; kept: {report.runs_live} not finished, "
        f"{report.runs_changed} changed during the clean-up, {report.maps_foreign} maps of another namespace; "
        f"{verb} {entries if report.dry_run else report.entries_deleted} entries "
        f"({sum(m.size for m, _ in stale) if report.dry_run else report.bytes_deleted:,} bytes)"
    )
    return "\n".join(lines)
