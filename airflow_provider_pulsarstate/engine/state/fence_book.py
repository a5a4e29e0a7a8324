"""The highest fencing token applied per (lease log, lease name): part of the replicated state.

The same rules on every replica decide which writes under a lease are admitted, so every
replica holds the same fences at the same offset (and checkpoints carry them).
"""

from __future__ import annotations

import logging

from airflow_provider_pulsarstate.engine.envelope import FenceTag
from airflow_provider_pulsarstate.engine.errors import LeaseFencedError
from airflow_provider_pulsarstate.engine.fencing import Fence, FenceKey, check_fence, reset_matches
from airflow_provider_pulsarstate.engine.grants import LeaseGrants
from airflow_provider_pulsarstate.engine.state.stats import ManagerStats
from airflow_provider_pulsarstate.engine.writes import PendingWrite

log = logging.getLogger(__name__)


class FenceBook:
    """Fences of one log, and the lease logs' grants its writes are checked against.

    Read and changed under the state lock (except :meth:`resolve`, which only reads).
    """

    def __init__(self, topic: str, grants: LeaseGrants, stats: ManagerStats) -> None:
        self.topic = topic
        self.grants = grants
        self.stats = stats
        self.tokens: dict[FenceKey, int] = {}

    def resolve(self, lease: Fence) -> FenceTag:
        """``(lease log ref, name, token)`` of a lease whose lease log granted its token.

        A token below this log's fence may come from a recreated lease log that this instance's
        replica predates: it is checked again on a fresh replica before the write is refused.
        """
        lease_log, name, token = check_fence(lease)
        ref = self.grants.verify(lease_log, name, token)
        if token < self.tokens.get((ref, name), 0):
            ref = self.grants.verify(lease_log, name, token, fresh=True)
        return ref, name, token

    def check(self, w: PendingWrite) -> bool | None:
        """None: not under a lease; True: a token the log has not seen, or a reset (append it);
        False: the current token. Raises LeaseFencedError for an older token."""
        if w.fence is None:
            return None
        ref, name, token = w.fence
        if token == 0:
            return True
        seen = self.tokens.get((ref, name), 0)
        if token < seen:
            raise LeaseFencedError(topic=self.topic, lease=name, token=token, newer_token=seen)
        return token > seen

    def take(self, fence: FenceTag) -> dict[FenceKey, int]:
        """Record an admitted token, or apply a reset (token 0); returns the fences a reset removed."""
        ref, name, token = fence
        if token:
            self.tokens[(ref, name)] = token
            return {}
        removed = {key: t for key, t in self.tokens.items() if reset_matches(key, lease_log=ref, name=name)}
        for key in removed:
            del self.tokens[key]
        log.warning("%s: fence of lease %r reset (lease log %s); removed %s", self.topic, name, ref, removed or "none")
        return removed

    def admit_replayed(self, fence: FenceTag, seq: int, offset: int) -> LeaseFencedError | None:
        """The replay rule, the same on every replica: None (admitted, fence taken) or the refusal."""
        ref, name, token = fence
        seen = self.tokens.get((ref, name), 0) if token else 0
        if token and token < seen:
            self.stats.fenced_skipped += 1
            refused = LeaseFencedError(topic=self.topic, lease=name, token=token, newer_token=seen)
            log.warning("%s: skipping write %d at offset %d: %s", self.topic, seq, offset, refused)
            return refused
        self.take(fence)
        return None
