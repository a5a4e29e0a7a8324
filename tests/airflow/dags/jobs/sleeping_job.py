"""A Spark job that records when it started, runs a small computation, then sleeps (to be killed)."""

from __future__ import annotations

import argparse
import sys
import time


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument(
        "--marker", required=True, help="file the job appends 'spark-start <time>' / 'spark-end <time>' to"
    )
    parser.add_argument("--seconds", type=float, default=60.0)
    args = parser.parse_args()

    from pyspark.sql import SparkSession

    spark = SparkSession.builder.appName("sleeping-job").getOrCreate()
    try:
        assert spark.range(0, 1000).count() == 1000
        with open(args.marker, "a") as out:
            out.write(f"spark-start {time.time()}\n")
        time.sleep(args.seconds)
        with open(args.marker, "a") as out:
            out.write(f"spark-end {time.time()}\n")
    finally:
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
