"""Leases across the tasks of a DAG: acquire -> guarded tasks -> release, takeovers, contention.

Real ``dag.test()`` runs on SQLite, on both back ends; a real ``spark-submit`` where a Spark job
must be killed. Takeovers are made by the test itself, through its own hook (a thread of the test
process stands in for another deployment while dag.test() runs the tasks in this process).
"""

from __future__ import annotations

import threading
import time
import uuid
from pathlib import Path
from typing import Any
from unittest import mock

import pytest

from airflow_provider_pulsarstate.engine.errors import LeaseLostError
from airflow_provider_pulsarstate.hooks.pulsarstate import PulsarStateHook
from airflow_provider_pulsarstate.operators.leases import LeaseGuardMixin, describe_loss, lease_task_group
from tests.airflow.dagruns import TEST_DAGS, load_dag, run_dag
from tests.airflow.test_views_operators import _seed, _table


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def _marks(marker: Path) -> list[list[str]]:
    return [line.split() for line in marker.read_text().splitlines()] if marker.exists() else []


def _describe(name: str) -> Any:
    with PulsarStateHook() as hook:
        return hook.get_leases().describe(name)


# ---------------------------------------------------------------------------------- one run
def test_acquire_guarded_task_release_in_one_run(dag_bundles: None, state_backend: str, tmp_path: Path) -> None:
    dag = load_dag(TEST_DAGS, "leases_guarded_work")
    lease, marker = _name("lease"), tmp_path / "marks"
    # the work runs 2 ttl (1.5 s): without renewals in the background the lease would expire under it
    run = run_dag(dag, {"lease_name": lease, "marker": str(marker), "seconds": 3.0})
    assert run.state == "success", run.states
    handle = run.xcoms["lease.acquire"]
    assert handle["name"] == lease and handle["token"] >= 1 and handle["ttl"] == 1.5  # the templated ttl, as seconds
    assert handle["holder"].startswith("deployment-a/leases_guarded_work/")  # deployment/dag/run
    # the work checked the lease every 50 ms for 3 s = 2 ttl: held throughout, so renewed at least
    # twice (once per ttl); how many more depends on how busy the CPUs were, not on the operators
    assert run.xcoms["work"]["token"] == handle["token"] and run.xcoms["work"]["renewals"] >= 2
    assert [m[0] for m in _marks(marker)] == ["start", "end"]
    assert run.xcoms["lease.release"] == {"name": lease, "token": handle["token"], "released": True}
    info = _describe(lease)
    assert info is not None and info.holder is None and info.token == handle["token"]

    again = run_dag(dag, {"lease_name": lease, "marker": str(marker)})  # the next run gets a higher token
    assert again.state == "success" and again.xcoms["lease.acquire"]["token"] > handle["token"]


def test_release_runs_when_the_guarded_task_fails(dag_bundles: None, state_backend: str, tmp_path: Path) -> None:
    dag = load_dag(TEST_DAGS, "leases_guarded_work")
    lease = _name("lease")
    run = run_dag(dag, {"lease_name": lease, "marker": str(tmp_path / "marks"), "fail": True})
    assert run.state == "failed", run.states  # the release (a teardown) succeeding does not hide the failure
    assert run.states["work"] == "failed" and run.states["lease.release"] == "success"
    assert run.xcoms["lease.release"]["released"] is True
    assert _describe(lease).holder is None  # free for the next run at once, not after ttl


