#!/usr/bin/env python
"""Writer handover: N processes each write once to one topic at the same moment, with and without it.

Usage (from the repository root)::

    .venv/bin/python benchmarks/bench_handover.py                          # 50 processes, both back ends, own broker
    .venv/bin/python benchmarks/bench_handover.py --processes 200
    .venv/bin/python benchmarks/bench_handover.py --service-url pulsar://127.0.0.1:6650 \\
        --admin-url http://127.0.0.1:8080 --broker-pid 1234                # a running broker (pid: its CPU too)
    .venv/bin/python benchmarks/bench_handover.py --backend embedded       # the SQLite log only

The workload is Airflow's: many task processes write one value each to the same state topic
(a map, the XCom store), then go on with their work, keeping their manager (and its writer) open.
Each process opens a ``SharedStateManager`` on the topic and replays it, then all are released
together; each times its one ``write`` and reports it, then stays until every process has
reported (or given up).

Two runs per back end, same processes and options (``writer_idle_timeout`` and
``acquire_timeout`` at their defaults, 10 s and 30 s, unless given):

* **handover**: an idle writer is released as soon as another process waits for it
  (``handover_check_interval`` 0.02 s, the default);
* **baseline**: ``handover_check_interval=None``, the former behaviour: the writer is kept until
  ``writer_idle_timeout``, waiters retry until they get it or time out.

Per run: write latency p50 / p99 / max over the writes that succeeded, failures, the makespan
(release to the last report), and the CPU the processes used from the release to the end
(process time summed over all of them, and as average CPUs busy), plus the broker's when its pid is
given. The ratio column is baseline p50 / handover p50. Prints machine, date and load average;
run it on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import multiprocessing
import os
import queue
import statistics
import sys
import tempfile
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from machine import broker_urls, percentile, print_run_header  # noqa: E402  (benchmarks/machine.py, beside this script)

CTX = multiprocessing.get_context("spawn")


def _writer_process(
    conn: dict[str, Any], topic: str, key: str, options: dict[str, Any], go: Any, stop: Any, out: Any
) -> None:
    """One task-like process: replay, wait for the release, write once, stay until told to stop."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    for fd in (1, 2):  # pulsar-client's C++ warnings (one per refused Exclusive attempt) would drown the table
        os.dup2(devnull, fd)
    from airflow_provider_pulsarstate import ConnectionConfig, open_backend
    from airflow_provider_pulsarstate.engine.manager import SharedStateManager

    logging.getLogger("airflow_provider_pulsarstate").setLevel(logging.CRITICAL)
    backend = open_backend(ConnectionConfig(**conn))
    manager = SharedStateManager(backend, topic, initializer=list, applier=lambda state, k: state.append(k), **options)
    manager.start()
    out.put(("ready", key))
    go.wait()
    cpu = time.process_time()
    started = time.monotonic()
    try:
        manager.write(lambda state: [key])
        out.put(("ok", key, time.monotonic() - started))
    except Exception as exc:  # noqa: BLE001 - reported, counted as a failure
        out.put(("failed", key, f"{type(exc).__name__}: {str(exc)[:120]}"))
    stop.wait()
    out.put(("cpu", key, time.process_time() - cpu))
    out.close()
    out.join_thread()
    os._exit(0)  # no orderly client shutdown to wait for


def _get(q: Any, timeout: float) -> Any:
    try:
        return q.get(timeout=timeout)
    except queue.Empty:
        raise SystemExit(f"no answer from the writer processes within {timeout:.0f}s") from None


def _broker_cpu(pid: int | None) -> float | None:
    if pid is None:
        return None
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _cpu_of(pids: list[int]) -> float:
    """Seconds of CPU the processes used so far (user + system)."""
    return sum(_broker_cpu(pid) or 0.0 for pid in pids)


