"""The provider as a user deploys it: the built wheel in a brand-new venv beside Airflow 3.3, the four
Airflow components started from that venv, the connection created through the REST API, the example
pipeline triggered through the REST API (not ``dag.test()``) with the XCom and state-store backends
configured, and the table it leaves checked against the plain-Python fold.

Nothing here imports the checkout into the deployment: the venv imports the installed wheel only
(PYTHONPATH cleared), and only the DAG files come from the checkout, as a user's DAG folder would.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path
from typing import Any

import pytest
import requests

from airflow_provider_pulsarstate.testing.airflow_processes import AirflowProcesses

ROOT = Path(__file__).resolve().parent.parent.parent
PACKAGE = "airflow_provider_pulsarstate"
DAG_ID = "price_events_pipeline"
EVENTS, SKUS = 2_000, 5_000

pytestmark = [pytest.mark.deployment, pytest.mark.slow]


def _uv() -> str:
    beside = Path(sys.executable).with_name("uv")
    found = str(beside) if beside.exists() else shutil.which("uv")
    assert found, "uv is needed to build and install the wheel (pip install uv)"
    return found


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A brand-new venv with the built wheel (and its [spark] extra: the pipeline runs spark-submit)
    beside ``apache-airflow==3.3.*``, at the versions of the repository's lock."""
    src = tmp_path_factory.mktemp("src")
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, src / name)
    shutil.copytree(ROOT / PACKAGE, src / PACKAGE, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    dist = tmp_path_factory.mktemp("dist")
    subprocess.run([_uv(), "build", "--wheel", "--quiet", "--out-dir", str(dist), str(src)], check=True, timeout=300)
    (wheel,) = dist.glob("*.whl")
    target = tmp_path_factory.mktemp("deployment") / "venv"
    subprocess.run([_uv(), "venv", "--quiet", "--python", sys.executable, str(target)], check=True, timeout=300)
    subprocess.run(
        [_uv(), "pip", "install", "--quiet", "--python", str(target / "bin" / "python"),
         "-c", str(ROOT / "requirements" / "test.lock"),
         f"airflow-provider-pulsarstate[spark] @ {wheel.as_uri()}", "apache-airflow==3.3.*"],
        check=True, timeout=900,
    )
    return target


def _read_table(venv: Path, config: dict[str, str], table_topic: str) -> dict[str, Any]:
    """The table's committed rows, read by the deployment's own install."""
    script = textwrap.dedent(
        """
        import json, sys
        from airflow_provider_pulsarstate import ConnectionConfig, open_backend
        from airflow_provider_pulsarstate.engine.recipes.table import StateTable

        config = ConnectionConfig(**json.loads(sys.argv[1]))
        backend = open_backend(config)
        try:
            with StateTable(backend, config.topic_name(sys.argv[2])) as table:
                rows = table.to_dict(latest=True)
        finally:
            backend.close()
        print(json.dumps({key: dict(value) for key, value in rows.items()}))
        """
    )
    result = subprocess.run(
        [str(venv / "bin" / "python"), "-c", script, json.dumps(config), table_topic],
        env={**os.environ, "PYTHONPATH": ""}, capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def _create_and_test_connection(api_url: str, typed: dict[str, str]) -> None:
    """``pulsarstate_default`` as the UI saves it: the form's defaults (from the hook metadata the
    form is built from) plus what the user typed, created and then tested through the REST API."""
    meta = requests.get(api_url + "/ui/connections/hook_meta", timeout=30)
    assert meta.status_code == 200, meta.text
    (entry,) = [e for e in meta.json() if e["connection_type"] == "pulsarstate"]
    form = {name: spec["value"] for name, spec in entry["extra_fields"].items()}
    body = {"connection_id": "pulsarstate_default", "conn_type": "pulsarstate", "extra": json.dumps({**form, **typed})}
    created = requests.post(api_url + "/api/v2/connections", json=body, timeout=30)
    assert created.status_code == 201, created.text
    tested = requests.post(api_url + "/api/v2/connections/test", json=body, timeout=120)
    assert tested.status_code == 200 and tested.json()["status"] is True, tested.text


def _fold(batches: int) -> dict[str, Any]:
    import importlib.util

    spec = importlib.util.spec_from_file_location("price_events_job", ROOT / "dags" / "jobs" / "price_events_job.py")
    assert spec is not None and spec.loader is not None
    job = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(job)
    table = None
    for batch in range(1, batches + 1):
        table = job.fold(job.batch_events(batch, EVENTS, SKUS), table)
    return json.loads(json.dumps(table))


@pytest.mark.parametrize("backend", ["embedded", pytest.param("pulsar", marks=pytest.mark.pulsar)])
def test_the_example_pipeline_runs_in_a_fresh_deployment(venv: Path, tmp_path: Path, backend: str,
                                                         request: pytest.FixtureRequest) -> None:
    home = tmp_path / "airflow"
    typed: dict[str, str] = {}  # what a user types into the form; everything else keeps its default
    if backend == "pulsar":
        broker = request.getfixturevalue("pulsar_broker")
        typed = {"service_url": broker.service_url, "admin_url": broker.admin_url}
        read_config = {"url": broker.service_url, "admin_url": broker.admin_url}
    else:  # the embedded default: an empty service_url, the log under AIRFLOW_HOME
        read_config = {"url": str(home / "pulsarstate" / "state.db")}
    env = {
        "PYTHONPATH": "",  # the installed wheel, never the checkout
        "AIRFLOW__CORE__XCOM_BACKEND": "airflow_provider_pulsarstate.xcom.backend.PulsarXComBackend",
        "AIRFLOW__STATE_STORE__BACKEND": "airflow_provider_pulsarstate.state_store.backend.PulsarStateStoreBackend",
        "AIRFLOW__WORKERS__STATE_STORE_BACKEND": "airflow_provider_pulsarstate.state_store.backend.PulsarStateStoreBackend",
        "AIRFLOW__CORE__TEST_CONNECTION": "Enabled",
        "AIRFLOW_CONN_SPARK_DEFAULT": '{"conn_type": "spark", "host": "local[*]"}',
    }
    suffix = uuid.uuid4().hex[:8]  # one broker serves the whole session
    names = {"events_topic": f"deploy-events-{suffix}", "table_topic": f"deploy-table-{suffix}", "subscription": "deploy-ingest"}
    with AirflowProcesses(home=home, dags_folder=ROOT / "dags", env=env, airflow=venv / "bin" / "airflow",
                          start_timeout=300) as af:
        _create_and_test_connection(af.api_url, typed)
        af.wait_for_dag(DAG_ID, timeout=300)
        for batch in (1, 2):
            run_id = af.trigger(DAG_ID, conf={"batch": batch, "events": EVENTS, "skus": SKUS, **names})
            state = af.wait_for_run(DAG_ID, run_id, timeout=900)
            assert state == "success", (
                f"batch {batch}: {state}; tasks: "
                + ", ".join(f"{t['task_id']}={t['state']}" for t in af.task_instances(DAG_ID, run_id))
                + "\n" + af.tail("scheduler")
            )
    rows = _read_table(venv, read_config, names["table_topic"])
    assert rows == _fold(2)
