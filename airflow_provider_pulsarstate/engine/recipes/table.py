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
* **Validated staging.** Every staged row is checked at plan and apply (frame, UTF-8 key, row
  kind, value the canonical JSON of a dict of JSON scalars): a foreign or corrupt row fails the
  apply naming the key, the stager and the view, and nothing is published.
* **Durable staging.** Rows are staged into a topic of the view's own, from any number of
  processes at once; the live table and its readers see nothing until apply.
* **Canonical comparison.** Records are compared as canonical JSON (sorted fields, integral floats
  as ints), so field order or ``1.0`` vs ``1`` never cause a spurious change. A changed record is
  published as one set of the full record (no del+set flicker).
* **Change records.** Every published change carries its type (set/delete), the view id and the
  commit offset (:class:`TableChange`).
* **Exactly-once ingestion.** A view computed from a range of source messages (offsets of any
  topic, see :mod:`~airflow_provider_pulsarstate.engine.offsets`) carries that range in its seal
  (:class:`SourceRange`: topic, partition, start, next). Apply publishes the consumed next offsets
  in the same commit record as the diff, and refuses (:class:`SourceOffsetsConflictError`) a view
  whose range does not start at the table's recorded offsets: the table's record
  (:meth:`StateTable.source_offsets`), not a subscription's cursor, says where the next run starts.
* **Expiry.** Views not applied or dropped within ``ttl`` seconds are dropped by the next
  create_view (or :meth:`StateTable.expire_views`), and their staging topics deleted.
"""

from __future__ import annotations

import heapq
import json
import logging
import re
import secrets
import time
import uuid
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Iterable, Iterator, Mapping

from airflow_provider_pulsarstate.engine.backends.base import Backend, RawWriter
from airflow_provider_pulsarstate.engine.config import DEFAULT_MAX_DELETE_FRACTION
from airflow_provider_pulsarstate.engine.envelope import (
    KEY_DELETE,
    KEY_SET,
    FrameError,
    decode_key_op,
    decode_writes,
    encode_key_op,
    encode_writes,
)
from airflow_provider_pulsarstate.engine.errors import (
    BackendUnavailableError,
    ConfigurationError,
    SerializationError,
    SourceOffsetsConflictError,
    ViewClosedError,
    ViewConflictError,
    UnknownScopePredicateError,
    ViewGuardError,
    ViewNotFoundError,
    ViewNotSealedError,
    ViewScopeError,
    ViewSealMismatchError,
    ViewStagedRowError,
)
from airflow_provider_pulsarstate.engine.fencing import Fence
from airflow_provider_pulsarstate.engine.manager import Change, SharedStateManager
from airflow_provider_pulsarstate.engine.recipes.base import Recipe
from airflow_provider_pulsarstate.engine.progress import Progress

log = logging.getLogger(__name__)

_VIEW_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_PREDICATE_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,128}$")
_SCOPE_PREDICATES: dict[str, Callable[[str], Any]] = {}
_OPS = ("set", "del", "view", "view_end", "seal")
Record = dict[str, Any]


_canonical_json = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode


def canonical(record: Record) -> bytes:
    """The canonical bytes of a record: sorted fields, no spaces, integral floats as ints."""
    for v in record.values():
        if type(v) is float and v.is_integer():
            record = {k: int(x) if type(x) is float and x.is_integer() else x for k, x in record.items()}
            break
    return _canonical_json(record).encode()


def staging_topic(table_topic: str, view_id: str) -> str:
    """The topic a view's rows are staged into."""
    return f"{table_topic}-view-{view_id}"


def check_view_id(view_id: str) -> str:
    if not isinstance(view_id, str) or not _VIEW_ID.match(view_id):
        raise ConfigurationError(f"view id {view_id!r} must be 1-64 characters of [A-Za-z0-9_-]")
    return view_id


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
    def from_dict(cls, data: Mapping[str, Any]) -> "SourceRange":
        """The inverse of :meth:`as_dict` (e.g. from a job's result or an XCom).

        :raises ConfigurationError: missing or extra fields, or bad values.
        """
        if not isinstance(data, Mapping) or set(data) != {"topic", "partition", "start", "next"}:
            raise ConfigurationError(f"a source range needs exactly topic, partition, start, next; got {data!r}")
        return cls(data["topic"], data["partition"], data["start"], data["next"])


