"""Leases: leadership that spans processes, with fencing tokens (the kazoo Lock/Election recipe, durable).

An exclusive producer lives and dies with one connection; a lease lives in a log. Each lease name
in a lease log has at most one holder at a time; every acquisition gets a **fencing token** that
strictly increases for that name (one more than the previous token of that name, starting at 1)
across holders, re-acquisitions, broker restarts and takeovers, and that is durable in the lease
log before :meth:`Leases.acquire` returns it.

Clocks. Safety never depends on synchronised wall clocks:

* a holder measures its lease's validity on its own clock from when it *sent* its acquire or
  renew (:meth:`Leases.remaining`): it stops believing it holds the lease no later than anybody
  else may take it. The clock keeps running while the machine is suspended (:func:`boot_clock`,
  ``CLOCK_BOOTTIME`` on Linux): a holder resumed after a suspend does not overstate its validity;
* :class:`LeaseKeeper` renews in the background and calls ``on_lost`` at the latest when that
  validity runs out, even while a renew call is still blocked;
* a challenger measures expiry from when *it observed* the last acquire or renew (replaying or
  following the lease log): a lease is taken over only after ``ttl`` of silence as seen locally.
  A process that starts now and finds a held lease waits a full ``ttl`` before taking it.

Expiry gives liveness only. Safety comes from the token: pass the :class:`Lease` to the writes it
guards (``PulsarMap.put(..., lease=lease)``, ``StateTable.apply(..., lease=lease)``,
``SharedStateManager.write(..., lease=lease)``); each state log refuses a token this lease log
never granted (:class:`~airflow_provider_pulsarstate.engine.errors.LeaseNotGrantedError`) and a
token lower than one it has seen for that name of this lease log
(:class:`~airflow_provider_pulsarstate.engine.errors.LeaseFencedError`), so a holder that was
paused past expiry and wakes up after a new holder wrote changes nothing, and a forged handle
changes nothing either.

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
import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from airflow_provider_pulsarstate.engine.backends.base import AcquireMode, Backend
from airflow_provider_pulsarstate.engine.errors import (
    BackendUnavailableError,
    ConfigurationError,
    LeaseLostError,
    LeaseTimeoutError,
    UnknownOutcomeError,
    WriterBusyError,
    WriterFencedError,
)
from airflow_provider_pulsarstate.engine.fencing import (
    MAX_LEASE_NAME_BYTES,
    MAX_TOKEN,
    check_lease_log,
    check_lease_name,
    check_token,
)
from airflow_provider_pulsarstate.engine.manager import Change, SharedStateManager, json_op_serializer
from airflow_provider_pulsarstate.engine.recipes.base import Recipe
from airflow_provider_pulsarstate.engine.retry import Backoff

log = logging.getLogger(__name__)

DEFAULT_LEASE_TOPIC = "pulsarstate-leases"
"""The lease log's short name (resolved with the connection's tenant and namespace)."""

DEFAULT_CHECKPOINT_AFTER_BYTES = 1 << 20
"""Lease logs live forever and grow with every renew; their state is tiny, so image it often."""

MAX_HOLDER_BYTES = 1024
_ACQUIRE, _RENEW, _RELEASE = "acquire", "renew", "release"
_IMAGE_VERSION = 1
MAX_TRANSITIONS_KEPT = 1000
"""Most lease transitions one :class:`Leases` remembers (the oldest go first)."""
_BOOT_CLOCK_ID: int | None = getattr(time, "CLOCK_BOOTTIME", None)


def boot_clock() -> float:
    """Seconds on a clock that never goes back and keeps counting while the machine is suspended
    (``CLOCK_BOOTTIME`` on Linux; ``time.monotonic`` where there is none). The default clock of
    :class:`Leases`: ``time.monotonic`` stops during a suspend, so a holder resumed from one would
    believe its lease valid for longer than a challenger does."""
    if _BOOT_CLOCK_ID is None:
        return time.monotonic()
    return time.clock_gettime(_BOOT_CLOCK_ID)


_CONTENDED = (WriterFencedError, WriterBusyError, UnknownOutcomeError, BackendUnavailableError)
"""An attempt that decided nothing: candidates fenced each other's lease-log writer, or the log was unreachable."""


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
        holder, ttl = _check_holder(data["holder"]), data["ttl"]
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


