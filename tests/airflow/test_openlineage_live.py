"""OpenLineage of the example pipeline ``dags/price_events_pipeline.py`` run by a real ``airflow
scheduler`` (LocalExecutor workers, ``dag-processor``, ``api-server``; SQLite), with a real
``spark-submit`` in local mode, on the embedded back end (no connection: the state lives under
AIRFLOW_HOME). The listener's file transport writes the events; the test reads them back.

The apply's COMPLETE event has exactly the events topic (the offsets the run consumed per
partition) and the table as read as inputs, and exactly the table (its row count and the
published counts) as output. 3-12 minutes: three Airflow processes and a Spark job.
"""

from __future__ import annotations

import json
import shutil
import uuid
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_pulsarstate.assets.uri import lineage_namespace
from airflow_provider_pulsarstate.engine.config import ConnectionConfig
from airflow_provider_pulsarstate.testing.airflow_processes import AirflowProcesses
from tests.airflow.dagruns import EXAMPLE_DAGS

pytest.importorskip("airflow.providers.openlineage", reason="needs apache-airflow-providers-openlineage (test extra)")
pytest.importorskip("pyspark", reason="needs the [spark] extra")

DAG_ID = "price_events_pipeline"
SPARK_LOCAL = json.dumps({"conn_type": "spark", "host": "local[*]"})


def _datasets(event: dict[str, Any], kind: str) -> dict[tuple[str, str], dict[str, Any]]:
    return {(d["namespace"], d["name"]): d for d in event.get(kind) or []}


@pytest.mark.timeout(1800)  # the Spark job alone took 6 min at a load of 20 on 2 cores
def test_a_scheduled_run_of_the_example_pipeline_reports_what_it_consumed_and_published(
    tmp_path: Path, migrated_db: Path
) -> None:
    dags = tmp_path / "dags"
    dags.mkdir()
    shutil.copy(EXAMPLE_DAGS / "price_events_pipeline.py", dags)
    shutil.copytree(EXAMPLE_DAGS / "jobs", dags / "jobs")
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
        run_id = af.trigger(DAG_ID, conf={"batch": 1, "events": 300, "skus": 120, "lease_timeout": 120, **names})
        state = af.wait_for_run(DAG_ID, run_id, timeout=900)
        assert state == "success", (af.task_instances(DAG_ID, run_id), af.tail("scheduler"))
        report = af.xcom(DAG_ID, run_id, "report")
        result = af.xcom(DAG_ID, run_id, "prices.apply_view")

    events = [json.loads(line) for line in events_file.read_text().splitlines() if line.strip()]
    ns = lineage_namespace(ConnectionConfig(url=str(home / "pulsarstate" / "state.db")))
    events_name = f"persistent://public/default/{names['events_topic']}"
    table_name = f"persistent://public/default/{names['table_topic']}"
    apply = [e for e in events if e["job"]["name"] == f"{DAG_ID}.prices.apply_view"]
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
    # the DAG run's own events (the scheduler's listener) and the task's, linked by the parent facet
    dag_events = [e for e in events if e["job"]["name"] == DAG_ID]
    assert [e["eventType"] for e in dag_events] == ["START", "COMPLETE"]
    assert apply[1]["run"]["facets"]["parent"]["run"]["runId"] == dag_events[0]["run"]["runId"]


@pytest.mark.timeout(1200)  # the components alone took over 3 min to start at a load of 20 on 2 cores
def test_a_scheduled_failed_apply_reports_the_table_without_counts(tmp_path: Path, migrated_db: Path) -> None:
    """``lineage_apply`` (tests/airflow/dags/lineage_test_dags.py) told to apply an unknown view,
    run by the scheduler: the apply's events are START and FAIL, the FAIL naming the table as
    output without statistics or counts."""
    from tests.airflow.dagruns import TEST_DAGS

    dags = tmp_path / "dags"
    dags.mkdir()
    shutil.copy(TEST_DAGS / "lineage_test_dags.py", dags)
    home = tmp_path / "airflow"
    (home / "pulsarstate").mkdir(parents=True, mode=0o700)
    events_file = tmp_path / "openlineage.jsonl"
    env = {
        "AIRFLOW__OPENLINEAGE__TRANSPORT": json.dumps(
            {"type": "file", "log_file_path": str(events_file), "append": True}
        ),
        "AIRFLOW__OPENLINEAGE__NAMESPACE": "pulsarstate-live",
    }
    table = f"ol-fail-{uuid.uuid4().hex[:8]}"
    components = ("api-server", "scheduler", "dag-processor")
    with AirflowProcesses(
        home=home, dags_folder=dags, env=env, components=components, metadata_db=migrated_db, start_timeout=600
    ) as af:
        af.wait_for_dag("lineage_apply")
        run_id = af.trigger(
            "lineage_apply", conf={"table_topic": table, "rows": {"sku-1": {"p": 1}}, "bad_view_id": "no-such-view"}
        )
        assert af.wait_for_run("lineage_apply", run_id, timeout=600) == "failed"
        states = {ti["task_id"]: ti["state"] for ti in af.task_instances("lineage_apply", run_id)}
        assert states["apply_view"] == "failed", states

    events = [json.loads(line) for line in events_file.read_text().splitlines() if line.strip()]
    apply = [e for e in events if e["job"]["name"] == "lineage_apply.apply_view"]
    assert [e["eventType"] for e in apply] == ["START", "FAIL"]
    ns = lineage_namespace(ConnectionConfig(url=str(home / "pulsarstate" / "state.db")))
    outputs = _datasets(apply[1], "outputs")
    assert set(outputs) == {(ns, f"persistent://public/default/{table}")}
    assert not outputs[(ns, f"persistent://public/default/{table}")].get("outputFacets")
