#!/usr/bin/env python
"""Throughput benchmark of PulsarMap against raw pulsar-client baselines, on one real broker.

Usage (from the repository root)::

    .venv/bin/python benchmarks/bench_state.py                 # full run (~2-3 min on 2 cores)
    .venv/bin/python benchmarks/bench_state.py --quick         # smoke run, under a minute
    .venv/bin/python benchmarks/bench_state.py --json out.json # also write the results as JSON
    .venv/bin/python benchmarks/bench_state.py --service-url pulsar://127.0.0.1:6650 \\
        --admin-url http://127.0.0.1:8080                      # use a running broker

Without ``--service-url`` the script starts its own Pulsar standalone broker
(:class:`~airflow_provider_pulsarstate.testing.broker.PulsarStandalone`) on loopback and stops it
at the end. Every phase runs on that one broker, each on fresh topics, after an untimed warm-up
(the first topic of each namespace bundle costs the broker a bundle load), and prints one table
row per comparison: ``phase | ours | baseline | ratio | target | pass/fail``. Run it on an
otherwise idle machine: the load average at start is recorded and warned about.

Phases
------
(a) sequential put: ``PulsarMap.put`` one at a time, blocking, on a fresh topic, against
    (1) a raw Exclusive producer doing blocking ``send`` of payloads of the same size as the
    frame one put appends, batching off (as the engine's producer), and (2) the PIP-137 sample's
    write path (eolivelli/pulsar-shared-state-manager): a NEW exclusive producer per write,
    send, close. The sample also reads to the tail under each new producer; that is left out
    here, so baseline (2) is an upper bound for it. Ours and (1) run interleaved in 4 blocks
    (ours, raw, raw, ours, ...) and include their set-up (map start and writer acquisition;
    producer creation).
(b) concurrent put with group commit: ``PulsarMap.put_async`` N times, then wait for all,
    against (1) a raw Exclusive producer ``send_async`` of N same-size payloads, batching at
    client defaults (``block_if_queue_full`` on so the client does not reject sends), flush,
    wait for every callback, and (2) the per-write-producer design on fewer ops (rates compared).
    Ours and (1) run ``--conc-rounds`` times each in alternating order; the fastest counts.
    The per-write-producer design cannot overlap writes: each one holds the topic's only
    exclusive producer, so it runs sequentially.
(c) bootstrap: build a log of M map put ops (``SharedStateManager.write`` of batches of ops, one
    record per batch) cycling through K keys (default 1M ops on 100k keys: a table under churn,
    each key written 10 times) with PulsarMap's default checkpoint policy (the writer
    stores images as the log grows, on a background thread), then time a fresh
    ``PulsarMap(...).size(latest=True)`` in a fresh interpreter: it loads the newest image and
    replays the records after it. Baseline: a raw pulsar-client Reader reading the same log
    topic from earliest to the end (``has_message_available()`` / ``read_next()``, touching
    ``data()``), also in a fresh interpreter. A second row times the full replay of the same log
    (``use_checkpoints=False``), no target. The runs alternate ``--replay-runs`` times; the
    fastest of each counts. Peak RSS of each (VmHWM of the worker process) is reported.
(c-distinct) supplementary, no target: the same with every op on a distinct key, so the state is
    as large as the log (the worst case for checkpoints).
(c') supplementary, no target: the same on a smaller log of small records (10 ops per record),
    where per-record costs weigh more than per-op costs (too short a log for a checkpoint).

``--profile-replay out.prof`` additionally replays the (c) log once more under cProfile (not
timed) and prints the top functions.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import gc
import json
import logging
import os
import resource
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import wait as wait_futures
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import pulsar  # noqa: E402
from machine import machine_info  # noqa: E402  (benchmarks/machine.py, beside this script)

from airflow_provider_pulsarstate import ConnectionConfig, PulsarMap, open_backend  # noqa: E402
from airflow_provider_pulsarstate.engine.envelope import HEADER, RecordKind, encode_frames, encode_writes  # noqa: E402
from airflow_provider_pulsarstate.engine.recipes.map import _PUT  # noqa: E402

log = logging.getLogger("bench")

PROGRESS_EVERY = 3.0  # seconds between progress lines
NAMESPACE = "persistent://public/default"

FULL = dict(
    seq_ops=2000,
    conc_ops=50_000,
    conc_rounds=2,
    perwrite_seq_ops=300,
    perwrite_conc_ops=300,
    bootstrap_ops=1_000_000,
    ops_per_record=1000,
    bootstrap_keys=100_000,
    worst_case=1,
    replay_runs=3,
    small_records_ops=100_000,
    small_records_per_record=10,
)
QUICK = dict(
    seq_ops=100,
    conc_ops=3000,
    conc_rounds=2,
    perwrite_seq_ops=30,
    perwrite_conc_ops=30,
    bootstrap_ops=20_000,
    ops_per_record=1000,
    bootstrap_keys=2_000,
    worst_case=1,
    replay_runs=1,
    small_records_ops=2_000,
    small_records_per_record=10,
)


# ---------------------------------------------------------------------------------------- data
def key_of(i: int) -> str:
    return f"key-{i:09d}"


def value_of(i: int) -> dict[str, Any]:
    return {"n": i, "owner": "worker-07", "state": "running", "pad": "x" * 24}


def put_frame_size() -> int:
    """Bytes of the single frame one ``PulsarMap.put`` appends (what the raw baselines send)."""
    codec = PulsarMap(None, "t")  # type: ignore[arg-type]  # construction does no I/O; only its op codec is used
    body = encode_writes([(1, [codec._serialize_op((_PUT, key_of(0), codec._encode(key_of(0), value_of(0))))])])
    frames = encode_frames(
        kind=RecordKind.DATA, epoch=1, offset=0, writer_id=b"\0" * 16, body=body, max_frame_bytes=1 << 20
    )
    assert len(frames) == 1
    return len(frames[0])


def payload_of(size: int, i: int) -> bytes:
    head = f"{i:012d}".encode()
    return head + b"p" * (size - len(head))


# ------------------------------------------------------------------------------------- helpers
def fresh_topic(tag: str) -> str:
    return f"{NAMESPACE}/bench-{tag}-{uuid.uuid4().hex[:10]}"


def quiet_client_logger() -> logging.Logger:
    lg = logging.getLogger("bench.pulsar_client")
    lg.setLevel(logging.WARNING)
    return lg


class Ticker:
    """Logs ``what: n/total (rate/s)`` at most every PROGRESS_EVERY seconds."""

    def __init__(self, what: str, total: int | None = None, unit: str = "ops") -> None:
        self.what, self.total, self.unit = what, total, unit
        self.start = self.last = time.monotonic()

    def __call__(self, n: int, force: bool = False) -> None:
        now = time.monotonic()
        if force or now - self.last >= PROGRESS_EVERY:
            self.last = now
            el = max(now - self.start, 1e-9)
            tot = f"/{self.total:,}" if self.total else ""
            log.info(
                "  %s: %s%s %s in %.1fs (%s %s/s)", self.what, f"{n:,}", tot, self.unit, el, f"{n / el:,.0f}", self.unit
            )


def maxrss_mb() -> float:
    """Peak RSS of this process in MB.

    VmHWM (Linux) rather than ``getrusage().ru_maxrss``: the latter survives fork+exec, so a
    worker started by a big parent would report the parent's peak.
    """
    with contextlib.suppress(OSError, ValueError, IndexError):
        for ln in Path("/proc/self/status").read_text().splitlines():
            if ln.startswith("VmHWM:"):
                return int(ln.split()[1]) / 1024.0
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # KiB on Linux


@dataclass
class Row:
    phase: str
    ours: str
    baseline: str
    ratio: float
    ratio_text: str
    target: str
    passed: bool | None  # None: no target

    @property
    def verdict(self) -> str:
        return "-" if self.passed is None else ("PASS" if self.passed else "FAIL")


@dataclass
class Results:
    meta: dict[str, Any] = field(default_factory=dict)
    measurements: dict[str, Any] = field(default_factory=dict)
    rows: list[Row] = field(default_factory=list)


# ------------------------------------------------------------------------------------ baselines
def sequential_interleaved(
    config: ConnectionConfig, client: pulsar.Client, n: int, size: int, blocks: int
) -> tuple[float, float, dict]:
    """(a): ``PulsarMap.put`` one at a time vs a raw Exclusive producer's blocking ``send``.

    The n ops of each side run in ``blocks`` interleaved blocks (ours, raw, raw, ours, ...) so that
    drift on the shared 2-core machine (broker JIT, GC, page cache) hits both sides alike. Each
    side's set-up is counted once: map start (replay of the empty topic) plus, inside the first
    put, taking the writer; producer creation for the raw side.
    """
    backend = open_backend(config)
    try:
        t0 = time.perf_counter()
        table = PulsarMap(backend, fresh_topic("a-ours")).start()
        ours_t = time.perf_counter() - t0
        t0 = time.perf_counter()
        producer = client.create_producer(
            fresh_topic("a-raw"), access_mode=pulsar.ProducerAccessMode.Exclusive, batching_enabled=False
        )
        raw_t = time.perf_counter() - t0
        tick_o, tick_r = Ticker("PulsarMap.put", n), Ticker("raw blocking send", n, "msgs")
        edges = [n * b // blocks for b in range(blocks + 1)]
        for b in range(blocks):
            lo, hi = edges[b], edges[b + 1]
            for side in ("ours", "raw") if b % 2 == 0 else ("raw", "ours"):
                t0 = time.perf_counter()
                if side == "ours":
                    for i in range(lo, hi):
                        table.put(key_of(i), value_of(i))
                        tick_o(i + 1)
                    ours_t += time.perf_counter() - t0
                else:
                    for i in range(lo, hi):
                        producer.send(payload_of(size, i))
                        tick_r(i + 1)
                    raw_t += time.perf_counter() - t0
        stats = dict(table.manager.stats)
        assert table.size() == n
        table.close()
        producer.close()
        return ours_t, raw_t, stats
    finally:
        backend.close()


def per_write_producer(client: pulsar.Client, topic: str, n: int, size: int) -> float:
    """The PIP-137 sample's write path: for every write a NEW exclusive producer, send, close."""
    tick = Ticker("per-write producer", n, "writes")
    t0 = time.perf_counter()
    for i in range(n):
        producer = client.create_producer(
            topic, access_mode=pulsar.ProducerAccessMode.Exclusive, batching_enabled=False, block_if_queue_full=True
        )
        producer.send(payload_of(size, i))
        producer.close()
        tick(i + 1)
    return time.perf_counter() - t0


