"""The "Pulsar State" API on a large table: summary and one page of rows, through a real API server.

Writes a table of ``--rows`` rows (default 1M) on the embedded back end with one applied view,
starts ``airflow api-server`` (simple auth manager, logins on) with the connection defined, loads
the table once (the first summary: the API server replays the log), then times ``--requests``
summaries, first pages and deep pages (a prefix in the middle of the key space, then the page after
it), and reports the API server's resident memory (its whole process tree) before and after::

    .venv/bin/python benchmarks/bench_state_ui.py                 # 1M rows, about 3-5 min on 2 cores
    .venv/bin/python benchmarks/bench_state_ui.py --rows 100000   # quicker

With ``--xcom-entries N`` it measures the XCom / state-store maps instead: one DAG run whose XCom
map holds N entries (a task mapped N ways) and whose task-state map holds a few, then times the
DAG's run list, the run's summary (counts and sizes per task), a first page of entries, a page
after a cursor in the middle, and a page of values::

    .venv/bin/python benchmarks/bench_state_ui.py --xcom-entries 100000

Target: every timed request under 200 ms once the table (or map) is loaded.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.machine import machine_info, percentile  # noqa: E402

CONN_ID = "ps_bench_ui"
TOPIC = "bench-ui-table"
KEY_NAMESPACE = "bench"
DAG = "bench_fanout"
RUN_ID = "manual__2026-11-26T00:00:00+00:00"


def write_xcom_map(entries: int) -> float:
    """``entries`` XComs of one run (a task mapped ``entries`` ways) in its run map, and a little task state."""
    from airflow_provider_pulsarstate.engine.recipes.state_store import TaskStateScope
    from airflow_provider_pulsarstate.engine.recipes.xcom_store import XComRecord
    from airflow_provider_pulsarstate.hooks.pulsarstate import PulsarStateHook, close_shared_state_maps

    start = time.perf_counter()
    with PulsarStateHook(CONN_ID) as hook:
        with hook.xcom_run_store("airflow-xcom", namespace=KEY_NAMESPACE, dag_id=DAG, run_id=RUN_ID) as store:
            pending = []
            for i in range(entries):
                text = json.dumps({"rows": i, "path": f"s3://bucket/part-{i:06d}.parquet"})
                record = XComRecord(text, time.time(), len(text), "dict", 1)
                pending.append(store.map.put_async(store.map_key(DAG, RUN_ID, "extract", i, "return_value"), record))
                if len(pending) >= 2000:
                    for future in pending:
                        future.result(timeout=120)
                    pending.clear()
            for future in pending:
                future.result(timeout=120)
        state = hook.get_state_store(namespace=KEY_NAMESPACE)
        for task in ("extract", "load"):
            state.set(TaskStateScope(DAG, RUN_ID, task), "job_id", {"id": 7})
    close_shared_state_maps()
    return time.perf_counter() - start


def write_table(rows: int) -> float:
    from airflow_provider_pulsarstate.hooks.pulsarstate import PulsarStateHook

    start = time.perf_counter()
    with PulsarStateHook(CONN_ID) as hook:
        table = hook.get_table(TOPIC)
        view = table.create_view(view_id="bench-load")
        with table.stager(view.view_id) as stager:
            stager.set_many(
                (f"sku-{i:08d}", {"price": i % 1000, "currency": "EUR", "name": f"item {i}"}) for i in range(rows)
            )
        table.seal(view.view_id, stagers=[stager])
        table.apply(view.view_id)
        table.checkpoint()
    return time.perf_counter() - start


def tree_rss_mb(pid: int) -> float:
    """Resident memory of ``pid`` and its descendants (MB)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        todo += children.get(p, [])
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        except OSError:
            pass
    return total / 1024


