"""The Spark job of a temp-view task group: its arguments, rendered from the create task's XComs,
its operator (the ``[spark]`` extra), and the offsets commit after the apply."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator

from airflow_provider_pulsarstate.engine.errors import MissingExtraError

if TYPE_CHECKING:
    from airflow_provider_pulsarstate.operators.views import ApplyTempViewOperator

__all__ = [
    "CONFIG_XCOM_KEY",
    "commit_offsets_task",
    "job_extra_args",
    "spark_job_task",
    "view_job_args",
    "view_spark_submit_operator",
    "xcom_of",
]

CONFIG_XCOM_KEY = "pulsarstate_config"
"""XCom key under which :class:`CreateTempViewOperator` pushes the connection config as JSON
(embedded path absolute, auth token left out) for the Spark job's ``--config-json``."""


def job_extra_args(
    application_args_extra: Iterable[Any],
    source_topic: str | None,
    source_subscription: str | None,
    spark_kwargs: Mapping[str, Any],
) -> list[str]:
    """The job's arguments after the view's: ``--source-topic`` first for ingestion, then the
    caller's (each as a str); refuses arguments the group sets itself."""
    for reserved in ("task_id", "application", "application_args", "conn_id"):
        if reserved in spark_kwargs:
            raise TypeError(f"temp_view_spark_task_group() sets {reserved!r} itself")
    extra = [arg if isinstance(arg, str) else str(arg) for arg in application_args_extra]
    if source_subscription and not source_topic:
        raise TypeError("temp_view_spark_task_group(): source_subscription needs source_topic")
    return ["--source-topic", source_topic, *extra] if source_topic else extra


def spark_job_task(
    submit_operator: type[BaseOperator],
    application: str,
    job_args: list[str],
    spark_conn_id: str,
    pulsarstate_conn_id: str,
    spark_kwargs: Mapping[str, Any],
) -> BaseOperator:
    """The ``spark_job`` task: ``spark-submit`` of ``application`` with ``job_args``."""
    return submit_operator(
        task_id="spark_job",
        application=application,
        application_args=job_args,
        conn_id=spark_conn_id,
        pulsarstate_conn_id=pulsarstate_conn_id,
        **spark_kwargs,
    )


def view_spark_submit_operator() -> type[BaseOperator]:
    """:class:`~airflow_provider_pulsarstate.operators.spark_submit.ViewSparkSubmitOperator`, which
    needs the ``[spark]`` extra."""
    try:
        from airflow_provider_pulsarstate.operators.spark_submit import ViewSparkSubmitOperator
    except MissingExtraError as exc:
        raise MissingExtraError(f"temp_view_spark_task_group: {exc}", extra=exc.extra) from exc
    return ViewSparkSubmitOperator


def xcom_of(create_task_id: str) -> str:
    """The template expression of the create task's XCom (the view's info)."""
    return f"ti.xcom_pull(task_ids={create_task_id!r})"


def view_job_args(create_task_id: str) -> list[str]:
    """The job's first arguments: the view, its table and the connection, rendered from the create task's XComs."""
    pull = xcom_of(create_task_id)
    return [
        "--view-id",
        "{{ %s['view_id'] }}" % pull,
        "--table-topic",
        "{{ %s['table'] }}" % pull,
        "--config-json",
        "{{ ti.xcom_pull(task_ids=%r, key=%r) }}" % (create_task_id, CONFIG_XCOM_KEY),
    ]


def commit_offsets_task(
    apply: ApplyTempViewOperator,
    table_topic: str,
    source_topic: str | None,
    subscription: str | None,
    pulsarstate_conn_id: str,
) -> BaseOperator | None:
    """Moves the source subscription's cursor to the table's record, after the apply (None: no
    subscription to move; :func:`job_extra_args` refuses a subscription without a topic)."""
    if not (subscription and source_topic):
        return None
    from airflow_provider_pulsarstate.operators.offsets import CommitSourceOffsetsOperator

    commit = CommitSourceOffsetsOperator(
        task_id="commit_offsets",
        table_topic=table_topic,
        source_topic=source_topic,
        subscription=subscription,
        pulsarstate_conn_id=pulsarstate_conn_id,
    )
    apply >> commit
    return commit