def raw_async_send(client: pulsar.Client, topic: str, n: int, size: int, quiet: bool = False) -> float:
    """send_async of n payloads on an Exclusive producer, batching at client defaults, then flush
    and wait for every callback."""
    producer = client.create_producer(
        topic,
        access_mode=pulsar.ProducerAccessMode.Exclusive,
        batching_enabled=True,  # client defaults otherwise: 1000 msgs / 128 KiB / 10 ms per batch
        block_if_queue_full=True,
    )
    payloads = [payload_of(size, i) for i in range(n)]
    done = threading.Event()
    lock = threading.Lock()
    state = {"left": n, "failed": 0}

    def callback(res: pulsar.Result, _msg_id: Any) -> None:
        with lock:
            if res != pulsar.Result.Ok:
                state["failed"] += 1
            state["left"] -= 1
            if state["left"] == 0:
                done.set()

    tick = Ticker("raw send_async", n, "msgs")
    t0 = time.perf_counter()
    for i, p in enumerate(payloads):
        producer.send_async(p, callback)
        if (i & 1023) == 0 and not quiet:
            tick(i + 1)
    producer.flush()
    if not done.wait(300):
        raise RuntimeError(f"raw send_async: {state['left']} callbacks missing after 300 s")
    elapsed = time.perf_counter() - t0
    if not quiet:
        tick(n, force=True)
    producer.close()
    if state["failed"]:
        raise RuntimeError(f"raw send_async: {state['failed']} sends failed")
    return elapsed