def timed(session: requests.Session, url: str, params: dict, n: int) -> list[float]:
    times = []
    for _ in range(n):
        start = time.perf_counter()
        answer = session.get(url, params=params, timeout=120)
        times.append(time.perf_counter() - start)
        answer.raise_for_status()
    return times


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--requests", type=int, default=30)
    parser.add_argument("--json", help="also write the results here")
    parser.add_argument(
        "--xcom-entries", type=int, default=0, help="measure the maps API on a run with this many XComs"
    )
    args = parser.parse_args()
    if args.xcom_entries:
        return bench_maps(args)

    from airflow_provider_pulsarstate.testing.airflow_processes import AirflowProcesses

    home = Path(tempfile.mkdtemp(prefix="bench-state-ui-"))
    (home / "dags").mkdir()
    conn = json.dumps({"conn_type": "pulsarstate", "extra": {"service_url": f"file://{home / 'state.db'}"}})
    os.environ[f"AIRFLOW_CONN_{CONN_ID.upper()}"] = conn
    write_seconds = write_table(args.rows)
    print(f"wrote {args.rows} rows in {write_seconds:.1f}s", file=sys.stderr)
    password = "bench-" + os.urandom(6).hex()
    (home / "passwords.json").write_text(json.dumps({"admin": password}))
    af = AirflowProcesses(
        home=home / "airflow",
        dags_folder=home / "dags",
        components=("api-server",),
        env={
            "PYTHONPATH": str(ROOT),
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "False",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": "admin:admin",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(home / "passwords.json"),
            "AIRFLOW__CORE__LAZY_DISCOVER_PROVIDERS": "False",
            f"AIRFLOW_CONN_{CONN_ID.upper()}": conn,
        },
    )
    af.start()
    try:
        pid = af._procs["api-server"].pid
        token = requests.post(
            af.api_url + "/auth/token", json={"username": "admin", "password": password}, timeout=30
        ).json()["access_token"]
        session = requests.Session()
        session.headers["Authorization"] = f"Bearer {token}"
        base = f"{af.api_url}/pulsarstate/api/connections/{CONN_ID}"
        timed(session, base + "/topics", {}, 1)
        rss_before = tree_rss_mb(pid)
        start = time.perf_counter()
        first = session.get(base + "/table", params={"topic": TOPIC}, timeout=600)
        load_seconds = time.perf_counter() - start
        first.raise_for_status()
        assert first.json()["rows"] == args.rows, first.text[:300]
        first_page = timed(session, base + "/table/rows", {"topic": TOPIC, "limit": 50}, 1)[0]
        rss_after = tree_rss_mb(pid)
        mid = f"sku-{args.rows // 2:08d}"[:-2]
        results = {
            "summary": timed(session, base + "/table", {"topic": TOPIC}, args.requests),
            "first page (50 rows)": timed(session, base + "/table/rows", {"topic": TOPIC, "limit": 50}, args.requests),
            "prefix page (50 rows)": timed(
                session, base + "/table/rows", {"topic": TOPIC, "prefix": mid, "limit": 50}, args.requests
            ),
            "cursor page (500 rows)": timed(
                session, base + "/table/rows", {"topic": TOPIC, "cursor": mid + "50", "limit": 500}, args.requests
            ),
        }
    finally:
        af.stop()
    report = {
        "machine": machine_info(),
        "load_average_1m": round(os.getloadavg()[0], 1),
        "rows": args.rows,
        "write_seconds": round(write_seconds, 1),
        "first_summary_seconds (load)": round(load_seconds, 2),
        "first_rows_page_seconds (key index)": round(first_page, 3),
        "api_server_rss_mb": {"before": round(rss_before), "after_load": round(rss_after)},
        "requests": {
            name: {
                "median_ms": round(statistics.median(t) * 1000, 1),
                "p95_ms": round(percentile(t, 95) * 1000, 1),
                "max_ms": round(max(t) * 1000, 1),
            }
            for name, t in results.items()
        },
    }
    print(json.dumps(report, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))
    return 0


