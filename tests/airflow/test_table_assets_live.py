"""A DAG scheduled on a state table's asset runs once per apply that published something, with a
real ``airflow scheduler``, ``dag-processor`` and ``api-server`` (LocalExecutor, SQLite), on both
back ends (embedded: the default, no connection at all; Pulsar: the session broker).

``table_assets_apply`` (tests/airflow/dags/asset_test_dags.py) stages ``params.rows`` as the table's
whole content and applies it; ``table_assets_downstream`` is scheduled on
``Asset("pulsar://public/default/<table>")`` and returns the extras of the events that triggered it.
Three applies: new rows (an event, a run), the same rows again (nothing published: no event, no
run), one row fewer (an event, a run).

The OpenLineage provider is enabled with its file transport in these processes: the apply's
COMPLETE event, emitted from the listener's forked process of a real worker, names the table with
the connection's namespace (the ``pulsar://`` converter reads it from the asset, not from a
connection lookup, which cannot be answered in that forked process).
"""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_pulsarstate.assets.uri import lineage_namespace
from airflow_provider_pulsarstate.engine.config import ConnectionConfig
from airflow_provider_pulsarstate.testing.airflow_processes import AirflowProcesses
from tests.airflow.dagruns import TEST_DAGS

APPLY, DOWNSTREAM = "table_assets_apply", "table_assets_downstream"


def _wait(predicate: Any, what: str, af: AirflowProcesses, timeout: float = 240) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := predicate():
            return value
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}\n--- scheduler:\n{af.tail('scheduler')}")


def _apply(af: AirflowProcesses, rows: dict[str, Any]) -> dict[str, Any]:
    run_id = af.trigger(APPLY, conf={"rows": rows})
    state = af.wait_for_run(APPLY, run_id, timeout=300)
    assert state == "success", (af.task_instances(APPLY, run_id), af.tail("scheduler"))
    result = af.xcom(APPLY, run_id, "apply_view")
    assert isinstance(result, dict), result
    return result


def _downstream_runs(af: AirflowProcesses) -> list[dict[str, Any]]:
    return [r for r in af.runs(DOWNSTREAM) if r["state"] in ("success", "failed")]


@pytest.mark.parametrize("back_end", ["embedded", pytest.param("pulsar", marks=pytest.mark.pulsar)])
def test_a_dag_scheduled_on_the_table_runs_once_per_apply_that_published(
    tmp_path: Path, back_end: str, request: pytest.FixtureRequest, migrated_db: Path
) -> None:
    table = f"asset-live-{uuid.uuid4().hex[:8]}"  # the session broker outlives this test
    dags = tmp_path / "dags"
    dags.mkdir()
    source = (TEST_DAGS / "asset_test_dags.py").read_text()
    assert 'TABLE_TOPIC = "asset-test-prices"' in source
    (dags / "asset_test_dags.py").write_text(source.replace('"asset-test-prices"', f'"{table}"'))
    home = tmp_path / "airflow"
    (home / "pulsarstate").mkdir(parents=True, mode=0o700)
    events_file = tmp_path / "openlineage.jsonl"
    env = {
        "AIRFLOW__OPENLINEAGE__TRANSPORT": json.dumps(
            {"type": "file", "log_file_path": str(events_file), "append": True}
        ),
        "AIRFLOW__OPENLINEAGE__NAMESPACE": "pulsarstate-live",
    }
    if back_end == "pulsar":
        broker = request.getfixturevalue("pulsar_broker")
        extra = {"service_url": broker.service_url, "admin_url": broker.admin_url, "operation_timeout": 30}
        env["AIRFLOW_CONN_PULSARSTATE_DEFAULT"] = json.dumps({"conn_type": "pulsarstate", "extra": extra})
        namespace = lineage_namespace(ConnectionConfig(url=broker.service_url))
    else:  # no connection: the tasks use $AIRFLOW_HOME/pulsarstate/state.db
        namespace = lineage_namespace(ConnectionConfig(url=str(home / "pulsarstate" / "state.db")))
    components = ("api-server", "scheduler", "dag-processor")
    with AirflowProcesses(home=home, dags_folder=dags, env=env, components=components, metadata_db=migrated_db) as af:
        af.wait_for_dag(APPLY)
        af.wait_for_dag(DOWNSTREAM)

        first = _apply(af, {"sku-1": {"price": 1}, "sku-2": {"price": 2}})
        assert (first["set"], first["delete"]) == (2, 0)
        (run1,) = _wait(lambda: _downstream_runs(af) or None, "the downstream run of the first apply", af)
        assert run1["state"] == "success" and run1["run_type"] == "asset_triggered", run1

        again = _apply(af, {"sku-1": {"price": 1}, "sku-2": {"price": 2}})
        assert (again["set"], again["delete"], again["unchanged"]) == (0, 0, 2)

        fewer = _apply(af, {"sku-1": {"price": 1}})
        assert (fewer["set"], fewer["delete"]) == (0, 1)
        _wait(lambda: len(_downstream_runs(af)) >= 2, "the downstream run of the third apply", af)
        time.sleep(5)  # scheduler loops at 1 s: a run for the empty apply would show by now
        runs = _downstream_runs(af)
        assert [r["state"] for r in runs] == ["success", "success"], runs
        seen = [af.xcom(DOWNSTREAM, r["dag_run_id"], "read_events") for r in runs]
        full = f"persistent://public/default/{table}"
        assert [[(e["table"], e["commit_offset"], e["set"], e["delete"]) for e in events] for events in seen] == [
            [(full, first["commit_offset"], 2, 0)],
            [(full, fewer["commit_offset"], 0, 1)],
        ]

    # the lineage of the three applies, written by the real workers' OpenLineage listener
    events = [json.loads(line) for line in events_file.read_text().splitlines() if line.strip()]
    completes = [e for e in events if e["job"]["name"] == f"{APPLY}.apply_view" and e["eventType"] == "COMPLETE"]
    assert len(completes) == 3, [(e["job"]["name"], e["eventType"]) for e in events]
    for event in completes:
        assert {(d["namespace"], d["name"]) for d in event["outputs"]} == {(namespace, full)}, event["outputs"]
