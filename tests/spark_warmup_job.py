"""A small Spark job doing what the suite's jobs do (JSON parsing, a grouped aggregate with a
struct ordering, a full outer join, a Python data source of rows, ``mapInArrow`` and ``collect``),
so that the class archive written at its exit (``tests/spark_jvm.py``) holds the classes they load."""

from __future__ import annotations

import json

from pyspark.sql import SparkSession
from pyspark.sql import functions as F


def main() -> None:
    spark = SparkSession.builder.appName("class-archive-warmup").getOrCreate()
    try:
        events = spark.createDataFrame(
            [(i % 2, i, json.dumps({"sku": f"s{i % 50}", "price": i / 10, "stock_delta": 1})) for i in range(500)],
            "partition int, offset long, value string",
        )
        parsed = events.select(
            "partition", "offset", F.from_json("value", "sku string, price double, stock_delta long").alias("e")
        ).select("partition", "offset", "e.*")
        changes = parsed.groupBy("sku").agg(
            F.max_by("price", F.struct("partition", "offset")).alias("price"),
            F.sum("stock_delta").alias("delta"),
            F.count(F.lit(1)).alias("n"),
        )
        old = spark.createDataFrame([("s1", 1.0, 3)], "sku string, price double, stock long")
        joined = old.join(changes, "sku", "full_outer").select("sku", F.coalesce(changes["price"], old["price"]))

        def count_rows(batches):  # type: ignore[no-untyped-def]
            import pyarrow as pa

            for batch in batches:
                yield pa.RecordBatch.from_pydict({"rows": [batch.num_rows]})

        counted = joined.mapInArrow(count_rows, "rows long").collect()
        assert sum(r["rows"] for r in counted) == 50, counted
    finally:
        spark.stop()


if __name__ == "__main__":
    main()
