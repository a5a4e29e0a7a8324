#!/usr/bin/env python
"""Many deferred offset sensors in one triggerer-like process: CPU and detection latency.

Usage (from the repository root)::

    .venv/bin/python benchmarks/bench_offset_sensors.py                     # 200 triggers, own broker
    .venv/bin/python benchmarks/bench_offset_sensors.py --sensors 200 --topics 50 --poll-interval 1
    .venv/bin/python benchmarks/bench_offset_sensors.py --service-url pulsar://127.0.0.1:6650 \\
        --admin-url http://127.0.0.1:8080                                   # use a running broker
    .venv/bin/python benchmarks/bench_offset_sensors.py --backend embedded  # the SQLite log

What it does: ``--sensors`` :class:`OffsetProgressTrigger` instances (what 200 deferred
``OffsetProgressSensor`` tasks hand to the triggerer) run as tasks of ONE asyncio event loop in
this process, as in ``airflow triggerer``, spread over ``--topics`` topics, each waiting for its
topic's end offset to pass the current one (``end_offset`` >= end + 1), polling every
``--poll-interval`` seconds through the back end's async probe (Pulsar: async HTTP to the
admin API). A ticker coroutine measures the event loop's worst lateness throughout.

1. idle: all triggers poll, nothing is published, for ``--idle`` seconds: CPU of this process
   (user + system, from ``getrusage``) per wall second, and of the broker when it runs here;
2. detection: a separate process publishes one message to every topic at random moments over
   ``--spread`` seconds and reports when each was acknowledged (durable); each trigger's
   latency is the time from its topic's acknowledgement to its event, reported as percentiles.

The expected latency is about half a poll interval plus one admin round trip. Prints machine,
date and load average; run it on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import multiprocessing
import os
import random
import resource
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from machine import machine_info, print_run_header  # noqa: E402  (benchmarks/machine.py, beside this script)


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _proc_cpu_seconds(pid: int) -> float | None:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        ticks = os.sysconf("SC_CLK_TCK")
        return (int(fields[11]) + int(fields[12])) / ticks  # utime + stime
    except (OSError, IndexError, ValueError):
        return None


def _percentiles(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)

    def pct(p: float) -> float:
        return ordered[min(len(ordered) - 1, max(0, round(p / 100 * len(ordered)) - 1))]

    return {"p50": pct(50), "p90": pct(90), "p99": pct(99), "max": ordered[-1], "mean": statistics.fmean(ordered)}


# ---------------------------------------------------------------------------------- the publisher process
def _publisher(conn_json: str, airflow_home: str, topics: list[str], spread: float, start_at: float, out: Any) -> None:
    os.environ["AIRFLOW_HOME"] = airflow_home
    os.environ["AIRFLOW_CONN_PULSARSTATE_DEFAULT"] = conn_json
    from airflow_provider_pulsarstate.hooks.pulsarstate import PulsarStateHook

    order = list(topics)
    random.shuffle(order)
    moments = sorted(random.uniform(0, spread) for _ in order)
    acked: dict[str, float] = {}
    with PulsarStateHook() as hook:
        publishers = {t: hook.get_publisher(t, batching=False) for t in order}
        time.sleep(max(0.0, start_at - time.time()))
        t0 = time.time()
        for topic, at in zip(order, moments):
            time.sleep(max(0.0, t0 + at - time.time()))
            publishers[topic].send(b"go")
            publishers[topic].flush(timeout=30)
            acked[topic] = time.time()
    out.put(acked)


# ---------------------------------------------------------------------------------- the triggerer-like loop
async def _bench(
    args: argparse.Namespace, conn_json: str, airflow_home: str, topics: list[str], broker_pid: int | None
) -> dict[str, Any]:
    from airflow_provider_pulsarstate.triggers.offsets import OffsetProgressTrigger

    fired: dict[int, tuple[float, Any]] = {}
    worst_lag, stop = 0.0, asyncio.Event()

    async def ticker() -> None:
        nonlocal worst_lag
        loop = asyncio.get_running_loop()
        while not stop.is_set():
            before = loop.time()
            await asyncio.sleep(0.05)
            worst_lag = max(worst_lag, loop.time() - before - 0.05)

    async def one(i: int, trigger: OffsetProgressTrigger) -> None:
        runner = trigger.run()
        try:
            event = await runner.__anext__()
            fired[i] = (time.time(), event.payload)
        finally:
            await runner.aclose()

    sensor_topics = [topics[i % len(topics)] for i in range(args.sensors)]
    triggers = [
        OffsetProgressTrigger(topic=t, condition="end_offset", target=2, poll_interval=args.poll_interval)
        for t in sensor_topics
    ]
    tick = asyncio.create_task(ticker())
    started = time.monotonic()
    tasks = [asyncio.create_task(one(i, trig)) for i, trig in enumerate(triggers)]
    await asyncio.sleep(max(args.poll_interval * 2, 3.0))  # first polls (connections, TLS, pools)
    early = len(fired)

    worst_lag = 0.0
    cpu0, wall0, broker0 = _cpu_seconds(), time.monotonic(), _proc_cpu_seconds(broker_pid) if broker_pid else None
    await asyncio.sleep(args.idle)
    cpu1, wall1, broker1 = _cpu_seconds(), time.monotonic(), _proc_cpu_seconds(broker_pid) if broker_pid else None
    idle_lag = worst_lag

    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    start_at = time.time() + 1.0
    publisher = ctx.Process(target=_publisher, args=(conn_json, airflow_home, topics, args.spread, start_at, out))
    await asyncio.to_thread(publisher.start)  # spawning blocks: keep it off the measured loop
    cpu2 = _cpu_seconds()
    deadline = time.monotonic() + args.spread + 60
    while len(fired) < args.sensors and time.monotonic() < deadline:
        await asyncio.sleep(0.2)
    acked = await asyncio.to_thread(out.get, True, 60)
    await asyncio.to_thread(publisher.join, 30)
    cpu3 = _cpu_seconds()
    stop.set()
    await tick
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)

    latencies = [fired[i][0] - acked[sensor_topics[i]] for i in fired if sensor_topics[i] in acked]
    statuses: dict[str, int] = {}
    for _, payload in fired.values():
        statuses[payload.get("status", "?")] = statuses.get(payload.get("status", "?"), 0) + 1
    result: dict[str, Any] = {
        "sensors": args.sensors,
        "topics": len(topics),
        "poll_interval_s": args.poll_interval,
        "fired_before_publish": early,
        "fired": len(fired),
        "statuses": statuses,
        "idle_seconds": round(wall1 - wall0, 1),
        "idle_cpu_percent_of_one_core": round(100 * (cpu1 - cpu0) / (wall1 - wall0), 1),
        "idle_cpu_ms_per_poll": round(1000 * (cpu1 - cpu0) / ((wall1 - wall0) / args.poll_interval * args.sensors), 3),
        "idle_worst_loop_lag_ms": round(1000 * idle_lag, 1),
        "worst_loop_lag_ms": round(1000 * worst_lag, 1),
        "detection_cpu_seconds": round(cpu3 - cpu2, 2),
        "latency_s": {k: round(v, 3) for k, v in _percentiles(latencies).items()} if latencies else None,
        "run_seconds": round(time.monotonic() - started, 1),
    }
    if broker0 is not None and broker1 is not None:
        result["idle_broker_cpu_percent_of_one_core"] = round(100 * (broker1 - broker0) / (wall1 - wall0), 1)
    return result


@contextlib.contextmanager
def _broker(args: argparse.Namespace) -> Iterator[tuple[str, str, int | None]]:
    if args.service_url:
        yield args.service_url, args.admin_url, None
        return
    from airflow_provider_pulsarstate.testing.broker import PulsarStandalone

    with PulsarStandalone() as broker:
        yield broker.service_url, broker.admin_url, broker.pid


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--sensors", type=int, default=200)
    p.add_argument("--topics", type=int, default=50)
    p.add_argument("--poll-interval", type=float, default=1.0)
    p.add_argument("--idle", type=float, default=20.0, help="seconds of idle polling measured")
    p.add_argument("--spread", type=float, default=10.0, help="seconds over which the topics get their message")
    p.add_argument("--backend", choices=["pulsar", "embedded"], default="pulsar")
    p.add_argument("--service-url")
    p.add_argument("--admin-url")
    p.add_argument("--json", type=Path, help="also write the results here")
    args = p.parse_args(argv)

    logging.getLogger("airflow_provider_pulsarstate").setLevel(logging.WARNING)  # no per-trigger tables
    home = tempfile.mkdtemp(prefix="bench-offset-sensors-")
    os.environ["AIRFLOW_HOME"] = home
    os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")
    print_run_header()

    with contextlib.ExitStack() as stack:
        if args.backend == "pulsar":
            service_url, admin_url, broker_pid = stack.enter_context(_broker(args))
            extra = {"service_url": service_url, "admin_url": admin_url, "operation_timeout": 30}
        else:
            service_url, admin_url, broker_pid = str(Path(home) / "state.db"), "", None
            extra = {"service_url": service_url, "operation_timeout": 30}
        conn_json = json.dumps({"conn_type": "pulsarstate", "extra": extra})
        os.environ["AIRFLOW_CONN_PULSARSTATE_DEFAULT"] = conn_json
        from airflow_provider_pulsarstate.hooks.pulsarstate import PulsarStateHook

        t0 = time.monotonic()
        prefix = f"bench-sensors-{uuid.uuid4().hex[:6]}"
        with PulsarStateHook() as hook:
            topics = [hook.create_topic(f"{prefix}-{i}") for i in range(args.topics)]
            for topic in topics:
                publisher = hook.get_publisher(topic, batching=False)
                publisher.send(b"first")
                publisher.flush(timeout=30)
                if hook.get_pull_consumer(topic).end_offsets() != {0: 1}:
                    raise SystemExit(f"{topic}: expected end offset 1 after one message")
        print(f"set-up: {args.topics} topics with one message each in {time.monotonic() - t0:.1f}s ({args.backend})")
        result = asyncio.run(_bench(args, conn_json, home, topics, broker_pid))
    result["backend"] = args.backend
    result["loadavg_at_end"] = os.getloadavg()
    print(json.dumps(result, indent=2))
    if args.json:
        args.json.write_text(json.dumps({"machine": machine_info(), "result": result}, indent=2))
    ok = (
        result["fired"] == args.sensors
        and result["fired_before_publish"] == 0
        and result["statuses"] == {"success": args.sensors}
    )
    print("all triggers fired once, on their message" if ok else "SOME TRIGGERS DID NOT FIRE AS EXPECTED")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
