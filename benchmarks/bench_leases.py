#!/usr/bin/env python
"""Durable leases: acquire and renew latency, failover after SIGKILL, raw exclusive-producer handover.

Usage (from the repository root)::

    .venv/bin/python benchmarks/bench_leases.py                       # own broker, 200 ops, 5 failovers: ~3 min
    .venv/bin/python benchmarks/bench_leases.py --ops 500 --failovers 10 --ttl 5
    .venv/bin/python benchmarks/bench_leases.py --service-url pulsar://127.0.0.1:6650 \\
        --admin-url http://127.0.0.1:8080                             # use a running broker
    .venv/bin/python benchmarks/bench_leases.py --backend embedded    # the SQLite log (no raw handover)

What it measures, on one lease log (``Leases`` from engine/recipes/lease.py):

1. latency in this process: ``--ops`` acquire+release cycles on one name (acquire and release
   timed separately), then ``--ops`` renews of one held lease: median and p99;
2. the first acquire of a free lease by ``--fresh`` fresh processes (connect, replay of the lease
   log, lease-log writer: what an Airflow task pays once), timed from just before ``acquire``;
3. failover (``--failovers`` rounds): a holder process acquires with ``--ttl``
   and renews every ttl/3; a challenger process waits in ``acquire(timeout=...)``; the holder is
   SIGKILLed at a random point of its renew cycle; the time from the kill to the challenger's
   acquire returning is judged against the target ttl + 1 s. A challenger takes over only after
   ttl of silence *as it observed it*, so the expected time is ttl minus the part of the renew
   cycle that had passed at the kill (ttl*2/3 .. ttl) plus one poll and one write;
4. Pulsar only, on the same broker: the raw exclusive-producer handover the lease is built beside:
   a process holds a pulsar-client ``Exclusive`` producer and is SIGKILLed; a challenger process
   either polls ``create_producer(Exclusive)`` every ``--poll-interval`` or waits in one
   ``WaitForExclusive`` creation (bounded by ``--wait-bound``: it can wait forever,
   apache/pulsar#24516). The broker sees the dead connection at once, so this is the floor; the
   lease's extra time is the ttl a challenger must wait because it cannot tell dead from paused.

All times are on CLOCK_MONOTONIC, which every process of the machine shares. Prints machine,
date and load average; run it on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import multiprocessing
import os
import queue
import random
import signal
import statistics
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from machine import broker_urls, machine_info, percentile, print_run_header  # noqa: E402  (benchmarks/machine.py, beside this script)

CTX = multiprocessing.get_context("spawn")


def _ms(values: list[float]) -> str:
    return f"median {1000 * statistics.median(values):.1f} ms, p99 {1000 * percentile(values, 99):.1f} ms"


def _leases(conn: dict[str, Any], topic: str, poll_interval: float) -> Any:
    from airflow_provider_pulsarstate import ConnectionConfig, open_backend
    from airflow_provider_pulsarstate.engine.recipes.lease import Leases

    logging.getLogger("airflow_provider_pulsarstate").setLevel(logging.WARNING)
    return Leases(open_backend(ConnectionConfig(**conn)), topic, poll_interval=poll_interval)


# ---------------------------------------------------------------------------------- child processes
def _fresh_acquirer(conn: dict[str, Any], topic: str, name: str, out: Any) -> None:
    leases = _leases(conn, topic, 0.5)
    t0 = time.monotonic()
    lease = leases.acquire(name, f"fresh-{os.getpid()}", ttl=30.0, timeout=60)
    first = time.monotonic() - t0
    leases.release(lease)
    t0 = time.monotonic()
    lease = leases.acquire(name, f"fresh-{os.getpid()}", ttl=30.0, timeout=60)
    second = time.monotonic() - t0
    leases.release(lease)
    out.put((first, second))
    _exit(out)


def _lease_holder(conn: dict[str, Any], topic: str, name: str, ttl: float, out: Any) -> None:
    leases = _leases(conn, topic, 0.5)
    lease = leases.acquire(name, "holder", ttl=ttl, timeout=120)
    out.put(("acquired", lease.token, time.monotonic()))
    while True:
        time.sleep(ttl / 3)
        lease = leases.renew(lease)
        out.put(("renewed", lease.token, time.monotonic()))


def _lease_challenger(conn: dict[str, Any], topic: str, name: str, ttl: float, poll: float, out: Any) -> None:
    leases = _leases(conn, topic, poll).start()
    out.put(("ready", 0, time.monotonic()))
    lease = leases.acquire(name, "challenger", ttl=ttl, timeout=ttl * 4 + 60)
    out.put(("acquired", lease.token, time.monotonic()))
    leases.release(lease)
    _exit(out)


def _raw_holder(service_url: str, topic: str, out: Any) -> None:
    import pulsar

    client = pulsar.Client(service_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
    client.create_producer(topic, access_mode=pulsar.ProducerAccessMode.Exclusive)
    out.put(("ready", time.monotonic()))
    while True:
        time.sleep(60)


def _raw_challenger(service_url: str, topic: str, mode: str, poll: float, bound: float, out: Any) -> None:
    import pulsar

    client = pulsar.Client(service_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
    out.put(("ready", time.monotonic()))
    if mode == "poll":
        attempts = 0
        while True:
            attempts += 1
            try:
                client.create_producer(topic, access_mode=pulsar.ProducerAccessMode.Exclusive)
                break
            except Exception:  # ProducerFenced / ProducerBusy while the holder lives
                time.sleep(poll)
        out.put(("acquired", time.monotonic(), attempts))
    else:
        got: dict[str, float] = {}

        def create() -> None:
            with contextlib.suppress(Exception):
                client.create_producer(topic, access_mode=pulsar.ProducerAccessMode.WaitForExclusive)
                got["t"] = time.monotonic()

        thread = threading.Thread(target=create, daemon=True)
        thread.start()
        thread.join(bound)  # WaitForExclusive can wait forever: bounded here, abandoned with the process
        out.put(("acquired", got["t"], 1) if "t" in got else ("timeout", time.monotonic(), 1))
    _exit(out)


def _exit(out: Any) -> None:
    """Leave at once (no orderly client shutdown to wait for), after the queue's feeder flushed."""
    out.close()
    out.join_thread()
    os._exit(0)


