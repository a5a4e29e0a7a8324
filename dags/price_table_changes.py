"""Runs when the price table applies a view, and reads exactly what that commit changed.

``price_table_pipeline`` (or ``price_events_pipeline``) publishes a recomputed price table as the
minimal diff of a temp view, in one commit record of the shared ``price-table``. Here an
``AssetWatcher`` with ``StateChangeTrigger`` waits in the triggerer for such an apply: each one
becomes an asset event carrying the commit offset, the view id and the set/delete counts, and
schedules this DAG. ``report_changes`` reads that commit's rows through the hook (not the whole
table) and logs a short table: counts by type and a few keys.

Events that arrive before the scheduler acts coalesce into one run: the task reads every commit
in ``triggering_asset_events``, once per offset (the trigger delivers at least once; a commit
delivered twice after a triggerer crash has the same offset). Nothing here needs a broker to
parse; without a ``pulsarstate_default`` connection the embedded log under AIRFLOW_HOME is used.
"""

from __future__ import annotations

import logging
from typing import Any

import pendulum
from airflow.sdk import Asset, AssetWatcher, dag, task

from airflow_provider_pulsarstate.hooks.pulsarstate import PulsarStateHook
from airflow_provider_pulsarstate.triggers.state_change import StateChangeTrigger

log = logging.getLogger(__name__)

TABLE_TOPIC = "price-table"
POLL_INTERVAL = 5.0

price_table_applies = Asset(
    "pulsarstate-price-table-applies",
    watchers=[
        AssetWatcher(
            name="price-table-view-apply",
            trigger=StateChangeTrigger(
                table=TABLE_TOPIC, on=["view_apply"], key_prefix="sku-", poll_interval=POLL_INTERVAL
            ),
        )
    ],
)


def commits_of(triggering_asset_events: Any) -> list[tuple[str, int]]:
    """The (table, commit offset) pairs of the events that scheduled this run, each once, in order."""
    seen = set()
    for events in (triggering_asset_events or {}).values():
        for event in events:
            payload = (event.extra or {}).get("payload") or {}
            if isinstance(payload.get("offset"), int) and isinstance(payload.get("table"), str):
                seen.add((payload["table"], payload["offset"]))
    return sorted(seen, key=lambda pair: (pair[0], pair[1]))


@dag(
    dag_id="price_table_changes",
    schedule=[price_table_applies],
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,
    tags=["pulsarstate", "example"],
)
def price_table_changes() -> None:
    @task
    def report_changes(*, triggering_asset_events: Any = None) -> list[dict[str, Any]]:
        """Read each triggering commit's changes; the summaries are the XCom."""
        summaries = []
        with PulsarStateHook() as hook:
            ours = hook.topic_name(TABLE_TOPIC)
            for table, offset in commits_of(triggering_asset_events):
                if table != ours:  # an asset event posted by hand may name anything: read only our table
                    log.warning("ignoring an event of table %r (this DAG reads %s)", table, ours)
                    continue
                changes = hook.get_table_changes(table, offset)
                log.info("%s commit %d (view %s)\n%s", table, offset, changes.commit.view_id, changes.table(sample=3))
                summaries.append(changes.summary(sample=3))
        return summaries

    report_changes()


price_table_changes()
