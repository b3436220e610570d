"""Batch-read N records (100-byte values, 10-byte keys, 3 partitions) through the
logkit Spark data source, beside `spark.read.parquet` of the same rows, in one run.

Run: .venv/bin/python benchmarks/spark_read.py [--records 1000000] [--repeats 3]
The action on both sides is the same full scan: sum(length(value)) and count(*).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

import logkit  # noqa: E402


def prepare(root: str, records: int, partitions: int = 3) -> str:
    value = b"v" * 100
    with logkit.Broker(root) as broker:
        topic = broker.create_topic("bench", partitions)
        per_batch = 130
        for start in range(0, records, per_batch):
            rows = [(b"%010d" % i, value, None, 1_700_000_000_000 + i)
                    for i in range(start, min(start + per_batch, records))]
            topic.partition((start // per_batch) % partitions).append(rows)
    parquet_dir = os.path.join(root, "parquet")
    os.makedirs(parquet_dir)
    chunk = 200_000
    for n, start in enumerate(range(0, records, chunk)):
        stop = min(start + chunk, records)
        table = pa.table({
            "key": pa.array([b"%010d" % i for i in range(start, stop)], pa.binary()),
            "value": pa.array([value] * (stop - start), pa.binary()),
            "topic": pa.array(["bench"] * (stop - start)),
            "partition": pa.array([i % partitions for i in range(start, stop)], pa.int32()),
            "offset": pa.array(range(start, stop), pa.int64()),
            "timestamp": pa.array([1_700_000_000_000_000 + i for i in range(start, stop)],
                                  pa.timestamp("us", tz="UTC")),
            "timestampType": pa.array([0] * (stop - start), pa.int32())})
        pq.write_table(table, os.path.join(parquet_dir, f"part-{n:05d}.parquet"))
    return parquet_dir


def timed(fn) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    from pyspark.sql import SparkSession
    spark = (SparkSession.builder.master("local[2]").appName("logkit-spark-read-bench")
             .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.shuffle.partitions", "2").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    root = tempfile.mkdtemp(prefix="logkit-spark-bench-")
    try:
        parquet_dir = prepare(root, args.records)
        query = "sum(length(value)) AS bytes", "count(*) AS n"

        def logkit_scan():
            row = (spark.read.format("logkit").option("path", root)
                   .option("subscribe", "bench").load().selectExpr(*query).collect()[0])
            assert row.n == args.records

        def parquet_scan():
            row = spark.read.parquet(parquet_dir).selectExpr(*query).collect()[0]
            assert row.n == args.records

        logkit_scan(), parquet_scan()                     # warm both paths
        ours = [timed(logkit_scan) for _ in range(args.repeats)]
        theirs = [timed(parquet_scan) for _ in range(args.repeats)]
    finally:
        spark.stop()
        shutil.rmtree(root, ignore_errors=True)
    median_ours, median_theirs = statistics.median(ours), statistics.median(theirs)
    print(f"records: {args.records:,}; median of {args.repeats} full scans")
    print(f"logkit data source: {median_ours:.2f} s ({args.records / median_ours:,.0f} rec/s)")
    print(f"spark.read.parquet: {median_theirs:.2f} s ({args.records / median_theirs:,.0f} rec/s)")
    print(f"ratio logkit/parquet: {median_ours / median_theirs:.2f}x (target <= 1.5x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