def bench_maps(args: argparse.Namespace) -> int:
    import sqlite3

    from airflow_provider_pulsarstate.testing.airflow_processes import AirflowProcesses

    home = Path(tempfile.mkdtemp(prefix="bench-state-ui-maps-"))
    (home / "dags").mkdir()
    conn = json.dumps({"conn_type": "pulsarstate", "extra": {"service_url": f"file://{home / 'state.db'}"}})
    os.environ[f"AIRFLOW_CONN_{CONN_ID.upper()}"] = conn
    os.environ["AIRFLOW__PULSARSTATE__KEY_NAMESPACE"] = KEY_NAMESPACE
    write_seconds = write_xcom_map(args.xcom_entries)
    print(f"wrote {args.xcom_entries} XComs in {write_seconds:.1f}s", file=sys.stderr)
    password = "bench-" + os.urandom(6).hex()
    (home / "passwords.json").write_text(json.dumps({"admin": password}))
    af = AirflowProcesses(
        home=home / "airflow",
        dags_folder=home / "dags",
        components=("api-server",),
        env={
            "PYTHONPATH": str(ROOT),
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "False",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": "admin:admin",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(home / "passwords.json"),
            "AIRFLOW__CORE__LAZY_DISCOVER_PROVIDERS": "False",
            "AIRFLOW__PULSARSTATE__KEY_NAMESPACE": KEY_NAMESPACE,
            f"AIRFLOW_CONN_{CONN_ID.upper()}": conn,
        },
    )
    af.start()
    with sqlite3.connect(home / "airflow" / "airflow.db") as db:
        db.execute(
            "INSERT INTO dag_run (dag_id, run_id, run_type, run_after, state, clear_number, span_status) "
            "VALUES (?, ?, 'manual', CURRENT_TIMESTAMP, 'success', 0, 'not_started')",
            (DAG, RUN_ID),
        )
    try:
        pid = af._procs["api-server"].pid
        token = requests.post(
            af.api_url + "/auth/token", json={"username": "admin", "password": password}, timeout=30
        ).json()["access_token"]
        session = requests.Session()
        session.headers["Authorization"] = f"Bearer {token}"
        base = f"{af.api_url}/pulsarstate/api/connections/{CONN_ID}/maps/dags/{DAG}"
        # warm up the plugin and the connection, not the run's maps (an asset with no map)
        timed(session, f"{af.api_url}/pulsarstate/api/connections/{CONN_ID}/maps/asset", {"name": "warm-up"}, 1)
        rss_before = tree_rss_mb(pid)
        start = time.perf_counter()
        first = session.get(base + "/run", params={"run_id": RUN_ID}, timeout=600)
        load_seconds = time.perf_counter() - start
        first.raise_for_status()
        assert first.json()["xcom"]["entries"] == args.xcom_entries, first.text[:300]
        rss_after = tree_rss_mb(pid)
        middle = session.get(base + "/run/entries", params={"run_id": RUN_ID, "limit": 500}, timeout=120).json()[
            "next_cursor"
        ]
        mid = f"extract/{args.xcom_entries // 2}/return_value"
        results = {
            "run list (1 run, counts and sizes)": timed(session, base + "/runs", {}, args.requests),
            "run summary (per task)": timed(session, base + "/run", {"run_id": RUN_ID}, args.requests),
            "first page of entries (50)": timed(session, base + "/run/entries", {"run_id": RUN_ID}, args.requests),
            "page after a cursor in the middle (50)": timed(
                session, base + "/run/entries", {"run_id": RUN_ID, "cursor": mid}, args.requests
            ),
            "page of values (50)": timed(
                session, base + "/run/values", {"run_id": RUN_ID, "cursor": middle}, args.requests
            ),
            "page of values (500)": timed(
                session, base + "/run/values", {"run_id": RUN_ID, "limit": 500}, args.requests
            ),
        }
    finally:
        af.stop()
    report = {
        "machine": machine_info(),
        "load_average_1m": round(os.getloadavg()[0], 1),
        "xcom_entries": args.xcom_entries,
        "write_seconds": round(write_seconds, 1),
        "first_run_summary_seconds (load)": round(load_seconds, 2),
        "api_server_rss_mb": {"before": round(rss_before), "after_load": round(rss_after)},
        "requests": {
            name: {
                "median_ms": round(statistics.median(t) * 1000, 1),
                "p95_ms": round(percentile(t, 95) * 1000, 1),
                "max_ms": round(max(t) * 1000, 1),
            }
            for name, t in results.items()
        },
    }
    print(json.dumps(report, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
