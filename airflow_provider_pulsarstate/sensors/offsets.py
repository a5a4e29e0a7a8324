"""``OffsetProgressSensor``: gate a task on a topic's progress, measured in offsets.

Conditions (``condition=``; the numbers are offsets as the pull consumer numbers them):

==================  ============================================================================
``end_offset``      the topic's end offset (last + 1) reaches ``target``, e.g. the offset an
                    upstream task published up to (an XCom or a template)
``committed``       ``subscription``'s committed offset (next to consume) reaches ``target``
``lag``             end - committed of ``subscription`` falls to ``target`` or below
``new_messages``    at least ``target`` messages arrived since a watermark kept in a PulsarMap
==================  ============================================================================

``target`` is an int (compared with the sum over partitions, or with every partition when
``per_partition``), or a dict of partition -> int (each named partition); templates and XComs
are rendered first (``"{{ ti.xcom_pull(task_ids='publish')['end_offset'] }}"``).

Modes: poke (or reschedule) with a pull consumer, or deferred to the triggerer
(``deferrable=True``; default from ``[operators] default_deferrable``) where
:class:`~airflow_provider_pulsarstate.triggers.offsets.OffsetProgressTrigger` polls without
blocking the event loop. ``timeout`` and ``soft_fail`` hold in every mode: the trigger is
deferred with the time left, and fires a timeout event itself at that deadline, so a deferred
sensor fails (or, with ``soft_fail``, is skipped) on time even where the deferral timeout is not
enforced (``dag.test()``). With ``start_from_trigger=True`` the scheduler starts the trigger
directly and the trigger ends the task with the offsets as its XCom: no worker runs the sensor
unless it fails or times out (then a worker raises the error, so retries, ``soft_fail`` and
callbacks behave as in the other modes). Errors (unknown topic or partition, a bad target, a
broker without the offset index) fail the task with the problem named; ``soft_fail`` skips only
on timeout.

Watermarks (``condition="new_messages"``): a PulsarMap on ``watermark_map`` (short name in the
connection's namespace; default :data:`DEFAULT_WATERMARK_MAP`) holds, under ``watermark_key``
(default ``"<dag_id>/<task_id>"``), the JSON value::

    {"topic": "persistent://public/default/events",     # the topic it tracks (checked)
     "offsets": {"0": 1200, "1": 1180},                  # the watermark: partition -> end offset
     "previous": {"0": 1000, "1": 990},                  # the one before the last advance
     "advanced_by": "<dag_id>/<run_id>/<task_id>/<map_index>",
     "advanced_at": "2026-11-23T09:00:00+00:00"}

A missing key counts from offset 0 (the topic's whole history). With ``advance_watermark``
(the default) the sensor moves the watermark, when it succeeds and atomically, to the end
offsets it saw (never backwards); the next run then waits for ``target`` messages beyond them.
A retry or clear of the same task instance in the same run measures again from ``previous``, so
it is not stalled by its own earlier advance. The watermark gates runs; it does not record
consumption (a consumer uses its subscription's committed offsets for that). With
``advance_watermark=False`` a later task advances it with :func:`advance_watermark`.
Watermarks need a worker (the map is read and written there), so ``new_messages`` does not
combine with ``start_from_trigger``.

The sensor returns (XCom) the offsets it saw, e.g.::

    {"topic": "persistent://public/default/events", "condition": "end_offset", "target": 500,
     "per_partition": false, "met": true, "end_offsets": {"0": 260, "1": 251}, "value": 511}

plus ``committed`` (with a subscription), ``watermark`` and ``watermark_advanced_to``
(``new_messages``), and logs them as a table (partition / end / committed / value / target).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseSensorOperator, PokeReturnValue
from airflow.sdk.configuration import conf
from airflow.sdk.exceptions import AirflowSensorTimeout

from airflow_provider_pulsarstate.engine.errors import PulsarStateError
from airflow_provider_pulsarstate.hooks.pulsarstate import PulsarStateHook
from airflow_provider_pulsarstate.lineage.operators import TaskLineageMixin, record_ranges
from airflow_provider_pulsarstate.plugins.links import PulsarStateSubscriptionLink
from airflow_provider_pulsarstate.sensors.trigger_start import (
    default_start_trigger_args,
    for_triggerer,
    is_xcom_arg,
    start_from_trigger_args,
    task_instance_id,
)
from airflow_provider_pulsarstate.triggers.offset_conditions import (
    Progress,
    ProgressError,
    check_condition,
    evaluate,
    offsets_json,
    parse_offsets,
    parse_target,
    target_json,
)
from airflow_provider_pulsarstate.triggers.offsets import OffsetProgressTrigger

if TYPE_CHECKING:
    from airflow.sdk import Context

    from airflow_provider_pulsarstate.hooks.pulsarstate import PulsarMap

DEFAULT_WATERMARK_MAP = "pulsarstate-offset-watermarks"
"""The PulsarMap (short name) that holds ``new_messages`` watermarks unless ``watermark_map`` says otherwise."""


def _is_template(value: Any) -> bool:
    return isinstance(value, str) and any(mark in value for mark in ("{{", "{%", "{#"))


class OffsetProgressSensor(TaskLineageMixin, BaseSensorOperator):
    """Wait until a topic's offsets meet a condition; returns the offsets it saw (see the module docstring).

    Usage::

        publish = PublishEventsOperator(...)   # returns {"end_offset": 500, ...}
        wait = OffsetProgressSensor(
            task_id="wait_for_events",
            topic="price-events",
            condition="end_offset",
            target="{{ ti.xcom_pull(task_ids='publish')['end_offset'] }}",
            deferrable=True,
            timeout=3600,
        )

    :param topic: short name (the connection's namespace) or full ``persistent://...``. Templated.
    :param condition: ``end_offset`` (default), ``committed``, ``lag`` or ``new_messages``.
    :param target: the offset to reach (``end_offset``, ``committed``), the lag bound (``lag``)
        or the number of new messages (``new_messages``): an int, a dict of partition -> int, or
        a template / XComArg rendering to one. Templated.
    :param subscription: the subscription (``committed``, ``lag``). Templated.
    :param per_partition: every partition must meet an int target (default: the sum over partitions).
    :param watermark_map: the PulsarMap holding watermarks (``new_messages``). Templated.
    :param watermark_key: the key of this sensor's watermark (default ``"<dag_id>/<task_id>"``). Templated.
    :param advance_watermark: move the watermark to the offsets seen when the sensor succeeds.
    :param deferrable: wait in the triggerer (default ``[operators] default_deferrable``).
    :param start_from_trigger: with ``deferrable``, the scheduler starts the trigger directly and
        the trigger ends the task (no worker slot); not with ``new_messages``.
    :param pulsarstate_conn_id: the ``pulsarstate`` connection (missing default: embedded log).
    :param kwargs: BaseSensorOperator's: ``poke_interval`` (also the trigger's poll interval),
        ``timeout``, ``soft_fail``, ``mode``, ...
    :raises ValueError: an unknown condition, a missing subscription or target, or an
        unsupported combination (at DAG parse time).
    """

    template_fields: Sequence[str] = ("topic", "target", "subscription", "watermark_map", "watermark_key")
    operator_extra_links = (PulsarStateSubscriptionLink(),)
    ui_color = "#e4f0e8"
    start_trigger_args = default_start_trigger_args(OffsetProgressTrigger)
    start_from_trigger = False

    def __init__(
        self,
        *,
        topic: str,
        target: Any,
        condition: str = "end_offset",
        subscription: str | None = None,
        per_partition: bool = False,
        watermark_map: str = DEFAULT_WATERMARK_MAP,
        watermark_key: str | None = None,
        advance_watermark: bool = True,
        deferrable: bool = conf.getboolean("operators", "default_deferrable", fallback=False),
        start_from_trigger: bool = False,
        pulsarstate_conn_id: str = PulsarStateHook.default_conn_name,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        check_condition(condition, subscription=subscription, per_partition=per_partition)
        if target is None:
            raise ProgressError("target is required (an int, a dict of partition -> int, or a template/XComArg)")
        if not (_is_template(target) or is_xcom_arg(target)):
            parse_target(target)  # fail at parse time on a literal that can never work
        if start_from_trigger and not deferrable:
            raise ProgressError("start_from_trigger needs deferrable=True")
        if start_from_trigger and condition == "new_messages":
            raise ProgressError(
                "condition 'new_messages' reads and advances its watermark on a worker: it cannot start_from_trigger"
            )
        self.topic = topic
        self.condition = condition
        self.target = target
        self.subscription = subscription
        self.per_partition = per_partition
        self.watermark_map = watermark_map
        self.watermark_key = watermark_key
        self.advance_watermark = advance_watermark
        self.deferrable = deferrable
        self.start_from_trigger = start_from_trigger
        self.pulsarstate_conn_id = pulsarstate_conn_id
        self._hook: PulsarStateHook | None = None
        self._consumer: Any = None
        self._baseline: dict[int, int] | None = None
        self._logged_total: int | None = None
        if start_from_trigger:
            self.start_trigger_args = start_from_trigger_args(
                self.start_trigger_args,
                {
                    "topic": topic,
                    "condition": condition,
                    "target": for_triggerer(target),
                    "subscription": subscription,
                    "per_partition": per_partition,
                    "watermark": None,
                    "poll_interval": self.poke_interval or 1.0,
                    "deadline": None,  # the triggerer's timeout_after (from timeout)
                    "pulsarstate_conn_id": pulsarstate_conn_id,
                    "end_from_trigger": True,
                },
                timeout=self.timeout,
            )

    # ------------------------------------------------------------------ execution
    def execute(self, context: Context) -> Any:
        try:
            if not self.deferrable:
                return super().execute(context)  # poke / reschedule: poke() below
            started = time.monotonic()
            progress = self._check(context)
            if progress.met:
                return self._succeed(context, progress)
            remaining = max(0.0, self.timeout - (time.monotonic() - started))
            trigger = OffsetProgressTrigger(
                topic=progress.topic,
                condition=self.condition,
                target=target_json(progress.target),
                subscription=self.subscription,
                per_partition=self.per_partition,
                watermark=offsets_json(self._baseline) if self._baseline is not None else None,  # type: ignore[arg-type]
                poll_interval=self.poke_interval or 1.0,
                deadline=time.time() + remaining,
                pulsarstate_conn_id=self.pulsarstate_conn_id,
            )
        finally:
            self._close()
        self.log.info("deferring for up to %.0fs until the condition holds", remaining)
        self.defer(trigger=trigger, method_name="execute_complete", timeout=timedelta(seconds=remaining))

    def poke(self, context: Context) -> PokeReturnValue:
        progress = self._check(context)
        if not progress.met:
            return PokeReturnValue(False)
        return PokeReturnValue(True, self._succeed(context, progress))

    def execute_complete(self, context: Context, event: Any = None) -> dict[str, Any]:
        """Resume after the trigger fired: return the offsets, or raise its timeout or error."""
        if not isinstance(event, Mapping) or event.get("status") not in ("success", "timeout", "error"):
            raise PulsarStateError(f"unexpected event from the offset trigger: {event!r}")
        if event["status"] == "timeout":
            raise AirflowSensorTimeout(
                f"Sensor has timed out: {event.get('message')}; last seen: {event.get('progress')}"
            )
        if event["status"] == "error":
            raise PulsarStateError(f"{event.get('error_type', 'error')}: {event.get('message')}")
        seen = event.get("progress")
        try:
            # re-decided from the numbers the trigger saw: an event is evidence, not a verdict
            progress = _progress_from_xcom(seen)
        except (ProgressError, KeyError, TypeError) as exc:
            raise PulsarStateError(f"malformed offsets in the trigger's event ({exc}): {seen!r}") from None
        if not progress.met:
            raise PulsarStateError(f"the trigger fired but its offsets do not meet the condition: {seen!r}")
        try:
            return self._succeed(context, progress)
        finally:
            self._close()

    # ------------------------------------------------------------------ internals
    def _get_hook(self) -> PulsarStateHook:
        if self._hook is None:
            self._hook = PulsarStateHook(self.pulsarstate_conn_id)
        return self._hook

    def _close(self) -> None:
        hook, self._hook, self._consumer = self._hook, None, None
        if hook is not None:
            hook.close()

    def _check(self, context: Context) -> Progress:
        hook = self._get_hook()
        target = parse_target(self.target)
        subscription = (self.subscription or "").strip() or None
        if self._consumer is None:
            self._consumer = hook.get_pull_consumer(str(self.topic).strip(), subscription)
        consumer = self._consumer
        watermark = None
        if self.condition == "new_messages":
            if self._baseline is None:
                self._baseline = self._read_baseline(context, consumer.topic)
            watermark = self._baseline
        end = consumer.end_offsets()
        committed = {p: consumer.committed(partition=p) for p in end} if subscription else None
        progress = evaluate(
            topic=consumer.topic,
            condition=self.condition,
            target=target,
            end_offsets=end,
            committed=committed,
            watermark=watermark,
            per_partition=self.per_partition,
        )
        if progress.total != self._logged_total and not progress.met:
            self._logged_total = progress.total
            self.log.info("%s", progress.table())
        return progress

    def _succeed(self, context: Context, progress: Progress) -> dict[str, Any]:
        result = progress.as_xcom()
        if self.condition == "new_messages" and self.advance_watermark:
            advanced = advance_watermark(
                self._watermark_map(),
                self._watermark_key(context),
                topic=progress.topic,
                offsets=progress.end_offsets,
                advanced_by=task_instance_id(context),
            )
            result["watermark_advanced_to"] = offsets_json(advanced)
        if lineage := self.start_lineage(self._get_hook().get_config()):
            record_ranges(
                lineage, progress.topic, start=progress.watermark or progress.committed, end=progress.end_offsets
            )
        self.log.info("%s", progress.table())
        return result

    def _watermark_map(self) -> PulsarMap[Any, Any]:
        return self._get_hook().get_map(str(self.watermark_map).strip())

    def _watermark_key(self, context: Context) -> str:
        if self.watermark_key:
            return str(self.watermark_key)
        ti = context["ti"]
        return f"{ti.dag_id}/{ti.task_id}"

    def _read_baseline(self, context: Context, topic: str) -> dict[int, int]:
        key = self._watermark_key(context)
        value = self._watermark_map().get(key, latest=True)
        baseline = read_watermark(value, key=key, topic=topic, identity=task_instance_id(context))
        self.log.info("watermark %r of %s: %s", key, topic, offsets_json(baseline) or "none yet (counting from 0)")
        return baseline


def _progress_from_xcom(seen: Any) -> Progress:
    if not isinstance(seen, Mapping):
        raise ProgressError(f"expected a dict, got {type(seen).__name__}")
    return evaluate(
        topic=str(seen["topic"]),
        condition=str(seen["condition"]),
        target=parse_target(seen["target"]),
        end_offsets=parse_offsets(seen["end_offsets"], "end_offsets"),
        committed=(
            {int(p): (None if c is None else int(c)) for p, c in seen["committed"].items()}
            if seen.get("committed") is not None
            else None
        ),
        watermark=parse_offsets(seen["watermark"], "watermark") if seen.get("watermark") is not None else None,
        per_partition=bool(seen.get("per_partition", False)),
    )


# ---------------------------------------------------------------------------------- watermarks
def read_watermark(value: Any, *, key: str, topic: str, identity: str | None = None) -> dict[int, int]:
    """The offsets to count new messages from, out of a watermark value (see the module docstring).

    A missing value gives ``{}`` (count from 0). When ``identity`` advanced it last (a retry of
    the same task instance in the same run), its ``previous`` offsets.

    :raises ProgressError: the value is malformed, or tracks another topic (names key and topics).
    """
    if value is None:
        return {}
    if not isinstance(value, Mapping) or not isinstance(value.get("offsets"), Mapping):
        raise ProgressError(f"watermark {key!r} is not a watermark value (no 'offsets' dict): {value!r}")
    if value.get("topic") != topic:
        raise ProgressError(
            f"watermark {key!r} tracks topic {value.get('topic')!r}, not {topic}: give this sensor its own watermark_key"
        )
    if identity is not None and value.get("advanced_by") == identity and isinstance(value.get("previous"), Mapping):
        return parse_offsets(value["previous"], f"watermark {key!r} previous offsets")
    return parse_offsets(value["offsets"], f"watermark {key!r} offsets")


def advance_watermark(
    watermarks: PulsarMap[Any, Any],
    key: str,
    *,
    topic: str,
    offsets: Mapping[int, int],
    advanced_by: str,
) -> dict[int, int]:
    """Atomically move watermark ``key`` of ``topic`` up to ``offsets`` (per partition, never down).

    ``previous`` keeps the offsets before the first advance by ``advanced_by``, so repeated
    advances by the same task instance (retries) keep the same baseline.

    :return: the watermark's offsets after the advance.
    :raises ProgressError: the stored value is malformed or tracks another topic.
    """
    seen = {int(p): int(o) for p, o in offsets.items()}

    def advance(_key: str, old: Any) -> dict[str, Any]:
        current = read_watermark(old, key=key, topic=topic)
        if old is not None and old.get("advanced_by") == advanced_by and isinstance(old.get("previous"), Mapping):
            previous = old["previous"]
        else:
            previous = offsets_json(current)
        merged = {p: max(current.get(p, 0), seen.get(p, 0)) for p in sorted(set(current) | set(seen))}
        return {
            "topic": topic,
            "offsets": offsets_json(merged),
            "previous": previous,
            "advanced_by": advanced_by,
            "advanced_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        }

    value = watermarks.update(key, advance)
    return parse_offsets(value["offsets"], f"watermark {key!r} offsets")  # type: ignore[index]