def test_a_second_deployment_waits_or_times_out_per_its_acquire_timeout(
    dag_bundles: None, state_backend: str, tmp_path: Path
) -> None:
    dag = load_dag(TEST_DAGS, "leases_guarded_work")
    lease, marker = _name("lease"), tmp_path / "marks"
    with PulsarStateHook() as hook:
        leases = hook.get_leases()
        other = leases.acquire(lease, "deployment-b/other-run", ttl=30.0, timeout=5.0)
        # held and valid: a run that may wait 1 s fails at acquire; its guarded task never starts
        run = run_dag(dag, {"lease_name": lease, "marker": str(marker), "timeout": 1})
        assert run.state == "failed", run.states
        assert run.states["lease.acquire"] == "failed" and run.states["work"] == "upstream_failed"
        assert run.states["lease.release"] == "upstream_failed"  # nothing was acquired: the teardown does not run
        assert not marker.exists()
        assert leases.describe(lease).holder == "deployment-b/other-run"  # untouched

        # a run that may wait longer gets it as soon as the holder releases (released 2 s after its
        # acquire task is seen running, however long the loaded machine takes to get there)
        releaser = threading.Thread(
            target=_release_when_running, args=(leases, other, dag.dag_id, "lease.acquire", 2.0)
        )
        releaser.start()
        try:
            run = run_dag(dag, {"lease_name": lease, "marker": str(marker), "timeout": 30})
        finally:
            releaser.join()
    assert run.state == "success", run.states
    assert run.xcoms["lease.acquire"]["token"] == other.token + 1
    assert run.durations["lease.acquire"] >= 1.5  # it waited for the release


def _release_when_running(leases: Any, held: Any, dag_id: str, task_id: str, after: float) -> None:
    """Release ``held`` ``after`` seconds after a task instance of ``task_id`` is seen running."""
    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.session import create_session

    deadline = time.monotonic() + 300
    try:
        while time.monotonic() < deadline:
            with create_session() as session:
                running = session.query(TaskInstance).filter_by(dag_id=dag_id, task_id=task_id, state="running").count()
            if running:
                time.sleep(after)
                return
            time.sleep(0.05)
    finally:
        leases.release(held)


# ---------------------------------------------------------------------------------- takeovers
def _steal_when(marker: Path, lease: str, first: str, *, after: float = 0.0) -> tuple[threading.Thread, dict[str, Any]]:
    """A thread of the test standing in for another deployment: once ``marker`` has a line starting
    with ``first``, it takes the lease over (steal=True)."""
    out: dict[str, Any] = {}

    def run() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not any(m and m[0] == first for m in _marks(marker)):
            time.sleep(0.05)
        time.sleep(after)
        with PulsarStateHook() as hook:
            out["lease"] = hook.get_leases().acquire(lease, "deployment-b/thief", ttl=30.0, timeout=0, steal=True)
            out["at"] = time.time()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, out


def test_a_guarded_task_stops_when_its_lease_is_taken_over_while_it_runs(
    dag_bundles: None, state_backend: str, tmp_path: Path
) -> None:
    dag = load_dag(TEST_DAGS, "leases_guarded_work")
    lease, marker = _name("lease"), tmp_path / "marks"
    thread, stolen = _steal_when(marker, lease, "start")
    run = run_dag(dag, {"lease_name": lease, "marker": str(marker), "seconds": 20.0})
    thread.join(timeout=30)
    assert run.state == "failed", run.states
    assert run.states["work"] == "failed" and run.seconds < 20  # stopped, not run to its end
    assert [m[0] for m in _marks(marker)] == ["start"]
    assert stolen["lease"].token == run.xcoms["lease.acquire"]["token"] + 1
    assert run.xcoms["lease.release"]["released"] is False  # it releases nothing it no longer holds
    assert _describe(lease).holder == "deployment-b/thief"


def test_a_handle_taken_over_between_tasks_fails_the_guarded_task_with_a_clear_error(
    dag_bundles: None, state_backend: str, tmp_path: Path
) -> None:
    dag = load_dag(TEST_DAGS, "leases_guarded_work")
    lease, marker = _name("lease"), tmp_path / "marks"
    acquire = dag.get_task("lease.acquire")
    errors: list[BaseException] = []

    def steal_after_acquire(context: Any, result: Any) -> None:  # between the acquire and the guarded task
        with PulsarStateHook() as hook:
            hook.get_leases().acquire(lease, "deployment-b/thief", ttl=30.0, timeout=0, steal=True)

    work = dag.get_task("work")

    def record(context: Any) -> None:
        errors.append(context["exception"])

    with (
        mock.patch.object(acquire, "_post_execute_hook", steal_after_acquire),
        mock.patch.object(work, "on_failure_callback", [record]),
    ):
        run = run_dag(dag, {"lease_name": lease, "marker": str(marker)})
    assert run.state == "failed" and run.states["work"] == "failed", run.states
    assert not marker.exists()  # its body never ran
    token = run.xcoms["lease.acquire"]["token"]
    (error,) = errors
    message = str(error)
    assert type(error).__name__ == "AirflowFailException"  # retrying cannot help
    assert f"lease {lease!r} (token {token}" in message
    assert f"now held by 'deployment-b/thief' under token {token + 1}" in message
    assert isinstance(error.__cause__, LeaseLostError)


