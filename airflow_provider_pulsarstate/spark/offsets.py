"""Read a range of a topic's offsets into a Spark DataFrame, split across executors.

The other half of exactly-once ingestion into a state table (see
:class:`~airflow_provider_pulsarstate.engine.recipes.table.SourceRange`): a job reads where the table's
record says to start, snapshots the end offsets, reads exactly that range, folds it into the
table and seals its view with the range::

    from airflow_provider_pulsarstate.engine.recipes.table import source_ranges
    from airflow_provider_pulsarstate.spark import ingestion_range, read_offset_range, table_snapshot, write_view

    rows, recorded = table_snapshot(config, table_topic=table, source_topic=events)   # one consistent read
    start, end = ingestion_range(config, topic=events, recorded=recorded)          # end: a snapshot
    events_df = read_offset_range(spark, config=config, topic=events, start=start, end=end)
    new_table = fold(rows, events_df)                                              # the job's own logic
    write_view(new_table, config=config, table_topic=table, view_id=view_id, key_column="sku",
               source_offsets=source_ranges(events, start, end))

Apply then publishes the diff and the range's next offsets in one commit record, and refuses the
view if another run consumed from the same start first. Nothing here imports Airflow.
"""

from __future__ import annotations

import datetime as _dt
import logging
from collections.abc import Iterator, Mapping
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from airflow_provider_pulsarstate.engine.config import ConnectionConfig
from airflow_provider_pulsarstate.engine.errors import ConfigurationError, OffsetError
from airflow_provider_pulsarstate.spark.requirement import require_pyspark
from airflow_provider_pulsarstate.spark.views import _as_config, portable_config

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

log = logging.getLogger(__name__)

DEFAULT_OFFSETS_PER_SPLIT = 50_000
"""Offsets each Spark task pulls at most (a partition's range is cut into splits of this many offsets)."""


def message_schema() -> StructType:
    """The schema of :func:`read_offset_range`'s DataFrame.

    :raises MissingExtraError: pyspark is not installed (the ``[spark]`` extra).
    """
    require_pyspark("message_schema")
    from pyspark.sql import types as T

    return T.StructType(
        [
            T.StructField("partition", T.IntegerType(), nullable=False),
            T.StructField("offset", T.LongType(), nullable=False),
            T.StructField("key", T.StringType(), nullable=True),
            T.StructField("value", T.BinaryType(), nullable=False),
            T.StructField("publish_time", T.TimestampType(), nullable=True),
            T.StructField("properties", T.MapType(T.StringType(), T.StringType()), nullable=False),
        ]
    )


def plan_splits(
    start: Mapping[int, int], end: Mapping[int, int], *, offsets_per_split: int = DEFAULT_OFFSETS_PER_SPLIT
) -> list[tuple[int, int, int]]:
    """Cut each partition's ``[start[p], end[p])`` into ``(partition, lo, hi)`` splits of at most
    ``offsets_per_split`` offsets, by offset (never by message count: offsets may skip numbers).

    :raises ConfigurationError: the mappings name different partitions, an end below its start, or
        a bad split size.
    """
    if offsets_per_split < 1:
        raise ConfigurationError(f"offsets_per_split must be at least 1, got {offsets_per_split!r}")
    if set(start) != set(end):
        raise ConfigurationError(f"start offsets name partitions {sorted(start)}, end offsets {sorted(end)}")
    splits = []
    for partition in sorted(start):
        lo, hi = int(start[partition]), int(end[partition])
        if lo < 0 or hi < lo:
            raise ConfigurationError(f"partition {partition}: bad offset range [{lo}, {hi})")
        for first in range(lo, hi, offsets_per_split):
            splits.append((int(partition), first, min(first + offsets_per_split, hi)))
    return splits


def read_offset_range(
    spark: SparkSession,
    *,
    config: ConnectionConfig | Mapping[str, Any],
    topic: str,
    start: Mapping[int, int],
    end: Mapping[int, int],
    offsets_per_split: int = DEFAULT_OFFSETS_PER_SPLIT,
    max_messages: int = 500,
    pull_timeout: float = 1.0,
) -> DataFrame:
    """Exactly the messages of ``topic`` with ``start[p] <= offset < end[p]``, as a DataFrame.

    Columns: ``partition`` (int), ``offset`` (long), ``key`` (string), ``value`` (binary),
    ``publish_time`` (timestamp), ``properties`` (map<string,string>); no order is promised (sort
    by ``partition, offset``). Each range is cut into splits of ``offsets_per_split`` offsets
    (:func:`plan_splits`); every split is one Spark task that opens its own back end and pulls its
    sub-range with a :class:`~airflow_provider_pulsarstate.engine.offsets.PullConsumer` (no
    subscription: nothing is committed). A retried task pulls the same messages again.

    The DataFrame is lazy: each action pulls again, so ``cache()`` it when it is used twice.

    :param config: where the topic lives (an embedded path is made absolute on the driver).
    :param topic: the topic (short names use the config's tenant and namespace).
    :param start: partition -> first offset (inclusive); a non-partitioned topic is partition 0.
    :param end: partition -> end offset (exclusive), e.g. a snapshot of ``end_offsets()``.
    :param max_messages: messages per pull.
    :param pull_timeout: seconds a pull waits at the partition's end before the split is done.
    :raises ConfigurationError: bad ranges (on the driver, before any task runs).
    :raises pyspark.errors.PythonException: a task failed; its message carries ours (an
        :class:`OffsetOutOfRangeError` when ``start`` was trimmed by retention: messages are lost).
    :raises MissingExtraError: pyspark is not installed (the ``[spark]`` extra).
    """
    require_pyspark("read_offset_range")
    cfg = portable_config(config)
    full_topic = cfg.topic_name(topic)
    splits = plan_splits(start, end, offsets_per_split=offsets_per_split)
    schema = message_schema()
    if not splits:
        return spark.createDataFrame([], schema)
    config_dict = asdict(cfg)

    def pull(split: tuple[int, int, int]) -> Iterator[tuple[Any, ...]]:
        partition, lo, hi = split
        yield from _pull_split(
            config_dict, full_topic, partition, lo, hi, max_messages=max_messages, timeout=pull_timeout
        )

    rdd = spark.sparkContext.parallelize(splits, numSlices=len(splits)).flatMap(pull)
    return spark.createDataFrame(rdd, schema)


