"""A connection saved with bad input (unknown extra keys, wrong types, an unreachable broker) is
refused by the Test button and at first use, with an error naming the connection and the field,
and nothing is written anywhere: no state file, no topic."""

from __future__ import annotations

import json
import socket
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from airflow_provider_pulsarstate import ConfigurationError
from airflow_provider_pulsarstate.engine.errors import BackendUnavailableError
from airflow_provider_pulsarstate.hooks.pulsarstate import HEALTHCHECK_TOPIC, PulsarStateHook

EnvConnection = Callable[..., str]

BAD_EXTRAS: list[tuple[str, dict[str, Any], str]] = [
    ("unknown-key", {"service_uri": "pulsar://typo:6650"}, "service_uri"),
    ("masked-bool", {"allow_plaintext_auth": "***"}, "allow_plaintext_auth"),
    ("number-as-bool", {"tls_hostname_verification": 1}, "tls_hostname_verification"),
    ("number-as-string", {"tenant": 42}, "tenant"),
    ("list-as-string", {"admin_url": ["http://127.0.0.1:8080"]}, "admin_url"),
    ("text-as-seconds", {"operation_timeout": "soon"}, "operation_timeout"),
    ("bool-as-seconds", {"operation_timeout": True}, "operation_timeout"),
    ("zero-seconds", {"operation_timeout": 0}, "operation_timeout"),
    ("bad-scheme", {"service_url": "kafka://broker:9092"}, "service_url"),
]


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An AIRFLOW_HOME of this test alone: the embedded default would appear under it."""
    path = tmp_path / "airflow-home"
    path.mkdir()
    monkeypatch.setenv("AIRFLOW_HOME", str(path))
    return path


def _topics(admin_url: str) -> list[str]:
    resp = requests.get(f"{admin_url.rstrip('/')}/admin/v2/namespaces/public/default/topics", timeout=30)
    resp.raise_for_status()
    return list(resp.json())


@pytest.mark.parametrize(("extra", "field"), [b[1:] for b in BAD_EXTRAS], ids=[b[0] for b in BAD_EXTRAS])
def test_bad_extra_is_refused_at_test_and_at_first_use_and_writes_nothing(
    env_connection: EnvConnection,
    state_backend: str,
    request: pytest.FixtureRequest,
    tmp_path: Path,
    home: Path,
    extra: dict[str, Any],
    field: str,
) -> None:
    topic = f"bad-input-{uuid.uuid4().hex[:8]}"
    if state_backend == "pulsar":
        broker = request.getfixturevalue("pulsar_broker")
        base = {"service_url": broker.service_url, "admin_url": broker.admin_url}
    else:
        base = {"service_url": str(tmp_path / "state" / "state.db")}
    conn_id = env_connection("ps_bad_input", extra={**base, **extra})

    ok, message = PulsarStateHook(conn_id).test_connection()
    assert not ok
    assert "'ps_bad_input'" in message and repr(field) in message, message

    with PulsarStateHook(conn_id) as hook, pytest.raises(ConfigurationError) as info:
        hook.get_map(topic).put("k", "v")
    assert "'ps_bad_input'" in str(info.value) and repr(field) in str(info.value)

    assert not (tmp_path / "state").exists() and list(home.iterdir()) == []
    if state_backend == "pulsar":
        assert not [t for t in _topics(broker.admin_url) if topic in t]


def test_an_extra_that_is_not_an_object_is_refused(
    env_connection: EnvConnection, home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_PS_LIST_EXTRA", json.dumps({"conn_type": "pulsarstate", "extra": "[1, 2]"}))
    ok, message = PulsarStateHook("ps_list_extra").test_connection()
    assert not ok and "'ps_list_extra'" in message and "'extra'" in message
    with pytest.raises(ConfigurationError, match=r"'ps_list_extra'.*'extra'"):
        PulsarStateHook("ps_list_extra").get_map("m")
    assert list(home.iterdir()) == []


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A port on 127.0.0.1 that accepts connections and never answers."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(128)
        yield int(sock.getsockname()[1])


def test_a_silent_broker_is_refused_at_test_and_at_first_use(
    env_connection: EnvConnection, silent_port: int, home: Path
) -> None:
    url = f"127.0.0.1:{silent_port}"
    conn_id = env_connection(
        "ps_silent", extra={"service_url": f"pulsar://{url}", "admin_url": f"http://{url}", "operation_timeout": 2}
    )
    started = time.monotonic()
    ok, message = PulsarStateHook(conn_id).test_connection()
    assert time.monotonic() - started < 60  # bounded by the operation timeout, generously under load
    assert not ok
    assert "'ps_silent'" in message and "'admin_url'" in message and url in message, message

    started = time.monotonic()
    with PulsarStateHook(conn_id) as hook, pytest.raises(BackendUnavailableError) as info:
        hook.get_map("m").put("k", "v")
    assert time.monotonic() - started < 60
    text = str(info.value)
    assert "'ps_silent'" in text and ("'service_url'" in text or "'admin_url'" in text) and url in text, text
    assert list(home.iterdir()) == []


@pytest.mark.pulsar
def test_a_silent_service_url_beside_a_working_admin_url_is_named(
    pulsar_broker: Any, env_connection: EnvConnection, silent_port: int, home: Path
) -> None:
    conn_id = env_connection(
        "ps_silent_binary",
        extra={
            "service_url": f"pulsar://127.0.0.1:{silent_port}",
            "admin_url": pulsar_broker.admin_url,
            "operation_timeout": 2,
        },
    )
    before = _topics(pulsar_broker.admin_url)
    started = time.monotonic()
    ok, message = PulsarStateHook(conn_id).test_connection()
    assert time.monotonic() - started < 60
    assert not ok
    assert "'ps_silent_binary'" in message and "'service_url'" in message, message
    created = set(_topics(pulsar_broker.admin_url)) - set(before)  # other sessions may share the broker
    assert not [t for t in created if HEALTHCHECK_TOPIC in t]  # the test created no topic
    assert list(home.iterdir()) == []
