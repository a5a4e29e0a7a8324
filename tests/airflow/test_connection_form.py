"""The connection form as users meet it: field names Airflow does not mask, the old field name
still read (with a warning), and the REST API behind the form on a real API server with auth on."""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from airflow_provider_pulsarstate import ConnectionConfig
from airflow_provider_pulsarstate.hooks.airflow_internals import is_masked_field_name
from airflow_provider_pulsarstate.hooks.connection_form import CONN_FIELDS, CONN_TYPE, RENAMED_FIELDS, SECRET_FIELDS
from airflow_provider_pulsarstate.hooks.pulsarstate import PulsarStateHook
from airflow_provider_pulsarstate.testing.airflow_processes import AirflowProcesses

# the tests share the module's API server: on one xdist worker, started once
pytestmark = pytest.mark.xdist_group("connection-form")

ROOT = Path(__file__).resolve().parents[2]
EnvConnection = Callable[..., str]


def masked_plain_fields(form: dict[str, dict[str, Any]]) -> list[str]:
    """Fields of ``form`` that are not secrets but whose value Airflow's UI would show and save as '***'."""
    return sorted(
        name for name, spec in form.items() if spec["schema"].get("format") != "password" and is_masked_field_name(name)
    )


# ---------------------------------------------------------------------------------- field names
def test_no_plain_field_is_named_like_a_secret() -> None:
    assert masked_plain_fields(CONN_FIELDS) == []
    assert {"auth_token"} == SECRET_FIELDS
    assert all(is_masked_field_name(name) for name in SECRET_FIELDS)  # the check is live, not vacuous


def test_the_check_fails_for_the_old_field_name() -> None:
    form = dict(CONN_FIELDS)
    form["allow_insecure_token"] = form.pop("allow_plaintext_auth")
    assert masked_plain_fields(form) == ["allow_insecure_token"]
    assert all(is_masked_field_name(old) and not is_masked_field_name(new) for old, new in RENAMED_FIELDS.items())


# ---------------------------------------------------------------------------------- the old name
_HTTP_TOKEN = {"service_url": "pulsar://broker.example:6650", "auth_token": "t0ken-value"}


@pytest.mark.parametrize("key", ["allow_insecure_token", "extra__pulsarstate__allow_insecure_token"])
@pytest.mark.parametrize(("raw", "expected"), [(True, True), ("true", True), (False, False)])
def test_the_old_field_name_is_read_with_a_deprecation_warning(
    env_connection: EnvConnection, key: str, raw: Any, expected: bool
) -> None:
    extra = {**_HTTP_TOKEN, key: raw}
    if not expected:
        extra["admin_url"] = "https://broker.example:8443"
    conn_id = env_connection("ps_old_name", extra=extra)
    with pytest.warns(
        DeprecationWarning, match=r"'ps_old_name'.*allow_insecure_token' is deprecated.*'allow_plaintext_auth'"
    ):
        config = PulsarStateHook(conn_id).get_config()
    assert config.allow_plaintext_auth is expected


def test_the_new_field_name_wins_over_the_old_one(env_connection: EnvConnection) -> None:
    conn_id = env_connection(
        "ps_both_names", extra={**_HTTP_TOKEN, "allow_insecure_token": True, "allow_plaintext_auth": False}
    )
    with pytest.warns(DeprecationWarning), pytest.raises(Exception, match="allow_plaintext_auth"):
        PulsarStateHook(conn_id).get_config()  # False wins: a token over plain http is refused


def test_the_new_field_name_warns_nothing(env_connection: EnvConnection) -> None:
    conn_id = env_connection("ps_new_name", extra={**_HTTP_TOKEN, "allow_plaintext_auth": True})
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        assert PulsarStateHook(conn_id).get_config().allow_plaintext_auth is True


def test_the_engine_config_keeps_the_old_keyword_with_a_warning() -> None:
    with pytest.warns(DeprecationWarning, match="allow_plaintext_auth"):
        config = ConnectionConfig(url="pulsar://broker.example:6650", auth_token="jwt", allow_insecure_token=True)
    assert config.allow_plaintext_auth is True
    assert config.with_options(tenant="t").allow_plaintext_auth is True


# ---------------------------------------------------------------------------------- the REST API behind the form
_PASSWORD = "form-test-" + os.urandom(8).hex()


