"""PySpark helpers for Spark jobs that feed state tables (no Airflow imports).

:func:`write_view` stages a DataFrame into an open temp view from the executors, in parallel;
:func:`read_table` reads a table's committed state into a DataFrame on the driver;
:func:`read_offset_range` reads a range of a topic's offsets from the executors (exactly-once
ingestion, with :func:`ingestion_range` and :func:`table_snapshot`). The config
travels as JSON (:func:`dump_config` / :func:`load_config`), which is how the Airflow task group
hands it to ``spark-submit``.

pyspark is optional (the ``[spark]`` extra): this package imports without it, and the helpers that
need it raise :class:`~airflow_provider_pulsarstate.engine.errors.MissingExtraError` with the
``pip install 'airflow-provider-pulsarstate[spark]'`` command.
"""

from __future__ import annotations

from airflow_provider_pulsarstate.spark.offsets import (
    ingestion_range,
    message_schema,
    plan_splits,
    read_offset_range,
    table_snapshot,
)
from airflow_provider_pulsarstate.spark.views import (
    AUTH_TOKEN_ENV,
    dump_config,
    load_config,
    portable_config,
    read_table,
    write_view,
)

__all__ = [
    "AUTH_TOKEN_ENV",
    "dump_config",
    "ingestion_range",
    "load_config",
    "message_schema",
    "plan_splits",
    "portable_config",
    "read_offset_range",
    "read_table",
    "table_snapshot",
    "write_view",
]
