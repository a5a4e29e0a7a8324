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

with DAG(
    "lineage_offsets",
    schedule=None,
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    params={
        "table_topic": Param("lineage-offsets-table", type="string"),
        "source_topic": Param("lineage-offsets-events", type="string"),
        "events": Param(30, type="integer"),
    },
) as lineage_offsets:
    from airflow_provider_pulsarstate.operators.offsets import CommitSourceOffsetsOperator
    from airflow_provider_pulsarstate.sensors.offsets import OffsetProgressSensor

    @task
    def publish(params: dict | None = None) -> dict:
        """Publish ``params.events`` messages over 2 partitions; returns the end offsets."""
        assert params is not None
        with PulsarStateHook() as hook:
            topic = hook.create_topic(params["source_topic"], partitions=2)
            publisher = hook.get_publisher(topic)
            for i in range(params["events"]):
                publisher.send(b"e%d" % i, key=f"k{i}")
            publisher.flush(timeout=60.0)
            return {str(p): o for p, o in hook.get_pull_consumer(topic).end_offsets().items()}

    wait = OffsetProgressSensor(
        task_id="wait_for_events",
        topic="{{ params.source_topic }}",
        condition="new_messages",
        target="1",
        watermark_key="lineage/{{ params.source_topic }}",
        poke_interval=0.5,
        timeout=120,
        mode="poke",
    )
    create_o = CreateTempViewOperator(task_id="create_view", table_topic="{{ params.table_topic }}")

    @task
    def fold(view: dict, end: dict, params: dict | None = None) -> None:
        """Stage one row per partition, sealed with the whole range consumed."""
        assert params is not None
        with PulsarStateHook() as hook:
            table = hook.get_table(params["table_topic"])
            source = hook.topic_name(params["source_topic"])
            with ViewStager(hook.get_conn(), table.topic, view["view_id"]) as stager:
                for p, o in end.items():
                    stager.set(f"partition-{p}", {"events": o})
            table.seal(
                view["view_id"],
                stagers=[stager],
                source_offsets=[SourceRange(source, int(p), 0, int(o)) for p, o in sorted(end.items())],
            )

    apply_o = ApplyTempViewOperator(
        task_id="apply_view",
        table_topic="{{ params.table_topic }}",
        view_id="{{ ti.xcom_pull(task_ids='create_view')['view_id'] }}",
    )
    commit = CommitSourceOffsetsOperator(
        task_id="commit_offsets",
        table_topic="{{ params.table_topic }}",
        source_topic="{{ params.source_topic }}",
        subscription="lineage-ingest",
    )
    ends = publish()
    ends >> wait >> create_o
    fold(create_o.output, ends) >> apply_o >> commit

with DAG(
    "lineage_hook_task",
    schedule=None,
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    params={
        "source_topic": Param("lineage-hook-in", type="string"),
        "target_topic": Param("lineage-hook-out", type="string"),
    },
) as lineage_hook_task:

    @task
    def copy_messages(params: dict | None = None) -> int:
        """Plain hook use, no operator lineage: publish to one topic, pull it, publish the copies to another."""
        assert params is not None
        with PulsarStateHook() as hook:
            source = hook.create_topic(params["source_topic"])
            publisher = hook.get_publisher(source)
            for i in range(5):
                publisher.send(b"m%d" % i)
            publisher.flush(timeout=60.0)
            consumer = hook.get_pull_consumer(source)
            messages = consumer.pull(0, partition=0, max_messages=100).messages
            target = hook.get_publisher(hook.create_topic(params["target_topic"]))
            for message in messages:
                target.send(message.value)
            target.flush(timeout=60.0)
            return len(messages)

    copy_messages()

with DAG(
    "lineage_guarded_spark",
    schedule=None,
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    params={
        "source_topic": Param("lineage-spark-in", type="string"),
        "table_topic": Param("lineage-spark-out", type="string"),
        "lease_name": Param("lineage-spark-lease", type="string"),
        "out": Param("", type="string", description="where the job writes its spark.openlineage.* properties"),
    },
) as lineage_guarded_spark:
    import os
    import sys
    from pathlib import Path

    from airflow_provider_pulsarstate.operators.leases import lease_task_group
    from airflow_provider_pulsarstate.operators.spark_submit import GuardedSparkSubmitOperator

    spark_job = GuardedSparkSubmitOperator(
        task_id="spark_job",
        application=str(Path(__file__).resolve().parent / "jobs" / "openlineage_conf_job.py"),
        application_args=["--out", "{{ params.out }}"],
        input_topics=["{{ params.source_topic }}"],
        output_topics=["{{ params.table_topic }}"],
        conf={"spark.ui.enabled": "false"},
        # a plain SparkSubmitOperator: the venv's spark-submit and Python
        env_vars={
            "PATH": os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")]),
            "PYSPARK_PYTHON": sys.executable,
        },
    )
    lease_task_group(
        "lease", lease_name="{{ params.lease_name }}", ttl=60.0, timeout=60, holder="{{ run_id }}", guard=[spark_job]
    )