@dataclass(slots=True)
class _Record:
    """One name's entry in the replicated state (mutated in place by the applier)."""

    holder: str | None
    token: int
    ttl: float
    acquired_at: float
    renewed_at: float
    transitions: int
    offset: int  # of the last acquire or renew

    def fingerprint(self) -> tuple[int, int, float]:
        """Identifies the acquire/renew this record last took in (stable across replays)."""
        return (self.offset, self.token, self.renewed_at)


class Leases(Recipe):
    """Durable leases with fencing tokens, kept in one lease log (a SharedStateManager underneath).

    Every operation is a read-modify-write on the latest state under the lease log's exclusive
    writer, so a token is always the previous token of the name + 1 and two acquirers can never
    both win. The lease log's writer is taken with fencing (``acquire_mode="fence"``): a holder
    paused while holding it (a frozen VM, SIGSTOP) cannot block everybody else.

    Example::

        with Leases(backend, "persistent://public/default/pulsarstate-leases") as leases:
            lease = leases.acquire("nightly-load", holder="deployment-a", ttl=30.0, timeout=60.0)
            try:
                ...  # guarded writes pass lease=lease; renew before leases.remaining(lease) runs out
                lease = leases.renew(lease)
            finally:
                leases.release(lease)

    Construction does no I/O.

    :param backend: where the lease log lives.
    :param topic: the lease log (a full topic name).
    :param operation_timeout: seconds one append or catch-up may take.
    :param poll_interval: how often a waiting :meth:`acquire` re-reads the log when it has not
        been woken by a change (seconds); also the follow interval of :meth:`watch`.
    :param clock: the clock validity and expiry are measured on (default :func:`boot_clock`, which
        keeps counting through a suspend; injectable for tests; never wall time).
    :param options: further SharedStateManager options (``acquire_mode`` defaults to ``"fence"``,
        ``max_retries`` to 10, ``writer_idle_timeout`` to 1 s, ``checkpoint_after_bytes`` to 1 MiB).
    :raises CorruptEntryError: (from any call) the lease log holds an entry that is not a valid
        lease op; the message names the offset and the bad field.
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
        if not isinstance(topic, str) or not topic:
            raise ConfigurationError(f"lease log topic must be a non-empty string, got {topic!r}")
        if not _positive(poll_interval):
            raise ConfigurationError(f"poll_interval must be a positive number of seconds, got {poll_interval!r}")
        self.topic = topic
        self.poll_interval = float(poll_interval)
        self._clock = clock or boot_clock
        # Local, never replicated or checkpointed: when this process observed each name's last
        # acquire/renew ((fingerprint, monotonic time)), and when it sent its own ((name, token) -> (time, ttl)).
        self._observed: dict[str, tuple[tuple[int, int, float], float]] = {}
        self._sent: dict[tuple[str, int], tuple[float, float]] = {}
        self._sent_lock = threading.Lock()
        self.contended = 0
        """Attempts that decided nothing because the lease log's writer was contended (retried)."""
        self._changed = threading.Condition()
        # Transitions seen by this replica's applier, oldest first; a rebuild replays ops already
        # recorded, so each is kept once (by offset, name, token and event).
        self._history: deque[LeaseTransition] = deque(maxlen=MAX_TRANSITIONS_KEPT)
        self._history_keys: set[tuple[int, str, int, str]] = set()
        self._history_lock = threading.Lock()
        options.setdefault("acquire_mode", AcquireMode.FENCE)
        options.setdefault("max_retries", 10)
        options.setdefault("writer_idle_timeout", 1.0)
        options.setdefault("checkpoint_after_bytes", DEFAULT_CHECKPOINT_AFTER_BYTES)
        self.manager: SharedStateManager[dict[str, _Record], dict[str, Any]] = SharedStateManager(
            backend,
            topic,
            initializer=dict,
            applier=self._apply,
            op_serializer=json_op_serializer,
            op_deserializer=parse_lease_op,
            state_serializer=_serialize_image,
            state_deserializer=self._deserialize_image,
            operation_timeout=operation_timeout,
            follow_interval=self.poll_interval,
            **options,
        )
        self.manager.add_listener(self._wake)

    def start(self) -> Leases:
        """Replay the lease log now instead of on first use (no background following: :meth:`watch` starts that)."""
        self.manager.read(lambda s: None)
        return self

    # ------------------------------------------------------------------ operations
    def acquire(
        self, name: str, holder: str, *, ttl: float, timeout: float | None = None, steal: bool = False
    ) -> Lease:
        """Wait until ``name`` is free or expired (as observed here), take it, return the lease.

        The new token is durable in the lease log when this returns. A holder acquiring its own
        still-valid lease again gets a new, higher token (a re-acquisition).

        :param holder: non-empty text naming the holder.
        :param ttl: seconds the lease stays valid after this acquire (and after each renew).
        :param timeout: seconds to wait (0: one attempt; None: as long as it takes). The attempt
            running when it ends is completed (bounded by the manager's own time-outs). An attempt
            that decided nothing (candidates fenced each other's lease-log writer, or the log was
            unreachable) is retried for at least ``operation_timeout``, also with ``timeout=0``.
        :param steal: take it over even though its holder's lease is still valid (explicit takeover).
        :raises LeaseTimeoutError: still held and valid when ``timeout`` ran out (``err.current``),
            or the lease log stayed contended or unreachable (``__cause__``).
        :raises ConfigurationError: bad name, holder, ttl or timeout.
        """
        _check_name(name)
        _check_holder(holder)
        if not _positive(ttl):
            raise ConfigurationError(f"lease {name!r}: ttl must be a positive number of seconds, got {ttl!r}")
        if timeout is not None and (
            isinstance(timeout, bool)
            or not isinstance(timeout, (int, float))
            or not math.isfinite(timeout)
            or timeout < 0
        ):
            raise ConfigurationError(
                f"lease {name!r}: timeout must be None or a number of seconds >= 0, got {timeout!r}"
            )
        ttl = float(ttl)
        deadline = None if timeout is None else self._clock() + timeout
        while True:
            outcome: dict[str, Any] = {}
            sent = self._clock()
            info = self._write(
                self._acquire_ops(name, holder, ttl, steal, outcome),
                lambda s: self._info(s, name),
                what=f"acquire lease {name!r} for {holder!r}",
                lease=name,
                until=math.inf if deadline is None else deadline,
            )
            token = outcome.get("token")
            if token is not None and info is not None and info.token == token and info.holder == holder:
                with self._sent_lock:
                    self._sent[(name, token)] = (sent, ttl)
                previous = outcome.get("previous")
                how = (
                    "stolen from a valid holder"
                    if outcome.get("stolen")
                    else "after expiry"
                    if outcome.get("expired")
                    else "re-acquired"
                    if previous == holder
                    else "free"
                )
                log.info(
                    "%s: lease %r acquired by %r with token %d (previous holder %r, %s)",
                    self.topic,
                    name,
                    holder,
                    token,
                    previous,
                    how,
                )
                return Lease(name=name, holder=holder, token=token, ttl=ttl, topic=self.topic)
            now = self._clock()
            if deadline is not None and now >= deadline:
                held = (
                    f"held by {info.holder!r} with token {info.token}" if info is not None and info.held else "not won"
                )
                raise LeaseTimeoutError(
                    f"{self.topic}: lease {name!r} is still {held} (observed {info.observed_age:.1f}s ago, ttl "
                    f"{info.ttl:g}s) after {timeout:g}s"
                    if info is not None and info.held
                    else f"{self.topic}: lease {name!r} was not won within {timeout:g}s",
                    lease=name,
                    current=info,
                )
            wait = min(self.poll_interval, outcome.get("expires_in", self.poll_interval))
            if deadline is not None:
                wait = min(wait, deadline - now)
            with self._changed:
                self._changed.wait(timeout=max(0.001, wait))

    def _acquire_ops(
        self, name: str, holder: str, ttl: float, steal: bool, outcome: dict[str, Any]
    ) -> Callable[[dict[str, _Record]], list[dict[str, Any]]]:
        def ops(state: dict[str, _Record]) -> list[dict[str, Any]]:
            outcome.clear()  # runs again on the latest state under the writer: the last run counts
            rec = state.get(name)
            expired = False
            if rec is not None and rec.holder is not None and rec.holder != holder:
                left = rec.ttl - (self._clock() - self._observed_at(name, rec))
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
            return [{"op": _ACQUIRE, "name": name, "holder": holder, "token": token, "ttl": ttl, "at": time.time()}]

        return ops

    def renew(self, lease: Lease, *, ttl: float | None = None, timeout: float | None = None) -> Lease:
        """Extend ``lease`` by its ttl (or a new ``ttl``) from now; also re-validates a handle that
        came from another process. Allowed after expiry as long as nobody took the lease over.

        :param timeout: stop retrying a contended or unreachable lease log after this many seconds
            (None: at least ``operation_timeout``). One attempt already sent is not interrupted:
            :class:`LeaseKeeper` does not wait for it to tell that the lease ran out.

        :returns: the lease (same token) with the ttl in force.
        :raises LeaseLostError: the lease log holds another token or holder for the name, or the
            lease was released (``err.current`` is what the log says).
        :raises LeaseTimeoutError: ``timeout`` ran out while the lease log was contended or unreachable.
        :raises ConfigurationError: a bad handle or ttl, or a handle of another lease log.
        """
        self._check_handle(lease)
        new_ttl = lease.ttl if ttl is None else ttl
        if not _positive(new_ttl):
            raise ConfigurationError(f"lease {lease.name!r}: ttl must be a positive number of seconds, got {ttl!r}")
        new_ttl = float(new_ttl)

        def ops(state: dict[str, _Record]) -> list[dict[str, Any]]:
            rec = state.get(lease.name)
            if rec is None or rec.holder != lease.holder or rec.token != lease.token:
                raise self._lost(lease, state, "renew")
            return [
                {
                    "op": _RENEW,
                    "name": lease.name,
                    "holder": lease.holder,
                    "token": lease.token,
                    "ttl": new_ttl,
                    "at": time.time(),
                }
            ]

        sent = self._clock()
        try:
            self._write(
                ops,
                what=f"renew lease {lease.name!r} (token {lease.token})",
                lease=lease.name,
                until=None if timeout is None else sent + max(0.0, timeout),
                at_most=timeout is not None,
            )
        except LeaseLostError:
            self._forget(lease)
            raise
        with self._sent_lock:
            key = (lease.name, lease.token)
            if key not in self._sent or self._sent[key][0] <= sent:
                self._sent[key] = (sent, new_ttl)
        return Lease(name=lease.name, holder=lease.holder, token=lease.token, ttl=new_ttl, topic=self.topic)

    def release(self, lease: Lease) -> bool:
        """Give the lease up if ``lease`` still holds it; idempotent.

        :returns: True when this call released it; False when it was already released or is held
            under another token or by another holder (nothing is changed then).
        """
        self._check_handle(lease)
        done: list[bool] = [False]

        def ops(state: dict[str, _Record]) -> list[dict[str, Any]]:
            rec = state.get(lease.name)
            done[0] = rec is not None and rec.holder == lease.holder and rec.token == lease.token
            if not done[0]:
                return []
            return [
                {"op": _RELEASE, "name": lease.name, "holder": lease.holder, "token": lease.token, "at": time.time()}
            ]

        try:
            self._write(ops, what=f"release lease {lease.name!r} (token {lease.token})", lease=lease.name)
        finally:
            self._forget(lease)
        if done[0]:
            log.info("%s: lease %r released by %r (token %d)", self.topic, lease.name, lease.holder, lease.token)
        return done[0]

    def names(self, *, latest: bool = True) -> list[str]:
        """The name of every lease the log has recorded (held or released), sorted."""
        return self.manager.read(lambda state: sorted(state), latest=latest)

    def describe(self, name: str, *, latest: bool = True) -> LeaseInfo | None:
        """The lease as the log says now, without acquiring (None: never acquired in this log).

        :param latest: first read up to the tail (False: this process's replica as it is).
        """
        _check_name(name)
        return self.manager.read(lambda s: self._info(s, name), latest=latest)

    def transitions(self, name: str | None = None, *, limit: int = 100, latest: bool = True) -> list[LeaseTransition]:
        """The most recent holder changes (of ``name``, or of every lease), newest first, at most
        ``limit``: what this process's replica applied since it was opened, so a reader that
        loaded a checkpoint knows only the ops after it (and at most :data:`MAX_TRANSITIONS_KEPT`).
        Renewals are not transitions. Reads only: nothing is appended to the lease log.

        :param latest: first read up to the tail (False: this process's replica as it is).
        :raises ConfigurationError: ``limit`` is not a positive integer.
        """
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise ConfigurationError(f"limit must be a positive integer, got {limit!r}")
        if name is not None:
            _check_name(name)
        self.manager.read(lambda s: None, latest=latest)
        with self._history_lock:
            items = [t for t in reversed(self._history) if name is None or t.name == name]
        return items[:limit]

    def _record_transition(self, transition: LeaseTransition) -> None:
        key = (transition.offset, transition.name, transition.token, transition.event)
        with self._history_lock:
            if key in self._history_keys:
                return
            if len(self._history) == self._history.maxlen:
                old = self._history[0]
                self._history_keys.discard((old.offset, old.name, old.token, old.event))
            self._history.append(transition)
            self._history_keys.add(key)

    def watch(self, name: str, callback: Callable[[LeaseInfo], None]) -> Callable[[], None]:
        """Call ``callback`` with the new :class:`LeaseInfo` after every change of ``name``
        (acquire, renew, release, takeover) that this process observes; returns a function that
        stops the watch. Starts following the log in the background (every ``poll_interval``).

        The callback runs on the thread that applied the change, with the replica's lock held:
        keep it short. Its exceptions are logged and counted (``manager.stats["listener_errors"]``).
        """
        _check_name(name)
        if not callable(callback):
            raise ConfigurationError(f"lease {name!r}: watch callback must be callable, got {callback!r}")
        last = [-1]

        def on_change(change: Change[dict[str, Any]]) -> None:
            if change.op["name"] != name or change.offset == last[0]:
                return  # one call per record, however many ops of it touch the name
            last[0] = change.offset
            info = self.manager.read(lambda s: self._info(s, name))
            if info is not None:
                callback(info)

        self.manager.add_listener(on_change)
        self.manager.start()  # replays if needed and follows from now on

        def unsubscribe() -> None:
            self.manager.remove_listener(on_change)

        return unsubscribe

    def remaining(self, lease: Lease) -> float:
        """Seconds this process may still treat ``lease`` as held: its ttl minus the time (on this
        object's clock, :func:`boot_clock` by default) since this process sent the acquire or renew that granted it (0.0 when it never did here,
        e.g. a handle from another process not renewed yet)."""
        with self._sent_lock:
            entry = self._sent.get((lease.name, lease.token))
        if entry is None:
            return 0.0
        sent, ttl = entry
        return max(0.0, ttl - (self._clock() - sent))

    # ------------------------------------------------------------------ internals
    def _write(
        self,
        ops: Callable[[dict[str, _Record]], list[dict[str, Any]]],
        reader: Any = None,
        *,
        what: str,
        lease: str,
        until: float | None = None,
        at_most: bool = False,
    ) -> Any:
        """A write whose ops see the tail, retried while the lease log's writer is contended.

        A writer held here skips the catch-up (the manager assumes nobody else appends
        meanwhile), but lease writers fence each other: without the read, a "held" or "lost"
        answer that appends nothing could come from a stale replica. Candidates racing for the
        lease log's writer fence each other's attempts; such an attempt decided nothing, so it is
        tried again (jittered) until ``until`` (at least one ``operation_timeout`` from now, unless
        ``at_most``: then the first attempt is always made, and no retry starts after ``until``). A
        retried write whose first send may have landed is safe: every op is decided again on the
        latest state (an acquire that did land is then re-acquired under the next token).

        :raises LeaseTimeoutError: still contended at the end (``__cause__`` is the last error).
        """
        if not at_most or until is None:
            until = max(until or 0.0, self._clock() + self.manager.operation_timeout)
        backoff = Backoff(initial=0.02, maximum=0.5)
        attempts = 0
        while True:
            attempts += 1
            try:
                self.manager.read(lambda s: None, latest=True)
                return self.manager.write(ops, reader)
            except _CONTENDED as exc:
                self.contended += 1
                if self._clock() >= until:
                    raise LeaseTimeoutError(
                        f"{self.topic}: could not {what}: {attempts} attempt(s) in which the lease log's writer "
                        f"was contended or unavailable; the last: {exc}",
                        lease=lease,
                        current=None,
                    ) from exc
                log.info("%s: %s: attempt %d decided nothing (%s); trying again", self.topic, what, attempts, exc)
                backoff.sleep(deadline=time.monotonic() + max(0.0, until - self._clock()))

    def _check_handle(self, lease: Lease) -> None:
        if not isinstance(lease, Lease):
            raise ConfigurationError(f"expected a Lease handle (Lease.from_json reads one), got {type(lease).__name__}")
        if lease.topic != self.topic:
            raise ConfigurationError(
                f"lease {lease.name!r} (token {lease.token}) belongs to lease log {lease.topic!r}, not {self.topic!r}"
            )

    def _forget(self, lease: Lease) -> None:
        with self._sent_lock:
            self._sent.pop((lease.name, lease.token), None)

    def _lost(self, lease: Lease, state: dict[str, _Record], what: str) -> LeaseLostError:
        info = self._info(state, lease.name)
        if info is None:
            now = "the lease log has no such lease"
        elif info.holder is None:
            now = f"it was released (the last token granted is {info.token})"
        else:
            now = f"it is held by {info.holder!r} with token {info.token}"
        return LeaseLostError(
            f"{self.topic}: cannot {what} lease {lease.name!r} of {lease.holder!r} with token {lease.token}: {now}",
            lease=lease.name,
            token=lease.token,
            current=info,
        )

    def _info(self, state: dict[str, _Record], name: str) -> LeaseInfo | None:
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
            observed_age=max(0.0, self._clock() - self._observed_at(name, rec)),
            offset=rec.offset,
        )

    def _observed_at(self, name: str, rec: _Record) -> float:
        """When this process observed ``rec``'s last acquire/renew (first look, if never recorded)."""
        entry = self._observed.get(name)
        if entry is not None and entry[0] == rec.fingerprint():
            return entry[1]
        now = self._clock()
        self._observed[name] = (rec.fingerprint(), now)
        return now

    def _observe(self, name: str, rec: _Record) -> None:
        # A rebuild replays what was already observed: keep the earlier time for the same op.
        entry = self._observed.get(name)
        if entry is None or entry[0] != rec.fingerprint():
            self._observed[name] = (rec.fingerprint(), self._clock())

    def _apply(self, state: dict[str, _Record], op: dict[str, Any]) -> None:
        """Apply one validated op. An op that does not fit the state (a token that is not the
        next one, a renew or release of another token) is logged and ignored by every replica alike."""
        name, kind, token, holder = op["name"], op["op"], op["token"], op["holder"]
        rec = state.get(name)
        offset = self.manager.applying_offset
        if kind == _ACQUIRE:
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
                self._record_transition(LeaseTransition(name, ended, rec.holder, rec.token, at, offset))
            self._record_transition(LeaseTransition(name, "acquired", holder, token, op["at"], offset, op["ttl"]))
            state[name] = rec = _Record(holder, token, op["ttl"], op["at"], op["at"], transitions, offset)
            self._observe(name, rec)
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
        if kind == _RENEW:
            rec.ttl, rec.renewed_at, rec.offset = op["ttl"], op["at"], offset
            self._observe(name, rec)
        else:
            self._record_transition(LeaseTransition(name, "released", holder, token, op.get("at", 0.0), offset))
            rec.holder = None

    def _wake(self, change: Change[dict[str, Any]]) -> None:
        with self._changed:
            self._changed.notify_all()

    def _deserialize_image(self, data: bytes) -> dict[str, _Record]:
        image = json.loads(data)
        if not isinstance(image, dict) or image.get("v") != _IMAGE_VERSION or not isinstance(image.get("leases"), dict):
            raise ValueError(f"not a version {_IMAGE_VERSION} lease image")
        state: dict[str, _Record] = {}
        for name, fields in image["leases"].items():
            if not isinstance(fields, list) or len(fields) != 7:
                raise ValueError(f"lease {name!r}: image entry must be a list of 7 fields")
            holder, token, ttl, acquired_at, renewed_at, transitions, offset = fields
            op = {"op": _ACQUIRE, "name": name, "holder": holder or "-", "token": token, "ttl": ttl, "at": acquired_at}
            _validate(op)
            _number({"renewed_at": renewed_at}, "renewed_at", name)
            for field, value in (("transitions", transitions), ("offset", offset)):
                if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                    raise ValueError(f"lease {name!r}: image field {field!r} must be an integer >= 0, got {value!r}")
            if holder is not None and (not isinstance(holder, str) or not holder):
                raise ValueError(f"lease {name!r}: image field 'holder' must be null or a non-empty string")
            state[name] = rec = _Record(
                holder, token, float(ttl), float(acquired_at), float(renewed_at), transitions, offset
            )
            self._observe(name, rec)  # observed at load time
        return state


