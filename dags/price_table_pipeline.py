"""A price table recomputed in full by Spark; consumers see only what changed.

``prices.create_view`` opens a temp view on the shared ``price-table``; ``prices.spark_job`` runs
``jobs/price_table_job.py`` with ``spark-submit``, which computes the whole table for
``params.version`` (100k skus by default) and stages every row into the view from the executors;
``prices.apply_view`` publishes only the diff against the committed table, atomically, at one
commit offset: about 1 % of the rows between consecutive versions, not 100k. If the job or the
apply fails, ``prices.drop_view`` drops the view and the table stays as it was. ``report`` logs
what was published and returns it.

Trigger it with ``{"version": 2}`` after ``{"version": 1}`` to see a second run publish only
the changed rows. State lives in the embedded log under AIRFLOW_HOME when there is no
``pulsarstate_default`` connection, in a Pulsar broker when there is one; Spark needs
``AIRFLOW_CONN_SPARK_DEFAULT='{"conn_type": "spark", "host": "local[*]"}'`` (or a real cluster).
With a Spark cluster (or an executor other than LocalExecutor), define ``pulsarstate_default``:
the embedded log is a file on one host and the tasks refuse to use it there.

The view is bounded by ``scope_prefix``. To bound it by code instead, register a predicate by
name in a module this file imports (the apply task resolves it from the same import), e.g.
``register_scope_predicate("eur-skus", lambda key: key.startswith("sku-eur-"))`` from
``airflow_provider_pulsarstate.engine.recipes``, and pass ``scope_predicate="eur-skus"``: the log
records only the name, and an unregistered name fails the task. The job's ``write_view`` seals
the view with per-partition row counts; the apply refuses to delete more than half the table
unless ``max_deletes``/``max_delete_fraction`` says so.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pendulum
from airflow.sdk import Param, dag, get_current_context, task

from airflow_provider_pulsarstate.hooks.pulsarstate import PulsarStateHook
from airflow_provider_pulsarstate.operators.views import temp_view_spark_task_group

log = logging.getLogger(__name__)

JOB = Path(__file__).resolve().parent / "jobs" / "price_table_job.py"
TABLE_TOPIC = "price-table"


@dag(
    dag_id="price_table_pipeline",
    schedule=None,
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    tags=["pulsarstate", "spark", "example"],
    params={
        "version": Param(1, type="integer", minimum=1, description="price table version to compute"),
        "rows": Param(100_000, type="integer", minimum=1, description="skus in version 1"),
        "table_topic": Param(TABLE_TOPIC, type="string", description="the shared state table"),
    },
)
def price_table_pipeline() -> None:
    prices = temp_view_spark_task_group(
        "prices",
        table_topic="{{ params.table_topic }}",
        application=str(JOB),
        application_args_extra=["--version", "{{ params.version }}", "--rows", "{{ params.rows }}"],
        scope_prefix="sku-",
        name="price-table-job",
        conf={"spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "4"},
    )

    @task
    def report(result: dict) -> dict:
        """Log what the switch published and the table's size; the summary is the XCom."""
        params = get_current_context()["params"]
        with PulsarStateHook() as hook, hook.get_table(params["table_topic"]) as table:
            size = table.size(latest=True)
        summary = {
            "version": params["version"],
            "view_id": result["view_id"],
            "published": result["set"] + result["delete"],
            "set": result["set"],
            "delete": result["delete"],
            "unchanged": result["unchanged"],
            "table_rows": size,
            "commit_offset": result["commit_offset"],
        }
        log.info(
            "price table v%s published\n%s",
            params["version"],
            "\n".join(f"  {name:<14} {value:>12}" for name, value in summary.items() if name != "version"),
        )
        return summary

    report(prices.apply.output)


price_table_pipeline()
