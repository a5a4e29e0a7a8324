"""Spark job: fold the new price-change events of a topic into the price table, exactly once.

Run by ``spark-submit`` (the ingestion pipeline's SparkSubmitOperator)::

    spark-submit price_events_job.py --source-topic persistent://public/default/price-events \\
        --view-id V --table-topic persistent://public/default/price-events-table --config-json '{...}'

1. Read the table and its recorded offsets of the source topic in one consistent read
   (``table_snapshot``): where the last applied run stopped. Never the subscription's cursor.
2. Snapshot the end offsets (or take ``--end-offsets-json``); the range is [recorded, end).
3. Pull exactly that range from the executors (``read_offset_range``), fold each sku's events
   into its row: the latest price, the stock plus the sum of the stock deltas, the event count.
4. Stage the whole new table into the view and seal it with the range (``write_view``): apply
   publishes only the changed rows and the consumed offsets, in one commit record.

The events, and the table they fold into, are pure functions of (batch, events, skus):
:func:`batch_events` and :func:`fold` compute them in plain Python for the upstream task, the
tests and ``dev/run_example.py``, independently of Spark. No randomness: :func:`mix` is a fixed
integer hash that stays below 2**62.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from collections.abc import Iterable
from typing import Any

log = logging.getLogger("price_events_job")

DEFAULT_SKUS = 100_000
DEFAULT_EVENTS = 10_000
_P = 2_147_483_647


# ---------------------------------------------------------------------------------- the events
def mix(a: int, b: int) -> int:
    """A deterministic hash of two non-negative integers into [0, 2**31 - 1)."""
    x = ((a % _P) * 48_271 + (b % _P) * 16_807 + 11) % _P
    x = x * x % _P
    x = (x * 69_621 + 12_345) % _P
    return x * x % _P


def batch_events(batch: int, events: int = DEFAULT_EVENTS, skus: int = DEFAULT_SKUS) -> list[dict[str, Any]]:
    """Batch ``batch`` (>= 1) of price-change events, in publish order: each sets a sku's price
    and moves its stock by a delta in [-10, 10]."""
    out = []
    for seq in range(events):
        i = mix(batch, seq) % skus
        out.append(
            {
                "sku": f"sku-{i:06d}",
                "price": (199 + mix(batch * 100_003 + seq, 3) % 99_800) / 100,
                "stock_delta": mix(seq, batch + 17) % 21 - 10,
                "batch": batch,
                "seq": seq,
            }
        )
    return out


def encode(event: dict[str, Any]) -> bytes:
    return json.dumps(event, sort_keys=True, separators=(",", ":")).encode()


def fold(events: Iterable[dict[str, Any]], table: dict[str, dict[str, Any]] | None = None) -> dict[str, dict[str, Any]]:
    """The price table after ``events`` (in order per sku), from ``table``: every event counted once."""
    out = {key: dict(row) for key, row in (table or {}).items()}
    for e in events:
        row = out.setdefault(e["sku"], {"price": e["price"], "stock": 0, "events": 0})
        row["price"] = e["price"]
        row["stock"] += e["stock_delta"]
        row["events"] += 1
    return out


def expected_runs(
    batches: int, events: int = DEFAULT_EVENTS, skus: int = DEFAULT_SKUS
) -> tuple[list[dict[str, int]], dict[str, dict[str, Any]]]:
    """The truth for runs of batches 1..``batches`` in plain Python: the counts each run's ``report``
    gives (events published and consumed, rows set / deleted / unchanged, table rows) and the table
    after the last run."""
    reports: list[dict[str, int]] = []
    table: dict[str, dict[str, Any]] = {}
    for batch in range(1, batches + 1):
        batch_list = batch_events(batch, events, skus)
        touched = {e["sku"] for e in batch_list}
        unchanged = len(table.keys() - touched)
        table = fold(batch_list, table)
        reports.append(
            {
                "events_published": events,
                "offsets_consumed": events,
                "set": len(touched),
                "delete": 0,
                "unchanged": unchanged,
                "table_rows": len(table),
            }
        )
    return reports, table


# ---------------------------------------------------------------------------------- the job
def fold_frame(spark: Any, table: dict[str, dict[str, Any]], events: Any) -> Any:
    """The new table as a DataFrame (sku, price, stock, events): ``table`` plus ``events`` folded in."""
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    event_schema = T.StructType(
        [
            T.StructField("sku", T.StringType()),
            T.StructField("price", T.DoubleType()),
            T.StructField("stock_delta", T.LongType()),
        ]
    )
    parsed = events.select(
        "partition", "offset", F.from_json(F.col("value").cast("string"), event_schema).alias("e")
    ).select("partition", "offset", "e.*")
    bad = parsed.where(F.col("sku").isNull() | F.col("price").isNull() | F.col("stock_delta").isNull())
    if bad.limit(1).count():
        first = bad.first()
        raise ValueError(f"event at partition {first['partition']} offset {first['offset']} is not a price event")
    changes = parsed.groupBy("sku").agg(
        F.max_by("price", F.struct("partition", "offset")).alias(
            "new_price"
        ),  # the latest (keys stay in one partition)
        F.sum("stock_delta").alias("delta"),
        F.count(F.lit(1)).alias("n"),
    )
    old = spark.createDataFrame(
        [(k, float(r["price"]), int(r["stock"]), int(r["events"])) for k, r in table.items()],
        "sku string, price double, stock long, events long",
    )
    joined = old.join(changes, "sku", "full_outer")
    return joined.select(
        "sku",
        F.coalesce("new_price", "price").alias("price"),
        (F.coalesce("stock", F.lit(0)) + F.coalesce("delta", F.lit(0))).alias("stock"),
        (F.coalesce("events", F.lit(0)) + F.coalesce("n", F.lit(0))).alias("events"),
    )


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source-topic", required=True, help="the topic of price-change events")
    parser.add_argument("--view-id", required=True, help="the open temp view to stage into")
    parser.add_argument("--table-topic", required=True, help="the state table's topic")
    parser.add_argument("--config-json", required=True, help="the ConnectionConfig as JSON (no token)")
    parser.add_argument(
        "--end-offsets-json", default="", help='end offsets to read up to, {"0": 120, ...} (default: now)'
    )
    parser.add_argument("--offsets-per-split", type=int, default=5_000, help="offsets per Spark task")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    args = parse_args(sys.argv[1:] if argv is None else argv)

    from pyspark.sql import SparkSession

    from airflow_provider_pulsarstate.engine.recipes.table import source_ranges
    from airflow_provider_pulsarstate.spark import (
        ingestion_range,
        load_config,
        read_offset_range,
        table_snapshot,
        write_view,
    )

    config = load_config(args.config_json)
    source = config.topic_name(args.source_topic)
    end = {int(p): int(o) for p, o in json.loads(args.end_offsets_json).items()} if args.end_offsets_json else None
    started = time.monotonic()
    rows, recorded = table_snapshot(config, table_topic=args.table_topic, source_topic=source)
    start, stop = ingestion_range(config, topic=source, recorded=recorded, end=end)
    log.info(
        "table %s: %d rows, recorded offsets %s; reading %s [%s, %s)",
        args.table_topic,
        len(rows),
        recorded,
        source,
        start,
        stop,
    )
    spark = SparkSession.builder.appName("price-events").getOrCreate()
    try:
        events = read_offset_range(
            spark, config=config, topic=source, start=start, end=stop, offsets_per_split=args.offsets_per_split
        ).cache()
        consumed = events.count()
        staged = write_view(
            fold_frame(spark, rows, events),
            config=config,
            table_topic=args.table_topic,
            view_id=args.view_id,
            key_column="sku",
            source_offsets=source_ranges(source, start, stop),
        )
    finally:
        spark.stop()
    log.info(
        "%d events of %s folded into %d rows of view %s in %.1fs (offsets %s -> %s, %s back end)",
        consumed,
        source,
        staged,
        args.view_id,
        time.monotonic() - started,
        start,
        stop,
        config.kind,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