def _get(q: Any, what: str, timeout: float) -> Any:
    try:
        return q.get(timeout=timeout)
    except queue.Empty:
        raise SystemExit(f"no answer from the {what} within {timeout:.0f}s") from None


def _kill(proc: Any) -> float:
    os.kill(proc.pid, signal.SIGKILL)
    killed = time.monotonic()
    proc.join(10)
    return killed


# ---------------------------------------------------------------------------------- phases
def bench_latency(conn: dict[str, Any], topic: str, ops: int) -> dict[str, list[float]]:
    leases = _leases(conn, topic, 0.5)
    try:
        for _ in range(5):  # connections, writer, first replay
            leases.release(leases.acquire("warm-up", "bench", ttl=30.0))
        acquire, release, renew = [], [], []
        for _ in range(ops):
            t0 = time.monotonic()
            lease = leases.acquire("cycle", "bench", ttl=30.0, timeout=10)
            t1 = time.monotonic()
            leases.release(lease)
            acquire.append(t1 - t0)
            release.append(time.monotonic() - t1)
        lease = leases.acquire("renewed", "bench", ttl=30.0, timeout=10)
        for _ in range(ops):
            t0 = time.monotonic()
            lease = leases.renew(lease)
            renew.append(time.monotonic() - t0)
        leases.release(lease)
        return {"acquire": acquire, "release": release, "renew": renew, "contended": [leases.contended]}
    finally:
        leases.close()


def bench_fresh(conn: dict[str, Any], topic: str, count: int) -> list[tuple[float, float]]:
    results = []
    for i in range(count):
        out = CTX.Queue()
        proc = CTX.Process(target=_fresh_acquirer, args=(conn, topic, f"fresh-{i}", out))
        proc.start()
        results.append(_get(out, "fresh acquirer", 120))
        proc.join(30)
    return results


