"""DAGs for tests/airflow/test_leadership_sensor.py: LeadershipSensor in poke, deferred and acquire modes."""

from __future__ import annotations

from typing import Any

import pendulum
from airflow.sdk import DAG, Param, task

from airflow_provider_pulsarstate.sensors.leadership import LeadershipSensor

START = pendulum.datetime(2026, 1, 1, tz="UTC")
FAST = {"poke_interval": 0.2}


@task
def create(**context: Any) -> str:
    """Create ``params.topic``; return its full name."""
    from airflow_provider_pulsarstate.hooks.pulsarstate import PulsarStateHook

    with PulsarStateHook() as hook:
        return hook.create_topic(context["params"]["topic"])


# Each sensor finds its mode unmet first; the test then changes who leads (see the test's Actor).
with DAG(
    "leadership_sensor_modes", schedule=None, start_date=START, params={"topic": Param("t", type="string")}
) as modes_dag:
    created = create()
    leader_poke = LeadershipSensor(
        task_id="leader_poke",
        topic="{{ params.topic }}",
        mode="leader",
        leader_name="cand-a",
        deferrable=False,
        timeout=60,
        **FAST,
    )
    no_leader_deferred = LeadershipSensor(
        task_id="no_leader_deferred",
        topic="{{ params.topic }}",
        mode="no_leader",
        deferrable=True,
        timeout=60,
        **FAST,
    )
    changed_from_trigger = LeadershipSensor(
        # dag.test() runs it on the worker (it bypasses start_from_trigger): then it defers as above
        task_id="changed_from_trigger",
        topic="{{ params.topic }}",
        mode="changed",
        since_epoch="{{ ti.xcom_pull(task_ids='leader_poke')['partitions'][0]['epoch'] }}",
        deferrable=True,
        start_from_trigger=True,
        timeout=60,
        **FAST,
    )
    created >> leader_poke >> no_leader_deferred >> changed_from_trigger

with DAG(
    "leadership_sensor_timeouts", schedule=None, start_date=START, params={"topic": Param("t", type="string")}
) as timeout_dag:
    created = create()
    for name, deferrable, soft_fail in (
        ("timeout_poke", False, False),
        ("timeout_deferred", True, False),
        ("soft_poke", False, True),
        ("soft_deferred", True, True),
    ):
        created >> LeadershipSensor(
            task_id=name,
            topic="{{ params.topic }}",
            mode="leader",
            deferrable=deferrable,
            soft_fail=soft_fail,
            timeout=2,
            **FAST,
        )


@task
def occupy(holder: str, ttl: float, **context: Any) -> dict[str, Any]:
    """Another deployment takes the lease (and, unless the test releases it, keeps it)."""
    from airflow_provider_pulsarstate.hooks.pulsarstate import PulsarStateHook

    params = context["params"]
    with PulsarStateHook() as hook:
        leases = hook.get_leases(params["lease_topic"])
        return leases.acquire(params["lease_name"], holder, ttl=ttl, timeout=10).to_json()


@task
def release(handle: dict[str, Any], **context: Any) -> bool:
    from airflow_provider_pulsarstate.engine.recipes.lease import Lease
    from airflow_provider_pulsarstate.hooks.pulsarstate import PulsarStateHook

    with PulsarStateHook() as hook:
        return hook.get_leases(context["params"]["lease_topic"]).release(Lease.from_json(handle))


with DAG(
    "leadership_sensor_acquire",
    schedule=None,
    start_date=START,
    params={"lease_name": Param("l", type="string"), "lease_topic": Param("leases", type="string")},
) as acquire_dag:
    lease_args = {
        "mode": "acquire",
        "lease_name": "{{ params.lease_name }}",
        "lease_topic": "{{ params.lease_topic }}",
        "ttl": 30,
        "timeout": 60,
        **FAST,
    }
    first = occupy.override(task_id="occupy_1")("deployment-b", 30)
    acquire_poke = LeadershipSensor(task_id="acquire_poke", deferrable=False, **lease_args)
    second = occupy.override(task_id="occupy_2")("deployment-b", 30)
    acquire_deferred = LeadershipSensor(task_id="acquire_deferred", deferrable=True, **lease_args)
    third = occupy.override(task_id="occupy_dead")("deployment-dead", 2)  # never renewed nor released
    acquire_expired = LeadershipSensor(task_id="acquire_expired", deferrable=True, **lease_args)
    first >> acquire_poke >> release.override(task_id="release_poke")(acquire_poke.output) >> second
    second >> acquire_deferred >> release.override(task_id="release_deferred")(acquire_deferred.output) >> third
    third >> acquire_expired
    # the lease is now held (ttl 30) by acquire_expired: these give up after 2 s, skipped
    for name, deferrable in (("acquire_soft_poke", False), ("acquire_soft_deferred", True)):
        acquire_expired >> LeadershipSensor(
            task_id=name,
            deferrable=deferrable,
            soft_fail=True,
            **{**lease_args, "timeout": 2},
        )

with DAG(
    "leadership_sensor_acquire_race",
    schedule=None,
    start_date=START,
    params={"lease_name": Param("l", type="string"), "lease_topic": Param("leases", type="string")},
) as race_dag:
    # the test releases deployment-b's lease, then takes it again (ttl 1.5 s, never renewed) just
    # as the trigger reports it free: the sensor loses the race, defers again and wins after expiry
    occupy.override(task_id="occupy")("deployment-b", 30) >> LeadershipSensor(
        task_id="acquire_race",
        deferrable=True,
        mode="acquire",
        lease_name="{{ params.lease_name }}",
        lease_topic="{{ params.lease_topic }}",
        ttl=30,
        timeout=60,
        **FAST,
    )
