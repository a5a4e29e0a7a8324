"""Benchmark: switching a 1M-key table through a temp view, beside a plain in-memory dict diff.

    .venv/bin/python benchmarks/bench_views.py                 # embedded log in a temp dir
    .venv/bin/python benchmarks/bench_views.py --rows 100000   # smaller
    .venv/bin/python benchmarks/bench_views.py --service-url pulsar://127.0.0.1:6650 --admin-url http://127.0.0.1:8080
    .venv/bin/python benchmarks/bench_views.py --start-broker  # a throw-away Pulsar standalone

Every measurement runs in a child process of its own, so each peak RSS is that side's alone:

* baseline: build the old and the new table as two dicts and diff them with ``==`` (only the
  diff is timed: the median of five timings);
* load: version 0 of the table (all rows) through a view;
* apply (versions 1, 5 and 20, the targets of BENCHMARKS.md): a fresh process bootstraps the table (from
  its newest checkpoint and the records after it), stages the next full version into a view and
  applies it; bootstrap and apply are timed, peak RSS is the process's;
* versions in between are applied by a filler process, so version 20 has 20 versions of history.

The published op count must equal the true diff (computed by the baseline) in every run; the
script exits 1 if it does not, or (with ``--check``) if a target is missed.
"""

from __future__ import annotations

import argparse
import json
import logging
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

TOPIC = "persistent://public/default/bench-prices"


def row(i: int, version: int) -> dict:
    """The record of sku i in a version: each version changes the price of 1% of the skus (slice i % 100)."""
    k = i % 100 or 100
    bump = (version - k) // 100 + 1 if version >= k else 0
    return {"price": round((i * 7919 % 10_000) / 100 + bump, 2), "currency": "EUR", "stock": i % 50}


def table(rows: int, version: int) -> dict[str, dict]:
    return {f"sku-{i:07d}": row(i, version) for i in range(rows)}


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def run_baseline(rows: int, repeats: int = 5) -> dict:
    """The diff of two built tables, timed ``repeats`` times: its median is the baseline (one
    timing of it varies by a third between runs on a busy host)."""
    start = time.perf_counter()
    old, new = table(rows, 0), table(rows, 1)
    built = time.perf_counter()
    times = []
    for _ in range(repeats):
        began = time.perf_counter()
        sets = [k for k, v in new.items() if old.get(k) != v]
        deletes = [k for k in old if k not in new]
        times.append(time.perf_counter() - began)
    return {
        "diff_s": statistics.median(times),
        "diff_runs_s": [round(t, 3) for t in times],
        "total_s": built - start + times[0],
        "ops": len(sets) + len(deletes),
        "peak_rss_mb": peak_rss_mb(),
    }


def true_diff(rows: int, version: int) -> int:
    """Ops between version-1 and version (without building the tables)."""
    return sum(1 for i in range(rows) if row(i, version) != row(i, version - 1))


def apply_version(state, rows: int, version: int) -> tuple[float, float, object]:
    view = state.create_view()
    t1 = time.perf_counter()
    with state.stager(view.view_id, batch_rows=5000) as stager:
        for i in range(rows):
            stager.set(f"sku-{i:07d}", row(i, version))
    state.seal(view.view_id, stagers=[stager])
    t2 = time.perf_counter()
    result = state.apply(view.view_id)
    return t2 - t1, time.perf_counter() - t2, result


def run_ours(rows: int, config: dict, versions: list[int], topic: str = TOPIC) -> dict:
    """Bootstrap a fresh table instance, then apply ``versions`` in order (timing the last)."""
    from airflow_provider_pulsarstate import ConnectionConfig, open_backend
    from airflow_provider_pulsarstate.engine.recipes.table import StateTable

    backend = open_backend(ConnectionConfig(**config))
    state = StateTable(backend, topic, operation_timeout=600.0)
    out: dict = {}
    t0 = time.perf_counter()
    state.start()
    out["bootstrap_s"] = time.perf_counter() - t0
    out["checkpoint_offset"] = state.manager.stats["checkpoint_loaded_offset"]
    out["records_replayed"] = state.manager.stats["records_replayed"]
    out["ops"] = []
    for version in versions:
        stage_s, apply_s, result = apply_version(state, rows, version)
        out["ops"].append(result.set + result.delete)
        logging.info("version %d: staged in %.1fs, applied in %.2fs: %d ops", version, stage_s, apply_s, out["ops"][-1])
    out.update(
        stage_s=stage_s,
        apply_s=apply_s,
        unchanged=result.unchanged,
        commit_offset=result.commit_offset,
        peak_rss_mb=peak_rss_mb(),
        views_kept=len(state.views()),
    )
    state.close()
    backend.close()
    return out


