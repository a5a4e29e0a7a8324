"""read_offset_range: an offset range of a topic into a DataFrame, split across executors, on both back ends.

Expectations come from a sequential PullConsumer drain of the same topic (offsets are not assumed
dense: a Pulsar broker may give indexes to system messages), never from Spark.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_pulsarstate import ConfigurationError, ConnectionConfig, open_backend
from airflow_provider_pulsarstate.engine.errors import OffsetOutOfRangeError
from airflow_provider_pulsarstate.engine.offsets import PullConsumer, create_topic, open_publisher
from airflow_provider_pulsarstate.spark import ingestion_range, plan_splits, read_offset_range
from tests.airflow.test_spark_views import spark  # noqa: F401  (the module's local SparkSession)


def _publish(config: ConnectionConfig, topic: str, n: int, *, partitions: int) -> dict[tuple[int, int], tuple]:
    """Publish ``n`` keyed messages; returns (partition, offset) -> (key, value, properties) as pulled back."""
    backend = open_backend(config)
    try:
        create_topic(backend, topic, partitions=partitions)
        with open_publisher(backend, topic, batching=True) as publisher:
            for i in range(n):
                publisher.send(f"v{i:05d}".encode(), key=f"k{i % 17}", properties={"i": str(i)})
            publisher.flush(timeout=30.0)
        out = {}
        with PullConsumer(backend, topic) as consumer:
            for p in consumer.partitions():
                offset = consumer.beginning_offsets()[p]
                while True:
                    result = consumer.pull(offset, partition=p, max_messages=97)
                    if not result.messages:
                        break
                    out.update({(p, m.offset): (m.key, m.value, dict(m.properties)) for m in result.messages})
                    offset = result.next_offset
        assert len(out) == n
        return out
    finally:
        backend.close()


def test_plan_splits_cuts_by_offset() -> None:
    assert plan_splits({0: 3, 1: 10}, {0: 10, 1: 10}, offsets_per_split=3) == [(0, 3, 6), (0, 6, 9), (0, 9, 10)]
    assert plan_splits({}, {}) == []
    with pytest.raises(ConfigurationError, match=r"start offsets name partitions \[0\], end offsets \[1\]"):
        plan_splits({0: 0}, {1: 0})
    with pytest.raises(ConfigurationError, match=r"partition 0: bad offset range \[5, 4\)"):
        plan_splits({0: 5}, {0: 4})
    with pytest.raises(ConfigurationError, match="offsets_per_split"):
        plan_splits({0: 0}, {0: 1}, offsets_per_split=0)


def test_read_offset_range_yields_exactly_the_range(spark: Any, backend_config: ConnectionConfig) -> None:
    topic = f"persistent://public/default/events-{uuid.uuid4().hex[:8]}"
    published = _publish(backend_config, topic, 400, partitions=2)
    by_partition: dict[int, list[int]] = {}
    for p, offset in sorted(published):
        by_partition.setdefault(p, []).append(offset)
    # start inside the partitions (inside a batch on Pulsar), end before the tail of partition 1
    start = {p: offsets[len(offsets) // 3] for p, offsets in by_partition.items()}
    end = {0: by_partition[0][-1] + 1, 1: by_partition[1][-5]}
    expected = {k: v for k, v in published.items() if start[k[0]] <= k[1] < end[k[0]]}

    df = read_offset_range(
        spark, config=backend_config, topic=topic, start=start, end=end, offsets_per_split=23, max_messages=10
    )
    rows = df.collect()
    assert df.rdd.getNumPartitions() == len(plan_splits(start, end, offsets_per_split=23))
    got = {(r["partition"], r["offset"]): (r["key"], bytes(r["value"]), dict(r["properties"])) for r in rows}
    assert len(rows) == len(got) == len(expected)  # no duplicates
    assert got == expected
    assert all(r["publish_time"] is not None for r in rows)

    # the ingestion range: the table's record where it has one, the beginning elsewhere, end now
    begin, stop = ingestion_range(backend_config, topic=topic, recorded={1: start[1]})
    assert begin == {0: by_partition[0][0], 1: start[1]}
    assert stop == {0: by_partition[0][-1] + 1, 1: by_partition[1][-1] + 1}
    assert (
        ingestion_range(backend_config, topic=topic, recorded={1: start[1]}, end={0: 0, 1: 0})[1] == begin
    )  # clamped: empty
    with pytest.raises(ConfigurationError, match="partition.*\\[2\\] that .* does not have"):
        ingestion_range(backend_config, topic=topic, recorded={2: 0})

    empty = read_offset_range(spark, config=backend_config, topic=topic, start=stop, end=stop)
    assert empty.count() == 0


def test_a_trimmed_start_is_an_error_not_a_silent_skip(spark: Any, tmp_path: Path) -> None:
    from airflow_provider_pulsarstate.engine.offsets.embedded import trim_embedded_topic

    config = ConnectionConfig(url=str(tmp_path / "s.db"))
    _publish(config, "persistent://public/default/trimmed", 30, partitions=0)
    backend = open_backend(config)
    trim_embedded_topic(backend, "persistent://public/default/trimmed", 10)  # type: ignore[arg-type]
    backend.close()
    with pytest.raises(OffsetOutOfRangeError, match=r"recorded offset 4 is below the retained beginning 10.*\[4, 10\)"):
        ingestion_range(config, topic="trimmed", recorded={0: 4})
    from pyspark.errors import PythonException

    with pytest.raises(PythonException, match="OffsetOutOfRangeError"):
        read_offset_range(spark, config=config, topic="trimmed", start={0: 4}, end={0: 30}).collect()
