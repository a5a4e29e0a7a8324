"""One Airflow "deployment" running the price-events pipeline once with dag.test(), in its own
process with its own metadata DB (copied from the session's migrated one). Prints the run's task
states and the Spark task's start and end times as ``RESULT <json>``.

    python deployment_worker.py <dags folder> <run conf JSON>

AIRFLOW_HOME, AIRFLOW__DATABASE__SQL_ALCHEMY_CONN and AIRFLOW_VAR_PULSARSTATE_DEPLOYMENT come
from the environment the test sets.
"""

from __future__ import annotations

import json
import os
import sys


def main() -> int:
    folder, conf = sys.argv[1], json.loads(sys.argv[2])
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=folder)
    if bag.import_errors:
        print(json.dumps({"import_errors": {k: str(v) for k, v in bag.import_errors.items()}}), flush=True)
        return 2
    dag = bag.get_dag("price_events_pipeline")
    # each deployment keeps its own sensor watermark: with one shared watermark the deployment whose
    # sensor succeeds first moves it past the other's batch, and the other would wait for news forever
    sensor = dag.get_task("wait_for_events")
    sensor.watermark_key = f"{sensor.watermark_key}/{os.environ['AIRFLOW_VAR_PULSARSTATE_DEPLOYMENT']}"
    run = dag.test(run_conf=conf)
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    with create_session() as session:
        tis = {ti.task_id: ti for ti in run.get_task_instances(session=session)}
        times = {
            task_id: [ti.start_date.timestamp(), ti.end_date.timestamp()]
            for task_id, ti in tis.items()
            if ti.start_date and ti.end_date
        }
        xcoms = {
            row.task_id: XComModel.deserialize_value(row)
            for row in session.scalars(XComModel.get_many(run_id=run.run_id, dag_ids=dag.dag_id, key="return_value"))
        }
    print(
        "RESULT "
        + json.dumps(
            {
                "state": str(run.state),
                "states": {k: str(ti.state) for k, ti in tis.items()},
                "times": times,
                "lease": xcoms.get("lease.acquire"),
                "release": xcoms.get("lease.release"),
                "report": xcoms.get("report"),
            }
        ),
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
