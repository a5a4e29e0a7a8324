"""DAGs for tests/airflow/test_table_assets.py: an apply without Spark, and a DAG scheduled on its table."""

from __future__ import annotations

import pendulum
from airflow.sdk import DAG, Asset, Param, task

from airflow_provider_pulsarstate.engine.recipes.table import ViewStager
from airflow_provider_pulsarstate.hooks.pulsarstate import PulsarStateHook
from airflow_provider_pulsarstate.operators.views import ApplyTempViewOperator, CreateTempViewOperator

TABLE_TOPIC = "asset-test-prices"
START = pendulum.datetime(2026, 1, 1, tz="UTC")

with DAG(
    "table_assets_apply",
    schedule=None,
    start_date=START,
    params={"rows": Param({}, type="object"), "table_topic": Param(TABLE_TOPIC, type="string")},
) as apply_dag:
    create = CreateTempViewOperator(task_id="create_view", table_topic="{{ params.table_topic }}")

    @task
    def stage(view: dict, params: dict | None = None) -> int:
        """Stage ``params.rows`` as the table's full content (the part a Spark job usually does)."""
        assert params is not None
        with PulsarStateHook() as hook:
            table = hook.get_table(params["table_topic"])
            with ViewStager(hook.get_conn(), table.topic, view["view_id"]) as stager:
                for key, record in params["rows"].items():
                    stager.set(key, record)
            table.seal(view["view_id"], stagers=[stager])
        return len(params["rows"])

    apply = ApplyTempViewOperator(
        task_id="apply_view",
        table_topic="{{ params.table_topic }}",
        view_id="{{ ti.xcom_pull(task_ids='create_view')['view_id'] }}",
        max_delete_fraction=None,
    )
    stage(create.output) >> apply

TABLE_ASSET = Asset(f"pulsar://public/default/{TABLE_TOPIC}")

with DAG("table_assets_downstream", schedule=[TABLE_ASSET], start_date=START, catchup=False) as downstream_dag:

    @task
    def read_events(triggering_asset_events=None) -> list:
        """The extras of the table's events that triggered this run (the accessor also lists each
        event under the alias it came through: read the asset's entry only)."""
        return [dict(event.extra) for event in (triggering_asset_events or {})[TABLE_ASSET]]

    read_events()
