"""DAGs for tests/airflow/test_offset_sensor.py: OffsetProgressSensor in poke and deferred modes."""

from __future__ import annotations

from typing import Any

import pendulum
from airflow.sdk import DAG, Param, task

from airflow_provider_pulsarstate.sensors.offsets import OffsetProgressSensor

START = pendulum.datetime(2026, 1, 1, tz="UTC")
FAST = {"poke_interval": 0.2}


@task
def publish(**context: Any) -> dict[str, Any]:
    """Publish ``params.count`` messages to ``params.topic`` (made with ``params.partitions``);
    return the topic and its total end offset afterwards."""
    from airflow_provider_pulsarstate.hooks.pulsarstate import PulsarStateHook

    params = context["params"]
    with PulsarStateHook() as hook:
        name = hook.create_topic(params["topic"], partitions=params["partitions"])
        publisher = hook.get_publisher(name)
        for i in range(params["count"]):
            publisher.send(f"upstream-{i}".encode())
        publisher.flush(timeout=30)
        end = hook.get_pull_consumer(name).end_offsets()
    return {"topic": name, "end_offset": sum(end.values()), "end_offsets": {str(p): o for p, o in end.items()}}


COMMON_PARAMS = {
    "topic": Param("offsets", type="string"),
    "partitions": Param(0, type="integer"),
    "count": Param(5, type="integer"),
}

# Sensors chained, each waiting for `extra` more messages than the one before: the test feeds
# `extra` messages whenever a sensor first reports the condition unmet.
with DAG(
    "offset_sensor_xcom_target",
    schedule=None,
    start_date=START,
    params={**COMMON_PARAMS, "extra": Param(3, type="integer")},
) as xcom_dag:
    published = publish()
    end = "ti.xcom_pull(task_ids='publish')['end_offset']"
    wait_poke = OffsetProgressSensor(
        task_id="wait_poke",
        topic="{{ params.topic }}",
        target=f"{{{{ {end} + params.extra }}}}",
        deferrable=False,
        timeout=60,
        **FAST,
    )
    wait_deferred = OffsetProgressSensor(
        task_id="wait_deferred",
        topic="{{ params.topic }}",
        target=f"{{{{ {end} + 2 * params.extra }}}}",
        deferrable=True,
        timeout=60,
        **FAST,
    )
    wait_from_trigger = OffsetProgressSensor(
        # dag.test() runs it on the worker (it bypasses start_from_trigger): then it defers as above
        task_id="wait_from_trigger",
        topic="{{ params.topic }}",
        target=f"{{{{ {end} + 3 * params.extra }}}}",
        deferrable=True,
        start_from_trigger=True,
        timeout=60,
        **FAST,
    )
    published >> wait_poke >> wait_deferred >> wait_from_trigger

with DAG(
    "offset_sensor_timeouts",
    schedule=None,
    start_date=START,
    params={**COMMON_PARAMS, "count": Param(1, type="integer")},
) as timeout_dag:
    published = publish()
    never = "{{ ti.xcom_pull(task_ids='publish')['end_offset'] + 1000 }}"
    for name, deferrable, soft_fail in (
        ("timeout_poke", False, False),
        ("timeout_deferred", True, False),
        ("soft_poke", False, True),
        ("soft_deferred", True, True),
    ):
        published >> OffsetProgressSensor(
            task_id=name,
            topic="{{ params.topic }}",
            target=never,
            deferrable=deferrable,
            soft_fail=soft_fail,
            timeout=2,
            **FAST,
        )

for _mode, _deferrable in (("poke", False), ("deferred", True)):
    with DAG(
        f"offset_sensor_watermark_{_mode}",
        schedule=None,
        start_date=START,
        params={**COMMON_PARAMS, "n": Param(5, type="integer")},
    ) as _dag:
        publish() >> OffsetProgressSensor(
            task_id="wait_new",
            topic="{{ params.topic }}",
            condition="new_messages",
            target="{{ params.n }}",
            watermark_key="{{ params.topic }}/" + _mode,
            deferrable=_deferrable,
            timeout=60,
            **FAST,
        )
    globals()[f"watermark_{_mode}_dag"] = _dag