def warm_up(config: ConnectionConfig, client: pulsar.Client, size: int, warm_ops: int) -> float:
    """Untimed: make the broker own every namespace bundle and warm the code paths of both sides.

    The first topic in each bundle of ``public/default`` makes the broker load the bundle (seconds
    on a fresh standalone), which would otherwise be charged to whichever phase comes first.
    """
    t0 = time.perf_counter()
    for i in range(24):
        producer = client.create_producer(fresh_topic(f"warm{i}"), access_mode=pulsar.ProducerAccessMode.Exclusive)
        producer.send(payload_of(size, i))
        producer.close()
    # Then some traffic on both sides, so the broker's JIT is warm before anything is timed.
    producer = client.create_producer(fresh_topic("warm-raw"), access_mode=pulsar.ProducerAccessMode.Exclusive)
    for i in range(warm_ops):
        producer.send(payload_of(size, i))
    producer.close()
    raw_async_send(client, fresh_topic("warm-raw-async"), 10 * warm_ops, size, quiet=True)
    backend = open_backend(config)
    try:
        with PulsarMap(backend, fresh_topic("warm-map")) as table:
            for i in range(warm_ops):
                table.put(key_of(i), value_of(i))
            for f in [table.put_async(key_of(i), value_of(i)) for i in range(10 * warm_ops)]:
                f.result()
    finally:
        backend.close()
    return time.perf_counter() - t0


