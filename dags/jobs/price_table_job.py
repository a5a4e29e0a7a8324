"""Spark job: compute version N of a price table and stage it into an open temp view.

Run by ``spark-submit`` (the example pipeline's SparkSubmitOperator)::

    spark-submit price_table_job.py --version 2 --rows 100000 --view-id V \\
        --table-topic persistent://public/default/price-table --config-json '{"url": "/abs/state.db", ...}'

The table is a pure function of (sku, version, rows), computed twice from one formula: with
Spark columns here (``spark.range``), and with Python ints by :func:`price_table`, which the tests
and ``dev/run_example.py`` use to know the true diff between two versions independently of Spark.

* Version 1 holds skus ``sku-000000`` .. ``sku-<rows-1>``, each ``{"price", "currency", "stock"}``.
* Each later version adds ``rows // 1000`` new skus (0.1 %), and about 0.1 % of the live skus
  reach the end of their life (a sku lives 1 to 1000 versions).
* A sku's price and stock change every 100 versions, at a phase of its own: about 1 % of the
  rows change between two consecutive versions.

No randomness: everything comes from a fixed integer hash (:func:`mix`), which stays below 2**62
so Spark's 64-bit arithmetic (ANSI mode, overflow checked) and Python agree exactly; prices are
integer cents divided by 100, one IEEE division in both.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from typing import Any

log = logging.getLogger("price_table_job")

DEFAULT_ROWS = 100_000
CURRENCY = "EUR"
_P = 2_147_483_647  # 2**31 - 1, prime: every intermediate stays below 2**62


# ---------------------------------------------------------------------------------- the formulas
# Written once for Python ints and Spark Columns alike (both have + - * % < <= & and comparisons).
def mix(a: Any, b: Any) -> Any:
    """A deterministic hash of two non-negative integers into [0, 2**31 - 1)."""
    x = ((a % _P) * 48_271 + (b % _P) * 16_807 + 11) % _P
    x = x * x % _P
    x = (x * 69_621 + 12_345) % _P
    return x * x % _P


def growth(rows: int) -> int:
    """New skus per version."""
    return max(1, rows // 1000)


def id_space(version: int, rows: int) -> int:
    """How many sku numbers exist up to ``version`` (live or not)."""
    return rows + (version - 1) * growth(rows)


def _parts(i: Any, version: int, rows: int, ops: Any) -> tuple[Any, Any, Any]:
    """(alive, price in cents, stock) of sku number ``i`` at ``version``."""
    born = ops.where(i < rows, 1, 2 + ops.div(i - rows, growth(rows)))
    dies = born + 1 + mix(i, 7) % 1000  # first version without it
    alive = (born <= version) & (dies > version)
    step = version + mix(i, 1) % 100
    epoch = step - step % 100  # changes every 100 versions, at a per-sku phase
    cents = 199 + mix(i * 4 + 1, epoch) % 99_800
    stock = mix(i * 4 + 2, epoch) % 500
    return alive, cents, stock


class _PyOps:
    @staticmethod
    def where(cond: bool, a: int, b: int) -> int:
        return a if cond else b

    @staticmethod
    def div(a: int, b: int) -> int:
        return a // b


def sku(i: int) -> str:
    return f"sku-{i:06d}"


def price_record(i: int, version: int, rows: int = DEFAULT_ROWS) -> dict[str, Any] | None:
    """The record of sku number ``i`` at ``version``, or None when it does not exist then."""
    alive, cents, stock = _parts(i, version, rows, _PyOps)
    if not alive:
        return None
    return {"price": cents / 100, "currency": CURRENCY, "stock": stock}


def price_table(version: int, rows: int = DEFAULT_ROWS) -> dict[str, dict[str, Any]]:
    """The whole table at ``version``, computed in plain Python (the reference for tests)."""
    table = {}
    for i in range(id_space(version, rows)):
        record = price_record(i, version, rows)
        if record is not None:
            table[sku(i)] = record
    return table


def table_diff(old: dict[str, dict], new: dict[str, dict]) -> dict[str, set[str]]:
    """The keys a switch from ``old`` to ``new`` must set and delete."""
    return {
        "set": {k for k, v in new.items() if old.get(k) != v},
        "delete": set(old) - set(new),
    }


def price_frame(spark: Any, version: int, rows: int) -> Any:
    """The table at ``version`` as a DataFrame (sku, price, currency, stock), computed by Spark."""
    from pyspark.sql import functions as F

    class SparkOps:
        @staticmethod
        def where(cond: Any, a: Any, b: Any) -> Any:
            return F.when(cond, a).otherwise(b)

        @staticmethod
        def div(a: Any, b: int) -> Any:  # exact: a - a % b is a multiple of b
            return ((a - a % b) / b).cast("long")

    i = F.col("id")
    alive, cents, stock = _parts(i, version, rows, SparkOps)
    return (
        spark.range(0, id_space(version, rows))
        .where(alive)
        .select(
            F.format_string("sku-%06d", i).alias("sku"),
            (cents / 100).cast("double").alias("price"),
            F.lit(CURRENCY).alias("currency"),
            stock.cast("long").alias("stock"),
        )
    )


# ---------------------------------------------------------------------------------- the job
def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--version", type=int, required=True, help="table version to compute (>= 1)")
    parser.add_argument("--rows", type=int, default=DEFAULT_ROWS, help="skus in version 1")
    parser.add_argument("--view-id", required=True, help="the open temp view to stage into")
    parser.add_argument("--table-topic", required=True, help="the state table's topic")
    parser.add_argument("--config-json", required=True, help="the ConnectionConfig as JSON (no token)")
    parser.add_argument("--batch-rows", type=int, default=1000, help="rows per staged batch")
    args = parser.parse_args(argv)
    if args.version < 1 or args.rows < 1:
        parser.error("--version and --rows must be at least 1")
    return args


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    args = parse_args(sys.argv[1:] if argv is None else argv)

    from pyspark.sql import SparkSession

    from airflow_provider_pulsarstate.spark import load_config, write_view

    config = load_config(args.config_json)
    spark = SparkSession.builder.appName(f"price-table-v{args.version}").getOrCreate()
    try:
        started = time.monotonic()
        frame = price_frame(spark, args.version, args.rows)
        staged = write_view(
            frame,
            config=config,
            table_topic=args.table_topic,
            view_id=args.view_id,
            key_column="sku",
            batch_rows=args.batch_rows,
        )
        elapsed = time.monotonic() - started
    finally:
        spark.stop()
    log.info(
        "price table v%d: %d rows staged into view %s of %s in %.1fs (%.0f rows/s, %s back end)",
        args.version,
        staged,
        args.view_id,
        args.table_topic,
        elapsed,
        staged / elapsed if elapsed > 0 else 0.0,
        config.kind,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
