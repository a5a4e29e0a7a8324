"""What the project's sensors share to start from their trigger, and to name the task instance.

A sensor class declares :func:`default_start_trigger_args` (Airflow reads it from the class); an
instance with ``start_from_trigger=True`` replaces it with :func:`start_from_trigger_args`, never
mutating the class's shared value.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from airflow.triggers.base import StartTriggerArgs

if TYPE_CHECKING:
    from airflow.sdk import Context


def default_start_trigger_args(trigger_cls: type) -> StartTriggerArgs:
    """The class-level ``start_trigger_args`` of a sensor that defers to ``trigger_cls`` and
    resumes in ``execute_complete``: the trigger named by its import path, no kwargs yet."""
    return StartTriggerArgs(
        trigger_cls=f"{trigger_cls.__module__}.{trigger_cls.__qualname__}",
        trigger_kwargs={},
        next_method="execute_complete",
        next_kwargs=None,
        timeout=None,
    )


def start_from_trigger_args(
    defaults: StartTriggerArgs, trigger_kwargs: Mapping[str, Any], *, timeout: float
) -> StartTriggerArgs:
    """A copy of ``defaults`` with the trigger's kwargs and the sensor's ``timeout`` (seconds).

    The trigger's own ``deadline`` should be None in ``trigger_kwargs``: the triggerer's
    ``timeout_after`` (from ``timeout``) then ends it.
    """
    # replaced, not mutated: start_trigger_args is shared by every instance of the class
    return dataclasses.replace(defaults, trigger_kwargs=dict(trigger_kwargs), timeout=timedelta(seconds=timeout))


def is_xcom_arg(value: Any) -> bool:
    """Whether ``value`` is an XComArg (rendered at run time, never checked at parse time)."""
    from airflow.sdk.definitions.xcom_arg import XComArg

    return isinstance(value, XComArg)


def for_triggerer(value: Any) -> Any:
    """``value`` as a trigger kwarg: an XComArg becomes its xcom_pull template, rendered in the triggerer."""
    return str(value) if is_xcom_arg(value) else value


def task_instance_id(context: Context) -> str:
    """``"<dag_id>/<run_id>/<task_id>/<map_index>"`` of the running task instance (-1: not mapped)."""
    ti = context["ti"]
    map_index = getattr(ti, "map_index", -1)
    return f"{ti.dag_id}/{ti.run_id}/{ti.task_id}/{-1 if map_index is None else map_index}"
