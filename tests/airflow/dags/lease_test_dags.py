"""DAGs for tests/airflow/test_lease_operators.py: guarded work under a lease, a guarded apply, a guarded Spark job."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

import pendulum
from airflow.sdk import DAG, BaseOperator, Param
from airflow.sdk.exceptions import AirflowFailException

from airflow_provider_pulsarstate.operators.leases import LeaseGuardMixin, lease_task_group
from airflow_provider_pulsarstate.operators.spark_submit import GuardedSparkSubmitOperator
from airflow_provider_pulsarstate.operators.views import ApplyTempViewOperator, CreateTempViewOperator

HERE = Path(__file__).resolve().parent
START = pendulum.datetime(2026, 1, 1, tz="UTC")
TTL = 1.5
SPARK_TTL = 15.0
HOLDER = "{{ params.deployment }}/{{ dag.dag_id }}/{{ run_id }}"
COMMON = {
    "lease_name": Param("test-lease", type="string"),
    "deployment": Param("deployment-a", type="string"),
    "timeout": Param(30, type="number"),
    "marker": Param("", type="string"),
}


class RecordUnderLease(LeaseGuardMixin, BaseOperator):
    """Guarded work: appends ``start``/``end`` lines (holder, token, wall time) to ``marker``, runs
    ``seconds``, fails on purpose with ``fail``; returns the token and how often the lease was renewed."""

    template_fields = ("marker", "seconds", "fail")

    def __init__(self, *, marker: str, seconds: Any = 0, fail: Any = False, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.marker, self.seconds, self.fail = marker, seconds, fail

    def execute(self, context: Any) -> dict[str, Any]:
        with self.lease_guard(context) as lease:
            assert lease is not None
            with open(self.marker, "a") as out:
                out.write(f"start {lease.holder} {lease.token} {time.time()}\n")
            deadline = time.monotonic() + float(self.seconds)
            while time.monotonic() < deadline:
                self._lease_renewer.check()  # type: ignore[union-attr]
                time.sleep(0.05)
            if str(self.fail) == "True":
                raise AirflowFailException("injected failure of the guarded task")
            with open(self.marker, "a") as out:
                out.write(f"end {lease.holder} {lease.token} {time.time()}\n")
            return {"token": lease.token, "renewals": self._lease_renewer.renewals}  # type: ignore[union-attr]


with DAG(
    "leases_guarded_work",
    schedule=None,
    start_date=START,
    params={
        **COMMON,
        "seconds": Param(0, type="number"),
        "fail": Param(False, type="boolean"),
        "ttl": Param(TTL, type="number"),
    },
) as guarded_work:
    work = RecordUnderLease(
        task_id="work", marker="{{ params.marker }}", seconds="{{ params.seconds }}", fail="{{ params.fail }}"
    )
    lease_task_group(
        "lease",
        lease_name="{{ params.lease_name }}",
        ttl="{{ params.ttl }}",  # templated: rendered to seconds at execute
        timeout="{{ params.timeout }}",
        holder=HOLDER,
        guard=[work],
    )

with DAG(
    "leases_guarded_apply",
    schedule=None,
    start_date=START,
    params={**COMMON, "table_topic": Param("t", type="string"), "view_id": Param("", type="string")},
) as guarded_apply:
    apply = ApplyTempViewOperator(
        task_id="apply_view", table_topic="{{ params.table_topic }}", view_id="{{ params.view_id }}"
    )
    lease_task_group(
        "lease",
        lease_name="{{ params.lease_name }}",
        ttl=TTL,
        timeout="{{ params.timeout }}",
        holder=HOLDER,
        guard=[apply],
    )

with DAG(
    "leases_guarded_create_view",
    schedule=None,
    start_date=START,
    params={**COMMON, "table_topic": Param("t", type="string")},
) as guarded_create_view:
    create = CreateTempViewOperator(task_id="create_view", table_topic="{{ params.table_topic }}", scope_prefix="sku-")
    lease_task_group(
        "lease",
        lease_name="{{ params.lease_name }}",
        ttl=TTL,
        timeout="{{ params.timeout }}",
        holder=HOLDER,
        guard=[create],
    )

with DAG(
    "leases_guarded_spark",
    schedule=None,
    start_date=START,
    params={**COMMON, "seconds": Param(60, type="number")},
) as guarded_spark:
    spark = GuardedSparkSubmitOperator(
        task_id="spark_job",
        application=str(HERE / "jobs" / "sleeping_job.py"),
        application_args=["--marker", "{{ params.marker }}", "--seconds", "{{ params.seconds }}"],
        conf={"spark.ui.enabled": "false"},
        # a plain SparkSubmitOperator: find the venv's spark-submit and Python as ViewSparkSubmitOperator does
        env_vars={
            "PATH": os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")]),
            "PYSPARK_PYTHON": sys.executable,
        },
    )
    lease_task_group(
        "lease",
        lease_name="{{ params.lease_name }}",
        # the test takes the lease over by force: a longer ttl only keeps a renewer starved while the
        # JVM starts on a loaded machine from losing the lease before the job begins
        ttl=SPARK_TTL,
        timeout="{{ params.timeout }}",
        holder=HOLDER,
        guard=[spark],
    )