def source_ranges(
    topic: str, start: Mapping[int, int], next_offsets: Mapping[int, int]
) -> list[SourceRange]:
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
    __slots__ = ("rows", "changed", "views", "sources")

    def __init__(self) -> None:
        self.rows: dict[str, Record] = {}
        # key -> offset of its last change, kept only while some view is open (for conflict checks)
        self.changed: dict[str, int] = {}
        self.views: dict[str, dict[str, Any]] = {}
        # source topic -> partition -> next offset, as published by the last view that consumed it
        self.sources: dict[str, dict[int, int]] = {}

    def open_views(self) -> list[str]:
        return [vid for vid, meta in self.views.items() if meta["status"] == "open"]


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
    :param manager_options: passed to :class:`SharedStateManager`.
    :raises ViewConflictError: apply found keys changed by someone else since the baseline.
    :raises ViewScopeError: a staged key is outside the view's scope.
    :raises ViewNotFoundError, ViewClosedError: the view does not exist, or was dropped/expired.
    """

    def __init__(self, backend: Backend, topic: str, **manager_options: Any) -> None:
        self.backend = backend
        self.topic = topic
        manager_options.setdefault("operation_timeout", 120.0)
        self.manager: SharedStateManager[_TableState, dict[str, Any]] = SharedStateManager(
            backend, topic, initializer=_TableState, applier=self._apply,
            op_serializer=_serialize_op, op_deserializer=_deserialize_op, **manager_options,
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
            if state.views and any(m["status"] == "open" for m in state.views.values()):
                state.changed[key] = offset
        elif kind == "view":
            state.views[op["id"]] = {**op["meta"], "baseline": offset, "status": "open", "result": None}
        elif kind == "seal":
            meta = state.views.get(op["id"])
            if meta is not None and meta["status"] == "open":
                meta["sealed"] = op["stagers"]
                meta["sources"] = op.get("sources") or []
        else:  # view_end
            meta = state.views.get(op["id"])
            if meta is not None:
                meta["status"] = op["status"]
                meta["result"] = op.get("result")
                meta["commit_offset"] = offset
            for topic, partition, _start, next_offset in op.get("sources") or ():
                state.sources.setdefault(topic, {})[partition] = next_offset
            if not state.open_views():
                state.changed.clear()

    def add_listener(self, listener: Callable[[TableChange], None]) -> None:
        """Call ``listener`` for every committed row change (set/delete) from now on."""

        def on_change(change: Change[dict[str, Any]]) -> None:
            op = change.op
            if op["o"] in ("set", "del"):
                listener(TableChange("set" if op["o"] == "set" else "delete", op["k"], op.get("v"), op.get("w"), change.offset))

        self.manager.add_listener(on_change)

    # ------------------------------------------------------------------ rows
    # Every blocking call takes ``timeout`` (seconds; None: bounded only by the manager's
    # acquire/operation time-outs), as SharedStateManager.read/write do.
    def get(self, key: str, *, latest: bool = False, timeout: float | None = None) -> Record | None:
        return self.manager.read(lambda s: s.rows.get(key), latest=latest, timeout=timeout)

    def to_dict(self, *, latest: bool = False, timeout: float | None = None) -> dict[str, Record]:
        return self.manager.read(lambda s: dict(s.rows), latest=latest, timeout=timeout)

    def size(self, *, latest: bool = False, timeout: float | None = None) -> int:
        return self.manager.read(lambda s: len(s.rows), latest=latest, timeout=timeout)

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
        return self.manager.read(
            lambda s: (dict(s.rows), dict(s.sources.get(topic, {}))), latest=latest, timeout=timeout
        )

    def put(self, key: str, record: Record, *, timeout: float | None = None, lease: Fence | None = None) -> None:
        """Set one row directly (not through a view)."""
        _check_record(key, record)
        self.manager.write(lambda s: [{"o": "set", "k": key, "v": record, "w": None}], timeout=timeout, lease=lease)

    def delete(self, key: str, *, timeout: float | None = None, lease: Fence | None = None) -> None:
        """Delete one row directly (not through a view)."""
        self.manager.write(
            lambda s: [{"o": "del", "k": key, "w": None}] if key in s.rows else [], timeout=timeout, lease=lease
        )

    # ------------------------------------------------------------------ views
    def create_view(
        self, *, view_id: str | None = None, scope_prefix: str | None = None, scope_predicate: str | None = None,
        ttl: float = 86400.0, lease: Fence | None = None,
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
                    "scope_prefix": scope_prefix, "scope_predicate": scope_predicate,
                    "expires_at": time.time() + ttl, "created_at": time.time(),
                }
                out.append({"o": "view", "id": vid, "meta": meta})
            return out

        info = self.manager.write(ops, lambda s: self._info(s, vid), lease=lease)
        self._delete_staging(expired)
        log.info("view %s on %s open at baseline offset %d (scope: %s)", vid, self.topic, info.baseline, info.describe_scope())
        return info

    def view_info(self, view_id: str, *, latest: bool = True) -> ViewInfo | None:
        return self.manager.read(lambda s: self._info(s, view_id) if view_id in s.views else None, latest=latest)

    def views(self, *, latest: bool = True) -> list[ViewInfo]:
        return self.manager.read(lambda s: [self._info(s, v) for v in s.views], latest=latest)

    def stager(self, view_id: str, **options: Any) -> "ViewStager":
        """A :class:`ViewStager` for the view (convenience for single-process producers)."""
        return ViewStager(self.backend, self.topic, view_id, **options)

    def seal(
        self, view_id: str, *, stagers: "Iterable[ViewStager] | Mapping[str, int]",
        source_offsets: Iterable[SourceRange] = (), lease: Fence | None = None,
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
        log.info("view %s on %s sealed: %d row(s) from %d stager(s)", view_id, self.topic, sum(counts.values()), len(counts))
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
                view_id, len(diff.sets), len(diff.deletes), diff.unchanged,
                diff.sample_sets(sample), diff.sample_deletes(sample), self._conflicts(s, info, diff), stale,
            )

        return self.manager.read(run, latest=True)

    def apply(
        self, view_id: str, *, overwrite: bool = False, max_deletes: int | None = None,
        max_delete_fraction: float | None = DEFAULT_MAX_DELETE_FRACTION, sample: int = 10,
        timeout: float | None = None, lease: Fence | None = None,
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
                raise ViewSealMismatchError(f"view {view_id!r} on {self.topic} was sealed again during apply; apply again")
            stale = self._source_conflicts(s, info)
            if stale:
                r, recorded = stale[0]
                raise SourceOffsetsConflictError(
                    f"view {view_id!r} consumed {r.topic} partition {r.partition} from offset {r.start}, but "
                    f"{self.topic} records {recorded} as its next offset: that range was consumed by another "
                    "view already (applying would count it twice); nothing was published -- recompute the view "
                    "from the table's recorded offsets",
                    topic=r.topic, partition=r.partition, start=r.start, recorded=recorded,
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
            out: list[dict[str, Any]] = [{"o": "set", "k": k, "v": v, "w": view_id} for k, v in diff.sets.items()]
            out += [{"o": "del", "k": k, "w": view_id} for k in diff.deletes]
            counts = {
                "set": len(diff.sets), "delete": len(diff.deletes), "unchanged": diff.unchanged,
                "sample_set": diff.sample_sets(sample), "sample_delete": diff.sample_deletes(sample),
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
                view_id, self.topic, result.commit_offset, time.monotonic() - start, result.set, result.delete, result.unchanged,
            )
        self._delete_staging([view_id])
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
            view_id, self.topic, m["baseline"], m["scope_prefix"], m["expires_at"], m["status"],
            staging_topic(self.topic, view_id), m.get("result"), m.get("commit_offset", -1), m.get("sealed"),
            m.get("scope_predicate"), [SourceRange(*r) for r in m.get("sources") or ()],
        )

    @staticmethod
    def _result(info: ViewInfo, *, already: bool) -> ViewResult:
        counts = info.result or {}
        return ViewResult(
            info.view_id, counts.get("set", 0), counts.get("delete", 0), counts.get("unchanged", 0),
            info.commit_offset, already, counts.get("sample_set", []), counts.get("sample_delete", []),
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
        sealed = info.sealed
        found: dict[str, int] = {}
        target: dict[str, bytes | None] = {}
        reader = self.backend.create_reader(info.staging_topic)
        progress = Progress(log, f"reading view {info.view_id}", unit="rows", quiet=True)
        outside: list[str] = []
        in_scope = info.in_scope()
        try:
            while reader.has_next():
                entry = reader.read_next(timeout=self.manager.operation_timeout)
                if entry is None:
                    break
                try:
                    writes = decode_writes(entry.payload)
                except FrameError as exc:
                    raise ViewStagedRowError(
                        f"view {info.view_id!r}: staging topic {info.staging_topic} holds a malformed batch at "
                        f"{entry.position!r}: {exc}; nothing was published"
                    ) from None
                for seq, ops in writes:
                    stager = stager_name(seq)
                    rows = [_decode_staged(op, view_id=info.view_id, stager=stager) for op in ops]
                    found[stager] = found.get(stager, 0) + len(rows)
                    if stager not in sealed:
                        continue  # a failed or retried task's rows: not part of the view
                    for key, value in rows:
                        if not in_scope(key):
                            outside.append(key)
                        target[key] = value
                    progress.tick(len(ops))
        finally:
            reader.close()
        progress.done(keys=len(target))
        wrong = {sid: (n, found.get(sid, 0)) for sid, n in sealed.items() if found.get(sid, 0) != n}
        if wrong:
            raise ViewSealMismatchError(
                f"view {info.view_id!r}: the staging topic {info.staging_topic} does not match the seal "
                f"(stager: sealed rows vs found): "
                + ", ".join(f"{sid}: {n} vs {got}" for sid, (n, got) in sorted(wrong.items())[:10])
                + " -- rows were staged elsewhere (a private embedded file on another host?) or lost; nothing was published"
            )
        if outside:
            raise ViewScopeError(
                f"view {info.view_id!r} staged {len(outside)} key(s) outside its scope "
                f"({info.describe_scope()}): {', '.join(sorted(outside)[:10])}"
            )
        return target

    def _diff(self, s: _TableState, info: ViewInfo, target: dict[str, bytes | None]) -> "_Diff":
        """The diff between the committed rows in the view's scope and its staged target."""
        in_scope = None if info.scope_prefix is None and info.scope_predicate is None else info.in_scope()
        diff = _Diff()
        rows = s.rows
        for key, row in rows.items():
            if in_scope is not None and not in_scope(key):
                continue
            diff.in_scope += 1
            staged = target.get(key)
            if staged is None:
                diff.deletes.append(key)
            elif canonical(row) == staged:
                diff.unchanged += 1
            else:
                diff.sets[key] = json.loads(staged)
        for key, staged in target.items():  # keys new to the table
            if staged is not None and key not in rows:
                diff.sets[key] = json.loads(staged)
        return diff

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

    def _conflicts(self, s: _TableState, info: ViewInfo, diff: "_Diff") -> list[str]:
        changed = s.changed
        if not changed:
            return []
        touched = list(diff.sets) + diff.deletes
        return sorted(k for k in touched if changed.get(k, -1) > info.baseline)

    def _delete_staging(self, view_ids: list[str]) -> None:
        for vid in view_ids:
            try:
                self.backend.delete_topic(staging_topic(self.topic, vid))
            except BackendUnavailableError as exc:  # the rows are useless now; leave them
                log.warning("could not delete the staging topic of view %s: %s", vid, exc)


