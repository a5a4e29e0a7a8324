"""``OffsetProgressTrigger``: waits in the triggerer until a topic's offsets meet a condition.

It polls through the back end's :class:`~airflow_provider_pulsarstate.engine.offsets.base.AsyncOffsetProbe`
(Pulsar: an async HTTP client on the admin API; embedded: SQLite reads on a private thread pool),
so a poll never blocks the triggerer's event loop, and nothing runs on asgiref's shared thread.
"""

from __future__ import annotations

from typing import Any

from airflow_provider_pulsarstate.engine.config import ConnectionConfig
from airflow_provider_pulsarstate.engine.retry import within
from airflow_provider_pulsarstate.hooks.pulsarstate import PulsarStateHook
from airflow_provider_pulsarstate.triggers.offset_conditions import (
    CONDITIONS,
    ProgressError,
    evaluate,
    offsets_json,
    parse_offsets,
    parse_target,
    target_json,
)
from airflow_provider_pulsarstate.triggers.polling import Observation, PollingTrigger


class OffsetProgressTrigger(PollingTrigger):
    """Fire one event when ``condition`` holds on ``topic`` (see :mod:`~airflow_provider_pulsarstate.triggers.offset_conditions`).

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
        self._set_polling(
            poll_interval=poll_interval,
            deadline=deadline,
            pulsarstate_conn_id=pulsarstate_conn_id,
            end_from_trigger=end_from_trigger,
            error=ProgressError,
        )
        self.topic = topic
        self.condition = condition
        # canonical JSON forms, so that serialize() round-trips exactly
        self.target = target_json(parse_target(target)) if isinstance(target, dict) else target
        self.subscription = subscription
        self.per_partition = bool(per_partition)
        self.watermark = offsets_json(parse_offsets(watermark, "watermark")) if watermark is not None else None

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return self._serialized(
            {
                "topic": self.topic,
                "condition": self.condition,
                "target": self.target,
                "subscription": self.subscription,
                "per_partition": self.per_partition,
                "watermark": self.watermark,
            }
        )

    result_key = "progress"
    probe_name = "offset probe"

    def _where(self) -> str:
        return f"topic {self.topic!r}"

    async def _open(self, hook: PulsarStateHook, config: ConnectionConfig) -> tuple[Any, str, str]:
        self._topic = config.topic_name(str(self.topic).strip())
        self._target = parse_target(self.target)
        self._watermark = parse_offsets(self.watermark, "watermark") if self.watermark is not None else None
        self._subscription = (self.subscription or "").strip() or None
        if self.condition in ("committed", "lag") and self._subscription is None:
            raise ProgressError(f"condition {self.condition!r} needs a subscription")
        probe = hook.get_async_offset_probe(config=config, freshness=self._freshness())
        return probe, f"topic {self._topic}", f"{self.condition} condition"

    async def _observe(self, probe: Any, bound: float) -> Observation:
        end = await within(probe.end_offsets(self._topic), bound)
        committed = (
            await within(probe.committed(self._topic, self._subscription), bound)
            if self._subscription is not None
            else None
        )
        progress = evaluate(
            topic=self._topic,
            condition=self.condition,
            target=self._target,
            end_offsets=end,
            committed=committed,
            watermark=self._watermark,
            per_partition=self.per_partition,
        )
        return Observation(progress.as_xcom(), progress.met, progress.total, progress.table())
