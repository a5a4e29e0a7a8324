"""A view's lifecycle on a table: the ops that open, seal, drop and expire views, reading a sealed
view's staged rows, and deleting staging topics once their view is closed.

The op generators run under the manager's lock on the latest state (they may run more than
once: no side effects beyond what they return or fill in).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable, Mapping
from typing import Any

from airflow_provider_pulsarstate.engine.backends.base import Backend
from airflow_provider_pulsarstate.engine.errors import (
    BackendUnavailableError,
    ConfigurationError,
    ViewClosedError,
    ViewNotFoundError,
    ViewNotSealedError,
)
from airflow_provider_pulsarstate.engine.recipes.table_records import SourceRange, ViewInfo
from airflow_provider_pulsarstate.engine.recipes.table_state import TableState, source_list
from airflow_provider_pulsarstate.engine.recipes.view_staging import ViewStager, read_staged, staging_topic

log = logging.getLogger(__name__)

__all__ = [
    "StagingCleaner",
    "create_ops",
    "drop_ops",
    "expiry_ops",
    "read_target",
    "seal_counts",
    "seal_ops",
    "seal_sources",
]


def expiry_ops(s: TableState, table: str, expired: list[str]) -> list[dict[str, Any]]:
    """The ops dropping every open view past its expiry time; fills ``expired`` with their ids."""
    now = time.time()
    expired[:] = [vid for vid in s.open_views() if s.views[vid]["expires_at"] <= now]
    for vid in expired:
        log.warning("view %s on %s expired unapplied; dropping it", vid, table)
    return [{"o": "view_end", "id": vid, "status": "dropped"} for vid in expired]


def create_ops(
    s: TableState,
    view_id: str,
    *,
    scope_prefix: str | None,
    scope_predicate: str | None,
    ttl: float,
) -> list[dict[str, Any]]:
    """The op opening ``view_id`` (none if it exists already: a retried create is safe)."""
    if view_id in s.views:
        return []
    meta = {
        "scope_prefix": scope_prefix,
        "scope_predicate": scope_predicate,
        "expires_at": time.time() + ttl,
        "created_at": time.time(),
    }
    return [{"o": "view", "id": view_id, "meta": meta}]


def drop_ops(s: TableState, view_id: str) -> list[dict[str, Any]]:
    """The op dropping ``view_id`` if it is open (none otherwise)."""
    meta = s.views.get(view_id)
    return (
        [{"o": "view_end", "id": view_id, "status": "dropped"}] if meta is not None and meta["status"] == "open" else []
    )


def seal_sources(view_id: str, source_offsets: Iterable[SourceRange]) -> list[SourceRange]:
    """The source ranges of a seal, checked: SourceRange each, one per topic partition.

    :raises ConfigurationError: another type, or two ranges of one topic partition.
    """
    sources = list(source_offsets)
    seen: set[tuple[str, int]] = set()
    for r in sources:
        if not isinstance(r, SourceRange):
            raise ConfigurationError(f"view {view_id!r}: source_offsets must hold SourceRange, got {r!r}")
        if (r.topic, r.partition) in seen:
            raise ConfigurationError(f"view {view_id!r}: two source ranges of {r.topic} partition {r.partition}")
        seen.add((r.topic, r.partition))
    return sources


def seal_counts(view_id: str, stagers: Iterable[ViewStager] | Mapping[str, int]) -> dict[str, int]:
    """Stager id -> rows staged, from closed stagers or a mapping gathered elsewhere.

    :raises ConfigurationError: a stager still buffers rows, or a bad id or count.
    """
    counts: dict[str, int] = {}
    if isinstance(stagers, Mapping):
        counts = dict(stagers)
    else:
        for stager in stagers:
            if stager.pending:
                raise ConfigurationError(
                    f"view {view_id!r}: stager {stager.stager_id} still buffers {stager.pending} row(s); close it before sealing"
                )
            counts[stager.stager_id] = stager.rows_staged
    for sid, n in counts.items():
        if not isinstance(sid, str) or not isinstance(n, int) or isinstance(n, bool) or n < 0:
            raise ConfigurationError(f"view {view_id!r}: bad seal entry {sid!r}: {n!r} (stager id -> row count)")
    return counts


def seal_ops(
    s: TableState, table: str, view_id: str, counts: dict[str, int], sources: list[SourceRange]
) -> list[dict[str, Any]]:
    """The op sealing an open view.

    :raises ViewNotFoundError, ViewClosedError: the view does not exist or is not open.
    """
    meta = s.views.get(view_id)
    if meta is None:
        raise ViewNotFoundError(f"no view {view_id!r} on {table}")
    if meta["status"] != "open":
        raise ViewClosedError(f"view {view_id!r} on {table} is {meta['status']}; it cannot be sealed")
    op: dict[str, Any] = {"o": "seal", "id": view_id, "stagers": counts}
    if sources:
        op["sources"] = source_list(sources)
    return [op]


def read_target(backend: Backend, info: ViewInfo, *, timeout: float) -> dict[str, bytes | None]:
    """A sealed view's target rows: key -> canonical record bytes (None: staged as deleted).

    :raises ViewNotSealedError: the view was never sealed.
    """
    if info.sealed is None:
        raise ViewNotSealedError(
            f"view {info.view_id!r} on {info.table} is not sealed: its producer never recorded what it staged "
            "(StateTable.seal, or write_view at the end of the Spark job); nothing was published"
        )
    scoped = info.scope_prefix is not None or info.scope_predicate is not None
    return read_staged(
        backend,
        view_id=info.view_id,
        topic=info.staging_topic,
        sealed=info.sealed,
        in_scope=info.in_scope() if scoped else None,
        describe_scope=info.describe_scope(),
        timeout=timeout,
    )


class StagingCleaner:
    """Deletes the staging topics of closed views, now or on a thread of its own."""

    def __init__(self, backend: Backend, table: str) -> None:
        self.backend = backend
        self.table = table
        self._threads: list[threading.Thread] = []

    def delete(self, view_ids: list[str]) -> None:
        for vid in view_ids:
            try:
                self.backend.delete_topic(staging_topic(self.table, vid))
            except BackendUnavailableError as exc:  # the rows are useless now; leave them
                log.warning("could not delete the staging topic of view %s: %s", vid, exc)

    def delete_later(self, view_id: str) -> None:
        """Delete an applied view's staged rows on a thread of its own (:meth:`join` waits for it):
        the switch is complete without it, and deleting a million staged rows takes a while."""
        self._threads = [t for t in self._threads if t.is_alive()]
        cleaner = threading.Thread(
            target=self.delete, args=([view_id],), name=f"pulsarstate-view-cleanup-{view_id}", daemon=True
        )
        cleaner.start()
        self._threads.append(cleaner)

    def join(self, timeout: float) -> None:
        """Wait (up to ``timeout`` seconds each) for the deletions still running."""
        for cleaner in self._threads:
            cleaner.join(timeout=timeout)
