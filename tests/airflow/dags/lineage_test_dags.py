"""DAGs for tests/airflow/test_openlineage.py: an apply fed from a source topic's offsets, without Spark."""

from __future__ import annotations

import pendulum
from airflow.sdk import DAG, Param, task

from airflow_provider_pulsarstate.engine.recipes.table import SourceRange, ViewStager
from airflow_provider_pulsarstate.hooks.pulsarstate import PulsarStateHook
from airflow_provider_pulsarstate.operators.views import ApplyTempViewOperator, CreateTempViewOperator

with DAG(
    "lineage_apply",
    schedule=None,
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    params={
        "table_topic": Param("lineage-table", type="string"),
        "source_topic": Param("lineage-events", type="string"),
        "rows": Param({}, type="object"),
        "ranges": Param({}, type="object", description="partition -> [start, next]"),
        "bad_view_id": Param("", type="string", description="apply this (unknown) view instead: the apply fails"),
    },
) as lineage_apply:
    create = CreateTempViewOperator(task_id="create_view", table_topic="{{ params.table_topic }}")

    @task
    def stage(view: dict, params: dict | None = None) -> int:
        """Stage ``params.rows`` as computed from ``params.ranges`` of the source topic."""
        assert params is not None
        with PulsarStateHook() as hook:
            table = hook.get_table(params["table_topic"])
            source = hook.topic_name(params["source_topic"])
            with ViewStager(hook.get_conn(), table.topic, view["view_id"]) as stager:
                for key, record in params["rows"].items():
                    stager.set(key, record)
            ranges = [SourceRange(source, int(p), int(r[0]), int(r[1])) for p, r in sorted(params["ranges"].items())]
            table.seal(view["view_id"], stagers=[stager], source_offsets=ranges)
        return len(params["rows"])

    apply = ApplyTempViewOperator(
        task_id="apply_view",
        table_topic="{{ params.table_topic }}",
        view_id="{{ params.bad_view_id or ti.xcom_pull(task_ids='create_view')['view_id'] }}",
        max_delete_fraction=None,
    )
    stage(create.output) >> apply
