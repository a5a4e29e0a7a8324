"""Temp-view operators and the Spark task group: the example DAG end to end, failures, dry runs, edges.

The end-to-end tests run the real DAGs with ``dag.test()`` and a real ``spark-submit`` in local
mode, on the embedded default (no ``pulsarstate_default`` connection) and on the session's
Pulsar broker. The expected diff between two versions of the price table comes from the job's
own formulas evaluated in plain Python, never from Spark.
"""

from __future__ import annotations

import json
import os
import re
import sys
import uuid
from pathlib import Path
from typing import Any
from unittest import mock

import pytest

from airflow_provider_pulsarstate import ConnectionConfig
from airflow_provider_pulsarstate.engine.recipes.table import (
    StateTable,
    TableChange,
    ViewStager,
    staging_topic,
)
from airflow_provider_pulsarstate.hooks.pulsarstate import PulsarStateHook
from airflow_provider_pulsarstate.spark import AUTH_TOKEN_ENV, load_config
from tests.airflow.dagruns import EXAMPLE_DAGS, TEST_DAGS, load_dag, load_job, run_dag
from tests.conftest import count_entries

ROWS = 5000
job = load_job("price_table_job")


def _topic(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def _table(hook: PulsarStateHook, topic: str) -> StateTable:
    # release the writer quickly after our own writes: the DAG's tasks need it next
    return hook.get_table(topic, writer_idle_timeout=0.2).start()


def _seed(hook: PulsarStateHook, topic: str, rows: dict[str, dict]) -> None:
    """Publish ``rows`` as the table's content through a view (fast, no Spark)."""
    table = _table(hook, topic)
    view = table.create_view()
    with ViewStager(hook.get_conn(), table.topic, view.view_id) as stager:
        for key, record in rows.items():
            stager.set(key, record)
    table.seal(view.view_id, stagers=[stager])
    table.apply(view.view_id)


# ---------------------------------------------------------------------------------- end to end
def test_example_pipeline_second_run_publishes_exactly_the_changed_rows(dag_bundles: None, state_backend: str) -> None:
    dag = load_dag(EXAMPLE_DAGS, "price_table_pipeline")
    topic = _topic("prices")
    v1, v2 = job.price_table(1, ROWS), job.price_table(2, ROWS)
    diff = job.table_diff(v1, v2)
    assert diff["set"] and diff["delete"]  # the workload changes between versions

    first = run_dag(dag, {"version": 1, "rows": ROWS, "table_topic": topic})
    assert first.state == "success", first.states
    assert first.xcoms["report"]["set"] == len(v1) and first.xcoms["report"]["delete"] == 0

    with PulsarStateHook() as hook:
        assert (hook.get_config().kind == "pulsar") == (state_backend == "pulsar")
        table = _table(hook, topic)
        assert table.to_dict(latest=True) == v1
        changes: list[TableChange] = []
        table.add_listener(changes.append)

        second = run_dag(dag, {"version": 2, "rows": ROWS, "table_topic": topic})
        assert second.state == "success", second.states
        assert second.states["prices.drop_view"] == "skipped"
        report, result = second.xcoms["report"], second.xcoms["prices.apply_view"]
        unchanged = sum(1 for key, record in v2.items() if v1.get(key) == record)
        expected = {"set": len(diff["set"]), "delete": len(diff["delete"]), "unchanged": unchanged}
        assert {k: result[k] for k in expected} == expected
        assert report["published"] == len(diff["set"]) + len(diff["delete"])
        assert report["table_rows"] == len(v2)

        # what the table's readers saw: exactly the diff, from this view, at one commit offset
        assert table.to_dict(latest=True) == v2
        assert {c.key for c in changes if c.type == "set"} == diff["set"]
        assert {c.key for c in changes if c.type == "delete"} == diff["delete"]
        assert len(changes) == len(diff["set"]) + len(diff["delete"])
        assert {c.view_id for c in changes} == {result["view_id"]}
        assert {c.offset for c in changes} == {result["commit_offset"]}
        for change in changes:
            if change.type == "set":
                assert change.value == v2[change.key]
        info = table.view_info(result["view_id"])
        assert info is not None and info.status == "applied"
        assert count_entries(hook.get_conn(), info.staging_topic) == 0  # staging rows deleted after apply


def test_failing_spark_job_drops_the_view_and_leaves_the_table(
    dag_bundles: None, state_backend: str, tmp_path: Path
) -> None:
    dag = load_dag(TEST_DAGS, "views_failing_job")
    topic, marker = _topic("failing"), tmp_path / "staged.txt"
    with PulsarStateHook() as hook:
        _seed(hook, topic, {"sku-000001": {"stock": 7}, "other-1": {"stock": 1}})
        before = _table(hook, topic).to_dict(latest=True)

        outcome = run_dag(dag, {"table_topic": topic, "marker": str(marker)})

        assert outcome.state == "failed"
        assert outcome.states == {
            "prices.create_view": "success",
            "prices.spark_job": "failed",
            "prices.apply_view": "upstream_failed",
            "prices.drop_view": "success",
        }
        assert int(marker.read_text()) == 300  # the job did stage rows before failing
        view_id = outcome.xcoms["prices.create_view"]["view_id"]
        assert outcome.xcoms["prices.drop_view"] == {"view_id": view_id, "dropped": True}
        table = _table(hook, topic)
        assert table.to_dict(latest=True) == before
        info = table.view_info(view_id)
        assert info is not None and info.status == "dropped"
        assert count_entries(hook.get_conn(), staging_topic(table.topic, view_id)) == 0


def test_dry_run_publishes_nothing_and_drops_the_view(dag_bundles: None, state_backend: str) -> None:
    dag = load_dag(TEST_DAGS, "views_dry_run")
    rows, topic = 2000, _topic("dry")
    v1, v2 = job.price_table(1, rows), job.price_table(2, rows)
    diff = job.table_diff(v1, v2)
    with PulsarStateHook() as hook:
        _seed(hook, topic, v1)
        table = _table(hook, topic)
        changes: list[TableChange] = []
        table.add_listener(changes.append)

        outcome = run_dag(dag, {"table_topic": topic, "version": 2, "rows": rows})

        assert outcome.state == "success", outcome.states
        plan = outcome.xcoms["prices.apply_view"]
        assert (plan["set"], plan["delete"], plan["conflicts"]) == (len(diff["set"]), len(diff["delete"]), [])
        assert plan["sample_set"] == sorted(diff["set"])[:10]
        assert plan["sample_delete"] == sorted(diff["delete"])[:10]
        assert "commit_offset" not in plan
        assert outcome.states["prices.drop_view"] == "skipped"  # the apply task dropped it
        assert table.to_dict(latest=True) == v1
        assert changes == []
        assert table.view_info(plan["view_id"]).status == "dropped"


# ---------------------------------------------------------------------------------- operators, one by one
@pytest.fixture
def embedded_conn(env_connection: Any, tmp_path: Path) -> str:
    return env_connection("ps_views", extra={"service_url": str(tmp_path / "state.db")})


def _context(
    task_id: str = "create_view", *, run_id: str = "manual__2026-01-01T00:00:00+00:00", try_number: int = 1
) -> dict:
    ti = mock.MagicMock(dag_id="d", task_id=task_id, run_id=run_id, try_number=try_number)
    return {"ti": ti}


def test_create_operator_returns_the_view_and_pushes_a_portable_config(embedded_conn: str, tmp_path: Path) -> None:
    from airflow_provider_pulsarstate.operators.views import (
        CONFIG_XCOM_KEY,
        CreateTempViewOperator,
    )

    context = _context()
    op = CreateTempViewOperator(
        task_id="create_view", table_topic="t1", scope_prefix="sku-", pulsarstate_conn_id=embedded_conn
    )
    out = op.execute(context)
    assert set(out) == {"view_id", "baseline", "staging_topic", "table"}
    assert out["table"] == "persistent://public/default/t1"
    assert out["staging_topic"] == staging_topic(out["table"], out["view_id"])
    assert re.fullmatch(r"[A-Za-z0-9_-]{1,64}", out["view_id"])
    (call,) = context["ti"].xcom_push.call_args_list
    assert call.kwargs["key"] == CONFIG_XCOM_KEY
    config = load_config(call.kwargs["value"])
    assert config.embedded_path == tmp_path / "state.db"

    # a retried create (same id) gets the same open view
    assert op.execute(_context()) == out


def test_create_operator_records_a_scope_predicate(embedded_conn: str) -> None:
    import tests.engine.test_views  # noqa: F401  (registers the "even-keys" scope predicate)
    from airflow_provider_pulsarstate.operators.views import CreateTempViewOperator

    path = "even-keys"
    op = CreateTempViewOperator(task_id="c", table_topic="t6", scope_predicate=path, pulsarstate_conn_id=embedded_conn)
    out = op.execute(_context())
    with PulsarStateHook(embedded_conn) as hook:
        assert _table(hook, "t6").view_info(out["view_id"]).scope_predicate == path


def test_create_operator_refuses_an_applied_view_id(embedded_conn: str) -> None:
    from airflow.sdk.exceptions import AirflowFailException

    from airflow_provider_pulsarstate.operators.views import (
        ApplyTempViewOperator,
        CreateTempViewOperator,
    )

    create = CreateTempViewOperator(
        task_id="c", table_topic="t2", view_id="fixed-id", pulsarstate_conn_id=embedded_conn
    )
    create.execute(_context())
    with PulsarStateHook(embedded_conn) as hook:
        _table(hook, "t2").seal("fixed-id", stagers={})  # an empty job's seal
    ApplyTempViewOperator(task_id="a", table_topic="t2", view_id="fixed-id", pulsarstate_conn_id=embedded_conn).execute(
        _context()
    )
    with pytest.raises(AirflowFailException, match="already applied"):
        create.execute(_context())


def test_create_operator_passes_no_token_through_xcom(env_connection: Any, tmp_path: Path) -> None:
    from airflow_provider_pulsarstate.operators.views import CreateTempViewOperator

    conn_id = env_connection("ps_token", extra={"service_url": str(tmp_path / "s.db"), "auth_token": "s3cret-token"})
    context = _context()
    CreateTempViewOperator(task_id="c", table_topic="t", pulsarstate_conn_id=conn_id).execute(context)
    pushed = context["ti"].xcom_push.call_args.kwargs["value"]
    assert "s3cret-token" not in pushed and "auth_token" not in json.loads(pushed)


def test_apply_operator_counts_reapplies_and_fails_on_conflicts(embedded_conn: str) -> None:
    from airflow.sdk.exceptions import AirflowFailException

    from airflow_provider_pulsarstate.operators.views import ApplyTempViewOperator

    with PulsarStateHook(embedded_conn) as hook:
        table = _table(hook, "t3")
        table.put("a", {"x": 1})
        table.put("b", {"x": 2})
        view = table.create_view()
        with table.stager(view.view_id) as stager:
            stager.set("a", {"x": 1})
            stager.set("c", {"x": 3})
        table.seal(view.view_id, stagers=[stager])

        def apply(**kwargs: Any) -> dict:
            return ApplyTempViewOperator(
                task_id="a", table_topic="t3", view_id=view.view_id, pulsarstate_conn_id=embedded_conn, **kwargs
            ).execute(_context())

        plan = apply(dry_run=True)
        assert (plan["set"], plan["delete"], plan["unchanged"], plan["sample_set"], plan["sample_delete"]) == (
            1,
            1,
            1,
            ["c"],
            ["b"],
        )
        assert table.to_dict(latest=True) == {"a": {"x": 1}, "b": {"x": 2}}
        result = apply()
        assert (result["set"], result["delete"], result["unchanged"], result["already_applied"]) == (1, 1, 1, False)
        assert (result["sample_set"], result["sample_delete"]) == (["c"], ["b"])  # from apply's own diff
        assert table.to_dict(latest=True) == {"a": {"x": 1}, "c": {"x": 3}}
        again = apply()
        assert again["already_applied"] is True and again["commit_offset"] == result["commit_offset"]

        # a second producer writes a key the next view deletes: conflict, nothing published
        conflicted = table.create_view()
        with table.stager(conflicted.view_id) as stager:
            stager.set("a", {"x": 1})
        table.seal(conflicted.view_id, stagers=[stager])
        table.put("c", {"x": 30})
        op = ApplyTempViewOperator(
            task_id="a", table_topic="t3", view_id=conflicted.view_id, pulsarstate_conn_id=embedded_conn
        )
        with pytest.raises(
            AirflowFailException, match=r"1 key\(s\) changed on .* since baseline offset \d+: c\b"
        ) as info:
            op.execute(_context())
        assert "overwrite=True" in str(info.value)
        assert table.get("c", latest=True) == {"x": 30}
        op.overwrite = True
        assert op.execute(_context())["delete"] == 1
        assert table.to_dict(latest=True) == {"a": {"x": 1}}


def test_apply_operator_max_deletes_fails_without_publishing(embedded_conn: str) -> None:
    from airflow.sdk.exceptions import AirflowFailException

    from airflow_provider_pulsarstate.operators.views import ApplyTempViewOperator

    with PulsarStateHook(embedded_conn) as hook:
        table = _table(hook, "t5")
        for i in range(5):
            table.put(f"k{i}", {"x": i})
        empty = table.create_view()  # the job staged nothing
        table.seal(empty.view_id, stagers={})
        op = ApplyTempViewOperator(
            task_id="a", table_topic="t5", view_id=empty.view_id, max_deletes=2, pulsarstate_conn_id=embedded_conn
        )
        with pytest.raises(AirflowFailException, match="would delete 5 key.*max_deletes=2"):
            op.execute(_context())
        assert table.size(latest=True) == 5


def test_apply_operator_refuses_by_default_to_delete_more_than_half(embedded_conn: str) -> None:
    from airflow.sdk.exceptions import AirflowFailException

    from airflow_provider_pulsarstate.operators.views import ApplyTempViewOperator

    with PulsarStateHook(embedded_conn) as hook:
        table = _table(hook, "t5b")
        for i in range(5):
            table.put(f"k{i}", {"x": i})
        empty = table.create_view()  # the job staged nothing (e.g. its executors wrote elsewhere)
        table.seal(empty.view_id, stagers={})
        op = ApplyTempViewOperator(
            task_id="a", table_topic="t5b", view_id=empty.view_id, pulsarstate_conn_id=embedded_conn
        )
        with pytest.raises(AirflowFailException, match=r"would delete 5 key.*max_delete_fraction=0.5"):
            op.execute(_context())
        assert table.size(latest=True) == 5
        op = ApplyTempViewOperator(
            task_id="a",
            table_topic="t5b",
            view_id=empty.view_id,
            max_delete_fraction=1.0,
            pulsarstate_conn_id=embedded_conn,
        )
        assert op.execute(_context())["delete"] == 5


def test_apply_and_drop_operators_on_missing_or_dropped_views(embedded_conn: str) -> None:
    from airflow.sdk.exceptions import AirflowFailException

    from airflow_provider_pulsarstate.operators.views import (
        ApplyTempViewOperator,
        DropTempViewOperator,
    )

    def drop(view_id: str | None) -> dict:
        return DropTempViewOperator(
            task_id="d", table_topic="t4", view_id=view_id, pulsarstate_conn_id=embedded_conn
        ).execute(_context())

    def apply(view_id: str) -> dict:
        return ApplyTempViewOperator(
            task_id="a", table_topic="t4", view_id=view_id, pulsarstate_conn_id=embedded_conn
        ).execute(_context())

    assert drop("") == {"view_id": None, "dropped": False}
    assert drop("never-created") == {"view_id": "never-created", "dropped": False}
    with pytest.raises(AirflowFailException, match="no view 'never-created'"):
        apply("never-created")
    with pytest.raises(AirflowFailException, match="no view id"):
        apply("")
    with PulsarStateHook(embedded_conn) as hook:
        view = _table(hook, "t4").create_view()
    assert drop(view.view_id) == {"view_id": view.view_id, "dropped": True}
    assert drop(view.view_id)["dropped"] is False
    with pytest.raises(AirflowFailException, match="dropped"):
        apply(view.view_id)


def test_default_view_id_is_topic_safe_and_new_per_attempt() -> None:
    from airflow_provider_pulsarstate.operators.views import default_view_id

    run_id = "scheduled__2026-11-22T02:14:06.123456+00:00 with spaces/and:more" * 3
    ids = {
        default_view_id("dag", "g.create_view", run_id, 1),
        default_view_id("dag", "g.create_view", run_id, 2),
        default_view_id("dag", "h.create_view", run_id, 1),
        default_view_id("dag2", "g.create_view", run_id, 1),
    }
    assert len(ids) == 4
    for view_id in ids:
        assert re.fullmatch(r"[A-Za-z0-9_-]{1,64}", view_id), view_id
    assert default_view_id("d", "t", "manual__2026-01-01T00:00:00+00:00").startswith(
        "manual__2026-01-01T00_00_00_00_00-"
    )
    assert re.fullmatch(r"view-[0-9a-f]{8}-1", default_view_id("d", "t", "::"))


def test_format_counts() -> None:
    from airflow_provider_pulsarstate.operators.views import format_counts

    text = format_counts(
        {"set": 1234, "delete": 2, "unchanged": 5, "sample_set": [f"k{i}" for i in range(7)], "sample_delete": ["x"]},
        title="view v applied",
    )
    assert text.splitlines() == [
        "view v applied",
        "  kind             rows  sample keys",
        "  set             1,234  k0, k1, k2, k3, k4, ...",
        "  delete              2  x",
        "  unchanged           5",
        "  conflicts           0",
    ]


# ---------------------------------------------------------------------------------- the task group
def _group_dag(**kwargs: Any) -> tuple[Any, Any, Any]:
    import pendulum
    from airflow.providers.standard.operators.empty import EmptyOperator
    from airflow.sdk import DAG

    from airflow_provider_pulsarstate.operators.views import temp_view_spark_task_group

    with DAG("group_shape", schedule=None, start_date=pendulum.datetime(2026, 1, 1, tz="UTC")) as dag:
        group = temp_view_spark_task_group("prices", table_topic="price-table", application="/jobs/job.py", **kwargs)
        after = EmptyOperator(task_id="after")
        group >> after
    return dag, group, after


def test_task_group_wiring() -> None:
    from airflow.sdk import TriggerRule

    dag, group, after = _group_dag(application_args_extra=["--version", 3, "{{ params.v }}"], name="job")
    assert {t.task_id for t in dag.tasks} == {
        "prices.create_view",
        "prices.spark_job",
        "prices.apply_view",
        "prices.drop_view",
        "after",
    }
    assert group.spark.upstream_task_ids == {"prices.create_view"}
    assert group.apply.upstream_task_ids == {"prices.spark_job"}
    assert group.drop.upstream_task_ids == {"prices.spark_job"}
    assert group.drop.trigger_rule == TriggerRule.ONE_FAILED
    # the downstream task follows the apply only (drop is skipped on success)
    assert after.upstream_task_ids == {"prices.apply_view"}
    args = group.spark.application_args
    assert all(isinstance(a, str) for a in args)
    assert args[0::2][:3] == ["--view-id", "--table-topic", "--config-json"]
    assert "xcom_pull(task_ids='prices.create_view')" in args[1]
    assert args[6:] == ["--version", "3", "{{ params.v }}"]
    assert group.spark._conn_id == "spark_default" and group.spark.name == "job"
    assert "prices.create_view" in group.drop.view_id and ".get('view_id')" in group.drop.view_id


def test_task_group_dry_run_drops_after_planning_and_rejects_reserved_arguments() -> None:
    from airflow.sdk import TriggerRule

    _, group, _ = _group_dag(dry_run=True)
    assert group.apply.plan_only is True and group.apply.drop_after_plan is True
    assert group.apply.max_delete_fraction == 0.5 and group.apply.max_deletes is None  # the safe default
    _, group, _ = _group_dag(max_deletes=7, max_delete_fraction=0.9)
    assert (group.apply.max_deletes, group.apply.max_delete_fraction) == (7, 0.9)
    assert group.drop.trigger_rule == TriggerRule.ONE_FAILED
    with pytest.raises(TypeError, match="application_args"):
        _group_dag(application_args=["x"])


def test_spark_operator_passes_the_token_by_environment_and_finds_local_spark(
    env_connection: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from airflow.providers.apache.spark.operators.spark_submit import (
        SparkSubmitOperator,
    )

    from airflow_provider_pulsarstate.operators.spark_submit import (
        ViewSparkSubmitOperator,
    )

    conn_id = env_connection("ps_tok", extra={"service_url": str(tmp_path / "s.db"), "auth_token": "tok-123"})
    env_connection("spark_local", conn_type="spark", host="local[2]")
    seen: dict[str, Any] = {}
    monkeypatch.setattr(SparkSubmitOperator, "execute", lambda self, context: seen.update(env=self.env_vars))
    monkeypatch.setenv("PATH", "/nonexistent")

    op = ViewSparkSubmitOperator(
        task_id="s", application="/j.py", conn_id="spark_local", pulsarstate_conn_id=conn_id, env_vars={"A": "1"}
    )
    op.execute({})
    env = seen["env"]
    assert env["A"] == "1" and env[AUTH_TOKEN_ENV] == "tok-123"
    assert env["PYSPARK_PYTHON"] == sys.executable
    assert env["PATH"].split(os.pathsep)[0] == os.path.dirname(sys.executable)

    env_connection("spark_yarn", conn_type="spark", host="yarn")
    remote = env_connection("ps_tok_remote", extra={"service_url": "pulsar://localhost:6650", "auth_token": "tok-123"})
    op = ViewSparkSubmitOperator(
        task_id="s2",
        application="/j.py",
        conn_id="spark_yarn",
        pulsarstate_conn_id=remote,
        env_vars={"A": "1"},
        pass_token=False,
    )
    op.execute({})
    assert seen["env"] == {"A": "1"}  # nothing local-only on a cluster, no token (it would be in argv there)


def test_provider_info_lists_the_operators() -> None:
    from airflow_provider_pulsarstate.provider_info import provider_info

    modules = [m for entry in provider_info()["operators"] for m in entry["python-modules"]]
    assert "airflow_provider_pulsarstate.operators.views" in modules
    for module in modules:
        __import__(module)


def test_pulsar_config_round_trips_through_the_job_arguments() -> None:
    from airflow_provider_pulsarstate.spark import dump_config

    config = ConnectionConfig(
        url="pulsar://h:6650",
        admin_url="http://h:8080",
        tenant="t",
        namespace="n",
        auth_token="x",
        allow_plaintext_auth=True,
    )
    text = dump_config(config)
    assert "auth_token" not in text
    assert load_config(text, environ={AUTH_TOKEN_ENV: "x"}) == config
    assert load_config(text, environ={}) == config.with_options(auth_token=None)
