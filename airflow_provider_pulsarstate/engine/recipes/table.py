"""StateTable: a replicated table of records with temp views (create, stage, plan, apply, drop).

A producer that recomputes a whole table (a nightly Spark job, say) stages the full new table
into a *view*; ``apply`` then publishes only the minimal diff against the committed table. This
is sonic-swss-common's create_temp_view / apply_temp_view, minus its weaknesses:

* **Atomic switch.** The whole diff is one log record (framed when large): readers see all of
  it at one commit offset or none of it. A crash during apply leaves the table unchanged or fully
  switched; running apply again completes it.
* **Idempotent.** The record that applies a view also marks it applied, with its counts; applying
  it again appends nothing and returns the original result (``already_applied=True``).
* **No lost writes from other producers.** The view pins a baseline (the offset of its create
  record). If a key the diff touches was changed after the baseline, apply fails with
  :class:`ViewConflictError` naming the keys, unless ``overwrite=True``.
* **Scoped deletes.** With ``scope_prefix`` and/or ``scope_predicate`` (the *name* of a predicate
  registered in code with :func:`register_scope_predicate`; nothing named in the log is ever
  imported or executed) the view owns only the keys in scope: keys outside it are never deleted,
  and staging one is an error.
* **Sealed views.** The producer *seals* a view when it has staged everything, recording how many
  rows each :class:`ViewStager` (by its id) staged: :meth:`StateTable.seal` (``write_view`` does it
  at the end of a Spark job, with the counts of the tasks that succeeded). Plan and apply refuse an
  unsealed view (:class:`ViewNotSealedError`) and a staging topic whose rows do not match the seal
  (:class:`ViewSealMismatchError`: rows staged somewhere else, lost, or a stager missing). Only rows
  of the stagers named in the seal are applied: a failed or retried Spark task's partial rows are
  ignored. A view may be sealed again while open; the last seal wins.
* **Validated staging.** Every staged batch is checked at plan and apply (frame, stager, UTF-8
  keys, row kinds, scope), and every staged value the diff would publish must be the canonical JSON
  of a dict of JSON scalars; a value byte-identical to the committed row was checked when it was
  committed. A foreign or corrupt row fails the apply naming the key and the view, and nothing is
  published.
* **Durable staging.** Rows are staged into a topic of the view's own, from any number of
  processes at once; the live table and its readers see nothing until apply.
* **Canonical comparison.** Rows are canonicalized once, when staged (sorted fields, integral
  floats as ints), and kept as those bytes: apply compares bytes, so field order or ``1.0`` vs
  ``1`` never cause a spurious change, and an unchanged row is never decoded. A changed record is
  published as one set of the full record (no del+set flicker).
* **Change records.** Every published change carries its type (set/delete), the view id and the
  commit offset (:class:`TableChange`).
* **Exactly-once ingestion.** A view computed from a range of source messages (offsets of any
  topic, see :mod:`~airflow_provider_pulsarstate.engine.offsets`) carries that range in its seal
  (:class:`SourceRange`: topic, partition, start, next). Apply publishes the consumed next offsets
  in the same commit record as the diff, and refuses (:class:`SourceOffsetsConflictError`) a view
  whose range does not start at the table's recorded offsets: the table's record
  (:meth:`StateTable.source_offsets`), not a subscription's cursor, says where the next run starts.
* **Checkpoints.** An image of the table (rows, views, per-key change offsets, source offsets)
  is stored after ``checkpoint_after_bytes`` of log, or on demand (:meth:`StateTable.checkpoint`,
  any instance): a fresh instance loads the newest one and replays only the records after it.
* **Bounded history.** Memory follows the table, not its history: per-key change offsets are
  kept only while a view is open, and of the closed views only the newest
  :data:`KEEP_CLOSED_VIEWS` (a re-apply of an older one raises :class:`ViewNotFoundError`).
* **Expiry.** Views not applied or dropped within ``ttl`` seconds are dropped by the next
  create_view (or :meth:`StateTable.expire_views`), and their staging topics deleted.
"""

from __future__ import annotations

import bisect
import heapq
import json
import logging
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import msgspec

from airflow_provider_pulsarstate.engine.backends.base import Backend
from airflow_provider_pulsarstate.engine.checkpoint import CheckpointInfo
from airflow_provider_pulsarstate.engine.config import DEFAULT_MAX_DELETE_FRACTION
from airflow_provider_pulsarstate.engine.errors import (
    BackendUnavailableError,
    ConfigurationError,
    SourceOffsetsConflictError,
    UnknownScopePredicateError,
    ViewClosedError,
    ViewConflictError,
    ViewGuardError,
    ViewNotFoundError,
    ViewNotSealedError,
    ViewSealMismatchError,
)
from airflow_provider_pulsarstate.engine.fencing import Fence
from airflow_provider_pulsarstate.engine.manager import Change, SharedStateManager
from airflow_provider_pulsarstate.engine.recipes.base import Recipe
from airflow_provider_pulsarstate.engine.recipes.map import DEFAULT_CHECKPOINT_AFTER_BYTES
from airflow_provider_pulsarstate.engine.recipes.table_ops import (
    Record,
    canonical,
    decode_checked_op,
    decode_row,
    del_op,
    encode_op,
    record_bytes,
    set_op,
)
from airflow_provider_pulsarstate.engine.recipes.view_staging import (
    ViewStager,
    check_staged_value,
    check_view_id,
    read_staged,
    stager_name,
    staging_topic,
)

