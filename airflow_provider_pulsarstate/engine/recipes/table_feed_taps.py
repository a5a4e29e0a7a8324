"""The shared table feeds' reader of a table's log, on the worker pool: each new record in counts
(over every key, and under each watched key prefix; never rows), and the count of open readers.

The event-loop side, which shares these reads among feeds, is
:mod:`~airflow_provider_pulsarstate.engine.recipes.shared_table_feed`.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

from airflow_provider_pulsarstate.engine.backends.base import Backend
from airflow_provider_pulsarstate.engine.config import ConnectionConfig
from airflow_provider_pulsarstate.engine.manager import Change, SharedStateManager
from airflow_provider_pulsarstate.engine.recipes.table_feed import (
    TableCommit,
    _nothing_read,
    _open_manager,
)

__all__ = ["CountedRecord", "KeyPrefixes", "LogTap", "TableTaps", "open_table_readers"]


class KeyPrefixes:
    """Which watched prefixes a key lies under, by the prefixes' lengths (few distinct lengths)."""

    def __init__(self, prefixes: Collection[str]) -> None:
        self.all = frozenset(prefixes)
        by_len: dict[int, set[str]] = {}
        for prefix in self.all:
            by_len.setdefault(len(prefix), set()).add(prefix)
        self._by_len = sorted(by_len.items())

    def of(self, key: str) -> list[str]:
        return [key[:n] for n, group in self._by_len if n <= len(key) and key[:n] in group]


@dataclass(slots=True)
class CountedRecord:
    """One committed record in counts: over every key, and under each watched prefix (absent: 0)."""

    offset: int
    publish_time: float
    sets: int = 0
    deletes: int = 0
    applied: list[str] = field(default_factory=list)
    under: dict[str, list[int]] = field(default_factory=dict)  # prefix -> [sets, deletes]

    def add(self, op: dict[str, Any], prefixes: KeyPrefixes) -> None:
        kind = op["o"]
        if kind == "set" or kind == "del":
            i = 0 if kind == "set" else 1
            if i == 0:
                self.sets += 1
            else:
                self.deletes += 1
            for prefix in prefixes.of(op["k"]):
                self.under.setdefault(prefix, [0, 0])[i] += 1
        elif kind == "view_end" and op.get("status") == "applied" and op.get("id") not in self.applied:
            self.applied.append(op["id"])

    def commit(self, prefix: str | None) -> TableCommit:
        if prefix is None:
            return TableCommit(self.offset, self.publish_time, self.sets, self.deletes, tuple(self.applied))
        sets, deletes = self.under.get(prefix, (0, 0))
        return TableCommit(
            self.offset, self.publish_time, self.sets, self.deletes, tuple(self.applied), prefix, sets, deletes
        )


class LogTap:
    """The table's log read forward from ``start`` (None: its tail at the first read), each new
    record in counts under the prefixes given to the read. Blocking: runs on a pool thread."""

    def __init__(self, backend: Backend, topic: str, *, start: int | None, operation_timeout: float) -> None:
        self.backend, self.topic, self.operation_timeout = backend, topic, operation_timeout
        self._after = start
        self._manager: SharedStateManager[None, dict[str, Any]] | None = None
        self._prefixes = KeyPrefixes(())
        self._records: list[CountedRecord] = []

    def _on_change(self, change: Change[dict[str, Any]]) -> None:
        if self._after is None or change.offset <= self._after:
            return
        if not self._records or self._records[-1].offset != change.offset:
            self._records.append(CountedRecord(change.offset, change.publish_time))
        self._records[-1].add(change.op, self._prefixes)

    def read(self, prefixes: frozenset[str]) -> tuple[list[CountedRecord], int]:
        """The records after the previous read (after ``start`` for the first), and the offset read to."""
        if self._manager is None:
            self._manager = _open_manager(
                self.backend,
                self.topic,
                limit=self._after,
                operation_timeout=self.operation_timeout,
                on_corrupt="raise",
                listener=self._on_change,
                check_exists=True,
            )
        if prefixes != self._prefixes.all:
            self._prefixes = KeyPrefixes(prefixes)
        self._manager.read(_nothing_read, latest=True)
        records, self._records = self._records, []
        self._after = self._manager.applied_offset
        return records, self._after

    def close(self) -> None:
        manager, self._manager = self._manager, None
        if manager is not None:
            manager.close()


_live: Counter[tuple[ConnectionConfig, str]] = Counter()  # open taps by (connection, topic), for diagnostics
_live_lock = threading.Lock()


class TableTaps:
    """What the shared reader holds on the pool: the connection's back end and the open tap."""

    def __init__(self, backend: Backend, config: ConnectionConfig, topic: str) -> None:
        self.backend, self.config, self.topic = backend, config, topic
        self.tap: LogTap | None = None

    def read(self, start: int | None, prefixes: frozenset[str]) -> tuple[list[CountedRecord], int]:
        if self.tap is None:
            self.tap = LogTap(self.backend, self.topic, start=start, operation_timeout=self.config.operation_timeout)
            with _live_lock:
                _live[(self.config, self.topic)] += 1
        try:
            return self.tap.read(prefixes)
        except BaseException:
            self.drop()  # reopened from the last position handed out: a half-read tap never counts twice
            raise

    def catch_up(self, after: int, prefixes: frozenset[str]) -> tuple[list[CountedRecord], int]:
        """The records after ``after`` counted under ``prefixes``, by a replay of its own."""
        tap = LogTap(self.backend, self.topic, start=after, operation_timeout=self.config.operation_timeout)
        try:
            return tap.read(prefixes)
        finally:
            tap.close()

    def drop(self) -> None:
        tap, self.tap = self.tap, None
        if tap is not None:
            with _live_lock:
                _live[(self.config, self.topic)] -= 1
            tap.close()

    def close(self) -> None:
        self.drop()


def open_table_readers() -> dict[str, int]:
    """Log readers the shared table feeds of this process hold open now, by table topic."""
    out: Counter[str] = Counter()
    with _live_lock:
        counts = list(_live.items())
    for (_, topic), n in counts:
        out[topic] += n
    return {topic: n for topic, n in out.items() if n}
