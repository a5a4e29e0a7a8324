"""The replicated state of a :class:`~airflow_provider_pulsarstate.engine.recipes.table.StateTable`.

:class:`TableState` holds the rows (canonical bytes), the views' metadata, the per-key change
offsets conflict checks need while a view is open, and the recorded source offsets.
:func:`apply_op` folds one log op into it (the only place the state changes); the image codec
stores and loads it in checkpoints; :func:`view_info_of` and :func:`view_result` read a view's
metadata as the public records.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import msgspec

from airflow_provider_pulsarstate.engine.recipes.table_records import SourceRange, ViewInfo, ViewResult
from airflow_provider_pulsarstate.engine.recipes.view_staging import staging_topic

__all__ = [
    "KEEP_CLOSED_VIEWS",
    "TableState",
    "apply_op",
    "deserialize_image",
    "serialize_image",
    "source_list",
    "view_info_of",
    "view_result",
]

KEEP_CLOSED_VIEWS = 256
"""Applied or dropped views whose metadata (and result, for an idempotent re-apply) the table
keeps; older ones are forgotten, so memory does not grow with the number of views ever applied."""


class TableState:
    __slots__ = ("changed", "n_open", "rows", "sources", "views")

    def __init__(self) -> None:
        # key -> canonical bytes of its record
        self.rows: dict[str, bytes] = {}
        # key -> offset of its last change, kept only while some view is open (for conflict checks)
        self.changed: dict[str, int] = {}
        # view id -> metadata, in creation order; only the newest KEEP_CLOSED_VIEWS closed ones are kept
        self.views: dict[str, dict[str, Any]] = {}
        # source topic -> partition -> next offset, as published by the last view that consumed it
        self.sources: dict[str, dict[int, int]] = {}
        self.n_open = 0

    def open_views(self) -> list[str]:
        return [vid for vid, meta in self.views.items() if meta["status"] == "open"]


def apply_op(state: TableState, op: dict[str, Any], offset: int) -> None:
    """Fold one log op, committed at ``offset``, into ``state``."""
    kind = op["o"]
    if kind == "set" or kind == "del":
        key = op["k"]
        if kind == "set":
            state.rows[key] = op["v"]
        else:
            state.rows.pop(key, None)
        if state.n_open:
            state.changed[key] = offset
    elif kind == "view":
        if op["id"] not in state.views:
            state.n_open += 1
        state.views[op["id"]] = {**op["meta"], "baseline": offset, "status": "open", "result": None}
    elif kind == "seal":
        meta = state.views.get(op["id"])
        if meta is not None and meta["status"] == "open":
            meta["sealed"] = op["stagers"]
            meta["sources"] = op.get("sources") or []
    else:
        _end_view(state, op, offset)


def _end_view(state: TableState, op: dict[str, Any], offset: int) -> None:
    meta = state.views.get(op["id"])
    if meta is not None:
        if meta["status"] == "open":
            state.n_open -= 1
        meta["status"] = op["status"]
        meta["result"] = op.get("result")
        meta["commit_offset"] = offset
        _forget_old_views(state)
    for topic, partition, _start, next_offset in op.get("sources") or ():
        state.sources.setdefault(topic, {})[partition] = next_offset
    if not state.n_open:
        state.changed.clear()


def _forget_old_views(state: TableState) -> None:
    closed = len(state.views) - state.n_open
    if closed > KEEP_CLOSED_VIEWS:
        for vid in [v for v, m in state.views.items() if m["status"] != "open"][: closed - KEEP_CLOSED_VIEWS]:
            del state.views[vid]


def source_list(ranges: Iterable[SourceRange]) -> list[list[Any]]:
    """Source ranges as the log records them: ``[topic, partition, start, next]`` each."""
    return [[r.topic, r.partition, r.start, r.next] for r in ranges]


def view_info_of(state: TableState, table: str, view_id: str) -> ViewInfo:
    """The metadata of ``view_id`` (which must be in ``state.views``) as a :class:`ViewInfo`."""
    m = state.views[view_id]
    return ViewInfo(
        view_id,
        table,
        m["baseline"],
        m["scope_prefix"],
        m["expires_at"],
        m["status"],
        staging_topic(table, view_id),
        m.get("result"),
        m.get("commit_offset", -1),
        m.get("sealed"),
        m.get("scope_predicate"),
        [SourceRange(*r) for r in m.get("sources") or ()],
    )


def view_result(info: ViewInfo, *, already: bool) -> ViewResult:
    """The result recorded with an applied view."""
    counts = info.result or {}
    return ViewResult(
        info.view_id,
        counts.get("set", 0),
        counts.get("delete", 0),
        counts.get("unchanged", 0),
        info.commit_offset,
        already,
        counts.get("sample_set", []),
        counts.get("sample_delete", []),
        counts.get("sources", []),
    )


_IMAGE_FORMAT = 1
_IMAGE = msgspec.msgpack.Decoder(
    tuple[int, dict[str, bytes], dict[str, int], dict[str, dict[str, Any]], dict[str, dict[int, int]]]
)
_IMAGE_ENCODER = msgspec.msgpack.Encoder()


def serialize_image(state: TableState) -> bytes:
    """The checkpoint image of ``state``."""
    return _IMAGE_ENCODER.encode((_IMAGE_FORMAT, state.rows, state.changed, state.views, state.sources))


def deserialize_image(data: bytes) -> TableState:
    """The state an image holds.

    :raises ValueError: another image format, or a view without status or baseline.
    """
    fmt, rows, changed, views, sources = _IMAGE.decode(data)
    if fmt != _IMAGE_FORMAT:
        raise ValueError(f"table image format {fmt} is not {_IMAGE_FORMAT}")
    state = TableState()
    state.rows, state.changed, state.views, state.sources = rows, changed, views, sources
    for vid, meta in views.items():
        if not isinstance(meta.get("status"), str) or not isinstance(meta.get("baseline"), int):
            raise ValueError(f"table image: view {vid!r} has no status or baseline")
    state.n_open = len(state.open_views())
    return state
