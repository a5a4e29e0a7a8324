"""A feed of a :class:`~airflow_provider_pulsarstate.engine.recipes.table.StateTable`'s commits.

Change-driven scheduling (``StateChangeTrigger``) needs to know *which* commits a table made after a
watermark, and a downstream task needs the row changes of exactly one of them; neither needs its rows:

* :class:`TableFeed` reports each committed record after a commit offset: its offset, publish
  time, the views it applied, and how many rows it set and deleted (in all, and under a key
  prefix). It keeps counts only, never rows.
* :func:`read_commit` returns the row changes of one commit offset.

(For async code, :mod:`~airflow_provider_pulsarstate.engine.recipes.shared_table_feed` gives the
same commits through one reader per table shared by every feed of the process.)

Both read the log through a :class:`~airflow_provider_pulsarstate.engine.manager.SharedStateManager`
whose state is nothing at all (its applier ignores every op), so a record reaches them exactly
when it reaches every replica of the table: the same epoch rules (zombie and forged frames
skipped), the same op decoder, and the same lease fences (a write refused by its fencing token
is not a change). A feed starts from the newest checkpoint manifest *at or before* its watermark
(the manifest gives the log position, epoch and fences; the image is never loaded), so a restart
replays only the records after it, not the whole history; without such a manifest it replays
the log from the beginning.

Example::

    feed = TableFeed(backend, "persistent://public/default/price-table", after=41, key_prefix="sku-")
    for commit in feed.poll():              # the commits after offset 41, in order
        print(commit.offset, commit.view_id, commit.sets, commit.deletes)
    changes = read_commit(backend, feed.topic, commit.offset)   # that commit's row changes
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from airflow_provider_pulsarstate.engine.backends.base import EARLIEST, Backend
from airflow_provider_pulsarstate.engine.checkpoint import CheckpointInfo, CheckpointStore
from airflow_provider_pulsarstate.engine.errors import (
    CheckpointError,
    CommitNotFoundError,
    ConfigurationError,
    TableNotFoundError,
)
from airflow_provider_pulsarstate.engine.genesis import read_beginning
from airflow_provider_pulsarstate.engine.manager import Change, SharedStateManager
from airflow_provider_pulsarstate.engine.recipes.table import TableChange
from airflow_provider_pulsarstate.engine.recipes.table_ops import decode_checked_op, decode_row, encode_op
from airflow_provider_pulsarstate.engine.wal import CorruptPolicy

__all__ = ["CommitChanges", "TableCommit", "TableFeed", "read_commit"]


@dataclass(frozen=True, slots=True)
class TableCommit:
    """One committed record of a table, in counts.

    :ivar offset: its commit offset.
    :ivar publish_time: when the back end stored it (seconds since the epoch).
    :ivar sets: rows set (inserted or changed) by it.
    :ivar deletes: rows deleted by it.
    :ivar applied_views: ids of the views it applied (a view apply is one record: its whole diff
        and its ``view_end``).
    :ivar key_prefix: the feed's prefix (None: no prefix counts).
    :ivar prefix_sets: rows set under ``key_prefix`` (None without a prefix).
    :ivar prefix_deletes: rows deleted under ``key_prefix`` (None without a prefix).
    """

    offset: int
    publish_time: float
    sets: int
    deletes: int
    applied_views: tuple[str, ...] = ()
    key_prefix: str | None = None
    prefix_sets: int | None = None
    prefix_deletes: int | None = None

    @property
    def view_id(self) -> str | None:
        """The view this commit applied (the first, in the rare record applying several)."""
        return self.applied_views[0] if self.applied_views else None

    @property
    def view_apply(self) -> bool:
        """Whether this commit applied a view."""
        return bool(self.applied_views)

    def as_json(self) -> dict[str, Any]:
        """Plain JSON (an asset event's extra)."""
        out: dict[str, Any] = {
            "offset": self.offset,
            "publish_time": self.publish_time,
            "view_id": self.view_id,
            "view_apply": self.view_apply,
            "applied_views": list(self.applied_views),
            "sets": self.sets,
            "deletes": self.deletes,
        }
        if self.key_prefix is not None:
            out.update(key_prefix=self.key_prefix, prefix_sets=self.prefix_sets, prefix_deletes=self.prefix_deletes)
        return out


@dataclass
class _Tally:
    """A commit's counts while its ops arrive."""

    publish_time: float
    prefix: str | None
    sets: int = 0
    deletes: int = 0
    prefix_sets: int = 0
    prefix_deletes: int = 0
    applied: list[str] = field(default_factory=list)

    def add(self, op: dict[str, Any]) -> None:
        kind = op["o"]
        if kind == "set" or kind == "del":
            under = self.prefix is not None and op["k"].startswith(self.prefix)
            if kind == "set":
                self.sets += 1
                self.prefix_sets += under
            else:
                self.deletes += 1
                self.prefix_deletes += under
        elif kind == "view_end" and op.get("status") == "applied" and op.get("id") not in self.applied:
            self.applied.append(op["id"])

    def commit(self, offset: int) -> TableCommit:
        with_prefix = self.prefix is not None
        return TableCommit(
            offset,
            self.publish_time,
            self.sets,
            self.deletes,
            tuple(self.applied),
            self.prefix,
            self.prefix_sets if with_prefix else None,
            self.prefix_deletes if with_prefix else None,
        )


@dataclass(frozen=True)
class CommitChanges:
    """The row changes of one commit (:func:`read_commit`).

    :ivar commit: its counts (over every key, and under the prefix asked for).
    :ivar changes: its row changes in log order (only keys under the prefix, when one was given).
    """

    commit: TableCommit
    changes: list[TableChange]

    def summary(self, *, sample: int = 5) -> dict[str, Any]:
        """Counts by type and up to ``sample`` keys of each (plain JSON)."""
        sets = [c.key for c in self.changes if c.type == "set"]
        deletes = [c.key for c in self.changes if c.type == "delete"]
        return {
            **self.commit.as_json(),
            "changes": len(self.changes),
            "set_keys": sets[:sample],
            "delete_keys": deletes[:sample],
        }

    def table(self, *, sample: int = 5) -> str:
        """:meth:`summary` as aligned text lines (for a task log)."""
        s = self.summary(sample=sample)
        rows = [
            ("offset", s["offset"]),
            ("view", s["view_id"] or "-"),
            ("set", s["sets"]),
            ("delete", s["deletes"]),
            ("sample set", ", ".join(s["set_keys"]) or "-"),
            ("sample delete", ", ".join(s["delete_keys"]) or "-"),
        ]
        if self.commit.key_prefix is not None:
            rows[4:4] = [
                (f"set {self.commit.key_prefix}*", s["prefix_sets"]),
                (f"delete {self.commit.key_prefix}*", s["prefix_deletes"]),
            ]
        return "\n".join(f"  {name:<16} {value}" for name, value in rows)


class _ManifestsOnly(CheckpointStore):
    """A table's checkpoints as a feed starts from them: the newest manifest at or before
    ``limit`` (older manifests are searched when the newest lies past it), and never an image.

    The manager still checks the manifest against the log (:meth:`CheckpointStore.verify`) and
    takes its position, epoch and fences; the rows of the image are not needed.
    """

    def __init__(self, store: CheckpointStore, limit: int | None) -> None:
        super().__init__(store.backend, store.topic, max_frame_bytes=store.max_frame_bytes, timeout=store.timeout)
        self.limit = limit

    def latest(self) -> CheckpointInfo | None:
        newest = super().latest()
        if newest is None or self.limit is None or newest.offset <= self.limit:
            return newest
        best: CheckpointInfo | None = None
        reader = self.backend.create_reader(self.index_topic, start=EARLIEST)
        try:
            while reader.has_next() and (entry := reader.read_next(timeout=self.timeout)) is not None:
                try:
                    info = self._parse(entry.payload)
                except CheckpointError:
                    continue  # a damaged old manifest is passed over, as a damaged newest one would be
                if info.offset <= self.limit and (best is None or info.offset > best.offset):
                    best = info
        finally:
            reader.close()
        return best

    def load(self, info: CheckpointInfo) -> bytes:
        return b""


def _nothing() -> None:
    return None


def _ignore(state: None, op: Any) -> None:
    return None


def _no_rows(image: bytes) -> None:
    return None


def _open_manager(
    backend: Backend,
    topic: str,
    *,
    limit: int | None,
    operation_timeout: float,
    on_corrupt: CorruptPolicy,
    listener: Callable[[Change[dict[str, Any]]], None],
    check_exists: bool = False,
) -> SharedStateManager[None, dict[str, Any]]:
    """A stateless manager of the table's log (its op decoder and acceptance rules) from the newest
    manifest at or before ``limit`` (None: the newest), telling ``listener`` every change it replays.
    ``check_exists``: raise :class:`TableNotFoundError` on an empty log."""
    if check_exists:
        _check_exists(backend, topic, operation_timeout)
    manager: SharedStateManager[None, dict[str, Any]] = SharedStateManager(
        backend,
        topic,
        initializer=_nothing,
        applier=_ignore,
        op_serializer=encode_op,
        op_deserializer=decode_checked_op,
        state_deserializer=_no_rows,
        operation_timeout=operation_timeout,
        on_corrupt=on_corrupt,
    )
    manager.checkpoints = _ManifestsOnly(manager.checkpoints, limit)
    manager.add_listener(listener)
    return manager


def _check_exists(backend: Backend, topic: str, timeout: float) -> None:
    if read_beginning(backend, topic, timeout=timeout).empty:
        raise TableNotFoundError(topic=topic)


def _check_offset(name: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigurationError(f"{name} must be an int >= {minimum} (a commit offset), got {value!r}")
    return value


class TableFeed:
    """The commits of a table after a commit offset, in counts (see the module docstring).

    Construction does no I/O. The first :meth:`start` or :meth:`poll` replays the log from the
    newest checkpoint manifest at or before ``after``; later polls read only new records.

    :param backend: where the table's log lives.
    :param topic: the table's topic (full name).
    :param after: report commits after this offset (-1: every commit; None: only commits made
        after :meth:`start`, which resolves it to the table's last commit).
    :param key_prefix: also count the rows set and deleted under this prefix.
    :param operation_timeout: seconds a single read may take.
    :param on_corrupt: as for :class:`SharedStateManager` ("raise": stop at an undecodable entry).
    :raises TableNotFoundError: (from :meth:`start`) the table's log is empty.
    :raises CommitNotFoundError: (from :meth:`start`) ``after`` lies past the table's last commit
        (the table was recreated, or the watermark belongs to another table).
    """

    def __init__(
        self,
        backend: Backend,
        topic: str,
        *,
        after: int | None = None,
        key_prefix: str | None = None,
        operation_timeout: float = 30.0,
        on_corrupt: CorruptPolicy = "raise",
    ) -> None:
        if after is not None:
            _check_offset("after", after, -1)
        if key_prefix is not None and not isinstance(key_prefix, str):
            raise ConfigurationError(f"key_prefix must be a str or None, got {key_prefix!r}")
        self.backend = backend
        self.topic = topic
        self.key_prefix = key_prefix
        self.operation_timeout = operation_timeout
        self.on_corrupt = on_corrupt
        self._after = after
        self._started = False
        self._manager: SharedStateManager[None, dict[str, Any]] | None = None
        self._tallies: dict[int, _Tally] = {}

    @property
    def after(self) -> int | None:
        """The watermark: every commit up to this offset was reported (None before :meth:`start`
        when the feed starts at the tail)."""
        return self._after

    @property
    def stats(self) -> dict[str, int]:
        """The underlying manager's counters (``checkpoint_loaded_offset``, ``records_replayed``,
        ``fenced_skipped``, ``corrupt_skipped``, ...)."""
        return dict(self._manager.stats) if self._manager is not None else {}

    def _on_change(self, change: Change[dict[str, Any]]) -> None:
        if self._after is None or change.offset <= self._after:
            return  # before the watermark (or while the starting tail is being found)
        tally = self._tallies.get(change.offset)
        if tally is None:
            tally = self._tallies[change.offset] = _Tally(change.publish_time, self.key_prefix)
        tally.add(change.op)

    def start(self, *, timeout: float | None = None) -> int:
        """Replay up to the tail (once) and return the watermark.

        :raises TableNotFoundError, CommitNotFoundError: see the class docstring.
        :raises OperationTimeoutError: ``timeout`` ran out; the next call goes on from there.
        """
        if self._manager is None:
            self._manager = _open_manager(
                self.backend,
                self.topic,
                limit=self._after,
                operation_timeout=self.operation_timeout,
                on_corrupt=self.on_corrupt,
                listener=self._on_change,
                check_exists=True,
            )
        if not self._started:
            self._manager.read(_nothing_read, latest=True, timeout=timeout)
            last = self._manager.applied_offset
            if self._after is None:
                self._after = last
            elif self._after > last:
                raise CommitNotFoundError(
                    f"the feed's watermark {self._after} lies past the last commit {last} of table {self.topic!r}: "
                    "the table was recreated, or the watermark belongs to another table",
                    topic=self.topic,
                    offset=self._after,
                    last_offset=last,
                )
            self._started = True
        assert self._after is not None
        return self._after

    def poll(self, *, timeout: float | None = None) -> list[TableCommit]:
        """The commits after the watermark up to the tail as it is now, in offset order; the
        watermark then moves to the last record read (also past records that changed nothing,
        such as writes refused by a lease fence).

        :raises OperationTimeoutError: ``timeout`` ran out; nothing is lost, the next poll goes on.
        """
        self.start(timeout=timeout)
        assert self._manager is not None and self._after is not None
        self._manager.read(_nothing_read, latest=True, timeout=timeout)
        tallies, self._tallies = self._tallies, {}
        commits = [tallies[offset].commit(offset) for offset in sorted(tallies)]
        self._after = max(self._after, self._manager.applied_offset)
        return commits

    def changes_at(self, offset: int, *, timeout: float | None = None) -> CommitChanges:
        """:func:`read_commit` of this feed's table and prefix."""
        return read_commit(
            self.backend,
            self.topic,
            offset,
            key_prefix=self.key_prefix,
            operation_timeout=self.operation_timeout,
            timeout=timeout,
        )

    def close(self) -> None:
        manager, self._manager = self._manager, None
        if manager is not None:
            manager.close()

    def __enter__(self) -> TableFeed:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _nothing_read(state: None) -> None:
    return None


def read_commit(
    backend: Backend,
    topic: str,
    offset: int,
    *,
    key_prefix: str | None = None,
    operation_timeout: float = 30.0,
    timeout: float | None = None,
) -> CommitChanges:
    """The row changes of the commit at ``offset`` of table ``topic``.

    Replays from the newest checkpoint manifest before ``offset`` up to the tail (the manager
    reads to the tail; only ``offset``'s ops are kept), under the table's acceptance rules.

    :param key_prefix: keep only changes to keys under this prefix (the counts cover both).
    :raises TableNotFoundError: the table's log is empty.
    :raises CommitNotFoundError: ``offset`` is negative, past the last commit, or a record of
        which nothing was applied (its writes were refused by a lease fence, or it was skipped as
        corrupt).
    """
    _check_commit_offset(topic, offset)
    _check_exists(backend, topic, operation_timeout)
    ops = _ops_of_commit(backend, topic, offset, operation_timeout=operation_timeout, timeout=timeout)
    return _commit_changes(ops, offset, key_prefix)


def _check_commit_offset(topic: str, offset: int) -> None:
    if isinstance(offset, bool) or not isinstance(offset, int):
        raise ConfigurationError(f"offset must be an int (a commit offset of {topic!r}), got {offset!r}")
    if offset < 0:
        raise CommitNotFoundError(
            f"offset {offset} is not a commit of table {topic!r}: commit offsets start at 0",
            topic=topic,
            offset=offset,
            last_offset=-1,
        )


def _ops_of_commit(
    backend: Backend, topic: str, offset: int, *, operation_timeout: float, timeout: float | None
) -> list[Change[dict[str, Any]]]:
    """The ops applied at ``offset``, by a replay from the newest checkpoint before it to the tail."""
    ops: list[Change[dict[str, Any]]] = []

    def keep(change: Change[dict[str, Any]]) -> None:
        if change.offset == offset:
            ops.append(change)

    manager = _open_manager(
        backend, topic, limit=offset - 1, operation_timeout=operation_timeout, on_corrupt="raise", listener=keep
    )
    try:
        manager.read(_nothing_read, latest=True, timeout=timeout)
        last = manager.applied_offset
    finally:
        manager.close()
    if offset > last:
        raise CommitNotFoundError(
            f"offset {offset} is not a commit of table {topic!r}: its last commit is {last}",
            topic=topic,
            offset=offset,
            last_offset=last,
        )
    if not ops:
        raise CommitNotFoundError(
            f"offset {offset} of table {topic!r} changed nothing: its writes were refused by a lease fence "
            "or it was skipped as corrupt",
            topic=topic,
            offset=offset,
            last_offset=last,
        )
    return ops


def _commit_changes(ops: list[Change[dict[str, Any]]], offset: int, key_prefix: str | None) -> CommitChanges:
    """The counts and the row changes (under ``key_prefix``, if given) of one commit's ops."""
    tally = _Tally(ops[0].publish_time, key_prefix)
    changes: list[TableChange] = []
    for change in ops:
        op = change.op
        tally.add(op)
        if op["o"] in ("set", "del") and (key_prefix is None or op["k"].startswith(key_prefix)):
            changes.append(
                TableChange(
                    "set" if op["o"] == "set" else "delete",
                    op["k"],
                    decode_row(op["k"], op.get("v")),
                    op.get("w"),
                    offset,
                )
            )
    return CommitChanges(tally.commit(offset), changes)
