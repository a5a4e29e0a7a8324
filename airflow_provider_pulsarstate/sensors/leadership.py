"""``LeadershipSensor``: gate a task on who leads a topic, or wait until a durable lease is won.

Modes (``mode_of_leadership`` is the sensor's own ``mode=`` argument; Airflow's poke/reschedule
choice is ``sensor_mode=``):

==============  ================================================================================
``leader``      an exclusive producer holds the topic (with ``leader_name``: one of that name)
``no_leader``   nobody holds it exclusively
``changed``     the topic epoch grew past ``since_epoch``: a new exclusive producer took the topic
                since that epoch was seen (whether or not it still holds it)
``acquire``     wait until this task wins the durable lease ``lease_name``; returns the lease handle
==============  ================================================================================

A partitioned topic meets ``leader``, ``no_leader`` and ``changed`` only when EVERY partition
does. Leadership is the topic's exclusive producer (PIP-68), read from the broker's admin stats
(``publishers[].accessMode``, ``topicEpoch``) or, embedded, from the writer lock's holder and
epoch: it lives only as long as the holder's connection. For leadership across tasks use
``acquire`` (a lease with a fencing token, :mod:`~airflow_provider_pulsarstate.engine.recipes.lease`).

The sensor returns (XCom), for the observing modes::

    {"topic": "persistent://public/default/orders", "mode": "leader", "leader_name": null,
     "since_epoch": null, "met": true,
     "partitions": [{"partition": null, "leader": "deployment-a", "access_mode": "Exclusive",
                     "epoch": 3, "waiting_publishers": 0, "other_producers": []}]}

(``partition`` is null for a non-partitioned topic; ``epoch`` null: never held), and for
``acquire`` the lease handle ``Lease.to_json()`` (``name``, ``holder``, ``token``, ``ttl``,
``topic``) that guarded tasks pass on (``Lease.from_json``) and renew first.

Poke (or reschedule) mode reads through the hook; ``deferrable=True`` waits in the triggerer
(:class:`~airflow_provider_pulsarstate.triggers.leadership.LeadershipTrigger`), never blocking
its loop. ``timeout`` and ``soft_fail`` hold in every mode: the trigger fires a timeout event
itself at the deadline. ``start_from_trigger=True`` starts the trigger from the scheduler (no
worker slot); for the observing modes the trigger also ends the task with the XCom.

Acquire: a poke is one ``acquire(..., timeout=0)`` attempt (held by another: not yet), with one
Leases kept for the whole poke-mode execution so that expiry is measured from its first look.
Deferred, the trigger only reads the lease log until the lease is free (released, never acquired)
or expired as the trigger observed it; the sensor then acquires on the worker and defers again if
it lost the race. Expiry is measured by each process from its own observation (no clock is
trusted across processes), so the worker, having observed nothing yet, waits up to one more ttl
before taking over an expired lease: a dead holder's lease passes to a deferred sensor after
about two ttls, to a poke-mode one after one (as long as the poke interval is short). With
``sensor_mode="reschedule"`` every poke is a new process: only released leases can be won.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseSensorOperator, PokeReturnValue
from airflow.sdk.configuration import conf
from airflow.sdk.exceptions import AirflowSensorTimeout

from airflow_provider_pulsarstate.engine.errors import LeaseTimeoutError, PulsarStateError
from airflow_provider_pulsarstate.hooks.pulsarstate import PulsarStateHook
from airflow_provider_pulsarstate.plugins.links import PulsarStateLeaseLink
from airflow_provider_pulsarstate.sensors.trigger_start import (
    default_start_trigger_args,
    for_triggerer,
    is_xcom_arg,
    start_from_trigger_args,
    task_instance_id,
)
from airflow_provider_pulsarstate.triggers.leadership import LeadershipTrigger
from airflow_provider_pulsarstate.triggers.leadership_conditions import (
    LeadershipConditionError,
    check_mode,
    check_result,
    evaluate,
    parse_since_epoch,
    table,
)

if TYPE_CHECKING:
    from airflow.sdk import Context

_DEFAULT_TTL = 60.0


def _check_topic_or_lease(
    mode: str, *, topic: str | None, holder: str | None, ttl: float, lease_topic: str | None
) -> None:
    """Observing modes watch a topic; ``acquire`` alone takes a lease's options and no topic."""
    if mode != "acquire" and not topic:
        raise LeadershipConditionError(f"mode {mode!r} needs a topic")
    if mode == "acquire" and topic is not None:
        raise LeadershipConditionError(
            "mode 'acquire' waits for a lease, not a topic: give lease_name (and lease_topic)"
        )
    if mode != "acquire" and (holder is not None or lease_topic is not None or ttl != _DEFAULT_TTL):
        raise LeadershipConditionError(f"holder, ttl and lease_topic apply to mode 'acquire' only, not {mode!r}")


