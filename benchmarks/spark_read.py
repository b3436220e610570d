"""Batch-read N records (10-byte keys, 100-byte values, 3 partitions) through the
logkit Spark data source, beside `spark.read.parquet` of the same rows, in one run.

Run from the checkout's root:
    .venv/bin/python -m benchmarks.spark_read [--records 1000000] [--repeats 5]

The action on every side is the same full scan: sum(length(value)) and count(*).
Two data shapes, each written to a logkit topic and to Parquet with identical rows:
  constant  every value is b"v" * 100 (Parquet dictionary-encodes the column to one entry)
  random    incompressible random values, as real payloads are closer to
A third reader, the *transport floor*, is a Python data source that does no work: it
yields the same Arrow batches (same schema and sizes) from memory. Its time is what any
PySpark Python data source pays to hand N rows to the JVM on this machine, so
"logkit - floor" is the part of the time that is ours. When the JVM reader's jar is
built (spark/jvm, `make jar`), `format("logkit")` is read twice per shape: through the
JVM reader and, with `spark.logkit.jvm.enabled=false`, through the Python source.
Repeats are interleaved (one of each reader per round) so the machine's noise hits every
reader alike; medians reported.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from typing import Any, Callable, Iterator

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition  # noqa: E402

import logkit  # noqa: E402

from ._common import interleaved_medians  # noqa: E402

PARTITIONS = 3
RECORDS_PER_KAFKA_BATCH = 130          # what the producer's 16 KiB batch_size holds
FLOOR_BATCH_ROWS = 20_000              # the logkit reader's Arrow batch size
QUERY = ("sum(length(value)) AS bytes", "count(*) AS n")


def values_for(shape: str, start: int, stop: int) -> list[bytes]:
    if shape == "constant":
        return [b"v" * 100] * (stop - start)
    blob = os.urandom(100 * (stop - start))
    return [blob[i:i + 100] for i in range(0, len(blob), 100)]


def prepare(root: str, shape: str, records: int) -> str:
    """The same rows into topic `bench` of a broker at root/log and into Parquet files
    under root/parquet (a broker refuses a directory that holds anything else)."""
    parquet_dir = os.path.join(root, "parquet")
    os.makedirs(parquet_dir)
    with logkit.Broker(os.path.join(root, "log")) as broker:
        topic = broker.create_topic("bench", PARTITIONS)
        chunk = 200_000
        for n, start in enumerate(range(0, records, chunk)):
            stop = min(start + chunk, records)
            keys = [b"%010d" % i for i in range(start, stop)]
            values = values_for(shape, start, stop)
            offsets, partitions = [], []
            next_offset = [topic.partition(p).log_end_offset for p in range(PARTITIONS)]
            for first in range(0, stop - start, RECORDS_PER_KAFKA_BATCH):
                last = min(first + RECORDS_PER_KAFKA_BATCH, stop - start)
                p = ((start + first) // RECORDS_PER_KAFKA_BATCH) % PARTITIONS
                topic.partition(p).append([(keys[i], values[i], None,
                                            1_700_000_000_000 + start + i)
                                           for i in range(first, last)])
                offsets.extend(range(next_offset[p], next_offset[p] + last - first))
                partitions.extend([p] * (last - first))
                next_offset[p] += last - first
            pq.write_table(pa.table({
                "key": pa.array(keys, pa.binary()),
                "value": pa.array(values, pa.binary()),
                "topic": pa.array(["bench"] * (stop - start)),
                "partition": pa.array(partitions, pa.int32()),
                "offset": pa.array(offsets, pa.int64()),
                "timestamp": pa.array([(1_700_000_000_000 + i) * 1000
                                       for i in range(start, stop)],
                                      pa.timestamp("us", tz="UTC")),
                "timestampType": pa.array([0] * (stop - start), pa.int32())}),
                os.path.join(parquet_dir, f"part-{n:05d}.parquet"))
    return parquet_dir


class _FloorReader(DataSourceReader):
    """Yields prebuilt Arrow batches shaped like logkit's: the transport floor."""

    def __init__(self, records: int) -> None:
        self.records = records

    def partitions(self) -> list[InputPartition]:
        share = -(-self.records // PARTITIONS)
        return [InputPartition(min(share, self.records - i * share))
                for i in range(PARTITIONS)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        from pyspark_logkit.reader import _arrow_schema
        n = FLOOR_BATCH_ROWS
        blob = os.urandom(100 * n)
        batch = pa.RecordBatch.from_arrays([
            pa.array([b"%010d" % i for i in range(n)], pa.binary()),
            pa.array([blob[i:i + 100] for i in range(0, len(blob), 100)], pa.binary()),
            pa.repeat(pa.scalar("bench"), n), pa.repeat(pa.scalar(0, pa.int32()), n),
            pa.array(range(n), pa.int64()),
            pa.array(range(n), pa.timestamp("us", tz="UTC")),
            pa.repeat(pa.scalar(0, pa.int32()), n)], schema=_arrow_schema(False))
        left = partition.value
        while left > 0:
            yield batch if left >= n else batch.slice(0, left)
            left -= n


class FloorSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "logkit_bench_floor"

    def schema(self) -> str:
        return ("key binary, value binary, topic string, partition int, offset bigint, "
                "timestamp timestamp, timestampType int")

    def reader(self, schema: Any) -> _FloorReader:
        return _FloorReader(int(self.options["records"]))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    from pyspark_logkit import local_session
    spark = local_session("logkit-spark-read-bench")
    spark.dataSource.register(FloorSource)
    n = args.records

    from pyspark_logkit import jvm_reader
    jvm = jvm_reader(spark)

    def scan(df: Any, use_jvm: bool | None = None) -> Callable[[], None]:
        def run() -> None:
            if use_jvm is not None:
                spark.conf.set("spark.logkit.jvm.enabled", str(use_jvm).lower())
            row = df.selectExpr(*QUERY).collect()[0]
            assert row.n == n, (row.n, n)
        return run

    roots = {shape: tempfile.mkdtemp(prefix=f"logkit-spark-bench-{shape}-")
             for shape in ("constant", "random")}
    try:
        readers = {}
        for shape, root in roots.items():
            parquet_dir = prepare(root, shape, n)
            logkit_df = (spark.read.format("logkit").option("path", os.path.join(root, "log"))
                         .option("subscribe", "bench").load())
            if jvm:
                readers[f"logkit JVM reader ({shape})"] = scan(logkit_df, True)
            readers[f"logkit data source ({shape})"] = scan(logkit_df, False)
            readers[f"spark.read.parquet ({shape})"] = scan(spark.read.parquet(parquet_dir))
        readers["transport floor (no-work Python source)"] = scan(
            spark.read.format("logkit_bench_floor").option("records", n).load())
        medians = interleaved_medians(readers, args.repeats)
    finally:
        spark.stop()
        for root in roots.values():
            shutil.rmtree(root, ignore_errors=True)
    print(f"records: {n:,}; median of {args.repeats} interleaved full scans "
          f"({QUERY[0]}, {QUERY[1]})\n")
    print("| reader | time | records/s |\n|---|---:|---:|")
    for name, seconds in medians.items():
        print(f"| {name} | {seconds:.2f} s | {n / seconds:,.0f} |")
    floor = medians["transport floor (no-work Python source)"]
    print()
    for shape in roots:
        ours = medians[f"logkit data source ({shape})"]
        theirs = medians[f"spark.read.parquet ({shape})"]
        if jvm:
            fast = medians[f"logkit JVM reader ({shape})"]
            print(f"{shape}: JVM reader/parquet {fast / theirs:.2f}x (target <= 1.5x)")
        print(f"{shape}: Python source/parquet {ours / theirs:.2f}x; "
              f"floor/parquet {floor / theirs:.2f}x; Python source/floor {ours / floor:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