# ---------------------------------------------------------------------------------------- ours
def ours_concurrent_put(config: ConnectionConfig, topic: str, n: int) -> tuple[float, float, dict]:
    backend = open_backend(config)
    try:
        with PulsarMap(backend, topic) as table:  # start(): replays the (empty) topic first
            tick = Ticker("PulsarMap.put_async", n)
            t0 = time.perf_counter()
            futures = []
            for i in range(n):
                futures.append(table.put_async(key_of(i), value_of(i)))
                if (i & 1023) == 0:
                    tick(i + 1)
            submitted = time.perf_counter() - t0
            done, not_done = wait_futures(futures, timeout=600)
            elapsed = time.perf_counter() - t0
            tick(n, force=True)
            if not_done:
                raise RuntimeError(f"{len(not_done)} put_async futures still pending")
            errors = [f.exception() for f in futures if f.exception() is not None]
            if errors:
                raise RuntimeError(f"{len(errors)} put_async failed, first: {errors[0]!r}")
            stats = dict(table.manager.stats)
            assert table.size() == n
        return elapsed, submitted, stats
    finally:
        backend.close()


def build_log(config: ConnectionConfig, topic: str, n_ops: int, ops_per_record: int, keys: int) -> tuple[float, dict]:
    """Append n_ops map put ops on ``keys`` keys (round robin), ops_per_record per write (one DATA
    record each), with the default checkpoint policy."""
    backend = open_backend(config)
    try:
        t0 = time.perf_counter()
        with PulsarMap(backend, topic, writer_idle_timeout=None) as table:
            mgr = table.manager
            tick = Ticker("building the log", n_ops)
            i = 0
            while i < n_ops:
                lo, hi = i, min(i + ops_per_record, n_ops)
                mgr.write(
                    lambda _s, lo=lo, hi=hi: [
                        (_PUT, key_of(k % keys), table._encode(key_of(k % keys), value_of(k))) for k in range(lo, hi)
                    ]
                )
                i = hi
                tick(i)
            if mgr._checkpointer is not None:
                mgr._checkpointer.join()  # the last automatic checkpoint, if one is being stored
            elapsed = time.perf_counter() - t0
            tick(n_ops, force=True)
            stats = dict(mgr.stats)
            newest = mgr.checkpoints.latest()
            stats["newest_checkpoint_offset"] = newest.offset if newest else -1
            stats["newest_checkpoint_bytes"] = newest.size if newest else 0
            stats["data_records"] = mgr.applied_offset + 1
        return elapsed, stats
    finally:
        backend.close()
        gc.collect()


# -------------------------------------------------------------------- replay workers (subprocess)
def worker_replay_ours(service_url: str, admin_url: str, topic: str, profile: str | None, mode: str) -> dict:
    config = ConnectionConfig(url=service_url, admin_url=admin_url, operation_timeout=60.0)
    backend = open_backend(config)
    profiler = None
    if profile:
        import cProfile

        profiler = cProfile.Profile()
        profiler.enable()
    t0 = time.perf_counter()
    table = PulsarMap(backend, topic, progress_interval=PROGRESS_EVERY, use_checkpoints=mode != "full")
    size = table.size(latest=True)
    elapsed = time.perf_counter() - t0
    if profiler is not None:
        profiler.disable()
        profiler.dump_stats(profile)
    data_records = table.manager.applied_offset + 1
    stats = table.manager.stats
    table.close()
    backend.close()
    return {
        "seconds": elapsed,
        "size": size,
        "data_records": data_records,
        "maxrss_mb": maxrss_mb(),
        "checkpoint_offset": stats["checkpoint_loaded_offset"],
        "records_replayed": stats["records_replayed"],
    }


def worker_replay_raw(service_url: str, topic: str) -> dict:
    client = pulsar.Client(service_url, logger=quiet_client_logger(), operation_timeout_seconds=60)
    tick = Ticker("raw Reader", None, "msgs")
    t0 = time.perf_counter()
    reader = client.create_reader(topic, pulsar.MessageId.earliest)
    n = nbytes = 0
    while reader.has_message_available():
        msg = reader.read_next(60_000)
        nbytes += len(msg.data())
        n += 1
        if (n & 255) == 0:
            tick(n)
    elapsed = time.perf_counter() - t0
    tick(n, force=True)
    reader.close()
    client.close()
    return {"seconds": elapsed, "messages": n, "bytes": nbytes, "maxrss_mb": maxrss_mb()}