def _check_options(
    mode: str,
    *,
    topic: str | None,
    leader_name: str | None,
    since_epoch: Any,
    lease_name: str | None,
    holder: str | None,
    ttl: float,
    lease_topic: str | None,
    deferrable: bool,
    start_from_trigger: bool,
) -> None:
    """Refuse, at DAG parse time, an unknown mode or an option that does not fit it.

    :raises LeadershipConditionError: naming the option and the mode.
    """
    if mode in ("poke", "reschedule"):
        raise LeadershipConditionError(
            f"mode is the leadership mode (leader, no_leader, changed, acquire); Airflow's {mode!r} is sensor_mode={mode!r}"
        )
    check_mode(mode, leader_name=leader_name, since_epoch=since_epoch, lease_name=lease_name)
    _check_topic_or_lease(mode, topic=topic, holder=holder, ttl=ttl, lease_topic=lease_topic)
    if isinstance(ttl, bool) or not isinstance(ttl, (int, float)) or not ttl > 0:
        raise LeadershipConditionError(f"ttl must be a positive number of seconds, got {ttl!r}")
    if (
        mode == "changed"
        and isinstance(since_epoch, (int, str))
        and not is_xcom_arg(since_epoch)
        and "{{" not in str(since_epoch)
    ):
        parse_since_epoch(since_epoch)  # a literal that can never work fails at parse time
    if start_from_trigger and not deferrable:
        raise LeadershipConditionError("start_from_trigger needs deferrable=True")


def _check_event(event: Any, mode: str) -> None:
    """Refuse an event the trigger cannot send for ``mode``; raise its timeout or error.

    :raises AirflowSensorTimeout: a timeout event, with what was last seen.
    :raises PulsarStateError: an error event (its type and message), or an unexpected event.
    """
    if not isinstance(event, Mapping) or event.get("status") not in ("success", "free", "timeout", "error"):
        raise PulsarStateError(f"unexpected event from the leadership trigger: {event!r}")
    if event["status"] == "timeout":
        seen = event.get("lease" if mode == "acquire" else "leadership")
        raise AirflowSensorTimeout(f"Sensor has timed out: {event.get('message')}; last seen: {seen}")
    if event["status"] == "error":
        raise PulsarStateError(f"{event.get('error_type', 'error')}: {event.get('message')}")
    if mode == "acquire" and event["status"] != "free":
        raise PulsarStateError(f"unexpected event for mode 'acquire': {event!r}")
    if mode != "acquire" and event["status"] != "success":
        raise PulsarStateError(f"unexpected event for mode {mode!r}: {event!r}")


def _met_observation(event: Mapping[str, Any], mode: str) -> dict[str, Any]:
    """The observation of a success event, re-decided (an event is evidence, not a verdict).

    :raises PulsarStateError: it is malformed, or does not meet the mode.
    """
    try:
        result = check_result(event.get("leadership"))
    except (LeadershipConditionError, KeyError, TypeError, ValueError) as exc:
        raise PulsarStateError(f"malformed leadership in the trigger's event ({exc}): {event!r}") from None
    if not result["met"]:
        raise PulsarStateError(f"the trigger fired but its observation does not meet the mode: {event!r}")
    return result


