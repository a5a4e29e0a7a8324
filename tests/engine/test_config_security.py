"""TLS and token rules, private embedded files, URL redaction, topic rules."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import pytest
import requests

from airflow_provider_pulsarstate.engine.backends.admin import PulsarAdmin
from airflow_provider_pulsarstate.engine.backends.base import AcquireMode
from airflow_provider_pulsarstate.engine.backends.embedded import EmbeddedBackend
from airflow_provider_pulsarstate.engine.config import ConnectionConfig, redact_url
from airflow_provider_pulsarstate.engine.errors import BackendUnavailableError, ConfigurationError


# ------------------------------------------------------------------------------- item 10: token over http
@pytest.mark.parametrize(
    "url,admin_url",
    [
        ("pulsar://broker.example:6650", ""),  # the derived http://broker.example:8080
        ("pulsar+ssl://broker.example:6651", "http://broker.example:8080"),
        ("pulsar://10.0.0.5:6650", "http://10.0.0.5:8080"),
    ],
)
def test_token_over_plain_http_to_a_remote_host_is_refused(url: str, admin_url: str) -> None:
    with pytest.raises(ConfigurationError, match="admin_url .*allow_plaintext_auth"):
        ConnectionConfig(url=url, admin_url=admin_url, auth_token="jwt")


@pytest.mark.parametrize(
    "options",
    [
        dict(url="pulsar://localhost:6650", auth_token="jwt"),
        dict(url="pulsar://127.0.0.1:6650", admin_url="http://[::1]:8080", auth_token="jwt"),
        dict(url="pulsar+ssl://broker.example:6651", auth_token="jwt"),  # derived https://...:8443
        dict(url="pulsar://broker.example:6650", admin_url="https://broker.example:8443", auth_token="jwt"),
        dict(url="pulsar://broker.example:6650", auth_token="jwt", allow_plaintext_auth=True),
        dict(url="pulsar://broker.example:6650"),  # no token, nothing to leak
    ],
)
def test_token_rules_accept_safe_configs(options: dict[str, Any]) -> None:
    ConnectionConfig(**options)


def test_hostname_verification_is_on_by_default_and_reaches_the_client(monkeypatch: pytest.MonkeyPatch) -> None:
    import pulsar

    from airflow_provider_pulsarstate.engine.backends.pulsar import PulsarBackend

    seen: list[dict[str, Any]] = []
    monkeypatch.setattr(pulsar, "Client", lambda url, **kwargs: seen.append(kwargs) or object())
    PulsarBackend(ConnectionConfig(url="pulsar+ssl://broker.example:6651")).client
    PulsarBackend(ConnectionConfig(url="pulsar+ssl://broker.example:6651", tls_hostname_verification=False)).client
    assert [kw["tls_validate_hostname"] for kw in seen] == [True, False]


def test_admin_ca_file_wins_over_requests_ca_bundle(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """requests lets $REQUESTS_CA_BUNDLE replace a session's verify; ours goes with each request."""
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(tmp_path / "attacker-ca.pem"))
    monkeypatch.setenv("CURL_CA_BUNDLE", str(tmp_path / "attacker-ca.pem"))
    seen: list[Any] = []

    def send(self: Any, request: Any, **kwargs: Any) -> requests.Response:
        seen.append(kwargs["verify"])
        resp = requests.Response()
        resp.status_code, resp._content, resp.url = 200, b"{}", request.url
        return resp

    monkeypatch.setattr(requests.adapters.HTTPAdapter, "send", send)
    admin = PulsarAdmin("https://broker.example:8443", tls_trust_certs_file_path="/etc/pulsar/ca.pem")
    admin.topic_stats("persistent://t/n/x")
    assert seen == ["/etc/pulsar/ca.pem"]


