"""OpenLineage events of real runs: the file transport's events read back, START/COMPLETE/FAIL.

The OpenLineage provider's listener runs in the task process of ``dag.test()``; its file transport
appends one JSON event a line. Without the provider the operators record nothing (the guard test).
"""

from __future__ import annotations

import json
import sys
import uuid
from pathlib import Path
from typing import Any, Iterator

import pytest

from tests.airflow.dagruns import TEST_DAGS, load_dag, run_dag

pytest.importorskip("airflow.providers.openlineage", reason="needs apache-airflow-providers-openlineage (test extra)")


def _clear_openlineage_caches() -> None:
    from airflow.providers.openlineage import conf as ol_conf
    from airflow.providers.openlineage.plugins import listener as ol_listener

    for value in vars(ol_conf).values():
        if hasattr(value, "cache_clear"):
            value.cache_clear()
    ol_listener._openlineage_listener = None  # type: ignore[attr-defined]


@pytest.fixture(scope="module")
def openlineage_file(airflow_db: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    path = tmp_path_factory.mktemp("openlineage") / "events.jsonl"
    bundles = [{
        "name": "pulsarstate-test-dags",
        "classpath": "airflow.dag_processing.bundles.local.LocalDagBundle",
        "kwargs": {"path": str(TEST_DAGS), "refresh_interval": 0},
    }]
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("AIRFLOW__DAG_PROCESSOR__DAG_BUNDLE_CONFIG_LIST", json.dumps(bundles))
        patch.setenv("AIRFLOW__OPENLINEAGE__TRANSPORT", json.dumps({"type": "file", "log_file_path": str(path), "append": True}))
        patch.setenv("AIRFLOW__OPENLINEAGE__NAMESPACE", "pulsarstate-tests")
        _clear_openlineage_caches()
        try:
            yield path
        finally:
            patch.undo()
            _clear_openlineage_caches()


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


def test_apply_reports_the_consumed_offsets_and_the_published_counts(openlineage_file: Path, state_backend: str) -> None:
    dag = load_dag(TEST_DAGS / "lineage_test_dags.py", "lineage_apply")
    table, source = f"lin-table-{uuid.uuid4().hex[:8]}", f"lin-events-{uuid.uuid4().hex[:8]}"
    before = len(_events(openlineage_file, "lineage_apply.apply_view"))
    run = run_dag(dag, {
        "table_topic": table, "source_topic": source,
        "rows": {"sku-1": {"p": 1}, "sku-2": {"p": 2}, "sku-3": {"p": 3}},
        "ranges": {"0": [0, 40], "1": [0, 25]},
    })
    assert run.state == "success", run.states
    events = _events(openlineage_file, "lineage_apply.apply_view")[before:]
    assert [e["eventType"] for e in events] == ["START", "COMPLETE"]
    complete = events[1]
    ns = _namespace(state_backend)
    table_name, source_name = f"persistent://public/default/{table}", f"persistent://public/default/{source}"
    inputs, outputs = _datasets(complete, "inputs"), _datasets(complete, "outputs")
    assert set(inputs) == {(ns, source_name), (ns, table_name)}
    assert inputs[(ns, source_name)]["inputFacets"]["pulsarOffsetRanges"]["ranges"] == [
        {"partition": 0, "start": 0, "next": 40}, {"partition": 1, "start": 0, "next": 25},
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
    dag = load_dag(TEST_DAGS / "lineage_test_dags.py", "lineage_apply")
    table = f"lin-fail-{uuid.uuid4().hex[:8]}"
    before = len(_events(openlineage_file, "lineage_apply.apply_view"))
    run = run_dag(dag, {"table_topic": table, "rows": {"sku-1": {"p": 1}}, "bad_view_id": "no-such-view"})
    assert run.states["apply_view"] == "failed"
    events = _events(openlineage_file, "lineage_apply.apply_view")[before:]
    assert [e["eventType"] for e in events] == ["START", "FAIL"]
    ns = _namespace(state_backend)
    outputs = _datasets(events[1], "outputs")
    assert set(outputs) == {(ns, f"persistent://public/default/{table}")}
    assert not outputs[(ns, f"persistent://public/default/{table}")].get("outputFacets")


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

    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=os.environ.copy())
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-2000:]


def test_the_offset_sensor_and_the_commit_report_the_ranges_they_saw(openlineage_file: Path, state_backend: str) -> None:
    dag = load_dag(TEST_DAGS / "lineage_test_dags.py", "lineage_offsets")
    table, source = f"lin-otable-{uuid.uuid4().hex[:8]}", f"lin-oevents-{uuid.uuid4().hex[:8]}"
    run = run_dag(dag, {"table_topic": table, "source_topic": source, "events": 30})
    assert run.state == "success", run.states
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


def test_a_task_using_the_hook_directly_reports_the_topics_it_read_and_wrote(openlineage_file: Path, state_backend: str) -> None:
    from airflow.sdk.lineage import get_hook_lineage_collector

    get_hook_lineage_collector.cache_clear()  # built before the OpenLineage reader was enabled
    dag = load_dag(TEST_DAGS / "lineage_test_dags.py", "lineage_hook_task")
    source, target = f"lin-hin-{uuid.uuid4().hex[:8]}", f"lin-hout-{uuid.uuid4().hex[:8]}"
    run = run_dag(dag, {"source_topic": source, "target_topic": target})
    assert run.state == "success" and run.xcoms["copy_messages"] == 5, run.states
    event = [e for e in _events(openlineage_file, "lineage_hook_task.copy_messages") if e["eventType"] == "COMPLETE"][-1]
    ns = _namespace(state_backend)
    source_name, target_name = f"persistent://public/default/{source}", f"persistent://public/default/{target}"
    assert set(_datasets(event, "inputs")) == {(ns, source_name)}
    assert set(_datasets(event, "outputs")) == {(ns, source_name), (ns, target_name)}
