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

:class:`Leases` is a façade over parts with one job each: :mod:`.lease_records` (the records),
:mod:`.lease_codec` (the lease log's ops and image), :mod:`.lease_observer` (the fold and this
process's observations), :mod:`.lease_ops` (the decisions and checks) and :mod:`.lease_keeper`
(:class:`LeaseKeeper`). Every public name is importable from here.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

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
from airflow_provider_pulsarstate.engine.fencing import check_lease_name
from airflow_provider_pulsarstate.engine.manager import Change, SharedStateManager, json_op_serializer
from airflow_provider_pulsarstate.engine.recipes import lease_ops
from airflow_provider_pulsarstate.engine.recipes.base import Recipe
from airflow_provider_pulsarstate.engine.recipes.lease_codec import (
    MAX_HOLDER_BYTES,
    parse_lease_op,
    positive,
    serialize_image,
)
from airflow_provider_pulsarstate.engine.recipes.lease_keeper import LeaseKeeper
from airflow_provider_pulsarstate.engine.recipes.lease_observer import MAX_TRANSITIONS_KEPT, LeaseObserver, LeaseState
from airflow_provider_pulsarstate.engine.recipes.lease_records import Lease, LeaseInfo, LeaseTransition
from airflow_provider_pulsarstate.engine.retry import Backoff

log = logging.getLogger(__name__)

__all__ = [
    "DEFAULT_CHECKPOINT_AFTER_BYTES",
    "DEFAULT_LEASE_TOPIC",
    "MAX_HOLDER_BYTES",
    "MAX_TRANSITIONS_KEPT",
    "Lease",
    "LeaseInfo",
    "LeaseKeeper",
    "LeaseTransition",
    "Leases",
    "boot_clock",
    "parse_lease_op",
]

R = TypeVar("R")

DEFAULT_LEASE_TOPIC = "pulsarstate-leases"
"""The lease log's short name (resolved with the connection's tenant and namespace)."""

DEFAULT_CHECKPOINT_AFTER_BYTES = 1 << 20
"""Lease logs live forever and grow with every renew; their state is tiny, so image it often."""

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
        if not positive(poll_interval):
            raise ConfigurationError(f"poll_interval must be a positive number of seconds, got {poll_interval!r}")
        self.topic = topic
        self.poll_interval = float(poll_interval)
        self._clock = clock or boot_clock
        self._observer = LeaseObserver(topic, self._clock)
        self.contended = 0
        """Attempts that decided nothing because the lease log's writer was contended (retried)."""
        self._changed = threading.Condition()
        options.setdefault("acquire_mode", AcquireMode.FENCE)
        options.setdefault("max_retries", 10)
        options.setdefault("writer_idle_timeout", 1.0)
        options.setdefault("checkpoint_after_bytes", DEFAULT_CHECKPOINT_AFTER_BYTES)
        self.manager: SharedStateManager[LeaseState, dict[str, Any]] = SharedStateManager(
            backend,
            topic,
            initializer=dict,
            applier=self._apply,
            op_serializer=json_op_serializer,
            op_deserializer=parse_lease_op,
            state_serializer=serialize_image,
            state_deserializer=self._observer.load_image,
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
        ttl = lease_ops.check_acquire(name, holder, ttl, timeout)
        deadline = None if timeout is None else self._clock() + timeout
        while True:
            outcome: dict[str, Any] = {}
            sent = self._clock()
            info = self._write(
                lease_ops.acquire_ops(self._observer, name, holder, ttl, steal, outcome),
                lambda s: self._observer.info(s, name),
                what=f"acquire lease {name!r} for {holder!r}",
                lease=name,
                until=math.inf if deadline is None else deadline,
            )
            token = outcome.get("token")
            if token is not None and info is not None and info.token == token and info.holder == holder:
                return self._granted(name, holder, token, sent, ttl, outcome)
            now = self._clock()
            if deadline is not None and timeout is not None and now >= deadline:
                raise lease_ops.timeout_error(self.topic, name, info, timeout)
            wait = min(self.poll_interval, outcome.get("expires_in", self.poll_interval))
            if deadline is not None:
                wait = min(wait, deadline - now)
            with self._changed:
                self._changed.wait(timeout=max(0.001, wait))

    def _granted(self, name: str, holder: str, token: int, sent: float, ttl: float, outcome: dict[str, Any]) -> Lease:
        self._observer.granted(name, token, sent, ttl)
        log.info(
            "%s: lease %r acquired by %r with token %d (previous holder %r, %s)",
            self.topic,
            name,
            holder,
            token,
            outcome.get("previous"),
            lease_ops.describe_acquisition(outcome, holder),
        )
        return Lease(name=name, holder=holder, token=token, ttl=ttl, topic=self.topic)

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
        lease_ops.check_handle(self.topic, lease)
        new_ttl = lease_ops.check_ttl(lease, ttl)
        sent = self._clock()
        try:
            self._write(
                lease_ops.renew_ops(self._observer, lease, new_ttl),
                what=f"renew lease {lease.name!r} (token {lease.token})",
                lease=lease.name,
                until=None if timeout is None else sent + max(0.0, timeout),
                at_most=timeout is not None,
            )
        except LeaseLostError:
            self._observer.forget(lease)
            raise
        self._observer.granted(lease.name, lease.token, sent, new_ttl, renewal=True)
        return Lease(name=lease.name, holder=lease.holder, token=lease.token, ttl=new_ttl, topic=self.topic)

    def release(self, lease: Lease) -> bool:
        """Give the lease up if ``lease`` still holds it; idempotent.

        :returns: True when this call released it; False when it was already released or is held
            under another token or by another holder (nothing is changed then).
        """
        lease_ops.check_handle(self.topic, lease)
        done: list[bool] = [False]
        try:
            self._write(
                lease_ops.release_ops(lease, done),
                what=f"release lease {lease.name!r} (token {lease.token})",
                lease=lease.name,
            )
        finally:
            self._observer.forget(lease)
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
        check_lease_name(name)
        return self.manager.read(lambda s: self._observer.info(s, name), latest=latest)

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
            check_lease_name(name)
        self.manager.read(lambda s: None, latest=latest)
        return self._observer.transitions(name, limit)

    def watch(self, name: str, callback: Callable[[LeaseInfo], None]) -> Callable[[], None]:
        """Call ``callback`` with the new :class:`LeaseInfo` after every change of ``name``
        (acquire, renew, release, takeover) that this process observes; returns a function that
        stops the watch. Starts following the log in the background (every ``poll_interval``).

        The callback runs on the thread that applied the change, with the replica's lock held:
        keep it short. Its exceptions are logged and counted (``manager.stats["listener_errors"]``).
        """
        check_lease_name(name)
        if not callable(callback):
            raise ConfigurationError(f"lease {name!r}: watch callback must be callable, got {callback!r}")
        last = [-1]

        def on_change(change: Change[dict[str, Any]]) -> None:
            if change.op["name"] != name or change.offset == last[0]:
                return  # one call per record, however many ops of it touch the name
            last[0] = change.offset
            info = self.manager.read(lambda s: self._observer.info(s, name))
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
        return self._observer.remaining(lease)

    # ------------------------------------------------------------------ internals
    def _write(
        self,
        ops: lease_ops.Ops,
        reader: Callable[[LeaseState], R] | None = None,
        *,
        what: str,
        lease: str,
        until: float | None = None,
        at_most: bool = False,
    ) -> R | None:
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

    def _apply(self, state: LeaseState, op: dict[str, Any]) -> None:
        self._observer.apply(state, op, self.manager.applying_offset)

    def _wake(self, change: Change[dict[str, Any]]) -> None:
        with self._changed:
            self._changed.notify_all()