def run_worker(kind: str, args: argparse.Namespace, topic: str, profile: str | None = None, mode: str = "") -> dict:
    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--_worker",
        kind,
        "--_topic",
        topic,
        "--service-url",
        args.service_url,
        "--admin-url",
        args.admin_url,
        "--_mode",
        mode,
    ]
    if profile:
        cmd += ["--_profile", profile]
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"worker {kind} failed with code {proc.returncode}: {proc.stdout[-2000:]}")
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")][-1]
    return json.loads(line[len("RESULT ") :])


# ---------------------------------------------------------------------------------------- phases
def fmt_rate(x: float, unit: str = "ops/s") -> str:
    return f"{x:,.0f} {unit}"


def phase_a(args: argparse.Namespace, config: ConnectionConfig, client: pulsar.Client, res: Results, size: int) -> None:
    n, npw = args.seq_ops, args.perwrite_seq_ops
    log.info("(a) sequential put: %s ops each; per-write producer: %s writes", f"{n:,}", f"{npw:,}")
    ours_s, raw_s, stats = sequential_interleaved(config, client, n, size, blocks=4)
    pw_s = per_write_producer(client, fresh_topic("a-pwp"), npw, size)
    ours, raw, pw = n / ours_s, n / raw_s, npw / pw_s
    log.info("(a) ours %.0f ops/s (%s), raw send %.0f msg/s, per-write producer %.1f writes/s", ours, stats, raw, pw)
    res.measurements["a"] = dict(
        ops=n,
        ours_seconds=ours_s,
        ours_ops_per_s=ours,
        ours_stats=stats,
        raw_seconds=raw_s,
        raw_msgs_per_s=raw,
        per_write_ops=npw,
        per_write_seconds=pw_s,
        per_write_ops_per_s=pw,
        ours_latency_ms=1000 * ours_s / n,
        raw_latency_ms=1000 * raw_s / n,
        per_write_latency_ms=1000 * pw_s / npw,
    )
    res.rows.append(
        Row(
            "(a) seq put vs raw blocking send",
            fmt_rate(ours),
            fmt_rate(raw, "msg/s"),
            ours / raw,
            f"{ours / raw:.2f}",
            "-",
            None,
        )
    )
    res.rows.append(
        Row(
            "(a) seq put vs per-write producer",
            fmt_rate(ours),
            fmt_rate(pw, "writes/s"),
            ours / pw,
            f"{ours / pw:.1f}x",
            "-",
            None,
        )
    )


def phase_b(args: argparse.Namespace, config: ConnectionConfig, client: pulsar.Client, res: Results, size: int) -> None:
    n, npw = args.conc_ops, args.perwrite_conc_ops
    log.info("(b) concurrent put: %s ops each; per-write producer: %s writes", f"{n:,}", f"{npw:,}")
    raws, ourss = [], []
    for rnd in range(args.conc_rounds):  # alternate the order; the fastest run of each side counts
        for side in ("raw", "ours") if rnd % 2 == 0 else ("ours", "raw"):
            if side == "raw":
                raws.append(raw_async_send(client, fresh_topic("b-raw"), n, size))
            else:
                ourss.append(ours_concurrent_put(config, fresh_topic("b-ours"), n))
    raw_s = min(raws)
    ours_s, submit_s, stats = min(ourss, key=lambda r: r[0])
    pw_s = per_write_producer(client, fresh_topic("b-pwp"), npw, size)
    ours, raw, pw = n / ours_s, n / raw_s, npw / pw_s
    log.info(
        "(b) ours %.0f ops/s (submission took %.2fs; %s), raw send_async %.0f msg/s, per-write %.1f writes/s",
        ours,
        submit_s,
        stats,
        raw,
        pw,
    )
    per_record = stats["writes_committed"] / max(1, stats["records_appended"])
    res.measurements["b"] = dict(
        ops=n,
        ours_seconds=ours_s,
        ours_submit_seconds=submit_s,
        ours_ops_per_s=ours,
        ours_stats=stats,
        ours_writes_per_record=per_record,
        raw_seconds=raw_s,
        raw_msgs_per_s=raw,
        per_write_ops=npw,
        per_write_seconds=pw_s,
        per_write_ops_per_s=pw,
        ours_seconds_all=[o[0] for o in ourss],
        raw_seconds_all=raws,
    )
    r1, r2 = ours / raw, ours / pw
    res.rows.append(
        Row(
            "(b) put_async vs raw send_async",
            fmt_rate(ours),
            fmt_rate(raw, "msg/s"),
            r1,
            f"{r1:.2f}",
            ">= 0.50",
            r1 >= 0.5,
        )
    )
    res.rows.append(
        Row(
            "(b) put_async vs per-write producer",
            fmt_rate(ours),
            fmt_rate(pw, "writes/s"),
            r2,
            f"{r2:.0f}x",
            ">= 20x",
            r2 >= 20,
        )
    )