def test_an_apply_after_a_takeover_is_fenced_and_nothing_reaches_the_table(
    dag_bundles: None, state_backend: str
) -> None:
    """The worst moment: the guarded apply renewed its lease, then a new holder took it over and
    wrote before the apply's write arrived. The table refuses the old token."""
    from airflow_provider_pulsarstate.engine.recipes.table import StateTable

    dag = load_dag(TEST_DAGS, "leases_guarded_apply")
    lease, topic = _name("lease"), _name("fenced")
    with PulsarStateHook() as hook:
        _seed(hook, topic, {"sku-1": {"stock": 1}})
        table = _table(hook, topic)
        view = table.create_view(scope_prefix="sku-")
    with PulsarStateHook() as hook:
        from airflow_provider_pulsarstate.engine.recipes.table import ViewStager

        with ViewStager(hook.get_conn(), hook.topic_name(topic), view.view_id) as stager:
            stager.set("sku-1", {"stock": 99})
            stager.set("sku-2", {"stock": 2})
        _table(hook, topic).seal(view.view_id, stagers=[stager])

    real_apply = StateTable.apply

    def takeover_then_apply(self: StateTable, view_id: str, **kwargs: Any) -> Any:
        with PulsarStateHook() as hook:  # the new leader takes the lease and writes first
            new = hook.get_leases().acquire(lease, "deployment-b/thief", ttl=30.0, timeout=0, steal=True)
            _table(hook, topic).put("other-9", {"stock": 9}, lease=new)  # outside the view's scope: no conflict
        return real_apply(self, view_id, **kwargs)

    with mock.patch.object(StateTable, "apply", takeover_then_apply):
        run = run_dag(dag, {"lease_name": lease, "table_topic": topic, "view_id": view.view_id})
    assert run.state == "failed" and run.states["apply_view"] == "failed"
    with PulsarStateHook() as hook:
        assert _table(hook, topic).to_dict(latest=True) == {"sku-1": {"stock": 1}, "other-9": {"stock": 9}}


def test_a_view_opened_after_a_takeover_is_fenced(dag_bundles: None, state_backend: str) -> None:
    """create_view runs under the lease too: once a newer holder wrote, the old run opens no view."""
    from airflow_provider_pulsarstate.engine.recipes.table import StateTable

    dag = load_dag(TEST_DAGS, "leases_guarded_create_view")
    lease, topic = _name("lease"), _name("fenced-view")
    with PulsarStateHook() as hook:
        _seed(hook, topic, {"sku-1": {"stock": 1}})
        before = [v.view_id for v in _table(hook, topic).views(latest=True)]
    real_create = StateTable.create_view

    def takeover_then_create(self: StateTable, **kwargs: Any) -> Any:
        with PulsarStateHook() as hook:
            new = hook.get_leases().acquire(lease, "deployment-b/thief", ttl=30.0, timeout=0, steal=True)
            _table(hook, topic).put("other-9", {"stock": 9}, lease=new)
        return real_create(self, **kwargs)

    with mock.patch.object(StateTable, "create_view", takeover_then_create):
        run = run_dag(dag, {"lease_name": lease, "table_topic": topic})
    assert run.state == "failed" and run.states["create_view"] == "failed", run.states
    with PulsarStateHook() as hook:
        assert [v.view_id for v in _table(hook, topic).views(latest=True)] == before  # no view opened


