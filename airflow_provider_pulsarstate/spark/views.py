"""Write a Spark DataFrame into a temp view of a state table, and read a table into a DataFrame.

Both run inside a Spark application (``spark-submit``); nothing here imports Airflow. A typical
job, handed the view by :class:`~airflow_provider_pulsarstate.operators.views.CreateTempViewOperator`::

    from airflow_provider_pulsarstate.spark import load_config, write_view

    config = load_config(args.config_json)          # plus $PULSARSTATE_AUTH_TOKEN, if set
    prices = spark.read.parquet("s3://.../prices")  # one row per key
    staged = write_view(prices, config=config, table_topic=args.table_topic,
                        view_id=args.view_id, key_column="sku")

Every executor partition opens its own back end from the config and stages its rows through a
:class:`~airflow_provider_pulsarstate.engine.recipes.table.ViewStager`, in batches; the live table and
its readers see nothing until the view is applied.
"""

from __future__ import annotations

import datetime as _dt
import decimal
import itertools
import json
import math
import os
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from airflow_provider_pulsarstate.engine.config import ConnectionConfig
from airflow_provider_pulsarstate.engine.errors import ConfigurationError, SerializationError
from airflow_provider_pulsarstate.spark.requirement import require_pyspark

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import DataType, StructType

    from airflow_provider_pulsarstate.engine.recipes.table import SourceRange

AUTH_TOKEN_ENV = "PULSARSTATE_AUTH_TOKEN"
"""Environment variable a Spark job reads the broker token from (not in JSON; on YARN and Kubernetes
masters the Spark provider would put env_vars in argv, so there use ``token_file`` or a cluster secret)."""

_CONFIG_FIELDS = frozenset(f.name for f in fields(ConnectionConfig))
_INT64 = (-(2**63), 2**63 - 1)


# ---------------------------------------------------------------------------------- config
def portable_config(config: ConnectionConfig | Mapping[str, Any]) -> ConnectionConfig:
    """The config with the embedded state file spelled as an absolute path.

    An empty URL means "under ``$AIRFLOW_HOME``" and a relative path means "under the current
    directory", both of which can differ between the Airflow worker, the Spark driver and its
    executors; the absolute path names the same file everywhere. Pulsar configs are unchanged.

    :raises ConfigurationError: the config is invalid (a dict with an unknown field, a bad URL).
    """
    cfg = _as_config(config)
    if not cfg.is_single_host:
        return cfg
    return cfg.with_options(url=os.path.abspath(cfg.embedded_path))


def dump_config(config: ConnectionConfig | Mapping[str, Any], *, include_token: bool = False) -> str:
    """The config as one JSON object (the ``--config-json`` argument of a Spark job).

    The embedded path is made absolute (:func:`portable_config`). The auth token is left out
    unless ``include_token``: pass it to the job in ``$PULSARSTATE_AUTH_TOKEN`` instead, so it
    shows up in no command line, XCom or log.
    """
    data = asdict(portable_config(config))
    if not include_token:
        data.pop("auth_token", None)
    return json.dumps(data, sort_keys=True)


def load_config(text: str, *, environ: Mapping[str, str] | None = None) -> ConnectionConfig:
    """Parse :func:`dump_config` output; the token comes from ``$PULSARSTATE_AUTH_TOKEN`` when absent.

    The JSON may also carry ``token_file``: the path of a file holding the token (for clusters
    where environment variables travel on the command line); it wins over the variable.

    :raises ConfigurationError: not a JSON object, an unknown field, or an embedded path that is
        not absolute (executors would not find the same file).
    """
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigurationError(f"config JSON is not valid JSON ({exc}): {text[:200]!r}") from None
    if not isinstance(data, dict):
        raise ConfigurationError(f"config JSON must be an object, got {type(data).__name__}")
    env = os.environ if environ is None else environ
    token_file = data.pop("token_file", None)
    if token_file is not None and not data.get("auth_token"):
        if not isinstance(token_file, str) or not token_file:
            raise ConfigurationError(f"config JSON: token_file must be a file path, got {token_file!r}")
        try:
            data["auth_token"] = Path(token_file).read_text().strip() or None
        except OSError as exc:
            raise ConfigurationError(f"config JSON: cannot read token_file {token_file!r}: {exc}") from None
    if not data.get("auth_token") and env.get(AUTH_TOKEN_ENV):
        data["auth_token"] = env[AUTH_TOKEN_ENV]
    cfg = _as_config(data)
    if cfg.is_single_host and not (cfg.url and os.path.isabs(cfg.embedded_path)):
        raise ConfigurationError(
            f"config JSON: the embedded state file must be an absolute path so that every Spark "
            f"process opens the same file, got url={cfg.url!r}"
        )
    return cfg


