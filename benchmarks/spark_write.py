"""Batch-write N rows (string keys, 100-byte string values) through the logkit Spark
data source into a 3-partition topic, beside `df.write.parquet` of the same cached
DataFrame, in one run.

Run from the checkout's root:
    .venv/bin/python -m benchmarks.spark_write [--records 500000] [--repeats 3]

Each logkit write appends N more records (staged by the tasks, appended by the driver's
commit); each Parquet write overwrites its directory. Repeats are interleaved; medians.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

import logkit  # noqa: E402

from ._common import interleaved_medians  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=500_000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    from pyspark_logkit import local_session
    spark = local_session("logkit-spark-write-bench")
    root = tempfile.mkdtemp(prefix="logkit-spark-write-bench-")
    try:
        with logkit.Broker(root) as broker:
            broker.create_topic("bench", 3)
        df = (spark.range(args.records, numPartitions=2)
              .selectExpr("CAST(id AS STRING) AS key", "repeat('x', 100) AS value").cache())
        df.count()
        writers = {
            "logkit data source": lambda: df.write.format("logkit").option("path", root)
            .option("topic", "bench").mode("append").save(),
            "df.write.parquet": lambda: df.write.mode("overwrite")
            .parquet(os.path.join(root, "parquet")),
        }
        medians = interleaved_medians(writers, args.repeats)
        with logkit.Broker(root) as broker:
            topic = broker.topic("bench")
            written = sum(p.log_end_offset for p in topic.partitions)
        assert written == args.records * (args.repeats + 1), written
    finally:
        spark.stop()
        shutil.rmtree(root, ignore_errors=True)
    print(f"records: {args.records:,}; median of {args.repeats} interleaved writes\n")
    print("| writer | time | records/s |\n|---|---:|---:|")
    for name, seconds in medians.items():
        print(f"| {name} | {seconds:.2f} s | {args.records / seconds:,.0f} |")
    ratio = medians["logkit data source"] / medians["df.write.parquet"]
    print(f"\nlogkit/parquet: {ratio:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
