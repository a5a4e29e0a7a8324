"""A Spark job that stages some rows into its view, records how many, then fails (exit code 3)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--view-id", required=True)
    parser.add_argument("--table-topic", required=True)
    parser.add_argument("--config-json", required=True)
    parser.add_argument("--marker", required=True, help="file to write the staged row count to")
    args = parser.parse_args()

    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    from airflow_provider_pulsarstate.spark import load_config, write_view

    spark = SparkSession.builder.appName("failing-job").getOrCreate()
    try:
        rows = spark.range(0, 300).select(
            F.format_string("sku-%06d", F.col("id")).alias("sku"), (F.col("id") * 2).alias("stock")
        )
        staged = write_view(
            rows,
            config=load_config(args.config_json),
            table_topic=args.table_topic,
            view_id=args.view_id,
            key_column="sku",
        )
    finally:
        spark.stop()
    Path(args.marker).write_text(str(staged))
    print(f"staged {staged} rows, now failing on purpose", file=sys.stderr)
    return 3


if __name__ == "__main__":
    sys.exit(main())