def test_a_spark_job_is_killed_when_its_lease_is_taken_over(dag_bundles: None, tmp_path: Path) -> None:
    # one back end is enough: the kill is the Airflow layer's (the renewal thread calls on_kill)
    dag = load_dag(TEST_DAGS, "leases_guarded_spark")
    lease, marker = _name("lease"), tmp_path / "marks"
    thread, stolen = _steal_when(marker, lease, "spark-start")
    started = time.monotonic()
    # the job would run 300 s: ending well before that, without its end mark, means it was killed
    run = run_dag(dag, {"lease_name": lease, "marker": str(marker), "seconds": 300})
    thread.join(timeout=30)
    assert run.state == "failed" and run.states["spark_job"] == "failed", run.states
    assert [m[0] for m in _marks(marker)] == ["spark-start"]  # it never reached its end
    assert time.monotonic() - started < 240
    assert run.xcoms["lease.release"]["released"] is False and "lease" in stolen


# ---------------------------------------------------------------------------------- wiring, no run
def test_lease_group_wiring_and_refusals() -> None:
    from airflow.sdk import DAG
    from airflow.sdk.bases.operator import BaseOperator

    from airflow_provider_pulsarstate.operators.views import temp_view_spark_task_group

    with DAG("lease_wiring", schedule=None) as dag:
        prices = temp_view_spark_task_group("prices", table_topic="t", application="job.py")
        lease = lease_task_group("lease", lease_name="n", ttl=10, guard=[prices])
        plain = BaseOperator(task_id="plain")
        with pytest.raises(TypeError, match="'plain' .* cannot hold a lease: subclass it with LeaseGuardMixin"):
            lease.guard(plain)
    dag.validate_setup_teardown()
    assert lease.acquire.is_setup and lease.release.is_teardown
    assert lease.release.trigger_rule == "all_done_setup_success"
    guarded = {t.task_id for t in dag.tasks if isinstance(t, LeaseGuardMixin) and t.lease_task_id == "lease.acquire"}
    assert guarded == {"prices.create_view", "prices.spark_job", "prices.apply_view"}  # not drop_view
    assert prices.create.upstream_task_ids == {"lease.acquire"}
    assert guarded <= lease.release.upstream_task_ids


def test_acquire_refuses_a_ttl_or_timeout_that_is_not_seconds_naming_the_field() -> None:
    from airflow.sdk.exceptions import AirflowFailException

    from airflow_provider_pulsarstate.operators.leases import AcquireLeaseOperator

    for fields, field in (({"ttl": "soon"}, "ttl"), ({"ttl": ""}, "ttl"), ({"ttl": 10, "timeout": "later"}, "timeout")):
        operator = AcquireLeaseOperator(task_id="acquire", lease_name="ingest", **fields)  # type: ignore[arg-type]
        refused = pytest.raises(AirflowFailException, match=f"lease 'ingest': {field} must be seconds, got ")
        with mock.patch("airflow_provider_pulsarstate.operators.leases.PulsarStateHook") as hook, refused:
            operator.execute({})  # type: ignore[arg-type]
        hook.assert_not_called()  # refused before any connection


def test_describe_loss_names_lease_token_and_new_holder() -> None:
    from airflow_provider_pulsarstate.hooks.pulsarstate import Lease

    lease = Lease("ingest", "a/run-1", 3, 10.0, "persistent://public/default/pulsarstate-leases")
    current = mock.Mock(holder="b/run-7", token=4)
    text = describe_loss(lease, LeaseLostError("held by another", lease="ingest", token=3, current=current))
    assert "lease 'ingest' (token 3, holder 'a/run-1'" in text and "now held by 'b/run-7' under token 4" in text
    released = describe_loss(
        lease, LeaseLostError("released", lease="ingest", token=3, current=mock.Mock(holder=None, token=3))
    )
    assert "it was released" in released


# ---------------------------------------------------------------------------------- two deployments
WORKER = Path(__file__).with_name("deployment_worker.py")


