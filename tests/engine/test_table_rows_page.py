"""StateTable.rows_page: rows by key prefix in key order, one bounded page at a time, on both back ends."""

from __future__ import annotations

import time
from typing import Any

import pytest

from airflow_provider_pulsarstate.engine.errors import ConfigurationError


def walk(table: Any, *, prefix: str, limit: int) -> list[str]:
    keys: list[str] = []
    cursor = None
    while True:
        rows, cursor = table.rows_page(prefix=prefix, after=cursor, limit=limit, latest=True)
        assert len(rows) <= limit
        keys += [key for key, _ in rows]
        if cursor is None:
            return keys


def test_pages_cover_the_prefix_exactly_once_in_key_order(tables: Any) -> None:
    table = tables()
    for i in range(57):
        table.put(f"b-{i:03d}", {"v": i})
    table.put("a-first", {"v": -1})
    table.put("c-last", {"v": 99})
    assert walk(table, prefix="b-", limit=10) == [f"b-{i:03d}" for i in range(57)]
    assert walk(table, prefix="", limit=7) == ["a-first", *[f"b-{i:03d}" for i in range(57)], "c-last"]
    rows, cursor = table.rows_page(prefix="b-05", limit=100, latest=True)
    assert rows == [(f"b-05{i}", {"v": 50 + i}) for i in range(7)] and cursor is None
    assert table.rows_page(prefix="zzz", limit=5, latest=True) == ([], None)


def test_a_page_sees_the_writes_committed_since_the_previous_one(tables: Any) -> None:
    table = tables()
    for key in ("k1", "k3", "k5"):
        table.put(key, {"v": key})
    rows, cursor = table.rows_page(limit=2, latest=True)
    assert [k for k, _ in rows] == ["k1", "k3"] and cursor == "k3"
    table.put("k4", {"v": "k4"})
    table.delete("k5")
    rows, cursor = table.rows_page(after=cursor, limit=2, latest=True)
    assert rows == [("k4", {"v": "k4"})] and cursor is None


def test_a_bad_limit_is_refused(tables: Any) -> None:
    with pytest.raises(ConfigurationError, match="limit"):
        tables().rows_page(limit=0)


def test_paging_a_large_table_reuses_the_key_index(tables: Any) -> None:
    table = tables()
    view = table.create_view()
    with table.stager(view.view_id) as stager:
        stager.set_many((f"k{i:06d}", {"v": i}) for i in range(50_000))
    table.seal(view.view_id, stagers=[stager])
    table.apply(view.view_id)
    table.rows_page(limit=50, latest=True)  # builds the index
    start = time.process_time()
    cursor = None
    for _ in range(100):
        rows, cursor = table.rows_page(after=cursor, limit=50, latest=True)
    per_page = (time.process_time() - start) / 100
    assert [k for k, _ in rows][-1] == f"k{100 * 50 - 1:06d}"
    assert per_page < 0.02, f"{per_page * 1000:.1f} ms of CPU per page"
