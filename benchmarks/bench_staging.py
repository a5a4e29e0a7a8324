"""Benchmark: staging rows into a view from 4 Spark partitions, beside raw writers of the same bytes.

    .venv/bin/python benchmarks/bench_staging.py                       # starts a throw-away broker
    .venv/bin/python benchmarks/bench_staging.py --rows 200000 --backend pulsar
    .venv/bin/python benchmarks/bench_staging.py --service-url pulsar://127.0.0.1:6650 --admin-url http://127.0.0.1:8080

Per back end, in the same run:

* **ours**: ``spark.write_view`` of a cached 4-partition DataFrame (``local[4]``, one Python worker
  per partition) into an open view. Timed: the ``write_view`` call alone (every partition opens
  its back end, converts and stages its rows through a ViewStager, closes it -- every batch
  acknowledged -- and the driver seals the view). Not timed: JVM start-up, building and caching
  the DataFrame, and starting the Python workers (warm-up jobs that only count the rows, whose
  time is printed as the Spark floor: what Spark alone costs to hand the rows to Python).
* **raw Pulsar producer**: 4 processes (the same parallelism as the 4 Spark Python workers),
  each with its own pulsar-client Client and producer on a fresh topic of the same broker,
  sending the very payloads ViewStager writes for its quarter of the rows (the same packed
  batches, the same batch size), prepared before the clock starts: ``send_async`` of every
  batch, then ``flush()`` (every message acknowledged). Timed: first send to last
  acknowledgement over the 4 processes.
* **raw SQLite** (embedded back end): 4 processes inserting the same payloads into one WAL file
  (``synchronous=NORMAL``, as the embedded back end), one ``BEGIN IMMEDIATE`` transaction per
  batch (each batch durable before the next, as a ViewStager's append).

Rows are bench_views.py's ``row()`` (``{"price", "currency", "stock"}``, keys ``sku-0000000``).
The script checks that the seal counts every row and that the staging topic holds the expected
number of batches; it exits 1 if not.
"""

from __future__ import annotations

import argparse
import json
import logging
import multiprocessing as mp
import os
import sqlite3
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_views import row  # noqa: E402
from machine import broker_urls, print_run_header  # noqa: E402

log = logging.getLogger("bench_staging")


# ---------------------------------------------------------------------------------- the same bytes
def partition_payloads(rows: int, partitions: int, part: int, batch_rows: int) -> list[bytes]:
    """The payloads a ViewStager writes for Spark partition ``part`` of ``spark.range(rows, numPartitions=partitions)``."""
    import msgspec

    from airflow_provider_pulsarstate.engine.envelope import encode_writes
    from airflow_provider_pulsarstate.engine.recipes.table_ops import canonical

    start, end = part * rows // partitions, (part + 1) * rows // partitions
    encoder = msgspec.msgpack.Encoder()
    seq = 0x5EED0000 + part
    payloads = []
    for at in range(start, end, batch_rows):
        batch = {f"sku-{i:07d}": canonical(row(i, 0)) for i in range(at, min(end, at + batch_rows))}
        payloads.append(encode_writes([(seq, [b"\x04" + encoder.encode(batch)])]))
    return payloads


def _raw_pulsar_worker(service_url: str, topic: str, payloads_args: tuple, barrier: Any, out: Any) -> None:
    import pulsar

    payloads = partition_payloads(*payloads_args)
    client = pulsar.Client(
        service_url, operation_timeout_seconds=120, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn)
    )
    producer = client.create_producer(
        topic, access_mode=pulsar.ProducerAccessMode.Shared, block_if_queue_full=True, send_timeout_millis=120_000
    )
    failures: list[Any] = []

    def done(res: Any, _msg_id: Any) -> None:
        if res != pulsar.Result.Ok:
            failures.append(res)

    barrier.wait()
    t0, c0 = time.time(), time.process_time()
    for payload in payloads:
        producer.send_async(payload, done)
    producer.flush()
    t1, c1 = time.time(), time.process_time()
    producer.close()
    client.close()
    out.put((t0, t1, len(payloads), sum(map(len, payloads)), len(failures), c1 - c0))


