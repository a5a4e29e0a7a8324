"""What one process observes of a lease log: it folds the log's ops into the replicated state and
remembers, locally, when it saw each lease's last acquire or renew, when it sent its own, and the
holder changes it applied.

Nothing here is replicated or checkpointed: a challenger measures expiry from when *it* observed
the last acquire or renew, a holder its validity from when *it* sent it, each on its own clock.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable
from typing import Any

from airflow_provider_pulsarstate.engine.recipes.lease_codec import ACQUIRE, RENEW, LeaseRecord, deserialize_image
from airflow_provider_pulsarstate.engine.recipes.lease_records import Lease, LeaseInfo, LeaseTransition

log = logging.getLogger(__name__)

__all__ = ["MAX_TRANSITIONS_KEPT", "LeaseObserver"]

MAX_TRANSITIONS_KEPT = 1000
"""Most lease transitions one :class:`~airflow_provider_pulsarstate.engine.recipes.lease.Leases` remembers (the oldest go first)."""

LeaseState = dict[str, LeaseRecord]


class LeaseObserver:
    """The applier of a lease log's replica and this process's observations of it.

    :param topic: the lease log (for messages).
    :param clock: the clock observations are measured on (never wall time).
    """

    def __init__(self, topic: str, clock: Callable[[], float]) -> None:
        self.topic = topic
        self.clock = clock
        # name -> (fingerprint of its last acquire/renew, when this process observed it)
        self._observed: dict[str, tuple[tuple[int, int, float], float]] = {}
        # (name, token) -> (when this process sent the acquire/renew that granted it, its ttl)
        self._sent: dict[tuple[str, int], tuple[float, float]] = {}
        self._sent_lock = threading.Lock()
        # Transitions seen by this replica's applier, oldest first; a rebuild replays ops already
        # recorded, so each is kept once (by offset, name, token and event).
        self._history: deque[LeaseTransition] = deque(maxlen=MAX_TRANSITIONS_KEPT)
        self._history_keys: set[tuple[int, str, int, str]] = set()
        self._history_lock = threading.Lock()

    # ------------------------------------------------------------------ the fold
    def apply(self, state: LeaseState, op: dict[str, Any], offset: int) -> None:
        """Apply one validated op. An op that does not fit the state (a token that is not the
        next one, a renew or release of another token) is logged and ignored by every replica alike."""
        name, kind, token, holder = op["name"], op["op"], op["token"], op["holder"]
        rec = state.get(name)
        if kind == ACQUIRE:
            self._apply_acquire(state, op, offset)
            return
        if rec is None or rec.holder != holder or rec.token != token:
            log.warning(
                "%s: ignoring the %s of lease %r at offset %d: token %d of %r is not the current one",
                self.topic,
                kind,
                name,
                offset,
                token,
                holder,
            )
            return
        if kind == RENEW:
            rec.ttl, rec.renewed_at, rec.offset = op["ttl"], op["at"], offset
            self._observe(name, rec)
        else:
            self._record(LeaseTransition(name, "released", holder, token, op.get("at", 0.0), offset))
            rec.holder = None

    def _apply_acquire(self, state: LeaseState, op: dict[str, Any], offset: int) -> None:
        name, token, holder = op["name"], op["token"], op["holder"]
        rec = state.get(name)
        expected = (rec.token if rec is not None else 0) + 1
        if token != expected:
            log.warning(
                "%s: ignoring the acquire of lease %r at offset %d: token %d, expected %d",
                self.topic,
                name,
                offset,
                token,
                expected,
            )
            return
        transitions = 0 if rec is None else rec.transitions + (rec.holder != holder)
        if rec is not None and rec.holder is not None:
            ends = rec.renewed_at + rec.ttl
            ended = "expired" if op["at"] >= ends else "superseded"
            at = ends if ended == "expired" else op["at"]
            self._record(LeaseTransition(name, ended, rec.holder, rec.token, at, offset))
        self._record(LeaseTransition(name, "acquired", holder, token, op["at"], offset, op["ttl"]))
        state[name] = rec = LeaseRecord(holder, token, op["ttl"], op["at"], op["at"], transitions, offset)
        self._observe(name, rec)

    def load_image(self, data: bytes) -> LeaseState:
        """The state a checkpoint image holds; every lease in it counts as observed now."""
        state = deserialize_image(data)
        for name, rec in state.items():
            self._observe(name, rec)
        return state

    # ------------------------------------------------------------------ observations
    def observed_at(self, name: str, rec: LeaseRecord) -> float:
        """When this process observed ``rec``'s last acquire/renew (first look, if never recorded)."""
        entry = self._observed.get(name)
        if entry is not None and entry[0] == rec.fingerprint():
            return entry[1]
        now = self.clock()
        self._observed[name] = (rec.fingerprint(), now)
        return now

    def _observe(self, name: str, rec: LeaseRecord) -> None:
        # A rebuild replays what was already observed: keep the earlier time for the same op.
        entry = self._observed.get(name)
        if entry is None or entry[0] != rec.fingerprint():
            self._observed[name] = (rec.fingerprint(), self.clock())

    def expires_in(self, name: str, rec: LeaseRecord) -> float:
        """Seconds until ``rec``'s holder may be taken over, as observed here (negative: expired)."""
        return rec.ttl - (self.clock() - self.observed_at(name, rec))

    def info(self, state: LeaseState, name: str) -> LeaseInfo | None:
        """The lease ``name`` as ``state`` and this process see it (None: never acquired)."""
        rec = state.get(name)
        if rec is None:
            return None
        return LeaseInfo(
            name=name,
            holder=rec.holder,
            token=rec.token,
            ttl=rec.ttl,
            acquired_at=rec.acquired_at,
            renewed_at=rec.renewed_at,
            transitions=rec.transitions,
            observed_age=max(0.0, self.clock() - self.observed_at(name, rec)),
            offset=rec.offset,
        )

    # ------------------------------------------------------------------ what this process sent
    def granted(self, name: str, token: int, sent: float, ttl: float, *, renewal: bool = False) -> None:
        """This process sent the acquire (or renew) that granted ``token`` at ``sent``, for ``ttl``.

        A renewal never moves the time back (a slower renew answered after a faster one)."""
        key = (name, token)
        with self._sent_lock:
            if not renewal or key not in self._sent or self._sent[key][0] <= sent:
                self._sent[key] = (sent, ttl)

    def remaining(self, lease: Lease) -> float:
        """Seconds left of ``lease``'s validity as this process counts it (0.0: never sent here)."""
        with self._sent_lock:
            entry = self._sent.get((lease.name, lease.token))
        if entry is None:
            return 0.0
        sent, ttl = entry
        return max(0.0, ttl - (self.clock() - sent))

    def forget(self, lease: Lease) -> None:
        with self._sent_lock:
            self._sent.pop((lease.name, lease.token), None)

    # ------------------------------------------------------------------ transitions
    def _record(self, transition: LeaseTransition) -> None:
        key = (transition.offset, transition.name, transition.token, transition.event)
        with self._history_lock:
            if key in self._history_keys:
                return
            if len(self._history) == self._history.maxlen:
                old = self._history[0]
                self._history_keys.discard((old.offset, old.name, old.token, old.event))
            self._history.append(transition)
            self._history_keys.add(key)

    def transitions(self, name: str | None, limit: int) -> list[LeaseTransition]:
        """The newest ``limit`` transitions applied here (of ``name``, or of every lease), newest first."""
        with self._history_lock:
            items = [t for t in reversed(self._history) if name is None or t.name == name]
        return items[:limit]