class LeaseKeeper:
    """Keeps a lease renewed in the background and says, on time, when it is no longer held.

    Guarantees:

    * ``on_lost`` is called at most once, and no later than the lease's expiry as this process
      counts it (``sent + ttl`` of the last acquire or renew that succeeded, on the leases' clock)
      plus ``watch_interval`` and thread scheduling, whatever a renew call is doing: a watchdog
      thread checks :meth:`Leases.remaining` while another thread renews;
    * once lost, always lost: a renew that was blocked and succeeds afterwards is not used;
    * each renew stops retrying when the lease's remaining validity runs out.

    Example::

        keeper = LeaseKeeper(leases, lease, on_lost=lambda err: job.kill()).start()
        try:
            ...  # guarded writes pass lease=keeper.lease
        finally:
            keeper.stop()
        keeper.check()

    :param leases: the recipe the lease lives in.
    :param lease: a lease this process acquired or renewed (else it counts as expired at once).
    :param interval: seconds between renewals (default ``ttl / 3``).
    :param on_lost: called once with the loss, from the watchdog or the renewing thread.
    :param watch_interval: the longest the watchdog sleeps between checks (it also wakes at the
        expected expiry); bounds how late a loss is reported after a suspend.
    :param log: a logger for renewals and failures (default: this module's).
    """

    def __init__(
        self,
        leases: Leases,
        lease: Lease,
        *,
        interval: float | None = None,
        on_lost: Callable[[LeaseLostError], None] | None = None,
        watch_interval: float = 0.1,
        log: Any = None,
    ) -> None:
        interval = lease.ttl / 3.0 if interval is None else interval
        if not _positive(interval) or not _positive(watch_interval):
            raise ConfigurationError(
                f"lease {lease.name!r}: interval and watch_interval must be positive seconds, got {interval!r}, {watch_interval!r}"
            )
        self._leases = leases
        self.lease = lease
        self.interval = float(interval)
        self.watch_interval = float(watch_interval)
        self._on_lost = on_lost
        self._log = log if log is not None else logging.getLogger(__name__)
        self.lost: LeaseLostError | None = None
        self.renewals = 0
        self._stop = threading.Event()
        self._lost_lock = threading.RLock()  # on_lost may call stop()
        self._threads = [
            threading.Thread(target=self._renew_loop, name=f"lease-renewer-{lease.name}", daemon=True),
            threading.Thread(target=self._watch_loop, name=f"lease-watchdog-{lease.name}", daemon=True),
        ]

    def start(self) -> LeaseKeeper:
        for thread in self._threads:
            thread.start()
        return self

    def stop(self) -> None:
        """Stop renewing (``on_lost`` is not called after this returns). Waits briefly for the
        renewing thread; one blocked in a renew call is left behind (it is a daemon)."""
        self._stop.set()
        with self._lost_lock:
            pass  # an on_lost call already running finishes before stop returns
        for thread in self._threads:
            if thread.is_alive() and thread is not threading.current_thread():
                thread.join(timeout=min(5.0, self.lease.ttl))

    def check(self) -> None:
        """:raises LeaseLostError: the lease was lost while kept."""
        if self.lost is not None:
            raise self.lost

    def _renew_loop(self) -> None:
        delay = self.interval
        while not self._stop.wait(delay):
            remaining = self._leases.remaining(self.lease)
            if remaining <= 0:
                return  # the watchdog reports it
            try:
                renewed = self._leases.renew(self.lease, timeout=remaining)
            except LeaseLostError as exc:
                self._lose(exc)
                return
            except Exception as exc:  # noqa: BLE001 - transient: retry while the lease is valid here
                left = self._leases.remaining(self.lease)
                self._log.warning("renewing lease %r failed (%s); %.1fs left", self.lease.name, exc, left)
                delay = min(self.interval, max(0.05, left / 4))
                continue
            if self.lost is not None:
                return  # the watchdog fired while the renew was blocked: the loss stands
            self.lease = renewed
            self.renewals += 1
            delay = self.interval

    def _watch_loop(self) -> None:
        while True:
            remaining = self._leases.remaining(self.lease)
            if remaining <= 0:
                self._lose(
                    LeaseLostError(
                        f"{self._leases.topic}: lease {self.lease.name!r} (token {self.lease.token}) expired here: "
                        f"not renewed within its ttl of {self.lease.ttl:g}s (the lease log did not answer in time)",
                        lease=self.lease.name,
                        token=self.lease.token,
                    )
                )
                return
            # Short waits: Event.wait counts monotonic time, which stops during a suspend.
            if self._stop.wait(min(remaining, self.watch_interval)):
                return

    def _lose(self, exc: LeaseLostError) -> None:
        with self._lost_lock:
            if self.lost is not None:
                return
            self.lost = exc
            self._log.error("%s", exc)
            if self._on_lost is None or self._stop.is_set():
                return
            try:
                self._on_lost(exc)
            except Exception:  # noqa: BLE001 - stopping the guarded work is best effort
                self._log.exception("on_lost of lease %r failed", self.lease.name)


