"""Fixtures for the Airflow layer: a throw-away AIRFLOW_HOME, a migrated metadata DB, env connections.

Airflow reads AIRFLOW_HOME and its configuration once, when ``airflow`` is first imported, which
happens while test modules are collected. So the environment is set when this conftest is
imported (before any test module here), and restored when the session ends.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.airflow.dagruns import dag_bundle_env
from tests.airflow.metadata_db import copy_airflow_db, db_problems, migrated_template

AIRFLOW_BIN = str(Path(sys.executable).with_name("airflow"))

_HOME = Path(tempfile.mkdtemp(prefix="pulsarstate-airflow-home-"))
_ENV = {
    "AIRFLOW_HOME": str(_HOME),
    "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
    "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{_HOME / 'airflow.db'}",
    "AIRFLOW__CORE__AUTH_MANAGER": "airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager",
    "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "True",
    "AIRFLOW__API_AUTH__JWT_SECRET": "pulsarstate-tests-only-" + "0123456789abcdef" * 4,
    "AIRFLOW__CORE__TEST_CONNECTION": "Enabled",
}
_SAVED = {name: os.environ.get(name) for name in [*_ENV, "AIRFLOW_CONN_PULSARSTATE_DEFAULT"]}
if "airflow.configuration" not in sys.modules:
    os.environ.update(_ENV)
    os.environ.pop("AIRFLOW_CONN_PULSARSTATE_DEFAULT", None)


@pytest.fixture(scope="session", autouse=True)
def airflow_home() -> Iterator[Path]:
    """The session's AIRFLOW_HOME (a temp dir, removed at the end)."""
    from airflow import configuration

    if Path(configuration.AIRFLOW_HOME).resolve() != _HOME.resolve():
        pytest.fail(
            f"airflow was imported before tests/airflow/conftest.py could point AIRFLOW_HOME at {_HOME} "
            f"(it uses {configuration.AIRFLOW_HOME}); import Airflow lazily in earlier conftests"
        )
    try:
        yield _HOME
    finally:
        for name, value in _SAVED.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        shutil.rmtree(_HOME, ignore_errors=True)


@pytest.fixture(scope="session")
def migrated_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A metadata DB as ``airflow db migrate`` leaves it, made once per run (~12 s of CPU, 30-60 s
    on a loaded machine) and shared by the xdist workers: start a new metadata DB as a copy of it
    (``copy_airflow_db``, or ``AirflowProcesses(metadata_db=...)``) instead of migrating again."""
    base = tmp_path_factory.getbasetemp()
    run_root = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base  # xdist: <run>/popen-gwN
    try:
        return migrated_template(run_root / "airflow-migrated", AIRFLOW_BIN)
    except RuntimeError as exc:
        pytest.fail(str(exc))


@pytest.fixture(scope="session")
def airflow_db(airflow_home: Path, migrated_db: Path) -> Path:
    """The session's migrated metadata DB (a copy of ``migrated_db``)."""
    copy_airflow_db(migrated_db, airflow_home / "airflow.db")
    return airflow_home / "airflow.db"


@pytest.fixture(autouse=True)
def _check_airflow_db(request: pytest.FixtureRequest) -> Iterator[None]:
    """Fail the first test after which the session's shared metadata DB no longer passes
    ``PRAGMA quick_check``: a damaged DB otherwise shows up tests later as runs that two
    processes see differently. Copy it with ``metadata_db.copy_airflow_db``, never as a file."""
    yield
    db = _HOME / "airflow.db"
    if not db.exists():
        return
    if problems := db_problems(db):
        pytest.fail(f"the shared metadata DB {db} is damaged after {request.node.nodeid}: {problems[:5]}")


@pytest.fixture
def env_connection(monkeypatch: pytest.MonkeyPatch) -> Callable[..., str]:
    """Define an Airflow connection for one test through ``AIRFLOW_CONN_<ID>`` (JSON form).

    ``env_connection("ps_x", extra={...}, host=...)`` returns the conn id.
    """

    def define(
        conn_id: str, *, conn_type: str = "pulsarstate", extra: dict[str, Any] | None = None, **attrs: Any
    ) -> str:
        body: dict[str, Any] = {"conn_type": conn_type, **attrs}
        if extra is not None:
            body["extra"] = extra
        monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps(body))
        return conn_id

    return define


@pytest.fixture(params=["embedded", pytest.param("pulsar", marks=pytest.mark.pulsar)])
def state_backend(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Embedded: no pulsarstate_default connection at all (the default). Pulsar: the test broker."""
    if request.param == "pulsar":
        broker = request.getfixturevalue("pulsar_broker")
        extra = {"service_url": broker.service_url, "admin_url": broker.admin_url, "operation_timeout": 30}
        monkeypatch.setenv("AIRFLOW_CONN_PULSARSTATE_DEFAULT", json.dumps({"conn_type": "pulsarstate", "extra": extra}))
    else:
        monkeypatch.delenv("AIRFLOW_CONN_PULSARSTATE_DEFAULT", raising=False)
    return request.param


@pytest.fixture(scope="module")
def dag_bundles(airflow_db: Path) -> Iterator[None]:
    """DAG bundles for the example DAGs and the test DAGs (dag.test() needs serialized DAGs), and Spark."""
    with pytest.MonkeyPatch.context() as patch:
        for name, value in dag_bundle_env().items():
            patch.setenv(name, value)
        yield
