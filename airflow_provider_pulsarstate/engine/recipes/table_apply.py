"""Plan and apply of a view: the diff between the committed rows and the staged target (pure).

Everything here runs on a :class:`~.table_state.TableState` under the manager's lock and does no
I/O: :func:`plan_view` counts what an apply would publish, :func:`apply_ops` checks the view
against the state (still open, sealed the same, source offsets, delete limits, conflicts) and
returns the one record's ops that switch the table, ending with the op that marks the view applied.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from airflow_provider_pulsarstate.engine.errors import (
    SourceOffsetsConflictError,
    ViewClosedError,
    ViewConflictError,
    ViewGuardError,
    ViewNotFoundError,
    ViewSealMismatchError,
)
from airflow_provider_pulsarstate.engine.recipes.table_ops import del_op, set_op
from airflow_provider_pulsarstate.engine.recipes.table_records import SourceRange, ViewInfo, ViewPlan
from airflow_provider_pulsarstate.engine.recipes.table_state import TableState, source_list
from airflow_provider_pulsarstate.engine.recipes.view_staging import check_staged_value

__all__ = ["ApplyLimits", "Diff", "apply_ops", "plan_view"]

Target = dict[str, bytes | None]
"""A view's staged rows: key -> canonical record bytes (None: staged as deleted)."""


@dataclass(frozen=True)
class ApplyLimits:
    """The caller's options of one apply (see :meth:`StateTable.apply`)."""

    overwrite: bool = False
    max_deletes: int | None = None
    max_delete_fraction: float | None = None
    sample: int = 10


@dataclass
class Diff:
    sets: dict[str, bytes] = field(default_factory=dict)
    deletes: list[str] = field(default_factory=list)
    unchanged: int = 0
    in_scope: int = 0
    """Committed rows in the view's scope (the base of the delete fraction)."""

    def sample_sets(self, n: int) -> list[str]:
        return heapq.nsmallest(n, self.sets)  # no full sort of a million-key diff

    def sample_deletes(self, n: int) -> list[str]:
        return heapq.nsmallest(n, self.deletes)


def compute_diff(s: TableState, info: ViewInfo, target: Target) -> Diff:
    """The diff between the committed rows in the view's scope and its staged target.

    Rows are compared as canonical bytes; only the values the diff publishes are decoded
    (and checked: a staged row equal to a committed one was checked when it was committed).
    """
    rows = s.rows
    if info.scope_prefix is None and info.scope_predicate is None:
        scope_rows: Mapping[str, bytes] = rows
    else:
        in_scope = info.in_scope()
        scope_rows = {k: v for k, v in rows.items() if in_scope(k)}
    sets = {k: v for k, v in target.items() if v is not None and rows.get(k) != v}
    for key, value in sets.items():
        check_staged_value(info.view_id, key, value)
    replaced = sum(1 for k in sets if k in rows)
    # The target's keys are distinct and all in scope: when none is staged as deleted and as
    # many are committed rows as the scope holds, nothing is deleted (no pass over the rows).
    if None not in target.values() and len(target) - (len(sets) - replaced) == len(scope_rows):
        deletes: list[str] = []
    else:
        deletes = [k for k in scope_rows if target.get(k) is None]
    return Diff(sets, deletes, len(scope_rows) - len(deletes) - replaced, len(scope_rows))


def source_conflicts(s: TableState, info: ViewInfo) -> list[tuple[SourceRange, int]]:
    """The view's ranges that do not start at the table's recorded next offset.

    A partition the table records nothing for accepts any start (the first run picks it).
    """
    stale = []
    for r in info.sources:
        recorded = s.sources.get(r.topic, {}).get(r.partition)
        if recorded is not None and recorded != r.start:
            stale.append((r, recorded))
    return stale


def key_conflicts(s: TableState, info: ViewInfo, diff: Diff) -> list[str]:
    """The keys the diff touches that changed after the view's baseline."""
    changed = s.changed
    if not changed:
        return []
    touched = list(diff.sets) + diff.deletes
    return sorted(k for k in touched if changed.get(k, -1) > info.baseline)


def plan_view(s: TableState, info: ViewInfo, target: Target, *, sample: int) -> ViewPlan:
    """What apply would publish now, counted."""
    diff = compute_diff(s, info, target)
    stale = [
        f"{r.topic} partition {r.partition}: view starts at {r.start}, table records {recorded}"
        for r, recorded in source_conflicts(s, info)
    ]
    return ViewPlan(
        info.view_id,
        len(diff.sets),
        len(diff.deletes),
        diff.unchanged,
        diff.sample_sets(sample),
        diff.sample_deletes(sample),
        key_conflicts(s, info, diff),
        stale,
    )


