"""DAGs for tests/airflow/test_xcom_backend.py (run with PulsarXComBackend configured)."""

from __future__ import annotations

from typing import Any

import pendulum
from airflow.sdk import DAG, Param, task

from tests.airflow.xcom_values import EXPECTED, same

START = pendulum.datetime(2026, 1, 1, tz="UTC")

with DAG("xcom_backend_values", schedule=None, start_date=START, catchup=False,
         params={"big_size": Param(10, type="integer")}):

    @task
    def push(**context: Any) -> dict[str, Any]:
        for key, value in EXPECTED.items():
            context["ti"].xcom_push(key, value)
        return {"pushed": sorted(EXPECTED), "when": EXPECTED["a_datetime"]}

    @task
    def pull(**context: Any) -> list[str]:
        ti = context["ti"]
        got = {key: ti.xcom_pull(task_ids="push", key=key) for key in EXPECTED}
        wrong = [key for key in EXPECTED if not same(got[key], EXPECTED[key])]
        if wrong:
            raise AssertionError(f"values changed in the round trip: {[(k, got[k]) for k in wrong]}")
        summary = ti.xcom_pull(task_ids="push")
        assert same(summary["when"], EXPECTED["a_datetime"]), summary
        return [type(got[key]).__name__ for key in sorted(EXPECTED)]

    @task
    def double(x: int) -> int:
        return x * 2

    @task
    def total(values: Any) -> int:
        return sum(values)

    @task
    def big(**context: Any) -> str:
        return "x" * int(context["params"]["big_size"])

    @task
    def big_len(value: str) -> int:
        return len(value)

    push() >> pull()
    total(double.expand(x=[1, 2, 3]))
    big_len(big())


with DAG("xcom_backend_plain", schedule=None, start_date=START, catchup=False):

    @task
    def produce() -> dict[str, Any]:
        return {"rows": 3, "day": pendulum.date(2026, 11, 23)}

    @task
    def consume(value: dict[str, Any]) -> int:
        return value["rows"]

    consume(produce())


with DAG("xcom_backend_retry", schedule=None, start_date=START, catchup=False):

    @task(retries=1, retry_delay=pendulum.duration(seconds=0))
    def flaky(**context: Any) -> str:
        ti = context["ti"]
        if ti.try_number == 1:
            ti.xcom_push("first_try", {"try": 1})
            # a value that reached the map but never the DB (as if the process died in between)
            from airflow_provider_pulsarstate.xcom.backend import PulsarXComBackend

            PulsarXComBackend.serialize_value(
                {"orphan": True}, key="orphan", task_id=ti.task_id, dag_id=ti.dag_id, run_id=ti.run_id, map_index=-1
            )
            raise RuntimeError("injected failure of try 1")
        from airflow_provider_pulsarstate.hooks.provider_config import settings
        from airflow_provider_pulsarstate.xcom.backend import run_store

        # before this try's first push: what Airflow's clear at the start of the try left in the map
        with run_store(settings(), ti.dag_id, ti.run_id) as store:
            at_start = sorted(e.key for e in store.list_run(ti.dag_id, ti.run_id))
        ti.xcom_push("second_try", {"try": ti.try_number, "at_start": at_start})
        return "done"

    flaky()


with DAG("xcom_backend_cleanup", schedule=None, start_date=START, catchup=False,
         params={"older_than_days": Param(None, type=["null", "number"]), "dry_run": Param(False, type="boolean"), "dag_id": Param("xcom_backend_plain", type="string")}):
    from airflow_provider_pulsarstate.operators.xcom_cleanup import XComCleanupOperator

    XComCleanupOperator(
        task_id="cleanup",
        older_than_days="{{ params.older_than_days }}",
        dry_run="{{ params.dry_run }}",
        dag_id_filter="{{ params.dag_id }}",
    )