def _pull_split(
    config_dict: dict[str, Any], topic: str, partition: int, lo: int, hi: int, *, max_messages: int, timeout: float
) -> Iterator[tuple[Any, ...]]:
    """The messages of one split (runs on an executor)."""
    from airflow_provider_pulsarstate.engine.backends import open_backend
    from airflow_provider_pulsarstate.engine.offsets import PullConsumer

    backend = open_backend(ConnectionConfig(**config_dict))
    try:
        with PullConsumer(backend, topic, reader_pool_size=1) as consumer:
            offset = lo
            while offset < hi:
                result = consumer.pull(offset, partition=partition, max_messages=max_messages, timeout=timeout)
                if not result.messages:
                    if result.end_offset >= hi:
                        return  # only skipped offsets (no messages) left below hi
                    raise OffsetError(
                        f"{topic} partition {partition}: the range [{lo}, {hi}) ends past the partition's end "
                        f"offset {result.end_offset} (pulled up to {offset}); was the end snapshot from another topic?"
                    )
                for m in result.messages:
                    if m.offset >= hi:
                        return
                    yield (
                        partition,
                        m.offset,
                        m.key,
                        bytes(m.value),
                        _dt.datetime.fromtimestamp(m.publish_time, tz=_dt.timezone.utc) if m.publish_time else None,
                        dict(m.properties),
                    )
                offset = result.next_offset
    finally:
        backend.close()


def table_snapshot(
    config: ConnectionConfig | Mapping[str, Any], *, table_topic: str, source_topic: str
) -> tuple[dict[str, dict[str, Any]], dict[int, int]]:
    """A state table's rows and its recorded next offsets of ``source_topic``, from one consistent
    state (:meth:`StateTable.rows_with_source_offsets`), read on the driver.

    :param table_topic, source_topic: short names use the config's tenant and namespace.
    """
    from airflow_provider_pulsarstate.engine.backends import open_backend
    from airflow_provider_pulsarstate.engine.recipes.table import StateTable

    cfg = _as_config(config)
    backend = open_backend(cfg)
    try:
        with StateTable(backend, cfg.topic_name(table_topic)) as table:
            return table.rows_with_source_offsets(cfg.topic_name(source_topic))
    finally:
        backend.close()


def ingestion_range(
    config: ConnectionConfig | Mapping[str, Any],
    *,
    topic: str,
    recorded: Mapping[int, int],
    end: Mapping[int, int] | None = None,
) -> tuple[dict[int, int], dict[int, int]]:
    """The offsets to ingest next: ``(start, end)`` per partition of ``topic``.

    ``start`` is the table's ``recorded`` next offset, or the partition's beginning where the table
    records none (a new table, or a partition added since); ``end`` is ``end`` when given (e.g.
    the offsets a sensor saw) or a snapshot of the end offsets now. An end below its start (the
    table already consumed past the given snapshot) becomes an empty range at the start.

    :raises ConfigurationError: ``recorded`` or ``end`` names a partition the topic does not have.
    :raises OffsetOutOfRangeError: the recorded start is below the retained range (retention trimmed
        messages the table never consumed: they are lost, and this says so instead of skipping them).
    """
    from airflow_provider_pulsarstate.engine.backends import open_backend
    from airflow_provider_pulsarstate.engine.errors import OffsetOutOfRangeError
    from airflow_provider_pulsarstate.engine.offsets import PullConsumer

    cfg = _as_config(config)
    full_topic = cfg.topic_name(topic)
    backend = open_backend(cfg)
    try:
        with PullConsumer(backend, full_topic) as consumer:
            partitions = consumer.partitions()
            for name, mapping in (("recorded", recorded), ("end", end or {})):
                unknown = sorted(set(map(int, mapping)) - set(partitions))
                if unknown:
                    raise ConfigurationError(
                        f"{name} offsets name partition(s) {unknown} that {full_topic} does not have"
                    )
            beginning = consumer.beginning_offsets()
            now = consumer.end_offsets() if end is None else {int(p): int(o) for p, o in end.items()}
        start = {}
        for p in partitions:
            first = recorded.get(p)
            if first is not None and first < beginning[p]:
                raise OffsetOutOfRangeError(
                    f"{full_topic} partition {p}: the table's recorded offset {first} is below the retained "
                    f"beginning {beginning[p]}: messages [{first}, {beginning[p]}) were trimmed before they were consumed",
                    topic=full_topic,
                    partition=p,
                    offset=first,
                    beginning=beginning[p],
                    end=now.get(p, beginning[p]),
                )
            start[p] = beginning[p] if first is None else int(first)
        stop = {p: max(start[p], now.get(p, start[p])) for p in partitions}
        return start, stop
    finally:
        backend.close()