def _as_config(config: ConnectionConfig | Mapping[str, Any]) -> ConnectionConfig:
    if isinstance(config, ConnectionConfig):
        return config
    if not isinstance(config, Mapping):
        raise ConfigurationError(f"config must be a ConnectionConfig or a dict, got {type(config).__name__}")
    unknown = sorted(set(config) - _CONFIG_FIELDS)
    if unknown:
        raise ConfigurationError(
            f"config: unknown field(s) {', '.join(map(repr, unknown))}; expected {', '.join(sorted(_CONFIG_FIELDS))}"
        )
    return ConnectionConfig(**config)


# ---------------------------------------------------------------------------------- DataFrame -> view
def write_view(
    df: DataFrame,
    *,
    config: ConnectionConfig | Mapping[str, Any],
    table_topic: str,
    view_id: str,
    key_column: str,
    batch_rows: int = 1000,
    source_offsets: Iterable[SourceRange] = (),
) -> int:
    """Stage every row of ``df`` into the open view ``view_id`` of ``table_topic``, then seal it; returns the row count.

    The executors read their rows as Arrow batches (``DataFrame.mapInArrow``: whole columns, no
    Row object per row). Each non-empty partition opens its own back end from ``config`` and a
    :class:`~airflow_provider_pulsarstate.engine.recipes.table.ViewStager`, and stages its rows in
    batches of ``batch_rows``. When every partition succeeded, the driver seals the view with the
    row count of each successful partition's stager (:meth:`StateTable.seal`): apply uses only
    those stagers' rows (a failed or retried task's partial rows are ignored) and refuses if the
    staging topic does not hold exactly those counts (e.g. executors that staged into a private
    embedded file on another host). Every column except ``key_column`` becomes a field of the row's
    record, converted to a JSON scalar: booleans, integers, strings and nulls as they are, finite
    floats as numbers, decimals as numbers (integers when integral), dates and timestamps as ISO
    8601 strings, day-time intervals as seconds. Keys must be unique within ``df`` (a key staged
    twice keeps whichever row came last).

    The column types are checked on the driver before any row is staged; values (null keys,
    NaN/infinite floats) are checked as they are staged. A staged row is harmless until the view
    is applied, and staging the same row again (a retried Spark task) changes nothing.

    :param df: one row per key.
    :param config: where the table lives; an embedded path is made absolute on the driver.
    :param table_topic: the table's topic (short names use the config's tenant and namespace).
    :param view_id: the open view to stage into (from ``StateTable.create_view``).
    :param key_column: the column holding the key (strings or integers).
    :param batch_rows: rows per staged batch.
    :param source_offsets: the source ranges the rows were computed from (exactly-once ingestion,
        see :mod:`airflow_provider_pulsarstate.spark.offsets`): recorded in the seal, published by
        apply with the diff.
    :return: the number of rows staged (the sum of the sealed counts).
    :raises ConfigurationError: ``key_column`` is missing or not a string/integer column, or the
        config is invalid.
    :raises SerializationError: a field column's type has no JSON-scalar form (array, map, struct,
        binary, ...); the message names the column.
    :raises pyspark.errors.PythonException: an executor failed; its message carries ours (a null
        key, a NaN, a view that is not open).
    :raises MissingExtraError: pyspark is not installed (the ``[spark]`` extra).
    """
    require_pyspark("write_view")
    if batch_rows < 1:
        raise ConfigurationError(f"batch_rows must be at least 1, got {batch_rows!r}")
    cfg = portable_config(config)
    key_index, field_plan = _plan_columns(df.schema, key_column)
    plan = _StagePlan(asdict(cfg), cfg.topic_name(table_topic), view_id, batch_rows, key_column, key_index, field_plan)
    # Arrow hands the executors whole columns (no Row object per row); only the attempts Spark kept.
    rows = df.mapInArrow(_partition_stager(plan), "stager string, rows long").collect()
    counts = {r["stager"]: r["rows"] for r in rows}
    _seal(cfg, plan.topic, view_id, counts, list(source_offsets))
    return sum(counts.values())


@dataclass(frozen=True)
class _StagePlan:
    """What every executor needs to stage its partition (pickled to it)."""

    config_dict: dict[str, Any]
    topic: str
    view_id: str
    batch_rows: int
    key_column: str
    key_index: int
    field_plan: list[tuple[str, int, Callable[[Any], Any] | None]]


def _partition_stager(plan: _StagePlan) -> Callable[[Iterator[Any]], Iterator[Any]]:
    """The function ``mapInArrow`` runs per partition: stages it, yields its stager's id and row count."""

    def stage_partition(batches: Iterator[Any]) -> Iterator[Any]:
        import pyarrow as pa

        staged = _stage_batches(batches, plan)
        if staged is not None:  # no back end for an empty partition
            yield pa.RecordBatch.from_pydict({"stager": [staged[0]], "rows": [staged[1]]})

    return stage_partition


