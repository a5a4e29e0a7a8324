"""Least-privilege test_connection, the token off spark-submit's
command line, secrets masked in task logs, docker-compose bound to loopback."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml

from airflow_provider_pulsarstate.engine.errors import ConfigurationError
from airflow_provider_pulsarstate.hooks.pulsarstate import PulsarStateHook

EnvConnection = Callable[..., str]
REPO = Path(__file__).resolve().parents[2]


# ---------------------------------------------------------------------------------- item 14: masking
def test_get_config_registers_the_token_and_url_credentials_for_masking(env_connection: EnvConnection) -> None:
    from airflow.sdk.log import _secrets_masker

    token, password = f"jwt-{uuid.uuid4().hex}", f"pw-{uuid.uuid4().hex}"
    conn_id = env_connection(
        "ps_mask",
        extra={
            "service_url": "pulsar://127.0.0.1:6650",
            "admin_url": f"http://alice:{password}@127.0.0.1:8080",
            "auth_token": token,
        },
    )
    PulsarStateHook(conn_id).get_config()
    # Task logs (and the supervisor's copy) go through this masker's redact().
    text = _secrets_masker().redact(f"token={token} admin=http://alice:{password}@127.0.0.1:8080")
    assert "token=" in text
    assert token not in text and password not in text


def test_test_connection_messages_hide_url_credentials(env_connection: EnvConnection) -> None:
    conn_id = env_connection(
        "ps_cred",
        extra={
            "service_url": "pulsar://127.0.0.1:1",
            "admin_url": "http://bob:hunter2@127.0.0.1:1",
            "operation_timeout": 2,
        },
    )
    ok, message = PulsarStateHook(conn_id).test_connection()
    assert not ok
    assert "hunter2" not in message and "bob" not in message and "127.0.0.1:1" in message


def test_token_over_plain_http_names_the_connection_and_option(env_connection: EnvConnection) -> None:
    conn_id = env_connection("ps_http", extra={"service_url": "pulsar://broker.example:6650", "auth_token": "t"})
    with pytest.raises(
        ConfigurationError, match="'ps_http'.*admin_url 'http://broker.example:8080'.*allow_plaintext_auth"
    ):
        PulsarStateHook(conn_id).get_config()
    conn_id = env_connection(
        "ps_http_ok",
        extra={"service_url": "pulsar://broker.example:6650", "auth_token": "t", "allow_plaintext_auth": True},
    )
    assert PulsarStateHook(conn_id).get_config().allow_plaintext_auth is True


def test_boolean_options_are_read_and_checked(env_connection: EnvConnection) -> None:
    conn_id = env_connection("ps_bool", extra={"tls_hostname_verification": "false", "allow_other_namespaces": True})
    config = PulsarStateHook(conn_id).get_config()
    assert (config.tls_hostname_verification, config.allow_other_namespaces) == (False, True)
    bad = env_connection("ps_bool_bad", extra={"allow_other_namespaces": "maybe"})
    with pytest.raises(ConfigurationError, match="'ps_bool_bad'.*'allow_other_namespaces'.*true or false"):
        PulsarStateHook(bad).get_config()


# ---------------------------------------------------------------------------------- item 11: test_connection
def test_test_connection_embedded_creates_nothing(env_connection: EnvConnection, tmp_path: Path) -> None:
    path = tmp_path / "nested" / "state.db"
    ok, message = PulsarStateHook(env_connection("ps_missing", extra={"service_url": str(path)})).test_connection()
    assert ok and "will be created" in message and str(path) in message
    assert not path.parent.exists()

    with PulsarStateHook(env_connection("ps_write", extra={"service_url": str(path)})) as hook:
        hook.get_map("m").put("k", "v")
    before = sorted((p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in path.parent.iterdir())
    ok, message = PulsarStateHook("ps_write").test_connection()
    assert ok, message
    assert str(path) in message
    assert sorted((p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in path.parent.iterdir()) == before


@pytest.mark.pulsar
def test_test_connection_real_broker_creates_no_topic(pulsar_broker: Any, env_connection: EnvConnection) -> None:
    admin = pulsar_broker.admin_url.rstrip("/")
    namespace = f"tc{uuid.uuid4().hex[:8]}"
    requests.put(f"{admin}/admin/v2/namespaces/public/{namespace}", timeout=30).raise_for_status()

    def topics() -> list[str]:
        resp = requests.get(f"{admin}/admin/v2/namespaces/public/{namespace}/topics", timeout=30)
        resp.raise_for_status()
        return sorted(resp.json())

    conn_id = env_connection(
        "ps_real_lp",
        extra={
            "service_url": pulsar_broker.service_url,
            "admin_url": pulsar_broker.admin_url,
            "namespace": namespace,
            "operation_timeout": 15,
        },
    )
    ok, message = PulsarStateHook(conn_id).test_connection()  # an empty namespace
    assert ok, message
    assert topics() == []
    with PulsarStateHook(conn_id) as hook:
        hook.get_map("m").put("k", "v")
    before = topics()
    ok, message = PulsarStateHook(conn_id).test_connection()
    assert ok, message
    assert topics() == before


# ---------------------------------------------------------------------------------- item 12: spark-submit argv
@pytest.mark.parametrize("master", ["yarn", "k8s://https://k8s.example:6443"])
def test_token_never_reaches_the_spark_submit_command_line(
    master: str, env_connection: EnvConnection, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from airflow.providers.apache.spark.hooks import spark_submit as spark_hook_module
    from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator

    from airflow_provider_pulsarstate.operators.spark_submit import ViewSparkSubmitOperator

    token = f"tok-{uuid.uuid4().hex}"
    conn_id = env_connection("ps_spark", extra={"service_url": "pulsar://localhost:6650", "auth_token": token})
    env_connection("spark_cluster", conn_type="spark", host=master)
    # The k8s master needs the cncf.kubernetes provider only to track the driver, not to build argv.
    monkeypatch.setattr(spark_hook_module, "kube_client", object(), raising=False)
    commands: list[list[str]] = []
    monkeypatch.setattr(
        SparkSubmitOperator,
        "execute",
        lambda self, context: commands.append(self._get_hook()._build_spark_submit_command(self.application)),
    )
    op = ViewSparkSubmitOperator(task_id="s", application="/j.py", conn_id="spark_cluster", pulsarstate_conn_id=conn_id)
    with pytest.raises(ConfigurationError, match="command line.*token_file.*pass_token=False"):
        op.execute({})
    assert commands == []  # refused before spark-submit runs

    op = ViewSparkSubmitOperator(
        task_id="s2",
        application="/j.py",
        conn_id="spark_cluster",
        pulsarstate_conn_id=conn_id,
        pass_token=False,
        env_vars={"OTHER": "1"},
    )
    op.execute({})
    assert commands and not any(token in arg for arg in commands[0])
    assert any("OTHER=1" in arg for arg in commands[0])  # the provider does put env_vars in argv here


def test_load_config_reads_a_token_file(tmp_path: Path) -> None:
    from airflow_provider_pulsarstate.spark import load_config

    token_file = tmp_path / "token"
    token_file.write_text("from-file\n")
    text = f'{{"url": "pulsar://127.0.0.1:6650", "token_file": "{token_file}"}}'
    assert load_config(text, environ={}).auth_token == "from-file"
    with pytest.raises(ConfigurationError, match="token_file"):
        load_config('{"url": "pulsar://127.0.0.1:6650", "token_file": "/nonexistent/t"}', environ={})


# ---------------------------------------------------------------------------------- item 17: docker-compose
def test_docker_compose_binds_loopback_and_has_no_literal_passwords() -> None:
    compose = yaml.safe_load((REPO / "docker-compose.yaml").read_text())
    passwords = []
    for name, service in compose["services"].items():
        for port in service.get("ports", []):
            assert str(port).startswith("127.0.0.1:"), (name, port)
        for key, value in (service.get("environment") or {}).items():
            if key.upper().endswith("PASSWORD"):
                passwords.append(key)
                assert str(value).startswith("${") and ":?" in str(value), (name, key, value)
    assert passwords == ["AIRFLOW_ADMIN_PASSWORD"]
    airflow = compose["services"]["airflow"]
    # the simple auth manager takes the password from its file, written from that variable
    assert "AIRFLOW_ADMIN_PASSWORD" in airflow["command"]
    assert airflow["environment"]["AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE"] in airflow["command"]
