"""The embedded default refuses to run where it cannot be shared: multi-host executors, non-local Spark masters."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from airflow_provider_pulsarstate import ConfigurationError
from airflow_provider_pulsarstate.hooks.pulsarstate import PulsarStateHook


@pytest.mark.parametrize(
    "executor",
    [
        "CeleryExecutor",
        "KubernetesExecutor",
        "LocalExecutor,CeleryExecutor",
        "edge:airflow.providers.edge3.executors.EdgeExecutor",
    ],
)
def test_the_embedded_default_refuses_a_multi_host_executor(monkeypatch: pytest.MonkeyPatch, executor: str) -> None:
    monkeypatch.delenv("AIRFLOW_CONN_PULSARSTATE_DEFAULT", raising=False)
    monkeypatch.setenv("AIRFLOW__CORE__EXECUTOR", executor)
    with pytest.raises(
        ConfigurationError,
        match=r"'pulsarstate_default' is not defined.*cannot be shared.*Configure a pulsarstate connection.*AIRFLOW_CONN_PULSARSTATE_DEFAULT",
    ):
        PulsarStateHook().get_config()


@pytest.mark.parametrize("executor", ["LocalExecutor", "local:airflow.executors.local_executor.LocalExecutor"])
def test_the_embedded_default_runs_under_a_local_executor(
    monkeypatch: pytest.MonkeyPatch, executor: str, tmp_path: Path
) -> None:
    monkeypatch.delenv("AIRFLOW_CONN_PULSARSTATE_DEFAULT", raising=False)
    monkeypatch.setenv("AIRFLOW_HOME", str(tmp_path))
    monkeypatch.setenv("AIRFLOW__CORE__EXECUTOR", executor)
    assert PulsarStateHook().get_config().kind == "embedded"


@pytest.mark.parametrize("spark_host", ["yarn", "k8s://https://k8s.example:6443", "spark://master.example:7077", None])
def test_spark_job_refuses_an_embedded_config_on_a_non_local_master(
    env_connection: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, spark_host: str | None
) -> None:
    from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
    from airflow.sdk.exceptions import AirflowFailException

    from airflow_provider_pulsarstate.operators.spark_submit import ViewSparkSubmitOperator

    submitted: list[Any] = []
    monkeypatch.setattr(SparkSubmitOperator, "execute", lambda self, context: submitted.append(self))
    conn_id = env_connection("ps_emb", extra={"service_url": str(tmp_path / "s.db")})
    spark_conn = "spark_missing"
    if spark_host is not None:
        spark_conn = env_connection("spark_remote", conn_type="spark", host=spark_host)
    op = ViewSparkSubmitOperator(task_id="s", application="/j.py", conn_id=spark_conn, pulsarstate_conn_id=conn_id)
    with pytest.raises(
        AirflowFailException, match=r"'ps_emb' uses the embedded state log.*non-local Spark master.*AIRFLOW_CONN_PS_EMB"
    ):
        op.execute({})
    assert submitted == []  # nothing was submitted
    env_connection("spark_local", conn_type="spark", host="local[2]")
    ViewSparkSubmitOperator(
        task_id="s", application="/j.py", conn_id="spark_local", pulsarstate_conn_id=conn_id
    ).execute({})
    assert len(submitted) == 1