def _held(
    conn: dict[str, Any], topic: str, seconds: float, pids: list[int], held: threading.Event
) -> tuple[float, float]:
    """Hold ``topic``'s writer for ``seconds`` (never handed over) while the processes wait for it
    (``held`` is set once it is taken); returns the CPU they used meanwhile and the time from its
    release to the next holder's epoch."""
    from airflow_provider_pulsarstate import ConnectionConfig, open_backend
    from airflow_provider_pulsarstate.engine.backends.base import AcquireMode

    backend = open_backend(ConnectionConfig(**conn))
    try:
        writer = backend.acquire_writer(topic, mode=AcquireMode.FAIL_FAST, timeout=30)
        held.set()
        time.sleep(min(2.0, seconds / 2))  # every process is in its wait by then
        cpu, started = _cpu_of(pids), time.monotonic()
        time.sleep(seconds)
        cpu, waited = _cpu_of(pids) - cpu, time.monotonic() - started
        epoch = writer.epoch
        writer.close()
        released = time.monotonic()
        while backend.current_epoch(topic) <= epoch:
            time.sleep(0.001)
        return cpu / waited, time.monotonic() - released
    finally:
        backend.close()


def run(
    conn: dict[str, Any], processes: int, options: dict[str, Any], *, broker_pid: int | None, hold: float = 0.0
) -> dict[str, Any]:
    """One run on a fresh topic; returns latencies, failures, makespan and CPU. With ``hold``, the
    topic's writer is first held for that long by this process while all of them wait for it."""
    topic = f"persistent://public/default/bench-handover-{uuid.uuid4().hex[:10]}"
    go, stop, out = CTX.Event(), CTX.Event(), CTX.Queue()
    procs = [
        CTX.Process(target=_writer_process, args=(conn, topic, f"w{i:03d}", options, go, stop, out), daemon=True)
        for i in range(processes)
    ]
    for proc in procs:
        proc.start()
    try:
        for _ in procs:
            _get(out, 300)
        time.sleep(1.0)  # let the start-up CPU settle before the release
        broker0 = _broker_cpu(broker_pid)
        released = time.monotonic()
        waiting_cpu = first_grant = None
        if hold:
            held = threading.Event()
            holding = ThreadPoolExecutor(1)
            pending = holding.submit(_held, conn, topic, hold, [proc.pid for proc in procs], held)
            held.wait(60)  # the writer is held before they start
        go.set()
        if hold:
            waiting_cpu, first_grant = pending.result(hold + 120)
            holding.shutdown()
        latencies: list[float] = []
        failures: list[str] = []
        while len(latencies) + len(failures) < processes:
            event, _key, value = _get(out, options["acquire_timeout"] + 120)
            (latencies if event == "ok" else failures).append(value)
        makespan = time.monotonic() - released
        broker1 = _broker_cpu(broker_pid)
        stop.set()
        cpu = sum(_get(out, 60)[2] for _ in procs)
    finally:
        stop.set()
        for proc in procs:
            proc.join(30)
            if proc.is_alive():
                proc.kill()
    return {
        "latencies": latencies,
        "failures": failures,
        "makespan": makespan,
        "cpu": cpu,
        "broker_cpu": None if broker0 is None or broker1 is None else broker1 - broker0,
        "waiting_cpu": waiting_cpu,
        "first_grant": first_grant,
    }