def _seal(cfg: ConnectionConfig, topic: str, view_id: str, counts: dict[str, int], sources: list[SourceRange]) -> None:
    """Seal the view from the driver with the per-stager counts the executors returned."""
    from airflow_provider_pulsarstate.engine.backends import open_backend
    from airflow_provider_pulsarstate.engine.recipes.table import StateTable

    backend = open_backend(cfg)
    try:
        table = StateTable(backend, topic)
        try:
            table.seal(view_id, stagers=counts, source_offsets=sources)
        finally:
            table.close()
    finally:
        backend.close()


def _stage_batches(batches: Iterable[Any], plan: _StagePlan) -> tuple[str, int] | None:
    """Stage one partition's Arrow batches (runs on an executor); its stager's id and row count, None if it had no rows."""
    from airflow_provider_pulsarstate.engine.backends import open_backend
    from airflow_provider_pulsarstate.engine.recipes.view_staging import ViewStager

    filled = (batch for batch in batches if batch.num_rows)
    first = next(filled, None)
    if first is None:
        return None
    backend = open_backend(ConnectionConfig(**plan.config_dict))
    try:
        with ViewStager(backend, plan.topic, plan.view_id, batch_rows=plan.batch_rows) as stager:
            for batch in itertools.chain((first,), filled):
                _stage_batch(stager, batch, plan)
        return stager.stager_id, stager.rows_staged
    finally:
        backend.close()


def _stage_batch(stager: Any, batch: Any, plan: _StagePlan) -> None:
    """Stage the rows of one Arrow record batch, column by column (the fields converted as in :func:`_converter`)."""
    columns = batch.columns
    if columns[plan.key_index].null_count:
        raise SerializationError(f"key column {plan.key_column!r} is null in a row of view {plan.view_id!r}")
    keys = columns[plan.key_index].to_pylist()
    if keys and type(keys[0]) is not str:
        keys = [str(key) for key in keys]
    names = [name for name, _, _ in plan.field_plan]
    values = []
    for name, index, convert in plan.field_plan:
        column = columns[index].to_pylist()
        if convert is not None:
            column = _convert_column(column, convert, name, keys)
        values.append(column)
    stage = stager.set
    if not values:
        for key in keys:
            stage(key, {})
        return
    for key, *row in zip(keys, *values):
        stage(key, dict(zip(names, row)))


def _convert_column(column: list[Any], convert: Callable[[Any], Any], name: str, keys: list[str]) -> list[Any]:
    out = []
    for at, value in enumerate(column):
        if value is not None:
            try:
                value = convert(value)
            except ValueError as exc:
                raise SerializationError(f"column {name!r}, key {keys[at]!r}: {exc}") from None
        out.append(value)
    return out


def _plan_columns(
    schema: StructType, key_column: str
) -> tuple[int, list[tuple[str, int, Callable[[Any], Any] | None]]]:
    """Check the schema on the driver; returns the key's index and (name, index, converter) per field."""
    from pyspark.sql import types as T

    names = [f.name for f in schema.fields]
    if key_column not in names:
        raise ConfigurationError(
            f"key column {key_column!r} is not in the DataFrame (columns: {', '.join(names) or 'none'})"
        )
    if names.count(key_column) > 1:
        raise ConfigurationError(f"key column {key_column!r} appears {names.count(key_column)} times in the DataFrame")
    key_index = names.index(key_column)
    key_type = schema.fields[key_index].dataType
    if not isinstance(key_type, (T.StringType, T.ByteType, T.ShortType, T.IntegerType, T.LongType)):
        raise ConfigurationError(
            f"key column {key_column!r} has type {key_type.simpleString()}; keys must be strings or integers"
        )
    seen: set[str] = set()
    plan: list[tuple[str, int, Callable[[Any], Any] | None]] = []
    for index, f in enumerate(schema.fields):
        if index == key_index:
            continue
        if f.name in seen:
            raise SerializationError(f"column {f.name!r} appears more than once; record fields must be unique")
        seen.add(f.name)
        plan.append((f.name, index, _converter(f.name, f.dataType)))
    return key_index, plan


def _converter(name: str, data_type: DataType) -> Callable[[Any], Any] | None:
    """How a column's values become JSON scalars (None: they already are)."""
    from pyspark.sql import types as T

    plain = (T.NullType, T.BooleanType, T.StringType, T.ByteType, T.ShortType, T.IntegerType, T.LongType)
    if isinstance(data_type, plain):
        return None
    if isinstance(data_type, (T.FloatType, T.DoubleType)):
        return _finite
    if isinstance(data_type, T.DecimalType):
        return _decimal
    if isinstance(data_type, T.TimestampType):
        return _iso_local
    if isinstance(data_type, (T.DateType, T.TimestampNTZType)):
        return _iso
    if isinstance(data_type, T.DayTimeIntervalType):
        return _seconds
    raise SerializationError(
        f"column {name!r} has type {data_type.simpleString()}, which is not a JSON scalar; record fields "
        "must be booleans, numbers, strings, dates or timestamps (flatten it, or cast it, e.g. to_json())"
    )


