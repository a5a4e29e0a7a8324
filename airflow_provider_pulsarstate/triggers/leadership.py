"""``LeadershipTrigger``: waits in the triggerer until a topic's leadership meets a mode, or until
a durable lease looks free.

It polls through the hook's async factories (Pulsar: the admin API over a shared async HTTP
client; embedded: SQLite on the probe's own thread; leases: the lease log on the observer's own
thread), so a poll never blocks the triggerer's event loop and nothing runs on asgiref's shared
thread.
"""

from __future__ import annotations

from typing import Any

from airflow.triggers.base import TriggerEvent

from airflow_provider_pulsarstate.engine.config import ConnectionConfig
from airflow_provider_pulsarstate.engine.retry import within
from airflow_provider_pulsarstate.hooks.pulsarstate import PulsarStateHook
from airflow_provider_pulsarstate.triggers.leadership_conditions import (
    LeadershipConditionError,
    check_mode,
    evaluate,
    parse_since_epoch,
    table,
)
from airflow_provider_pulsarstate.triggers.polling import Observation, PollingTrigger


class LeadershipTrigger(PollingTrigger):
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
        self._set_polling(
            poll_interval=poll_interval,
            deadline=deadline,
            pulsarstate_conn_id=pulsarstate_conn_id,
            end_from_trigger=end_from_trigger,
            error=LeadershipConditionError,
        )
        self.topic = topic
        self.mode = mode
        self.leader_name = leader_name
        self.since_epoch = since_epoch
        self.lease_name = lease_name
        self.lease_topic = lease_topic

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return self._serialized(
            {
                "topic": self.topic,
                "mode": self.mode,
                "leader_name": self.leader_name,
                "since_epoch": self.since_epoch,
                "lease_name": self.lease_name,
                "lease_topic": self.lease_topic,
            }
        )

    probe_name = "leadership probe"

    @property
    def result_key(self) -> str:  # type: ignore[override]
        return "lease" if self.mode == "acquire" else "leadership"

    def _where(self) -> str:
        return f"{self.mode} on {self.lease_name if self.mode == 'acquire' else self.topic!r}"

    async def _open(self, hook: PulsarStateHook, config: ConnectionConfig) -> tuple[Any, str, str]:
        self._leader_name = (str(self.leader_name).strip() or None) if self.leader_name is not None else None
        if self.mode == "acquire":
            self._lease = str(self.lease_name).strip()
            probe = hook.get_async_lease_observer(
                (self.lease_topic or "").strip() or None, config=config, freshness=self._freshness()
            )
            return probe, f"lease {self._lease!r} in {probe.topic}", self.mode
        self._topic = config.topic_name(str(self.topic).strip())
        self._since = parse_since_epoch(self.since_epoch) if self.mode == "changed" else None
        return (
            hook.get_async_leadership_probe(config=config, freshness=self._freshness()),
            f"topic {self._topic}",
            self.mode,
        )

    async def _observe(self, probe: Any, bound: float) -> Observation:
        if self.mode == "acquire":
            # a lease poll may replay the lease log: the bound is the whole operation time-out at least
            info = await within(probe.describe(self._lease), bound)
            value = info.as_dict() if info is not None else None
            met = info is None or not info.held or info.expired
            shown = None if info is None else (info.holder, info.token, info.expired)
            return Observation(value, met, shown, f"lease {self._lease!r}: {value}")
        observed = await within(probe.leadership(self._topic), bound)
        value = evaluate(
            self._topic,
            self.mode,
            [p.as_json() for p in observed],
            leader_name=self._leader_name,
            since_epoch=self._since,
        )
        return Observation(value, value["met"], [(p["leader"], p["epoch"]) for p in value["partitions"]], table(value))

    def _met_event(self, observation: Observation, deadline: float | None) -> TriggerEvent:
        if self.mode == "acquire":
            # the deadline travels with the event: a resumed sensor may not get its own defer
            # kwargs back (dag.test() replaces them with the event)
            return TriggerEvent({"status": "free", "lease": observation.value, "deadline": deadline})
        return super()._met_event(observation, deadline)
