"""A task process's XCom push and pull on Pulsar, as the supervisor's forked task runs them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.pulsar
def test_small_values_are_pushed_and_pulled_without_starting_a_pulsar_client(
    pulsar_broker: object, tmp_path: Path
) -> None:
    """No ``import pulsar``, no client, no producer in the task process: what keeps a fan-out of
    hundreds of task processes close to the DB backend's cost."""
    tag = uuid.uuid4().hex[:10]
    env = dict(os.environ)
    env.update(
        {
            "AIRFLOW_HOME": str(tmp_path),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__PULSARSTATE__KEY_NAMESPACE": f"tp-{tag}",
            "AIRFLOW__PULSARSTATE__XCOM_TOPIC": f"tp-{tag}-xcom",
            "AIRFLOW__PULSARSTATE__XCOM_MAX_VALUE_BYTES": str(8 << 20),
            "AIRFLOW_CONN_PULSARSTATE_DEFAULT": json.dumps(
                {
                    "conn_type": "pulsarstate",
                    "extra": {
                        "service_url": pulsar_broker.service_url,
                        "admin_url": pulsar_broker.admin_url,  # type: ignore[attr-defined]
                    },
                }
            ),
            "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p),
        }
    )
    script = textwrap.dedent("""
        import sys
        from types import SimpleNamespace
        from airflow_provider_pulsarstate.xcom.backend import PulsarXComBackend, close_stores

        assert "pulsar" not in sys.modules
        values = [{"task": i, "rows": [1, 2, 3], "text": "\\u00fc\\n"} for i in range(3)]
        if sys.argv[1] == "big":
            values.append("x" * (2 << 20))  # over the HTTP path's limit: a producer, chunked
        for i, value in enumerate(values):
            ref = PulsarXComBackend.serialize_value(
                value, key="return_value", task_id=f"t{i}", dag_id="d", run_id="r", map_index=-1
            )
            assert PulsarXComBackend.deserialize_value(SimpleNamespace(value=ref)) == value
        print("pulsar" in sys.modules)
        close_stores()
    """)
    loaded = {}
    for case in ("small", "big"):  # each in a fresh process
        out = subprocess.run([sys.executable, "-c", script, case], capture_output=True, text=True, timeout=300, env=env)
        assert out.returncode == 0, out.stderr[-3000:]
        loaded[case] = out.stdout.split()[-1]
    assert loaded == {"small": "False", "big": "True"}  # the client is loaded only for the large value
