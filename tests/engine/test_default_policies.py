"""A second real broker with Pulsar's own defaults (no retention, inactive topics deleted, checked
every 5 s; no entry-index interceptor): a state log left to them is deleted; the engine sets topic
policies at first use, or fails naming the setting and the command when it may not."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
import requests

from airflow_provider_pulsarstate import PulsarMap, open_backend
from airflow_provider_pulsarstate.engine.backends.base import Backend
from airflow_provider_pulsarstate.engine.backends.policies import INACTIVE, RETENTION
from airflow_provider_pulsarstate.engine.checkpoint import CheckpointStore
from airflow_provider_pulsarstate.engine.errors import RetentionPolicyError
from airflow_provider_pulsarstate.testing import wait_until
from tests.conftest import pulsar_config

pytestmark = [pytest.mark.pulsar, pytest.mark.xdist_group("stock-broker")]  # one such broker per run

INACTIVE_WINDOW = 5 + 5  # brokerDeleteInactiveTopicsMaxInactiveDurationSeconds + ...FrequencySeconds


@pytest.fixture
def backend(pulsar_stock_broker: Any) -> Iterator[Backend]:
    b = open_backend(pulsar_config(pulsar_stock_broker))
    yield b
    b.close()


def test_without_the_check_the_default_settings_delete_a_log(backend: Backend, topic: str) -> None:
    """The hazard itself: what the broker does to a topic left to its defaults."""
    admin = backend.admin  # type: ignore[attr-defined]
    writer = backend.open_shared_writer(topic)  # the raw contract: no policy check
    writer.append([b"entry"], timeout=10)
    writer.close()
    assert admin.applied_policy(topic, INACTIVE)["deleteWhileInactive"] is True
    assert admin.applied_policy(topic, RETENTION) == {"retentionTimeInMinutes": 0, "retentionSizeInMB": 0}
    wait_until(lambda: not admin.topic_exists(topic), timeout=4 * INACTIVE_WINDOW, interval=0.5, what="deletion")


def test_a_state_log_gets_safe_topic_policies_and_survives(backend: Backend, topic: str) -> None:
    admin = backend.admin  # type: ignore[attr-defined]
    with PulsarMap(backend, topic, checkpoint_after_bytes=None) as table:
        table.put("a", 1)
        table.checkpoint()
    assert admin.applied_policy(topic, RETENTION) == {"retentionTimeInMinutes": -1, "retentionSizeInMB": -1}
    assert admin.applied_policy(topic, INACTIVE)["deleteWhileInactive"] is False
    info = CheckpointStore(backend, topic).latest()
    for derived in (info.data_topic, CheckpointStore(backend, topic).index_topic):
        assert admin.applied_policy(derived, INACTIVE)["deleteWhileInactive"] is False
    time.sleep(2 * INACTIVE_WINDOW)  # long enough for the broker to delete an unprotected idle topic
    assert admin.topic_exists(topic)
    with PulsarMap(backend, topic, checkpoint_after_bytes=None) as fresh:
        assert fresh.to_dict(latest=True) == {"a": 1}
        assert fresh.manager.stats["checkpoint_loaded_offset"] == 0  # the image survived too


def test_a_role_that_may_not_set_policies_gets_an_error_naming_the_setting(
    backend: Backend, topic: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The broker's answer to a role without the topic-policy permission (403), for POSTs only:
    reading the policies still goes to the real broker."""
    session = backend.admin._session  # type: ignore[attr-defined]
    real = session.request

    def forbidden(method: str, url: str, **kwargs: Any) -> requests.Response:
        if method == "POST":
            resp = requests.Response()
            resp.status_code, resp._content, resp.url = 403, b'{"reason":"Don\'t have permission"}', url
            return resp
        return real(method, url, **kwargs)

    monkeypatch.setattr(session, "request", forbidden)
    table = PulsarMap(backend, topic, checkpoint_after_bytes=None)
    try:
        with pytest.raises(RetentionPolicyError):
            table.get("a", latest=True)  # a reader's bootstrap
        with pytest.raises(RetentionPolicyError) as err:
            table.put("a", 1)  # a writer
    finally:
        table.close()
    message = str(err.value)
    assert err.value.setting == "retention" and topic in message
    assert f"pulsar-admin topics set-retention {topic} --time -1 --size -1" in message
    assert "pulsar-admin namespaces set-retention public/default --time -1 --size -1" in message
