"""The provider as a user deploys it, on the embedded default and on the test broker.

The built wheel (with ``[spark]``: the example pipeline runs spark-submit) in a brand-new venv
beside ``apache-airflow==3.3.*``; api-server, scheduler, dag-processor and triggerer started from
that venv (LocalExecutor, SQLite, loopback ports, logins on); ``pulsarstate_default`` created
through the REST API behind the connection form, from the form's own defaults, and tested there;
the XCom and state-store backends configured; ``price_events_pipeline`` triggered through the REST
API; then the table and the XCom values read back with that venv's
``airflow pulsarstate table-show`` / ``xcom-show`` and compared with the plain-Python fold.

Nothing imports the checkout into the deployment: the venv imports the installed wheel only
(PYTHONPATH cleared); only the DAG files come from the checkout, as a user's DAG folder would.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_pulsarstate.testing.airflow_processes import AirflowProcesses

ROOT = Path(__file__).resolve().parent.parent.parent
PACKAGE = "airflow_provider_pulsarstate"
DAG_ID = "price_events_pipeline"
EVENTS, SKUS = 2_000, 5_000
BATCHES = (1,)  # one Spark run per back end: batch 2 after 1 is tests/airflow/test_ingest_pipeline.py's
USER, PASSWORD = "admin", "deploy-" + uuid.uuid4().hex
PROVIDER_ENV = {
    "AIRFLOW__CORE__XCOM_BACKEND": "airflow_provider_pulsarstate.xcom.backend.PulsarXComBackend",
    "AIRFLOW__STATE_STORE__BACKEND": "airflow_provider_pulsarstate.state_store.backend.PulsarStateStoreBackend",
    "AIRFLOW__WORKERS__STATE_STORE_BACKEND": "airflow_provider_pulsarstate.state_store.backend.PulsarStateStoreBackend",
    "AIRFLOW__CORE__TEST_CONNECTION": "Enabled",
    "AIRFLOW_CONN_SPARK_DEFAULT": '{"conn_type": "spark", "host": "local[*]"}',
}
# the wheel is built and installed, the DB migrated, four components started and a Spark job run
# Both back ends on one xdist worker: the venv (a module fixture) is then built once.
pytestmark = [
    pytest.mark.deployment,
    pytest.mark.slow,
    pytest.mark.timeout(1800),
    pytest.mark.xdist_group("deployment-venv"),
]


def _uv() -> str:
    beside = Path(sys.executable).with_name("uv")
    found = str(beside) if beside.exists() else shutil.which("uv")
    assert found, "uv is needed to build and install the wheel (pip install uv)"
    return found


def _step(message: str) -> None:
    print(f"[deployment {time.strftime('%H:%M:%S')}] {message}", flush=True)


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A brand-new venv with the built wheel and its [spark] extra beside ``apache-airflow==3.3.*``,
    at the versions of the repository's lock (shared by both back ends: built once)."""
    started = time.monotonic()
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
        [
            _uv(),
            "pip",
            "install",
            "--quiet",
            "--compile-bytecode",  # as pip does by default: no Airflow process compiles its imports
            "--python",
            str(target / "bin" / "python"),
            "-c",
            str(ROOT / "requirements" / "test.lock"),
            f"airflow-provider-pulsarstate[spark] @ {wheel.as_uri()}",
            "apache-airflow==3.3.*",
        ],
        check=True,
        timeout=900,
    )
    _step(f"venv with {wheel.name} ready in {time.monotonic() - started:.0f}s")
    return target


def _job() -> Any:
    spec = importlib.util.spec_from_file_location("price_events_job", ROOT / "dags" / "jobs" / "price_events_job.py")
    assert spec is not None and spec.loader is not None
    job = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(job)
    return job


