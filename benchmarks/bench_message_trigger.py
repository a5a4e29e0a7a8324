#!/usr/bin/env python
"""PulsarMessageTrigger: messages per second beside a raw pulsar-client consumer, and the latency
from publish to a stored asset event with a real triggerer.

Usage (from the repository root)::

    .venv/bin/python benchmarks/bench_message_trigger.py                  # own broker, both parts
    .venv/bin/python benchmarks/bench_message_trigger.py --messages 20000 --latency-messages 30
    .venv/bin/python benchmarks/bench_message_trigger.py --service-url pulsar://127.0.0.1:6650 \\
        --admin-url http://127.0.0.1:8080 --skip-latency

1. Throughput: ``--messages`` messages are published (batched producer) to a fresh topic, then
   consumed to the end on separate subscriptions, in the same run, by

   * ``raw``: pulsar-client's asyncio consumer, ``receive`` + ``acknowledge`` per message
     (what a hand-written trigger would do);
   * ``trigger batch=1``/``batch=N``: the trigger through Airflow's own ``SharedStreamManager``
     in ack mode (one subscriber; each event confirmed persisted as soon as it is emitted, as the
     triggerer's runner does after storing it), with one event per message or per batch;
   * ``trigger.run()``: the trigger's async generator driven directly (no shared stream).

   Each rate is messages / wall seconds from subscribe to the last acknowledgement; the ratio to
   ``raw`` is printed.
2. Latency: ``airflow triggerer`` + ``scheduler`` (LocalExecutor, SQLite) with one watcher; one
   message is published every ``--latency-interval`` seconds; latency = the asset event's stored
   timestamp minus the message's publish time (both this machine's clock), p50/p95/max.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sqlite3
import sys
import tempfile
import time
import uuid
from datetime import datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from machine import broker_urls, percentile, print_run_header  # noqa: E402


def _admin_put(admin_url: str, topic: str) -> None:
    import requests

    resp = requests.put(f"{admin_url}/admin/v2/{topic.replace('persistent://', 'persistent/')}", timeout=30)
    if resp.status_code not in (204, 409):
        raise RuntimeError(f"creating {topic}: {resp.status_code} {resp.text}")


def _publish(service_url: str, topic: str, count: int, size: int) -> None:
    import pulsar

    client = pulsar.Client(service_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn))
    try:
        producer = client.create_producer(
            topic, batching_enabled=True, batching_max_messages=1000, block_if_queue_full=True
        )
        body = b"x" * size
        for _ in range(count):
            producer.send_async(body, None)
        producer.flush()
    finally:
        client.close()


async def _raw(service_url: str, topic: str, count: int) -> float:
    import pulsar
    import pulsar.asyncio as pa

    client = pa.Client(service_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn))
    started = time.perf_counter()
    consumer = await client.subscribe(
        topic, "raw", consumer_type=pulsar.ConsumerType.Failover, initial_position=pulsar.InitialPosition.Earliest
    )
    for _ in range(count):
        msg = await consumer.receive()
        await consumer.acknowledge(msg)
    elapsed = time.perf_counter() - started
    await consumer.close()
    await client.close()
    return elapsed


async def _shared(trigger: Any, count: int) -> float:
    from airflow.triggers.shared_stream import SharedStreamManager

    manager = SharedStreamManager(ack_timeout=300)
    key = trigger.shared_stream_key()
    started = time.perf_counter()
    stream = manager.subscribe(trigger_id=1, trigger=trigger, key=key)
    seen = 0
    events = trigger.filter_shared_stream(stream)
    async for event in events:
        seq = manager.bind_pending_event(trigger_id=1, key=key)
        manager.confirm_persisted([seq])
        seen += len(event.payload["messages"])
        if seen >= count:
            break
    await events.aclose()
    # the last raw event resolves when the subscriber leaves; stopping the group drains its advance
    await manager.unsubscribe(1, key)
    return time.perf_counter() - started


async def _run(trigger: Any, count: int) -> float:
    started = time.perf_counter()
    seen = 0
    runner = trigger.run()
    async for event in runner:
        seen += len(event.payload["messages"])
        if seen >= count:
            break
    await runner.aclose()
    return time.perf_counter() - started


def throughput(service_url: str, admin_url: str, count: int, size: int, batch: int) -> list[tuple[str, float]]:
    from airflow_provider_pulsarstate.triggers.messages import PulsarMessageTrigger

    topic = f"persistent://public/default/bench-msgs-{uuid.uuid4().hex[:8]}"
    _admin_put(admin_url, topic)
    _publish(service_url, topic, count, size)
    os.environ["AIRFLOW_CONN_PULSARSTATE_BENCH"] = json.dumps(
        {
            "conn_type": "pulsarstate",
            "extra": {"service_url": service_url, "admin_url": admin_url},
        }
    )

    def trigger(subscription: str, batch_size: int) -> Any:
        return PulsarMessageTrigger(
            topics=topic,
            subscription=subscription,
            batch_size=batch_size,
            batch_wait=0.05,
            initial_position="earliest",
            pulsarstate_conn_id="pulsarstate_bench",
        )

    rows = [("raw pulsar-client asyncio (receive + acknowledge)", asyncio.run(_raw(service_url, topic, count)))]
    rows.append(("trigger, shared stream (ack mode), batch=1", asyncio.run(_shared(trigger("s1", 1), count))))
    rows.append(
        (f"trigger, shared stream (ack mode), batch={batch}", asyncio.run(_shared(trigger("sn", batch), count)))
    )
    rows.append((f"trigger.run() directly, batch={batch}", asyncio.run(_run(trigger("rn", batch), count))))
    return rows


def latency(service_url: str, admin_url: str, n: int, interval: float) -> list[float]:
    import pulsar

    from airflow_provider_pulsarstate.testing.airflow_processes import AirflowProcesses

    topic = f"persistent://public/default/bench-latency-{uuid.uuid4().hex[:8]}"
    _admin_put(admin_url, topic)
    with tempfile.TemporaryDirectory() as tmp:
        dags = Path(tmp) / "dags"
        dags.mkdir()
        (dags / "bench_watch.py").write_text(
            "from airflow.sdk import DAG, Asset, AssetWatcher\n"
            "from airflow.providers.standard.operators.empty import EmptyOperator\n"
            "from airflow_provider_pulsarstate.triggers.messages import PulsarMessageTrigger\n"
            f"a = Asset('bench-latency', watchers=[AssetWatcher(name='w', trigger=PulsarMessageTrigger("
            f"topics={topic!r}, subscription='bench', initial_position='earliest'))])\n"
            "with DAG('bench_latency', schedule=[a], catchup=False):\n    EmptyOperator(task_id='noop')\n"
        )
        env = {
            "AIRFLOW_CONN_PULSARSTATE_DEFAULT": json.dumps(
                {"conn_type": "pulsarstate", "extra": {"service_url": service_url, "admin_url": admin_url}}
            )
        }
        with AirflowProcesses(home=Path(tmp) / "airflow", dags_folder=dags, env=env, parallelism=2) as af:
            af.wait_for_dag("bench_latency")
            import requests

            path = topic.replace("persistent://", "persistent/")
            deadline = time.monotonic() + 120
            while (
                not requests.get(f"{admin_url}/admin/v2/{path}/stats", timeout=10)
                .json()
                .get("subscriptions", {})
                .get("bench", {})
                .get("consumers")
            ):
                if time.monotonic() > deadline:
                    raise RuntimeError("the watcher never subscribed:\n" + af.tail("triggerer"))
                time.sleep(0.5)
            client = pulsar.Client(service_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn))
            producer = client.create_producer(topic, batching_enabled=False)
            published = []
            for i in range(n):
                producer.send(f"m{i}".encode())
                published.append(time.time())
                time.sleep(interval)
            client.close()
            db = af.home / "airflow.db"
            deadline = time.monotonic() + 120
            while True:
                conn = sqlite3.connect(db, timeout=30)
                rows = conn.execute(
                    "SELECT e.timestamp, e.extra FROM asset_event e JOIN asset a ON a.id = e.asset_id "
                    "WHERE a.name = 'bench-latency'"
                ).fetchall()
                conn.close()
                if len(rows) >= n or time.monotonic() > deadline:
                    break
                time.sleep(0.5)
    out = []
    for stamp, extra in rows:
        data = json.loads(extra)
        message = data["payload"]["messages"][0]
        stored = datetime.fromisoformat(str(stamp).replace(" ", "T")).replace(tzinfo=None)
        # the DB stores UTC without a zone; publish_time is ms since the epoch
        stored_epoch = (stored - datetime(1970, 1, 1)).total_seconds()
        out.append(stored_epoch - message["publish_time"] / 1000.0)
    if len(out) != n:
        print(f"WARNING: {len(out)} asset events for {n} messages")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=10000)
    parser.add_argument("--size", type=int, default=100, help="payload bytes")
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--latency-messages", type=int, default=20)
    parser.add_argument("--latency-interval", type=float, default=1.0)
    parser.add_argument("--skip-latency", action="store_true")
    parser.add_argument("--service-url")
    parser.add_argument("--admin-url")
    args = parser.parse_args()
    print_run_header()
    with broker_urls(args.service_url, args.admin_url) as (service_url, admin_url):
        rows = throughput(service_url, admin_url, args.messages, args.size, args.batch)
        raw = rows[0][1]
        print(f"\nthroughput: {args.messages} messages of {args.size} B, one topic, one partition")
        print(f"{'consumer':55} {'msgs/s':>10} {'vs raw':>8}")
        for name, elapsed in rows:
            print(f"{name:55} {args.messages / elapsed:10.0f} {raw / elapsed:8.2f}")
        if not args.skip_latency:
            lat = latency(service_url, admin_url, args.latency_messages, args.latency_interval)
            if lat:
                print(
                    f"\nlatency publish -> stored asset event (real triggerer, {len(lat)} messages, "
                    f"one every {args.latency_interval}s): p50 {percentile(lat, 50) * 1000:.0f} ms, "
                    f"p95 {percentile(lat, 95) * 1000:.0f} ms, max {max(lat) * 1000:.0f} ms"
                )


if __name__ == "__main__":
    main()
