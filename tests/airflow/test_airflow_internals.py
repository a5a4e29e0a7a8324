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
    from airflow_provider_pulsarstate.hooks.provider_config import derived_key_namespace

    class Conf:
        def __init__(self, address: str) -> None:
            self.address = address

        def get(self, section: str, key: str, fallback: str = "") -> str:
            assert (section, key) == ("database", "sql_alchemy_conn")
            return self.address

    # the value Airflow's supervisor writes into a task process's config is the one we recognise
    (placeholder,) = [
        line.split('"')[1] for line in inspect.getsource(supervisor.block_orm_access).splitlines()
        if line.strip().startswith("conn = ")
    ]
    assert is_blocked_db_url(placeholder)
    with pytest.raises(ConfigurationError, match=r"key_namespace is not set.*hides it from task processes"):
        derived_key_namespace(Conf(placeholder))
    one = derived_key_namespace(Conf("postgresql://db-a/airflow"))
    assert one.startswith("airflow-") and one == derived_key_namespace(Conf("postgresql://db-a/airflow"))
    assert one != derived_key_namespace(Conf("postgresql://db-b/airflow"))
