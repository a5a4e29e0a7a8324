"""Fencing tokens as state logs see them: a lease log, a lease name and a token that only grows.

A write to a SharedStateManager may carry a :class:`Fence` (a
:class:`~airflow_provider_pulsarstate.engine.recipes.lease.Lease` is one). Each state log keeps,
per **(lease log, lease name)**, the highest token it has applied; a write whose token is lower
is refused at append (:class:`~airflow_provider_pulsarstate.engine.errors.LeaseFencedError`) and
skipped by every replica on replay. The log checks tokens, never clocks.

Guarantees:

* **Only granted tokens.** Before a guarded write is queued, its token is checked against the lease
  log it names (:mod:`~airflow_provider_pulsarstate.engine.grants`): a token the lease log never
  granted (forged, or from another deployment) is refused with
  :class:`~airflow_provider_pulsarstate.engine.errors.LeaseNotGrantedError` and never reaches the
  log, so it cannot raise the fence.
* **Keyed by lease log.** The key's lease log is the lease log's topic and its GENESIS log id
  (:func:`lease_log_ref`): two lease logs using the same lease name, or a lease log recreated
  with tokens starting at 1 again, have fences of their own and never block each other.
* **Checked at the boundary.** Names must be non-empty UTF-8 of at most
  :data:`MAX_LEASE_NAME_BYTES` bytes and tokens in ``1 .. 2**64 - 1`` (the log stores a u64);
  anything else is a ConfigurationError naming the field, before anything is queued.
* **Resettable.** A fence that must go (one raised by a forged frame appended with a writer of
  its own, or by a version that did not check grants) is removed by a reset recorded in the log
  (:meth:`~airflow_provider_pulsarstate.engine.manager.SharedStateManager.reset_fence`); every
  replica and checkpoint after it agrees.
* **Old logs.** Frames written before fences were keyed by lease log carry a lease name only;
  they replay under the lease log :data:`LEGACY_LEASE_LOG` (``""``) and keep fencing each other
  as they did, but never block (or are blocked by) writes that name their lease log.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from airflow_provider_pulsarstate.engine.errors import ConfigurationError

MAX_LEASE_NAME_BYTES = 1024
MAX_LEASE_LOG_BYTES = 4096
MAX_TOKEN = 2**64 - 1
"""The largest fencing token a frame can hold (a u64)."""
LEGACY_LEASE_LOG = ""
"""The lease log of fences read from frames that name none (written by earlier versions)."""
ANY_LEASE_LOG = "*"
"""In a reset: every lease log (the legacy one included)."""

FenceKey = tuple[str, str]
"""(lease log reference, lease name): what a state log keeps one highest token for."""


@runtime_checkable
class Fence(Protocol):
    """Anything with a lease ``name``, a fencing ``token`` and the lease log (``topic``) that
    granted it (a ``Lease`` handle is one)."""

    @property
    def name(self) -> str: ...

    @property
    def token(self) -> int: ...

    @property
    def topic(self) -> str: ...


def check_lease_name(name: object, *, field: str = "name") -> str:
    """``name`` if it is a valid lease name, else ConfigurationError naming ``field``."""
    return check_text(name, what="lease name", field=field, limit=MAX_LEASE_NAME_BYTES)


def check_token(token: object, *, name: str) -> int:
    """``token`` if it is a valid fencing token (an int in 1 .. 2**64 - 1), else ConfigurationError."""
    if isinstance(token, bool) or not isinstance(token, int) or token < 1:
        raise ConfigurationError(
            f"fencing token (field 'token') of lease {name!r} must be a positive integer, got {token!r}"
        )
    if token > MAX_TOKEN:
        raise ConfigurationError(
            f"fencing token (field 'token') of lease {name!r} must be below 2**64 (the log stores a u64), got {token}"
        )
    return token


def check_lease_log(topic: object, *, name: str, field: str = "topic") -> str:
    """``topic`` if it can name a lease log, else ConfigurationError naming ``field``."""
    if topic is None:
        raise ConfigurationError(
            f"lease {name!r} names no lease log (field {field!r}): fences are checked against the lease log that granted them"
        )
    return check_text(topic, what=f"lease log of lease {name!r}", field=field, limit=MAX_LEASE_LOG_BYTES)


def check_fence(fence: object) -> tuple[str, str, int]:
    """``(lease log topic, name, token)`` of a fence, or ConfigurationError naming the bad field."""
    name = check_lease_name(getattr(fence, "name", None))
    token = check_token(getattr(fence, "token", None), name=name)
    return check_lease_log(getattr(fence, "topic", None), name=name), name, token


def lease_log_ref(topic: str, log_id: str | None) -> str:
    """How fences name a lease log: its topic and GENESIS log id (``topic#id``), so a recreated
    lease log (same topic, tokens from 1 again) is another lease log. Just the topic for a lease
    log older than GENESIS records."""
    return topic if log_id is None else f"{topic}#{log_id}"


def ref_topic(ref: str) -> str:
    """The topic part of a :func:`lease_log_ref`."""
    return ref.split("#", 1)[0]


def reset_matches(key: FenceKey, *, lease_log: str, name: str) -> bool:
    """Whether a reset of ``name`` in ``lease_log`` (a topic, a ref, or :data:`ANY_LEASE_LOG`) removes ``key``."""
    ref, key_name = key
    if key_name != name:
        return False
    return lease_log == ANY_LEASE_LOG or ref == lease_log or ref_topic(ref) == lease_log


def check_text(value: object, *, what: str, field: str, limit: int) -> str:
    """``value`` if it is non-blank text of at most ``limit`` UTF-8 bytes.

    :raises ConfigurationError: naming ``what`` and ``field``, and the problem.
    """
    if not isinstance(value, str) or not value.strip():
        raise ConfigurationError(f"{what} must be a non-empty string, got {value!r} (field {field!r})")
    try:
        size = len(value.encode())
    except UnicodeEncodeError as exc:
        raise ConfigurationError(
            f"{what} (field {field!r}) is not UTF-8 encodable ({exc.reason} at index {exc.start}): {value[:40]!r}"
        ) from None
    if size > limit:
        raise ConfigurationError(f"{what} (field {field!r}) {value[:40]!r}... is longer than {limit} bytes")
    return value
