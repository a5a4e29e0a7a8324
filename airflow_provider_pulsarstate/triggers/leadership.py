"""``LeadershipTrigger``: waits in the triggerer until a topic's leadership meets a mode, or until
a durable lease looks free.

It polls through the hook's async factories (Pulsar: the admin API over a shared async HTTP
client; embedded: SQLite on the probe's own thread; leases: the lease log on the observer's own
thread), so a poll never blocks the triggerer's event loop and nothing runs on asgiref's shared
thread.
"""

from __future__ import annotations

import asyncio
import math
import random
import time
from datetime import datetime
from typing import Any, AsyncIterator

from airflow.triggers.base import BaseTrigger, TaskSuccessEvent, TriggerEvent

from airflow_provider_pulsarstate.engine.errors import BackendUnavailableError, OperationTimeoutError
from airflow_provider_pulsarstate.engine.retry import Backoff, within
from airflow_provider_pulsarstate.hooks.pulsarstate import PulsarStateHook
from airflow_provider_pulsarstate.triggers.leadership_conditions import (
    MODES,
    LeadershipConditionError,
    check_mode,
    evaluate,
    parse_since_epoch,
    table,
)

_TRANSIENT = (BackendUnavailableError, OperationTimeoutError, asyncio.TimeoutError)


class LeadershipTrigger(BaseTrigger):
    """Fire one event when ``mode`` holds (see :mod:`~airflow_provider_pulsarstate.triggers.leadership_conditions`).

    Events (payloads are plain JSON):

    * ``{"status": "success", "leadership": {...}}``: the observation that met the mode (the
      sensor's XCom); with ``end_from_trigger`` a ``TaskSuccessEvent`` carrying it as the task's
      ``return_value`` instead, so no worker runs the sensor;
    * mode ``acquire``: ``{"status": "free", "lease": {...} | None, "deadline"}`` once the lease ``lease_name``
      is released, never acquired, or held but silent for longer than its ttl as observed by this
      trigger (``lease`` is the ``LeaseInfo`` seen, ``None``: never acquired). The trigger only
      reads; the sensor acquires on the worker (and defers again until ``deadline``, seconds since
      the epoch or None, if it lost the race);
    * ``{"status": "timeout", "message", "leadership"}``: ``deadline`` (or the deferral's
      ``timeout_after``) passed first; ``leadership`` is the last observation (acquire: ``lease``);
    * ``{"status": "error", "error_type", "message"}``: the problem, named (unknown topic, bad
      option, ...). Unreachable back ends and time-outs are retried with back-off until the deadline.

    The first poll is immediate; later ones come every 75-100% of ``poll_interval``. The probe is
    opened in :meth:`run` and closed in its ``finally`` (also when the triggerer cancels the trigger).

    :param topic: short name or full ``persistent://...`` (not used by ``acquire``).
    :param mode: ``leader``, ``no_leader``, ``changed`` or ``acquire``.
    :param leader_name: ``leader``: only a leader of this name counts.
    :param since_epoch: ``changed``: the epoch seen before (an int or its text).
    :param lease_name: ``acquire``: the lease.
    :param lease_topic: ``acquire``: the lease log (default: the hook's).
    :param poll_interval: seconds between polls.
    :param deadline: seconds since the epoch after which a timeout event fires (None: the
        triggerer's ``timeout_after``, else never).
    :param pulsarstate_conn_id: the ``pulsarstate`` connection.
    :param end_from_trigger: end the task from the trigger on success (not with ``acquire``).
    """

    def __init__(
        self,
        *,
        topic: str | None = None,
        mode: str = "leader",
        leader_name: str | None = None,
        since_epoch: Any = None,
        lease_name: str | None = None,
        lease_topic: str | None = None,
        poll_interval: float = 5.0,
        deadline: float | None = None,
        pulsarstate_conn_id: str = PulsarStateHook.default_conn_name,
        end_from_trigger: bool = False,
    ) -> None:
        super().__init__()
        check_mode(mode, leader_name=leader_name, since_epoch=since_epoch, lease_name=lease_name)
        if mode != "acquire" and not topic:
            raise LeadershipConditionError(f"mode {mode!r} needs a topic")
        if mode == "acquire" and end_from_trigger:
            raise LeadershipConditionError("mode 'acquire' acquires on a worker: it cannot end from the trigger")
        if isinstance(poll_interval, bool) or not isinstance(poll_interval, (int, float)) or not poll_interval > 0:
            raise LeadershipConditionError(f"poll_interval must be a positive number of seconds, got {poll_interval!r}")
        if deadline is not None and (isinstance(deadline, bool) or not isinstance(deadline, (int, float)) or not math.isfinite(deadline)):
            raise LeadershipConditionError(f"deadline must be seconds since the epoch or None, got {deadline!r}")
        self.topic = topic
        self.mode = mode
        self.leader_name = leader_name
        self.since_epoch = since_epoch
        self.lease_name = lease_name
        self.lease_topic = lease_topic
        self.poll_interval = float(poll_interval)
        self.deadline = float(deadline) if deadline is not None else None
        self.pulsarstate_conn_id = pulsarstate_conn_id
        self.end_from_trigger = bool(end_from_trigger)

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "topic": self.topic,
                "mode": self.mode,
                "leader_name": self.leader_name,
                "since_epoch": self.since_epoch,
                "lease_name": self.lease_name,
                "lease_topic": self.lease_topic,
                "poll_interval": self.poll_interval,
                "deadline": self.deadline,
                "pulsarstate_conn_id": self.pulsarstate_conn_id,
                "end_from_trigger": self.end_from_trigger,
            },
        )

    def _deadline(self) -> float | None:
        if self.deadline is not None:
            return self.deadline
        after = getattr(self, "timeout_after", None)
        return after.timestamp() if isinstance(after, datetime) else None

    async def run(self) -> AsyncIterator[TriggerEvent]:
        probe: Any = None
        try:
            try:
                hook = PulsarStateHook(self.pulsarstate_conn_id)
                config = await hook.aget_config()
                leader_name = (str(self.leader_name).strip() or None) if self.leader_name is not None else None
                if self.mode == "acquire":
                    name = str(self.lease_name).strip()
                    probe = hook.get_async_lease_observer((self.lease_topic or "").strip() or None, config=config)
                    where = f"lease {name!r} in {probe.topic}"
                else:
                    topic = config.topic_name(str(self.topic).strip())
                    since = parse_since_epoch(self.since_epoch) if self.mode == "changed" else None
                    probe = hook.get_async_leadership_probe(config=config)
                    where = f"topic {topic}"
                call_timeout = config.operation_timeout
            except Exception as exc:
                yield _error(exc, f"{self.mode} on {self.lease_name if self.mode == 'acquire' else self.topic!r}")
                return

            deadline = self._deadline()
            backoff = Backoff(initial=min(1.0, self.poll_interval), maximum=max(self.poll_interval, 30.0))
            last: Any = None
            logged: Any = None
            while True:
                remaining = None if deadline is None else deadline - time.time()
                if remaining is not None and remaining <= 0:
                    key = "lease" if self.mode == "acquire" else "leadership"
                    yield TriggerEvent({
                        "status": "timeout",
                        "message": f"{self.mode} on {where} not met before the sensor's timeout",
                        key: last,
                    })
                    return
                # a lease poll may replay the lease log: give it the whole operation time-out at least
                bound = call_timeout if remaining is None else max(0.001, min(call_timeout, remaining))
                try:
                    if self.mode == "acquire":
                        info = await within(probe.describe(name), bound)
                        last = info.as_dict() if info is not None else None
                        met = info is None or not info.held or info.expired
                        shown = None if info is None else (info.holder, info.token, info.expired)
                    else:
                        observed = await within(probe.leadership(topic), bound)
                        last = evaluate(topic, self.mode, [p.as_json() for p in observed],
                                        leader_name=leader_name, since_epoch=since)
                        met = last["met"]
                        shown = [(p["leader"], p["epoch"]) for p in last["partitions"]]
                except _TRANSIENT as exc:
                    delay = backoff.next_delay()
                    self.log.warning("polling %s failed (%s: %s); retrying in %.1fs", where, type(exc).__name__, exc, delay)
                    await asyncio.sleep(delay if remaining is None else min(delay, max(0.0, remaining)))
                    continue
                except Exception as exc:
                    yield _error(exc, where)
                    return
                backoff = Backoff(initial=min(1.0, self.poll_interval), maximum=max(self.poll_interval, 30.0))
                if shown != logged:
                    logged = shown
                    self.log.info("%s", table(last) if self.mode != "acquire" else f"{where}: {last}")
                if met:
                    if self.mode == "acquire":
                        # the deadline travels with the event: a resumed sensor may not get its own
                        # defer kwargs back (dag.test() replaces them with the event)
                        yield TriggerEvent({"status": "free", "lease": last, "deadline": deadline})
                    elif self.end_from_trigger:
                        yield TaskSuccessEvent(xcoms={"return_value": last})
                    else:
                        yield TriggerEvent({"status": "success", "leadership": last})
                    return
                delay = self.poll_interval * random.uniform(0.75, 1.0)
                await asyncio.sleep(delay if remaining is None else min(delay, max(0.0, remaining)))
        finally:
            if probe is not None:
                try:
                    await probe.aclose()
                except Exception:
                    self.log.warning("closing the leadership probe failed", exc_info=True)


def _error(exc: BaseException, where: str) -> TriggerEvent:
    message = str(exc) or type(exc).__name__
    if where not in message:
        message = f"{where}: {message}"
    return TriggerEvent({"status": "error", "error_type": type(exc).__name__, "message": message})


__all__ = ["MODES", "LeadershipTrigger"]