def _finite(value: float) -> float:
    if not math.isfinite(value):
        raise ValueError(f"{value!r} is not a finite number (NaN and infinities have no JSON form)")
    return value


def _decimal(value: decimal.Decimal) -> int | float:
    if not value.is_finite():
        raise ValueError(f"{value!r} is not a finite number")
    return int(value) if value == value.to_integral_value() else float(value)


def _iso(value: _dt.date) -> str:
    return value.isoformat()


def _iso_local(value: _dt.datetime) -> str:
    """A TIMESTAMP as the executor's local wall time, as PySpark's Row conversion gives it (Arrow
    gives it in the session time zone)."""
    if value.tzinfo is not None:
        value = value.astimezone().replace(tzinfo=None)
    return value.isoformat()


def _seconds(value: _dt.timedelta) -> float:
    return value.total_seconds()


# ---------------------------------------------------------------------------------- table -> DataFrame
def read_table(
    spark: SparkSession,
    *,
    config: ConnectionConfig | Mapping[str, Any],
    table_topic: str,
    key_column: str = "key",
) -> DataFrame:
    """The committed state of a table as a DataFrame: ``key_column`` plus one column per field.

    Reads on the driver (the whole table passes through its memory), up to the log's tail at call
    time. Field types are inferred from the values: booleans, 64-bit integers, doubles (integers
    mixed with floats), strings; a field with mixed or out-of-range values becomes a string column
    (JSON text), and a field missing from a record is null. Columns after the key are sorted by
    name.

    :param spark: the active session.
    :param config: where the table lives.
    :param table_topic: the table's topic (short names use the config's tenant and namespace).
    :param key_column: the name of the key column.
    :raises ConfigurationError: a field of the table is called ``key_column``.
    :raises MissingExtraError: pyspark is not installed (the ``[spark]`` extra).
    """
    require_pyspark("read_table")
    from pyspark.sql import types as T

    data = _committed_records(_as_config(config), table_topic)
    kinds = _field_kinds(data, table_topic)
    if key_column in kinds:
        raise ConfigurationError(f"table {table_topic!r} has a field named {key_column!r}; pick another key_column")
    columns = sorted(kinds)
    spark_types = {name: _spark_type(kinds[name] - {"null"}, T) for name in columns}
    as_text = {
        name for name in columns if isinstance(spark_types[name], T.StringType) and kinds[name] - {"null", "str"}
    }
    schema = T.StructType(
        [T.StructField(key_column, T.StringType(), nullable=False)]
        + [T.StructField(name, spark_types[name], nullable=True) for name in columns]
    )
    doubles = {name for name in columns if isinstance(spark_types[name], T.DoubleType)}

    def cell(name: str, value: Any) -> Any:
        if value is None:
            return None
        if name in as_text and not isinstance(value, str):
            return json.dumps(value)
        if name in doubles:
            return float(value)
        return value

    rows = [(key, *(cell(name, record.get(name)) for name in columns)) for key, record in data.items()]
    return spark.createDataFrame(rows, schema)


def _committed_records(cfg: ConnectionConfig, table_topic: str) -> dict[str, Any]:
    """The table's records, read up to the log's tail now, on the driver."""
    from airflow_provider_pulsarstate.engine.backends import open_backend
    from airflow_provider_pulsarstate.engine.recipes.table import StateTable

    backend = open_backend(cfg)
    try:
        with StateTable(backend, cfg.topic_name(table_topic)) as table:
            data: dict[str, Any] = table.to_dict(latest=True)
            return data
    finally:
        backend.close()


def _field_kinds(data: Mapping[str, Any], table_topic: str) -> dict[str, set[str]]:
    """The kinds of value (:func:`_value_kind`) each field holds across the records."""
    kinds: dict[str, set[str]] = {}
    for key, record in data.items():
        if not isinstance(record, dict):
            raise SerializationError(f"table {table_topic!r}, key {key!r}: the value is not a record (dict)")
        for name, value in record.items():
            kinds.setdefault(name, set()).add(_value_kind(value))
    return kinds


def _value_kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int" if _INT64[0] <= value <= _INT64[1] else "bigint"
    if isinstance(value, float):
        return "float"
    if isinstance(value, str):
        return "str"
    return "other"


def _spark_type(kinds: set[str], T: Any) -> Any:
    if kinds == {"bool"}:
        return T.BooleanType()
    if kinds == {"int"}:
        return T.LongType()
    if kinds and kinds <= {"int", "float"}:
        return T.DoubleType()
    return T.StringType()