def apply_ops(s: TableState, info: ViewInfo, target: Target, limits: ApplyLimits) -> list[dict[str, Any]] | None:
    """The ops of the record that switches the table to the view; None: the view is applied already.

    :raises ViewNotFoundError, ViewClosedError: the view is gone or was dropped meanwhile.
    :raises ViewSealMismatchError: it was sealed again since ``info`` was read.
    :raises SourceOffsetsConflictError, ViewGuardError, ViewConflictError: see :meth:`StateTable.apply`.
    """
    view_id, table = info.view_id, info.table
    meta = s.views.get(view_id)
    if meta is None:
        raise ViewNotFoundError(f"no view {view_id!r} on {table}")
    if meta["status"] == "applied":  # applied by a concurrent or crashed-and-retried apply
        return None
    if meta["status"] != "open":
        raise ViewClosedError(f"view {view_id!r} on {table} is {meta['status']}")
    if meta.get("sealed") != info.sealed or (meta.get("sources") or []) != source_list(info.sources):
        raise ViewSealMismatchError(f"view {view_id!r} on {table} was sealed again during apply; apply again")
    _check_sources(s, info)
    diff = compute_diff(s, info, target)
    _check_deletes(info, diff, target, limits)
    conflicts = key_conflicts(s, info, diff)
    if conflicts and not limits.overwrite:
        raise ViewConflictError(
            f"view {view_id!r}: {len(conflicts)} key(s) changed on {table} since baseline offset "
            f"{info.baseline}: {', '.join(conflicts[:10])}{' ...' if len(conflicts) > 10 else ''}",
            keys=conflicts,
        )
    return _switch_ops(info, diff, limits.sample)


def _switch_ops(info: ViewInfo, diff: Diff, sample: int) -> list[dict[str, Any]]:
    view_id = info.view_id
    out: list[dict[str, Any]] = [set_op(k, v, view_id) for k, v in diff.sets.items()]
    out += [del_op(k, view_id) for k in diff.deletes]
    counts = {
        "set": len(diff.sets),
        "delete": len(diff.deletes),
        "unchanged": diff.unchanged,
        "sample_set": diff.sample_sets(sample),
        "sample_delete": diff.sample_deletes(sample),
        "sources": [r.as_dict() for r in info.sources],
    }
    end: dict[str, Any] = {"o": "view_end", "id": view_id, "status": "applied", "result": counts}
    if info.sources:  # the consumed offsets move in the same record as the diff
        end["sources"] = source_list(info.sources)
    out.append(end)
    return out


def _check_sources(s: TableState, info: ViewInfo) -> None:
    stale = source_conflicts(s, info)
    if stale:
        r, recorded = stale[0]
        raise SourceOffsetsConflictError(
            f"view {info.view_id!r} consumed {r.topic} partition {r.partition} from offset {r.start}, but "
            f"{info.table} records {recorded} as its next offset: that range was consumed by another "
            "view already (applying would count it twice); nothing was published -- recompute the view "
            "from the table's recorded offsets",
            topic=r.topic,
            partition=r.partition,
            start=r.start,
            recorded=recorded,
        )


def _check_deletes(info: ViewInfo, diff: Diff, target: Target, limits: ApplyLimits) -> None:
    """Raise ViewGuardError when the diff deletes more than the caller allows."""
    deletes = len(diff.deletes)
    if limits.max_deletes is not None:
        limit, name = limits.max_deletes, f"max_deletes={limits.max_deletes}"
    elif limits.max_delete_fraction is not None:
        limit = int(limits.max_delete_fraction * diff.in_scope)
        name = f"max_delete_fraction={limits.max_delete_fraction} of {diff.in_scope} row(s) in scope (limit {limit})"
    else:
        return
    if deletes > limit:
        raise ViewGuardError(
            f"view {info.view_id!r} would delete {deletes} key(s) of {info.table}, over {name} "
            f"(staged {sum(v is not None for v in target.values())} rows): {', '.join(heapq.nsmallest(10, diff.deletes))}; "
            "nothing was published -- pass a higher max_deletes (or max_delete_fraction) if this is intended",
            deletes=deletes,
        )