MODES = {"checkpoint": "checkpoint + tail", "full": "full replay"}


def replay_runs(args: argparse.Namespace, topic: str, label: str, modes: list[str]) -> tuple[dict, list, dict]:
    """Replay ``topic`` args.replay_runs times each way (raw, then each mode), alternating; keep the fastest."""
    raws: list[dict] = []
    ours: dict[str, list[dict]] = {m: [] for m in modes}
    for run in range(1, args.replay_runs + 1):
        log.info(
            "%s run %d/%d: raw pulsar-client Reader, earliest to the end (fresh interpreter)",
            label,
            run,
            args.replay_runs,
        )
        raws.append(run_worker("replay-raw", args, topic))
        log.info(
            "%s   raw Reader: %.2fs, %s messages, %s bytes, peak RSS %.0f MB",
            label,
            raws[-1]["seconds"],
            f"{raws[-1]['messages']:,}",
            f"{raws[-1]['bytes']:,}",
            raws[-1]["maxrss_mb"],
        )
        for mode in modes:
            log.info(
                "%s run %d/%d: fresh PulsarMap(...).size(latest=True), %s (fresh interpreter)",
                label,
                run,
                args.replay_runs,
                MODES[mode],
            )
            r = run_worker("replay-ours", args, topic, mode=mode)
            ours[mode].append(r)
            log.info(
                "%s   ours (%s): %.2fs, %s keys, checkpoint offset %s, %s records replayed, peak RSS %.0f MB",
                label,
                MODES[mode],
                r["seconds"],
                f"{r['size']:,}",
                r["checkpoint_offset"],
                f"{r['records_replayed']:,}",
                r["maxrss_mb"],
            )
    return min(raws, key=lambda r: r["seconds"]), raws, ours


def bootstrap(
    args: argparse.Namespace,
    config: ConnectionConfig,
    res: Results,
    key: str,
    label: str,
    n: int,
    per: int,
    keys: int,
    target: bool,
    modes: list[str],
) -> str:
    topic = fresh_topic(f"{key}-log")
    keys = min(keys, n)
    log.info(
        "%s bootstrap: building a log of %s map put ops on %s keys, %s ops per record",
        label,
        f"{n:,}",
        f"{keys:,}",
        f"{per:,}",
    )
    build_s, stats = build_log(config, topic, n, per, keys)
    log.info("%s log built in %.1fs (%s ops/s): %s", label, build_s, f"{n / build_s:,.0f}", stats)
    raw, raws, ours_by_mode = replay_runs(args, topic, label, modes)
    records = raw["messages"]  # every record of the log topic: DATA records + the writer's EPOCH record
    raw_rec = records / raw["seconds"]
    raw_rss = max(r["maxrss_mb"] for r in raws)
    res.measurements[key] = dict(
        ops=n,
        keys=keys,
        ops_per_record=per,
        records=records,
        log_bytes=raw["bytes"],
        build_seconds=build_s,
        build_ops_per_s=n / build_s,
        build_stats=stats,
        runs=args.replay_runs,
        raw_seconds=raw["seconds"],
        raw_seconds_all=[r["seconds"] for r in raws],
        raw_ops_per_s=n / raw["seconds"],
        raw_records_per_s=raw_rec,
        raw_maxrss_mb=raw_rss,
    )
    for mode, ourss in ours_by_mode.items():
        for o in ourss:
            if o["size"] != keys:
                raise RuntimeError(f"replayed map has {o['size']} keys, expected {keys}")
        ours = min(ourss, key=lambda r: r["seconds"])
        ours_ops, ours_rec = n / ours["seconds"], records / ours["seconds"]
        ratio = raw["seconds"] / ours["seconds"]
        ours_rss = max(o["maxrss_mb"] for o in ourss)
        res.measurements[key][mode] = dict(
            ours_seconds=ours["seconds"],
            ours_seconds_all=[o["seconds"] for o in ourss],
            ours_ops_per_s=ours_ops,
            ours_records_per_s=ours_rec,
            ours_maxrss_mb=ours_rss,
            checkpoint_offset=ours["checkpoint_offset"],
            records_replayed=ours["records_replayed"],
            data_records=ours["data_records"],
            ratio=ratio,
        )
        is_target = target and mode == modes[0]
        res.rows.append(
            Row(
                f"{label} bootstrap {n:,} ops on {keys:,} keys in {records:,} records, {MODES[mode]} "
                f"({ours['records_replayed']:,} replayed) vs raw Reader",
                f"{ours_ops:,.0f} ops/s ({ours['seconds']:.2f}s, RSS {ours_rss:,.0f} MB)",
                f"{raw_rec:,.0f} rec/s ({raw['seconds']:.2f}s, RSS {raw_rss:,.0f} MB)",
                ratio,
                f"{ratio:.2f}",
                ">= 0.70" if is_target else "(info)",
                (ratio >= 0.7) if is_target else None,
            )
        )
    return topic


