"""The "Pulsar State" plugin's declarations and the extra links from this provider's tasks to it."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest
import tomllib

import airflow_provider_pulsarstate
from airflow_provider_pulsarstate.plugins.links import ALL_LINKS
from airflow_provider_pulsarstate.plugins.pulsar_state import PulsarStatePlugin

ROOT = Path(__file__).resolve().parents[2]
PLUGIN_CLASS = "airflow_provider_pulsarstate.plugins.pulsar_state.PulsarStatePlugin"


def test_the_plugin_is_declared_both_ways() -> None:
    info = airflow_provider_pulsarstate.get_provider_info()
    assert info["plugins"] == [{"name": PulsarStatePlugin.name, "plugin-class": PLUGIN_CLASS}]
    entry_points = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"]["airflow.plugins"]
    assert entry_points == {PulsarStatePlugin.name: PLUGIN_CLASS.rsplit(".", 1)[0] + ":PulsarStatePlugin"}
    assert info["extra-links"] == [f"{cls.__module__}.{cls.__qualname__}" for cls in ALL_LINKS]


def test_the_page_and_its_api_share_one_prefix_outside_airflows_own() -> None:
    (fastapi_app,) = PulsarStatePlugin.fastapi_apps
    (view,) = PulsarStatePlugin.external_views
    assert view["destination"] == "nav" and view["name"] == "Pulsar State"
    assert view["href"] == fastapi_app["url_prefix"] + "/"
    assert not any(
        fastapi_app["url_prefix"].startswith(p) for p in ("/api/v2", "/ui", "/execution", "/auth", "/pluginsv2")
    )


def _fragment(url: str) -> dict[str, str]:
    parts = urlsplit(url)
    assert parts.path.endswith("/pulsarstate/")
    return {k: v[0] for k, v in parse_qs(parts.fragment).items()}


def _operators() -> list[tuple[object, dict[str, dict[str, str]]]]:
    from airflow_provider_pulsarstate.operators.leases import AcquireLeaseOperator, ReleaseLeaseOperator
    from airflow_provider_pulsarstate.operators.offsets import CommitSourceOffsetsOperator
    from airflow_provider_pulsarstate.operators.views import (
        ApplyTempViewOperator,
        CreateTempViewOperator,
        DropTempViewOperator,
    )
    from airflow_provider_pulsarstate.sensors.leadership import LeadershipSensor
    from airflow_provider_pulsarstate.sensors.offsets import OffsetProgressSensor

    conn = {"conn": "ps_links"}
    view = {
        "Pulsar State: view": {**conn, "tab": "views", "topic": "prices", "view": "v-1"},
        "Pulsar State: table": {**conn, "tab": "tables", "topic": "prices"},
    }
    return [
        (
            CreateTempViewOperator(
                task_id="create", table_topic="prices", view_id="v-1", pulsarstate_conn_id="ps_links"
            ),
            view,
        ),
        (
            ApplyTempViewOperator(task_id="apply", table_topic="prices", view_id="v-1", pulsarstate_conn_id="ps_links"),
            view,
        ),
        (
            DropTempViewOperator(task_id="drop", table_topic="prices", view_id="v-1", pulsarstate_conn_id="ps_links"),
            view,
        ),
        (
            AcquireLeaseOperator(
                task_id="acquire", lease_name="nightly", holder="me", ttl=60, pulsarstate_conn_id="ps_links"
            ),
            {"Pulsar State: lease": {**conn, "tab": "leases", "lease": "nightly"}},
        ),
        (
            ReleaseLeaseOperator(task_id="release", lease_task_id="acquire", pulsarstate_conn_id="ps_links"),
            {"Pulsar State: lease": {**conn, "tab": "leases"}},
        ),
        (
            CommitSourceOffsetsOperator(
                task_id="commit",
                table_topic="prices",
                source_topic="events",
                subscription="ingest",
                pulsarstate_conn_id="ps_links",
            ),
            {
                "Pulsar State: subscription": {
                    **conn,
                    "tab": "subscriptions",
                    "topic": "events",
                    "subscription": "ingest",
                },
                "Pulsar State: table": {**conn, "tab": "tables", "topic": "prices"},
            },
        ),
        (
            LeadershipSensor(
                task_id="lead",
                mode="acquire",
                lease_name="nightly",
                holder="me",
                ttl=60,
                pulsarstate_conn_id="ps_links",
            ),
            {"Pulsar State: lease": {**conn, "tab": "leases", "lease": "nightly"}},
        ),
        (
            OffsetProgressSensor(
                task_id="offsets", topic="events", target=10, subscription="ingest", pulsarstate_conn_id="ps_links"
            ),
            {
                "Pulsar State: subscription": {
                    **conn,
                    "tab": "subscriptions",
                    "topic": "events",
                    "subscription": "ingest",
                }
            },
        ),
    ]


def test_each_operator_links_to_its_item() -> None:
    for operator, expected in _operators():
        links = {link.name: _fragment(link.get_link(operator, ti_key=None)) for link in operator.operator_extra_links}
        assert links == expected, type(operator).__name__


def test_the_links_survive_dag_serialization() -> None:
    """The DAG processor serializes the links by class; the API server must find them registered."""
    from airflow.sdk import DAG
    from airflow.serialization.serialized_objects import DagSerialization

    with DAG("links_dag", schedule=None, start_date=datetime(2026, 1, 1)) as dag:
        operators = _operators()
    restored = DagSerialization.from_dict(DagSerialization.to_dict(dag))
    for op, expected in operators:
        assert set(restored.get_task(op.task_id).extra_links) == set(expected), op.task_id


@pytest.mark.parametrize("base_url", ["http://airflow.example:8080", "http://airflow.example:8080/"])
def test_links_are_absolute_when_the_base_url_is_set(monkeypatch: pytest.MonkeyPatch, base_url: str) -> None:
    from airflow_provider_pulsarstate.plugins.links import page_url

    monkeypatch.setenv("AIRFLOW__API__BASE_URL", base_url)
    assert (
        page_url(conn="c", tab="views", topic="t")
        == "http://airflow.example:8080/pulsarstate/#conn=c&tab=views&topic=t"
    )