class LeadershipSensor(BaseSensorOperator):
    """Wait until a topic's leadership meets a mode, or until a lease is won (see the module docstring).

    Usage::

        # wait until deployment-a's writer leads the topic, then read what it wrote
        LeadershipSensor(task_id="a_leads", topic="orders", mode="leader", leader_name="deployment-a",
                         deferrable=True, timeout=600)

        # run the nightly load only under the lease; downstream tasks get the handle as XCom
        LeadershipSensor(task_id="take_lease", mode="acquire", lease_name="nightly-load", ttl=300,
                         deferrable=True, timeout=3600)

    :param topic: short name (the connection's namespace) or full ``persistent://...``; not for
        ``acquire``. Templated.
    :param mode: ``leader`` (default), ``no_leader``, ``changed`` or ``acquire``.
    :param leader_name: ``leader``: only a leader of this name counts (a state manager's
        ``writer_name``). Templated.
    :param since_epoch: ``changed``: the topic epoch seen before (an int, its text, or an XComArg
        / template; -1: none seen). Templated.
    :param lease_name: ``acquire``: the lease to win. Templated.
    :param holder: ``acquire``: who holds it (default ``"<dag_id>/<run_id>/<task_id>/<map_index>"``). Templated.
    :param ttl: ``acquire``: seconds the lease stays valid after it is won (renew before then).
    :param lease_topic: ``acquire``: the lease log (default: the hook's ``pulsarstate-leases``). Templated.
    :param sensor_mode: Airflow's ``mode`` of BaseSensorOperator (``poke`` or ``reschedule``).
    :param deferrable: wait in the triggerer (default ``[operators] default_deferrable``).
    :param start_from_trigger: with ``deferrable``, the scheduler starts the trigger directly.
    :param pulsarstate_conn_id: the ``pulsarstate`` connection (missing default: embedded log).
    :param kwargs: BaseSensorOperator's: ``poke_interval`` (also the trigger's poll interval),
        ``timeout``, ``soft_fail``, ...
    :raises ValueError: an unknown mode or an option that does not fit it (at DAG parse time).
    """

    template_fields: Sequence[str] = ("topic", "leader_name", "since_epoch", "lease_name", "holder", "lease_topic")
    operator_extra_links = (PulsarStateLeaseLink(),)
    ui_color = "#e8e4f0"
    start_trigger_args = default_start_trigger_args(LeadershipTrigger)
    start_from_trigger = False

    def __init__(
        self,
        *,
        topic: str | None = None,
        mode: str = "leader",
        leader_name: str | None = None,
        since_epoch: Any = None,
        lease_name: str | None = None,
        holder: str | None = None,
        ttl: float = _DEFAULT_TTL,
        lease_topic: str | None = None,
        sensor_mode: str = "poke",
        deferrable: bool = conf.getboolean("operators", "default_deferrable", fallback=False),
        start_from_trigger: bool = False,
        pulsarstate_conn_id: str = PulsarStateHook.default_conn_name,
        **kwargs: Any,
    ) -> None:
        super().__init__(mode=sensor_mode, **kwargs)
        _check_options(
            mode,
            topic=topic,
            leader_name=leader_name,
            since_epoch=since_epoch,
            lease_name=lease_name,
            holder=holder,
            ttl=ttl,
            lease_topic=lease_topic,
            deferrable=deferrable,
            start_from_trigger=start_from_trigger,
        )
        self.topic = topic
        self.leadership_mode = mode
        self.leader_name = leader_name
        self.since_epoch = since_epoch
        self.lease_name = lease_name
        self.holder = holder
        self.ttl = float(ttl)
        self.lease_topic = lease_topic
        self.deferrable = deferrable
        self.start_from_trigger = start_from_trigger
        self.pulsarstate_conn_id = pulsarstate_conn_id
        self._hook: PulsarStateHook | None = None
        self._leases: Any = None
        self._logged: Any = None
        if start_from_trigger:
            self.start_trigger_args = start_from_trigger_args(
                self.start_trigger_args,
                # deadline None: the triggerer's timeout_after (from timeout); observing modes
                # end in the trigger, acquire resumes on a worker to acquire
                self._trigger_kwargs(deadline=None, end_from_trigger=mode != "acquire"),
                timeout=self.timeout,
            )

    # ------------------------------------------------------------------ execution
    def execute(self, context: Context) -> Any:
        try:
            if not self.deferrable:
                return super().execute(context)  # poke / reschedule: poke() below
            deadline = time.time() + self.timeout
            if self.leadership_mode == "acquire":
                lease = self._try_acquire(context, timeout=0.0)
                if lease is not None:
                    return lease
            else:
                result = self._observe()
                if result["met"]:
                    return self._succeed(result)
        finally:
            self._close()
        self._defer(deadline)

    def poke(self, context: Context) -> PokeReturnValue:
        if self.leadership_mode == "acquire":
            lease = self._try_acquire(context, timeout=0.0)
            return PokeReturnValue(lease is not None, lease)
        result = self._observe()
        if not result["met"]:
            return PokeReturnValue(False)
        return PokeReturnValue(True, self._succeed(result))

    def execute_complete(self, context: Context, event: Any = None, deadline: float | None = None) -> Any:
        """Resume after the trigger fired: return the XCom, acquire the lease, or raise its timeout or error."""
        _check_event(event, self.leadership_mode)
        if isinstance(event.get("deadline"), (int, float)) and not isinstance(event.get("deadline"), bool):
            deadline = float(event["deadline"])  # the trigger's: also when started from the trigger
        if deadline is None:
            started = getattr(context.get("ti"), "start_date", None)
            deadline = (started.timestamp() if started is not None else time.time()) + self.timeout
        try:
            if self.leadership_mode != "acquire":
                return self._succeed(_met_observation(event, self.leadership_mode))
            lease = self._acquire_after_free(context, event, deadline)
            if lease is not None:
                return lease
            self.log.info("lost the race for lease %r; waiting again", self.lease_name)
        finally:
            self._close()
        self._defer(deadline)

    def _acquire_after_free(self, context: Context, event: Mapping[str, Any], deadline: float) -> dict[str, Any] | None:
        """After the trigger saw the lease free: the lease won, or None when another took it first.

        :raises AirflowSensorTimeout: not won and the deadline passed.
        """
        seen = event.get("lease") if isinstance(event.get("lease"), Mapping) else None
        # Released or never acquired: one attempt. Expired as the trigger saw it: this
        # process must observe the silence itself (up to one ttl; no clock is shared).
        wait = 0.0
        if seen is not None and seen.get("held"):
            wait = min(float(seen.get("ttl") or 0.0) + 1.0, max(0.0, deadline - time.time()))
        lease = self._try_acquire(context, timeout=wait)
        if lease is None and time.time() >= deadline:
            raise AirflowSensorTimeout(f"Sensor has timed out: lease {self.lease_name!r} was not won")
        return lease

    # ------------------------------------------------------------------ internals
    def _defer(self, deadline: float) -> None:
        remaining = max(0.0, deadline - time.time())
        trigger = LeadershipTrigger(**self._trigger_kwargs(deadline=deadline, end_from_trigger=False))
        self.log.info("deferring for up to %.0fs until %s", remaining, self._what())
        self.defer(
            trigger=trigger,
            method_name="execute_complete",
            kwargs={"deadline": deadline},
            timeout=timedelta(seconds=remaining),
        )

    def _trigger_kwargs(self, *, deadline: float | None, end_from_trigger: bool) -> dict[str, Any]:
        """The :class:`LeadershipTrigger` kwargs that watch what this sensor waits for."""
        return {
            "topic": self.topic if self.leadership_mode != "acquire" else None,
            "mode": self.leadership_mode,
            "leader_name": self.leader_name,
            "since_epoch": for_triggerer(self.since_epoch),
            "lease_name": self.lease_name,
            "lease_topic": self.lease_topic,
            "poll_interval": self.poke_interval or 1.0,
            "deadline": deadline,
            "pulsarstate_conn_id": self.pulsarstate_conn_id,
            "end_from_trigger": end_from_trigger,
        }

    def _what(self) -> str:
        if self.leadership_mode == "acquire":
            return f"lease {self.lease_name!r} is won"
        return f"{self.topic} meets {self.leadership_mode!r}"

    def _get_hook(self) -> PulsarStateHook:
        if self._hook is None:
            self._hook = PulsarStateHook(self.pulsarstate_conn_id)
        return self._hook

    def _close(self) -> None:
        hook, self._hook, self._leases = self._hook, None, None
        if hook is not None:
            hook.close()

    def _observe(self) -> dict[str, Any]:
        hook = self._get_hook()
        topic = hook.topic_name(str(self.topic).strip())
        leader_name = (str(self.leader_name).strip() or None) if self.leader_name is not None else None
        result = evaluate(
            topic,
            self.leadership_mode,
            [p.as_json() for p in hook.get_leadership(topic)],
            leader_name=leader_name,
            since_epoch=self.since_epoch,
        )
        shown = [(p["leader"], p["epoch"]) for p in result["partitions"]]
        if not result["met"] and shown != self._logged:
            self._logged = shown
            self.log.info("%s", table(result))
        return result

    def _succeed(self, result: dict[str, Any]) -> dict[str, Any]:
        self.log.info("%s", table(result))
        return result

    def _holder(self, context: Context) -> str:
        return str(self.holder) if self.holder else task_instance_id(context)

    def _try_acquire(self, context: Context, *, timeout: float) -> dict[str, Any] | None:
        """One acquisition (waiting up to ``timeout``): the lease handle as JSON, or None when it is
        still held by someone else. The Leases is kept while this sensor runs (poke mode)."""
        if self._leases is None:
            self._leases = self._get_hook().get_leases((self.lease_topic or "").strip() or None)
        name = str(self.lease_name).strip()
        try:
            lease = self._leases.acquire(name, self._holder(context), ttl=self.ttl, timeout=timeout)
        except LeaseTimeoutError as exc:
            if exc.current != self._logged:
                self._logged = exc.current
                self.log.info("lease %r not won yet: %s", name, exc)
            return None
        self.log.info("won lease %r (holder %r, token %d, ttl %gs)", lease.name, lease.holder, lease.token, lease.ttl)
        return lease.to_json()
