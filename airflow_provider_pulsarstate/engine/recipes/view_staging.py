"""Staging a view's rows: :class:`ViewStager` writes them, :func:`read_staged` reads them back.

A view's rows live in a topic of its own (:func:`staging_topic`), written by any number of
stagers at once (each Spark task opens one). A stager buffers rows and appends them in batches;
every batch carries the stager's id (the write's sequence field), so apply can use exactly the
rows of the stagers a seal names.

Batch layout: one write whose single op is ``0x04 | msgpack {key: canonical value or nil}`` (a
key staged twice into one batch keeps its last row; the earlier ``0x03 | msgpack [[key, value],
...]`` layout stays readable)
(rows in staging order). Rows are canonicalized once, here: apply then compares them with the
committed rows as bytes. Batches of the earlier layout (one keyed op per row) stay readable.

Nothing in a staging topic is trusted: :func:`read_staged` checks the framing, the stager ids,
the key types and the scope of every row, and :func:`check_staged_value` the value of every row
that differs from the committed table (an unchanged row is byte-identical to a committed,
already checked one).
"""

from __future__ import annotations

import collections
import logging
import re
import secrets
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import msgspec

from airflow_provider_pulsarstate.engine.backends.base import Backend, RawWriter
from airflow_provider_pulsarstate.engine.envelope import (
    KEY_DELETE,
    KEY_SET,
    FrameError,
    decode_key_op,
    decode_writes,
    encode_writes,
)
from airflow_provider_pulsarstate.engine.errors import (
    ConfigurationError,
    SerializationError,
    ViewScopeError,
    ViewSealMismatchError,
    ViewStagedRowError,
)
from airflow_provider_pulsarstate.engine.progress_report import Progress
from airflow_provider_pulsarstate.engine.recipes.table_ops import Record, check_canonical, record_bytes

log = logging.getLogger(__name__)

_VIEW_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_PAIRS = b"\x03"
_MAP = b"\x04"
_ENCODER = msgspec.msgpack.Encoder()
_PAIRS_DECODER = msgspec.msgpack.Decoder(list[tuple[str, bytes | None]])
_MAP_DECODER = msgspec.msgpack.Decoder(dict[str, bytes | None])


def staging_topic(table_topic: str, view_id: str) -> str:
    """The topic a view's rows are staged into."""
    return f"{table_topic}-view-{view_id}"


def check_view_id(view_id: str) -> str:
    if not isinstance(view_id, str) or not _VIEW_ID.match(view_id):
        raise ConfigurationError(f"view id {view_id!r} must be 1-64 characters of [A-Za-z0-9_-]")
    return view_id


def stager_name(seq: int) -> str:
    """The printable id of the stager that wrote a staged batch (its batch sequence field)."""
    return f"{seq:016x}"


