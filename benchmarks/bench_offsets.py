#!/usr/bin/env python
"""Pull-consumer benchmark: offset pulls against a raw pulsar-client Reader, on one real broker.

Usage (from the repository root)::

    .venv/bin/python benchmarks/bench_offsets.py                 # full run (1M messages per producer kind)
    .venv/bin/python benchmarks/bench_offsets.py --quick         # smoke run (50k messages)
    .venv/bin/python benchmarks/bench_offsets.py --json out.json # also write the results as JSON
    .venv/bin/python benchmarks/bench_offsets.py --service-url pulsar://127.0.0.1:6650 --admin-url http://127.0.0.1:8080

Without ``--service-url`` it starts its own Pulsar standalone broker (index interceptor on) and
stops it at the end. Phases, each printed as ``phase | ours | baseline | ratio | target | pass/fail``:

(a) throughput: ``--messages`` messages of ``--size`` bytes are published once per producer kind
    (batched at client defaults; unbatched), then read in full, alternately ``--runs`` times each
    (best counts): ours = ``PullConsumer.pull(offset, max_messages=500)`` from the beginning offset
    until ``next_offset`` reaches the end offset, touching every value; baseline = a raw
    ``pulsar.Client.create_reader`` from earliest, ``read_next`` until the same count, touching
    ``data()``. Target: ours >= 0.70 x the Reader.
(b) random-offset pull latency (pulls of 100 messages at ``--samples`` random offsets): cold = a
    new PullConsumer per pull (empty position cache, no pooled reader); warm = one consumer pulling
    the same offsets a second time (position cache filled; no reader continues there, so each pull
    still opens a reader). Median and p99, no target.
(c) embedded, no target: the same pulls over the embedded log (SQLite) beside a raw SQL read of
    the same rows.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import random
import sqlite3
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import pulsar  # noqa: E402

from airflow_provider_pulsarstate import ConnectionConfig, open_backend  # noqa: E402
from airflow_provider_pulsarstate.engine.offsets import PullConsumer, create_topic, open_publisher  # noqa: E402

PULL = 500
TARGET = 0.70


def machine() -> str:
    cpu = "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return f"{os.cpu_count()} vCPU {cpu}, {mem:.0f} GiB, Python {platform.python_version()}, load {os.getloadavg()[0]:.2f}"


def publish(backend: Any, topic: str, count: int, size: int, *, batching: bool) -> float:
    create_topic(backend, topic)
    body = os.urandom(size // 2).hex().encode()[:size]
    start = time.perf_counter()
    with open_publisher(backend, topic, batching=batching) as pub:
        for i in range(count):
            pub.send(body)
            if i % 100_000 == 99_999:
                pub.flush(timeout=120)
                print(f"    published {i + 1:,} ({(i + 1) / (time.perf_counter() - start):,.0f} msg/s)", flush=True)
        pub.flush(timeout=120)
    return time.perf_counter() - start


def pull_all(backend: Any, topic: str) -> tuple[float, int, int]:
    """Seconds, messages and bytes for one full pass of pulls."""
    with PullConsumer(backend, topic) as consumer:
        start = time.perf_counter()
        offset = consumer.beginning_offsets()[0]
        end = consumer.end_offsets()[0]
        count = nbytes = 0
        while offset < end:
            result = consumer.pull(offset, max_messages=PULL)
            for message in result.messages:
                nbytes += len(message.value)
            count += len(result.messages)
            offset = result.next_offset
        return time.perf_counter() - start, count, nbytes


def raw_read(client: pulsar.Client, topic: str, count: int) -> tuple[float, int, int]:
    start = time.perf_counter()
    reader = client.create_reader(topic, pulsar.MessageId.earliest)
    n = nbytes = 0
    while n < count:
        nbytes += len(reader.read_next(timeout_millis=30_000).data())
        n += 1
    reader.close()
    return time.perf_counter() - start, n, nbytes


def percentiles(samples: list[float]) -> tuple[float, float]:
    ordered = sorted(samples)
    return statistics.median(ordered), ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]


def latency(backend: Any, topic: str, offsets: list[int]) -> dict[str, tuple[float, float]]:
    cold = []
    for offset in offsets:
        with PullConsumer(backend, topic) as consumer:
            t = time.perf_counter()
            consumer.pull(offset, max_messages=100)
            cold.append(time.perf_counter() - t)
    warm = []
    with PullConsumer(backend, topic, position_cache_size=len(offsets) + 10) as consumer:
        for offset in offsets:
            consumer.pull(offset, max_messages=100)
        for offset in offsets:
            t = time.perf_counter()
            consumer.pull(offset, max_messages=100)
            warm.append(time.perf_counter() - t)
    return {"cold": percentiles(cold), "warm": percentiles(warm)}


def best(runs: int, fn: Callable[[], tuple[float, int, int]]) -> tuple[float, int, int]:
    return min((fn() for _ in range(runs)), key=lambda r: r[0])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--size", type=int, default=100, help="payload bytes")
    parser.add_argument("--runs", type=int, default=2, help="alternating runs of ours and the baseline")
    parser.add_argument("--samples", type=int, default=200, help="random offsets for the latency phase")
    parser.add_argument("--quick", action="store_true", help="50k messages, 1 run, 50 samples")
    parser.add_argument("--service-url")
    parser.add_argument("--admin-url", default="")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if args.quick:
        args.messages, args.runs, args.samples = 50_000, 1, 50

    print(f"# bench_offsets {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC; {machine()}")
    broker = None
    if args.service_url:
        service_url, admin_url = args.service_url, args.admin_url
    else:
        from airflow_provider_pulsarstate.testing.broker import PulsarStandalone

        broker = PulsarStandalone(data_dir=Path(tempfile.mkdtemp(prefix="bench-offsets-")))
        broker.start()
        service_url, admin_url = broker.service_url, broker.admin_url
    rows: list[dict[str, Any]] = []
    try:
        config = ConnectionConfig(url=service_url, admin_url=admin_url, operation_timeout=60.0)
        backend = open_backend(config)
        client = pulsar.Client(service_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn))
        try:
            for batching in (True, False):
                kind = "batched" if batching else "unbatched"
                topic = f"persistent://public/default/bench-offsets-{kind}-{uuid.uuid4().hex[:8]}"
                print(f"  publishing {args.messages:,} x {args.size} B, {kind} ...", flush=True)
                secs = publish(backend, topic, args.messages, args.size, batching=batching)
                print(f"  published in {secs:.1f}s", flush=True)
                ours_runs, raw_runs = [], []
                for _ in range(args.runs):
                    ours_runs.append(pull_all(backend, topic))
                    raw_runs.append(raw_read(client, topic, args.messages))
                ours, raw = min(ours_runs), min(raw_runs)
                if ours[1] != args.messages or raw[1] != args.messages:
                    raise SystemExit(f"{kind}: pulled {ours[1]:,} and read {raw[1]:,} of {args.messages:,} messages")
                ratio = (ours[1] / ours[0]) / (raw[1] / raw[0])
                rows.append({
                    "phase": f"(a) pull {args.messages:,} msgs in pulls of {PULL}, {kind} producer",
                    "ours": f"{ours[1] / ours[0]:,.0f} msg/s ({ours[0]:.2f} s)",
                    "baseline": f"raw Reader {raw[1] / raw[0]:,.0f} msg/s ({raw[0]:.2f} s)",
                    "ratio": round(ratio, 2), "target": f">= {TARGET}", "pass": ratio >= TARGET,
                })
                print("  " + json.dumps(rows[-1]), flush=True)
                rng = random.Random(7)
                offsets = [rng.randrange(0, args.messages - 100) for _ in range(args.samples)]
                lat = latency(backend, topic, offsets)
                for name, (p50, p99) in lat.items():
                    rows.append({
                        "phase": f"(b) random-offset pull of 100, {kind}, {name} cache",
                        "ours": f"median {p50 * 1000:.1f} ms, p99 {p99 * 1000:.1f} ms",
                        "baseline": "-", "ratio": "-", "target": "(info)", "pass": None,
                    })
                    print("  " + json.dumps(rows[-1]), flush=True)
        finally:
            client.close()
            backend.close()
        rows.extend(embedded_rows(args.messages, args.size, args.runs))
    finally:
        if broker is not None:
            broker.stop()

    print("\n| phase | ours | baseline | ratio | target | pass/fail |\n|---|---|---|---|---|---|")
    for r in rows:
        verdict = "-" if r["pass"] is None else ("**PASS**" if r["pass"] else "**FAIL**")
        print(f"| {r['phase']} | {r['ours']} | {r['baseline']} | {r['ratio']} | {r['target']} | {verdict} |")
    if args.json:
        args.json.write_text(json.dumps({"machine": machine(), "rows": rows}, indent=2))
    return 0 if all(r["pass"] is not False for r in rows) else 1


def embedded_rows(count: int, size: int, runs: int) -> list[dict[str, Any]]:
    path = Path(tempfile.mkdtemp(prefix="bench-offsets-embedded-")) / "state.db"
    config = ConnectionConfig(url=str(path), operation_timeout=60.0)
    topic = "persistent://public/default/bench-offsets-embedded"
    with open_backend(config) as backend:
        print(f"  embedded: publishing {count:,} ...", flush=True)
        publish(backend, topic, count, size, batching=True)
        ours = best(runs, lambda: pull_all(backend, topic))

    def raw() -> tuple[float, int, int]:
        start = time.perf_counter()
        conn = sqlite3.connect(path)
        n = nbytes = 0
        for (payload,) in conn.execute("SELECT payload FROM entries WHERE topic = ? ORDER BY pos", (topic,)):
            n += 1
            nbytes += len(payload)
        conn.close()
        return time.perf_counter() - start, n, nbytes

    base = best(runs, raw)
    ratio = (ours[1] / ours[0]) / (base[1] / base[0])
    row = {
        "phase": f"(c) embedded: pull {count:,} msgs in pulls of {PULL}",
        "ours": f"{ours[1] / ours[0]:,.0f} msg/s ({ours[0]:.2f} s)",
        "baseline": f"raw SQL read {base[1] / base[0]:,.0f} msg/s ({base[0]:.2f} s)",
        "ratio": round(ratio, 2), "target": "(info)", "pass": None,
    }
    print("  " + json.dumps(row), flush=True)
    return [row]


if __name__ == "__main__":
    sys.exit(main())
