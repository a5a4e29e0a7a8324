"""Texts of the temp-view operators: default view ids (safe in topic names) and the counts table
of their task logs."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from typing import Any

__all__ = ["default_view_id", "format_counts"]

_UNSAFE = re.compile(r"[^A-Za-z0-9_-]+")


def default_view_id(dag_id: str, task_id: str, run_id: str, try_number: int = 1) -> str:
    """A view id for one attempt of one create task in one dag run (safe in a topic name).

    ``<run id, sanitized, at most 40 chars>-<8 hex digits of dag id, task id and run id>-<try>``:
    readable in topic listings, unique per task and run, and new for every attempt, so a
    re-run after a dropped or applied view starts a fresh one.
    """
    digest = hashlib.sha256(f"{dag_id}\0{task_id}\0{run_id}".encode()).hexdigest()[:8]
    readable = _UNSAFE.sub("_", run_id).strip("_-")[:40] or "view"
    return f"{readable}-{digest}-{try_number}"


def format_counts(counts: Mapping[str, Any], *, title: str) -> str:
    """A small text table of set/delete/unchanged/conflicts with sample keys (for task logs)."""
    samples = {"set": counts.get("sample_set") or [], "delete": counts.get("sample_delete") or []}
    conflicts = counts.get("conflicts") or []
    rows: list[tuple[str, Any, list[str]]] = []
    for name in ("set", "delete", "unchanged"):
        if name in counts:
            rows.append((name, counts[name], samples.get(name, [])))
    rows.append(("conflicts", len(conflicts), list(conflicts)))
    lines = [title, f"  {'kind':<10} {'rows':>10}  sample keys"]
    for name, value, keys in rows:
        shown = ", ".join(keys[:5]) + (", ..." if len(keys) > 5 else "")
        lines.append(f"  {name:<10} {value:>10,}  {shown}".rstrip())
    return "\n".join(lines)
