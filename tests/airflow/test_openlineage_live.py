"""OpenLineage of the example pipeline ``dags/price_events_pipeline.py`` run by a real ``airflow
scheduler`` (LocalExecutor workers, ``dag-processor``, ``api-server``; SQLite), with a real
``spark-submit`` in local mode, on the embedded back end (no connection: the state lives under
AIRFLOW_HOME). The listener's file transport writes the events; the tests read them back.

The apply's COMPLETE event has exactly the events topic (the offsets the run consumed per
partition) and the table as read as inputs, and exactly the table (its row count and the
published counts) as output. One deployment runs both DAGs of the module (the example pipeline
and a failing apply) at once: 3-12 minutes, three Airflow processes and a Spark job.
"""

from __future__ import annotations

import json
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from airflow_provider_pulsarstate.assets.uri import lineage_namespace
from airflow_provider_pulsarstate.engine.config import ConnectionConfig
from airflow_provider_pulsarstate.testing.airflow_processes import AirflowProcesses
from tests.airflow.dagruns import EXAMPLE_DAGS, TEST_DAGS

pytest.importorskip("airflow.providers.openlineage", reason="needs apache-airflow-providers-openlineage (test extra)")
pytest.importorskip("pyspark", reason="needs the [spark] extra")

DAG_ID = "price_events_pipeline"
FAILING_DAG_ID = "lineage_apply"  # tests/airflow/dags/lineage_test_dags.py
# the module's tests share one deployment (a module fixture): on one xdist worker, started once
pytestmark = [pytest.mark.xdist_group("openlineage-live"), pytest.mark.timeout(1800)]
SPARK_LOCAL = json.dumps({"conn_type": "spark", "host": "local[*]"})


def _datasets(event: dict[str, Any], kind: str) -> dict[tuple[str, str], dict[str, Any]]:
    return {(d["namespace"], d["name"]): d for d in event.get(kind) or []}


@pytest.fixture(scope="module")
def scheduled(tmp_path_factory: pytest.TempPathFactory, migrated_db: Path) -> Iterator[SimpleNamespace]:
    """The example pipeline (one batch of 300 events) and ``lineage_apply`` told to apply an unknown
    view, triggered together and run to their end by the scheduler; their XComs, task states and
    the OpenLineage events the deployment wrote."""
    tmp_path = tmp_path_factory.mktemp("openlineage-live")
    dags = tmp_path / "dags"
    dags.mkdir()
    shutil.copy(EXAMPLE_DAGS / "price_events_pipeline.py", dags)
    shutil.copytree(EXAMPLE_DAGS / "jobs", dags / "jobs")
    shutil.copy(TEST_DAGS / "lineage_test_dags.py", dags)
    home = tmp_path / "airflow"
    (home / "pulsarstate").mkdir(parents=True, mode=0o700)
    events_file = tmp_path / "openlineage.jsonl"
    env = {
        "AIRFLOW__OPENLINEAGE__TRANSPORT": json.dumps(
            {"type": "file", "log_file_path": str(events_file), "append": True}
        ),
        "AIRFLOW__OPENLINEAGE__NAMESPACE": "pulsarstate-live",
        "AIRFLOW_CONN_SPARK_DEFAULT": SPARK_LOCAL,
    }
    suffix = uuid.uuid4().hex[:8]
    names = {"events_topic": f"ol-e-{suffix}", "table_topic": f"ol-t-{suffix}", "subscription": f"ol-s-{suffix}"}
    failing_table = f"ol-fail-{suffix}"
    components = ("api-server", "scheduler", "dag-processor")
    with AirflowProcesses(
        home=home,
        dags_folder=dags,
        env=env,
        components=components,
        metadata_db=migrated_db,
        parallelism=2,
        start_timeout=600,
    ) as af:
        af.wait_for_dag(DAG_ID)
        af.wait_for_dag(FAILING_DAG_ID)
        run_id = af.trigger(DAG_ID, conf={"batch": 1, "events": 300, "skus": 120, "lease_timeout": 120, **names})
        failing_run_id = af.trigger(
            FAILING_DAG_ID,
            conf={"table_topic": failing_table, "rows": {"sku-1": {"p": 1}}, "bad_view_id": "no-such-view"},
        )
        state = af.wait_for_run(DAG_ID, run_id, timeout=900)
        assert state == "success", (af.task_instances(DAG_ID, run_id), af.tail("scheduler"))
        failing_state = af.wait_for_run(FAILING_DAG_ID, failing_run_id, timeout=600)
        failing_states = {ti["task_id"]: ti["state"] for ti in af.task_instances(FAILING_DAG_ID, failing_run_id)}
        yield SimpleNamespace(
            names=names,
            failing_table=failing_table,
            report=af.xcom(DAG_ID, run_id, "report"),
            result=af.xcom(DAG_ID, run_id, "prices.apply_view"),
            failing_state=failing_state,
            failing_states=failing_states,
            events=[json.loads(line) for line in events_file.read_text().splitlines() if line.strip()],
            namespace=lineage_namespace(ConnectionConfig(url=str(home / "pulsarstate" / "state.db"))),
        )