# ------------------------------------------------------------------------------- item 13: files and URLs
def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_embedded_files_are_private(tmp_path: Path) -> None:
    old = os.umask(0o022)  # a typical umask: without the fix, files come out 0644
    try:
        db = tmp_path / "state" / "s.db"
        backend = EmbeddedBackend(db)
        writer = backend.acquire_writer("persistent://t/n/x", mode=AcquireMode.FAIL_FAST, timeout=5)
        writer.append([b"v"], timeout=5)
        locks = list(backend.lock_path("persistent://t/n/x", 1).parent.glob("*.lock"))
        assert locks, "the writer holds a lock file"
        assert _mode(db.parent) == 0o700
        assert _mode(backend.lock_path("persistent://t/n/x", 1).parent) == 0o700
        for path in [db, Path(f"{db}-wal"), Path(f"{db}-shm"), *locks]:
            assert path.exists(), path
            assert _mode(path) == 0o600, (path, oct(_mode(path)))
        writer.close()
        backend.close()
    finally:
        os.umask(old)


def test_file_url_with_a_host_part_is_refused() -> None:
    with pytest.raises(ConfigurationError, match=r"file://tmp/x.db.*file:///tmp/x.db"):
        ConnectionConfig(url="file://tmp/x.db")
    assert ConnectionConfig(url="file:///tmp/x.db").embedded_path == Path("/tmp/x.db")
    assert ConnectionConfig(url="file://localhost/tmp/x.db").embedded_path == Path("/tmp/x.db")


# ------------------------------------------------------------------------------- item 14: no credentials shown
def test_url_credentials_never_appear_in_repr_or_errors() -> None:
    config = ConnectionConfig(
        url="pulsar://127.0.0.1:1",
        admin_url="http://alice:pa55word@127.0.0.1:1",
        auth_token="jwt-secret",
        operation_timeout=2,
    )
    assert "pa55word" not in repr(config) and "jwt-secret" not in repr(config)
    assert redact_url(config.admin_url) == "http://***@127.0.0.1:1"
    admin = PulsarAdmin(config.resolved_admin_url, timeout=2)
    with pytest.raises(BackendUnavailableError) as err:
        admin.topic_stats("persistent://t/n/x")
    assert "pa55word" not in str(err.value) and "alice" not in str(err.value)
    assert "pa55word" not in repr(admin)
    with pytest.raises(ConfigurationError) as bad:
        ConnectionConfig(url="https://u:pa55word@h/x")
    assert "pa55word" not in str(bad.value)


# ------------------------------------------------------------------------------- item 17: topic names
def test_full_topic_names_must_be_in_the_connection_namespace() -> None:
    config = ConnectionConfig(tenant="acme", namespace="jobs")
    assert config.topic_name("t1") == "persistent://acme/jobs/t1"
    assert config.topic_name("persistent://acme/jobs/t1") == "persistent://acme/jobs/t1"
    with pytest.raises(
        ConfigurationError, match="outside the connection's namespace acme/jobs.*allow_other_namespaces"
    ):
        config.topic_name("persistent://other/ns/t1")
    open_config = config.with_options(allow_other_namespaces=True)
    assert open_config.topic_name("persistent://other/ns/t1") == "persistent://other/ns/t1"
    with pytest.raises(ConfigurationError, match="not persistent://tenant/namespace/name"):
        open_config.topic_name("persistent://other/t1")


def test_non_persistent_topics_are_refused_for_state() -> None:
    config = ConnectionConfig(allow_other_namespaces=True)
    with pytest.raises(ConfigurationError, match="non-persistent topic keeps no messages"):
        config.topic_name("non-persistent://public/default/t1")


# ------------------------------------------------------------------------------- admin answers of the wrong shape
def test_an_admin_answer_that_is_not_a_json_object_is_refused_naming_the_request() -> None:
    import http.server
    import threading

    class ListAnswer(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = b"[1, 2]"
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), ListAnswer)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        admin = PulsarAdmin(f"http://127.0.0.1:{server.server_port}", timeout=5)
        for call in (admin.topic_stats, admin.internal_stats, lambda t: admin.message_id_by_time(t, 0)):
            with pytest.raises(BackendUnavailableError, match=r"GET .*/persistent/t/n/x/.* answered a JSON list"):
                call("persistent://t/n/x")
    finally:
        server.shutdown()
        server.server_close()
