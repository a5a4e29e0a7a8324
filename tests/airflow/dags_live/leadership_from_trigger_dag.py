"""A DAG for the live scheduler + triggerer test: a leadership sensor that starts from the trigger.

Its execute() and execute_complete() leave a marker file: a worker running either would show.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pendulum
from airflow.sdk import DAG, Param

from airflow_provider_pulsarstate.sensors.leadership import LeadershipSensor


class MarkedLeadershipSensor(LeadershipSensor):
    def execute(self, context: Any) -> Any:
        Path(context["params"]["marker"]).write_text("execute ran on a worker")
        return super().execute(context)

    def execute_complete(self, context: Any, event: Any = None) -> Any:
        Path(context["params"]["marker"]).write_text("execute_complete ran on a worker")
        return super().execute_complete(context, event)


with DAG(
    "leadership_sensor_start_from_trigger",
    schedule=None,
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    params={"topic": Param("state", type="string"), "leader": Param("x", type="string"), "marker": Param("", type="string")},
) as dag:
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