def bench_failover(conn: dict[str, Any], topic: str, ttl: float, poll: float, rounds: int) -> list[dict[str, float]]:
    results = []
    for i in range(rounds):
        name = f"failover-{i}"
        hq, cq = CTX.Queue(), CTX.Queue()
        holder = CTX.Process(target=_lease_holder, args=(conn, topic, name, ttl, hq))
        challenger = CTX.Process(target=_lease_challenger, args=(conn, topic, name, ttl, poll, cq))
        holder.start()
        try:
            _, token, _ = _get(hq, "lease holder", 120)
            challenger.start()
            _get(cq, "lease challenger", 120)
            # let the challenger settle into its acquire, then pick a renew and a random point after it
            for _ in range(2):
                event, _, renewed = _get(hq, "lease holder", ttl * 2)
                assert event == "renewed"
            delay = random.uniform(0, ttl / 3)
            time.sleep(max(0.0, renewed + delay - time.monotonic()))
            killed = _kill(holder)
            event, new_token, acquired = _get(cq, "lease challenger", ttl * 4 + 60)
            if new_token != token + 1:
                raise SystemExit(f"failover {i}: challenger got token {new_token}, expected {token + 1}")
            results.append({"failover": acquired - killed, "into_cycle": killed - renewed, "token": new_token})
            print(
                f"  failover {i}: {acquired - killed:.2f}s (killed {killed - renewed:.2f}s after a renew returned)",
                flush=True,
            )
        finally:
            for proc in (holder, challenger):
                if proc.is_alive():
                    proc.kill()
                proc.join(10)
    return results


def bench_raw(service_url: str, mode: str, poll: float, bound: float, rounds: int) -> list[dict[str, float]]:
    results = []
    for i in range(rounds):
        topic = f"persistent://public/default/bench-raw-{uuid.uuid4().hex[:10]}"
        hq, cq = CTX.Queue(), CTX.Queue()
        holder = CTX.Process(target=_raw_holder, args=(service_url, topic, hq))
        challenger = CTX.Process(target=_raw_challenger, args=(service_url, topic, mode, poll, bound, cq))
        holder.start()
        try:
            _get(hq, "raw holder", 120)
            challenger.start()
            _get(cq, "raw challenger", 120)
            time.sleep(1.0 + random.uniform(0, poll))  # the challenger is polling (or queued as a waiter)
            killed = _kill(holder)
            event, got, attempts = _get(cq, "raw challenger", bound + 60)
            results.append(
                {
                    "handover": got - killed if event == "acquired" else float("nan"),
                    "attempts": attempts,
                    "timed_out": event != "acquired",
                }
            )
        finally:
            for proc in (holder, challenger):
                if proc.is_alive():
                    proc.kill()
                proc.join(10)
    return results


