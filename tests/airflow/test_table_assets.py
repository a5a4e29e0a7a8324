"""A state table is an asset: an apply that published something emits its event, with the counts.

Real ``dag.test()`` runs on both back ends; the events and the downstream DAG's queue entries are
read back from the metadata DB, as the scheduler reads them.
"""

from __future__ import annotations

import uuid
from typing import Any

from airflow_provider_pulsarstate.assets.tables import apply_event_extra, table_alias
from tests.airflow.dagruns import TEST_DAGS, load_dag, run_dag

ASSET_URI = "pulsar://public/default/asset-test-prices"


def _events() -> list[dict[str, Any]]:
    from airflow.models.asset import AssetEvent, AssetModel
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        rows = session.scalars(
            select(AssetEvent)
            .join(AssetModel, AssetEvent.asset_id == AssetModel.id)
            .where(AssetModel.uri == ASSET_URI)
            .order_by(AssetEvent.id)
        )
        return [dict(row.extra) | {"_source_dag": row.source_dag_id} for row in rows]


def _queued_for(dag_id: str) -> int:
    from airflow.models.asset import AssetDagRunQueue
    from airflow.utils.session import create_session
    from sqlalchemy import func, select

    with create_session() as session:
        return session.scalar(
            select(func.count()).select_from(AssetDagRunQueue).where(AssetDagRunQueue.target_dag_id == dag_id)
        )


def _unpause_and_clear_queue(dag_id: str) -> None:
    from airflow.models.asset import AssetDagRunQueue
    from airflow.models.dag import DagModel
    from airflow.utils.session import create_session
    from sqlalchemy import delete

    with create_session() as session:
        session.get(DagModel, dag_id).is_paused = False
        session.execute(delete(AssetDagRunQueue).where(AssetDagRunQueue.target_dag_id == dag_id))


def test_an_apply_emits_the_tables_asset_event_only_when_it_published(dag_bundles: None, state_backend: str) -> None:
    dag = load_dag(TEST_DAGS / "asset_test_dags.py", "table_assets_apply")
    nonce = uuid.uuid4().hex
    before = len(_events())

    first = run_dag(dag, {"rows": {"sku-1": {"price": nonce}, "sku-2": {"price": nonce}}})
    assert first.state == "success", first.states
    events = _events()[before:]
    assert len(events) == 1, events
    result = first.xcoms["apply_view"]
    assert events[0] == {
        "table": "persistent://public/default/asset-test-prices",
        "view_id": result["view_id"],
        "commit_offset": result["commit_offset"],
        "set": 2,
        "delete": 0,
        "unchanged": 0,
        "_source_dag": "table_assets_apply",
    }
    _unpause_and_clear_queue("table_assets_downstream")  # synced by the run (paused DAGs get no runs queued)

    same = run_dag(dag, {"rows": {"sku-1": {"price": nonce}, "sku-2": {"price": nonce}}})
    assert same.state == "success" and same.xcoms["apply_view"]["unchanged"] == 2
    assert len(_events()) == before + 1, "an apply that published nothing emitted an event"
    assert _queued_for("table_assets_downstream") == 0

    smaller = run_dag(dag, {"rows": {"sku-1": {"price": nonce}}})
    assert smaller.state == "success"
    (last,) = _events()[before + 1 :]
    assert (last["set"], last["delete"], last["unchanged"]) == (0, 1, 1)
    assert last["commit_offset"] == smaller.xcoms["apply_view"]["commit_offset"] > events[0]["commit_offset"]
    assert _queued_for("table_assets_downstream") == 1  # the scheduler would run the downstream DAG once


def test_the_outlet_is_an_alias_per_task_and_can_be_turned_off() -> None:
    import pendulum
    from airflow.sdk import DAG

    from airflow_provider_pulsarstate.operators.views import ApplyTempViewOperator

    with DAG("d", schedule=None, start_date=pendulum.datetime(2026, 1, 1, tz="UTC")):
        on = ApplyTempViewOperator(task_id="apply", table_topic="t", view_id="v")
        off = ApplyTempViewOperator(task_id="apply2", table_topic="t", view_id="v", table_outlet=False)
    assert on.outlets == [table_alias("d", "apply")] and on.outlets[0].name == "pulsarstate-table:d.apply"
    assert off.outlets == []


def test_the_event_extra_is_none_for_nothing_published() -> None:
    base = {"view_id": "v", "commit_offset": 7, "set": 0, "delete": 0, "unchanged": 5, "already_applied": False}
    assert apply_event_extra("persistent://t/n/x", base) is None
    assert apply_event_extra("persistent://t/n/x", {**base, "set": 1, "already_applied": True}) is None
    assert apply_event_extra("persistent://t/n/x", {**base, "delete": 1}) == {
        "table": "persistent://t/n/x",
        "view_id": "v",
        "commit_offset": 7,
        "set": 0,
        "delete": 1,
        "unchanged": 5,
    }