def child(args: list[str]) -> dict:
    proc = subprocess.run([sys.executable, __file__, *args], stdout=subprocess.PIPE, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"child {args[:2]} failed (exit {proc.returncode})")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--versions", type=int, default=20, help="versions applied after the load (default 20)")
    parser.add_argument("--service-url", default="")
    parser.add_argument("--admin-url", default="")
    parser.add_argument("--start-broker", action="store_true", help="start a throw-away Pulsar standalone")
    parser.add_argument("--check", action="store_true", help="exit 1 when a target is missed")
    parser.add_argument("--json", dest="json_out", default="")
    parser.add_argument("--phase", choices=["baseline", "ours"], help=argparse.SUPPRESS)
    parser.add_argument("--apply", default="", help=argparse.SUPPRESS)
    parser.add_argument("--config", help=argparse.SUPPRESS)
    parser.add_argument("--topic", default=TOPIC, help=argparse.SUPPRESS)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stderr)

    if args.phase == "baseline":
        print(json.dumps(run_baseline(args.rows)))
        return 0
    if args.phase == "ours":
        print(
            json.dumps(
                run_ours(args.rows, json.loads(args.config), [int(v) for v in args.apply.split(",")], args.topic)
            )
        )
        return 0
    if args.start_broker and not args.service_url:
        from benchmarks.machine import broker_urls

        with broker_urls(None, None) as (service_url, admin_url):
            args.service_url, args.admin_url = service_url, admin_url
            return run_all(args)
    return run_all(args)


def run_all(args: argparse.Namespace) -> int:
    from benchmarks.machine import print_run_header

    print_run_header()
    tmp = tempfile.mkdtemp(prefix="bench-views-")
    config = (
        {"url": args.service_url, "admin_url": args.admin_url, "operation_timeout": 600.0}
        if args.service_url
        else {"url": f"{tmp}/state.db", "operation_timeout": 600.0}
    )
    backend_name = "pulsar" if args.service_url else "embedded"
    topic = f"{TOPIC}-{int(time.time())}"  # a fresh table per run (a broker keeps earlier runs' tables)
    common = ["--rows", str(args.rows), "--config", json.dumps(config), "--topic", topic]
    base = child(["--phase", "baseline", "--rows", str(args.rows)])
    logging.info("loading the committed table: %d rows (%s back end)", args.rows, backend_name)
    child(["--phase", "ours", "--apply", "0", *common])
    measured = [v for v in (1, 5, 20) if v <= args.versions] or [args.versions]
    runs: dict[int, dict] = {}
    done = 0
    for v in measured:
        if v - 1 > done:
            logging.info("applying versions %d..%d in a filler process", done + 1, v - 1)
            child(["--phase", "ours", "--apply", ",".join(str(x) for x in range(done + 1, v)), *common])
        logging.info("version %d: bootstrap + stage + apply in a fresh process", v)
        runs[v] = child(["--phase", "ours", "--apply", str(v), *common])
        done = v
    ok_ops = (
        all(r["ops"] == [true_diff(args.rows, v)] for v, r in runs.items())
        and runs[measured[0]]["ops"][0] == base["ops"]
    )

    print(f"\nview switch of {args.rows:,} keys, 1% changed per version, {backend_name} back end")
    runs_s = ", ".join(f"{t:.2f}" for t in base["diff_runs_s"])
    print(
        f"dict diff: {base['diff_s']:.2f}s (median of {runs_s}), peak RSS {base['peak_rss_mb']:.0f} MB, {base['ops']:,} ops"
    )
    print(
        f"{'version':>7} {'bootstrap (s)':>13} {'replayed':>9} {'apply (s)':>9} {'x dict':>7} {'RSS (MB)':>9} {'x dict':>7} {'ops = diff':>10}"
    )
    passed = True
    for v, r in runs.items():
        ratio, rss = r["apply_s"] / base["diff_s"], r["peak_rss_mb"] / base["peak_rss_mb"]
        ops_ok = r["ops"] == [true_diff(args.rows, v)]
        print(
            f"{v:>7} {r['bootstrap_s']:>13.2f} {r['records_replayed']:>9} {r['apply_s']:>9.2f} {ratio:>6.2f}x "
            f"{r['peak_rss_mb']:>9.0f} {rss:>6.2f}x {'yes' if ops_ok else 'NO':>10}"
        )
    last = runs[measured[-1]]
    targets = [
        ("apply <= 2x dict diff (every version)", all(r["apply_s"] <= 2 * base["diff_s"] for r in runs.values())),
        (
            "peak RSS <= 1.3x dict diff (every version)",
            all(r["peak_rss_mb"] <= 1.3 * base["peak_rss_mb"] for r in runs.values()),
        ),
        (f"bootstrap after {measured[-1]} versions <= 1.5 s", last["bootstrap_s"] <= 1.5),
        ("published ops = true diff (every run)", ok_ops),
    ]
    for name, ok in targets:
        print(f"  {'PASS' if ok else 'FAIL'}  {name}")
        passed &= ok
    print(
        f"staging: {args.rows / last['stage_s']:,.0f} rows/s from one process; views kept after {measured[-1]} versions: {last['views_kept']}"
    )
    if args.json_out:
        Path(args.json_out).write_text(
            json.dumps({"rows": args.rows, "backend": backend_name, "runs": runs, "baseline": base}, indent=2)
        )
    if not ok_ops:
        return 1
    return 1 if args.check and not passed else 0


if __name__ == "__main__":
    sys.exit(main())
