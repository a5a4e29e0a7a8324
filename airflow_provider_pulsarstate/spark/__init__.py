"""PySpark helpers for Spark jobs that feed state tables (no Airflow imports).

:func:`write_view` stages a DataFrame into an open temp view from the executors, in parallel;
:func:`read_table` reads a table's committed state into a DataFrame on the driver. The config
travels as JSON (:func:`dump_config` / :func:`load_config`), which is how the Airflow task group
hands it to ``spark-submit``.
"""

from __future__ import annotations

from airflow_provider_pulsarstate.spark.views import (
    AUTH_TOKEN_ENV,
    dump_config,
    load_config,
    portable_config,
    read_table,
    write_view,
)

__all__ = ["AUTH_TOKEN_ENV", "dump_config", "load_config", "portable_config", "read_table", "write_view"]
