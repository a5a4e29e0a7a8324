"""What the project's triggers share: one poll loop that never blocks the triggerer's event loop.

A subclass opens its probe (:meth:`PollingTrigger._open`) and makes one observation
(:meth:`PollingTrigger._observe`); the loop here does the rest, alike for every trigger:

* the first poll is immediate, later ones come every 75-100% of ``poll_interval`` (jittered, so
  triggers started together, e.g. after a triggerer restart, drift out of phase instead of
  polling the broker in bursts);
* each poll is bounded by the connection's operation time-out and by the deadline
  (:func:`~airflow_provider_pulsarstate.engine.retry.within`: a cancellation always propagates);
* unreachable back ends and time-outs are retried with back-off until the deadline, never
  reported as success; any other error ends the trigger with an ``error`` event naming it;
* ``deadline`` (or the deferral's ``timeout_after``) ends it with a ``timeout`` event carrying the
  last observation;
* the probe is closed in a ``finally``, also when the triggerer cancels the trigger;
* opening waits its turn (:mod:`~airflow_provider_pulsarstate.triggers.start_gate`).
"""

from __future__ import annotations

import asyncio
import math
import random
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any, ClassVar

from airflow.triggers.base import BaseTrigger, TaskSuccessEvent, TriggerEvent

from airflow_provider_pulsarstate.engine.config import ConnectionConfig
from airflow_provider_pulsarstate.engine.errors import BackendUnavailableError, OperationTimeoutError
from airflow_provider_pulsarstate.engine.retry import Backoff
from airflow_provider_pulsarstate.hooks.pulsarstate import PulsarStateHook
from airflow_provider_pulsarstate.triggers.shared_config import shared_config
from airflow_provider_pulsarstate.triggers.start_gate import start_turn

MAX_FRESHNESS = 1.0
"""Seconds at most an observation may be answered from a request another trigger made before it."""

TRANSIENT = (BackendUnavailableError, OperationTimeoutError, asyncio.TimeoutError)
"""Errors a poll retries with back-off until the deadline."""


@dataclass(frozen=True)
class Observation:
    """One poll's outcome.

    :ivar value: plain JSON: the event payload under the trigger's ``result_key`` (the sensor's XCom).
    :ivar met: whether the trigger's condition holds.
    :ivar shown: what the log line shows; a line is logged when it changes, and when met.
    :ivar text: the log line.
    """

    value: Any
    met: bool
    shown: Any
    text: str


def error_event(exc: BaseException, where: str) -> TriggerEvent:
    """An ``error`` event naming the problem and where it arose."""
    message = str(exc) or type(exc).__name__
    if where not in message:
        message = f"{where}: {message}"
    return TriggerEvent({"status": "error", "error_type": type(exc).__name__, "message": message})


def check_timing(poll_interval: Any, deadline: Any, error: type[Exception]) -> None:
    """Refuse a non-positive ``poll_interval`` or a ``deadline`` that is not seconds since the epoch."""
    if isinstance(poll_interval, bool) or not isinstance(poll_interval, (int, float)) or not poll_interval > 0:
        raise error(f"poll_interval must be a positive number of seconds, got {poll_interval!r}")
    if deadline is not None and (
        isinstance(deadline, bool) or not isinstance(deadline, (int, float)) or not math.isfinite(deadline)
    ):
        raise error(f"deadline must be seconds since the epoch or None, got {deadline!r}")


def retry_backoff(poll_interval: float) -> Backoff:
    """The back-off between retries of a failed poll: from ``min(1 s, poll_interval)`` up to
    ``max(poll_interval, 30 s)``."""
    return Backoff(initial=min(1.0, poll_interval), maximum=max(poll_interval, 30.0))


async def _sleep_within(delay: float, remaining: float | None) -> None:
    """Sleep ``delay`` seconds, never past the deadline ``remaining`` seconds away (None: none)."""
    await asyncio.sleep(delay if remaining is None else min(delay, max(0.0, remaining)))


