"""PulsarStateHook: config from Airflow connections, test_connection, factories, registration, UI form."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_pulsarstate import ConfigurationError, ConnectionConfig, PulsarMap, SharedStateManager
from airflow_provider_pulsarstate.hooks.connection_form import CONN_FIELDS, UI_FIELD_BEHAVIOUR
from airflow_provider_pulsarstate.hooks.pulsarstate import PulsarStateHook
from airflow_provider_pulsarstate.provider_info import PACKAGE_NAME, provider_info

AIRFLOW_BIN = str(Path(sys.executable).with_name("airflow"))
EnvConnection = Callable[..., str]


# ---------------------------------------------------------------------------------- get_config
def test_get_config_reads_every_field_of_a_pulsar_connection(env_connection: EnvConnection) -> None:
    conn_id = env_connection(
        "ps_pulsar",
        extra={
            "service_url": "pulsar+ssl://broker.example:6651",
            "admin_url": "https://broker.example:8443",
            "tenant": "acme",
            "namespace": "pipelines",
            "auth_token": "secret-jwt-value",
            "tls_trust_certs_file_path": "/etc/ssl/ca.pem",
            "operation_timeout": 7.5,
        },
    )
    config = PulsarStateHook(conn_id).get_config()
    assert config == ConnectionConfig(
        url="pulsar+ssl://broker.example:6651",
        admin_url="https://broker.example:8443",
        tenant="acme",
        namespace="pipelines",
        auth_token="secret-jwt-value",
        tls_trust_certs_file_path="/etc/ssl/ca.pem",
        operation_timeout=7.5,
    )
    assert config.kind == "pulsar"


def test_get_config_embedded_url(env_connection: EnvConnection, tmp_path: Path) -> None:
    conn_id = env_connection("ps_file", extra={"service_url": f"file://{tmp_path}/state.db"})
    config = PulsarStateHook(conn_id).get_config()
    assert config.kind == "embedded"
    assert config.embedded_path == tmp_path / "state.db"


def test_get_config_falls_back_to_host_and_password(env_connection: EnvConnection) -> None:
    conn_id = env_connection(
        "ps_host", host="pulsar://h1:6650", password="token-from-password", extra={"allow_plaintext_auth": True}
    )
    config = PulsarStateHook(conn_id).get_config()
    assert (config.url, config.auth_token) == ("pulsar://h1:6650", "token-from-password")


def test_get_config_from_uri_form(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_PS_URI", "pulsarstate://pulsar%3A%2F%2Fh2%3A6650/?tenant=t2&operation_timeout=4")
    config = PulsarStateHook("ps_uri").get_config()
    assert (config.url, config.tenant, config.operation_timeout) == ("pulsar://h2:6650", "t2", 4.0)


def test_get_config_accepts_legacy_prefixed_extra_and_empty_form_values(env_connection: EnvConnection) -> None:
    conn_id = env_connection(
        "ps_legacy",
        extra={
            "extra__pulsarstate__service_url": "pulsar://legacy:6650",
            "admin_url": None,  # what the UI stores for an untouched optional field
            "auth_token": "",
            "operation_timeout": None,
        },
    )
    config = PulsarStateHook(conn_id).get_config()
    assert config == ConnectionConfig(url="pulsar://legacy:6650")


def test_get_config_is_not_cached(env_connection: EnvConnection) -> None:
    hook = PulsarStateHook(env_connection("ps_changing", extra={"tenant": "first"}))
    assert hook.get_config().tenant == "first"
    env_connection("ps_changing", extra={"tenant": "second"})
    assert hook.get_config().tenant == "second"


def test_missing_default_connection_means_the_embedded_default(airflow_home: Path) -> None:
    assert "AIRFLOW_CONN_PULSARSTATE_DEFAULT" not in os.environ
    config = PulsarStateHook().get_config()
    assert config == ConnectionConfig()
    assert config.embedded_path == airflow_home / "pulsarstate" / "state.db"


def test_missing_default_connection_is_an_error_in_a_server_process(airflow_home: Path) -> None:
    from airflow_provider_pulsarstate.hooks.airflow_internals import server_context

    with server_context(), pytest.raises(ConfigurationError) as info:
        PulsarStateHook().get_config()
    message = str(info.value)
    assert "'pulsarstate_default' is not defined" in message and "do not fall back to the embedded" in message
    assert "airflow connections add pulsarstate_default --conn-type pulsarstate" in message
    assert "AIRFLOW_CONN_PULSARSTATE_DEFAULT" in message
    assert PulsarStateHook().get_config().kind == "embedded"  # task side (no server context): the fallback stays


def test_missing_other_connection_is_an_error() -> None:
    with pytest.raises(ConfigurationError, match="'ps_nowhere' is not defined"):
        PulsarStateHook("ps_nowhere").get_config()


@pytest.mark.parametrize(
    ("attrs", "field"),
    [
        ({"extra": {"service_url": "kafka://broker:9092"}}, "service_url"),
        ({"host": "http://broker:8080"}, "host"),
        ({"host": "broker"}, "host"),
        ({"extra": {"operation_timeout": "soon"}}, "operation_timeout"),
        ({"extra": {"operation_timeout": -1}}, "operation_timeout"),
        ({"extra": {"operation_timeout": True}}, "operation_timeout"),
        ({"extra": {"tenant": 42}}, "tenant"),
        ({"extra": {"service_uri": "pulsar://typo:6650"}}, "service_uri"),
    ],
)
def test_invalid_values_name_the_connection_and_field(
    env_connection: EnvConnection, attrs: dict[str, Any], field: str
) -> None:
    conn_id = env_connection("ps_bad", **attrs)
    with pytest.raises(ConfigurationError) as info:
        PulsarStateHook(conn_id).get_config()
    assert "'ps_bad'" in str(info.value)
    assert repr(field) in str(info.value)


# ---------------------------------------------------------------------------------- back end
def test_get_conn_is_a_method_cached_per_hook_until_close(env_connection: EnvConnection, tmp_path: Path) -> None:
    hook = PulsarStateHook(env_connection("ps_conn", extra={"service_url": str(tmp_path / "s.db")}))
    backend = hook.get_conn()
    assert hook.get_conn() is backend
    hook.close()
    hook.close()  # idempotent
    reopened = hook.get_conn()
    assert reopened is not backend
    hook.close()


def test_constructor_does_no_io(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_lookup(*args: object, **kwargs: object) -> None:
        raise AssertionError("the constructor looked up the connection")

    monkeypatch.setattr(PulsarStateHook, "get_connection", no_lookup)
    hook = PulsarStateHook("ps_lazy")
    assert hook.pulsarstate_conn_id == "ps_lazy"


# ---------------------------------------------------------------------------------- test_connection
def test_test_connection_embedded(env_connection: EnvConnection, tmp_path: Path) -> None:
    path = tmp_path / "nested" / "state.db"
    conn_id = env_connection("ps_ok", extra={"service_url": str(path)})
    with PulsarStateHook(conn_id) as hook:
        hook.get_map("m").put("k", "v")
    ok, message = PulsarStateHook(conn_id).test_connection()
    assert ok, message
    assert str(path) in message


def test_test_connection_embedded_unusable_file(env_connection: EnvConnection, tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    conn_id = env_connection("ps_blocked", extra={"service_url": str(blocker / "state.db")})
    ok, message = PulsarStateHook(conn_id).test_connection()
    assert not ok
    assert str(blocker / "state.db") in message


def test_test_connection_reports_config_errors(env_connection: EnvConnection) -> None:
    ok, message = PulsarStateHook(env_connection("ps_cfg", extra={"operation_timeout": "x"})).test_connection()
    assert not ok
    assert "'operation_timeout'" in message and "'ps_cfg'" in message
    ok, message = PulsarStateHook("ps_undefined").test_connection()
    assert not ok and "'ps_undefined'" in message


def test_test_connection_unreachable_broker(env_connection: EnvConnection) -> None:
    conn_id = env_connection(
        "ps_down",
        extra={"service_url": "pulsar://127.0.0.1:1", "admin_url": "http://127.0.0.1:1", "operation_timeout": 2},
    )
    started = time.monotonic()
    ok, message = PulsarStateHook(conn_id).test_connection()
    assert time.monotonic() - started < 10
    assert not ok
    assert "pulsar://127.0.0.1:1" in message


# ---------------------------------------------------------------------------------- factories
def test_get_map_on_embedded_connection(env_connection: EnvConnection, tmp_path: Path) -> None:
    conn_id = env_connection("ps_map", extra={"service_url": str(tmp_path / "state.db"), "operation_timeout": 10})
    with PulsarStateHook(conn_id) as writer_hook, PulsarStateHook(conn_id) as reader_hook:
        assignments = writer_hook.get_map("assignments")
        assert isinstance(assignments, PulsarMap)
        assert assignments.topic == "persistent://public/default/assignments"
        assert assignments.manager.operation_timeout == 10
        assert assignments.put("shard-1", {"owner": "worker-a"}) == {"owner": "worker-a"}
        assert assignments.get("shard-1") == {"owner": "worker-a"}
        other = reader_hook.get_map("persistent://public/default/assignments")
        assert other.get("shard-1", latest=True) == {"owner": "worker-a"}


def test_get_state_manager_on_embedded_connection(env_connection: EnvConnection, tmp_path: Path) -> None:
    conn_id = env_connection(
        "ps_mgr", extra={"service_url": str(tmp_path / "state.db"), "tenant": "t", "namespace": "n"}
    )
    with PulsarStateHook(conn_id) as hook:
        counter = hook.get_state_manager(
            "runs", initializer=lambda: {"n": 0}, applier=lambda state, op: {"n": state["n"] + op}
        )
        assert isinstance(counter, SharedStateManager)
        assert counter.topic == "persistent://t/n/runs"
        counter.write(lambda state: [1])
        counter.write(lambda state: [2])
        assert counter.read(lambda state: state["n"], latest=True) == 3
    with pytest.raises(ConfigurationError):
        PulsarStateHook(conn_id).get_map("a/b")


# ---------------------------------------------------------------------------------- registration and UI form
def test_provider_info_uses_the_form_constants() -> None:
    (conn_type,) = provider_info()["connection-types"]
    assert conn_type["conn-fields"] == CONN_FIELDS
    assert conn_type["ui-field-behaviour"] == UI_FIELD_BEHAVIOUR
    assert conn_type["hook-class-name"] == f"{PulsarStateHook.__module__}.{PulsarStateHook.__qualname__}"
    assert conn_type["connection-type"] == PulsarStateHook.conn_type
    assert conn_type["hook-name"] == PulsarStateHook.hook_name


def test_provider_info_imports_no_airflow() -> None:
    code = (
        "import sys, airflow_provider_pulsarstate as p; p.get_provider_info(); "
        "bad = sorted(m for m in sys.modules if m == 'airflow' or m.startswith('airflow.')); "
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_providers_manager_registers_the_connection_type() -> None:
    from airflow.providers_manager import ProvidersManager

    manager = ProvidersManager()
    assert PACKAGE_NAME in manager.providers
    (meta,) = [m for m in manager.iter_connection_type_hook_ui_metadata() if m.connection_type == "pulsarstate"]
    assert meta.hook_class_name == "airflow_provider_pulsarstate.hooks.pulsarstate.PulsarStateHook"
    assert meta.hook_name == "Pulsar State"
    assert meta.field_behaviour["hidden_fields"] == UI_FIELD_BEHAVIOUR["hidden-fields"]
    widget = manager.connection_form_widgets["extra__pulsarstate__auth_token"]
    assert widget.is_sensitive
    assert not manager.connection_form_widgets["extra__pulsarstate__service_url"].is_sensitive


def test_task_runtime_builds_the_hook_from_a_connection(env_connection: EnvConnection, tmp_path: Path) -> None:
    from airflow.sdk import BaseHook
    from airflow.sdk.providers_manager_runtime import ProvidersManagerTaskRuntime

    hook_info = ProvidersManagerTaskRuntime().hooks["pulsarstate"]
    assert hook_info is not None
    assert hook_info.hook_class_name == "airflow_provider_pulsarstate.hooks.pulsarstate.PulsarStateHook"
    assert hook_info.connection_id_attribute_name == "pulsarstate_conn_id"
    conn_id = env_connection("ps_runtime", extra={"service_url": str(tmp_path / "state.db")})
    hook = BaseHook.get_hook(conn_id)
    assert isinstance(hook, PulsarStateHook)
    assert hook.pulsarstate_conn_id == conn_id
    assert hook.get_config().embedded_path == tmp_path / "state.db"


def test_airflow_providers_list_shows_the_package(airflow_home: Path) -> None:
    result = subprocess.run(
        [AIRFLOW_BIN, "providers", "list", "--output", "json"],
        env=os.environ.copy(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    packages = {row["package_name"] for row in json.loads(result.stdout)}
    assert PACKAGE_NAME in packages


def test_ui_hook_meta_describes_the_connection_form(airflow_db: Path) -> None:
    from airflow.api_fastapi.app import create_app
    from fastapi.testclient import TestClient

    with TestClient(create_app(apps="core")) as client:
        response = client.get("/ui/connections/hook_meta")
    assert response.status_code == 200, response.text
    (entry,) = [e for e in response.json() if e["connection_type"] == "pulsarstate"]
    assert entry["hook_name"] == "Pulsar State"
    assert entry["hook_class_name"] == "airflow_provider_pulsarstate.hooks.pulsarstate.PulsarStateHook"
    extra = entry["extra_fields"]
    assert set(extra) == set(CONN_FIELDS)
    for name, spec in CONN_FIELDS.items():
        assert extra[name]["schema"]["title"] == spec["label"]
        assert extra[name]["description"] == spec["description"]
    assert extra["auth_token"]["schema"]["format"] == "password"
    assert extra["operation_timeout"]["schema"]["type"] == ["number", "null"]
    assert extra["operation_timeout"]["value"] == ConnectionConfig().operation_timeout
    assert extra["tenant"]["value"] == "public"
    standard = entry["standard_fields"]
    for hidden in ("host", "port", "login", "password"):
        assert standard[hidden]["hidden"] is True
    assert standard["url_schema"]["hidden"] is True


# ---------------------------------------------------------------------------------- real broker
@pytest.mark.pulsar
def test_test_connection_real_broker(pulsar_broker: Any, env_connection: EnvConnection) -> None:
    conn_id = env_connection(
        "ps_real",
        extra={
            "service_url": pulsar_broker.service_url,
            "admin_url": pulsar_broker.admin_url,
            "operation_timeout": 15,
        },
    )
    ok, message = PulsarStateHook(conn_id).test_connection()
    assert ok, message
    assert pulsar_broker.service_url in message
