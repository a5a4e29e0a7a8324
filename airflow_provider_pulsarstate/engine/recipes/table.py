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

:class:`StateTable` is a façade over parts with one job each: :mod:`.table_records` (the records
it hands out), :mod:`.table_state` (the replicated state, its fold and image), :mod:`.table_apply`
(plan and apply on a state), :mod:`.table_views` (the view lifecycle and staging clean-up),
:mod:`.table_rows` (reads and listeners) and :mod:`.scope_predicates`. Every public name is
importable from here.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from airflow_provider_pulsarstate.engine.backends.base import Backend
from airflow_provider_pulsarstate.engine.checkpoint import CheckpointInfo
from airflow_provider_pulsarstate.engine.config import DEFAULT_MAX_DELETE_FRACTION
from airflow_provider_pulsarstate.engine.errors import ConfigurationError, ViewClosedError, ViewNotFoundError
from airflow_provider_pulsarstate.engine.fencing import Fence
from airflow_provider_pulsarstate.engine.manager import SharedStateManager
from airflow_provider_pulsarstate.engine.recipes import table_views
from airflow_provider_pulsarstate.engine.recipes.base import Recipe
from airflow_provider_pulsarstate.engine.recipes.map import DEFAULT_CHECKPOINT_AFTER_BYTES
from airflow_provider_pulsarstate.engine.recipes.scope_predicates import register_scope_predicate, resolve_predicate
from airflow_provider_pulsarstate.engine.recipes.table_apply import ApplyLimits, apply_ops, plan_view
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
from airflow_provider_pulsarstate.engine.recipes.table_records import (
    SourceRange,
    TableChange,
    ViewInfo,
    ViewPlan,
    ViewResult,
    source_ranges,
)
from airflow_provider_pulsarstate.engine.recipes.table_rows import KeyIndex, change_listener, decode_rows
from airflow_provider_pulsarstate.engine.recipes.table_state import (
    KEEP_CLOSED_VIEWS,
    TableState,
    apply_op,
    deserialize_image,
    serialize_image,
    view_info_of,
    view_result,
)
from airflow_provider_pulsarstate.engine.recipes.view_staging import (
    ViewStager,
    check_view_id,
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
        self._staging = table_views.StagingCleaner(backend, topic)
        self._key_index = KeyIndex()
        manager_options.setdefault("operation_timeout", 120.0)
        self.manager: SharedStateManager[TableState, dict[str, Any]] = SharedStateManager(
            backend,
            topic,
            initializer=TableState,
            applier=self._apply,
            op_serializer=encode_op,
            op_deserializer=decode_checked_op,
            state_serializer=serialize_image,
            state_deserializer=deserialize_image,
            checkpoint_after_bytes=checkpoint_after_bytes,
            **manager_options,
        )

    def _apply(self, state: TableState, op: dict[str, Any]) -> None:
        apply_op(state, op, self.manager.applying_offset)

    def add_listener(self, listener: Callable[[TableChange], None]) -> None:
        """Call ``listener`` for every committed row change (set/delete) from now on."""
        self.manager.add_listener(change_listener(listener))

    # ------------------------------------------------------------------ rows
    # Every blocking call takes ``timeout`` (seconds; None: bounded only by the manager's
    # acquire/operation time-outs), as SharedStateManager.read/write do.
    def get(self, key: str, *, latest: bool = False, timeout: float | None = None) -> Record | None:
        return decode_row(key, self.manager.read(lambda s: s.rows.get(key), latest=latest, timeout=timeout))

    def to_dict(self, *, latest: bool = False, timeout: float | None = None) -> dict[str, Record]:
        return decode_rows(self.manager.read(lambda s: dict(s.rows), latest=latest, timeout=timeout))

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

        def run(s: TableState) -> tuple[list[tuple[str, bytes]], bool]:
            # under the manager's lock: the applied offset is the state's
            return self._key_index.page(s, self.manager.applied_offset, prefix=prefix, after=after, limit=limit)

        page, more = self.manager.read(run, latest=latest, timeout=timeout)
        page = page[:limit]
        rows = [(key, json.loads(value)) for key, value in page]
        return rows, (page[-1][0] if more and page else None)

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
        return decode_rows(rows), offsets

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

        def ops(s: TableState) -> list[dict[str, Any]]:
            out = table_views.expiry_ops(s, self.topic, expired)
            return out + table_views.create_ops(
                s, vid, scope_prefix=scope_prefix, scope_predicate=scope_predicate, ttl=ttl
            )

        info = self._write_view(ops, vid, lease=lease)
        self._staging.delete(expired)
        log.info(
            "view %s on %s open at baseline offset %d (scope: %s)",
            vid,
            self.topic,
            info.baseline,
            info.describe_scope(),
        )
        return info

    def view_info(self, view_id: str, *, latest: bool = True) -> ViewInfo | None:
        return self.manager.read(
            lambda s: view_info_of(s, self.topic, view_id) if view_id in s.views else None, latest=latest
        )

    def views(self, *, latest: bool = True) -> list[ViewInfo]:
        return self.manager.read(lambda s: [view_info_of(s, self.topic, v) for v in s.views], latest=latest)

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
        sources = table_views.seal_sources(view_id, source_offsets)
        counts = table_views.seal_counts(view_id, stagers)
        info = self._write_view(
            lambda s: table_views.seal_ops(s, self.topic, view_id, counts, sources), view_id, lease=lease
        )
        log.info(
            "view %s on %s sealed: %d row(s) from %d stager(s)", view_id, self.topic, sum(counts.values()), len(counts)
        )
        return info

    def plan(self, view_id: str, *, sample: int = 10) -> ViewPlan:
        """Count what apply would publish (and which keys would conflict); publish nothing."""
        info = self._open_view(view_id)
        target = self._read_target(info)
        return self.manager.read(lambda s: plan_view(s, info, target, sample=sample), latest=True)

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
        found = self.view_info(check_view_id(view_id))
        if found is None:
            raise ViewNotFoundError(f"no view {view_id!r} on {self.topic}")
        if found.status == "applied":
            return view_result(found, already=True)
        if found.status != "open":
            raise ViewClosedError(f"view {view_id!r} on {self.topic} is {found.status}")
        target = self._read_target(found)
        limits = ApplyLimits(overwrite, max_deletes, max_delete_fraction, sample)
        already = [False]

        def ops(s: TableState) -> list[dict[str, Any]]:
            out = apply_ops(s, found, target, limits)
            already[0] = out is None
            return out or []

        start = time.monotonic()
        info = self._write_view(ops, view_id, timeout=timeout, lease=lease)
        result = view_result(info, already=already[0])
        if not result.already_applied:
            self._log_applied(result, time.monotonic() - start)
        self._staging.delete_later(view_id)
        return result

    def drop(self, view_id: str, *, timeout: float | None = None, lease: Fence | None = None) -> bool:
        """Abort an open view and delete its staged rows. Returns False if it was not open."""
        dropped = [False]

        def ops(s: TableState) -> list[dict[str, Any]]:
            out = table_views.drop_ops(s, view_id)
            dropped[0] = bool(out)
            return out

        self.manager.write(ops, timeout=timeout, lease=lease)
        if dropped[0]:
            self._staging.delete([view_id])
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
        self.manager.write(lambda s: table_views.expiry_ops(s, self.topic, expired))
        self._staging.delete(expired)
        return expired

    def close(self) -> None:
        """Release the writer and the reader; waits for staging topics still being deleted."""
        self._staging.join(self.manager.operation_timeout)
        super().close()

    # ------------------------------------------------------------------ internals
    def _write_view(
        self,
        ops: Callable[[TableState], list[dict[str, Any]]],
        view_id: str,
        *,
        timeout: float | None = None,
        lease: Fence | None = None,
    ) -> ViewInfo:
        """Write ``ops`` and return the view's metadata as of that write."""
        info = self.manager.write(ops, lambda s: view_info_of(s, self.topic, view_id), timeout=timeout, lease=lease)
        if info is None:  # the reader always returns a ViewInfo; None would be a manager defect
            raise ViewNotFoundError(f"no view {view_id!r} on {self.topic}")
        return info

    def _log_applied(self, result: ViewResult, seconds: float) -> None:
        log.info(
            "view %s applied to %s at offset %d in %.1fs: set=%d delete=%d unchanged=%d",
            result.view_id,
            self.topic,
            result.commit_offset,
            seconds,
            result.set,
            result.delete,
            result.unchanged,
        )

    def _open_view(self, view_id: str) -> ViewInfo:
        info = self.view_info(check_view_id(view_id))
        if info is None:
            raise ViewNotFoundError(f"no view {view_id!r} on {self.topic}")
        if info.status != "open":
            raise ViewClosedError(f"view {view_id!r} on {self.topic} is {info.status}")
        return info

    def _read_target(self, info: ViewInfo) -> dict[str, bytes | None]:
        return table_views.read_target(self.backend, info, timeout=self.manager.operation_timeout)
