"""The records of leases: :class:`Lease` (a granted lease, the handle a holder keeps and passes on),
:class:`LeaseInfo` (a lease as the log and this process see it) and :class:`LeaseTransition` (one
change of holder). Frozen: they describe the lease log, they do not change it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from airflow_provider_pulsarstate.engine.errors import ConfigurationError
from airflow_provider_pulsarstate.engine.fencing import check_lease_log, check_lease_name, check_token
from airflow_provider_pulsarstate.engine.recipes.lease_codec import check_holder

__all__ = ["Lease", "LeaseInfo", "LeaseTransition"]


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
    def from_json(cls, data: Mapping[str, Any] | str) -> Lease:
        """A lease from :meth:`to_json`'s output (a dict or its JSON text), checked field by field.

        Only the shape is checked here (a name that is UTF-8 text, a token a frame can hold: 1 ..
        2**64 - 1); :meth:`Leases.renew` checks it against the lease log, and so does every
        guarded write.

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
        name = check_lease_name(data["name"])
        token = check_token(data["token"], name=name)
        holder, ttl = check_holder(data["holder"]), data["ttl"]
        if isinstance(ttl, bool) or not isinstance(ttl, (int, float)) or not math.isfinite(ttl) or ttl <= 0:
            raise ConfigurationError(f"lease {name!r}: field 'ttl' must be a positive number of seconds, got {ttl!r}")
        topic = check_lease_log(data["topic"], name=name)
        return cls(name=name, holder=holder, token=token, ttl=float(ttl), topic=topic)


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
            "name": self.name,
            "holder": self.holder,
            "token": self.token,
            "ttl": self.ttl,
            "acquired_at": self.acquired_at,
            "renewed_at": self.renewed_at,
            "transitions": self.transitions,
            "observed_age": round(self.observed_age, 3),
            "held": self.held,
            "expired": self.expired,
            "offset": self.offset,
        }


@dataclass(frozen=True, slots=True)
class LeaseTransition:
    """One change of a lease's holder as the lease log recorded it (:meth:`Leases.transitions`).

    :ivar name: the lease name.
    :ivar event: ``acquired`` (``holder`` took it with ``token``), ``released`` (``holder`` gave
        token ``token`` back), ``expired`` (``holder``'s token ``token`` ran out before the next
        acquire) or ``superseded`` (``holder``'s still valid token ``token`` was replaced by the
        next acquire: a steal, or a re-acquisition by the same holder).
    :ivar holder: whose token the event concerns.
    :ivar token: the fencing token (epoch) concerned.
    :ivar at: wall-clock time of the event (the writer's clock; for an expiry, the end of the last
        ttl granted); for display only.
    :ivar offset: the lease log offset of the op that recorded it.
    :ivar ttl: the ttl granted (``acquired``), else None.
    """

    name: str
    event: str
    holder: str
    token: int
    at: float
    offset: int
    ttl: float | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "event": self.event,
            "holder": self.holder,
            "token": self.token,
            "at": self.at,
            "offset": self.offset,
            "ttl": self.ttl,
        }