@pytest.mark.timeout(900)  # two example runs with a real spark-submit each, one after the other: ~1-2 min
def test_two_deployments_never_run_the_example_spark_job_at_once(
    dag_bundles: None, state_backend: str, airflow_db: Path, tmp_path: Path
) -> None:
    """The example pipeline in two "deployments" at once: separate processes, each with its own
    metadata DB, sharing only the state back end. Both publish a batch and reach the lease
    together; one runs the Spark job while the other waits, and the table counts every event once."""
    import json
    import os
    import subprocess
    import sys

    from tests.airflow.dagruns import EXAMPLE_DAGS
    from tests.airflow.metadata_db import copy_airflow_db
    from tests.airflow.test_ingest_pipeline import EVENTS, SKUS, _names, _state, _topic_fold

    names = _names()
    env = os.environ.copy()
    if state_backend == "embedded":  # the two deployments share one state file (as one host would)
        state = str(Path(env["AIRFLOW_HOME"]) / "pulsarstate" / "state.db")
        env["AIRFLOW_CONN_PULSARSTATE_DEFAULT"] = json.dumps(
            {"conn_type": "pulsarstate", "extra": {"service_url": state}}
        )
    procs = {}
    for deployment, batch in (("deployment-a", 1), ("deployment-b", 2)):
        home = tmp_path / deployment
        home.mkdir()
        copy_airflow_db(airflow_db, home / "airflow.db")
        child = {
            **env,
            "AIRFLOW_HOME": str(home),
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home / 'airflow.db'}",
            "AIRFLOW_VAR_PULSARSTATE_DEPLOYMENT": deployment,
        }
        conf = {"batch": batch, "events": EVENTS, "skus": SKUS, **names}
        # Output goes to files, never to pipes read one process after the other: a deployment
        # whose pipe filled up (Spark logs a lot) blocked on logging, its lease renewer with it,
        # and lost its lease while the test read the other one.
        with (
            open(tmp_path / f"{deployment}.out", "w") as out_file,
            open(tmp_path / f"{deployment}.err", "w") as err_file,
        ):
            procs[deployment] = subprocess.Popen(
                [sys.executable, str(WORKER), str(EXAMPLE_DAGS), json.dumps(conf)],
                stdout=out_file,
                stderr=err_file,
                text=True,
                env=child,
            )
    results = {}
    for deployment, proc in procs.items():
        proc.wait(timeout=800)
        out = (tmp_path / f"{deployment}.out").read_text(errors="replace")
        err = (tmp_path / f"{deployment}.err").read_text(errors="replace")
        assert proc.returncode == 0, f"{deployment}: rc={proc.returncode}\n{out[-3000:]}\n{err[-5000:]}"
        line = next(line for line in out.splitlines() if line.startswith("RESULT "))
        results[deployment] = json.loads(line[len("RESULT ") :])
        failure = out[out.find("Task failed with exception") :][:3000]
        assert results[deployment]["state"] == "success", (results[deployment]["states"], failure, str(tmp_path))
        assert results[deployment]["lease"]["holder"].startswith(f"{deployment}/price_events_pipeline/")

    first, second = sorted(results.values(), key=lambda r: r["lease"]["token"])
    assert second["lease"]["token"] == first["lease"]["token"] + 1
    # the Spark jobs never overlapped, and the second deployment really contended: it asked for the
    # lease while the first held it, and got it only after the first released
    assert first["times"]["prices.spark_job"][1] <= second["times"]["prices.spark_job"][0]
    assert second["times"]["lease.acquire"][0] < first["times"]["lease.release"][0]
    assert second["times"]["lease.acquire"][1] >= first["times"]["lease.release"][0]
    assert first["release"]["released"] and second["release"]["released"]
    with PulsarStateHook() as hook:
        rows, recorded, cursor, end = _state(hook, names)
        expected, counted = _topic_fold(hook, hook.topic_name(names["events_topic"]), recorded)
        assert recorded == end and cursor == end and counted == 2 * EVENTS
        assert rows == expected  # both batches, every event exactly once
