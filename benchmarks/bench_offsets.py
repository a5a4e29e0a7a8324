#!/usr/bin/env python
"""Benchmark of PullConsumer on Pulsar (offsets from the broker's entry index) beside a raw Reader.

Usage (from the repository root)::

    .venv/bin/python benchmarks/bench_offsets.py                  # 1M messages, own broker
    .venv/bin/python benchmarks/bench_offsets.py --messages 100000 # smaller
    .venv/bin/python benchmarks/bench_offsets.py --service-url pulsar://127.0.0.1:6650 \\
        --admin-url http://127.0.0.1:8080                         # a running broker (index interceptor on)

Without ``--service-url`` the script starts its own standalone broker (the project's
``standalone.conf``: index interceptor on) and stops it at the end. One run, one broker:

(a) throughput: a topic of N messages (``--payload`` bytes each) written by a batching producer,
    another written by a non-batching one. On each, a raw pulsar-client Reader reads from the
    earliest message to the last (``read_next``, touching ``data()``), then ``PullConsumer.pull``
    reads the same offsets in pulls of ``--pull-size`` (each message with its offset, key,
    properties and publish time). Target: ours at least 70% of the raw Reader's rate.
(b) random-offset latency (batched topic): pulls of ``--pull-size`` at random offsets, with a cold
    cache (a new consumer per pull: index look-up, entry headers, a new reader) and a warm one
    (one consumer, offsets it already resolved: the cached position, a new reader).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import logging
import os
import platform
import random
import statistics
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import pulsar  # noqa: E402
from machine import machine_info  # noqa: E402  (benchmarks/machine.py, beside this script)

from airflow_provider_pulsarstate import ConnectionConfig, open_backend  # noqa: E402
from airflow_provider_pulsarstate.engine.offsets import PullConsumer, create_topic  # noqa: E402

log = logging.getLogger("bench_offsets")
TARGET = 0.70


def publish(client: pulsar.Client, topic: str, n: int, payload: int, *, batching: bool) -> float:
    producer = client.create_producer(
        topic,
        batching_enabled=batching,
        block_if_queue_full=True,
        max_pending_messages=5000,
        batching_max_messages=1000,
        batching_max_publish_delay_ms=5,
    )
    body = os.urandom(payload)
    done = threading.Semaphore(0)
    failed: list[object] = []

    def callback(res: pulsar.Result, _mid: object) -> None:
        if res != pulsar.Result.Ok:
            failed.append(res)
        done.release()

    t0 = time.perf_counter()
    for i in range(n):
        producer.send_async(body, callback)
    producer.flush()
    for _ in range(n):
        done.acquire()
    elapsed = time.perf_counter() - t0
    producer.close()
    if failed:
        raise SystemExit(f"{len(failed)} sends failed: {failed[0]}")
    return elapsed


def raw_reader(client: pulsar.Client, topic: str, n: int) -> float:
    reader = client.create_reader(topic, pulsar.MessageId.earliest, receiver_queue_size=1000)
    t0 = time.perf_counter()
    total = 0
    for _ in range(n):
        total += len(reader.read_next(60_000).data())
    elapsed = time.perf_counter() - t0
    reader.close()
    return elapsed


def ours(backend: object, topic: str, n: int, pull_size: int) -> float:
    with PullConsumer(backend, topic) as consumer:  # type: ignore[arg-type]
        t0 = time.perf_counter()
        offset = total = count = 0
        while count < n:
            result = consumer.pull(offset, max_messages=pull_size, max_bytes=64 << 20, timeout=10.0)
            for m in result.messages:
                total += len(m.value)
            count += len(result.messages)
            offset = result.next_offset
        elapsed = time.perf_counter() - t0
    if offset != n:
        raise SystemExit(f"pulled up to offset {offset}, expected {n}")
    return elapsed


def latencies(backend: object, topic: str, n: int, pull_size: int, samples: int) -> tuple[list[float], list[float]]:
    rng = random.Random(5)
    offsets = [rng.randrange(n) for _ in range(samples)]
    cold = []
    for off in offsets:
        with PullConsumer(backend, topic) as consumer:  # type: ignore[arg-type]
            t0 = time.perf_counter()
            result = consumer.pull(off, max_messages=pull_size, max_bytes=64 << 20)
            cold.append(time.perf_counter() - t0)
            assert result.messages[0].offset == off
    warm = []
    with PullConsumer(backend, topic, position_cache_size=max(1000, samples)) as consumer:  # type: ignore[arg-type]
        for off in offsets:  # resolve each once (untimed)
            consumer.pull(off, max_messages=1)
        for off in offsets:
            t0 = time.perf_counter()
            result = consumer.pull(off, max_messages=pull_size, max_bytes=64 << 20)
            warm.append(time.perf_counter() - t0)
            assert result.messages[0].offset == off
    return cold, warm


def summary(values: list[float]) -> str:
    ms = sorted(v * 1000 for v in values)
    p95 = ms[min(len(ms) - 1, int(len(ms) * 0.95))]
    return f"median {statistics.median(ms):.1f} ms, p95 {p95:.1f} ms, mean {statistics.fmean(ms):.1f} ms"


@contextlib.contextmanager
def broker_for(args: argparse.Namespace) -> Iterator[None]:
    if args.service_url:
        args.admin_url = args.admin_url or ConnectionConfig(url=args.service_url).resolved_admin_url
        yield
        return
    from airflow_provider_pulsarstate.testing.broker import PulsarStandalone

    with PulsarStandalone(heap="2g") as broker:
        args.service_url, args.admin_url = broker.service_url, broker.admin_url
        yield


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--pull-size", type=int, default=500)
    parser.add_argument("--payload", type=int, default=100, help="bytes per message (default 100)")
    parser.add_argument("--samples", type=int, default=100, help="random-offset pulls per cache state (default 100)")
    parser.add_argument("--service-url", default="")
    parser.add_argument("--admin-url", default="")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stderr)
    logging.getLogger("airflow_provider_pulsarstate.testing.broker").setLevel(logging.WARNING)
    print(f"date: {datetime.datetime.now(datetime.timezone.utc).isoformat(timespec='seconds')}")
    m = machine_info()
    print(
        f"machine: {platform.node()}: {m['cpus']} CPUs ({m.get('cpu', '?')}), {m.get('mem_gb', '?')} GB, "
        f"Python {m['python']}, pulsar-client {m.get('pulsar_client', '?')}; load average at start {os.getloadavg()[0]:.2f}"
    )
    rows = []
    passed = True
    with broker_for(args):
        config = ConnectionConfig(url=args.service_url, admin_url=args.admin_url, operation_timeout=60.0)
        backend = open_backend(config)
        client = pulsar.Client(
            args.service_url, operation_timeout_seconds=60, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn)
        )
        try:
            n = args.messages
            topics = {}
            for batching in (True, False):
                topic = f"persistent://public/default/bench-offsets-{'batched' if batching else 'unbatched'}-{uuid.uuid4().hex[:6]}"
                create_topic(backend, topic)
                took = publish(client, topic, n, args.payload, batching=batching)
                log.info("published %d %s messages in %.1fs", n, "batched" if batching else "unbatched", took)
                topics[batching] = topic
            for batching, topic in topics.items():
                kind = "batched" if batching else "unbatched"
                raw_s = raw_reader(client, topic, n)
                ours_s = ours(backend, topic, n, args.pull_size)
                ratio = raw_s / ours_s
                passed &= ratio >= TARGET
                rows.append(
                    (
                        f"{kind}: {n:,} msgs, pulls of {args.pull_size}",
                        f"{n / ours_s:,.0f} msg/s",
                        f"{n / raw_s:,.0f} msg/s",
                        f"{ratio:.2f}",
                        "PASS" if ratio >= TARGET else "FAIL",
                    )
                )
                log.info("%s: ours %.1fs, raw reader %.1fs", kind, ours_s, raw_s)
            cold, warm = latencies(backend, topics[True], n, args.pull_size, args.samples)
        finally:
            client.close()
            backend.close()
    print(f"\n{'throughput':<36} {'PullConsumer':>14} {'raw Reader':>14} {'ratio':>6}  target {TARGET:.2f}")
    for name, a, b, r, v in rows:
        print(f"{name:<36} {a:>14} {b:>14} {r:>6}  {v}")
    print(f"\nrandom-offset pull of {args.pull_size} ({args.samples} samples, batched topic of {args.messages:,}):")
    print(f"  cold cache (new consumer): {summary(cold)}")
    print(f"  warm cache (resolved):     {summary(warm)}")
    sys.stdout.flush()
    os._exit(0 if passed else 1)  # pulsar-client may abort at interpreter exit (apache/pulsar-client-python#256)


if __name__ == "__main__":
    main()
