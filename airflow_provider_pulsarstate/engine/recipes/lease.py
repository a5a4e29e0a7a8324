"""Leases: leadership that spans processes, with fencing tokens (the kazoo Lock/Election recipe, durable).

An exclusive producer lives and dies with one connection; a lease lives in a log. Each lease name
in a lease log has at most one holder at a time; every acquisition gets a **fencing token** that
strictly increases for that name (one more than the previous token of that name, starting at 1)
across holders, re-acquisitions, broker restarts and takeovers, and that is durable in the lease
log before :meth:`Leases.acquire` returns it.

Clocks. Safety never depends on synchronised wall clocks:

* a holder measures its lease's validity on its own monotonic clock from when it *sent* its
  acquire or renew (:meth:`Leases.remaining`): it stops believing it holds the lease no later
  than anybody else may take it;
* a challenger measures expiry from when *it observed* the last acquire or renew (replaying or
  following the lease log): a lease is taken over only after ``ttl`` of silence as seen locally.
  A process that starts now and finds a held lease waits a full ``ttl`` before taking it.

Expiry gives liveness only. Safety comes from the token: pass the :class:`Lease` to the writes it
guards (``PulsarMap.put(..., lease=lease)``, ``StateTable.apply(..., lease=lease)``,
``SharedStateManager.write(..., lease=lease)``); each state log refuses a token lower than one it
has seen for that name (:class:`~airflow_provider_pulsarstate.engine.errors.LeaseFencedError`),
so a holder that was paused past expiry and wakes up after a new holder wrote changes nothing.

Example::

    backend = open_backend(ConnectionConfig(url="pulsar://localhost:6650"))
    with Leases(backend) as leases, PulsarMap(backend, "persistent://public/default/assignments") as table:
        lease = leases.acquire("nightly-load", holder="deployment-a", ttl=30.0, timeout=60.0)
        try:
            table.put("shard-1", {"owner": "deployment-a"}, lease=lease)
            lease = leases.renew(lease)           # before remaining(lease) runs out
        finally:
            leases.release(lease)

A :class:`Lease` travels between processes (Airflow XCom) as :meth:`Lease.to_json`; the receiving
process calls :meth:`Leases.renew` first, which re-validates it against the lease log.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from airflow_provider_pulsarstate.engine.backends.base import Backend
from airflow_provider_pulsarstate.engine.errors import ConfigurationError
from airflow_provider_pulsarstate.engine.fencing import check_fence
from airflow_provider_pulsarstate.engine.recipes.base import Recipe

DEFAULT_LEASE_TOPIC = "pulsarstate-leases"
"""The lease log's short name (resolved with the connection's tenant and namespace)."""


@dataclass(frozen=True, slots=True)
class Lease:
    """A lease as granted: what a holder keeps, passes to guarded writes and sends as XCom.

    :ivar name: the lease name (unique within its lease log).
    :ivar holder: who holds it (free text chosen by the acquirer, e.g. a deployment or run id).
    :ivar token: the fencing token; strictly increasing per name.
    :ivar ttl: seconds the lease stays valid after each acquire or renew.
    :ivar topic: the lease log it lives in (full topic name).
    """

    name: str
    holder: str
    token: int
    ttl: float
    topic: str

    def to_json(self) -> dict[str, Any]:
        """Plain JSON (for XCom); :meth:`from_json` reads it back."""
        return {"name": self.name, "holder": self.holder, "token": self.token, "ttl": self.ttl, "topic": self.topic}

    @classmethod
    def from_json(cls, data: Mapping[str, Any] | str) -> "Lease":
        """A lease from :meth:`to_json`'s output (a dict or its JSON text), checked field by field.

        Only the shape is checked here; :meth:`Leases.renew` checks it against the lease log.

        :raises ConfigurationError: not a lease: names the missing or bad field.
        """
        if isinstance(data, str):
            try:
                data = json.loads(data)
            except ValueError as exc:
                raise ConfigurationError(f"lease handle is not JSON: {exc}") from None
        if not isinstance(data, Mapping):
            raise ConfigurationError(f"lease handle must be a JSON object, got {type(data).__name__}")
        missing = [f for f in ("name", "holder", "token", "ttl", "topic") if f not in data]
        if missing:
            raise ConfigurationError(f"lease handle lacks field(s) {', '.join(missing)}")
        name, token = check_fence(_Fields(data["name"], data["token"]))
        holder, ttl, topic = data["holder"], data["ttl"], data["topic"]
        if not isinstance(holder, str) or not holder:
            raise ConfigurationError(f"lease {name!r}: field 'holder' must be a non-empty string, got {holder!r}")
        if isinstance(ttl, bool) or not isinstance(ttl, (int, float)) or not math.isfinite(ttl) or ttl <= 0:
            raise ConfigurationError(f"lease {name!r}: field 'ttl' must be a positive number of seconds, got {ttl!r}")
        if not isinstance(topic, str) or not topic:
            raise ConfigurationError(f"lease {name!r}: field 'topic' must be a non-empty string, got {topic!r}")
        return cls(name=name, holder=holder, token=token, ttl=float(ttl), topic=topic)


@dataclass(frozen=True, slots=True)
class _Fields:
    name: Any
    token: Any


@dataclass(frozen=True, slots=True)
class LeaseInfo:
    """A lease as the lease log and this process see it (:meth:`Leases.describe`).

    :ivar name: the lease name.
    :ivar holder: the current holder, or None when released (or never held).
    :ivar token: the last token granted for the name (0: never acquired).
    :ivar ttl: the ttl of the last acquire or renew.
    :ivar acquired_at: wall-clock time (the acquirer's clock) of the last acquisition; for display only.
    :ivar renewed_at: wall-clock time (the holder's clock) of the last renewal; for display only.
    :ivar transitions: how many times the holder changed (a Kubernetes Lease's leaseTransitions).
    :ivar observed_age: seconds since THIS process observed the last acquire or renew (monotonic).
    :ivar offset: the lease log offset of that acquire or renew.
    """

    name: str
    holder: str | None
    token: int
    ttl: float
    acquired_at: float
    renewed_at: float
    transitions: int
    observed_age: float
    offset: int

    @property
    def held(self) -> bool:
        return self.holder is not None

    @property
    def expired(self) -> bool:
        """Held, but silent for longer than its ttl as observed here: a challenger may take it."""
        return self.held and self.observed_age > self.ttl

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name, "holder": self.holder, "token": self.token, "ttl": self.ttl,
            "acquired_at": self.acquired_at, "renewed_at": self.renewed_at, "transitions": self.transitions,
            "observed_age": round(self.observed_age, 3), "held": self.held, "expired": self.expired,
            "offset": self.offset,
        }


class Leases(Recipe):
    """Durable leases with fencing tokens, kept in one lease log (a SharedStateManager underneath).

    Construction does no I/O.

    :param backend: where the lease log lives.
    :param topic: the lease log (a full topic name).
    :param operation_timeout: seconds one append or catch-up may take.
    :param poll_interval: how often a waiting :meth:`acquire` re-reads the log when it has not
        been woken by a change (seconds).
    :param clock: the monotonic clock (injectable for tests; never wall time).
    :param options: further SharedStateManager options.
    """

    def __init__(
        self,
        backend: Backend,
        topic: str,
        *,
        operation_timeout: float = 30.0,
        poll_interval: float = 0.5,
        clock: Callable[[], float] | None = None,
        **options: Any,
    ) -> None:
        raise NotImplementedError  # issue 9, in progress

    def acquire(
        self, name: str, holder: str, *, ttl: float, timeout: float | None = None, steal: bool = False
    ) -> Lease:
        """Wait until ``name`` is free or expired (as observed here), take it, return the lease.

        The new token is durable in the lease log when this returns. A holder acquiring its own
        still-valid lease again gets a new, higher token (a re-acquisition).

        :param holder: non-empty text naming the holder.
        :param ttl: seconds the lease stays valid after this acquire (and after each renew).
        :param timeout: seconds to wait (0: one attempt; None: as long as it takes).
        :param steal: take it over even though its holder's lease is still valid (explicit takeover).
        :raises LeaseTimeoutError: still held and valid when ``timeout`` ran out (``err.current``).
        :raises ConfigurationError: bad name, holder or ttl.
        """
        raise NotImplementedError

    def renew(self, lease: Lease, *, ttl: float | None = None) -> Lease:
        """Extend ``lease`` by its ttl (or a new ``ttl``) from now; also re-validates a handle that
        came from another process. Allowed after expiry as long as nobody took the lease over.

        :returns: the lease (same token) with the ttl in force.
        :raises LeaseLostError: the lease log holds another token or holder for the name, or the
            lease was released.
        """
        raise NotImplementedError

    def release(self, lease: Lease) -> bool:
        """Give the lease up if ``lease`` still holds it; idempotent.

        :returns: True when this call released it; False when it was already released or is held
            under another token (nothing is changed then).
        """
        raise NotImplementedError

    def describe(self, name: str, *, latest: bool = True) -> LeaseInfo | None:
        """The lease as the log says now, without acquiring (None: never acquired in this log)."""
        raise NotImplementedError

    def watch(self, name: str, callback: Callable[[LeaseInfo], None]) -> Callable[[], None]:
        """Call ``callback`` with the new :class:`LeaseInfo` after every change of ``name``
        (acquire, renew, release, takeover) that this process observes; returns a function that
        stops the watch. Starts following the log in the background."""
        raise NotImplementedError

    def remaining(self, lease: Lease) -> float:
        """Seconds this process may still treat ``lease`` as held: its ttl minus the monotonic time
        since this process sent the acquire or renew that granted it (0.0 when it never did here,
        e.g. a handle from another process not renewed yet)."""
        raise NotImplementedError
