"""OpenLineage events of real runs: the file transport's events read back, START/COMPLETE/FAIL.

The OpenLineage provider's listener runs in the task process of ``dag.test()``; its file transport
appends one JSON event a line. Without the provider the operators record nothing (the guard test).
"""

from __future__ import annotations

import json
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from tests.airflow.dagruns import dag_bundle_env

pytest.importorskip("airflow.providers.openlineage", reason="needs apache-airflow-providers-openlineage (test extra)")


AIRFLOW_BIN = str(Path(sys.executable).with_name("airflow"))
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def openlineage_file(airflow_db: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The file the runs' OpenLineage events go to; set only in the ``airflow`` processes the
    tests start, so the listener is loaded enabled there and nowhere else in the session."""
    path = tmp_path_factory.mktemp("openlineage") / "events.jsonl"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(
            "AIRFLOW__DAG_PROCESSOR__DAG_BUNDLE_CONFIG_LIST",
            dag_bundle_env()["AIRFLOW__DAG_PROCESSOR__DAG_BUNDLE_CONFIG_LIST"],
        )
        yield path


def run_real(openlineage_file: Path, dag_id: str, conf: dict[str, Any]) -> SimpleNamespace:
    """``airflow dags test <dag_id>`` in its own process, with the file transport configured;
    returns the run's state, each task's state and XCom return values (read from the metadata DB)."""
    import os
    import subprocess

    from airflow.models.dagrun import DagRun
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session
    from sqlalchemy import select

    env = os.environ.copy()
    env["AIRFLOW__OPENLINEAGE__TRANSPORT"] = json.dumps(
        {"type": "file", "log_file_path": str(openlineage_file), "append": True}
    )
    env["AIRFLOW__OPENLINEAGE__NAMESPACE"] = "pulsarstate-tests"
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    done = subprocess.run(
        [AIRFLOW_BIN, "dags", "test", dag_id, "--conf", json.dumps(conf)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    with create_session() as session:
        run = session.scalars(select(DagRun).where(DagRun.dag_id == dag_id).order_by(DagRun.id.desc()).limit(1)).one()
        states = {ti.task_id: str(ti.state) for ti in run.get_task_instances(session=session)}
        xcoms = {
            row.task_id: XComModel.deserialize_value(row)
            for row in session.scalars(XComModel.get_many(run_id=run.run_id, dag_ids=dag_id, key="return_value"))
        }
        result = SimpleNamespace(
            state=str(run.state), states=states, xcoms=xcoms, output=done.stdout[-3000:] + done.stderr[-3000:]
        )
    print(f"airflow dags test {dag_id}: rc {done.returncode}, {result.state} {states}")
    return result


def _events(path: Path, job: str) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    events = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [e for e in events if e["job"]["name"] == job]


def _datasets(event: dict[str, Any], kind: str) -> dict[tuple[str, str], dict[str, Any]]:
    return {(d["namespace"], d["name"]): d for d in event.get(kind) or []}


def _namespace(state_backend: str) -> str:
    import os

    from airflow_provider_pulsarstate.assets.uri import lineage_namespace
    from airflow_provider_pulsarstate.engine.config import ConnectionConfig, default_embedded_path

    if state_backend == "embedded":
        return lineage_namespace(ConnectionConfig(url=str(default_embedded_path())))
    extra = json.loads(os.environ["AIRFLOW_CONN_PULSARSTATE_DEFAULT"])["extra"]
    return lineage_namespace(ConnectionConfig(url=extra["service_url"]))


def test_apply_reports_the_consumed_offsets_and_the_published_counts(
    openlineage_file: Path, state_backend: str
) -> None:
    table, source = f"lin-table-{uuid.uuid4().hex[:8]}", f"lin-events-{uuid.uuid4().hex[:8]}"
    before = len(_events(openlineage_file, "lineage_apply.apply_view"))
    run = run_real(
        openlineage_file,
        "lineage_apply",
        {
            "table_topic": table,
            "source_topic": source,
            "rows": {"sku-1": {"p": 1}, "sku-2": {"p": 2}, "sku-3": {"p": 3}},
            "ranges": {"0": [0, 40], "1": [0, 25]},
        },
    )
    assert run.state == "success", (run.states, run.output)
    events = _events(openlineage_file, "lineage_apply.apply_view")[before:]
    assert [e["eventType"] for e in events] == ["START", "COMPLETE"]
    complete = events[1]
    ns = _namespace(state_backend)
    table_name, source_name = f"persistent://public/default/{table}", f"persistent://public/default/{source}"
    inputs, outputs = _datasets(complete, "inputs"), _datasets(complete, "outputs")
    assert set(inputs) == {(ns, source_name), (ns, table_name)}
    assert inputs[(ns, source_name)]["inputFacets"]["pulsarOffsetRanges"]["ranges"] == [
        {"partition": 0, "start": 0, "next": 40},
        {"partition": 1, "start": 0, "next": 25},
    ]
    assert set(outputs) == {(ns, table_name)}
    facets = outputs[(ns, table_name)]["outputFacets"]
    assert facets["outputStatistics"]["rowCount"] == 3
    commit = facets["pulsarTableCommit"]
    result = run.xcoms["apply_view"]
    assert (commit["set"], commit["delete"], commit["unchanged"]) == (3, 0, 0)
    assert (commit["commitOffset"], commit["viewId"]) == (result["commit_offset"], result["view_id"])

    create = _events(openlineage_file, "lineage_apply.create_view")[-1]
    assert create["eventType"] == "COMPLETE"
    assert set(_datasets(create, "inputs")) == {(ns, table_name)} and not create.get("outputs")


def test_a_failed_apply_reports_the_table_without_counts(openlineage_file: Path, state_backend: str) -> None:
    table = f"lin-fail-{uuid.uuid4().hex[:8]}"
    before = len(_events(openlineage_file, "lineage_apply.apply_view"))
    run = run_real(
        openlineage_file,
        "lineage_apply",
        {"table_topic": table, "rows": {"sku-1": {"p": 1}}, "bad_view_id": "no-such-view"},
    )
    assert run.states["apply_view"] == "failed"
    events = _events(openlineage_file, "lineage_apply.apply_view")[before:]
    assert [e["eventType"] for e in events] == ["START", "FAIL"]
    ns = _namespace(state_backend)
    outputs = _datasets(events[1], "outputs")
    assert set(outputs) == {(ns, f"persistent://public/default/{table}")}
    assert not outputs[(ns, f"persistent://public/default/{table}")].get("outputFacets")


def test_installed_but_disabled_openlineage_records_nothing() -> None:
    from airflow.providers.openlineage import conf as openlineage_conf

    from airflow_provider_pulsarstate.lineage.facets import openlineage_available

    assert openlineage_conf.is_disabled()  # the session configures no transport
    assert not openlineage_available()


def test_without_the_openlineage_provider_nothing_is_recorded(tmp_path: Path) -> None:
    """In a fresh interpreter where the provider cannot be imported: the operator records nothing."""
    import subprocess

    code = (
        "import sys\n"
        "from airflow_provider_pulsarstate.lineage.facets import openlineage_available\n"
        "from airflow_provider_pulsarstate.operators.views import ApplyTempViewOperator\n"
        "from airflow_provider_pulsarstate.engine.config import ConnectionConfig\n"
        "op = ApplyTempViewOperator(task_id='a', table_topic='t', view_id='v')\n"
        "assert openlineage_available()\n"
        # uninstalled, as far as imports go (Airflow's provider discovery already ran)
        "for name in [m for m in sys.modules if m.startswith('airflow.providers.openlineage')]: del sys.modules[name]\n"
        "sys.modules['airflow.providers.openlineage'] = None\n"
        "assert not openlineage_available()\n"
        "assert op.start_lineage(ConnectionConfig()) is None\n"
        "assert op.get_openlineage_facets_on_complete(None) is None\n"
        "assert op.get_openlineage_facets_on_failure(None) is None\n"
        "print('ok')\n"
    )
    import os

    env = os.environ.copy()
    env["AIRFLOW__OPENLINEAGE__TRANSPORT"] = json.dumps({"type": "console"})
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-2000:]


def test_the_offset_sensor_and_the_commit_report_the_ranges_they_saw(
    openlineage_file: Path, state_backend: str
) -> None:
    table, source = f"lin-otable-{uuid.uuid4().hex[:8]}", f"lin-oevents-{uuid.uuid4().hex[:8]}"
    run = run_real(openlineage_file, "lineage_offsets", {"table_topic": table, "source_topic": source, "events": 30})
    assert run.state == "success", (run.states, run.output)
    end = run.xcoms["publish"]
    assert sum(end.values()) >= 30
    ns = _namespace(state_backend)
    table_name, source_name = f"persistent://public/default/{table}", f"persistent://public/default/{source}"
    whole = [{"partition": int(p), "start": 0, "next": o} for p, o in sorted(end.items())]

    def complete(task_id: str) -> dict[str, Any]:
        # this run's: the last one of the task (runs are sequential, topics unique per run)
        return [e for e in _events(openlineage_file, f"lineage_offsets.{task_id}") if e["eventType"] == "COMPLETE"][-1]

    sensor = complete("wait_for_events")
    assert set(_datasets(sensor, "inputs")) == {(ns, source_name)} and not sensor.get("outputs")
    assert _datasets(sensor, "inputs")[(ns, source_name)]["inputFacets"]["pulsarOffsetRanges"]["ranges"] == whole

    commit = complete("commit_offsets")
    inputs = _datasets(commit, "inputs")
    assert set(inputs) == {(ns, source_name), (ns, table_name)} and not commit.get("outputs")
    assert inputs[(ns, source_name)]["inputFacets"]["pulsarOffsetRanges"]["ranges"] == whole

    apply = complete("apply_view")
    assert _datasets(apply, "inputs")[(ns, source_name)]["inputFacets"]["pulsarOffsetRanges"]["ranges"] == whole
    assert _datasets(apply, "outputs")[(ns, table_name)]["outputFacets"]["outputStatistics"]["rowCount"] == len(end)


def test_a_task_using_the_hook_directly_reports_the_topics_it_read_and_wrote(
    openlineage_file: Path, state_backend: str
) -> None:
    source, target = f"lin-hin-{uuid.uuid4().hex[:8]}", f"lin-hout-{uuid.uuid4().hex[:8]}"
    run = run_real(openlineage_file, "lineage_hook_task", {"source_topic": source, "target_topic": target})
    assert run.state == "success" and run.xcoms["copy_messages"] == 5, run.states
    event = [e for e in _events(openlineage_file, "lineage_hook_task.copy_messages") if e["eventType"] == "COMPLETE"][
        -1
    ]
    ns = _namespace(state_backend)
    source_name, target_name = f"persistent://public/default/{source}", f"persistent://public/default/{target}"
    assert set(_datasets(event, "inputs")) == {(ns, source_name)}
    assert set(_datasets(event, "outputs")) == {(ns, source_name), (ns, target_name)}


def test_the_spark_view_job_reports_the_table_and_source_it_reads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The recorded lineage of the Spark task, from its rendered arguments (no Spark run here:
    the example pipeline's runs cover the job itself)."""
    from airflow_provider_pulsarstate.engine.config import ConnectionConfig
    from airflow_provider_pulsarstate.lineage.facets import RunLineage
    from airflow_provider_pulsarstate.lineage.operators import record_job_arguments

    config = ConnectionConfig(url="pulsar://127.0.0.1:36847")
    lineage = RunLineage(config=config)
    record_job_arguments(
        lineage,
        config,
        [
            "--view-id",
            "v1",
            "--table-topic",
            "persistent://public/default/prices",
            "--config-json",
            "{}",
            "--source-topic",
            "events",
            "--version",
            "2",
        ],
    )
    facets = lineage.to_openlineage()
    assert {(d.namespace, d.name) for d in facets.inputs} == {
        ("pulsar://127.0.0.1:36847", "persistent://public/default/events"),
        ("pulsar://127.0.0.1:36847", "persistent://public/default/prices"),
    }
    assert facets.outputs == []


SPARK_LOCAL = json.dumps({"conn_type": "spark", "host": "local[*]"})


def test_the_guarded_spark_job_reports_its_topics_and_the_spark_run_names_the_task_as_parent(
    openlineage_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A real spark-submit under a lease (embedded back end): the task's events list the declared
    topics, and with ``[openlineage] spark_inject_parent_job_info`` the job is submitted with the
    parent run properties the OpenLineage Spark integration reads (the job writes them back)."""
    monkeypatch.delenv("AIRFLOW_CONN_PULSARSTATE_DEFAULT", raising=False)
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", SPARK_LOCAL)
    monkeypatch.setenv("AIRFLOW__OPENLINEAGE__SPARK_INJECT_PARENT_JOB_INFO", "True")
    source, table = f"lin-sin-{uuid.uuid4().hex[:8]}", f"lin-sout-{uuid.uuid4().hex[:8]}"
    out = tmp_path / "spark-openlineage.json"
    run = run_real(
        openlineage_file,
        "lineage_guarded_spark",
        {
            "source_topic": source,
            "table_topic": table,
            "lease_name": f"lin-lease-{uuid.uuid4().hex[:8]}",
            "out": str(out),
        },
    )
    assert run.state == "success", (run.states, run.output)
    events = _events(openlineage_file, "lineage_guarded_spark.spark_job")
    assert [e["eventType"] for e in events] == ["START", "COMPLETE"]
    complete = events[1]
    ns = _namespace("embedded")
    assert set(_datasets(complete, "inputs")) == {(ns, f"persistent://public/default/{source}")}
    assert set(_datasets(complete, "outputs")) == {(ns, f"persistent://public/default/{table}")}

    props = json.loads(out.read_text())
    assert props["spark.openlineage.parentJobNamespace"] == "pulsarstate-tests"
    assert props["spark.openlineage.parentJobName"] == "lineage_guarded_spark.spark_job"
    assert props["spark.openlineage.parentRunId"] == complete["run"]["runId"]
    assert props["spark.openlineage.rootParentJobName"] == "lineage_guarded_spark"
    parent = complete["run"]["facets"]["parent"]
    assert props["spark.openlineage.rootParentRunId"] == parent["root"]["run"]["runId"]


def test_the_view_spark_operator_keeps_the_injected_parent_properties_with_a_token(
    env_connection: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With a token the operator checks the spark-submit command before submitting; the hook it
    builds for that check must not be the one that submits (it predates the injected properties)."""
    from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook
    from airflow.providers.apache.spark.operators import spark_submit as provider_module

    from airflow_provider_pulsarstate.operators.spark_submit import ViewSparkSubmitOperator

    env_connection("pulsarstate_default", extra={"service_url": "pulsar://127.0.0.1:1", "auth_token": "tok-123"})
    env_connection("spark_default", conn_type="spark", host="local[*]")
    injected = {"spark.openlineage.parentRunId": "0192-parent", "spark.openlineage.parentJobName": "d.t"}
    monkeypatch.setattr(
        provider_module,
        "inject_parent_job_information_into_spark_properties",
        lambda properties, context: {**properties, **injected},
    )
    submitted: list[dict[str, Any]] = []
    monkeypatch.setattr(
        SparkSubmitHook, "submit", lambda self, application="", **kw: submitted.append(dict(self._conf))
    )
    op = ViewSparkSubmitOperator(
        task_id="spark_job",
        application="job.py",
        conf={"spark.ui.enabled": "false"},
        openlineage_inject_parent_job_info=True,
    )
    op.execute({})  # type: ignore[arg-type]
    assert submitted == [{"spark.ui.enabled": "false", **injected}]