@pytest.fixture(scope="module")
def api_server(tmp_path_factory: pytest.TempPathFactory, migrated_db: Path) -> Iterator[AirflowProcesses]:
    """A real ``airflow api-server`` with SimpleAuthManager logins on (user ``admin``) and
    connection tests enabled; no pulsarstate connection in its environment."""
    home = tmp_path_factory.mktemp("form-api")
    (home / "dags").mkdir()
    passwords = home / "passwords.json"
    passwords.write_text(json.dumps({"admin": _PASSWORD}))
    af = AirflowProcesses(
        home=home / "airflow",
        dags_folder=home / "dags",
        components=("api-server",),
        metadata_db=migrated_db,
        env={
            "PYTHONPATH": str(ROOT),
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "False",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": "admin:admin",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(passwords),
            "AIRFLOW__CORE__TEST_CONNECTION": "Enabled",
        },
    )
    af.env.pop("AIRFLOW_CONN_PULSARSTATE_DEFAULT", None)
    af.start()
    try:
        yield af
    finally:
        af.stop()


@pytest.fixture(scope="module")
def client(api_server: AirflowProcesses) -> Iterator[requests.Session]:
    """A session logged in as the UI is (a bearer token from /auth/token)."""
    assert requests.get(api_server.api_url + "/ui/connections/hook_meta", timeout=30).status_code in (401, 403)
    login = requests.post(
        api_server.api_url + "/auth/token", json={"username": "admin", "password": _PASSWORD}, timeout=30
    )
    assert login.status_code == 201, login.text
    session = requests.Session()
    session.headers["Authorization"] = f"Bearer {login.json()['access_token']}"
    yield session
    session.close()


_EXPECTED_DEFAULTS = {
    "service_url": None,
    "admin_url": None,
    "tenant": "public",
    "namespace": "default",
    "auth_token": None,
    "tls_trust_certs_file_path": None,
    "operation_timeout": 30.0,
    "tls_hostname_verification": True,
    "allow_plaintext_auth": False,
    "allow_other_namespaces": False,
}
_TYPES: dict[str, tuple[type, ...]] = {
    "operation_timeout": (int, float),
    "tls_hostname_verification": (bool,),
    "allow_plaintext_auth": (bool,),
    "allow_other_namespaces": (bool,),
}


def test_the_form_saves_and_tests_a_working_connection(
    api_server: AirflowProcesses, client: requests.Session, state_backend: str, request: pytest.FixtureRequest
) -> None:
    url = api_server.api_url
    meta = client.get(url + "/ui/connections/hook_meta", timeout=30)
    assert meta.status_code == 200, meta.text
    (entry,) = [e for e in meta.json() if e["connection_type"] == CONN_TYPE]
    fields = entry["extra_fields"]
    assert set(fields) == set(CONN_FIELDS) == set(_EXPECTED_DEFAULTS)
    form = {name: spec["value"] for name, spec in fields.items()}
    assert [name for name, value in form.items() if value == "***"] == []  # Airflow masked none of them
    assert form == _EXPECTED_DEFAULTS  # every default as the form shows it, none masked to '***'
    assert form == {name: spec["schema"].get("default") for name, spec in CONN_FIELDS.items()}

    if state_backend == "pulsar":  # what a user types into the form; everything else stays at its default
        broker = request.getfixturevalue("pulsar_broker")
        form.update(service_url=broker.service_url, admin_url=broker.admin_url)
    conn_id = f"ps_form_{state_backend}"
    body = {"connection_id": conn_id, "conn_type": CONN_TYPE, "extra": json.dumps(form)}
    created = client.post(url + "/api/v2/connections", json=body, timeout=30)
    assert created.status_code == 201, created.text
    try:
        saved = client.get(url + f"/api/v2/connections/{conn_id}", timeout=30)
        assert saved.status_code == 200, saved.text
        extra = json.loads(saved.json()["extra"])
        for name, value in extra.items():
            if name in _TYPES:
                assert isinstance(value, _TYPES[name]), (name, value)
            elif name not in SECRET_FIELDS:
                assert value is None or isinstance(value, str), (name, value)
        assert {k: v for k, v in extra.items() if k not in SECRET_FIELDS} == {
            k: v for k, v in form.items() if k not in SECRET_FIELDS
        }

        tested = client.post(url + "/api/v2/connections/test", json=body, timeout=120)
        assert tested.status_code == 200, tested.text
        answer = tested.json()
        assert answer["status"] is True, answer["message"]
        if state_backend == "embedded":
            state_file = api_server.home / "pulsarstate" / "state.db"
            assert str(state_file) in answer["message"] and "will be created" in answer["message"]
            assert not state_file.parent.exists()  # the test created nothing
        else:
            assert broker.service_url in answer["message"]
    finally:
        client.delete(url + f"/api/v2/connections/{conn_id}", timeout=30)
