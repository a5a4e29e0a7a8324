"""The decisions of a lease log's writes, and the checks around them.

The op generators run on the latest state under the lease log's writer (they may run more than
once: the last run counts): an acquire takes a name only when it is free, expired as observed
here, or stolen; a renew or release only under the token the log holds (else the caller lost it).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

from airflow_provider_pulsarstate.engine.errors import ConfigurationError, LeaseLostError, LeaseTimeoutError
from airflow_provider_pulsarstate.engine.fencing import check_lease_name
from airflow_provider_pulsarstate.engine.recipes.lease_codec import (
    ACQUIRE,
    RELEASE,
    RENEW,
    LeaseRecord,
    check_holder,
    positive,
)
from airflow_provider_pulsarstate.engine.recipes.lease_observer import LeaseObserver, LeaseState
from airflow_provider_pulsarstate.engine.recipes.lease_records import Lease, LeaseInfo

__all__ = [
    "acquire_ops",
    "check_acquire",
    "check_handle",
    "check_ttl",
    "describe_acquisition",
    "lost_error",
    "release_ops",
    "renew_ops",
    "timeout_error",
]

Ops = Callable[[LeaseState], list[dict[str, Any]]]


def check_acquire(name: object, holder: object, ttl: object, timeout: object) -> float:
    """The arguments of an acquire checked; returns the ttl as a float.

    :raises ConfigurationError: bad name, holder, ttl or timeout (names which).
    """
    check_lease_name(name)
    check_holder(holder)
    if not positive(ttl):
        raise ConfigurationError(f"lease {name!r}: ttl must be a positive number of seconds, got {ttl!r}")
    if timeout is not None and (
        isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not math.isfinite(timeout) or timeout < 0
    ):
        raise ConfigurationError(f"lease {name!r}: timeout must be None or a number of seconds >= 0, got {timeout!r}")
    return float(ttl)


def check_ttl(lease: Lease, ttl: float | None) -> float:
    """The ttl a renew grants (``lease``'s own when None).

    :raises ConfigurationError: not a positive number.
    """
    new_ttl = lease.ttl if ttl is None else ttl
    if not positive(new_ttl):
        raise ConfigurationError(f"lease {lease.name!r}: ttl must be a positive number of seconds, got {ttl!r}")
    return float(new_ttl)


def check_handle(topic: str, lease: object) -> None:
    """:raises ConfigurationError: ``lease`` is not a :class:`Lease` of the lease log ``topic``."""
    if not isinstance(lease, Lease):
        raise ConfigurationError(f"expected a Lease handle (Lease.from_json reads one), got {type(lease).__name__}")
    if lease.topic != topic:
        raise ConfigurationError(
            f"lease {lease.name!r} (token {lease.token}) belongs to lease log {lease.topic!r}, not {topic!r}"
        )


def acquire_ops(
    observer: LeaseObserver, name: str, holder: str, ttl: float, steal: bool, outcome: dict[str, Any]
) -> Ops:
    """The ops of one acquire attempt; fills ``outcome`` with what the last run decided.

    ``outcome``: ``token`` (taken), ``previous`` holder, ``expired``, ``stolen``; or only
    ``expires_in`` (held and valid: nothing appended).
    """

    def ops(state: LeaseState) -> list[dict[str, Any]]:
        outcome.clear()  # runs again on the latest state under the writer: the last run counts
        rec = state.get(name)
        expired = False
        if rec is not None and rec.holder is not None and rec.holder != holder:
            left = observer.expires_in(name, rec)
            expired = left < 0
            if not expired and not steal:
                outcome["expires_in"] = left
                return []
        token = (rec.token if rec is not None else 0) + 1
        outcome.update(
            token=token,
            previous=rec.holder if rec is not None else None,
            expired=expired,
            stolen=steal and rec is not None and rec.holder not in (None, holder) and not expired,
        )
        return [{"op": ACQUIRE, "name": name, "holder": holder, "token": token, "ttl": ttl, "at": time.time()}]

    return ops


def describe_acquisition(outcome: dict[str, Any], holder: str) -> str:
    """How an acquire won: from a valid holder, after expiry, by re-acquisition, or free."""
    if outcome.get("stolen"):
        return "stolen from a valid holder"
    if outcome.get("expired"):
        return "after expiry"
    return "re-acquired" if outcome.get("previous") == holder else "free"


def timeout_error(topic: str, name: str, info: LeaseInfo | None, timeout: float) -> LeaseTimeoutError:
    """The error of an acquire whose ``timeout`` ran out with the lease still held (or not won)."""
    if info is not None and info.held:
        message = (
            f"{topic}: lease {name!r} is still held by {info.holder!r} with token {info.token} (observed "
            f"{info.observed_age:.1f}s ago, ttl {info.ttl:g}s) after {timeout:g}s"
        )
    else:
        message = f"{topic}: lease {name!r} was not won within {timeout:g}s"
    return LeaseTimeoutError(message, lease=name, current=info)


def _holds(rec: LeaseRecord | None, lease: Lease) -> bool:
    return rec is not None and rec.holder == lease.holder and rec.token == lease.token


def renew_ops(observer: LeaseObserver, lease: Lease, ttl: float) -> Ops:
    """The op renewing ``lease`` for ``ttl``.

    :raises LeaseLostError: (when run) the log holds another token or holder, or none.
    """

    def ops(state: LeaseState) -> list[dict[str, Any]]:
        if not _holds(state.get(lease.name), lease):
            raise lost_error(observer.topic, lease, observer.info(state, lease.name), "renew")
        return [
            {
                "op": RENEW,
                "name": lease.name,
                "holder": lease.holder,
                "token": lease.token,
                "ttl": ttl,
                "at": time.time(),
            }
        ]

    return ops


def release_ops(lease: Lease, done: list[bool]) -> Ops:
    """The op releasing ``lease`` if it still holds the name (none otherwise); ``done[0]`` says which."""

    def ops(state: LeaseState) -> list[dict[str, Any]]:
        done[0] = _holds(state.get(lease.name), lease)
        if not done[0]:
            return []
        return [{"op": RELEASE, "name": lease.name, "holder": lease.holder, "token": lease.token, "at": time.time()}]

    return ops


def lost_error(topic: str, lease: Lease, info: LeaseInfo | None, what: str) -> LeaseLostError:
    """The error saying ``lease`` no longer holds its name, and what the log holds instead."""
    if info is None:
        now = "the lease log has no such lease"
    elif info.holder is None:
        now = f"it was released (the last token granted is {info.token})"
    else:
        now = f"it is held by {info.holder!r} with token {info.token}"
    return LeaseLostError(
        f"{topic}: cannot {what} lease {lease.name!r} of {lease.holder!r} with token {lease.token}: {now}",
        lease=lease.name,
        token=lease.token,
        current=info,
    )
