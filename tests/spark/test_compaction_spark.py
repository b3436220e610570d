"""The Spark source over compacted topics (DESIGN §9, §16): batch reads (the JVM reader
and the Python source) and a streaming read return exactly the records a cleaning pass
kept; failOnDataLoss=true does not fire on the offsets the cleaner removed (Spark's
Kafka source learned the same), while offsets below the log start are still data
loss."""

from __future__ import annotations

import glob
import json
import os

import pytest

import logkit
from tests.helpers.compacted import COMPACTED, NO_CLEANER, fill_and_compact, removed_offsets
from tests.spark import test_spark
from tests.spark.test_spark import reader

read_path = test_spark.read_path        # the fixture: each batch read by both readers

pytestmark = pytest.mark.spark


def _survivors(expected):
    return sorted((p, offset, key, value) for p, rows in expected.items()
                  for offset, key, value in rows)


def _rows(df):
    return sorted((r.partition, r.offset, r.key, r.value)
                  for r in df.select("partition", "offset", "key", "value").collect())


def _compacted(root, name, **kwargs):
    with logkit.Broker(root, config=NO_CLEANER) as broker:
        expected = fill_and_compact(broker, name, **kwargs)
        ends = {p.partition: p.high_watermark for p in broker.topic(name).partitions}
        gaps = {p.partition: removed_offsets(p, expected[p.partition])
                for p in broker.topic(name).partitions}
    return expected, ends, gaps