@dataclass
class _Diff:
    sets: dict[str, Record] = field(default_factory=dict)
    deletes: list[str] = field(default_factory=list)
    unchanged: int = 0
    in_scope: int = 0
    """Committed rows in the view's scope (the base of the delete fraction)."""

    def sample_sets(self, n: int) -> list[str]:
        return heapq.nsmallest(n, self.sets)  # no full sort of a million-key diff

    def sample_deletes(self, n: int) -> list[str]:
        return heapq.nsmallest(n, self.deletes)


class ViewStager:
    """Stages rows into a view from any process (each Spark executor opens its own).

    Rows are buffered and appended in batches to the view's staging topic; the table and its
    readers see nothing until :meth:`StateTable.apply`. Once every stager is closed, seal the view
    with them (:meth:`StateTable.seal`): apply uses only the rows of the stagers the seal names. The last row staged for a key wins, so
    stage each key from one process only.

    :param backend: the table's back end.
    :param table_topic: the table's topic.
    :param view_id: the view, from :meth:`StateTable.create_view`.
    :param batch_rows: rows per appended batch.
    :param batch_bytes: flush a batch early once it holds this many bytes.
    """

    def __init__(self, backend: Backend, table_topic: str, view_id: str, *, batch_rows: int = 1000, batch_bytes: int = 1 << 20) -> None:
        self.backend = backend
        self.topic = staging_topic(table_topic, check_view_id(view_id))
        self.view_id = view_id
        self.batch_rows = batch_rows
        self.batch_bytes = batch_bytes
        self.rows_staged = 0
        """Rows staged so far (buffered ones included; all durable after :meth:`close`)."""
        self._seq = secrets.randbits(63) or 1
        self.stager_id = stager_name(self._seq)
        """This stager's id: every batch it appends carries it (errors and seals name it)."""
        self._buffer: list[bytes] = []
        self._size = 0
        self._writer: RawWriter | None = None

    def set(self, key: str, record: Record) -> None:
        """Stage ``record`` as the view's row for ``key``."""
        _check_record(key, record)
        try:
            value = canonical(record)
        except (TypeError, ValueError) as exc:
            raise SerializationError(f"view {self.view_id!r}: record of key {key!r} is not JSON: {exc}") from exc
        self._add(encode_key_op(KEY_SET, key.encode(), value))

    def delete(self, key: str) -> None:
        """Stage the absence of ``key`` (undo an earlier set in this view)."""
        self._add(encode_key_op(KEY_DELETE, key.encode()))

    def set_many(self, rows: Iterator[tuple[str, Record]] | list[tuple[str, Record]]) -> int:
        n = 0
        for key, record in rows:
            self.set(key, record)
            n += 1
        return n

    def _add(self, op: bytes) -> None:
        self._buffer.append(op)
        self._size += len(op)
        self.rows_staged += 1
        if len(self._buffer) >= self.batch_rows or self._size >= self.batch_bytes:
            self.flush()

    @property
    def pending(self) -> int:
        """Rows buffered and not yet appended."""
        return len(self._buffer)

    def flush(self) -> None:
        """Append the buffered rows (durable when this returns)."""
        if not self._buffer:
            return
        if self._writer is None:
            self._writer = self.backend.open_shared_writer(self.topic)
        self._writer.append([encode_writes([(self._seq, self._buffer)])], timeout=120.0)
        self._buffer, self._size = [], 0

    def close(self) -> None:
        """Flush and release the staging writer."""
        try:
            self.flush()
        finally:
            if self._writer is not None:
                self._writer.close()
                self._writer = None

    def __enter__(self) -> "ViewStager":
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        if exc_type is None:
            self.close()
        elif self._writer is not None:
            self._writer.close()


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