class ViewStager:
    """Stages rows into a view from any process (each Spark executor opens its own).

    Rows are buffered and appended in batches to the view's staging topic; the table and its
    readers see nothing until ``StateTable.apply``. Once every stager is closed, seal the view
    with them (``StateTable.seal``): apply uses only the rows of the stagers the seal names. The
    last row staged for a key wins, so stage each key from one process only.

    :param backend: the table's back end.
    :param table_topic: the table's topic.
    :param view_id: the view, from ``StateTable.create_view``.
    :param batch_rows: rows per appended batch.
    :param batch_bytes: flush a batch early once it holds this many bytes.
    :param max_pending: batches appended but not yet acknowledged at most (the back end sends
        them in order while rows keep coming); :meth:`flush` and :meth:`close` wait for all.
        After a failed append the stager refuses every further row with the same error.
    """

    def __init__(
        self,
        backend: Backend,
        table_topic: str,
        view_id: str,
        *,
        batch_rows: int = 1000,
        batch_bytes: int = 1 << 20,
        max_pending: int = 16,
    ) -> None:
        self.backend = backend
        self.topic = staging_topic(table_topic, check_view_id(view_id))
        self.view_id = view_id
        self._where = f"view {view_id!r}"
        self.batch_rows = batch_rows
        self.batch_bytes = batch_bytes
        self.max_pending = max_pending
        self.rows_staged = 0
        """Rows staged so far (buffered ones included; all durable after :meth:`close`); a key
        staged again before its batch was appended counts once."""
        self._seq = secrets.randbits(63) or 1
        self.stager_id = stager_name(self._seq)
        """This stager's id: every batch it appends carries it (errors and seals name it)."""
        self._buffer: dict[str, bytes | None] = {}
        self._size = 0
        self._writer: RawWriter | None = None
        self._pending: collections.deque[Callable[[], list[Any]]] = collections.deque()
        self._failed: BaseException | None = None

    def set(self, key: str, record: Record) -> None:
        """Stage ``record`` as the view's row for ``key``.

        :raises SerializationError: ``key`` is not a non-empty str, or ``record`` not a dict of JSON
            scalars (finite numbers).
        """
        if self._failed is not None:
            raise self._failed
        self._add(key, record_bytes(key, record, where=self._where))

    def delete(self, key: str) -> None:
        """Stage the absence of ``key`` (undo an earlier set in this view)."""
        if not isinstance(key, str) or not key:
            raise SerializationError(f"row key {key!r} must be a non-empty str")
        self._add(key, None)

    def set_many(self, rows: Iterator[tuple[str, Record]] | list[tuple[str, Record]]) -> int:
        n = 0
        for key, record in rows:
            self.set(key, record)
            n += 1
        return n

    def _add(self, key: str, value: bytes | None) -> None:
        if self._failed is not None:
            raise self._failed
        buffer = self._buffer
        before = len(buffer)
        buffer[key] = value
        self.rows_staged += len(buffer) - before
        self._size += len(key) + (len(value) if value is not None else 0) + 4
        if len(self._buffer) >= self.batch_rows or self._size >= self.batch_bytes:
            self._send()

    @property
    def pending(self) -> int:
        """Rows buffered and not yet appended."""
        return len(self._buffer)

    def _send(self) -> None:
        """Start appending the buffered rows as one batch; at most ``max_pending`` batches stay unacknowledged."""
        if self._failed is not None:
            raise self._failed
        if self._writer is None:
            self._writer = self.backend.open_shared_writer(self.topic, batching=False)
        payload = encode_writes([(self._seq, [_MAP + _ENCODER.encode(self._buffer)])])
        self._buffer, self._size = {}, 0
        try:
            self._pending.append(self._writer.append_async([payload], timeout=120.0))
            while len(self._pending) > self.max_pending:
                self._pending.popleft()()
        except BaseException as exc:
            self._fail(exc)
            raise

    def _fail(self, exc: BaseException) -> None:
        """A batch may be lost: this stager takes no more rows (its count can no longer be trusted)."""
        self._failed = exc
        self._pending.clear()

    def flush(self) -> None:
        """Append the buffered rows; returns once every batch of this stager is acknowledged (durable)."""
        if self._buffer:
            self._send()
        elif self._failed is not None:
            raise self._failed
        try:
            while self._pending:
                self._pending.popleft()()
        except BaseException as exc:
            self._fail(exc)
            raise

    def close(self) -> None:
        """Flush and release the staging writer."""
        try:
            self.flush()
        finally:
            if self._writer is not None:
                self._writer.close()
                self._writer = None

    def __enter__(self) -> ViewStager:
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        if exc_type is None:
            self.close()
        elif self._writer is not None:
            self._writer.close()


def read_staged(
    backend: Backend,
    *,
    view_id: str,
    topic: str,
    sealed: Mapping[str, int],
    in_scope: Callable[[str], Any] | None,
    describe_scope: str,
    timeout: float,
) -> dict[str, bytes | None]:
    """The rows the sealed stagers staged: key -> canonical value (None: staged as deleted).

    Values are not checked here (see :func:`check_staged_value`); everything else is.

    :raises ViewStagedRowError: a malformed batch or row (nothing is published).
    :raises ViewSealMismatchError: a sealed stager's row count differs from what the topic holds.
    :raises ViewScopeError: a staged key is outside the view's scope.
    """
    found, target = _read_batches(backend, view_id=view_id, topic=topic, sealed=sealed, timeout=timeout)
    _check_seal(view_id, topic, sealed, found)
    if in_scope is not None:
        outside = [key for key in target if not in_scope(key)]
        if outside:
            raise ViewScopeError(
                f"view {view_id!r} staged {len(outside)} key(s) outside its scope "
                f"({describe_scope}): {', '.join(sorted(outside)[:10])}"
            )
    if "" in target:
        raise _bad(view_id, "?", "", "empty key")
    return target