# ---------------------------------------------------------------------- op codec
def parse_lease_op(data: bytes) -> dict[str, Any]:
    """A lease op read from the log, checked field by field (nothing read back is trusted).

    :raises ValueError: not a lease op; the message names the bad field (the manager reports the
        entry as corrupt, with its topic and offset).
    """
    try:
        op = json.loads(data)
    except ValueError as exc:
        raise ValueError(f"lease op is not JSON: {exc}") from None
    if not isinstance(op, dict):
        raise ValueError(f"lease op must be a JSON object, got {type(op).__name__}")
    return _validate(op)


def _validate(op: dict[str, Any]) -> dict[str, Any]:
    kind = op.get("op")
    if kind not in (_ACQUIRE, _RENEW, _RELEASE):
        raise ValueError(f"lease op field 'op' must be one of acquire, renew, release, got {kind!r}")
    name = op.get("name")
    if not isinstance(name, str) or not name or len(name.encode()) > MAX_LEASE_NAME_BYTES:
        raise ValueError(
            f"lease op field 'name' must be a non-empty string of at most {MAX_LEASE_NAME_BYTES} bytes, got {name!r:.80}"
        )
    holder = op.get("holder")
    if not isinstance(holder, str) or not holder or len(holder.encode()) > MAX_HOLDER_BYTES:
        raise ValueError(
            f"lease {name!r}: op field 'holder' must be a non-empty string of at most {MAX_HOLDER_BYTES} bytes, got {holder!r:.80}"
        )
    token = op.get("token")
    if isinstance(token, bool) or not isinstance(token, int) or not 1 <= token <= MAX_TOKEN:
        raise ValueError(f"lease {name!r}: op field 'token' must be an integer in 1 .. 2**64 - 1, got {token!r}")
    out = {"op": kind, "name": name, "holder": holder, "token": token, "at": _number(op, "at", name)}
    if kind != _RELEASE:
        ttl = op.get("ttl")
        if not _positive(ttl):
            raise ValueError(f"lease {name!r}: op field 'ttl' must be a positive number of seconds, got {ttl!r}")
        out["ttl"] = float(ttl)
    return out


