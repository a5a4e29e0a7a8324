"""``airflow pulsarstate ...`` commands resolve connections as ``airflow connections get`` does
(metadata DB, secrets backends, environment), and a missing connection is an error that names it
and says how to define it; nothing falls back to an embedded log nobody else uses. Real CLI
processes on the session's metadata DB, with an AIRFLOW_HOME of their own."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_pulsarstate.hooks.pulsarstate import AssetStateScope, PulsarStateHook, close_shared_state_maps

ROOT = Path(__file__).resolve().parents[2]
AIRFLOW_BIN = str(Path(sys.executable).with_name("airflow"))
CONN_ID = "pulsarstate_default"


def _cli_env(home: Path) -> dict[str, str]:
    """The CLI's environment: the session's metadata DB, its own AIRFLOW_HOME, no connection in env."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "AIRFLOW_HOME": str(home)}
    env.pop(f"AIRFLOW_CONN_{CONN_ID.upper()}", None)
    return env


def _airflow(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([AIRFLOW_BIN, *args], env=env, capture_output=True, text=True, timeout=300, cwd=ROOT)


def test_commands_use_the_connection_in_the_metadata_db(
    state_backend: str, airflow_db: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if state_backend == "pulsar":
        extra: dict[str, Any] = json.loads(os.environ[f"AIRFLOW_CONN_{CONN_ID.upper()}"])["extra"]
    else:
        extra = {"service_url": str(tmp_path / "from-db" / "state.db")}
    # write an expired entry into the store the connection names (in this process, through env)
    monkeypatch.setenv(f"AIRFLOW_CONN_{CONN_ID.upper()}", json.dumps({"conn_type": "pulsarstate", "extra": extra}))
    close_shared_state_maps()
    scope = AssetStateScope(f"cli-db-{uuid.uuid4().hex[:8]}")
    store = PulsarStateHook().get_state_store()
    store.set(scope, "stale", 1, expires_at=time.time() - 60)
    store.set(scope, "kept", 2)
    close_shared_state_maps()

    home = tmp_path / "cli-home"
    env = _cli_env(home)
    added = _airflow(
        env, "connections", "add", CONN_ID, "--conn-type", "pulsarstate", "--conn-extra", json.dumps(extra)
    )
    assert added.returncode == 0, added.stderr[-3000:]
    try:
        cleanup = _airflow(env, "pulsarstate", "state-store-cleanup")
        assert cleanup.returncode == 0, cleanup.stderr[-3000:]
        assert "expired entr" in cleanup.stdout and "removed 0 " not in cleanup.stdout, cleanup.stdout
        assert "is not defined" not in cleanup.stdout + cleanup.stderr
        xcom = _airflow(env, "pulsarstate", "xcom-cleanup", "--dry-run")
        assert xcom.returncode == 0, xcom.stderr[-3000:]
        assert "is not defined" not in xcom.stdout + xcom.stderr
    finally:
        deleted = _airflow(env, "connections", "delete", CONN_ID)
        assert deleted.returncode == 0, deleted.stderr[-3000:]
    close_shared_state_maps()
    store = PulsarStateHook().get_state_store()
    assert store.entries(scope) == {"kept": 2}  # the command cleaned the store the DB connection names
    assert not (home / "pulsarstate").exists()  # and no embedded default beside it
    close_shared_state_maps()


@pytest.mark.parametrize(
    "command",
    [
        ["xcom-cleanup"],
        ["xcom-cleanup", "--dry-run", "--older-than-days", "1"],
        ["state-store-cleanup", "--dry-run"],
        ["state-store-migrate", "--dry-run"],
        ["reset-fence", "--topic", "prices", "--lease", "nightly"],
        ["table-show", "--topic", "prices"],
        ["xcom-show", "--dag-id", "d", "--run-id", "r"],
    ],
    ids=lambda c: "-".join(c[:2]),
)
def test_a_missing_connection_is_a_clear_error_and_creates_nothing(
    airflow_db: Path, tmp_path: Path, command: list[str]
) -> None:
    home = tmp_path / "cli-home"
    env = _cli_env(home)
    result = _airflow(env, "pulsarstate", *command)
    assert result.returncode != 0
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    message = result.stderr
    assert f"airflow pulsarstate {command[0]}: " in message, message[-3000:]
    assert f"'{CONN_ID}' is not defined" in message
    assert f"airflow connections add {CONN_ID} --conn-type pulsarstate" in message
    assert f"AIRFLOW_CONN_{CONN_ID.upper()}" in message
    assert not (home / "pulsarstate").exists()