def _read_batches(
    backend: Backend, *, view_id: str, topic: str, sealed: Mapping[str, int], timeout: float
) -> tuple[dict[str, int], dict[str, bytes | None]]:
    """Rows found per stager, and the rows of the sealed stagers (later batches win), in the staging topic."""
    found: dict[str, int] = {}
    target: dict[str, bytes | None] = {}
    reader = backend.create_reader(topic)
    progress = Progress(log, f"reading view {view_id}", unit="rows", quiet=True)
    try:
        while reader.has_next():
            entry = reader.read_next(timeout=timeout)
            if entry is None:
                break
            try:
                writes = decode_writes(entry.payload)
            except FrameError as exc:
                raise ViewStagedRowError(
                    f"view {view_id!r}: staging topic {topic} holds a malformed batch at "
                    f"{entry.position!r}: {exc}; nothing was published"
                ) from None
            for seq, ops in writes:
                stager = stager_name(seq)
                rows = _decode_batch(ops, view_id=view_id, stager=stager)
                found[stager] = found.get(stager, 0) + len(rows)
                if stager in sealed:  # else a failed or retried task's rows: not part of the view
                    target.update(rows)
                    progress.tick(len(rows))
    finally:
        reader.close()
    progress.done(keys=len(target))
    return found, target


def _check_seal(view_id: str, topic: str, sealed: Mapping[str, int], found: Mapping[str, int]) -> None:
    wrong = {sid: (n, found.get(sid, 0)) for sid, n in sealed.items() if found.get(sid, 0) != n}
    if wrong:
        raise ViewSealMismatchError(
            f"view {view_id!r}: the staging topic {topic} does not match the seal "
            f"(stager: sealed rows vs found): "
            + ", ".join(f"{sid}: {n} vs {got}" for sid, (n, got) in sorted(wrong.items())[:10])
            + " -- rows were staged elsewhere (a private embedded file on another host?) or lost; nothing was published"
        )


def check_staged_value(view_id: str, key: str, value: bytes) -> None:
    """Raise ViewStagedRowError unless ``value`` is the canonical JSON of a dict of JSON scalars."""
    try:
        check_canonical(key, value)
    except ValueError as exc:
        raise _bad(
            view_id, "?", key, f"value {value[:64]!r} is not the canonical JSON of a dict of JSON scalars ({exc})"
        ) from None


def _bad(view_id: str, stager: str, key: object, problem: str) -> ViewStagedRowError:
    who = f" from stager {stager}" if stager != "?" else ""
    return ViewStagedRowError(f"view {view_id!r}: staged row of key {key!r}{who}: {problem}; nothing was published")


def _decode_batch(
    ops: list[bytes], *, view_id: str, stager: str
) -> dict[str, bytes | None] | list[tuple[str, bytes | None]]:
    if len(ops) == 1 and ops[0][:1] in (_MAP, _PAIRS):
        try:
            return (_MAP_DECODER if ops[0][:1] == _MAP else _PAIRS_DECODER).decode(memoryview(ops[0])[1:])
        except msgspec.DecodeError as exc:
            raise _bad(view_id, stager, "?", f"a batch of rows does not decode ({exc})") from None
    return [_decode_keyed(op, view_id=view_id, stager=stager) for op in ops]


def _decode_keyed(op: bytes, *, view_id: str, stager: str) -> tuple[str, bytes | None]:
    """One row of the earlier one-op-per-row layout."""
    try:
        kind, raw_key, value = decode_key_op(op)
    except FrameError as exc:
        raise _bad(view_id, stager, op[:64], str(exc)) from None
    try:
        key = raw_key.decode()
    except UnicodeDecodeError:
        raise _bad(view_id, stager, raw_key[:64], "key is not valid UTF-8") from None
    if kind != KEY_SET and kind != KEY_DELETE:
        raise _bad(view_id, stager, key, f"unknown row kind {kind}")
    return key, value
