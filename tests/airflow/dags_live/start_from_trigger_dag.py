"""DAGs for the live scheduler + triggerer tests: sensors that start from the trigger.

Their execute() and execute_complete() leave a marker file: a worker running either would show.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pendulum
from airflow.sdk import DAG, Param

from airflow_provider_pulsarstate.sensors.leadership import LeadershipSensor
from airflow_provider_pulsarstate.sensors.offsets import OffsetProgressSensor

START = pendulum.datetime(2026, 1, 1, tz="UTC")


class MarkWorkerRuns:
    """Mixed in before a sensor: leaves the marker file if a worker ever runs it."""

    def execute(self, context: Any) -> Any:
        Path(context["params"]["marker"]).write_text("execute ran on a worker")
        return super().execute(context)  # type: ignore[misc]

    def execute_complete(self, context: Any, event: Any = None) -> Any:
        Path(context["params"]["marker"]).write_text("execute_complete ran on a worker")
        return super().execute_complete(context, event)  # type: ignore[misc]


class MarkedOffsetSensor(MarkWorkerRuns, OffsetProgressSensor):
    pass


class MarkedLeadershipSensor(MarkWorkerRuns, LeadershipSensor):
    pass


with DAG(
    "offset_sensor_start_from_trigger",
    schedule=None,
    start_date=START,
    params={
        "topic": Param("events", type="string"),
        "target": Param(1, type="integer"),
        "marker": Param("", type="string"),
    },
) as dag:
    MarkedOffsetSensor(
        task_id="wait",
        topic="{{ params.topic }}",
        target="{{ params.target }}",
        deferrable=True,
        start_from_trigger=True,
        poke_interval=0.5,
        timeout=300,
    )

with DAG(
    "leadership_sensor_start_from_trigger",
    schedule=None,
    start_date=START,
    params={
        "topic": Param("state", type="string"),
        "leader": Param("x", type="string"),
        "marker": Param("", type="string"),
    },
) as leadership_dag:
    MarkedLeadershipSensor(
        task_id="wait",
        topic="{{ params.topic }}",
        mode="leader",
        leader_name="{{ params.leader }}",
        deferrable=True,
        start_from_trigger=True,
        poke_interval=0.5,
        timeout=300,
    )
