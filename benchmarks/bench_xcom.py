#!/usr/bin/env python
"""XCom backend: push+pull latency of PulsarXComBackend beside Airflow's default DB backend.

Usage (from the repository root)::

    .venv/bin/python benchmarks/bench_xcom.py                  # own broker, both back ends, n=200: ~3 min
    .venv/bin/python benchmarks/bench_xcom.py --ops 500 --sizes 100 65536
    .venv/bin/python benchmarks/bench_xcom.py --backend embedded
    .venv/bin/python benchmarks/bench_xcom.py --service-url pulsar://127.0.0.1:6650 --admin-url http://127.0.0.1:8080

What it measures: the layer Airflow uses. Inside one real ``dag.test()`` run (SQLite metadata DB
in a throw-away AIRFLOW_HOME, the in-process execution API), one task times ``XCom.set`` (push) and
``XCom.get_one`` (pull, the value read back and compared) for each of ``--ops`` keys, alternating
between Airflow's default ``BaseXCom`` (value in the DB) and ``PulsarXComBackend`` (value in the
PulsarMap, a reference in the DB) so both see the same machine load. A push is serialize_value +
the task SDK's SetXCom through the execution API into the DB; a pull is GetXCom from the DB +
deserialize_value (for ours a ``latest=True`` map read: a round trip to the log's tail). The task
runs once per back end of the map (embedded file, then a Pulsar broker the script starts), each
in its own dag.test() run. The map's first open (connect, replay, writer: what every task process
pays once, as Airflow runs each task in a fresh process) is in a warm-up, reported apart (n=1).

Prints machine, date and load average; run it on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from machine import broker_urls, machine_info, percentile, print_run_header  # noqa: E402  (benchmarks/machine.py, beside this script)

DAG_FILE = """
from __future__ import annotations

import json
import time

import pendulum
from airflow.sdk import DAG, Param, task


with DAG("bench_xcom", schedule=None, start_date=pendulum.datetime(2026, 1, 1, tz="UTC"), catchup=False,
         params={"ops": Param(200, type="integer"), "sizes": Param([100], type="array"), "out": Param("", type="string")}):

    @task
    def measure(**context) -> None:
        from airflow.sdk.bases.xcom import BaseXCom
        from airflow_provider_pulsarstate.xcom.backend import PulsarXComBackend

        ti, params = context["ti"], context["params"]
        where = dict(dag_id=ti.dag_id, task_id=ti.task_id, run_id=ti.run_id, map_index=ti.map_index)
        backends = {"db": BaseXCom, "pulsarstate": PulsarXComBackend}
        results = {"first": {}}
        for size in params["sizes"]:
            value = {"payload": "x" * int(size), "rows": 3, "ok": True}
            for name, cls in backends.items():  # warm-up: the map's replay and writer are not timed
                for i in range(5):
                    t0 = time.perf_counter()
                    cls.set(f"warm-{name}-{size}-{i}", value, **where)
                    cls.get_one(key=f"warm-{name}-{size}-{i}", **where)
                    results["first"].setdefault(name, time.perf_counter() - t0)  # the process's very first pair
            times = {name: {"push": [], "pull": []} for name in backends}
            for i in range(int(params["ops"])):
                for name, cls in backends.items():
                    key = f"{name}-{size}-{i}"
                    t0 = time.perf_counter()
                    cls.set(key, value, **where)
                    t1 = time.perf_counter()
                    got = cls.get_one(key=key, **where)
                    t2 = time.perf_counter()
                    assert got == value, (name, key)
                    times[name]["push"].append(t1 - t0)
                    times[name]["pull"].append(t2 - t1)
            results[str(size)] = times
        with open(params["out"], "w") as out:
            json.dump(results, out)

    measure()
