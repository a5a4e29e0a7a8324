"""Runs the ingestion pipeline once with dag.test() in this process, SIGKILLing itself right after
one task's execute returned (its work done, its success not yet recorded): a worker dying at a
task boundary. Prints the run's id, task states and return values as JSON when no kill was asked for.

    python ingest_kill_worker.py <dags folder> <run conf JSON> <task id to die after, or "">

``fail:<task id>`` instead makes that task fail after its work on its first try (an exception,
not a kill) and retries it once in the same run.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from datetime import timedelta
from typing import Any


def main() -> int:
    folder, conf, kill_after = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3]
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=folder)
    if bag.import_errors:
        print(json.dumps({"import_errors": {k: str(v) for k, v in bag.import_errors.items()}}), flush=True)
        return 2
    dag = bag.get_dag("price_events_pipeline")
    if kill_after.startswith("fail:"):  # the task fails after its work on its first try, and is retried
        task = dag.get_task(kill_after[len("fail:") :])

        def fail_once(context: Any, result: Any) -> None:
            if context["ti"].try_number == 1:
                raise RuntimeError(f"injected failure after {task.task_id} (try 1)")

        task.retries, task.retry_delay = 1, timedelta(0)
        task._post_execute_hook = fail_once
    elif kill_after:

        def die(context: Any, result: Any) -> None:
            print(f"KILLED after {kill_after}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)

        dag.get_task(kill_after)._post_execute_hook = die  # runs right after execute, before the state is saved
    run = dag.test(run_conf=conf)
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    with create_session() as session:
        tis = run.get_task_instances(session=session)
        states = {ti.task_id: str(ti.state) for ti in tis}
        tries = {ti.task_id: ti.try_number for ti in tis}
        xcoms = {
            row.task_id: XComModel.deserialize_value(row)
            for row in session.scalars(XComModel.get_many(run_id=run.run_id, dag_ids=dag.dag_id, key="return_value"))
        }
    result = {"state": str(run.state), "run_id": run.run_id, "states": states, "tries": tries, "xcoms": xcoms}
    print("RESULT " + json.dumps(result, default=str), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