class PollingTrigger(BaseTrigger):
    """Base of the project's triggers (see the module docstring for the loop's guarantees).

    Subclasses set ``poll_interval``, ``deadline``, ``pulsarstate_conn_id`` and ``end_from_trigger``
    in ``__init__`` (:meth:`_set_polling`), serialize them with their own options
    (:meth:`_serialized`) and implement :meth:`_open` and :meth:`_observe`.
    """

    result_key: ClassVar[str] = "result"
    """The payload key of the observation in ``success`` and ``timeout`` events."""
    probe_name: ClassVar[str] = "probe"
    """How logs name the probe."""

    poll_interval: float
    deadline: float | None
    pulsarstate_conn_id: str
    end_from_trigger: bool

    def _set_polling(
        self,
        *,
        poll_interval: float,
        deadline: float | None,
        pulsarstate_conn_id: str,
        end_from_trigger: bool,
        error: type[Exception],
    ) -> None:
        """Check (:func:`check_timing`, raising ``error``) and set the options every poll loop takes."""
        check_timing(poll_interval, deadline, error)
        self.poll_interval = float(poll_interval)
        self.deadline = float(deadline) if deadline is not None else None
        self.pulsarstate_conn_id = pulsarstate_conn_id
        self.end_from_trigger = bool(end_from_trigger)

    def _serialized(self, options: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        """``serialize()``'s answer: the class path, and ``options`` followed by the poll loop's own."""
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                **options,
                "poll_interval": self.poll_interval,
                "deadline": self.deadline,
                "pulsarstate_conn_id": self.pulsarstate_conn_id,
                "end_from_trigger": self.end_from_trigger,
            },
        )

    def _freshness(self) -> float:
        """Seconds an observation may be answered from one another trigger of the loop asked for
        before this poll (probes share equal requests): half the poll interval, at most 1 s."""
        return min(self.poll_interval / 2, MAX_FRESHNESS)

    def _deadline(self) -> float | None:
        if self.deadline is not None:
            return self.deadline
        after = getattr(self, "timeout_after", None)
        return after.timestamp() if isinstance(after, datetime) else None

    async def _open(self, hook: PulsarStateHook, config: ConnectionConfig) -> tuple[Any, str, str]:
        """Parse the options and open the probe: ``(probe with aclose(), where, goal)``, where
        names what is watched (``"topic persistent://..."``) and goal what must hold."""
        raise NotImplementedError

    def _where(self) -> str:
        """What is watched, before :meth:`_open` resolved it (for its errors)."""
        raise NotImplementedError

    async def _observe(self, probe: Any, bound: float) -> Observation:
        """One observation; each awaited call bounded by ``within(..., bound)``."""
        raise NotImplementedError

    def _met_event(self, observation: Observation, deadline: float | None) -> TriggerEvent:
        if self.end_from_trigger:
            return TaskSuccessEvent(xcoms={"return_value": observation.value})
        return TriggerEvent({"status": "success", self.result_key: observation.value})

    def _timeout_event(self, goal: str, where: str, last: Observation | None) -> TriggerEvent:
        """The deadline passed before ``goal`` held: a ``timeout`` event with the last observation."""
        return TriggerEvent(
            {
                "status": "timeout",
                "message": f"{goal} on {where} not met before the sensor's timeout",
                self.result_key: last.value if last is not None else None,
            }
        )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        probe: Any = None
        try:
            try:
                await start_turn()  # a thousand triggers starting together take turns
                hook = PulsarStateHook(self.pulsarstate_conn_id)
                config = await shared_config(hook)
                probe, where, goal = await self._open(hook, config)
                call_timeout = config.operation_timeout
            except Exception as exc:
                yield error_event(exc, self._where())
                return

            deadline = self._deadline()
            backoff = retry_backoff(self.poll_interval)
            last: Observation | None = None
            logged: Any = None
            while True:
                remaining = None if deadline is None else deadline - time.time()
                if remaining is not None and remaining <= 0:
                    yield self._timeout_event(goal, where, last)
                    return
                bound = call_timeout if remaining is None else max(0.001, min(call_timeout, remaining))
                try:
                    last = await self._observe(probe, bound)
                except TRANSIENT as exc:
                    delay = backoff.next_delay()
                    self.log.warning(
                        "polling %s failed (%s: %s); retrying in %.1fs", where, type(exc).__name__, exc, delay
                    )
                    await _sleep_within(delay, remaining)
                    continue
                except Exception as exc:
                    yield error_event(exc, where)
                    return
                backoff = retry_backoff(self.poll_interval)
                if last.met or last.shown != logged:
                    logged = last.shown
                    self.log.info("%s", last.text)
                if last.met:
                    yield self._met_event(last, deadline)
                    return
                delay = self.poll_interval * random.uniform(0.75, 1.0)
                await _sleep_within(delay, remaining)
        finally:
            if probe is not None:
                try:
                    await probe.aclose()
                except Exception:
                    self.log.warning("closing the %s failed", self.probe_name, exc_info=True)
