"""A Spark job that writes the ``spark.openlineage.*`` properties it was submitted with to a JSON file
(what the OpenLineage Spark integration would read to link its run to the Airflow task)."""

from __future__ import annotations

import argparse
import json
import sys


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True, help="the JSON file to write")
    args = parser.parse_args()

    from pyspark.sql import SparkSession

    spark = SparkSession.builder.appName("openlineage-conf-job").getOrCreate()
    try:
        conf = {k: v for k, v in spark.sparkContext.getConf().getAll() if k.startswith("spark.openlineage.")}
        with open(args.out, "w") as out:
            json.dump(conf, out)
    finally:
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
