"""Full garbage collections in a REAL ``airflow triggerer`` running N watchers, with and without
the triggerer setting (``triggerer_gc.freeze_triggerer_imports()`` from a sitecustomize on the
triggerer's PYTHONPATH only).

A dag-processor and a triggerer (SQLite metadata DB, embedded back end) run N ``StateChangeTrigger``
asset watchers (one shared stream each, on one table) and a probe watcher
(``tests/airflow/gc_probe.py``) that reports from inside the trigger runner: objects frozen,
objects a full collection walks, full collections and their longest pause, and the loop's worst
stall (10 ms ticker minus CPU wait) from the probe's start until every watcher runs.

    .venv/bin/python benchmarks/bench_triggerer_gc.py --watchers 1000
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
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-triggerer-gc-") as tmp:
        db = migrated_template(Path(tmp) / "migrated", str(Path(sys.executable).with_name("airflow")))
        for freeze in {"both": (False, True), "default": (False,), "freeze": (True,)}[args.mode]:
            run_dir = Path(tmp) / ("freeze" if freeze else "default")
            run_dir.mkdir()
            run = run_many_watchers(run_dir, migrated_db=db, watchers=args.watchers, freeze=freeze, timeout=600)
            report = {k: v for k, v in run.report.items() if k not in ("pid", "ppid", "walked_types")}
            print(json.dumps({"watchers": args.watchers, "setting": freeze, **report}), flush=True)


if __name__ == "__main__":
    main()
