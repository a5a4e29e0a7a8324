"""Fencing tokens as state logs see them: a lease name and a token that only grows.

A write to a SharedStateManager may carry a :class:`Fence` (a
:class:`~airflow_provider_pulsarstate.engine.recipes.lease.Lease` is one). Each state log keeps,
per lease name, the highest token it has applied; a write whose token is lower is refused at
append (:class:`~airflow_provider_pulsarstate.engine.errors.LeaseFencedError`) and skipped by every
replica on replay. The log checks tokens, never clocks.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from airflow_provider_pulsarstate.engine.errors import ConfigurationError

MAX_LEASE_NAME_BYTES = 1024


@runtime_checkable
class Fence(Protocol):
    """Anything with a lease ``name`` and a fencing ``token`` (a ``Lease`` handle is one)."""

    @property
    def name(self) -> str: ...

    @property
    def token(self) -> int: ...


def check_fence(fence: object) -> tuple[str, int]:
    """``(name, token)`` of a fence, or ConfigurationError naming what is wrong with it."""
    name = getattr(fence, "name", None)
    token = getattr(fence, "token", None)
    if not isinstance(name, str) or not name.strip():
        raise ConfigurationError(f"lease name must be a non-empty string, got {name!r}")
    if len(name.encode()) > MAX_LEASE_NAME_BYTES:
        raise ConfigurationError(f"lease name {name[:40]!r}... is longer than {MAX_LEASE_NAME_BYTES} bytes")
    if isinstance(token, bool) or not isinstance(token, int) or token < 1:
        raise ConfigurationError(f"fencing token of lease {name!r} must be a positive integer, got {token!r}")
    return name, token