def _raw_sqlite_worker(path: str, payloads_args: tuple, barrier: Any, out: Any) -> None:
    payloads = partition_payloads(*payloads_args)
    conn = sqlite3.connect(path, timeout=60, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")
    barrier.wait()
    t0, c0 = time.time(), time.process_time()
    for payload in payloads:
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("INSERT INTO entries(payload, publish_time) VALUES (?, ?)", (payload, time.time()))
        conn.execute("COMMIT")
    t1, c1 = time.time(), time.process_time()
    conn.close()
    out.put((t0, t1, len(payloads), sum(map(len, payloads)), 0, c1 - c0))


def run_raw(kind: str, target: str, *, rows: int, partitions: int, batch_rows: int) -> dict[str, Any]:
    """Run the raw writers in ``partitions`` processes; wall time from the first send to the last acknowledgement."""
    ctx = mp.get_context("spawn")
    barrier, out = ctx.Barrier(partitions), ctx.Queue()
    procs = []
    for part in range(partitions):
        args = (rows, partitions, part, batch_rows)
        if kind == "pulsar":
            proc = ctx.Process(target=_raw_pulsar_worker, args=(target[0], target[1], args, barrier, out))
        else:
            proc = ctx.Process(target=_raw_sqlite_worker, args=(target, args, barrier, out))
        proc.start()
        procs.append(proc)
    results = [out.get(timeout=900) for _ in procs]
    for proc in procs:
        proc.join()
    seconds = max(r[1] for r in results) - min(r[0] for r in results)
    return {
        "seconds": seconds,
        "batches": sum(r[2] for r in results),
        "bytes": sum(r[3] for r in results),
        "failures": sum(r[4] for r in results),
        "rows_per_s": rows / seconds,
        "cpu_s": sum(r[5] for r in results),
    }


# ---------------------------------------------------------------------------------- Spark
def spark_session(partitions: int) -> Any:
    from pyspark.sql import SparkSession

    os.environ["PYSPARK_PYTHON"] = sys.executable  # the workers need this venv (pulsar-client, msgspec)
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH", "")]))
    return (
        SparkSession.builder.master(f"local[{partitions}]")
        .appName("bench-staging")
        .config("spark.ui.enabled", "false")
        .config("spark.driver.memory", "2g")
        .config("spark.python.worker.reuse", "true")
        .getOrCreate()
    )


def make_frame(spark: Any, rows: int, partitions: int) -> Any:
    """bench_views.row(i, 0) for every i, as a cached DataFrame (built and cached before any clock starts)."""
    from pyspark.sql import functions as F

    df = (
        spark.range(0, rows, numPartitions=partitions)
        .select(
            F.format_string("sku-%07d", F.col("id")).alias("key"),
            (((F.col("id") * 7919) % 10_000) / 100).alias("price"),
            F.lit("EUR").alias("currency"),
            (F.col("id") % 50).alias("stock"),
        )
        .cache()
    )
    assert df.count() == rows
    return df


def spark_floor(df: Any, *, arrow: bool) -> float:
    """Seconds Spark takes to hand every row to the Python workers, which only count them (also the warm-up).

    ``arrow``: as Arrow columns turned into Python lists (what write_view reads); else as Row objects (``df.rdd``).
    """

    def count_rows(rows: Any) -> Any:
        import pulsar  # noqa: F401

        import airflow_provider_pulsarstate.spark.views  # noqa: F401  (imports paid here, not in the timed run)

        yield sum(1 for _ in rows)

    def count_columns(batches: Any) -> Any:
        import pulsar  # noqa: F401
        import pyarrow as pa

        import airflow_provider_pulsarstate.spark.views  # noqa: F401

        n = 0
        for batch in batches:
            columns = [column.to_pylist() for column in batch.columns]
            n += sum(1 for _ in zip(*columns))
        yield pa.RecordBatch.from_pydict({"n": [n]})

    t0 = time.perf_counter()
    if arrow:
        total = sum(r["n"] for r in df.mapInArrow(count_columns, "n long").collect())
    else:
        total = sum(df.rdd.mapPartitions(count_rows).collect())
    seconds = time.perf_counter() - t0
    assert total == df.count()
    return seconds


def partition_cpu(df: Any, config: dict[str, Any], *, batch_rows: int, table_topic: str) -> dict[str, Any]:
    """write_view's executor side once more, instrumented: CPU seconds (all threads) and wall seconds per partition.

    The machine's load moves wall times a lot on 2 cores; the CPU the 4 writer processes burn
    moves much less. Stages into a view of its own (the rows are the same).
    """
    from dataclasses import asdict

    from airflow_provider_pulsarstate import open_backend
    from airflow_provider_pulsarstate.engine.recipes.table import StateTable
    from airflow_provider_pulsarstate.spark import views

    if not hasattr(views, "_stage_batches"):  # write_view before Arrow (for before/after runs)
        return {"cpu_s": float("nan"), "wall_s": []}
    cfg = views.portable_config(config)
    topic = cfg.topic_name(table_topic)
    key_index, plan = views._plan_columns(df.schema, "key")
    backend = open_backend(cfg)
    table = StateTable(backend, topic, operation_timeout=600.0)
    view_id = table.create_view().view_id
    table.close()
    backend.close()
    config_dict = asdict(cfg)

    def stage(batches: Any) -> Any:
        import pyarrow as pa

        t0, c0 = time.perf_counter(), time.process_time()
        views._stage_batches(
            batches,
            config_dict=config_dict,
            topic=topic,
            view_id=view_id,
            batch_rows=batch_rows,
            key_column="key",
            key_index=key_index,
            field_plan=plan,
        )
        yield pa.RecordBatch.from_pydict({"wall": [time.perf_counter() - t0], "cpu": [time.process_time() - c0]})

    parts = df.mapInArrow(stage, "wall double, cpu double").collect()
    return {"cpu_s": sum(r["cpu"] for r in parts), "wall_s": [r["wall"] for r in parts]}


def run_ours(df: Any, config: dict[str, Any], *, rows: int, batch_rows: int, table_topic: str) -> dict[str, Any]:
    from airflow_provider_pulsarstate import ConnectionConfig, open_backend
    from airflow_provider_pulsarstate.engine.recipes.table import StateTable
    from airflow_provider_pulsarstate.engine.recipes.view_staging import staging_topic
    from airflow_provider_pulsarstate.spark import write_view

    backend = open_backend(ConnectionConfig(**config))
    table = StateTable(backend, table_topic, operation_timeout=600.0)
    view = table.create_view()
    table.close()  # as the operator that opens the view does: else the driver's seal waits for this writer to idle out
    t0 = time.perf_counter()
    staged = write_view(
        df, config=config, table_topic=table_topic, view_id=view.view_id, key_column="key", batch_rows=batch_rows
    )
    seconds = time.perf_counter() - t0
    table = StateTable(backend, table_topic, operation_timeout=600.0)
    sealed = table.view_info(view.view_id).sealed or {}
    batches = 0
    reader = backend.create_reader(staging_topic(table.topic, view.view_id))
    while reader.has_next() and reader.read_next(timeout=30) is not None:
        batches += 1
    reader.close()
    table.close()
    backend.close()
    return {
        "seconds": seconds,
        "staged": staged,
        "sealed_rows": sum(sealed.values()),
        "stagers": len(sealed),
        "batches": batches,
        "rows_per_s": rows / seconds,
    }


# ---------------------------------------------------------------------------------- main
def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--batch-rows", type=int, default=0, help="rows per batch (default: write_view's default)")
    parser.add_argument("--backend", choices=["pulsar", "embedded", "both"], default="both")
    parser.add_argument("--repeat", type=int, default=1, help="runs of each side (the best is reported)")
    parser.add_argument("--service-url", default="")
    parser.add_argument("--admin-url", default="")
    parser.add_argument("--json", dest="json_out", default="")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stderr)
    logging.getLogger("py4j").setLevel(logging.WARNING)
    import inspect

    from airflow_provider_pulsarstate.spark import write_view

    batch_rows = args.batch_rows or inspect.signature(write_view).parameters["batch_rows"].default
    print_run_header()
    spark = spark_session(args.partitions)
    spark.sparkContext.setLogLevel("ERROR")
    df = make_frame(spark, args.rows, args.partitions)
    row_floor = min(spark_floor(df, arrow=False) for _ in range(2))
    floor = min(spark_floor(df, arrow=True) for _ in range(2))
    log.info("Spark floor: %.2fs for %d rows (as Row objects: %.2fs)", floor, args.rows, row_floor)
    tmp = tempfile.mkdtemp(prefix="bench-staging-")
    results: dict[str, Any] = {
        "rows": args.rows,
        "partitions": args.partitions,
        "batch_rows": batch_rows,
        "spark_floor_s": floor,
        "spark_row_floor_s": row_floor,
    }
    ok = True
    backends = ["embedded", "pulsar"] if args.backend == "both" else [args.backend]
    with (
        broker_urls(args.service_url or None, args.admin_url or None) if "pulsar" in backends else _no_broker() as urls
    ):
        for name in backends:
            ours, raw = [], []
            for attempt in range(args.repeat):
                topic = f"persistent://public/default/bench-staging-{os.getpid()}-{name}-{attempt}"
                if name == "pulsar":
                    config = {"url": urls[0], "admin_url": urls[1], "operation_timeout": 600.0}
                    raw_target: Any = (urls[0], f"{topic}-raw")
                else:
                    config = {"url": f"{tmp}/state-{attempt}.db", "operation_timeout": 600.0}
                    raw_target = f"{tmp}/raw-{attempt}.db"
                    with sqlite3.connect(raw_target) as conn:
                        conn.execute("PRAGMA journal_mode=WAL")
                        conn.execute(
                            "CREATE TABLE entries(pos INTEGER PRIMARY KEY, payload BLOB NOT NULL, publish_time REAL)"
                        )
                log.info("%s: write_view of %d rows (run %d)", name, args.rows, attempt + 1)
                ours.append(run_ours(df, config, rows=args.rows, batch_rows=batch_rows, table_topic=topic))
                ours[-1].update(partition_cpu(df, config, batch_rows=batch_rows, table_topic=f"{topic}-cpu"))
                log.info("%s: ours %.2fs; raw writers of the same payloads", name, ours[-1]["seconds"])
                raw.append(run_raw(name, raw_target, rows=args.rows, partitions=args.partitions, batch_rows=batch_rows))
                log.info("%s: raw %.2fs", name, raw[-1]["seconds"])
                o = ours[-1]
                if (
                    o["staged"] != args.rows
                    or o["sealed_rows"] != args.rows
                    or o["batches"] != raw[-1]["batches"]
                    or raw[-1]["failures"]
                ):
                    print(f"CHECK FAILED ({name}): ours {o}, raw {raw[-1]}")
                    ok = False
            results[name] = {
                "ours": min(ours, key=lambda r: r["seconds"]),
                "raw": min(raw, key=lambda r: r["seconds"]),
                "all_ours_s": [r["seconds"] for r in ours],
                "all_raw_s": [r["seconds"] for r in raw],
            }
    spark.stop()

    print(
        f"\nstaging {args.rows:,} rows from {args.partitions} Spark partitions (local[{args.partitions}]), "
        f"{batch_rows} rows per batch, best of {args.repeat}"
    )
    print(
        f"Spark floor (rows handed to Python and counted, no staging): {floor:.2f}s = {args.rows / floor:,.0f} rows/s "
        f"as Arrow columns to lists (write_view's way); {row_floor:.2f}s = {args.rows / row_floor:,.0f} rows/s as Row objects"
    )
    print(f"{'back end':<10} {'ours (write_view)':>20} {'raw writer':>22} {'ratio raw/ours':>15}")
    for name in backends:
        o, r = results[name]["ours"], results[name]["raw"]
        raw_name = "pulsar-client" if name == "pulsar" else "sqlite3"
        print(
            f"{name:<10} {o['rows_per_s']:>11,.0f} rows/s {r['rows_per_s']:>11,.0f} rows/s ({raw_name}) "
            f"{o['seconds'] / r['seconds']:>6.2f}x   ({o['seconds']:.2f}s vs {r['seconds']:.2f}s, "
            f"{r['batches']} batches, {r['bytes'] / 1e6:.1f} MB)"
        )
    print(
        f"CPU seconds in the {args.partitions} writer processes (executor side of write_view, instrumented run; raw: send loop)"
    )
    for name in backends:
        o, r = results[name]["ours"], results[name]["raw"]
        print(
            f"{name:<10} {o['cpu_s']:>13.2f} s cpu {r['cpu_s']:>17.2f} s cpu {' ':>18} {o['cpu_s'] / r['cpu_s']:>6.2f}x   "
            f"(ours per row {o['cpu_s'] / args.rows * 1e6:.2f} us, raw {r['cpu_s'] / args.rows * 1e6:.2f} us)"
        )
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(results, indent=2))
    return 0 if ok else 1


class _no_broker:
    def __enter__(self) -> tuple[str, str]:
        return "", ""

    def __exit__(self, *exc: object) -> None:
        return None


if __name__ == "__main__":
    sys.exit(main())
