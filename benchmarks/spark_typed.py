"""Spark typed read versus binary read of the same Avro records, in one run (issue 12).

Run from the checkout's root:
    .venv/bin/python -m benchmarks.spark_typed [--records 1000000] [--repeats 3]
    .venv/bin/python -m benchmarks.spark_typed --quick          (100,000 records)

N records of benchmarks.schemas' 6-field Avro order (about 55 bytes each, Confluent
framing, schema registered as `bench-value`) in 3 partitions. Two readers over the same
topic, each a full scan:
  binary  the source as Spark's Kafka source gives it: sum(length(value)), count(*)
  typed   valueFormat=avro: every value decoded into struct<...>:
          sum(value.quantity), count(*)
Repeats are interleaved (one of each per round, after a warm-up round); medians
reported. The ratio is what decoding into typed columns costs on top of the transport.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from typing import Any, Callable

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

import logkit  # noqa: E402
from logkit.serde import AvroSerde  # noqa: E402

from ._common import interleaved_medians  # noqa: E402
from .schemas import ORDER_SCHEMA, order  # noqa: E402

PARTITIONS = 3
TOPIC = "bench"
RECORDS_PER_KAFKA_BATCH = 250


def prepare(root: str, records: int) -> int:
    """N framed Avro orders into topic `bench`; returns the encoded bytes."""
    total = 0
    with logkit.Broker(root) as broker:
        topic = broker.create_topic(TOPIC, PARTITIONS)
        serde = AvroSerde(broker, TOPIC, ORDER_SCHEMA)
        for first in range(0, records, RECORDS_PER_KAFKA_BATCH):
            last = min(first + RECORDS_PER_KAFKA_BATCH, records)
            values = [serde.serialize(order(i)) for i in range(first, last)]
            total += sum(map(len, values))
            p = (first // RECORDS_PER_KAFKA_BATCH) % PARTITIONS
            topic.partition(p).append([(None, v, None, None) for v in values])
    return total


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="100,000 records")
    args = parser.parse_args()
    n = 100_000 if args.quick else args.records
    from pyspark_logkit import local_session
    spark = local_session("logkit-spark-typed-bench")
    root = tempfile.mkdtemp(prefix="logkit-spark-typed-")
    try:
        size = prepare(root, n)

        def scan(query: tuple[str, str], **options: str) -> Callable[[], None]:
            reader = spark.read.format("logkit").option("path", root) \
                .option("subscribe", TOPIC)
            for key, value in options.items():
                reader = reader.option(key, value)
            df: Any = reader.load()

            def run() -> None:
                row = df.selectExpr(*query).collect()[0]
                assert row.n == n, (row.n, n)
            return run

        readers = {
            "binary (value bytes)": scan(("sum(length(value)) AS s", "count(*) AS n")),
            "typed (valueFormat=avro)": scan(("sum(value.quantity) AS s", "count(*) AS n"),
                                             valueFormat="avro"),
        }
        medians = interleaved_medians(readers, args.repeats)
    finally:
        spark.stop()
        shutil.rmtree(root, ignore_errors=True)
    print(f"records: {n:,} Avro orders ({size / n:.0f} bytes each, framed), "
          f"{PARTITIONS} partitions; median of {args.repeats} interleaved full scans\n")
    print("| reader | time | records/s |\n|---|---:|---:|")
    for name, seconds in medians.items():
        print(f"| {name} | {seconds:.2f} s | {n / seconds:,.0f} |")
    typed, binary = medians["typed (valueFormat=avro)"], medians["binary (value bytes)"]
    print(f"\ntyped/binary: {typed / binary:.2f}x the time")
    return 0


if __name__ == "__main__":
    sys.exit(main())
