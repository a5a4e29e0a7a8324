"""``airflow pulsarstate table-show`` and ``xcom-show``: the read-only commands print what the store
holds, as JSON on one line, through the deployment's connection (real CLI processes)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from airflow_provider_pulsarstate.hooks.pulsarstate import PulsarStateHook, close_shared_state_maps
from airflow_provider_pulsarstate.provider_settings import settings as provider_settings

ROOT = Path(__file__).resolve().parents[2]
AIRFLOW_BIN = str(Path(sys.executable).with_name("airflow"))


def _show(tmp_path: Path, *args: str) -> Any:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "AIRFLOW_HOME": str(tmp_path / "cli-home")}
    result = subprocess.run([AIRFLOW_BIN, "pulsarstate", *args], env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_table_show_prints_the_committed_rows(env_connection: Any, airflow_db: Path, tmp_path: Path) -> None:
    env_connection("pulsarstate_default", extra={"service_url": str(tmp_path / "log" / "state.db")})
    close_shared_state_maps()
    with PulsarStateHook() as hook, hook.get_table("show-table") as table:
        table.put("sku-1", {"price": 1.5, "stock": 3})
        table.put("sku-2", {"price": 2.0, "stock": 0})
        table.put("other", {"price": 9.0, "stock": 1})
        table.delete("sku-2")
    close_shared_state_maps()
    assert _show(tmp_path, "table-show", "--topic", "show-table") == {
        "sku-1": {"price": 1.5, "stock": 3},
        "other": {"price": 9.0, "stock": 1},
    }
    assert _show(tmp_path, "table-show", "--topic", "show-table", "--prefix", "sku-") == {
        "sku-1": {"price": 1.5, "stock": 3}
    }


def test_xcom_show_prints_one_runs_values_deserialized(env_connection: Any, airflow_db: Path, tmp_path: Path) -> None:
    from airflow.sdk.serde import serialize

    env_connection("pulsarstate_default", extra={"service_url": str(tmp_path / "log" / "state.db")})
    close_shared_state_maps()
    settings = provider_settings()

    def put(run_id: str, task_id: str, map_index: int, key: str, value: Any) -> None:
        with PulsarStateHook().xcom_run_store(
            settings.xcom_topic,
            namespace=settings.key_namespace,
            dag_id="d",
            run_id=run_id,
        ) as store:
            store.put(
                "d", run_id, task_id, map_index, key, json.dumps(serialize(value)), type_name=type(value).__name__
            )

    put("r1", "report", -1, "return_value", {"rows": 3, "offsets": {"0": [0, 2]}})
    put("r1", "publish", -1, "return_value", [1, 2])
    put("r1", "publish", 0, "extra", "text")
    put("r2", "report", -1, "return_value", {"rows": 99})
    close_shared_state_maps()

    assert _show(tmp_path, "xcom-show", "--dag-id", "d", "--run-id", "r1") == [
        {"task_id": "publish", "map_index": -1, "key": "return_value", "value": [1, 2]},
        {"task_id": "publish", "map_index": 0, "key": "extra", "value": "text"},
        {"task_id": "report", "map_index": -1, "key": "return_value", "value": {"rows": 3, "offsets": {"0": [0, 2]}}},
    ]
    assert _show(tmp_path, "xcom-show", "--dag-id", "d", "--run-id", "r1", "--task-id", "report") == [
        {"task_id": "report", "map_index": -1, "key": "return_value", "value": {"rows": 3, "offsets": {"0": [0, 2]}}},
    ]


def test_xcom_show_prints_the_last_value_pushed_of_each_row_as_messages(
    env_connection: Any, airflow_db: Path, tmp_path: Path
) -> None:
    from airflow.sdk.serde import serialize

    from airflow_provider_pulsarstate.hooks.pulsarstate import XComIdentity

    env_connection("pulsarstate_default", extra={"service_url": str(tmp_path / "log" / "state.db")})
    close_shared_state_maps()
    settings = provider_settings()

    def push(run_id: str, task_id: str, map_index: int, key: str, value: Any) -> None:
        with PulsarStateHook().xcom_message_log(
            settings.xcom_topic,
            namespace=settings.key_namespace,
            dag_id="d",
            run_id=run_id,
        ) as log:
            identity = XComIdentity(settings.key_namespace, "d", run_id, task_id, map_index, key)
            log.append(identity, json.dumps(serialize(value)), type_name=type(value).__name__)

    push("r1", "report", -1, "return_value", {"rows": 1})
    push("r1", "report", -1, "return_value", {"rows": 3})  # a retry's push replaces the first
    push("r1", "publish", 0, "return_value", [1, 2])
    push("r2", "report", -1, "return_value", {"rows": 99})
    close_shared_state_maps()

    assert _show(tmp_path, "xcom-show", "--dag-id", "d", "--run-id", "r1") == [
        {"task_id": "publish", "map_index": 0, "key": "return_value", "value": [1, 2]},
        {"task_id": "report", "map_index": -1, "key": "return_value", "value": {"rows": 3}},
    ]
    assert _show(tmp_path, "xcom-show", "--dag-id", "d", "--run-id", "r3") == []
