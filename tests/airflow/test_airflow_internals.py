"""The Airflow internals hooks/airflow_internals.py relies on still behave as it assumes: an
Airflow upgrade that changes them fails here, by name, instead of changing behaviour silently."""

from __future__ import annotations

import os

import pytest

from airflow_provider_pulsarstate.hooks.airflow_internals import (
    PROCESS_CONTEXT_ENV,
    in_server_context,
    is_blocked_db_url,
    is_masked_field_name,
    server_context,
)


def _backend_names() -> list[str]:
    from airflow.sdk.execution_time.supervisor import ensure_secrets_backend_loaded

    return [type(b).__name__ for b in ensure_secrets_backend_loaded()]


def test_server_context_reads_connections_from_the_metadata_db(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(PROCESS_CONTEXT_ENV, raising=False)
    assert not in_server_context()
    assert "MetastoreBackend" not in _backend_names()
    with server_context():
        assert in_server_context()
        assert "MetastoreBackend" in _backend_names()
    assert PROCESS_CONTEXT_ENV not in os.environ  # restored


def test_server_context_restores_a_previous_context(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(PROCESS_CONTEXT_ENV, "client")
    with server_context():
        assert in_server_context()
    assert os.environ[PROCESS_CONTEXT_ENV] == "client"


def test_airflow_connections_get_sets_the_same_context() -> None:
    import inspect

    from airflow.cli.commands import connection_command

    assert f'os.environ["{PROCESS_CONTEXT_ENV}"] = "server"' in inspect.getsource(connection_command.connections_get)


def test_the_masked_name_check_is_airflows_own() -> None:
    from airflow._shared import secrets_masker
    from airflow.api_fastapi.core_api.datamodels import connections

    # the function the REST API's redaction of extra fields calls is the one we ask
    assert connections.should_hide_value_for_key is secrets_masker.should_hide_value_for_key
    assert is_masked_field_name("password") and is_masked_field_name("allow_insecure_token")
    assert not is_masked_field_name("allow_plaintext_auth")


def test_a_task_runner_is_task_side_even_under_a_server_parent(monkeypatch: pytest.MonkeyPatch) -> None:
    # LocalExecutor forks task processes from the scheduler, which set the server context in its
    # environment; Airflow then picks the task-side secrets chain because SUPERVISOR_COMMS is set
    from airflow.sdk.execution_time import task_runner

    monkeypatch.setenv(PROCESS_CONTEXT_ENV, "server")
    monkeypatch.setattr(task_runner, "SUPERVISOR_COMMS", object(), raising=False)
    assert not in_server_context()
    assert "MetastoreBackend" not in _backend_names()
    monkeypatch.setattr(task_runner, "SUPERVISOR_COMMS", None)
    assert in_server_context()


def test_task_processes_see_the_placeholder_the_namespace_is_never_derived_from() -> None:
    import inspect

    from airflow.sdk.execution_time import supervisor

    from airflow_provider_pulsarstate.engine.errors import ConfigurationError
    from airflow_provider_pulsarstate.provider_settings import derived_key_namespace

    class Conf:
        def __init__(self, address: str) -> None:
            self.address = address

        def get(self, section: str, key: str, fallback: str = "") -> str:
            assert (section, key) == ("database", "sql_alchemy_conn")
            return self.address

    # the value Airflow's supervisor writes into a task process's config is the one we recognise
    (placeholder,) = [
        line.split('"')[1]
        for line in inspect.getsource(supervisor.block_orm_access).splitlines()
        if line.strip().startswith("conn = ")
    ]
    assert is_blocked_db_url(placeholder)
    with pytest.raises(ConfigurationError, match=r"key_namespace is not set.*hides it from task processes"):
        derived_key_namespace(Conf(placeholder))
    one = derived_key_namespace(Conf("postgresql://db-a/airflow"))
    assert one.startswith("airflow-") and one == derived_key_namespace(Conf("postgresql://db-a/airflow"))
    assert one != derived_key_namespace(Conf("postgresql://db-b/airflow"))


def test_the_state_store_accessors_keep_what_we_read() -> None:
    import inspect

    from airflow.sdk import Asset
    from airflow.sdk.execution_time import context
    from airflow.sdk.execution_time.context import AssetStateStoreAccessor, AssetStateStoreAccessors

    from airflow_provider_pulsarstate.hooks.airflow_internals import (
        asset_state_accessor_name,
        asset_state_accessors,
        task_state_accessor_scope,
    )

    scope = object()
    accessor = context.TaskStateStoreAccessor.__new__(context.TaskStateStoreAccessor)
    context.TaskStateStoreAccessor.__init__(accessor, ti_id=None, scope=scope)  # type: ignore[arg-type]
    assert task_state_accessor_scope(accessor) is scope
    # the frame walk of the state-store backend finds the key being read in these methods' locals
    assert "key" in inspect.signature(context.TaskStateStoreAccessor.get).parameters
    assert "key" in inspect.signature(AssetStateStoreAccessor._extract_get_response).parameters
    assert asset_state_accessor_name(AssetStateStoreAccessor(name="prices")) == "prices"
    assert asset_state_accessor_name(AssetStateStoreAccessor(uri="s3://b/k")) is None

    store = AssetStateStoreAccessors([Asset(name="a", uri="s3://b/a"), Asset.ref(uri="s3://b/u")])
    found = asset_state_accessors(store)
    assert found is not None and {asset_state_accessor_name(a) for a in found} >= {"a"}
    assert asset_state_accessors(object()) is None


def test_the_task_runner_pushes_the_return_value_with_ti_in_its_frame() -> None:
    import inspect

    from airflow.sdk.execution_time import task_runner

    # the XCom backend finds the try number of a return value in the pusher's local ``ti``
    assert list(inspect.signature(task_runner._xcom_push).parameters)[0] == "ti"
    assert "_xcom_push(ti, " in inspect.getsource(task_runner)


def test_caller_frames_start_where_asked() -> None:
    from airflow_provider_pulsarstate.hooks.airflow_internals import caller_frames

    def inner() -> list[str]:
        return [frame.f_code.co_name for frame in caller_frames(1, 2)]

    def outer() -> list[str]:
        return inner()

    assert outer() == ["outer", "test_caller_frames_start_where_asked"]


def test_the_spark_submit_hook_builds_its_command_where_we_ask() -> None:
    import inspect

    spark_submit = pytest.importorskip("airflow.providers.apache.spark.hooks.spark_submit")
    from airflow_provider_pulsarstate.hooks.airflow_internals import spark_submit_command, spark_submit_master

    hook = spark_submit.SparkSubmitHook.__new__(spark_submit.SparkSubmitHook)
    assert (
        list(inspect.signature(spark_submit.SparkSubmitHook._build_spark_submit_command).parameters)[1] == "application"
    )
    assert "self._connection = self._resolve_connection()" in inspect.getsource(spark_submit.SparkSubmitHook.__init__)
    hook._connection = {"master": "local[1]"}  # type: ignore[attr-defined]
    assert spark_submit_master(hook) == "local[1]"
    calls = []
    hook._build_spark_submit_command = lambda application: calls.append(application) or ["spark-submit", application]  # type: ignore[method-assign]
    assert spark_submit_command(hook, "job.py") == ["spark-submit", "job.py"] and calls == ["job.py"]
