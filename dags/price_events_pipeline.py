"""Price-change events folded into a price table exactly once; consumers see only what changed.

``publish_events`` stands in for an upstream system: it publishes batch ``params.batch`` of
deterministic price-change events (``jobs/price_events_job.py``: ``batch_events``) to the
``price-events`` topic (2 partitions, keyed by sku). ``wait_for_events`` (an
:class:`~airflow_provider_pulsarstate.sensors.offsets.OffsetProgressSensor`) gates the Spark job
until ``params.min_events`` new events arrived since its watermark. The ``prices`` group then:

* ``create_view`` opens a temp view on ``price-events-table``;
* ``spark_job`` reads the table with its recorded offsets of the topic (one consistent read),
  snapshots the end offsets, pulls exactly that range from the executors, folds the events into
  the table and stages it (only rows of skus with new events change);
* ``apply_view`` publishes the diff and the consumed offsets in one commit record (it refuses a
  view whose range does not start at the table's record: another run consumed it);
* ``commit_offsets`` then moves the ``price-table-ingest`` subscription's cursor to the record.

The group runs under a lease (``lease.acquire`` / ``lease.release``, one lease per table): two
Airflow deployments running this DAG never run the Spark job at once. The holder names the
deployment (the Airflow Variable ``pulsarstate_deployment``, e.g. ``AIRFLOW_VAR_PULSARSTATE_DEPLOYMENT``),
the DAG and the run; the second deployment waits up to ``params.lease_timeout`` seconds. Each
guarded task renews the lease on start and every ``ttl / 3`` while it runs (the Spark job is killed
if the lease is lost), apply publishes under the lease's fencing token, and ``release`` runs
whatever happened.

A re-run starts from the table's record, not the cursor: kill any task and run again, and every
event is counted exactly once (tests/airflow/test_ingest_pipeline.py does it at each boundary).
Trigger it with ``{"batch": 2}`` after ``{"batch": 1}``: the second run consumes only batch 2 and
publishes only the rows it changed. State lives in the embedded log under AIRFLOW_HOME without a
``pulsarstate_default`` connection, in a Pulsar broker with one; Spark needs
``AIRFLOW_CONN_SPARK_DEFAULT='{"conn_type": "spark", "host": "local[*]"}'`` (or a real cluster).
"""

from __future__ import annotations

import importlib.util
import logging
from pathlib import Path
from typing import Any

import pendulum
from airflow.sdk import Param, dag, get_current_context, task

from airflow_provider_pulsarstate.hooks.pulsarstate import PulsarStateHook
from airflow_provider_pulsarstate.operators.leases import lease_task_group
from airflow_provider_pulsarstate.operators.views import temp_view_spark_task_group
from airflow_provider_pulsarstate.sensors.offsets import OffsetProgressSensor

log = logging.getLogger(__name__)

JOB = Path(__file__).resolve().parent / "jobs" / "price_events_job.py"
EVENTS_TOPIC = "price-events"
TABLE_TOPIC = "price-events-table"
SUBSCRIPTION = "price-table-ingest"
PARTITIONS = 2
HOLDER = "{{ var.value.get('pulsarstate_deployment', 'airflow') }}/{{ dag.dag_id }}/{{ run_id }}"
LEASE_TTL = 30.0


def _job() -> Any:
    """The job module (its event generator is the upstream system's)."""
    spec = importlib.util.spec_from_file_location("price_events_job", JOB)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@dag(
    dag_id="price_events_pipeline",
    schedule=None,
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    tags=["pulsarstate", "spark", "offsets", "example"],
    params={
        "batch": Param(1, type="integer", minimum=1, description="the batch of events upstream publishes"),
        "events": Param(10_000, type="integer", minimum=1, description="events per batch"),
        "skus": Param(100_000, type="integer", minimum=1, description="skus the events spread over"),
        "min_events": Param(1, type="integer", minimum=1, description="new events that start the job"),
        "events_topic": Param(EVENTS_TOPIC, type="string", description="the source topic"),
        "table_topic": Param(TABLE_TOPIC, type="string", description="the shared state table"),
        "subscription": Param(SUBSCRIPTION, type="string", description="the cursor that follows the table"),
        "lease_timeout": Param(900, type="number", minimum=0, description="seconds to wait for the table's lease"),
        "lease_ttl": Param(
            LEASE_TTL,
            type="number",
            exclusiveMinimum=0,
            description="seconds the table's lease outlives its last renewal (a run that dies holding it "
            "holds off the next run this long)",
        ),
    },
)
def price_events_pipeline() -> None:
    @task
    def publish_events() -> dict[str, Any]:
        """Upstream: publish one deterministic batch of events, keyed by sku; returns the end offsets."""
        params = get_current_context()["params"]
        job = _job()
        events = job.batch_events(params["batch"], params["events"], params["skus"])
        with PulsarStateHook() as hook:
            topic = hook.create_topic(params["events_topic"], partitions=PARTITIONS)
            publisher = hook.get_publisher(topic)
            for event in events:
                publisher.send(job.encode(event), key=event["sku"])
            publisher.flush(timeout=120.0)
            end = hook.get_pull_consumer(topic).end_offsets()
        log.info("published batch %d: %d events to %s, end offsets %s", params["batch"], len(events), topic, end)
        return {
            "topic": topic,
            "batch": params["batch"],
            "published": len(events),
            "end_offsets": {str(p): o for p, o in end.items()},
        }

    wait = OffsetProgressSensor(
        task_id="wait_for_events",
        topic="{{ params.events_topic }}",
        condition="new_messages",
        target="{{ params.min_events }}",
        watermark_key="price_events_pipeline/{{ params.events_topic }}",
        poke_interval=1.0,
        timeout=600,
        mode="poke",
    )

    prices = temp_view_spark_task_group(
        "prices",
        table_topic="{{ params.table_topic }}",
        application=str(JOB),
        source_topic="{{ params.events_topic }}",
        source_subscription="{{ params.subscription }}",
        scope_prefix="sku-",
        name="price-events-job",
        conf={"spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "4"},
    )

    lease = lease_task_group(
        "lease",
        lease_name="price-events-ingest/{{ params.table_topic }}",
        holder=HOLDER,
        ttl="{{ params.lease_ttl }}",
        timeout="{{ params.lease_timeout }}",
        guard=[prices],  # lease.acquire >> prices >> lease.release; create, Spark, apply, commit hold the lease
    )

    @task
    def report(published: dict, result: dict, committed: dict) -> dict:
        """Log what this run consumed and published; the summary is the XCom."""
        params = get_current_context()["params"]
        with PulsarStateHook() as hook, hook.get_table(params["table_topic"]) as table:
            size = table.size(latest=True)
        ranges = result.get("sources") or []
        summary = {
            "batch": params["batch"],
            "events_published": published["published"],
            "offsets_consumed": sum(r["next"] - r["start"] for r in ranges),  # = events, unless offsets skip numbers
            "offsets": {str(r["partition"]): [r["start"], r["next"]] for r in ranges},
            "view_id": result["view_id"],
            "published": result["set"] + result["delete"],
            "set": result["set"],
            "delete": result["delete"],
            "unchanged": result["unchanged"],
            "table_rows": size,
            "commit_offset": result["commit_offset"],
            "cursor": committed["committed"],
        }
        log.info(
            "price events batch %s ingested\n%s",
            params["batch"],
            "\n".join(f"  {name:<16} {value}" for name, value in summary.items() if name != "batch"),
        )
        return summary

    published = publish_events()
    published >> wait >> lease.acquire
    report(published, prices.apply.output, prices.commit.output)


price_events_pipeline()
