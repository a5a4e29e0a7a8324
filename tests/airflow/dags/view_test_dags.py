"""DAGs for tests/airflow/test_views_operators.py: a Spark job that fails, and a dry run."""

from __future__ import annotations

from pathlib import Path

import pendulum
from airflow.sdk import DAG, Param

from airflow_provider_pulsarstate.operators.views import temp_view_spark_task_group

HERE = Path(__file__).resolve().parent
PRICE_JOB = HERE.parent.parent.parent / "dags" / "jobs" / "price_table_job.py"
SPARK_CONF = {"spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "2"}
START = pendulum.datetime(2026, 1, 1, tz="UTC")

with DAG(
    "views_failing_job",
    schedule=None,
    start_date=START,
    params={"table_topic": Param("failing-table", type="string"), "marker": Param("", type="string")},
) as failing_dag:
    temp_view_spark_task_group(
        "prices",
        table_topic="{{ params.table_topic }}",
        application=str(HERE / "jobs" / "failing_job.py"),
        application_args_extra=["--marker", "{{ params.marker }}"],
        conf=SPARK_CONF,
    )

with DAG(
    "views_dry_run",
    schedule=None,
    start_date=START,
    params={
        "table_topic": Param("dry-run-table", type="string"),
        "version": Param(2, type="integer"),
        "rows": Param(2000, type="integer"),
    },
) as dry_run_dag:
    temp_view_spark_task_group(
        "prices",
        table_topic="{{ params.table_topic }}",
        application=str(PRICE_JOB),
        application_args_extra=["--version", "{{ params.version }}", "--rows", "{{ params.rows }}"],
        scope_prefix="sku-",
        dry_run=True,
        conf=SPARK_CONF,
    )
