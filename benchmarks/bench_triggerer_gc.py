"""Full garbage collections in a REAL ``airflow triggerer`` running N watchers, with and without
the triggerer setting (``triggerer_gc.freeze_triggerer_imports()`` from a sitecustomize on the
triggerer's PYTHONPATH only).

A dag-processor and a triggerer (SQLite metadata DB, embedded back end) run N ``StateChangeTrigger``
asset watchers (one shared stream each, on one table) and a probe watcher
(``tests/airflow/gc_probe.py``) that reports from inside the trigger runner: objects frozen,
objects a full collection walks, full collections and their longest pause, and the loop's worst
stall (10 ms ticker minus CPU wait) from the probe's start until every watcher runs.

    .venv/bin/python benchmarks/bench_triggerer_gc.py --watchers 1000
    .venv/bin/python benchmarks/bench_triggerer_gc.py --mode freeze --slow-turns   # and every slow loop turn

``--slow-turns`` also prints, per run, every turn of the triggerer's event loops whose callbacks ran
over 50 ms (``tests/airflow/slow_turns.py``: time outside ``select``, the thread's CPU and wait for a
CPU over it, its slowest callback), the longest first: what Airflow's "async thread was blocked"
line does not say.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.airflow.gc_probe import run_many_watchers  # noqa: E402
from tests.airflow.metadata_db import migrated_template  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--watchers", type=int, default=1000)
    parser.add_argument("--mode", choices=["both", "default", "freeze"], default="both")
    parser.add_argument("--slow-turns", action="store_true", help="print the triggerer's loop turns over 50 ms")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-triggerer-gc-") as tmp:
        db = migrated_template(Path(tmp) / "migrated", str(Path(sys.executable).with_name("airflow")))
        for freeze in {"both": (False, True), "default": (False,), "freeze": (True,)}[args.mode]:
            run_dir = Path(tmp) / ("freeze" if freeze else "default")
            run_dir.mkdir()
            turns = run_dir / "slow-turns.log" if args.slow_turns else None
            run = run_many_watchers(
                run_dir, migrated_db=db, watchers=args.watchers, freeze=freeze, timeout=600, slow_turns=turns
            )
            report = {k: v for k, v in run.report.items() if k not in ("pid", "ppid", "walked_types")}
            print(json.dumps({"watchers": args.watchers, "setting": freeze, **report}), flush=True)
            if turns is not None:
                lines = turns.read_text().splitlines() if turns.exists() else []
                runner = f"pid={run.report['pid']} "
                print(f"  slow turns of the trigger runner's loop (pid {run.report['pid']}), longest first:")
                for line in sorted(
                    (x for x in lines if runner in x), key=lambda x: -float(x.split("busy=")[1].split()[0])
                ):
                    print(f"    {line[:300]}")
                print("  and of the triggerer's supervisor (its in-process API server), longest first:")
                for line in sorted(
                    (x for x in lines if runner not in x), key=lambda x: -float(x.split("busy=")[1].split()[0])
                )[:3]:
                    print(f"    {line[:300]}", flush=True)


if __name__ == "__main__":
    main()
