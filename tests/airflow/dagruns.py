"""Helpers the Airflow tests share: load a DAG, run it once with dag.test() (here or in a child
process), the DAG bundles and Spark connection dag.test() needs, load an example Spark job."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE_DAGS = ROOT / "dags"
TEST_DAGS = Path(__file__).resolve().parent / "dags"
PIPELINE_WORKER = Path(__file__).with_name("ingest_kill_worker.py")
SPARK_LOCAL = json.dumps({"conn_type": "spark", "host": "local[*]"})


def dag_bundle_env() -> dict[str, str]:
    """The environment that lets dag.test() run the example DAGs and the test DAGs (it needs them
    in DAG bundles to serialize them) and their Spark jobs (``spark_default`` in local mode)."""
    bundles = [
        {
            "name": name,
            "classpath": "airflow.dag_processing.bundles.local.LocalDagBundle",
            "kwargs": {"path": str(path), "refresh_interval": 0},
        }
        for name, path in (("pulsarstate-examples", EXAMPLE_DAGS), ("pulsarstate-test-dags", TEST_DAGS))
    ]
    return {
        "AIRFLOW__DAG_PROCESSOR__DAG_BUNDLE_CONFIG_LIST": json.dumps(bundles),
        "AIRFLOW_CONN_SPARK_DEFAULT": SPARK_LOCAL,
    }


def load_dag(folder: Path, dag_id: str) -> Any:
    """``dag_id`` from the DAG files under ``folder`` (a folder or one file); import errors fail the test."""
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=str(folder))
    assert not bag.import_errors, bag.import_errors
    dag = bag.get_dag(dag_id)
    assert dag is not None, f"{dag_id} not in {folder}: {sorted(bag.dag_ids)}"
    return dag


def run_dag(dag: Any, conf: dict[str, Any]) -> SimpleNamespace:
    """dag.test() once: the run's state, each task's state, duration (seconds) and XCom return value."""
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    started = time.monotonic()
    run = dag.test(run_conf=conf)
    elapsed = time.monotonic() - started
    with create_session() as session:
        tis = run.get_task_instances(session=session)
        states = {ti.task_id: str(ti.state) for ti in tis}
        durations = {
            ti.task_id: (ti.end_date - ti.start_date).total_seconds() for ti in tis if ti.start_date and ti.end_date
        }
        xcoms = {
            row.task_id: XComModel.deserialize_value(row)
            for row in session.scalars(XComModel.get_many(run_id=run.run_id, dag_ids=dag.dag_id, key="return_value"))
        }
    print(f"{dag.dag_id} {conf}: {run.state} in {elapsed:.1f}s {states}")
    return SimpleNamespace(state=str(run.state), states=states, xcoms=xcoms, durations=durations, seconds=elapsed)


def load_job(name: str) -> ModuleType:
    """The example Spark job ``dags/jobs/<name>.py`` as a module (its pure-Python parts give the truth)."""
    spec = importlib.util.spec_from_file_location(name, EXAMPLE_DAGS / "jobs" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_pipeline_worker(
    conf: dict[str, Any], *, env: Mapping[str, str], kill_after: str = "", timeout: float = 900
) -> subprocess.CompletedProcess[str]:
    """``price_events_pipeline`` run once with dag.test() in a child process (``ingest_kill_worker.py``)
    under ``env`` (its AIRFLOW_HOME, metadata DB and connections); ``kill_after`` as the worker takes it.
    The process is forked from a warm parent (``warm_python``): it skips Airflow's import and
    execution-API start-up, not anything the run does."""
    from tests.airflow.warm_python import run_warm

    return run_warm(PIPELINE_WORKER, [str(EXAMPLE_DAGS), json.dumps(conf), kill_after], env=env, timeout=timeout)


def worker_result(proc: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    """The ``RESULT`` line of a pipeline worker that finished (state, task states, tries, run id,
    return values); a worker that failed fails the test with the end of its output."""
    tail = f"\n--- stdout\n{proc.stdout[-4000:]}\n--- stderr\n{proc.stderr[-6000:]}"
    assert proc.returncode == 0, f"rc={proc.returncode}{tail}"
    line = next((line for line in proc.stdout.splitlines() if line.startswith("RESULT ")), None)
    assert line is not None, f"no RESULT line{tail}"
    return dict(json.loads(line[len("RESULT ") :]))
