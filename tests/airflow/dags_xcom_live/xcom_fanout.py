"""A fan-out of 100 mapped task instances, each pushing its XCom, and one task reading all 100."""

from __future__ import annotations

from typing import Any

import pendulum
from airflow.sdk import DAG, task

with DAG(
    "xcom_fanout", schedule=None, start_date=pendulum.datetime(2026, 1, 1, tz="UTC"), catchup=False, max_active_tasks=64
):

    @task
    def items(**context: Any) -> list[int]:
        return list(range(int(context["dag_run"].conf.get("n", 100))))

    @task(retries=0)
    def square(x: int) -> dict[str, int]:
        return {"x": x, "square": x * x}

    @task
    def collect(values: Any) -> dict[str, int]:
        got = sorted(v["x"] for v in values)
        if got != list(range(len(got))) or any(v["square"] != v["x"] ** 2 for v in values):
            raise AssertionError(f"wrong values: {got}")
        return {"count": len(got), "sum_of_squares": sum(v["square"] for v in values)}

    collect(square.expand(x=items()))