"""


def _ms(values: list[float]) -> str:
    return f"median {1000 * statistics.median(values):.2f} ms, p99 {1000 * percentile(values, 99):.2f} ms"


def _airflow_home(home: Path) -> None:
    """Point Airflow at a fresh home with one DAG bundle (before airflow is imported) and migrate."""
    dags = home / "dags"
    dags.mkdir(parents=True)
    (dags / "bench_xcom_dag.py").write_text(DAG_FILE)
    bundles = [
        {
            "name": "bench",
            "classpath": "airflow.dag_processing.bundles.local.LocalDagBundle",
            "kwargs": {"path": str(dags), "refresh_interval": 0},
        }
    ]
    os.environ.update(
        {
            "AIRFLOW_HOME": str(home),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__DAGS_FOLDER": str(dags),
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home / 'airflow.db'}",
            "AIRFLOW__DAG_PROCESSOR__DAG_BUNDLE_CONFIG_LIST": json.dumps(bundles),
            "AIRFLOW__PULSARSTATE__KEY_NAMESPACE": "bench",
            "AIRFLOW__PULSARSTATE__XCOM_TOPIC": f"bench-xcom-{int(time.time())}",
            "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        }
    )
    os.environ.pop("AIRFLOW_CONN_PULSARSTATE_DEFAULT", None)
    airflow = str(Path(sys.executable).with_name("airflow"))
    subprocess.run([airflow, "db", "migrate"], check=True, capture_output=True, timeout=600)


def _run(kind: str, conn: dict[str, Any] | None, args: argparse.Namespace, home: Path) -> dict[str, Any]:
    from airflow.dag_processing.dagbag import DagBag

    from airflow_provider_pulsarstate.xcom.backend import close_stores

    if conn is None:
        os.environ.pop("AIRFLOW_CONN_PULSARSTATE_DEFAULT", None)
    else:
        os.environ["AIRFLOW_CONN_PULSARSTATE_DEFAULT"] = json.dumps({"conn_type": "pulsarstate", "extra": conn})
    close_stores()
    out = home / f"result-{kind}.json"
    dag = DagBag(dag_folder=str(home / "dags")).get_dag("bench_xcom")
    t0 = time.monotonic()
    run = dag.test(run_conf={"ops": args.ops, "sizes": args.sizes, "out": str(out)})
    if str(run.state) != "success" or not out.exists():
        raise SystemExit(f"the benchmark DAG run on {kind} ended {run.state}")
    print(f"{kind}: dag.test() in {time.monotonic() - t0:.1f}s, loadavg {os.getloadavg()}", flush=True)
    close_stores()
    return json.loads(out.read_text())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--backend", choices=["both", "pulsar", "embedded"], default="both")
    p.add_argument("--ops", type=int, default=200, help="push+pull pairs per backend and size")
    p.add_argument("--sizes", type=int, nargs="+", default=[100, 65536], help="payload sizes (characters)")
    p.add_argument("--service-url")
    p.add_argument("--admin-url")
    p.add_argument("--json", type=Path, help="also write the results here")
    args = p.parse_args(argv)

    print_run_header()
    home = Path(tempfile.mkdtemp(prefix="bench-xcom-"))
    _airflow_home(home)
    # the backend is configured as a deployment does it, before the task runner is imported
    os.environ["AIRFLOW__CORE__XCOM_BACKEND"] = "airflow_provider_pulsarstate.xcom.backend.PulsarXComBackend"
    results: dict[str, Any] = {}
    try:
        with contextlib.ExitStack() as stack:
            if args.backend in ("both", "embedded"):
                results["embedded"] = _run("embedded", None, args, home)
            if args.backend in ("both", "pulsar"):
                service_url, admin_url = stack.enter_context(broker_urls(args.service_url, args.admin_url))
                results["pulsar"] = _run(
                    "pulsar", {"service_url": service_url, "admin_url": admin_url, "operation_timeout": 30}, args, home
                )
    finally:
        shutil.rmtree(home, ignore_errors=True)

    print(f"loadavg at end: {os.getloadavg()}")
    print(
        "\n| map back end | value | push (ours) | pull (ours) | push+pull (ours) | push+pull (Airflow's DB backend) | ratio (medians) |"
    )
    print("|---|---|---|---|---|---|---|")
    for kind, by_size in results.items():
        first = by_size.pop("first")
        print(
            f"| {kind} | first push+pull of the task process (opens the map: connect, replay, writer) | - | - | "
            f"{1000 * first['pulsarstate']:.0f} ms | {1000 * first['db']:.0f} ms | (n=1) |"
        )
        for size, times in by_size.items():
            ours, db = times["pulsarstate"], times["db"]
            ours_pair = [a + b for a, b in zip(ours["push"], ours["pull"])]
            db_pair = [a + b for a, b in zip(db["push"], db["pull"])]
            ratio = statistics.median(ours_pair) / statistics.median(db_pair)
            print(
                f"| {kind} | {int(size):,} chars | {_ms(ours['push'])} | {_ms(ours['pull'])} | {_ms(ours_pair)} "
                f"| {_ms(db_pair)} | {ratio:.2f}x |"
            )
    if args.json:
        args.json.write_text(json.dumps({"machine": machine_info(), "ops": args.ops, "results": results}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