def _number(op: Mapping[str, Any], field: str, name: str) -> float:
    value = op.get(field)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"lease {name!r}: field {field!r} must be a finite number, got {value!r}")
    return float(value)


def _positive(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value) and value > 0


def _serialize_image(state: dict[str, _Record]) -> bytes:
    leases = {
        name: [r.holder, r.token, r.ttl, r.acquired_at, r.renewed_at, r.transitions, r.offset]
        for name, r in state.items()
    }
    return json.dumps({"v": _IMAGE_VERSION, "leases": leases}, separators=(",", ":")).encode()


def _check_name(name: object) -> None:
    check_lease_name(name)


def _check_holder(holder: object) -> str:
    if not isinstance(holder, str) or not holder.strip():
        raise ConfigurationError(f"lease holder must be a non-empty string, got {holder!r} (field 'holder')")
    try:
        size = len(holder.encode())
    except UnicodeEncodeError as exc:
        raise ConfigurationError(
            f"lease holder (field 'holder') is not UTF-8 encodable ({exc.reason}): {holder[:40]!r}"
        ) from None
    if size > MAX_HOLDER_BYTES:
        raise ConfigurationError(
            f"lease holder (field 'holder') {holder[:40]!r}... is longer than {MAX_HOLDER_BYTES} bytes"
        )
    return holder