def _pulsarstate(af: AirflowProcesses, *args: str) -> Any:
    """``airflow pulsarstate ARGS`` of the deployment's venv, on its metadata DB; its JSON answer."""
    result = subprocess.run([af.airflow, "pulsarstate", *args], env=af.env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, (
        f"airflow pulsarstate {' '.join(args)}:\n{result.stdout[-2000:]}\n{result.stderr[-3000:]}"
    )
    return json.loads(result.stdout.strip().splitlines()[-1])


def _failure_report(af: AirflowProcesses, run_id: str) -> str:
    """Task states, the ends of the task logs of the run and of every component's log."""
    parts = [", ".join(f"{t['task_id']}={t['state']}" for t in af.task_instances(DAG_ID, run_id))]
    logs = sorted((af.home / "logs").glob(f"dag_id={DAG_ID}/run_id={run_id}/**/*.log"))
    parts += [f"--- task log {p.relative_to(af.home)}:\n{p.read_text(errors='replace')[-3000:]}" for p in logs]
    parts += [
        f"--- {component}:\n{af.tail(component)}"
        for component in ("scheduler", "triggerer", "dag-processor", "api-server")
    ]
    return "\n".join(parts)


def _run(af: AirflowProcesses, conf: dict[str, Any], *, timeout: float = 900) -> str:
    """Trigger one run through the REST API and wait for it, printing task states as they change."""
    run_id = af.trigger(DAG_ID, conf=conf)
    started, shown = time.monotonic(), [""]

    def finished() -> str | None:
        state = af.run_state(DAG_ID, run_id)
        tasks = " ".join(f"{t['task_id']}={t['state']}" for t in af.task_instances(DAG_ID, run_id) if t["state"])
        if tasks != shown[0]:
            shown[0] = tasks
            _step(f"{run_id} {state} after {time.monotonic() - started:.0f}s: {tasks}")
        return state if state in ("success", "failed") else None

    state = af._wait(finished, f"run {run_id} to finish", timeout)
    assert state == "success", f"batch {conf['batch']}: {state}\n{_failure_report(af, run_id)}"
    return run_id


def _create_connection(af: AirflowProcesses, overrides: dict[str, Any]) -> dict[str, Any]:
    """``pulsarstate_default`` as the form saves it: the form's defaults, ``overrides`` typed in;
    then the form's Test button. Returns the test's answer."""
    meta = af.send("GET", "/ui/connections/hook_meta")
    (entry,) = [e for e in meta if e["connection_type"] == "pulsarstate"]
    form = {name: spec["value"] for name, spec in entry["extra_fields"].items()}
    assert "***" not in form.values(), form
    form.update(overrides)
    body = {"connection_id": "pulsarstate_default", "conn_type": "pulsarstate", "extra": json.dumps(form)}
    af.send("POST", "/api/v2/connections", body)
    answer = af.send("POST", "/api/v2/connections/test", body, timeout=120)
    assert answer["status"] is True, answer["message"]
    return dict(answer)


@pytest.fixture(params=["embedded", pytest.param("pulsar", marks=pytest.mark.pulsar)])
def form_fields(request: pytest.FixtureRequest) -> dict[str, Any]:
    """What a user types into the connection form: nothing (the embedded default), or the test broker's URLs."""
    if request.param == "embedded":
        return {}
    broker = request.getfixturevalue("pulsar_broker")
    return {"service_url": broker.service_url, "admin_url": broker.admin_url}


def test_the_example_pipeline_runs_in_a_fresh_deployment(
    venv: Path, tmp_path: Path, form_fields: dict[str, Any]
) -> None:
    home = tmp_path / "airflow"
    home.mkdir()
    passwords = tmp_path / "passwords.json"
    passwords.write_text(json.dumps({USER: PASSWORD}))
    env = {
        **PROVIDER_ENV,
        "PYTHONPATH": "",  # the installed wheel, never the checkout
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "False",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": f"{USER}:admin",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(passwords),
    }
    suffix = uuid.uuid4().hex[:8]  # the broker outlives the test: topics of their own
    # Required on workers: task processes see a placeholder for [database] sql_alchemy_conn, so the
    # namespace cannot be derived there (the backends refuse instead of deriving a wrong one).
    env["AIRFLOW__PULSARSTATE__KEY_NAMESPACE"] = f"deploy-{suffix}"
    names = {
        "events_topic": f"deploy-events-{suffix}",
        "table_topic": f"deploy-table-{suffix}",
        "subscription": f"deploy-ingest-{suffix}",
    }
    reports, table = _job().expected_runs(len(BATCHES), EVENTS, SKUS)
    started = time.monotonic()
    af = AirflowProcesses(
        home=home, dags_folder=ROOT / "dags", env=env, airflow=venv / "bin" / "airflow", start_timeout=600
    )
    af.env.pop("AIRFLOW_CONN_PULSARSTATE_DEFAULT", None)  # the connection comes from the form only
    with af:
        _step(f"components up in {time.monotonic() - started:.0f}s (API on {af.api_url})")
        af.login(USER, PASSWORD)
        tested = _create_connection(af, form_fields)
        if form_fields:
            assert form_fields["service_url"] in tested["message"]
        else:  # the Test button of a fresh embedded file: green, and nothing created yet
            assert "will be created" in tested["message"], tested["message"]
            assert not (home / "pulsarstate").exists()
        af.wait_for_dag(DAG_ID, timeout=600)
        run_ids = [_run(af, {"batch": batch, "events": EVENTS, "skus": SKUS, **names}) for batch in BATCHES]

        assert _pulsarstate(af, "table-show", "--topic", names["table_topic"]) == json.loads(json.dumps(table))
        for run_id, batch, expected in zip(run_ids, BATCHES, reports):
            shown = {
                (x["task_id"], x["key"]): x["value"]
                for x in _pulsarstate(af, "xcom-show", "--dag-id", DAG_ID, "--run-id", run_id)
            }
            report = shown[("report", "return_value")]
            fields = [
                name for name in expected if name != "offsets_consumed" or not form_fields
            ]  # Pulsar may skip offsets
            assert {name: report[name] for name in fields} == {name: expected[name] for name in fields}, report
            assert report["batch"] == batch, report
            assert shown[("publish_events", "return_value")]["published"] == EVENTS
            # the REST API (and so the UI) shows the metadata DB's row: a reference to that value
            reference = af.xcom(DAG_ID, run_id, "report")
            assert reference["key"].endswith("/report/-1/return_value") and "__pulsarstate_xcom__" in reference, (
                reference
            )
        _step(f"table and XComs read back with airflow pulsarstate; {time.monotonic() - started:.0f}s in all")
    if not form_fields:
        assert (home / "pulsarstate" / "state.db").exists()  # the embedded default under AIRFLOW_HOME
