"""Reading a table's rows: decoding, pages in key order over a cached sorted index, and the
adapter turning the manager's change stream into :class:`~.table_records.TableChange` records."""

from __future__ import annotations

import bisect
import json
from collections.abc import Callable
from typing import Any

from airflow_provider_pulsarstate.engine.manager import Change
from airflow_provider_pulsarstate.engine.recipes.table_ops import Record, decode_row
from airflow_provider_pulsarstate.engine.recipes.table_records import TableChange
from airflow_provider_pulsarstate.engine.recipes.table_state import TableState

__all__ = ["KeyIndex", "change_listener", "decode_rows"]


def decode_rows(rows: dict[str, bytes]) -> dict[str, Record]:
    return {k: json.loads(v) for k, v in rows.items()}


def change_listener(listener: Callable[[TableChange], None]) -> Callable[[Change[dict[str, Any]]], None]:
    """A manager listener calling ``listener`` for every committed row change (set/delete)."""

    def on_change(change: Change[dict[str, Any]]) -> None:
        op = change.op
        if op["o"] in ("set", "del"):
            listener(
                TableChange(
                    "set" if op["o"] == "set" else "delete",
                    op["k"],
                    decode_row(op["k"], op.get("v")),
                    op.get("w"),
                    change.offset,
                )
            )

    return on_change


class KeyIndex:
    """The table's keys in sorted order, built once per committed offset and reused by the
    following pages (a sort of the keys, then a binary search per page). Used under the
    manager's lock."""

    def __init__(self) -> None:
        self._cached: tuple[int, TableState, list[str]] | None = None

    def keys(self, state: TableState, offset: int) -> list[str]:
        """The sorted keys of ``state`` as of ``offset`` (rebuilt whenever a record was applied since)."""
        cached = self._cached
        if cached is None or cached[0] != offset or cached[1] is not state:
            cached = (offset, state, sorted(state.rows))
            self._cached = cached
        return cached[2]

    def page(
        self, state: TableState, offset: int, *, prefix: str, after: str | None, limit: int
    ) -> tuple[list[tuple[str, bytes]], bool]:
        """Up to ``limit + 1`` rows whose key starts with ``prefix`` and sorts after ``after``, and
        whether there were more than ``limit``."""
        keys = self.keys(state, offset)
        start = (
            bisect.bisect_right(keys, after)
            if after is not None and after >= prefix
            else bisect.bisect_left(keys, prefix)
        )
        page: list[tuple[str, bytes]] = []
        for key in keys[start : start + limit + 1]:
            if not key.startswith(prefix):
                break
            page.append((key, state.rows[key]))
        return page, len(page) > limit
