"""PySpark helpers: write_view from executors, read_table on the driver, config passing, clear errors.

One local SparkSession for the module (``local[2]``, the workers run this interpreter).
"""

from __future__ import annotations

import datetime as dt
import decimal
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_pulsarstate import ConfigurationError, ConnectionConfig, SerializationError, open_backend
from airflow_provider_pulsarstate.engine.errors import ViewGuardError
from airflow_provider_pulsarstate.engine.recipes.table import StateTable
from airflow_provider_pulsarstate.spark import (
    AUTH_TOKEN_ENV,
    dump_config,
    load_config,
    portable_config,
    read_table,
    write_view,
)

# the tests share the module's SparkSession (one JVM): on one xdist worker, started once
pytestmark = pytest.mark.xdist_group("spark-views")


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    from pyspark.sql import SparkSession

    patch = pytest.MonkeyPatch()
    patch.setenv("PYSPARK_PYTHON", sys.executable)  # the workers need this venv (pulsar-client)
    session = (
        SparkSession.builder.master("local[2]")
        .appName("pulsarstate-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    yield session
    session.stop()
    from pyspark import SparkContext

    gateway = SparkContext._gateway
    if gateway is not None:  # close py4j now, not in __del__ after pytest closed its streams
        gateway.shutdown()
        SparkContext._gateway = SparkContext._jvm = None
    patch.undo()


@pytest.fixture
def config(backend_config: ConnectionConfig) -> ConnectionConfig:
    """Once per back end (tests/conftest.py)."""
    return backend_config


@pytest.fixture
def table(config: ConnectionConfig, topic: str) -> Iterator[StateTable]:
    backend = open_backend(config)
    with StateTable(backend, topic, writer_idle_timeout=0.2) as t:
        yield t
    backend.close()


def _stage_and_apply(
    spark: Any, config: ConnectionConfig, table: StateTable, df: Any, **kwargs: Any
) -> tuple[int, Any]:
    view = table.create_view()
    staged = write_view(df, config=config, table_topic=table.topic, view_id=view.view_id, **kwargs)
    sealed = table.view_info(view.view_id).sealed  # the driver sealed it: one stager per non-empty partition
    assert sealed is not None and sum(sealed.values()) == staged
    return staged, table.apply(view.view_id)


# ---------------------------------------------------------------------------------- write_view
def test_write_view_stages_every_row_from_many_partitions(
    spark: Any, config: ConnectionConfig, table: StateTable
) -> None:
    from pyspark.sql import functions as F

    df = spark.range(0, 2500, numPartitions=5).select(
        F.format_string("k%05d", F.col("id")).alias("key"),
        (F.col("id") * 3).alias("n"),
        (F.col("id") % 2 == 0).alias("even"),
    )
    staged, result = _stage_and_apply(spark, config, table, df, key_column="key", batch_rows=100)
    assert staged == 2500
    assert len(table.views()[-1].sealed or {}) == 5  # applied views keep their seal
    assert (result.set, result.delete) == (2500, 0)
    rows = table.to_dict(latest=True)
    assert len(rows) == 2500
    assert rows["k00007"] == {"n": 21, "even": False}

    # the same table again: an identical view publishes nothing
    staged, result = _stage_and_apply(spark, config, table, df, key_column="key")
    assert (staged, result.set, result.delete, result.unchanged) == (2500, 0, 0, 2500)


def test_write_view_converts_values_to_json_scalars(spark: Any, tmp_path: Path) -> None:
    from pyspark.sql import types as T

    config = ConnectionConfig(url=str(tmp_path / "s.db"))
    schema = T.StructType(
        [
            T.StructField("id", T.LongType()),
            T.StructField("price", T.DecimalType(10, 2)),
            T.StructField("whole", T.DecimalType(10, 0)),
            T.StructField("day", T.DateType()),
            T.StructField("at", T.TimestampNTZType()),
            T.StructField("at_local", T.TimestampType()),
            T.StructField("wait", T.DayTimeIntervalType()),
            T.StructField("ratio", T.FloatType()),
            T.StructField("name", T.StringType()),
            T.StructField("missing", T.StringType()),
        ]
    )
    df = spark.createDataFrame(
        [
            (
                7,
                decimal.Decimal("12.34"),
                decimal.Decimal("5"),
                dt.date(2026, 1, 2),
                dt.datetime(2026, 1, 2, 3, 4, 5),
                dt.datetime(2026, 7, 2, 3, 4, 5, 250000),
                dt.timedelta(minutes=1, seconds=30, microseconds=500000),
                0.5,
                "x",
                None,
            )
        ],
        schema,
    )
    backend = open_backend(config)
    with StateTable(backend, "persistent://public/default/types") as t:
        view = t.create_view()
        assert write_view(df, config=config, table_topic="types", view_id=view.view_id, key_column="id") == 1
        t.apply(view.view_id)
        assert t.get("7", latest=True) == {
            "price": 12.34,
            "whole": 5,
            "day": "2026-01-02",
            "at": "2026-01-02T03:04:05",
            "at_local": "2026-07-02T03:04:05.250000",
            "wait": 90.5,  # a TIMESTAMP in local wall time, as Row gives it
            "ratio": 0.5,
            "name": "x",
            "missing": None,
        }
    backend.close()


def test_write_view_names_the_column_of_bad_input(spark: Any, tmp_path: Path) -> None:
    from pyspark.errors import PythonException
    from pyspark.sql import functions as F

    config = ConnectionConfig(url=str(tmp_path / "s.db"))
    base = spark.range(0, 3).select(F.col("id").cast("string").alias("k"), F.col("id").alias("v"))

    def write(df: Any, **kwargs: Any) -> int:
        options = {"config": config, "table_topic": "bad", "view_id": "v1", "key_column": "k", **kwargs}
        return write_view(df, **options)

    with pytest.raises(ConfigurationError, match="key column 'sku' is not in the DataFrame.*k, v"):
        write(base, key_column="sku")
    with pytest.raises(SerializationError, match="column 'tags' has type array<string>"):
        write(base.withColumn("tags", F.array(F.lit("a"))))
    with pytest.raises(SerializationError, match="column 'm' has type map<string,bigint>"):
        write(base.withColumn("m", F.create_map(F.lit("a"), F.col("v"))))
    with pytest.raises(SerializationError, match="column 'blob' has type binary"):
        write(base.withColumn("blob", F.lit(b"x")))
    with pytest.raises(ConfigurationError, match="key column 'd' has type double"):
        write(base.withColumn("d", F.lit(1.5)), key_column="d")
    with pytest.raises(ConfigurationError, match="batch_rows"):
        write(base, batch_rows=0)

    # value errors surface from the executors, still naming the column (the view is not even open)
    with StateTable(open_backend(config), "persistent://public/default/bad") as t:
        t.create_view(view_id="v1")
    with pytest.raises(PythonException, match=r"column 'ratio', key '\d': nan is not a finite number"):
        write(base.withColumn("ratio", F.lit(float("nan"))))
    with pytest.raises(PythonException, match="key column 'k' is null"):
        write(base.withColumn("k", F.lit(None).cast("string")))


def test_write_view_of_an_empty_frame_stages_nothing(spark: Any, config: ConnectionConfig, table: StateTable) -> None:
    table.put("old", {"x": 1})
    df = spark.range(0, 0).selectExpr("cast(id as string) as key", "id as x")
    view = table.create_view()
    assert write_view(df, config=config, table_topic=table.topic, view_id=view.view_id, key_column="key") == 0
    assert table.view_info(view.view_id).sealed == {}  # sealed by the driver: nothing staged
    with pytest.raises(ViewGuardError, match="would delete 1 key"):  # the safe default refuses
        table.apply(view.view_id)
    result = table.apply(view.view_id, max_deletes=1)
    assert (result.set, result.delete) == (0, 1)  # an empty view, explicitly allowed, means an empty table
    assert table.size(latest=True) == 0


# ---------------------------------------------------------------------------------- read_table
def test_read_table_infers_columns(spark: Any, config: ConnectionConfig, table: StateTable) -> None:
    table.put("a", {"n": 1, "mixed": 1, "flag": True, "text": "x", "either": "s"})
    table.put("b", {"n": 2, "mixed": 2.5, "flag": None, "either": 3, "big": 2**70})
    df = read_table(spark, config=config, table_topic=table.topic, key_column="sku")
    types = {f.name: f.dataType.simpleString() for f in df.schema.fields}
    assert types == {
        "sku": "string",
        "big": "string",
        "either": "string",
        "flag": "boolean",
        "mixed": "double",
        "n": "bigint",
        "text": "string",
    }
    rows = {r["sku"]: r.asDict() for r in df.collect()}
    assert rows["a"] == {"sku": "a", "big": None, "either": "s", "flag": True, "mixed": 1.0, "n": 1, "text": "x"}
    assert rows["b"] == {"sku": "b", "big": str(2**70), "either": "3", "flag": None, "mixed": 2.5, "n": 2, "text": None}

    with pytest.raises(ConfigurationError, match="field named 'n'"):
        read_table(spark, config=config, table_topic=table.topic, key_column="n")


def test_read_table_of_an_empty_table(spark: Any, config: ConnectionConfig, topic: str) -> None:
    df = read_table(spark, config=config, table_topic=topic)
    assert df.columns == ["key"] and df.count() == 0


# ---------------------------------------------------------------------------------- config passing
def test_dump_and_load_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    relative = ConnectionConfig(url="state.db", auth_token="t0k")
    text = dump_config(relative)
    assert json.loads(text)["url"] == str(tmp_path / "state.db")
    assert "t0k" not in text
    assert load_config(text, environ={}).url == str(tmp_path / "state.db")
    assert load_config(text, environ={AUTH_TOKEN_ENV: "t0k"}).auth_token == "t0k"
    assert load_config(dump_config(relative, include_token=True), environ={}).auth_token == "t0k"

    monkeypatch.setenv("AIRFLOW_HOME", str(tmp_path / "home"))
    assert portable_config(ConnectionConfig()).url == str(tmp_path / "home" / "pulsarstate" / "state.db")
    assert portable_config({"url": "pulsar://h:6650"}).url == "pulsar://h:6650"

    with pytest.raises(ConfigurationError, match="absolute path"):
        load_config('{"url": "state.db"}')
    with pytest.raises(ConfigurationError, match="absolute path"):
        load_config("{}")
    with pytest.raises(ConfigurationError, match="unknown field.*'service_url'"):
        load_config('{"service_url": "pulsar://h:6650"}')
    with pytest.raises(ConfigurationError, match="not valid JSON"):
        load_config("{")
    with pytest.raises(ConfigurationError, match="must be an object"):
        load_config("[]")
    assert os.path.isabs(load_config(dump_config(ConnectionConfig())).url)
