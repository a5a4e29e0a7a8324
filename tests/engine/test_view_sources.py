"""Exactly-once ingestion in StateTable: a view's consumed source offsets move with its diff, on both back ends."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from airflow_provider_pulsarstate.engine.backends.base import Backend
from airflow_provider_pulsarstate.engine.errors import ConfigurationError, SourceOffsetsConflictError
from airflow_provider_pulsarstate.engine.recipes.table import SourceRange, StateTable, TableChange, source_ranges

SOURCE = "persistent://public/default/price-events"


@pytest.fixture
def table(backend: Backend, topic: str) -> Iterator[StateTable]:
    with StateTable(backend, topic, acquire_timeout=30.0, writer_idle_timeout=0.1) as t:
        yield t


def ingest(table: StateTable, rows: dict[str, dict], sources: list[SourceRange]) -> str:
    """Open a view, stage ``rows`` (the whole new table), seal it with ``sources``; returns the view id."""
    view = table.create_view()
    with table.stager(view.view_id) as stager:
        for key, record in rows.items():
            stager.set(key, record)
    table.seal(view.view_id, stagers=[stager], source_offsets=sources)
    return view.view_id


def test_apply_records_the_consumed_offsets_in_the_diffs_commit(table: StateTable) -> None:
    assert table.source_offsets(SOURCE) == {}
    changes: list[TableChange] = []
    table.add_listener(changes.append)

    first = ingest(table, {"a": {"n": 1}, "b": {"n": 2}}, source_ranges(SOURCE, {0: 0, 1: 0}, {0: 5, 1: 3}))
    assert table.source_offsets(SOURCE) == {}  # sealed, not applied: nothing recorded yet
    result = table.apply(first)
    assert table.source_offsets(SOURCE) == {0: 5, 1: 3}
    assert result.sources == [
        {"topic": SOURCE, "partition": 0, "start": 0, "next": 5},
        {"topic": SOURCE, "partition": 1, "start": 0, "next": 3},
    ]
    rows, offsets = table.rows_with_source_offsets(SOURCE)
    assert rows == {"a": {"n": 1}, "b": {"n": 2}} and offsets == {0: 5, 1: 3}
    # the offsets travel in the very record that holds the diff: one commit offset for both
    assert {c.offset for c in changes} == {result.commit_offset}
    assert table.manager.read(lambda s: dict(s.sources), latest=True) == {SOURCE: {0: 5, 1: 3}}

    # the next run starts where the table's record ends; an unchanged row is not republished
    second = table.apply(
        ingest(table, {"a": {"n": 1}, "b": {"n": 7}}, source_ranges(SOURCE, {0: 5, 1: 3}, {0: 9, 1: 3}))
    )
    assert (second.set, second.unchanged) == (1, 1)
    assert table.source_offsets(SOURCE) == {0: 9, 1: 3}
    assert table.source_offsets("persistent://public/default/other") == {}

    # a view that consumed nothing new still moves nothing backwards and publishes nothing
    empty = table.apply(ingest(table, {"a": {"n": 1}, "b": {"n": 7}}, source_ranges(SOURCE, {0: 9}, {0: 9})))
    assert (empty.set, empty.delete) == (0, 0)
    assert table.source_offsets(SOURCE) == {0: 9, 1: 3}


def test_a_view_of_an_already_consumed_range_is_refused(table: StateTable) -> None:
    # two runs computed from the same recorded offsets: the second would count [0, 4) twice
    ranges = source_ranges(SOURCE, {0: 0}, {0: 4})
    first = ingest(table, {"a": {"n": 4}}, ranges)
    stale = ingest(table, {"a": {"n": 8}}, source_ranges(SOURCE, {0: 0}, {0: 6}))
    table.apply(first)
    before = table.to_dict(latest=True)
    plan = table.plan(stale)
    assert plan.source_conflicts == [f"{SOURCE} partition 0: view starts at 0, table records 4"]
    with pytest.raises(
        SourceOffsetsConflictError, match=rf"consumed {SOURCE} partition 0 from offset 0, but .* records 4"
    ) as info:
        table.apply(stale, overwrite=True)
    assert (info.value.topic, info.value.partition, info.value.start, info.value.recorded) == (SOURCE, 0, 0, 4)
    assert table.to_dict(latest=True) == before and table.source_offsets(SOURCE) == {0: 4}
    assert table.view_info(stale).status == "open"  # nothing was published; the job may recompute it

    # a gap is refused too (messages [4, 6) would be lost)
    gap = ingest(table, {"a": {"n": 9}}, source_ranges(SOURCE, {0: 6}, {0: 8}))
    with pytest.raises(SourceOffsetsConflictError, match="from offset 6, but .* records 4"):
        table.apply(gap)


def test_reapplying_an_ingestion_view_is_idempotent(table: StateTable) -> None:
    view_id = ingest(table, {"a": {"n": 1}}, source_ranges(SOURCE, {0: 0}, {0: 2}))
    first = table.apply(view_id)
    again = table.apply(view_id)  # a retried apply task: the record moved, yet no conflict
    assert again.already_applied and again.commit_offset == first.commit_offset
    assert again.sources == first.sources
    assert table.source_offsets(SOURCE) == {0: 2}


def test_reseal_replaces_the_ranges_and_views_without_sources_leave_the_record(table: StateTable) -> None:
    view = table.create_view()
    with table.stager(view.view_id) as stager:
        stager.set("a", {"n": 1})
    table.seal(view.view_id, stagers=[stager], source_offsets=source_ranges(SOURCE, {0: 0}, {0: 3}))
    table.seal(view.view_id, stagers=[stager], source_offsets=source_ranges(SOURCE, {0: 0}, {0: 1}))
    assert table.view_info(view.view_id).sources == [SourceRange(SOURCE, 0, 0, 1)]
    table.apply(view.view_id)
    assert table.source_offsets(SOURCE) == {0: 1}

    plain = table.create_view()
    with table.stager(plain.view_id) as stager:
        stager.set("a", {"n": 2})
    table.seal(plain.view_id, stagers=[stager])
    assert table.apply(plain.view_id).sources == []
    assert table.source_offsets(SOURCE) == {0: 1}


def test_bad_source_ranges_are_refused_with_clear_errors(table: StateTable) -> None:
    with pytest.raises(ConfigurationError, match="next 2 is below start 5"):
        SourceRange(SOURCE, 0, 5, 2)
    with pytest.raises(ConfigurationError, match="partition must be a non-negative int"):
        SourceRange(SOURCE, -1, 0, 2)
    with pytest.raises(ConfigurationError, match="topic must be a non-empty str"):
        SourceRange("", 0, 0, 2)
    with pytest.raises(ConfigurationError, match=r"start offsets name partitions \[0\], next offsets \[0, 1\]"):
        source_ranges(SOURCE, {0: 0}, {0: 1, 1: 1})
    with pytest.raises(ConfigurationError, match="exactly topic, partition, start, next"):
        SourceRange.from_dict({"topic": SOURCE, "partition": 0, "start": 0})
    assert SourceRange.from_dict(SourceRange(SOURCE, 1, 2, 3).as_dict()) == SourceRange(SOURCE, 1, 2, 3)
    view = table.create_view()
    with pytest.raises(ConfigurationError, match=f"two source ranges of {SOURCE} partition 0"):
        table.seal(
            view.view_id, stagers={}, source_offsets=[SourceRange(SOURCE, 0, 0, 1), SourceRange(SOURCE, 0, 1, 2)]
        )