def phase_c(args: argparse.Namespace, config: ConnectionConfig, res: Results) -> None:
    topic = bootstrap(
        args,
        config,
        res,
        "c",
        "(c)",
        args.bootstrap_ops,
        args.ops_per_record,
        args.bootstrap_keys,
        target=True,
        modes=["checkpoint", "full"],
    )
    if args.worst_case:
        # Supplementary: every op a distinct key, so the state is as large as the log.
        bootstrap(
            args,
            config,
            res,
            "c_distinct",
            "(c-distinct)",
            args.bootstrap_ops,
            args.ops_per_record,
            args.bootstrap_ops,
            target=False,
            modes=["checkpoint", "full"],
        )
    if args.small_records_ops:
        # Supplementary: the same comparison on a log of small records (per-record costs dominate).
        bootstrap(
            args,
            config,
            res,
            "c_small",
            "(c')",
            args.small_records_ops,
            args.small_records_per_record,
            args.small_records_ops,
            target=False,
            modes=["checkpoint"],
        )
    if args.profile_replay:
        log.info(
            "(c) profiling one more full replay of the (c) log under cProfile -> %s (not timed)", args.profile_replay
        )
        prof = run_worker("replay-ours", args, topic, profile=args.profile_replay, mode="full")
        log.info("(c) profiled replay took %.2fs (cProfile overhead included)", prof["seconds"])
        import pstats

        pstats.Stats(args.profile_replay, stream=sys.stderr).sort_stats("tottime").print_stats(15)


# ------------------------------------------------------------------------------------------ main
def print_table(res: Results) -> None:
    head = ("phase", "ours", "baseline", "ratio", "target", "pass/fail")
    rows = [(r.phase, r.ours, r.baseline, r.ratio_text, r.target, r.verdict) for r in res.rows]
    widths = [max(len(str(x[i])) for x in [head, *rows]) for i in range(len(head))]
    line = lambda cells: "| " + " | ".join(str(c).ljust(w) for c, w in zip(cells, widths)) + " |"  # noqa: E731
    print()
    print(line(head))
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for r in rows:
        print(line(r))
    print()


