"""``OffsetProgressTrigger``: waits in the triggerer until a topic's offsets meet a condition.

It polls through the back end's :class:`~airflow_provider_pulsarstate.engine.offsets.base.AsyncOffsetProbe`
(Pulsar: an async HTTP client on the admin API; embedded: SQLite reads on a private thread pool),
so a poll never blocks the triggerer's event loop, and nothing runs on asgiref's shared thread.
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
from airflow_provider_pulsarstate.triggers.progress import (
    CONDITIONS,
    Progress,
    ProgressError,
    evaluate,
    offsets_json,
    parse_offsets,
    parse_target,
    target_json,
)

_TRANSIENT = (BackendUnavailableError, OperationTimeoutError, asyncio.TimeoutError)


class OffsetProgressTrigger(BaseTrigger):
    """Fire one event when ``condition`` holds on ``topic`` (see :mod:`~airflow_provider_pulsarstate.triggers.progress`).

    Events (payloads are plain JSON):

    * ``{"status": "success", "progress": {...}}``: the offsets seen when the condition held (the
      sensor's XCom); with ``end_from_trigger`` a ``TaskSuccessEvent`` carrying them as the
      task's ``return_value`` instead, so no worker ever runs the task;
    * ``{"status": "timeout", "message", "progress"}``: ``deadline`` (or the deferral's
      ``timeout_after`` set by the triggerer) passed first; ``progress`` is the last evaluation;
    * ``{"status": "error", "error_type", "message"}``: the problem, named (unknown topic or
      partition, a bad target, no index on the broker, ...). Unreachable back ends and time-outs
      are retried with back-off until the deadline, never reported as success.

    The first poll is immediate; later ones come every 75-100% of ``poll_interval`` (jittered,
    so triggers started together do not poll in bursts).

    The probe is opened in :meth:`run` and closed in its ``finally`` (also when the triggerer
    cancels the trigger).

    :param topic: short name or full ``persistent://...``; rendered in the triggerer when the
        sensor starts from the trigger.
    :param condition: ``end_offset``, ``committed``, ``lag`` or ``new_messages``.
    :param target: an int, a dict of partition -> int, or their text (a rendered template).
    :param subscription: for ``committed`` and ``lag``.
    :param per_partition: each partition must meet an int target (instead of the sum).
    :param watermark: for ``new_messages``: partition -> offset to count from.
    :param poll_interval: seconds between polls.
    :param deadline: seconds since the epoch after which a timeout event fires (None: the
        triggerer's ``timeout_after``, else never).
    :param pulsarstate_conn_id: the ``pulsarstate`` connection.
    :param end_from_trigger: end the task from the trigger on success (``start_from_trigger``).
    """

    def __init__(
        self,
        *,
        topic: str,
        condition: str,
        target: Any,
        subscription: str | None = None,
        per_partition: bool = False,
        watermark: dict[str, int] | None = None,
        poll_interval: float = 5.0,
        deadline: float | None = None,
        pulsarstate_conn_id: str = PulsarStateHook.default_conn_name,
        end_from_trigger: bool = False,
    ) -> None:
        super().__init__()
        if condition not in CONDITIONS:
            raise ProgressError(f"condition must be one of {', '.join(CONDITIONS)}, got {condition!r}")
        if isinstance(poll_interval, bool) or not isinstance(poll_interval, (int, float)) or not poll_interval > 0:
            raise ProgressError(f"poll_interval must be a positive number of seconds, got {poll_interval!r}")
        if deadline is not None and (isinstance(deadline, bool) or not isinstance(deadline, (int, float)) or not math.isfinite(deadline)):
            raise ProgressError(f"deadline must be seconds since the epoch or None, got {deadline!r}")
        self.topic = topic
        self.condition = condition
        # canonical JSON forms, so that serialize() round-trips exactly
        self.target = target_json(parse_target(target)) if isinstance(target, dict) else target
        self.subscription = subscription
        self.per_partition = bool(per_partition)
        self.watermark = offsets_json(parse_offsets(watermark, "watermark")) if watermark is not None else None
        self.poll_interval = float(poll_interval)
        self.deadline = float(deadline) if deadline is not None else None
        self.pulsarstate_conn_id = pulsarstate_conn_id
        self.end_from_trigger = bool(end_from_trigger)

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "topic": self.topic,
                "condition": self.condition,
                "target": self.target,
                "subscription": self.subscription,
                "per_partition": self.per_partition,
                "watermark": self.watermark,
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
        probe = None
        try:
            try:
                hook = PulsarStateHook(self.pulsarstate_conn_id)
                config = await hook.aget_config()
                topic = config.topic_name(str(self.topic).strip())
                target = parse_target(self.target)
                watermark = parse_offsets(self.watermark, "watermark") if self.watermark is not None else None
                subscription = (self.subscription or "").strip() or None
                if self.condition in ("committed", "lag") and subscription is None:
                    raise ProgressError(f"condition {self.condition!r} needs a subscription")
                probe = hook.get_async_offset_probe(config=config)
                call_timeout = config.operation_timeout
            except Exception as exc:
                yield _error(exc, f"topic {self.topic!r}")
                return

            deadline = self._deadline()
            backoff = Backoff(initial=min(1.0, self.poll_interval), maximum=max(self.poll_interval, 30.0))
            last: Progress | None = None
            logged_total: int | None = None
            while True:
                remaining = None if deadline is None else deadline - time.time()
                if remaining is not None and remaining <= 0:
                    yield TriggerEvent({
                        "status": "timeout",
                        "message": f"{self.condition} condition on {topic} not met before the sensor's timeout",
                        "progress": last.as_xcom() if last is not None else None,
                    })
                    return
                bound = call_timeout if remaining is None else max(0.001, min(call_timeout, remaining))
                try:
                    end = await within(probe.end_offsets(topic), bound)
                    committed = (
                        await within(probe.committed(topic, subscription), bound)
                        if subscription is not None else None
                    )
                    last = evaluate(
                        topic=topic, condition=self.condition, target=target, end_offsets=end,
                        committed=committed, watermark=watermark, per_partition=self.per_partition,
                    )
                except _TRANSIENT as exc:
                    delay = backoff.next_delay()
                    self.log.warning("polling offsets of %s failed (%s: %s); retrying in %.1fs",
                                     topic, type(exc).__name__, exc, delay)
                    await asyncio.sleep(delay if remaining is None else min(delay, max(0.0, remaining)))
                    continue
                except Exception as exc:
                    yield _error(exc, f"topic {topic}")
                    return
                backoff = Backoff(initial=min(1.0, self.poll_interval), maximum=max(self.poll_interval, 30.0))
                if last.met:
                    self.log.info("%s", last.table())
                    if self.end_from_trigger:
                        yield TaskSuccessEvent(xcoms={"return_value": last.as_xcom()})
                    else:
                        yield TriggerEvent({"status": "success", "progress": last.as_xcom()})
                    return
                if last.total != logged_total:
                    logged_total = last.total
                    self.log.info("%s", last.table())
                # jittered (never longer than asked) so that triggers started together, e.g. after a
                # triggerer restart, drift out of phase instead of polling the broker in bursts
                delay = self.poll_interval * random.uniform(0.75, 1.0)
                await asyncio.sleep(delay if remaining is None else min(delay, max(0.0, remaining)))
        finally:
            if probe is not None:
                try:
                    await probe.aclose()
                except Exception:
                    self.log.warning("closing the offset probe failed", exc_info=True)


def _error(exc: BaseException, where: str) -> TriggerEvent:
    message = str(exc) or type(exc).__name__
    if where not in message:
        message = f"{where}: {message}"
    return TriggerEvent({"status": "error", "error_type": type(exc).__name__, "message": message})