def stager_name(seq: int) -> str:
    """The printable id of the stager that wrote a staged batch (its batch sequence field)."""
    return f"{seq:016x}"


def _check_deletes(
    view_id: str, topic: str, diff: _Diff, target: dict[str, bytes | None],
    max_deletes: int | None, max_delete_fraction: float | None,
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


def _check_record(key: str, record: Record) -> None:
    if not isinstance(key, str) or not key:
        raise SerializationError(f"row key {key!r} must be a non-empty str")
    if not isinstance(record, dict):
        raise SerializationError(f"record of key {key!r} must be a dict of fields, got {type(record).__name__}")
    for name, value in record.items():
        if not isinstance(name, str):
            raise SerializationError(f"record of key {key!r}: field name {name!r} is not a str")
        if value is not None and not isinstance(value, (str, int, float, bool)):
            raise SerializationError(
                f"record of key {key!r}: field {name!r} holds {type(value).__name__}, not a JSON scalar"
            )


def _decode_staged(op: bytes, *, view_id: str, stager: str) -> tuple[str, bytes | None]:
    """Decode and validate one staged row (same rules as :meth:`ViewStager.set`)."""

    def bad(key: object, problem: str) -> ViewStagedRowError:
        return ViewStagedRowError(
            f"view {view_id!r}: staged row of key {key!r} from stager {stager}: {problem}; nothing was published"
        )

    try:
        kind, raw_key, value = decode_key_op(op)
    except FrameError as exc:
        raise bad(op[:64], str(exc)) from None
    try:
        key = raw_key.decode()
    except UnicodeDecodeError:
        raise bad(raw_key[:64], "key is not valid UTF-8") from None
    if kind != KEY_SET and kind != KEY_DELETE:
        raise bad(key, f"unknown row kind {kind}")
    if not key:
        raise bad(key, "empty key")
    if value is None:
        return key, None
    try:
        record = json.loads(value)
        _check_record(key, record)
        if canonical(record) != value:
            raise ValueError("value is not canonical JSON")
    except (ValueError, SerializationError) as exc:
        raise bad(key, f"value {value[:64]!r} is not the canonical JSON of a dict of JSON scalars ({exc})") from None
    return key, value


def _serialize_op(op: dict[str, Any]) -> bytes:
    try:
        return json.dumps(op, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()
    except (TypeError, ValueError) as exc:
        raise SerializationError(f"cannot serialize table op for key {op.get('k')!r}: {exc}") from exc


def _deserialize_op(data: bytes) -> dict[str, Any]:
    op = json.loads(data)
    if not isinstance(op, dict) or op.get("o") not in _OPS:
        raise ValueError(f"unknown table op type {op.get('o') if isinstance(op, dict) else op!r}")
    return op