def _row(backend: str, label: str, r: dict[str, Any], processes: int) -> list[str]:
    lat = [1000 * v for v in r["latencies"]]
    spread = f"{statistics.median(lat):.0f} / {percentile(lat, 99):.0f} / {max(lat):.0f}" if lat else "-"
    busy = r["cpu"] / r["makespan"]
    broker = "-" if r["broker_cpu"] is None else f"{r['broker_cpu']:.1f} s"
    return [
        backend,
        label,
        f"{len(r['failures'])}/{processes}",
        spread,
        f"{r['makespan']:.2f} s",
        f"{r['cpu']:.1f} s ({busy:.2f} CPUs)",
        broker,
    ]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--backend", choices=["both", "pulsar", "embedded"], default="both")
    p.add_argument(
        "--processes", type=int, default=50, help="writer processes (200 for the worst case of BENCHMARKS.md)"
    )
    p.add_argument("--writer-idle-timeout", type=float, default=10.0)
    p.add_argument("--acquire-timeout", type=float, default=30.0)
    p.add_argument("--skip-baseline", action="store_true", help="only the handover run")
    p.add_argument(
        "--hold",
        type=float,
        default=0.0,
        help="instead: hold the writer this long while every process waits (their CPU while waiting, "
        "and how soon after the release one of them has it), then let them write",
    )
    p.add_argument("--service-url")
    p.add_argument("--admin-url")
    p.add_argument(
        "--broker-pid", type=int, help="the broker's pid, to report its CPU (a broker started here: its own)"
    )
    p.add_argument("--json", type=Path, help="also write the results here")
    args = p.parse_args(argv)

    print_run_header()
    base = {"writer_idle_timeout": args.writer_idle_timeout, "acquire_timeout": args.acquire_timeout}
    modes = [("handover", {**base}), ("baseline (no handover)", {**base, "handover_check_interval": None})]
    if args.skip_baseline:
        modes = modes[:1]
    backends = ["embedded", "pulsar"] if args.backend == "both" else [args.backend]
    rows: list[list[str]] = []
    ratios: list[str] = []
    holds: list[str] = []
    result: dict[str, Any] = {"processes": args.processes, **base}
    with contextlib.ExitStack() as stack:
        for backend in backends:
            broker_pid = None
            if backend == "pulsar":
                service_url, admin_url = stack.enter_context(broker_urls(args.service_url, args.admin_url))
                conn = {"url": service_url, "admin_url": admin_url, "operation_timeout": 30.0}
                broker_pid = args.broker_pid
            else:
                conn = {
                    "url": str(Path(tempfile.mkdtemp(prefix="bench-handover-")) / "state.db"),
                    "operation_timeout": 30.0,
                }
            p50: dict[str, float] = {}
            for label, options in modes:
                print(f"{backend}, {label}: {args.processes} processes ...", flush=True)
                r = run(conn, args.processes, options, broker_pid=broker_pid, hold=args.hold)
                result[f"{backend}/{label}"] = r
                rows.append(_row(backend, label, r, args.processes))
                if args.hold:
                    holds.append(
                        f"{backend}, {label}: {args.processes} processes waiting {args.hold:g} s used "
                        f"{r['waiting_cpu']:.3f} CPUs; the first had the writer {1000 * r['first_grant']:.1f} ms "
                        "after its release"
                    )
                if r["latencies"]:
                    p50[label] = statistics.median(r["latencies"])
                for failure in sorted(set(r["failures"]))[:2]:
                    print(f"  e.g. {failure}", flush=True)
            if len(p50) == 2:
                ratios.append(f"{backend}: baseline p50 / handover p50 = {p50[modes[1][0]] / p50[modes[0][0]]:.1f}x")

    header = [
        "back end",
        "run",
        "failed",
        "write p50 / p99 / max (ms)",
        "makespan",
        "CPU of the processes",
        "broker CPU",
    ]
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    print()
    print(
        f"{args.processes} processes, one write each to one topic at once "
        f"(writer_idle_timeout {args.writer_idle_timeout:g} s, acquire_timeout {args.acquire_timeout:g} s)"
    )
    for row in [header, ["-" * w for w in widths], *rows]:
        print("| " + " | ".join(cell.ljust(w) for cell, w in zip(row, widths)) + " |")
    for line in ratios + holds:
        print(line)
    print(
        "(the baseline's latencies are those of the writes that succeeded; failures timed out waiting for the writer)"
    )
    if args.json:
        args.json.write_text(json.dumps(result, indent=2, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
