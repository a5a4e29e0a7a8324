"""Keeping a lease: :class:`LeaseKeeper` renews it in the background while a watchdog thread
reports, on time, when it is no longer held."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from airflow_provider_pulsarstate.engine.errors import ConfigurationError, LeaseLostError
from airflow_provider_pulsarstate.engine.recipes.lease_codec import positive
from airflow_provider_pulsarstate.engine.recipes.lease_records import Lease

if TYPE_CHECKING:
    from airflow_provider_pulsarstate.engine.recipes.lease import Leases

__all__ = ["LeaseKeeper"]


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
        if not positive(interval) or not positive(watch_interval):
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