def _spread(values: list[float], unit: str = "s") -> str:
    return f"min {min(values):.2f} / median {statistics.median(values):.2f} / max {max(values):.2f} {unit}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--backend", choices=["pulsar", "embedded"], default="pulsar")
    p.add_argument("--ops", type=int, default=200, help="acquire+release cycles, and renews, timed")
    p.add_argument("--fresh", type=int, default=5, help="fresh processes timing their first acquire")
    p.add_argument(
        "--failovers", type=int, default=5, help="SIGKILL failover rounds (lease, and raw handover per mode)"
    )
    p.add_argument("--ttl", type=float, default=5.0)
    p.add_argument(
        "--poll-interval",
        type=float,
        default=0.25,
        help="lease challenger's poll_interval; also the raw Exclusive poll interval",
    )
    p.add_argument("--wait-bound", type=float, default=30.0, help="seconds a WaitForExclusive challenger waits at most")
    p.add_argument("--service-url")
    p.add_argument("--admin-url")
    p.add_argument("--json", type=Path, help="also write the results here")
    args = p.parse_args(argv)

    print_run_header()
    home = tempfile.mkdtemp(prefix="bench-leases-")
    topic = f"persistent://public/default/bench-leases-{uuid.uuid4().hex[:10]}"
    rows: list[tuple[str, str, str, str, str, str]] = []
    result: dict[str, Any] = {"backend": args.backend, "ttl": args.ttl}
    with contextlib.ExitStack() as stack:
        if args.backend == "pulsar":
            service_url, admin_url = stack.enter_context(broker_urls(args.service_url, args.admin_url))
            conn = {"url": service_url, "admin_url": admin_url, "operation_timeout": 30.0}
        else:
            service_url = ""
            conn = {"url": str(Path(home) / "state.db"), "operation_timeout": 30.0}

        t0 = time.monotonic()
        lat = bench_latency(conn, topic, args.ops)
        print(f"latency: {args.ops} cycles and renews in {time.monotonic() - t0:.1f}s", flush=True)
        result["latency"] = {k: v for k, v in lat.items()}
        rows.append(
            (
                f"acquire (acquire+release cycles on one name, one process, n={args.ops})",
                _ms(lat["acquire"]),
                "-",
                "-",
                "(info)",
                "-",
            )
        )
        rows.append(("release (same cycles)", _ms(lat["release"]), "-", "-", "(info)", "-"))
        rows.append((f"renew of a held lease (n={args.ops})", _ms(lat["renew"]), "-", "-", "(info)", "-"))

        fresh = bench_fresh(conn, topic, args.fresh)
        result["fresh"] = fresh
        firsts, seconds = [f for f, _ in fresh], [s for _, s in fresh]
        rows.append(
            (
                f"first acquire of a free lease in a fresh process (connect, replay, writer; n={args.fresh})",
                f"median {1000 * statistics.median(firsts):.0f} ms, max {1000 * max(firsts):.0f} ms",
                f"its second acquire: median {1000 * statistics.median(seconds):.1f} ms",
                "-",
                "(info)",
                "-",
            )
        )

        print(f"failover: {args.failovers} rounds, ttl {args.ttl:g}s", flush=True)
        fo = bench_failover(conn, topic, args.ttl, args.poll_interval, args.failovers)
        result["failover"] = fo
        times = [r["failover"] for r in fo]
        target = args.ttl + 1.0
        verdict = "**PASS**" if max(times) <= target else "**FAIL**"
        silence = [r["failover"] + r["into_cycle"] for r in fo]
        rows.append(
            (
                "same rounds: silence from the holder's last renew returning to the challenger's acquire returning",
                _spread(silence),
                f"ttl {args.ttl:g} s",
                "-",
                "(info: >= ttl, never less)",
                "-",
            )
        )
        raw_median: dict[str, float] = {}
        if args.backend == "pulsar":
            for mode in ("poll", "wait"):
                raw = bench_raw(service_url, mode, args.poll_interval, args.wait_bound, args.failovers)
                result[f"raw_{mode}"] = raw
                got = [r["handover"] for r in raw if not r["timed_out"]]
                label = (
                    f"raw handover: poll create_producer(Exclusive) every {args.poll_interval:g}s"
                    if mode == "poll"
                    else f"raw handover: one WaitForExclusive creation (bounded {args.wait_bound:g}s)"
                )
                timed_out = sum(r["timed_out"] for r in raw)
                ours = (_spread([1000 * g for g in got], "ms") if got else "no handover") + (
                    f", {timed_out} of {len(raw)} timed out" if timed_out else ""
                )
                rows.append((f"{label} (SIGKILL, n={len(raw)})", ours, "-", "-", "(info)", "-"))
                if got:
                    raw_median[mode] = statistics.median(got)
                print(f"raw {mode}: {ours}", flush=True)
        ratio = " / ".join(f"{statistics.median(times) / m:.0f}x" for m in raw_median.values()) or "-"
        baseline = (
            " / ".join({"poll": "raw Exclusive poll", "wait": "raw WaitForExclusive"}[k] for k in raw_median) or "-"
        )
        rows.insert(
            len(rows) - (2 if args.backend == "pulsar" else 0) - 1,
            (
                f"failover after SIGKILL of the holder, ttl {args.ttl:g}s, renew every ttl/3 (n={len(times)})",
                _spread(times),
                f"{baseline} (medians)" if raw_median else "-",
                ratio,
                f"<= ttl + 1 s = {target:g} s",
                verdict,
            ),
        )
    result["loadavg_at_end"] = os.getloadavg()
    print(f"loadavg at end: {result['loadavg_at_end']}")
    print()
    print(f"backend: {args.backend}")
    print("| phase | ours | baseline | ratio | target | pass/fail |")
    print("|---|---|---|---|---|---|")
    for row in rows:
        print("| " + " | ".join(row) + " |")
    if args.json:
        args.json.write_text(json.dumps({"machine": machine_info(), "result": result}, indent=2))
    return 0 if verdict == "**PASS**" else 1


if __name__ == "__main__":
    raise SystemExit(main())
