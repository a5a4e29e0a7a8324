"""The core install has no Spark runtime: everything but the Spark helpers works without the [spark]
extra, and the Spark helpers say how to install it.

Each check runs in a fresh interpreter where a meta-path finder refuses what the extra brings
(pyspark, pyarrow, the Spark provider's operators and hooks), as on a scheduler installed without
``[spark]``. The Spark provider's metadata module stays importable: Airflow's provider discovery
loads it when the provider is installed, as it is in the test venv.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
HINT = "pip install 'airflow-provider-pulsarstate[spark]'"

_BLOCKER = textwrap.dedent(
    """
    import importlib.abc, sys

    BLOCKED = (
        "pyspark", "py4j", "pyarrow",
        "airflow.providers.apache.spark.operators", "airflow.providers.apache.spark.hooks",
    )

    class NoSparkExtra(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if any(name == b or name.startswith(b + ".") for b in BLOCKED):
                raise ModuleNotFoundError(f"No module named {name!r} (blocked by the test)", name=name)
            return None

    sys.meta_path.insert(0, NoSparkExtra())
    """
)


def _run(body: str) -> dict:
    """Run ``body`` after the blocker; it prints one JSON object as its last line."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    result = subprocess.run(
        [sys.executable, "-c", _BLOCKER + textwrap.dedent(body)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_the_provider_works_without_the_spark_extra() -> None:
    out = _run(
        """
        import importlib, json, sys
        import airflow_provider_pulsarstate
        from airflow_provider_pulsarstate.provider_info import provider_info

        info = provider_info()
        modules = [
            *(m for kind in ("hooks", "sensors", "triggers") for e in info[kind] for m in e["python-modules"]),
            *(m for e in info["operators"] for m in e["python-modules"] if not m.endswith(".spark_submit")),
            "airflow_provider_pulsarstate.xcom.backend",
            "airflow_provider_pulsarstate.state_store.backend",
            "airflow_provider_pulsarstate.queues.pulsar",
            "airflow_provider_pulsarstate.cli.commands",
            "airflow_provider_pulsarstate.testing",
            "airflow_provider_pulsarstate.spark",
        ]
        for name in modules:
            importlib.import_module(name)
        from airflow_provider_pulsarstate.spark import dump_config, load_config

        config = load_config(dump_config({"url": "/tmp/state.db"}))
        loaded = sorted(m for m in sys.modules if m.split(".")[0] in ("pyspark", "py4j", "pyarrow"))
        print(json.dumps({"imported": len(modules), "loaded": loaded, "url": config.url}))
        """
    )
    assert out["imported"] > 10
    assert out["loaded"] == []
    assert out["url"] == "/tmp/state.db"


def test_the_spark_helpers_name_the_extra_to_install() -> None:
    out = _run(
        """
        import json
        from airflow_provider_pulsarstate import MissingExtraError
        from airflow_provider_pulsarstate.spark import message_schema, read_offset_range, read_table, write_view
        from airflow_provider_pulsarstate.operators.views import temp_view_spark_task_group

        calls = {
            "write_view": lambda: write_view(None, config={"url": "/tmp/x.db"}, table_topic="t", view_id="v", key_column="k"),
            "read_table": lambda: read_table(None, config={"url": "/tmp/x.db"}, table_topic="t"),
            "read_offset_range": lambda: read_offset_range(None, config={"url": "/tmp/x.db"}, topic="t", start={}, end={}),
            "message_schema": message_schema,
            "spark_submit": lambda: __import__("airflow_provider_pulsarstate.operators.spark_submit"),
            "temp_view_spark_task_group": lambda: temp_view_spark_task_group("g", table_topic="t", application="job.py"),
        }
        errors = {}
        for name, call in calls.items():
            try:
                call()
            except MissingExtraError as exc:
                errors[name] = {"message": str(exc), "extra": exc.extra, "import_error": isinstance(exc, ImportError)}
            else:
                errors[name] = None
        print(json.dumps(errors))
        """
    )
    for name, error in out.items():
        assert error is not None, f"{name} did not raise MissingExtraError"
        assert HINT in error["message"], (name, error["message"])
        assert error["extra"] == "spark" and error["import_error"], (name, error)
    assert out["temp_view_spark_task_group"]["message"].startswith("temp_view_spark_task_group")
