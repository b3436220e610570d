"""The Spark source's `kafka.isolation.level` (issue 33): read_uncommitted (the default,
as Spark's Kafka source) returns every data record; read_committed stops at each
partition's last stable offset and leaves out aborted transactions' records, through
both readers (the JVM reader skips aborted batches by the planner's aborted list, the
Python source by fetch_records' read_committed); control batches never appear; a
streaming query does not pass an open transaction and picks it up once committed."""

from __future__ import annotations

import json

import pytest

from tests.spark import test_spark
from tests.spark.test_spark import read_plan, reader

read_path = test_spark.read_path        # the fixture: each batch read by both readers

LEVEL = "kafka.isolation.level"
LONG_TIMEOUT = 600_000                   # the open transaction outlives the test


def _values(df):
    return sorted(row.value.decode() for row in df.select("value").collect())


def _send(producer, tag, partition, count):
    for i in range(count):
        producer.send("tx", f"{tag}{partition}-{i}".encode(), partition=partition)


@pytest.fixture
def transactions(broker):
    """Partition 0: committed A, aborted B, committed C, an open transaction O (another
    producer) and committed D after it. Partition 1: committed A, C and D only (its
    markers, no abort, nothing open). Yields (broker, the open producer)."""
    broker.create_topic("tx", partitions=2)
    writer = broker.producer(transactional_id="writer", acks="all")
    writer.init_transactions()
    for tag, commit in (("A", True), ("B", False), ("C", True)):
        writer.begin_transaction()
        _send(writer, tag, 0, 5)
        if tag != "B":
            _send(writer, tag, 1, 4)
        writer.commit_transaction() if commit else writer.abort_transaction()
    opened = broker.producer(transactional_id="open", acks="all",
                             transaction_timeout_ms=LONG_TIMEOUT)
    opened.init_transactions()
    opened.begin_transaction()
    _send(opened, "O", 0, 3)
    opened.flush()
    writer.begin_transaction()
    _send(writer, "D", 0, 2)
    _send(writer, "D", 1, 2)
    writer.commit_transaction()
    writer.close()
    assert broker.topic("tx").partition(0).last_stable_offset < \
        broker.topic("tx").partition(0).high_watermark
    yield broker, opened
    opened.close()


def _names(spec):
    return sorted(f"{tag}{partition}-{i}" for tag, partition, count in spec
                  for i in range(count))


EVERY = _names([("A", 0, 5), ("B", 0, 5), ("C", 0, 5), ("O", 0, 3), ("D", 0, 2),
                ("A", 1, 4), ("C", 1, 4), ("D", 1, 2)])
COMMITTED = _names([("A", 0, 5), ("C", 0, 5), ("A", 1, 4), ("C", 1, 4), ("D", 1, 2)])


def test_batch_reads_honour_the_isolation_level(spark, read_path, transactions):
    """includeHeaders reads Record tuples (the JVM hands it to Python);
    maxRecordsPerPartition=3 starts input partitions inside transactions (an aborted
    one's first batch before the cut)."""
    broker, _ = transactions
    root = broker.path
    default = reader(spark, root, subscribe="tx")
    assert read_plan(default) == read_path
    assert _values(default) == EVERY
    committed = reader(spark, root, subscribe="tx", **{LEVEL: "read_committed"})
    assert read_plan(committed) == read_path
    rows = committed.collect()
    assert sorted(row.value.decode() for row in rows) == COMMITTED
    assert max(row.offset for row in rows if row.partition == 0) < \
        broker.topic("tx").partition(0).last_stable_offset
    end = json.dumps({"tx": {"0": broker.topic("tx").partition(0).high_watermark}})
    held = reader(spark, root, subscribe="tx", endingOffsets=end,
                  **{LEVEL: "read_committed"})          # held at the last stable offset
    assert _values(held) == COMMITTED
    headers = reader(spark, root, subscribe="tx", includeHeaders="true",
                     **{LEVEL: "read_committed"})    # the record path: fetch_records
    assert _values(headers) == COMMITTED
    cut = reader(spark, root, subscribe="tx", maxRecordsPerPartition="3",
                 **{LEVEL: "read_committed"})
    assert cut.rdd.getNumPartitions() > 2
    assert _values(cut) == COMMITTED


def test_an_unknown_isolation_level_is_refused(spark, read_path, transactions):
    broker, _ = transactions
    with pytest.raises(Exception, match="'read_uncommitted', 'read_committed'"):
        reader(spark, broker.path, subscribe="tx", **{LEVEL: "committed"}).collect()


def test_a_stream_stops_at_the_open_transaction_and_reads_it_once_committed(
        spark, transactions, tmp_path):
    broker, opened = transactions
    checkpoint, out = str(tmp_path / "ck"), str(tmp_path / "out")

    def run():
        stream = (spark.readStream.format("logkit").option("path", str(broker.path))
                  .option("subscribe", "tx").option("startingOffsets", "earliest")
                  .option(LEVEL, "read_committed").option("maxOffsetsPerTrigger", "20")
                  .load())
        query = (stream.select("value").writeStream.format("parquet")
                 .option("path", out).option("checkpointLocation", checkpoint)
                 .trigger(availableNow=True).start())
        query.awaitTermination(120)
        assert query.exception() is None
        return _values(spark.read.parquet(out))

    assert run() == COMMITTED
    opened.commit_transaction()
    assert run() == sorted(COMMITTED + _names([("O", 0, 3), ("D", 0, 2)]))