@contextlib.contextmanager
def broker_for(args: argparse.Namespace) -> Iterator[None]:
    if args.service_url:
        if not args.admin_url:
            args.admin_url = ConnectionConfig(url=args.service_url).resolved_admin_url
        yield
        return
    from airflow_provider_pulsarstate.testing.broker import PULSAR_VERSION, PulsarStandalone

    log.info("starting a Pulsar %s standalone broker (set --service-url to use a running one)", PULSAR_VERSION)
    t0 = time.monotonic()
    with PulsarStandalone(heap=args.broker_heap) as broker:
        log.info(
            "broker up in %.1fs at %s (admin %s, pid %s)",
            time.monotonic() - t0,
            broker.service_url,
            broker.admin_url,
            broker.pid,
        )
        args.service_url, args.admin_url = broker.service_url, broker.admin_url
        try:
            yield
        finally:
            log.info("stopping the broker")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--quick", action="store_true", help="tiny sizes: a smoke run under a minute")
    p.add_argument("--json", metavar="OUT", help="write the results to this JSON file")
    p.add_argument("--service-url", default="", help="use this broker instead of starting one")
    p.add_argument("--admin-url", default="", help="its admin URL (default: derived from --service-url)")
    p.add_argument("--broker-heap", default="2g", help="heap of the broker the script starts (default 2g)")
    p.add_argument("--phases", default="abc", help="which phases to run (default abc)")
    p.add_argument("--seq-ops", type=int, help="(a) ops (default 2000)")
    p.add_argument("--conc-ops", type=int, help="(b) ops (default 50000)")
    p.add_argument("--conc-rounds", type=int, help="(b) runs of each side, alternating; the fastest counts (default 2)")
    p.add_argument("--perwrite-seq-ops", type=int, help="(a) writes of the per-write-producer design (default 300)")
    p.add_argument("--perwrite-conc-ops", type=int, help="(b) writes of the per-write-producer design (default 300)")
    p.add_argument("--bootstrap-ops", type=int, help="(c) ops in the log (default 1000000)")
    p.add_argument("--ops-per-record", type=int, help="(c) ops per record when building the log (default 1000)")
    p.add_argument("--bootstrap-keys", type=int, help="(c) distinct keys the ops cycle through (default 100000)")
    p.add_argument(
        "--worst-case", type=int, help="(c-distinct) also a log of all-distinct keys: 1 yes, 0 no (default 1)"
    )
    p.add_argument("--replay-runs", type=int, help="(c) replays each way, alternating; the fastest counts (default 3)")
    p.add_argument(
        "--small-records-ops",
        type=int,
        help="(c') ops in a supplementary log of small records; 0 skips it (default 100000)",
    )
    p.add_argument("--small-records-per-record", type=int, help="(c') ops per record there (default 10)")
    p.add_argument("--profile-replay", metavar="OUT.prof", help="(c) also replay once under cProfile")
    p.add_argument("--strict", action="store_true", help="exit with code 1 when a target is missed")
    p.add_argument("--_worker", help=argparse.SUPPRESS)
    p.add_argument("--_topic", help=argparse.SUPPRESS)
    p.add_argument("--_profile", help=argparse.SUPPRESS)
    p.add_argument("--_mode", default="", help=argparse.SUPPRESS)
    args = p.parse_args(argv)

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s", stream=sys.stderr)
    logging.getLogger("airflow_provider_pulsarstate.testing.broker").setLevel(logging.WARNING)

    if args._worker:
        if args._worker == "replay-ours":
            out = worker_replay_ours(args.service_url, args.admin_url, args._topic, args._profile, args._mode)
        elif args._worker == "replay-raw":
            out = worker_replay_raw(args.service_url, args._topic)
        else:
            raise SystemExit(f"unknown worker {args._worker}")
        print("RESULT " + json.dumps(out), flush=True)
        hard_exit(0)

    sizes = QUICK if args.quick else FULL
    for k, v in sizes.items():
        if getattr(args, k) is None:
            setattr(args, k, v)

    res = Results()
    res.meta = dict(
        date=datetime.date.today().isoformat(),
        quick=args.quick,
        machine=machine_info(),
        sizes={k: getattr(args, k) for k in sizes},
        own_broker=not args.service_url,
    )
    load = os.getloadavg()
    res.meta["loadavg_at_start"] = load
    if load[0] > 0.5:
        log.warning(
            "load average is %.2f before the run: other processes compete for the CPUs and will skew the numbers",
            load[0],
        )
    size = put_frame_size()
    res.meta["payload_bytes"] = size
    log.info(
        "payload: %d bytes per single-put frame (%d-byte header); machine %s", size, HEADER.size, res.meta["machine"]
    )
    started = time.monotonic()
    with broker_for(args):
        config = ConnectionConfig(url=args.service_url, admin_url=args.admin_url, operation_timeout=60.0)
        client = pulsar.Client(args.service_url, logger=quiet_client_logger(), operation_timeout_seconds=60)
        try:
            log.info("warming up the broker (untimed)")
            log.info("warm-up took %.1fs", warm_up(config, client, size, 30 if args.quick else 300))
            if "a" in args.phases:
                phase_a(args, config, client, res, size)
            if "b" in args.phases:
                phase_b(args, config, client, res, size)
            if "c" in args.phases:
                phase_c(args, config, res)
        finally:
            client.close()
    res.meta["total_seconds"] = time.monotonic() - started
    res.meta["loadavg_at_end"] = os.getloadavg()
    res.meta["main_maxrss_mb"] = maxrss_mb()
    print_table(res)
    log.info("done in %.0fs; main process peak RSS %.0f MB", res.meta["total_seconds"], res.meta["main_maxrss_mb"])
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {
                    "meta": res.meta,
                    "measurements": res.measurements,
                    "rows": [asdict(r) | {"verdict": r.verdict} for r in res.rows],
                },
                indent=2,
            )
            + "\n"
        )
        log.info("wrote %s", args.json)
    missed = [r.phase for r in res.rows if r.passed is False]
    if missed:
        log.info("targets missed: %s", "; ".join(missed))
    return 1 if (missed and args.strict) else 0


def hard_exit(code: int) -> None:
    """Exit without interpreter teardown.

    A pulsar-client Client created with a Python ``logger`` (the engine's back end does that)
    intermittently aborts the process at interpreter exit with "terminate called without an
    active exception" (apache/pulsar-client-python#256), even after ``close()``. Every client
    here is closed and the broker is stopped before this is called.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    hard_exit(main())