log = logging.getLogger(__name__)

__all__ = [
    "KEEP_CLOSED_VIEWS",
    "SourceRange",
    "StateTable",
    "TableChange",
    "ViewInfo",
    "ViewPlan",
    "ViewResult",
    "ViewStager",
    "canonical",
    "check_view_id",
    "register_scope_predicate",
    "resolve_predicate",
    "source_ranges",
    "stager_name",
    "staging_topic",
]

_PREDICATE_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,128}$")
_SCOPE_PREDICATES: dict[str, Callable[[str], Any]] = {}


@dataclass(frozen=True)
class TableChange:
    """A committed change to the table, as listeners receive it."""

    type: str  # "set" | "delete"
    key: str
    value: Record | None
    view_id: str | None
    offset: int


@dataclass(frozen=True)
class SourceRange:
    """The offsets of one source partition a view consumed: ``[start, next)``.

    ``start`` is where the table's record said to start (:meth:`StateTable.source_offsets`; the
    partition's beginning when the table records none), ``next`` the offset after the last message
    consumed (the end offset snapshot the job read up to).
    """

    topic: str
    partition: int
    start: int
    next: int

    def __post_init__(self) -> None:
        if not isinstance(self.topic, str) or not self.topic:
            raise ConfigurationError(f"source range: topic must be a non-empty str, got {self.topic!r}")
        for name in ("partition", "start", "next"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ConfigurationError(
                    f"source range of {self.topic}: {name} must be a non-negative int, got {value!r}"
                )
        if self.next < self.start:
            raise ConfigurationError(
                f"source range of {self.topic} partition {self.partition}: next {self.next} is below start {self.start}"
            )

    @property
    def count(self) -> int:
        """Offsets in the range (an upper bound of the messages: offsets may skip numbers)."""
        return self.next - self.start

    def as_dict(self) -> dict[str, Any]:
        return {"topic": self.topic, "partition": self.partition, "start": self.start, "next": self.next}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SourceRange:
        """The inverse of :meth:`as_dict` (e.g. from a job's result or an XCom).

        :raises ConfigurationError: missing or extra fields, or bad values.
        """
        if not isinstance(data, Mapping) or set(data) != {"topic", "partition", "start", "next"}:
            raise ConfigurationError(f"a source range needs exactly topic, partition, start, next; got {data!r}")
        return cls(data["topic"], data["partition"], data["start"], data["next"])


def source_ranges(topic: str, start: Mapping[int, int], next_offsets: Mapping[int, int]) -> list[SourceRange]:
    """The ranges ``[start[p], next_offsets[p])`` of every partition of ``topic`` (same partitions in both).

    :raises ConfigurationError: the two mappings name different partitions, or a bad range.
    """
    if set(start) != set(next_offsets):
        raise ConfigurationError(
            f"source ranges of {topic}: start offsets name partitions {sorted(start)}, next offsets {sorted(next_offsets)}"
        )
    return [SourceRange(topic, int(p), int(start[p]), int(next_offsets[p])) for p in sorted(start)]


@dataclass(frozen=True)
class ViewInfo:
    """A view's metadata, as recorded in the table's log."""

    view_id: str
    table: str
    baseline: int
    scope_prefix: str | None
    expires_at: float
    status: str  # "open" | "applied" | "dropped"
    staging_topic: str
    result: dict[str, Any] | None = None
    commit_offset: int = -1
    """Offset of the record that applied (or dropped) the view; -1 while open."""
    sealed: dict[str, int] | None = None
    """Stager id -> rows it staged, as recorded by :meth:`StateTable.seal`; None while unsealed."""
    scope_predicate: str | None = None
    """Name of a registered ``(key) -> bool`` (:func:`register_scope_predicate`) that, with ``scope_prefix``, bounds the view."""
    sources: list[SourceRange] = field(default_factory=list)
    """The source ranges the view consumed, as sealed (empty: a view computed from no source)."""

    def in_scope(self) -> Callable[[str], bool]:
        """The view's scope as a predicate on keys (everything when unscoped)."""
        prefix = self.scope_prefix
        predicate = resolve_predicate(self.scope_predicate, view_id=self.view_id) if self.scope_predicate else None
        if prefix and predicate:
            return lambda key: key.startswith(prefix) and bool(predicate(key))
        if prefix:
            return lambda key: key.startswith(prefix)
        if predicate:
            return lambda key: bool(predicate(key))
        return lambda key: True

    def describe_scope(self) -> str:
        parts = [f"prefix {self.scope_prefix!r}"] if self.scope_prefix else []
        parts += [f"predicate {self.scope_predicate!r}"] if self.scope_predicate else []
        return " and ".join(parts) or "the whole table"

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class ViewPlan:
    """What apply would publish, counted; nothing was published."""

    view_id: str
    set: int
    delete: int
    unchanged: int
    sample_set: list[str] = field(default_factory=list)
    sample_delete: list[str] = field(default_factory=list)
    conflicts: list[str] = field(default_factory=list)
    source_conflicts: list[str] = field(default_factory=list)
    """Source partitions whose range does not start at the table's recorded offset (apply would refuse)."""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class ViewResult:
    """What apply published, and at which commit offset."""

    view_id: str
    set: int
    delete: int
    unchanged: int
    commit_offset: int
    already_applied: bool = False
    sample_set: list[str] = field(default_factory=list)
    sample_delete: list[str] = field(default_factory=list)
    sources: list[dict[str, Any]] = field(default_factory=list)
    """The source ranges published with the diff (:meth:`SourceRange.as_dict` each)."""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class _TableState:
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


KEEP_CLOSED_VIEWS = 256
"""Applied or dropped views whose metadata (and result, for an idempotent re-apply) the table
keeps; older ones are forgotten, so memory does not grow with the number of views ever applied."""

_IMAGE_FORMAT = 1
_IMAGE = msgspec.msgpack.Decoder(
    tuple[int, dict[str, bytes], dict[str, int], dict[str, dict[str, Any]], dict[str, dict[int, int]]]
)
_IMAGE_ENCODER = msgspec.msgpack.Encoder()


def _serialize_image(state: _TableState) -> bytes:
    return _IMAGE_ENCODER.encode((_IMAGE_FORMAT, state.rows, state.changed, state.views, state.sources))


def _deserialize_image(data: bytes) -> _TableState:
    fmt, rows, changed, views, sources = _IMAGE.decode(data)
    if fmt != _IMAGE_FORMAT:
        raise ValueError(f"table image format {fmt} is not {_IMAGE_FORMAT}")
    state = _TableState()
    state.rows, state.changed, state.views, state.sources = rows, changed, views, sources
    for vid, meta in views.items():
        if not isinstance(meta.get("status"), str) or not isinstance(meta.get("baseline"), int):
            raise ValueError(f"table image: view {vid!r} has no status or baseline")
    state.n_open = len(state.open_views())
    return state


class StateTable(Recipe):
    """A replicated table ``key -> record`` (a dict of JSON scalar fields) with temp views.

    Example::

        table = StateTable(backend, "persistent://public/default/prices")
        view = table.create_view(scope_prefix="sku-")
        with ViewStager(backend, table.topic, view.view_id) as stager:   # from any process
            for sku, price in new_prices.items():
                stager.set(sku, {"price": price, "currency": "EUR"})
        print(table.plan(view.view_id))          # counts and samples, nothing published
        result = table.apply(view.view_id)       # only the diff, at one commit offset

    :param backend: where the table's log (and the views' staging topics) live.
    :param topic: the table's topic.
    :param checkpoint_after_bytes: log bytes between automatic checkpoints, written by the instance
        holding the writer in the background (None: only :meth:`checkpoint`); a fresh instance then
        bootstraps from the newest image and the records after it, whatever the history's length.
    :param manager_options: passed to :class:`SharedStateManager`.
    :raises ViewConflictError: apply found keys changed by someone else since the baseline.
    :raises ViewScopeError: a staged key is outside the view's scope.
    :raises ViewNotFoundError, ViewClosedError: the view does not exist, or was dropped/expired.
    """

    def __init__(
        self,
        backend: Backend,
        topic: str,
        *,
        checkpoint_after_bytes: int | None = DEFAULT_CHECKPOINT_AFTER_BYTES,
        **manager_options: Any,
    ) -> None:
        self.backend = backend
        self.topic = topic
        self._cleaners: list[threading.Thread] = []
        self._key_index: tuple[int, _TableState, list[str]] | None = None
        manager_options.setdefault("operation_timeout", 120.0)
        self.manager: SharedStateManager[_TableState, dict[str, Any]] = SharedStateManager(
            backend,
            topic,
            initializer=_TableState,
            applier=self._apply,
            op_serializer=encode_op,
            op_deserializer=decode_checked_op,
            state_serializer=_serialize_image,
            state_deserializer=_deserialize_image,
            checkpoint_after_bytes=checkpoint_after_bytes,
            **manager_options,
        )

    # ------------------------------------------------------------------ replication
    def _apply(self, state: _TableState, op: dict[str, Any]) -> None:
        offset = self.manager.applying_offset
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
        else:  # view_end
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

    def add_listener(self, listener: Callable[[TableChange], None]) -> None:
        """Call ``listener`` for every committed row change (set/delete) from now on."""

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

        self.manager.add_listener(on_change)

    # ------------------------------------------------------------------ rows
    # Every blocking call takes ``timeout`` (seconds; None: bounded only by the manager's
    # acquire/operation time-outs), as SharedStateManager.read/write do.
    def get(self, key: str, *, latest: bool = False, timeout: float | None = None) -> Record | None:
        return decode_row(key, self.manager.read(lambda s: s.rows.get(key), latest=latest, timeout=timeout))

    def to_dict(self, *, latest: bool = False, timeout: float | None = None) -> dict[str, Record]:
        return _decode_rows(self.manager.read(lambda s: dict(s.rows), latest=latest, timeout=timeout))

    def size(self, *, latest: bool = False, timeout: float | None = None) -> int:
        return self.manager.read(lambda s: len(s.rows), latest=latest, timeout=timeout)

    def rows_page(
        self,
        *,
        prefix: str = "",
        after: str | None = None,
        limit: int = 100,
        latest: bool = False,
        timeout: float | None = None,
    ) -> tuple[list[tuple[str, Record]], str | None]:
        """One page of rows, in key order: at most ``limit`` rows whose key starts with ``prefix``
        and sorts after ``after``, never the whole table.

        The sorted key index is built once per committed offset and reused by the following
        pages (a sort of the keys, then a binary search per page), so paging a large table
        that does not change costs a few microseconds per page after the first.

        :returns: the rows and the cursor of the next page (the last key; None: no more rows).
        """
        if limit < 1:
            raise ConfigurationError(f"rows_page of {self.topic}: limit must be >= 1, got {limit}")

        def run(s: _TableState) -> tuple[list[tuple[str, bytes]], bool]:
            keys = self._sorted_keys(s)
            start = (
                bisect.bisect_right(keys, after)
                if after is not None and after >= prefix
                else bisect.bisect_left(keys, prefix)
            )
            page: list[tuple[str, bytes]] = []
            for key in keys[start : start + limit + 1]:
                if not key.startswith(prefix):
                    break
                page.append((key, s.rows[key]))
            return page, len(page) > limit

        page, more = self.manager.read(run, latest=latest, timeout=timeout)
        page = page[:limit]
        rows = [(key, json.loads(value)) for key, value in page]
        return rows, (page[-1][0] if more and page else None)

    def _sorted_keys(self, state: _TableState) -> list[str]:
        # called under the manager's lock; rebuilt whenever a record was applied since
        offset = self.manager.applied_offset
        cached = self._key_index
        if cached is None or cached[0] != offset or cached[1] is not state:
            cached = (offset, state, sorted(state.rows))
            self._key_index = cached
        return cached[2]

    def source_offsets(self, topic: str, *, latest: bool = True, timeout: float | None = None) -> dict[int, int]:
        """The next offset to consume per partition of source ``topic``, as the last applied views
        recorded (empty: no view consumed it yet). This record, not a subscription's cursor, is
        where the next ingestion run starts: it moves in the same commit as the data it produced.
        """
        return self.manager.read(lambda s: dict(s.sources.get(topic, {})), latest=latest, timeout=timeout)

    def rows_with_source_offsets(
        self, topic: str, *, latest: bool = True, timeout: float | None = None
    ) -> tuple[dict[str, Record], dict[int, int]]:
        """The rows and :meth:`source_offsets` of ``topic`` from one consistent state (the rows are
        exactly the fold of the source up to those offsets, for tables fed only by ingestion views)."""
        rows, offsets = self.manager.read(
            lambda s: (dict(s.rows), dict(s.sources.get(topic, {}))), latest=latest, timeout=timeout
        )
        return _decode_rows(rows), offsets

    def put(self, key: str, record: Record, *, timeout: float | None = None, lease: Fence | None = None) -> None:
        """Set one row directly (not through a view)."""
        value = record_bytes(key, record, where=self.topic)
        self.manager.write(lambda s: [set_op(key, value)], timeout=timeout, lease=lease)

    def delete(self, key: str, *, timeout: float | None = None, lease: Fence | None = None) -> None:
        """Delete one row directly (not through a view)."""
        self.manager.write(lambda s: [del_op(key)] if key in s.rows else [], timeout=timeout, lease=lease)

    # ------------------------------------------------------------------ views
    def create_view(
        self,
        *,
        view_id: str | None = None,
        scope_prefix: str | None = None,
        scope_predicate: str | None = None,
        ttl: float = 86400.0,
        lease: Fence | None = None,
    ) -> ViewInfo:
        """Open a view; its baseline is the table's commit offset at creation.

        :param scope_prefix: the view owns only keys starting with this.
        :param scope_predicate: the name of a ``(key) -> bool`` registered with
            :func:`register_scope_predicate` in every process that plans or applies the view
            (only the name is logged); the view owns only keys it accepts.
        :raises ConfigurationError: a bad view id or ttl.
        :raises UnknownScopePredicateError: the predicate name is not registered here.

        Creating a view id that exists already returns it unchanged (a retried task is safe).
        Expired views are dropped in the same write.
        """
        vid = check_view_id(view_id or uuid.uuid4().hex[:16])
        if ttl <= 0:
            raise ConfigurationError(f"ttl must be positive, got {ttl!r}")
        if scope_predicate is not None:
            resolve_predicate(scope_predicate, view_id=vid)  # fail now, not at apply time
        expired: list[str] = []

        def ops(s: _TableState) -> list[dict[str, Any]]:
            out = self._expiry_ops(s, expired)
            if vid not in s.views:
                meta = {
                    "scope_prefix": scope_prefix,
                    "scope_predicate": scope_predicate,
                    "expires_at": time.time() + ttl,
                    "created_at": time.time(),
                }
                out.append({"o": "view", "id": vid, "meta": meta})
            return out

        info = self.manager.write(ops, lambda s: self._info(s, vid), lease=lease)
        self._delete_staging(expired)
        log.info(
            "view %s on %s open at baseline offset %d (scope: %s)",
            vid,
            self.topic,
            info.baseline,
            info.describe_scope(),
        )
        return info

    def view_info(self, view_id: str, *, latest: bool = True) -> ViewInfo | None:
        return self.manager.read(lambda s: self._info(s, view_id) if view_id in s.views else None, latest=latest)

    def views(self, *, latest: bool = True) -> list[ViewInfo]:
        return self.manager.read(lambda s: [self._info(s, v) for v in s.views], latest=latest)

    def stager(self, view_id: str, **options: Any) -> ViewStager:
        """A :class:`ViewStager` for the view (convenience for single-process producers)."""
        return ViewStager(self.backend, self.topic, view_id, **options)

    def seal(
        self,
        view_id: str,
        *,
        stagers: Iterable[ViewStager] | Mapping[str, int],
        source_offsets: Iterable[SourceRange] = (),
        lease: Fence | None = None,
    ) -> ViewInfo:
        """Record that staging is complete: which stagers staged how many rows, and from which source offsets.

        Call it once every stager is closed, with the stagers themselves or a mapping
        ``stager_id -> rows_staged`` gathered from other processes (``write_view`` does this for a
        Spark job). Plan and apply then use exactly the rows of these stagers and refuse if the
        staging topic holds a different count for any of them.

        ``source_offsets``: the ranges of source messages the staged rows were computed from (one
        per topic partition). Apply publishes their next offsets with the diff, atomically, and
        refuses the view if a range does not start at the table's recorded offset.

        :raises ViewNotFoundError, ViewClosedError: the view does not exist or is not open.
        :raises ConfigurationError: a stager still buffers rows (close it first), a bad count, or
            two ranges of the same topic partition.
        """
        sources = list(source_offsets)
        seen: set[tuple[str, int]] = set()
        for r in sources:
            if not isinstance(r, SourceRange):
                raise ConfigurationError(f"view {view_id!r}: source_offsets must hold SourceRange, got {r!r}")
            if (r.topic, r.partition) in seen:
                raise ConfigurationError(f"view {view_id!r}: two source ranges of {r.topic} partition {r.partition}")
            seen.add((r.topic, r.partition))
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

        def ops(s: _TableState) -> list[dict[str, Any]]:
            meta = s.views.get(view_id)
            if meta is None:
                raise ViewNotFoundError(f"no view {view_id!r} on {self.topic}")
            if meta["status"] != "open":
                raise ViewClosedError(f"view {view_id!r} on {self.topic} is {meta['status']}; it cannot be sealed")
            op: dict[str, Any] = {"o": "seal", "id": view_id, "stagers": counts}
            if sources:
                op["sources"] = [[r.topic, r.partition, r.start, r.next] for r in sources]
            return [op]

        info = self.manager.write(ops, lambda s: self._info(s, check_view_id(view_id)), lease=lease)
        log.info(
            "view %s on %s sealed: %d row(s) from %d stager(s)", view_id, self.topic, sum(counts.values()), len(counts)
        )
        return info

    def plan(self, view_id: str, *, sample: int = 10) -> ViewPlan:
        """Count what apply would publish (and which keys would conflict); publish nothing."""
        info = self._open_view(view_id)
        target = self._read_staged(info)

        def run(s: _TableState) -> ViewPlan:
            diff = self._diff(s, info, target)
            stale = [
                f"{r.topic} partition {r.partition}: view starts at {r.start}, table records {recorded}"
                for r, recorded in self._source_conflicts(s, info)
            ]
            return ViewPlan(
                view_id,
                len(diff.sets),
                len(diff.deletes),
                diff.unchanged,
                diff.sample_sets(sample),
                diff.sample_deletes(sample),
                self._conflicts(s, info, diff),
                stale,
            )

        return self.manager.read(run, latest=True)

    def apply(
        self,
        view_id: str,
        *,
        overwrite: bool = False,
        max_deletes: int | None = None,
        max_delete_fraction: float | None = DEFAULT_MAX_DELETE_FRACTION,
        sample: int = 10,
        timeout: float | None = None,
        lease: Fence | None = None,
    ) -> ViewResult:
        """Publish the minimal diff between the committed table and the view, atomically.

        The result carries up to ``sample`` keys per kind (the alphabetically first); they are
        recorded with the view, so applying it again returns the same result.

        :param overwrite: publish even if keys the diff touches changed since the baseline.
        :param max_deletes: refuse to publish a diff with more deletes than this (a job that
            staged nothing, or half its rows, would otherwise empty the table). When given, it
            replaces the fractional limit.
        :param max_delete_fraction: without ``max_deletes``, refuse a diff that deletes more than
            this fraction of the table's rows in the view's scope (default one half). Raise it,
            or pass ``max_deletes``, for a run that really deletes that much; None with
            ``max_deletes`` None: no limit.
        :raises ViewConflictError: such keys exist and ``overwrite`` is False (nothing published).
        :raises ViewGuardError: the diff deletes more than the limit (nothing published).
        :raises SourceOffsetsConflictError: a source range of the view does not start at the
            table's recorded offset (someone else consumed it: applying would double-count);
            nothing published, ``overwrite`` does not lift it.
        :param lease: the lease the apply is made under (a guarded job): refused with
            LeaseFencedError, nothing published, once the table has seen a newer token of it.
        :param timeout: seconds to wait for the switch's write (see ``SharedStateManager.write``);
            an :class:`UnknownOutcomeError` then means: ask ``manager.outcome`` or apply again
            (apply is idempotent: a view already applied returns its first result).
        """
        info = self.view_info(check_view_id(view_id))
        if info is None:
            raise ViewNotFoundError(f"no view {view_id!r} on {self.topic}")
        if info.status == "applied":
            return self._result(info, already=True)
        if info.status != "open":
            raise ViewClosedError(f"view {view_id!r} on {self.topic} is {info.status}")
        target = self._read_staged(info)
        already = [False]

        def ops(s: _TableState) -> list[dict[str, Any]]:
            meta = s.views.get(view_id)
            if meta is None:
                raise ViewNotFoundError(f"no view {view_id!r} on {self.topic}")
            if meta["status"] == "applied":  # applied by a concurrent or crashed-and-retried apply
                already[0] = True
                return []
            if meta["status"] != "open":
                raise ViewClosedError(f"view {view_id!r} on {self.topic} is {meta['status']}")
            if meta.get("sealed") != info.sealed or (meta.get("sources") or []) != [
                [r.topic, r.partition, r.start, r.next] for r in info.sources
            ]:
                raise ViewSealMismatchError(
                    f"view {view_id!r} on {self.topic} was sealed again during apply; apply again"
                )
            stale = self._source_conflicts(s, info)
            if stale:
                r, recorded = stale[0]
                raise SourceOffsetsConflictError(
                    f"view {view_id!r} consumed {r.topic} partition {r.partition} from offset {r.start}, but "
                    f"{self.topic} records {recorded} as its next offset: that range was consumed by another "
                    "view already (applying would count it twice); nothing was published -- recompute the view "
                    "from the table's recorded offsets",
                    topic=r.topic,
                    partition=r.partition,
                    start=r.start,
                    recorded=recorded,
                )
            diff = self._diff(s, info, target)
            _check_deletes(view_id, self.topic, diff, target, max_deletes, max_delete_fraction)
            conflicts = self._conflicts(s, info, diff)
            if conflicts and not overwrite:
                raise ViewConflictError(
                    f"view {view_id!r}: {len(conflicts)} key(s) changed on {self.topic} since baseline offset "
                    f"{info.baseline}: {', '.join(conflicts[:10])}{' ...' if len(conflicts) > 10 else ''}",
                    keys=conflicts,
                )
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
                end["sources"] = [[r.topic, r.partition, r.start, r.next] for r in info.sources]
            out.append(end)
            return out

        start = time.monotonic()
        info = self.manager.write(ops, lambda s: self._info(s, view_id), timeout=timeout, lease=lease)
        result = self._result(info, already=already[0])
        if not result.already_applied:
            log.info(
                "view %s applied to %s at offset %d in %.1fs: set=%d delete=%d unchanged=%d",
                view_id,
                self.topic,
                result.commit_offset,
                time.monotonic() - start,
                result.set,
                result.delete,
                result.unchanged,
            )
        self._delete_staging_later(view_id)
        return result

    def drop(self, view_id: str, *, timeout: float | None = None, lease: Fence | None = None) -> bool:
        """Abort an open view and delete its staged rows. Returns False if it was not open."""
        dropped = [False]

        def ops(s: _TableState) -> list[dict[str, Any]]:
            meta = s.views.get(view_id)
            dropped[0] = meta is not None and meta["status"] == "open"
            return [{"o": "view_end", "id": view_id, "status": "dropped"}] if dropped[0] else []

        self.manager.write(ops, timeout=timeout, lease=lease)
        if dropped[0]:
            self._delete_staging([view_id])
            log.info("view %s on %s dropped", view_id, self.topic)
        return dropped[0]

    def checkpoint(self) -> CheckpointInfo | None:
        """Store an image of the table as of the tail now, from any instance (None: empty log).

        The image holds the rows, the open and the newest closed views' metadata, the per-key
        change offsets that conflict checks need while views are open, and the recorded source
        offsets: a fresh instance loads it and replays only the records after it. Like every
        checkpoint it is derived data, checked against the log before use; a defective one means a
        full replay, never a different table (see :mod:`~airflow_provider_pulsarstate.engine.checkpoint`).
        """
        return self.manager.checkpoint()

    def expire_views(self) -> list[str]:
        """Drop every open view past its expiry time; returns their ids."""
        expired: list[str] = []
        self.manager.write(lambda s: self._expiry_ops(s, expired))
        self._delete_staging(expired)
        return expired

    # ------------------------------------------------------------------ internals
    def _expiry_ops(self, s: _TableState, expired: list[str]) -> list[dict[str, Any]]:
        now = time.time()
        expired[:] = [vid for vid in s.open_views() if s.views[vid]["expires_at"] <= now]
        for vid in expired:
            log.warning("view %s on %s expired unapplied; dropping it", vid, self.topic)
        return [{"o": "view_end", "id": vid, "status": "dropped"} for vid in expired]

    def _info(self, s: _TableState, view_id: str) -> ViewInfo:
        m = s.views[view_id]
        return ViewInfo(
            view_id,
            self.topic,
            m["baseline"],
            m["scope_prefix"],
            m["expires_at"],
            m["status"],
            staging_topic(self.topic, view_id),
            m.get("result"),
            m.get("commit_offset", -1),
            m.get("sealed"),
            m.get("scope_predicate"),
            [SourceRange(*r) for r in m.get("sources") or ()],
        )

    @staticmethod
    def _result(info: ViewInfo, *, already: bool) -> ViewResult:
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

    def _open_view(self, view_id: str) -> ViewInfo:
        info = self.view_info(check_view_id(view_id))
        if info is None:
            raise ViewNotFoundError(f"no view {view_id!r} on {self.topic}")
        if info.status != "open":
            raise ViewClosedError(f"view {view_id!r} on {self.topic} is {info.status}")
        return info

    def _read_staged(self, info: ViewInfo) -> dict[str, bytes | None]:
        """The view's target rows: key -> canonical record bytes (None: staged as deleted)."""
        if info.sealed is None:
            raise ViewNotSealedError(
                f"view {info.view_id!r} on {self.topic} is not sealed: its producer never recorded what it staged "
                "(StateTable.seal, or write_view at the end of the Spark job); nothing was published"
            )
        scoped = info.scope_prefix is not None or info.scope_predicate is not None
        return read_staged(
            self.backend,
            view_id=info.view_id,
            topic=info.staging_topic,
            sealed=info.sealed,
            in_scope=info.in_scope() if scoped else None,
            describe_scope=info.describe_scope(),
            timeout=self.manager.operation_timeout,
        )

    def _diff(self, s: _TableState, info: ViewInfo, target: dict[str, bytes | None]) -> _Diff:
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
        return _Diff(sets, deletes, len(scope_rows) - len(deletes) - replaced, len(scope_rows))

    @staticmethod
    def _source_conflicts(s: _TableState, info: ViewInfo) -> list[tuple[SourceRange, int]]:
        """The view's ranges that do not start at the table's recorded next offset.

        A partition the table records nothing for accepts any start (the first run picks it).
        """
        stale = []
        for r in info.sources:
            recorded = s.sources.get(r.topic, {}).get(r.partition)
            if recorded is not None and recorded != r.start:
                stale.append((r, recorded))
        return stale

    def _conflicts(self, s: _TableState, info: ViewInfo, diff: _Diff) -> list[str]:
        changed = s.changed
        if not changed:
            return []
        touched = list(diff.sets) + diff.deletes
        return sorted(k for k in touched if changed.get(k, -1) > info.baseline)

    def _delete_staging_later(self, view_id: str) -> None:
        """Delete an applied view's staged rows on a thread of its own (:meth:`close` waits for it):
        the switch is complete without it, and deleting a million staged rows takes a while."""
        self._cleaners = [t for t in self._cleaners if t.is_alive()]
        cleaner = threading.Thread(
            target=self._delete_staging, args=([view_id],), name=f"pulsarstate-view-cleanup-{view_id}", daemon=True
        )
        cleaner.start()
        self._cleaners.append(cleaner)

    def close(self) -> None:
        """Release the writer and the reader; waits for staging topics still being deleted."""
        for cleaner in self._cleaners:
            cleaner.join(timeout=self.manager.operation_timeout)
        super().close()

    def _delete_staging(self, view_ids: list[str]) -> None:
        for vid in view_ids:
            try:
                self.backend.delete_topic(staging_topic(self.topic, vid))
            except BackendUnavailableError as exc:  # the rows are useless now; leave them
                log.warning("could not delete the staging topic of view %s: %s", vid, exc)


@dataclass
class _Diff:
    sets: dict[str, bytes] = field(default_factory=dict)
    deletes: list[str] = field(default_factory=list)
    unchanged: int = 0
    in_scope: int = 0
    """Committed rows in the view's scope (the base of the delete fraction)."""

    def sample_sets(self, n: int) -> list[str]:
        return heapq.nsmallest(n, self.sets)  # no full sort of a million-key diff

    def sample_deletes(self, n: int) -> list[str]:
        return heapq.nsmallest(n, self.deletes)


def _forget_old_views(state: _TableState) -> None:
    closed = len(state.views) - state.n_open
    if closed > KEEP_CLOSED_VIEWS:
        for vid in [v for v, m in state.views.items() if m["status"] != "open"][: closed - KEEP_CLOSED_VIEWS]:
            del state.views[vid]


def _decode_rows(rows: dict[str, bytes]) -> dict[str, Record]:
    return {k: json.loads(v) for k, v in rows.items()}


def register_scope_predicate(name: str, fn: Callable[[str], Any] | None = None) -> Any:
    """Register ``fn`` (a ``(key) -> bool``) as the scope predicate ``name`` in this process.

    Use it directly (``register_scope_predicate("even", is_even)``) or as a decorator
    (``@register_scope_predicate("even")``). Views record only the name; every process that
    creates, plans or applies such a view must run the registration (put it in a module that
    the DAG file and the Spark job both import). Registering the same name again replaces it.

    :raises ConfigurationError: a bad name (1-128 characters of ``[A-Za-z0-9_.-]``) or a non-callable.
    """
    if not isinstance(name, str) or not _PREDICATE_NAME.match(name):
        raise ConfigurationError(f"scope predicate name {name!r} must be 1-128 characters of [A-Za-z0-9_.-]")

    def register(target: Callable[[str], Any]) -> Callable[[str], Any]:
        if not callable(target):
            raise ConfigurationError(f"scope predicate {name!r} must be callable, got {type(target).__name__}")
        _SCOPE_PREDICATES[name] = target
        return target

    return register if fn is None else register(fn)


def resolve_predicate(name: str, *, view_id: str | None = None) -> Callable[[str], Any]:
    """The scope predicate registered as ``name`` in this process (never imported from anywhere).

    :raises UnknownScopePredicateError: nothing is registered under that name.
    """
    target = _SCOPE_PREDICATES.get(name) if isinstance(name, str) else None
    if target is None:
        where = f"view {view_id!r}: " if view_id else ""
        raise UnknownScopePredicateError(
            f"{where}scope predicate {name!r} is not registered in this process; register it in code that "
            f"every process using the view imports: register_scope_predicate({name!r}, fn) "
            "(from airflow_provider_pulsarstate.engine.recipes.table); names are never imported from the log"
        )
    return target


def _check_deletes(
    view_id: str,
    topic: str,
    diff: _Diff,
    target: dict[str, bytes | None],
    max_deletes: int | None,
    max_delete_fraction: float | None,
) -> None:
    """Raise ViewGuardError when the diff deletes more than the caller allows."""
    deletes = len(diff.deletes)
    if max_deletes is not None:
        limit, name = max_deletes, f"max_deletes={max_deletes}"
    elif max_delete_fraction is not None:
        limit = int(max_delete_fraction * diff.in_scope)
        name = f"max_delete_fraction={max_delete_fraction} of {diff.in_scope} row(s) in scope (limit {limit})"
    else:
        return
    if deletes > limit:
        raise ViewGuardError(
            f"view {view_id!r} would delete {deletes} key(s) of {topic}, over {name} "
            f"(staged {sum(v is not None for v in target.values())} rows): {', '.join(heapq.nsmallest(10, diff.deletes))}; "
            "nothing was published -- pass a higher max_deletes (or max_delete_fraction) if this is intended",
            deletes=deletes,
        )