def _lifecycle(events: list[dict[str, Any]], job: str) -> list[dict[str, Any]]:
    return [e for e in events if e["job"]["name"] == job]


def test_a_scheduled_run_of_the_example_pipeline_reports_what_it_consumed_and_published(
    scheduled: SimpleNamespace,
) -> None:
    events, ns, report, result = scheduled.events, scheduled.namespace, scheduled.report, scheduled.result
    events_name = f"persistent://public/default/{scheduled.names['events_topic']}"
    table_name = f"persistent://public/default/{scheduled.names['table_topic']}"
    apply = _lifecycle(events, f"{DAG_ID}.prices.apply_view")
    assert [e["eventType"] for e in apply] == ["START", "COMPLETE"], [
        (e["job"]["name"], e["eventType"]) for e in events
    ]
    inputs, outputs = _datasets(apply[1], "inputs"), _datasets(apply[1], "outputs")
    assert set(inputs) == {(ns, events_name), (ns, table_name)}
    consumed = [{"partition": int(p), "start": r[0], "next": r[1]} for p, r in sorted(report["offsets"].items())]
    assert inputs[(ns, events_name)]["inputFacets"]["pulsarOffsetRanges"]["ranges"] == consumed
    assert sum(r["next"] - r["start"] for r in consumed) == report["offsets_consumed"] == 300
    assert set(outputs) == {(ns, table_name)}
    facets = outputs[(ns, table_name)]["outputFacets"]
    assert facets["outputStatistics"]["rowCount"] == report["table_rows"]
    counts = facets["pulsarTableCommit"]
    assert (counts["set"], counts["delete"], counts["unchanged"]) == (result["set"], 0, 0)
    assert (counts["commitOffset"], counts["viewId"]) == (result["commit_offset"], result["view_id"])
    # the Spark job read the events and the table, and wrote nothing a reader sees (its view is staged)
    spark = _lifecycle(events, f"{DAG_ID}.prices.spark_job")
    assert [e["eventType"] for e in spark] == ["START", "COMPLETE"]
    assert set(_datasets(spark[1], "inputs")) == {(ns, events_name), (ns, table_name)}
    assert not spark[1].get("outputs")
    # the cursor commit reports the same ranges the apply consumed
    commit_task = _lifecycle(events, f"{DAG_ID}.prices.commit_offsets")[-1]
    assert commit_task["eventType"] == "COMPLETE"
    assert (
        _datasets(commit_task, "inputs")[(ns, events_name)]["inputFacets"]["pulsarOffsetRanges"]["ranges"] == consumed
    )
    # the DAG run's own events (the scheduler's listener) and the task's, linked by the parent facet
    dag_events = _lifecycle(events, DAG_ID)
    assert [e["eventType"] for e in dag_events] == ["START", "COMPLETE"]
    assert apply[1]["run"]["facets"]["parent"]["run"]["runId"] == dag_events[0]["run"]["runId"]


def test_a_scheduled_failed_apply_reports_the_table_without_counts(scheduled: SimpleNamespace) -> None:
    """``lineage_apply`` told to apply an unknown view, run by the scheduler: the apply's events are
    START and FAIL, the FAIL naming the table as output without statistics or counts."""
    assert scheduled.failing_state == "failed"
    assert scheduled.failing_states["apply_view"] == "failed", scheduled.failing_states
    apply = _lifecycle(scheduled.events, f"{FAILING_DAG_ID}.apply_view")
    assert [e["eventType"] for e in apply] == ["START", "FAIL"]
    ns, table = scheduled.namespace, f"persistent://public/default/{scheduled.failing_table}"
    outputs = _datasets(apply[1], "outputs")
    assert set(outputs) == {(ns, table)}
    assert not outputs[(ns, table)].get("outputFacets")
