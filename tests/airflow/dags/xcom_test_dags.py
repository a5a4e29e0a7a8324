"""DAGs for tests/airflow/test_xcom_backend.py (run with PulsarXComBackend configured)."""

from __future__ import annotations

from typing import Any

import pendulum
from airflow.sdk import DAG, Param, task

from tests.airflow.xcom_values import EXPECTED, same

START = pendulum.datetime(2026, 1, 1, tz="UTC")

with DAG(
    "xcom_backend_values",
    schedule=None,
    start_date=START,
    catchup=False,
    params={"big_size": Param(10, type="integer")},
):

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
        from airflow_provider_pulsarstate.provider_settings import settings
        from airflow_provider_pulsarstate.xcom.backend import run_store

        # before this try's first push: what Airflow's clear at the start of the try left in the map
        with run_store(settings(), ti.dag_id, ti.run_id) as store:
            at_start = sorted(e.key for e in store.list_run(ti.dag_id, ti.run_id))
        ti.xcom_push("second_try", {"try": ti.try_number, "at_start": at_start})
        return "done"

    flaky()


with DAG(
    "xcom_backend_cleanup",
    schedule=None,
    start_date=START,
    catchup=False,
    params={
        "older_than_days": Param(None, type=["null", "number"]),
        "dry_run": Param(False, type="boolean"),
        "dag_id": Param("xcom_backend_plain", type="string"),
    },
):
    from airflow_provider_pulsarstate.operators.xcom_cleanup import XComCleanupOperator

    XComCleanupOperator(
        task_id="cleanup",
        older_than_days="{{ params.older_than_days }}",
        dry_run="{{ params.dry_run }}",
        dag_id_filter="{{ params.dag_id }}",
    )


with DAG(
    "xcom_isolation",
    schedule=None,
    start_date=START,
    catchup=False,
    params={
        "victim_topic": Param("", type="string"),
        "victim_key": Param("", type="string"),
        "victim_dag": Param("", type="string"),
        "victim_run": Param("", type="string"),
        "victim_ref": Param("", type="string"),
    },
):
    # Attacks on another DAG's XCom through this backend; each must be refused and leave it intact.

    def _forged(params: dict[str, Any]) -> dict[str, Any]:
        import json

        from airflow_provider_pulsarstate.xcom.backend import REFERENCE_MARKER

        if params.get("victim_ref"):  # the victim's own reference, copied whole (address and writer too)
            return json.loads(params["victim_ref"])
        return {
            REFERENCE_MARKER: 2,
            "topic": params["victim_topic"],
            "key": params["victim_key"],
            "size": 1,
            "type": "dict",
            "written_at": "2026-01-01T00:00:00+00:00",
        }

    @task(retries=1, retry_delay=pendulum.duration(seconds=0))
    def forge(**context: Any) -> dict[str, str]:
        from airflow.sdk.bases.xcom import BaseXCom
        from airflow.sdk.execution_time.xcom import XCom

        ti, params = context["ti"], context["params"]
        # a row of this task holding a reference to the victim's entry (as the REST API could write it)
        BaseXCom._set_xcom_in_db("stolen", _forged(params), dag_id=ti.dag_id, task_id=ti.task_id, run_id=ti.run_id)
        if ti.try_number == 1:
            raise RuntimeError("injected: Airflow purges this try's XComs ('stolen') when try 2 starts")
        try:
            XCom.set(
                "return_value",
                "overwritten",
                dag_id=params["victim_dag"],
                task_id="produce",
                run_id=params["victim_run"],
                map_index=-1,
            )
            overwrite = "accepted"
        except Exception as exc:
            overwrite = f"{type(exc).__name__}: {exc}"
        # an over-limit value that carries the reference marker: kept in the DB, never followed
        ti.xcom_push("lookalike", {**_forged(params), "pad": "x" * 3000})
        return {"overwrite": overwrite}

    @task
    def read_forged(**context: Any) -> str:
        try:
            return f"read: {context['ti'].xcom_pull(task_ids='forge', key='stolen')!r}"
        except Exception as exc:
            return f"{type(exc).__name__}: {exc}"

    @task
    def read_lookalike(**context: Any) -> dict[str, Any]:
        return context["ti"].xcom_pull(task_ids="forge", key="lookalike")

    done = forge()
    done >> [read_forged(), read_lookalike()]
