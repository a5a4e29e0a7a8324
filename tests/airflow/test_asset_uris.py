"""The ``pulsar`` asset URI scheme: canonical form, refusals (also at DAG parse time), factory, converter."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_pulsarstate.engine.config import ConnectionConfig
from airflow_provider_pulsarstate.engine.errors import AssetURIError


@pytest.mark.parametrize(
    ("given", "canonical"),
    [
        ("pulsar://public/default/prices", "pulsar://public/default/prices"),
        ("PULSAR://public/default/prices/", "pulsar://public/default/prices"),
        ("pulsar://public/default/prices#frag", "pulsar://public/default/prices"),
        ("pulsar://my-tenant/ns.v2/topic_a=1:b", "pulsar://my-tenant/ns.v2/topic_a=1:b"),
    ],
)
def test_canonical_uris_are_kept_in_canonical_form(given: str, canonical: str) -> None:
    from airflow.sdk import Asset

    assert Asset(given).uri == canonical


@pytest.mark.parametrize(
    ("given", "problem"),
    [
        ("pulsar://prices", "is a short name ('prices')"),
        ("pulsar://public/default", "has no topic"),
        ("pulsar://public/default/a/b", "4 path segments"),
        ("pulsar://broker:6650/public/default/prices", "names a broker"),
        ("pulsar://user@public/default/prices", "names a broker"),
        ("pulsar://public/default/prices?x=1", "has a query"),
        ("pulsar://public/default/prices-partition-0", "names one partition"),
        ("pulsar://public/def ault/prices", "invalid namespace 'def ault'"),
        ("pulsar:///default/prices", "has no tenant"),
    ],
)
def test_malformed_uris_are_refused_naming_the_uri(given: str, problem: str) -> None:
    from airflow.sdk import Asset

    with pytest.raises(AssetURIError) as caught:
        Asset(given)
    assert problem in str(caught.value)
    assert "pulsar://<tenant>/<namespace>/<topic>" in str(caught.value)
    assert caught.value.uri.rstrip("/") in given.lower()
    assert caught.value.uri.split("?")[0].split("#")[0] in str(caught.value)


def test_a_dag_with_a_malformed_pulsar_uri_fails_to_parse(tmp_path: Path) -> None:
    from airflow.dag_processing.dagbag import DagBag

    (tmp_path / "bad_asset_dag.py").write_text(
        textwrap.dedent("""
        import pendulum
        from airflow.sdk import Asset, dag, task

        @dag(schedule=[Asset("pulsar://prices")], start_date=pendulum.datetime(2026, 1, 1, tz="UTC"))
        def bad_asset_dag():
            @task
            def noop():
                pass
            noop()

        bad_asset_dag()
    """)
    )
    (tmp_path / "good_asset_dag.py").write_text(
        textwrap.dedent("""
        import pendulum
        from airflow.sdk import Asset, dag, task

        @dag(schedule=[Asset("pulsar://public/default/prices")], start_date=pendulum.datetime(2026, 1, 1, tz="UTC"))
        def good_asset_dag():
            @task
            def noop():
                pass
            noop()

        good_asset_dag()
    """)
    )
    bag = DagBag(dag_folder=str(tmp_path))
    assert sorted(bag.dag_ids) == ["good_asset_dag"]
    ((path, error),) = bag.import_errors.items()
    assert path.endswith("bad_asset_dag.py")
    assert "AssetURIError" in error and "'pulsar://prices'" in error and "short name" in error


def test_the_scheme_is_registered_with_airflow() -> None:
    from airflow.sdk.providers_manager_runtime import ProvidersManagerTaskRuntime

    from airflow_provider_pulsarstate.assets import scheme, uri

    manager = ProvidersManagerTaskRuntime()
    assert manager.asset_uri_handlers["pulsar"] is uri.sanitize_uri
    assert manager.asset_factories["pulsar"] is scheme.create_asset
    assert manager.asset_to_openlineage_converters["pulsar"] is scheme.convert_asset_to_openlineage


def test_factory_places_short_names_and_keeps_full_ones() -> None:
    from airflow_provider_pulsarstate.assets.scheme import create_asset

    assert create_asset(topic="prices").uri == "pulsar://public/default/prices"
    assert create_asset(topic="prices", tenant="acme", namespace="pricing").uri == "pulsar://acme/pricing/prices"
    assert create_asset(topic="persistent://acme/pricing/prices").uri == "pulsar://acme/pricing/prices"
    assert create_asset(topic="prices", extra={"owner": "x"}).extra == {"owner": "x"}
    with pytest.raises(AssetURIError, match="invalid topic"):
        create_asset(topic="bad topic")


def test_lineage_namespace_follows_the_naming_spec(tmp_path: Path) -> None:
    from airflow_provider_pulsarstate.assets.uri import dataset_identity, lineage_namespace

    assert lineage_namespace(ConnectionConfig(url="pulsar://broker.example:6650")) == "pulsar://broker.example:6650"
    assert lineage_namespace(ConnectionConfig(url="pulsar://broker.example")) == "pulsar://broker.example:6650"
    assert lineage_namespace(ConnectionConfig(url="pulsar+ssl://b1:6651,b2:6651")) == "pulsar://b1:6651"
    embedded = ConnectionConfig(url=str(tmp_path / "s.db"))
    assert lineage_namespace(embedded) == f"pulsarstate-embedded:{(tmp_path / 's.db').resolve()}"
    assert dataset_identity(ConnectionConfig(url="pulsar://b:1", tenant="t", namespace="n"), "x") == (
        "pulsar://b:1",
        "persistent://t/n/x",
    )


def test_converter_takes_the_namespace_from_the_asset_and_looks_nothing_up(
    env_connection: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In the listener's forked process a connection lookup can hang: the converter makes none,
    even with a default connection defined."""
    from airflow.sdk import Asset, BaseHook

    from airflow_provider_pulsarstate.assets.scheme import convert_asset_to_openlineage
    from airflow_provider_pulsarstate.assets.uri import LINEAGE_NAMESPACE_EXTRA
    from airflow_provider_pulsarstate.hooks.pulsarstate import PulsarStateHook

    env_connection("pulsarstate_default", extra={"service_url": "pulsar://127.0.0.1:36999"})

    def lookup(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the converter looked a connection up")

    monkeypatch.setattr(BaseHook, "get_connection", lookup)
    monkeypatch.setattr(PulsarStateHook, "get_config", lookup)
    carried = Asset("pulsar://acme/pricing/prices", extra={LINEAGE_NAMESPACE_EXTRA: "pulsar://10.1.2.3:6650"})
    dataset = convert_asset_to_openlineage(carried, None)
    assert (dataset.namespace, dataset.name) == ("pulsar://10.1.2.3:6650", "persistent://acme/pricing/prices")
    by_hand = convert_asset_to_openlineage(Asset("pulsar://acme/pricing/prices"), None)
    assert (by_hand.namespace, by_hand.name) == ("pulsar", "persistent://acme/pricing/prices")


def test_the_emitted_table_asset_carries_the_lineage_namespace() -> None:
    from collections import defaultdict

    from airflow_provider_pulsarstate.assets.tables import emit_apply_event, table_alias
    from airflow_provider_pulsarstate.assets.uri import LINEAGE_NAMESPACE_EXTRA

    added: list[tuple[Any, dict[str, Any]]] = []

    class Accessor:
        def add(self, asset: Any, extra: dict[str, Any]) -> None:
            added.append((asset, extra))

    events: defaultdict[Any, Accessor] = defaultdict(Accessor)
    result = {"view_id": "v", "commit_offset": 3, "set": 1, "delete": 0, "unchanged": 0}
    asset = emit_apply_event(
        {"outlet_events": events},
        table_alias("d", "t"),
        table="persistent://public/default/prices",
        result=result,
        lineage_namespace="pulsar://b:6650",
    )
    assert asset is not None and asset.uri == "pulsar://public/default/prices"
    assert asset.extra == {LINEAGE_NAMESPACE_EXTRA: "pulsar://b:6650"}
    assert added == [(asset, {"table": "persistent://public/default/prices", **result})]