def test_a_batch_read_returns_the_survivors_without_data_loss(spark, read_path, tmp_path):
    """failOnDataLoss=true (the default), ranges cut into pieces (maxRecordsPerPartition:
    cuts land in gaps too), a start inside a removed run of offsets: exactly the
    survivors, no data-loss error."""
    expected, ends, gaps = _compacted(tmp_path, "table", partitions=2, records=120,
                                      keys=13, batch=4)
    assert all(gaps.values())
    pieces = reader(spark, tmp_path, subscribe="table", maxRecordsPerPartition="70")
    assert pieces.rdd.getNumPartitions() > 2
    assert _rows(pieces) == _survivors(expected)
    start = gaps[0][len(gaps[0]) // 2]
    inside = reader(spark, tmp_path, assign=json.dumps({"table": [0]}),
                    startingOffsets=json.dumps({"table": {"0": start}}),
                    failOnDataLoss="true")
    assert _rows(inside) == [row for row in _survivors(expected)
                             if row[0] == 0 and row[1] > start]


def test_a_partition_whose_records_were_all_removed_reads_empty(spark, read_path,
                                                                tmp_path):
    """Every key tombstoned and the tombstones cleaned: the range up to the high
    watermark holds no record, and the read returns none (and no error)."""
    keys = [b"k%d" % n for n in range(5)]
    _, ends, _ = _compacted(tmp_path, "gone", records=50, keys=5, unique_every=0,
                            tombstones=keys)
    assert ends[0] > 50
    assert reader(spark, tmp_path, subscribe="gone").count() == 0


def test_offsets_below_the_log_start_of_a_compacted_topic_are_still_data_loss(
        spark, read_path, tmp_path):
    """DeleteRecords on a compacted topic moves its log start: a read from offset 0
    fails with failOnDataLoss=true and skips to the log start with false."""
    expected, _, _ = _compacted(tmp_path, "table", records=120, keys=7)
    with logkit.Broker(tmp_path, config=NO_CLEANER) as broker:
        broker.topic("table").partition(0).increase_log_start_offset(60)
    start = json.dumps({"table": {"0": 0}})
    with pytest.raises(Exception, match="removed by retention"):
        reader(spark, tmp_path, subscribe="table", startingOffsets=start).collect()
    rows = reader(spark, tmp_path, subscribe="table", startingOffsets=start,
                  failOnDataLoss="false")
    assert _rows(rows) == [row for row in _survivors(expected) if row[1] >= 60]


def test_a_streaming_read_returns_the_survivors_then_what_follows(spark, tmp_path):
    """Trigger.AvailableNow over a compacted topic (maxOffsetsPerTrigger counting
    offsets, removed ones included): the survivors, each once; records written and
    compacted after the first run are read by the restart from its checkpoint."""
    expected, _, _ = _compacted(tmp_path, "table", partitions=2, records=100, keys=9)
    checkpoint, out = str(tmp_path / "ck"), str(tmp_path / "out")

    def run():
        stream = (spark.readStream.format("logkit").option("path", str(tmp_path))
                  .option("subscribe", "table").option("startingOffsets", "earliest")
                  .option("maxOffsetsPerTrigger", "120").load())
        query = (stream.select("partition", "offset", "key", "value").writeStream
                 .format("parquet").option("path", out)
                 .option("checkpointLocation", checkpoint).trigger(availableNow=True)
                 .start())
        query.awaitTermination(120)
        assert query.exception() is None

    run()
    assert _rows(spark.read.parquet(out)) == _survivors(expected)
    with logkit.Broker(tmp_path, config=NO_CLEANER) as broker:
        partition = broker.topic("table").partition(0)
        first = partition.append([(b"new-%d" % (n % 2), b"n-%d" % n, None, None)
                                  for n in range(6)])
        partition.roll()
        partition.compact()
    run()
    later = [(0, first + 4, b"new-0", b"n-4"), (0, first + 5, b"new-1", b"n-5")]
    assert _rows(spark.read.parquet(out)) == sorted(_survivors(expected) + later)


@pytest.mark.parametrize("old_files_gone", [False, True])
def test_a_cleaning_pass_between_planning_and_reading_is_not_data_loss(spark, tmp_path,
                                                                        old_files_gone):
    """The JVM reader planned byte ranges of segment files, then the cleaner swapped
    cleaned files in for them (Kafka's .cleaned/.swap): while the old files wait out
    file.delete.delay.ms as `.deleted` the read takes them (the log as planned, every
    record); once they are gone it reads the cleaned files instead (the survivors).
    Either way each record once, and no data-loss or corruption error."""
    from pyspark_logkit import jvm_reader
    if not jvm_reader(spark):
        pytest.skip("the JVM reader's jar is not built (no javac?): make jar")
    written, latest = [], {}
    with logkit.Broker(tmp_path, config=NO_CLEANER) as broker:
        topic = broker.create_topic("table", 1, config=COMPACTED)
        partition = topic.partition(0)
        for first in range(0, 200, 4):
            rows = [(b"k%d" % (n % 7) if n % 5 else b"u%d" % n, b"v%d" % n, None, None)
                    for n in range(first, first + 4)]
            base = partition.append(rows)
            for i, row in enumerate(rows):
                written.append((0, base + i, row[0], row[1]))
                latest[row[0]] = (0, base + i, row[0], row[1])
        partition.roll()
    # without adaptive execution the plan made here is the one executed (AQE would
    # plan the scan again at execution, after the pass)
    spark.conf.set("spark.sql.adaptive.enabled", "false")
    try:
        df = reader(spark, tmp_path, subscribe="table").select("partition", "offset",
                                                                 "key", "value")
        plan = df._jdf.queryExecution().executedPlan()   # planned: the files as they are
        assert "JVM reader" in plan.toString()
        with logkit.Broker(tmp_path, config=NO_CLEANER) as broker:
            report = broker.topic("table").partition(0).compact()
            assert report.records_after < report.records_before
        left = glob.glob(os.path.join(tmp_path, "table-0", "*.log.deleted"))
        assert left                              # waiting out file.delete.delay.ms
        if old_files_gone:                       # ...or past it: unlinked, as the
            for path in left:                    # broker's chore does
                os.unlink(path)
        rows = plan.executeCollect()
    finally:
        spark.conf.unset("spark.sql.adaptive.enabled")
    got = sorted((row.getInt(0), row.getLong(1), bytes(row.getBinary(2)),
                  bytes(row.getBinary(3))) for row in rows)
    assert got == (sorted(latest.values()) if old_files_gone else written)


def test_a_keyless_row_written_to_a_compacted_topic_fails_the_write_whole(
        spark, read_path, tmp_path):
    """Both writers: a write with one null key to a compacted topic fails in its task
    with a message that says why, and appends nothing of the write (without the check
    the commit appended the keyed batches before the log refused the keyless one); the
    same rows with keys are written."""
    with logkit.Broker(tmp_path, config=NO_CLEANER) as broker:
        broker.create_topic("table", 2, config=COMPACTED)
    rows = [(b"k%d" % n, b"v%d" % n) for n in range(40)]
    keyless = spark.createDataFrame(rows[:20] + [(None, b"orphan")] + rows[20:],
                                    "key binary, value binary").repartition(1)
    with pytest.raises(Exception, match="every row needs a non-null 'key'"):
        keyless.write.format("logkit").option("path", str(tmp_path)) \
            .option("topic", "table").mode("append").save()
    with logkit.Broker(tmp_path, config=NO_CLEANER) as broker:
        assert [p.high_watermark for p in broker.topic("table").partitions] == [0, 0]
    spark.createDataFrame(rows, "key binary, value binary").write.format("logkit") \
        .option("path", str(tmp_path)).option("topic", "table").mode("append").save()
    assert test_spark.write_plan(spark) == read_path
    with logkit.Broker(tmp_path, config=NO_CLEANER) as broker:
        assert sum(p.high_watermark for p in broker.topic("table").partitions) == 40
