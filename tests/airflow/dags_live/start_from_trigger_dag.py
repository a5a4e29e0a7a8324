"""A DAG for the live scheduler + triggerer test: a sensor that starts from the trigger.

Its execute() and execute_complete() leave a marker file: a worker running either would show.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pendulum
from airflow.sdk import DAG, Param

from airflow_provider_pulsarstate.sensors.offsets import OffsetProgressSensor


class MarkedOffsetSensor(OffsetProgressSensor):
    def execute(self, context: Any) -> Any:
        Path(context["params"]["marker"]).write_text("execute ran on a worker")
        return super().execute(context)

    def execute_complete(self, context: Any, event: Any = None) -> Any:
        Path(context["params"]["marker"]).write_text("execute_complete ran on a worker")
        return super().execute_complete(context, event)


with DAG(
    "offset_sensor_start_from_trigger",
    schedule=None,
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    params={"topic": Param("events", type="string"), "target": Param(1, type="integer"), "marker": Param("", type="string")},
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
