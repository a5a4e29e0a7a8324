"""Committed offsets on Pulsar: stored exactly in the subscription's properties, then the cursor
moved so that exactly the messages below the committed offset are acknowledged (see :mod:`.pulsar`).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from airflow_provider_pulsarstate.engine.backends.pulsar import PulsarBackend
from airflow_provider_pulsarstate.engine.errors import OperationTimeoutError
from airflow_provider_pulsarstate.engine.offsets.checks import check_commit_range
from airflow_provider_pulsarstate.engine.offsets.pulsar_index import (
    COMMITTED_PROPERTY,
    EntryRef,
    cursor_positions,
    parse_committed,
)
from airflow_provider_pulsarstate.engine.offsets.pulsar_positions import PositionIndex
from airflow_provider_pulsarstate.engine.retry import Backoff

log = logging.getLogger(__name__)


class SubscriptionCommits:
    """Commits and reads the committed offsets of one topic's subscriptions. Thread-safe: commits
    of one subscription and partition are serialized in this process; another process committing
    at the same time makes the broker answer "busy", and the commit is retried."""

    def __init__(self, backend: PulsarBackend, topic: str, index: PositionIndex) -> None:
        self.topic = topic
        self._backend = backend
        self._admin = backend.admin
        self._index = index
        self._lock = threading.Lock()
        self._commit_locks: dict[tuple[str, int], threading.Lock] = {}

    def commit_at(self, subscription: str, partition: int, next_offset: int) -> None:
        """:meth:`OffsetLog.commit` (arguments checked)."""
        pt = self._index.ptopic(partition)
        beginning, end = self._index.beginning(partition), self._index.end(partition)
        check_commit_range(self.topic, partition, next_offset, beginning, end)
        target = self._cursor_target(partition, pt, next_offset, beginning, end)
        timeout = self._backend.config.operation_timeout
        with self._commit_lock(subscription, partition):
            deadline = time.monotonic() + timeout
            backoff = Backoff(initial=0.02, maximum=0.5)
            # The exact offset first, then the cursor: a crash in between leaves the cursor behind the
            # committed offset (messages kept and redelivered), never ahead of it. Another process
            # updating the same cursor makes the broker answer "busy": retry until the time-out.
            while not self._try_commit(pt, subscription, next_offset, target):
                if time.monotonic() >= deadline:
                    raise OperationTimeoutError(
                        f"committing {next_offset} on {self.topic} partition {partition} subscription {subscription}: "
                        f"the subscription stayed busy for {timeout:.0f}s"
                    )
                backoff.sleep(deadline)
        log.debug(
            "committed %s partition %d subscription %s at %d (%s)",
            self.topic,
            partition,
            subscription,
            next_offset,
            target,
        )

    def _try_commit(self, pt: str, subscription: str, next_offset: int, target: dict[str, Any]) -> bool:
        properties = self._admin.subscription_properties(pt, subscription)
        if properties is None:
            # The committed offset goes in with the creation: the broker creates the cursor at the
            # latest entry before moving it, and a probe must not see that as committed.
            self._admin.create_subscription(
                pt,
                subscription,
                ledger=target["ledger"],
                entry=target["entry"],
                properties={COMMITTED_PROPERTY: str(next_offset)},
            )
            properties = self._admin.subscription_properties(pt, subscription)
            if properties is None:
                return False  # another process is creating it: try again
        properties[COMMITTED_PROPERTY] = str(next_offset)
        return self._admin.set_subscription_properties(pt, subscription, properties) and self._admin.reset_cursor(
            pt, subscription, **target
        )

    def _commit_lock(self, subscription: str, partition: int) -> threading.Lock:
        with self._lock:
            return self._commit_locks.setdefault((subscription, partition), threading.Lock())

    def _cursor_target(self, partition: int, pt: str, next_offset: int, beginning: int, end: int) -> dict[str, Any]:
        """Where ``resetcursor`` puts the cursor so that exactly the offsets below ``next_offset`` are acknowledged."""
        if beginning == end:
            return {"ledger": -1, "entry": -1}  # nothing retained: nothing to acknowledge
        if next_offset == beginning:
            ref = self._index.locate(partition, pt, next_offset)
            assert isinstance(ref, EntryRef)
            return {"ledger": ref.ledger, "entry": ref.entry, "batch_index": max(0, next_offset - ref.first)}
        ref = self._index.locate(partition, pt, next_offset - 1)
        assert isinstance(ref, EntryRef)
        if next_offset - 1 >= ref.last:
            return {"ledger": ref.ledger, "entry": ref.entry, "excluded": True}
        return {"ledger": ref.ledger, "entry": ref.entry, "batch_index": next_offset - ref.first}

    def committed(self, subscription: str, partition: int) -> int | None:
        """:meth:`OffsetLog.committed` (arguments checked)."""
        pt = self._index.ptopic(partition)
        properties = self._admin.subscription_properties(pt, subscription)
        if properties is None:
            return None
        value = parse_committed(properties)
        if value is not None:
            return value
        return self._cursor_offset(partition, pt, subscription)

    def _cursor_offset(self, partition: int, pt: str, subscription: str) -> int:
        """The offset after a subscription's mark-delete position (a subscription this class did not
        commit on): conservative, individually acknowledged messages past it are not counted."""
        mark, read = cursor_positions(self._admin.internal_stats(pt), subscription)
        if mark is not None and (ref := self._index.entry_ref(pt, *mark)) is not None:
            return ref.last + 1
        if read is not None and (ref := self._index.entry_ref(pt, *read)) is not None:
            return ref.first
        return self._index.beginning(partition)
