"""The main job: the price-table pipeline end to end with dag.test(), on a SQLite metadata DB.

Runs ``price_table_pipeline`` twice, version 1 then version 2, each with a real ``spark-submit``
in local mode, and prints what each run published beside the true diff between the two
versions (computed in plain Python from the job's formulas): the second run publishes only the
changed rows. State goes to the embedded log under AIRFLOW_HOME unless
AIRFLOW_CONN_PULSARSTATE_DEFAULT points at a broker.

Environment: PULSARSTATE_EXAMPLE_DAG picks another DAG (run once, no params);
PULSARSTATE_EXAMPLE_ROWS changes the table size (default 100000).
"""

from __future__ import annotations

import importlib.util
import logging
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
MAIN_DAG = "price_table_pipeline"
DAG_ID = os.environ.get("PULSARSTATE_EXAMPLE_DAG", MAIN_DAG)
ROWS = int(os.environ.get("PULSARSTATE_EXAMPLE_ROWS", "100000"))
SPARK_LOCAL = '{"conn_type": "spark", "host": "local[*]"}'


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    os.environ.setdefault("AIRFLOW_CONN_SPARK_DEFAULT", SPARK_LOCAL)
    home = Path(os.environ["AIRFLOW_HOME"])
    home.mkdir(parents=True, exist_ok=True)
    airflow = str(Path(sys.executable).with_name("airflow"))
    start = time.monotonic()
    subprocess.run([airflow, "db", "migrate"], check=True, stdout=subprocess.DEVNULL)
    logging.info("metadata DB ready under %s in %.1fs", home, time.monotonic() - start)

    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=str(ROOT / "dags"))
    if bag.import_errors:
        for path, err in bag.import_errors.items():
            logging.error("cannot import %s: %s", path, err)
        return 1
    dag = bag.get_dag(DAG_ID)
    if dag is None:
        logging.error("no DAG %r in %s (found: %s)", DAG_ID, ROOT / "dags", ", ".join(sorted(bag.dag_ids)))
        return 1
    if DAG_ID != MAIN_DAG:
        return 0 if _run(dag, None) is not None else 1

    summaries = []
    for version in (1, 2):
        summary = _run(dag, {"version": version, "rows": ROWS})
        if summary is None:
            return 1
        summaries.append(summary)
    ok = _print_comparison(summaries)
    logging.info("%s: two runs in %.1fs", DAG_ID, time.monotonic() - start)
    return 0 if ok else 1


def _run(dag: Any, conf: dict[str, Any] | None) -> dict[str, Any] | None:
    started = time.monotonic()
    run = dag.test(run_conf=conf)
    state = str(getattr(run, "state", None))
    logging.info("%s %s finished: %s in %.1fs", dag.dag_id, conf or "", state, time.monotonic() - started)
    if state not in ("success", "DagRunState.SUCCESS"):
        return None
    if dag.dag_id != MAIN_DAG:
        return {}
    return {**_xcom(run, "report"), "seconds": time.monotonic() - started}


def _xcom(run: Any, task_id: str) -> Any:
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    with create_session() as session:
        row = session.scalars(
            XComModel.get_many(run_id=run.run_id, dag_ids=run.dag_id, task_ids=task_id, key="return_value")
        ).first()
        return XComModel.deserialize_value(row) if row is not None else None


def _print_comparison(summaries: list[dict[str, Any]]) -> bool:
    """The two runs side by side, with the true diff from the job's own formulas."""
    spec = importlib.util.spec_from_file_location("price_table_job", ROOT / "dags" / "jobs" / "price_table_job.py")
    assert spec is not None and spec.loader is not None
    job = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(job)
    v1, v2 = job.price_table(1, ROWS), job.price_table(2, ROWS)
    diff = job.table_diff(v1, v2)
    expected = {
        "set": len(diff["set"]),
        "delete": len(diff["delete"]),
        "unchanged": sum(1 for key, record in v2.items() if v1.get(key) == record),
        "table_rows": len(v2),
    }
    expected["published"] = expected["set"] + expected["delete"]

    first, second = summaries
    lines = [
        "",
        f"price table, {ROWS:,} skus: what each run published",
        f"  {'':<12} {'run 1 (v1)':>12} {'run 2 (v2)':>12} {'true v1->v2':>12}",
    ]
    for name in ("published", "set", "delete", "unchanged", "table_rows"):
        lines.append(f"  {name:<12} {first[name]:>12,} {second[name]:>12,} {expected[name]:>12,}")
    lines.append(f"  {'seconds':<12} {first['seconds']:>12.1f} {second['seconds']:>12.1f}")
    ok = all(second[name] == expected[name] for name in ("set", "delete", "unchanged", "table_rows"))
    share = 100.0 * second["published"] / max(1, second["table_rows"])
    lines.append(
        f"  run 2 published {second['published']:,} rows ({share:.2f} % of the table) at commit offset "
        f"{second['commit_offset']}: {'exactly the changed rows' if ok else 'NOT the true diff'}"
    )
    print("\n".join(lines), flush=True)
    return ok


if __name__ == "__main__":
    sys.exit(main())
