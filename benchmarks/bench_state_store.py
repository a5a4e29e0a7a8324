#!/usr/bin/env python
"""State-store backend: get/set latency of PulsarStateStoreBackend beside Airflow's default.

Usage (from the repository root)::

    .venv/bin/python benchmarks/bench_state_store.py                    # own broker, 500 ops each: ~1.5 min
    .venv/bin/python benchmarks/bench_state_store.py --ops 2000
    .venv/bin/python benchmarks/bench_state_store.py --backend embedded # no broker
    .venv/bin/python benchmarks/bench_state_store.py --service-url pulsar://127.0.0.1:6650 \\
        --admin-url http://127.0.0.1:8080                               # use a running broker

What it measures, in one process and one run: the backend objects themselves, as the execution
API calls them (``BaseStoreBackend.set(scope, key, json_text)`` then ``.get(scope, key)``), on a
``TaskScope``, ``--ops`` times each with a fresh key per set (a small JSON value, ~40 bytes),
after ``--warmup`` untimed calls:

1. Airflow's default ``MetastoreBackend`` on a SQLite metadata DB made by ``airflow db migrate``
   in a throw-away AIRFLOW_HOME (one DagRun row inserted: task state needs one); each call opens
   and commits its own session, as ``@provide_session`` does;
2. ``PulsarStateStoreBackend`` on the embedded log (a SQLite file);
3. ``PulsarStateStoreBackend`` on a real Pulsar broker (the bundled 4.2.4 standalone, started by
   the script unless ``--service-url`` is given).

Ours: set = one durable append through the map's writer (held between calls: the writer idle
timeout, ``[pulsarstate] state_store_writer_idle_timeout``, is raised to 10 s here so the numbers
show the steady state of a busy server; with the default 0.2 s, a set after a pause also pays
the writer's acquisition); get = a read at the tail (``latest=True``: sees every other
process's writes). Not measured: the execution API's HTTP hop, identical for both backends.
Prints machine, date and load average; run it on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import datetime
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from machine import machine_info, percentile  # noqa: E402  (benchmarks/machine.py, beside this script)

BACKEND = "airflow_provider_pulsarstate.state_store.backend.PulsarStateStoreBackend"


def _summary(values: list[float]) -> dict[str, float]:
    return {"median_ms": 1000 * statistics.median(values), "p99_ms": 1000 * percentile(values, 99), "n": len(values)}


def _time(fn: Callable[[int], Any], ops: int, warmup: int) -> list[float]:
    for i in range(warmup):
        fn(-1 - i)
    out = []
    for i in range(ops):
        start = time.perf_counter()
        fn(i)
        out.append(time.perf_counter() - start)
    return out


def _measure(backend: Any, scope: Any, ops: int, warmup: int) -> dict[str, dict[str, float]]:
    value = json.dumps({"offset": 123456, "job": "spark-42", "ok": True})
    sets = _time(lambda i: backend.set(scope, f"k{i}", value), ops, warmup)
    gets = _time(lambda i: backend.get(scope, f"k{i}"), ops, warmup)
    assert backend.get(scope, "k0") == value, "the value did not round-trip"
    return {"set": _summary(sets), "get": _summary(gets)}


def _prepare_airflow(home: Path) -> None:
    os.environ.update(
        {
            "AIRFLOW_HOME": str(home),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home / 'airflow.db'}",
            "AIRFLOW__PULSARSTATE__STATE_STORE_WRITER_IDLE_TIMEOUT": "10",
        }
    )
    airflow = str(Path(sys.executable).with_name("airflow"))
    done = subprocess.run(
        [airflow, "db", "migrate"], env=os.environ.copy(), capture_output=True, text=True, timeout=600
    )
    if done.returncode != 0:
        raise SystemExit(f"airflow db migrate failed:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")


def _dag_run(dag_id: str, run_id: str) -> None:
    from airflow.models.dagrun import DagRun
    from airflow.utils.session import create_session
    from airflow.utils.state import DagRunState
    from airflow.utils.types import DagRunType

    with create_session() as session:
        session.add(DagRun(dag_id=dag_id, run_id=run_id, run_type=DagRunType.MANUAL, state=DagRunState.RUNNING))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ops", type=int, default=500, help="timed sets and gets per backend")
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument(
        "--backend", choices=("both", "embedded", "pulsar"), default="both", help="our back ends to run"
    )
    parser.add_argument("--service-url", help="a running broker (default: start the bundled standalone)")
    parser.add_argument("--admin-url")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()

    load = os.getloadavg()
    print(f"machine: {machine_info()}")
    print(f"date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, load average {load[0]:.2f}")
    if load[0] > 0.5:
        print(f"warning: load average {load[0]:.2f}: other work on this machine skews the numbers", file=sys.stderr)

    home = Path(tempfile.mkdtemp(prefix="bench-state-store-"))
    _prepare_airflow(home)
    logging.getLogger("airflow_provider_pulsarstate").setLevel(logging.WARNING)
    from airflow.sdk.state import TaskScope
    from airflow.state.metastore import MetastoreBackend

    from airflow_provider_pulsarstate.state_store.backend import PulsarStateStoreBackend

    dag_id, run_id = "bench_state_store", f"bench__{uuid.uuid4().hex[:8]}"
    _dag_run(dag_id, run_id)
    from airflow._shared.state import TaskScope as CoreTaskScope  # the metastore matches on the core class

    results: dict[str, Any] = {}
    results["metastore (SQLite)"] = _measure(
        MetastoreBackend(), CoreTaskScope(dag_id, run_id, "t", -1), args.ops, args.warmup
    )
    print("measured metastore", file=sys.stderr)

    broker = None
    try:
        targets: list[tuple[str, dict[str, Any]]] = []
        if args.backend in ("both", "embedded"):
            targets.append(("embedded", {"service_url": str(home / "state.db")}))
        if args.backend in ("both", "pulsar"):
            if args.service_url:
                service_url, admin_url = args.service_url, args.admin_url
            else:
                from airflow_provider_pulsarstate.testing.broker import PulsarStandalone

                broker = PulsarStandalone(heap="1g").start()
                service_url, admin_url = broker.service_url, broker.admin_url
            targets.append(("pulsar", {"service_url": service_url, "admin_url": admin_url, "operation_timeout": 30}))
        for name, extra in targets:
            os.environ["AIRFLOW_CONN_PULSARSTATE_DEFAULT"] = json.dumps({"conn_type": "pulsarstate", "extra": extra})
            scope = TaskScope(dag_id=dag_id, run_id=f"{run_id}-{name}", task_id="t", map_index=-1)
            results[f"PulsarStateStoreBackend ({name})"] = _measure(
                PulsarStateStoreBackend(), scope, args.ops, args.warmup
            )
            print(f"measured {name}", file=sys.stderr)
    finally:
        from airflow_provider_pulsarstate.hooks.pulsarstate import close_shared_state_maps

        close_shared_state_maps()
        if broker is not None:
            broker.stop()

    base = results["metastore (SQLite)"]
    print(f"\nstate-store backend latency, {args.ops} ops each (TaskScope, ~40-byte JSON value)\n")
    print("| backend | set median / p99 | get median / p99 | set ratio | get ratio |")
    print("|---|---|---|---|---|")
    for name, r in results.items():
        print(
            f"| {name} | {r['set']['median_ms']:.2f} / {r['set']['p99_ms']:.2f} ms | {r['get']['median_ms']:.2f} / "
            f"{r['get']['p99_ms']:.2f} ms | {r['set']['median_ms'] / base['set']['median_ms']:.2f}x | "
            f"{r['get']['median_ms'] / base['get']['median_ms']:.2f}x |"
        )
    print("\nratio: median of the row / median of Airflow's MetastoreBackend in this run")
    if args.json:
        args.json.write_text(json.dumps({"machine": machine_info(), "load": load, "results": results}, indent=2))


if __name__ == "__main__":
    main()
