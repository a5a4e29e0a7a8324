"""The parts behind StateTable, without a broker: the fold of the log into the table's state, its
image, and the plan/apply decision on a given state (the live behaviour is in test_views.py)."""

from __future__ import annotations

from typing import Any

import pytest

from airflow_provider_pulsarstate.engine.errors import (
    SourceOffsetsConflictError,
    ViewClosedError,
    ViewConflictError,
    ViewGuardError,
    ViewSealMismatchError,
)
from airflow_provider_pulsarstate.engine.recipes import table_state
from airflow_provider_pulsarstate.engine.recipes.table_apply import ApplyLimits, apply_ops, plan_view
from airflow_provider_pulsarstate.engine.recipes.table_ops import canonical, del_op, set_op
from airflow_provider_pulsarstate.engine.recipes.table_records import SourceRange
from airflow_provider_pulsarstate.engine.recipes.table_state import (
    TableState,
    apply_op,
    deserialize_image,
    serialize_image,
    view_info_of,
)

T = "persistent://public/default/parts"


def row(value: int) -> bytes:
    return canonical({"v": value})


def fold(ops: list[dict[str, Any]], state: TableState | None = None, first: int = 0) -> TableState:
    state = state or TableState()
    for i, op in enumerate(ops):
        apply_op(state, op, first + i)
    return state


def open_view(vid: str = "v1", prefix: str | None = None) -> dict[str, Any]:
    meta = {"scope_prefix": prefix, "scope_predicate": None, "expires_at": 1e12, "created_at": 0.0}
    return {"o": "view", "id": vid, "meta": meta}


def sealed(state: TableState, vid: str = "v1", sources: list[SourceRange] | None = None) -> TableState:
    op: dict[str, Any] = {"o": "seal", "id": vid, "stagers": {"s": 1}}
    if sources:
        op["sources"] = table_state.source_list(sources)
    return fold([op], state, first=100)


def test_row_changes_are_tracked_only_while_a_view_is_open() -> None:
    s = fold([set_op("a", row(1)), open_view(), set_op("b", row(2)), del_op("a")])
    assert s.rows == {"b": row(2)}
    assert s.changed == {"b": 2, "a": 3}  # nothing before the view opened
    fold([{"o": "view_end", "id": "v1", "status": "dropped"}], s, first=4)
    assert s.n_open == 0 and s.changed == {}
    assert s.views["v1"]["commit_offset"] == 4


def test_only_the_newest_closed_views_are_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(table_state, "KEEP_CLOSED_VIEWS", 2)
    ops: list[dict[str, Any]] = []
    for n in range(4):
        ops += [open_view(f"v{n}"), {"o": "view_end", "id": f"v{n}", "status": "applied"}]
    s = fold([*ops, open_view("open")])
    assert list(s.views) == ["v2", "v3", "open"]


def test_the_image_round_trips_and_counts_open_views() -> None:
    s = sealed(fold([set_op("k", row(1)), open_view(), set_op("k", row(2))]))
    back = deserialize_image(serialize_image(s))
    assert (back.rows, back.changed, back.views, back.sources, back.n_open) == (
        s.rows,
        s.changed,
        s.views,
        s.sources,
        1,
    )
    with pytest.raises(ValueError, match="format"):
        deserialize_image(serialize_image(s).replace(b"\x01", b"\x09", 1))


def test_plan_counts_the_diff_in_scope_only() -> None:
    s = sealed(fold([set_op("a/1", row(1)), set_op("a/2", row(2)), set_op("b/1", row(3)), open_view(prefix="a/")]))
    info = view_info_of(s, T, "v1")
    plan = plan_view(s, info, {"a/1": row(1), "a/3": row(4)}, sample=5)
    assert (plan.set, plan.delete, plan.unchanged) == (1, 1, 1)
    assert (plan.sample_set, plan.sample_delete, plan.conflicts) == (["a/3"], ["a/2"], [])


def test_apply_publishes_the_diff_and_marks_the_view_applied_in_one_record() -> None:
    s = sealed(fold([set_op("a", row(1)), set_op("b", row(2)), open_view()]))
    info = view_info_of(s, T, "v1")
    ops = apply_ops(s, info, {"a": row(1), "c": row(3)}, ApplyLimits(max_delete_fraction=None))
    assert ops is not None
    assert [(op["o"], op.get("k")) for op in ops] == [("set", "c"), ("del", "b"), ("view_end", None)]
    assert ops[-1]["result"]["unchanged"] == 1
    fold(ops, s, first=200)
    assert apply_ops(s, info, {}, ApplyLimits()) is None  # applied already: nothing more to append


def test_apply_refuses_conflicts_deletes_over_the_limit_stale_sources_and_a_new_seal() -> None:
    s = sealed(fold([set_op("a", row(1)), set_op("b", row(2)), open_view(), set_op("a", row(5))]))
    info = view_info_of(s, T, "v1")
    with pytest.raises(ViewConflictError, match="since baseline offset 2: a") as conflict:
        apply_ops(s, info, {"a": row(6), "b": row(2)}, ApplyLimits())
    assert conflict.value.keys == ["a"]
    assert apply_ops(s, info, {"a": row(6), "b": row(2)}, ApplyLimits(overwrite=True))
    with pytest.raises(ViewGuardError, match="max_deletes=0"):
        apply_ops(s, info, {"a": row(5)}, ApplyLimits(max_deletes=0))
    sealed(s, sources=[SourceRange("src", 0, 5, 9)])
    stale = view_info_of(s, T, "v1")
    s.sources["src"] = {0: 7}
    with pytest.raises(SourceOffsetsConflictError, match="records 7"):
        apply_ops(s, stale, {"a": row(5), "b": row(2)}, ApplyLimits())
    with pytest.raises(ViewSealMismatchError, match="sealed again"):
        apply_ops(s, info, {"a": row(5), "b": row(2)}, ApplyLimits())
    fold([{"o": "view_end", "id": "v1", "status": "dropped"}], s, first=300)
    with pytest.raises(ViewClosedError, match="dropped"):
        apply_ops(s, stale, {}, ApplyLimits())
