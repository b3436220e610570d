"""Batch-write N rows (string keys, 100-byte string values) through the logkit Spark
data source into a 3-partition topic, beside `df.write.parquet` of the same cached
DataFrame, in one run.

Run from the checkout's root:
    .venv/bin/python -m benchmarks.spark_write [--records 500000] [--repeats 3]

Each logkit write appends N more records (staged by the tasks, appended by the driver's
commit); each Parquet write overwrites its directory. When the JVM reader's jar is built
(spark/jvm, `make jar`) the logkit write runs twice per round: through the jar's batch
writer and, with `spark.logkit.jvm.enabled=false`, through the Python sink. Repeats are
interleaved; medians.
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
        from pyspark_logkit import jvm_reader
        jvm = jvm_reader(spark)

        def logkit_write(use_jvm: bool):
            def run() -> None:
                spark.conf.set("spark.logkit.jvm.enabled", str(use_jvm).lower())
                (df.write.format("logkit").option("path", root).option("topic", "bench")
                 .mode("append").save())
            return run

        writers = {"logkit JVM writer": logkit_write(True)} if jvm else {}
        writers.update({
            "logkit data source": logkit_write(False),
            "df.write.parquet": lambda: df.write.mode("overwrite")
            .parquet(os.path.join(root, "parquet")),
        })
        medians = interleaved_medians(writers, args.repeats)
        with logkit.Broker(root) as broker:
            topic = broker.topic("bench")
            written = sum(p.log_end_offset for p in topic.partitions)
        assert written == args.records * (args.repeats + 1) * (len(writers) - 1), written
    finally:
        spark.stop()
        shutil.rmtree(root, ignore_errors=True)
    print(f"records: {args.records:,}; median of {args.repeats} interleaved writes\n")
    print("| writer | time | records/s |\n|---|---:|---:|")
    for name, seconds in medians.items():
        print(f"| {name} | {seconds:.2f} s | {args.records / seconds:,.0f} |")
    parquet = medians["df.write.parquet"]
    if "logkit JVM writer" in medians:
        print(f"\nJVM writer/parquet: {medians['logkit JVM writer'] / parquet:.2f}x "
              "(target <= 1.5x)")
    print(f"Python sink/parquet: {medians['logkit data source'] / parquet:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
