"""The logkit Spark data source on a real local[2] session: batch read/write, streaming
read with limits and restart, exactly-once streaming writes under replay, bad options.

The batch read tests run twice when the JVM reader's jar is built: through the JVM
reader (`jvm`) and through the Python source (`python`, spark.logkit.jvm.enabled=false),
on the one shared session. Everything else runs on the session's default: the JVM
source when the jar is there, which hands streaming, writes, headers and typed columns
to the Python source."""

from __future__ import annotations

import glob
import json
import os

import pytest

import logkit

pytestmark = pytest.mark.spark


def fill(root, topic, n, partitions=3, headers=False):
    with logkit.Broker(root) as broker:
        try:
            broker.create_topic(topic, partitions)
        except logkit.TopicExistsError:
            pass
        producer = broker.producer(linger_ms=5)
        for i in range(n):
            producer.send(topic, b"value-%d" % i, key=b"key-%d" % (i % 11),
                          headers=[("n", b"%d" % i)] if headers else None)
        producer.close()


def reader(spark, root, **options):
    return spark.read.format("logkit").options(path=str(root), **options).load()


@pytest.fixture(params=["jvm", "python"])
def read_path(request, spark):
    """Which reader serves format("logkit") batch reads in this test."""
    from pyspark_logkit import jvm_reader
    if request.param == "jvm" and not jvm_reader(spark):
        pytest.skip("the JVM reader's jar is not built (no javac?): make jar")
    spark.conf.set("spark.logkit.jvm.enabled", str(request.param == "jvm").lower())
    yield request.param
    spark.conf.unset("spark.logkit.jvm.enabled")


def read_plan(df):
    """Which reader a DataFrame's scan runs: 'jvm' or 'python'."""
    plan = df._jdf.queryExecution().executedPlan().toString()
    return "jvm" if "JVM reader" in plan else "python"


def write_plan(spark):
    """Which writer the session's last batch write ran: 'jvm' (the JVM writer,
    logkit.spark.LogkitWrite, in its physical plan) or 'python'."""
    spark.sparkContext._jsc.sc().listenerBus().waitUntilEmpty()   # the plan is recorded
    executions = spark._jsparkSession.sharedState().statusStore().executionsList()
    writes = [executions.apply(i) for i in range(executions.size())
              if "AppendData" in executions.apply(i).physicalPlanDescription()]
    last = max(writes, key=lambda execution: execution.executionId())
    return "jvm" if "logkit.spark.LogkitWrite" in last.physicalPlanDescription() else "python"


def test_batch_read_matches_the_log(spark, tmp_path):
    """A batch read returns every record with Spark's Kafka schema and headers."""
    fill(tmp_path, "events", 500, headers=True)
    df = reader(spark, tmp_path, subscribe="events", includeHeaders="true")
    assert df.columns == ["key", "value", "topic", "partition", "offset", "timestamp",
                          "timestampType", "headers"]
    rows = df.collect()
    assert len(rows) == 500
    with logkit.Broker(tmp_path) as broker:
        topic = broker.topic("events")
        for row in rows[:50]:
            assert row.partition == topic.partition_for(row.key)
            [record] = topic.partition(row.partition).read(row.offset, max_records=1)
            assert (record.key, record.value) == (row.key, row.value)
            assert [(h.key, h.value) for h in row.headers] == list(record.headers)


def test_batch_offsets_and_assign(spark, read_path, tmp_path):
    """startingOffsets/endingOffsets JSON and assign select exact ranges."""
    fill(tmp_path, "events", 300)
    start = json.dumps({"events": {"0": 5, "1": -2, "2": -1}})
    end = json.dumps({"events": {"0": 10, "1": 3, "2": -1}})
    df = reader(spark, tmp_path, subscribe="events", startingOffsets=start,
                endingOffsets=end)
    assert read_plan(df) == read_path
    got = sorted((r.partition, r.offset) for r in df.select("partition", "offset").collect())
    assert got == [(0, o) for o in range(5, 10)] + [(1, o) for o in range(3)]
    only = reader(spark, tmp_path, assign=json.dumps({"events": [1]}))
    assert {r.partition for r in only.select("partition").collect()} == {1}
    empty = reader(spark, tmp_path, subscribe="events", startingOffsets="latest")
    assert empty.count() == 0                          # an empty partition list is fine


def test_min_partitions_splits_ranges_without_losing_or_repeating(spark, read_path, tmp_path):
    """minPartitions / maxRecordsPerPartition cut offset ranges (even inside a Kafka
    batch) into more input partitions; together they still cover each record once."""
    fill(tmp_path, "events", 400, headers=True)
    whole = reader(spark, tmp_path, subscribe="events")
    expected = sorted((r.partition, r.offset, r.value) for r in whole.collect())
    assert whole.rdd.getNumPartitions() == 3             # Kafka's 1:1 by default
    for options in ({"minPartitions": "7"}, {"maxRecordsPerPartition": "37"},
                    {"minPartitions": "5", "includeHeaders": "true"}):
        df = reader(spark, tmp_path, subscribe="events", **options)
        assert df.rdd.getNumPartitions() >= int(options.get("minPartitions", 11))
        assert sorted((r.partition, r.offset, r.value) for r in df.collect()) == expected


def test_data_removed_by_retention_fails_or_is_skipped(spark, read_path, tmp_path):
    """Offsets that retention deleted before they were read fail the query with
    failOnDataLoss=true (the default) and are skipped with failOnDataLoss=false."""
    with logkit.Broker(tmp_path) as broker:
        topic = broker.create_topic("short", 1, config={"segment.bytes": 1024,
                                                        "retention.bytes": 2048})
        for i in range(40):
            topic.partition(0).append([(b"k", b"x" * 100, None, None)])
        assert broker.enforce_retention() > 0
        first = topic.partition(0).log_start_offset
        assert first > 0
    start = json.dumps({"short": {"0": 0}})
    with pytest.raises(Exception, match="removed by retention"):
        reader(spark, tmp_path, subscribe="short", startingOffsets=start).collect()
    rows = reader(spark, tmp_path, subscribe="short", startingOffsets=start,
                  failOnDataLoss="false").collect()
    assert sorted(r.offset for r in rows) == list(range(first, 40))


def test_batch_write_round_trip_strings_and_columns(spark, tmp_path):
    """Writes take string or binary key/value, a topic column and headers; keys are
    partitioned with murmur2 like the producer; the write is all-or-nothing."""
    with logkit.Broker(tmp_path) as broker:
        broker.create_topic("out", 4)
        broker.create_topic("other", 1)
    rows = [(f"k{i}", f"v{i}", "out" if i % 2 else "other", [("h", bytearray(b"1"))])
            for i in range(200)]
    df = spark.createDataFrame(rows, "key string, value string, topic string, "
                                     "headers array<struct<key:string,value:binary>>")
    df.write.format("logkit").option("path", str(tmp_path)).mode("append").save()
    assert write_plan(spark) == "python"        # a topic column: the Python sink's shape
    out = reader(spark, tmp_path, subscribe="out", includeHeaders="true").collect()
    assert sorted(r.value.decode() for r in out) == sorted(f"v{i}" for i in range(1, 200, 2))
    with logkit.Broker(tmp_path) as broker:
        topic = broker.topic("out")
        assert all(r.partition == topic.partition_for(r.key) for r in out)
    assert all([(h.key, h.value) for h in r.headers] == [("h", b"1")] for r in out)
    assert reader(spark, tmp_path, subscribe="other").count() == 100
    assert not os.listdir(os.path.join(tmp_path, ".spark-staging"))


def test_streaming_read_limits_and_restart(spark, tmp_path):
    """maxOffsetsPerTrigger caps micro-batches; a restart from the checkpoint reads only
    new records; Trigger.AvailableNow stops when caught up."""
    fill(tmp_path, "events", 300)
    checkpoint = str(tmp_path / "checkpoint")

    def run():
        stream = (spark.readStream.format("logkit").option("path", str(tmp_path))
                  .option("subscribe", "events").option("startingOffsets", "earliest")
                  .option("maxOffsetsPerTrigger", "100").load())
        query = (stream.selectExpr("CAST(value AS STRING) AS v", "offset", "partition")
                 .writeStream.format("parquet").option("path", str(tmp_path / "out"))
                 .option("checkpointLocation", checkpoint).trigger(availableNow=True).start())
        query.awaitTermination(120)
        return [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]

    sizes = run()
    assert sum(sizes) == 300 and max(sizes) <= 100 and len(sizes) >= 3
    fill(tmp_path, "events", 50)
    assert sum(run()) == 50                     # the restart reads only the new records
    rows = spark.read.parquet(str(tmp_path / "out")).collect()
    assert len(rows) == 350 and len({(r.partition, r.offset) for r in rows}) == 350


def test_streaming_pattern_picks_up_new_topics_from_their_start(spark, tmp_path):
    """subscribePattern: a topic created after the query started is read from its
    first offset on the next run; topics that do not match are not read."""
    fill(tmp_path, "clicks-a", 20, partitions=2)
    fill(tmp_path, "views", 5, partitions=1)
    checkpoint = str(tmp_path / "ck")

    def run():
        stream = (spark.readStream.format("logkit").option("path", str(tmp_path))
                  .option("subscribePattern", "clicks-.*")
                  .option("startingOffsets", "earliest").load())
        query = (stream.select("topic", "partition", "offset").writeStream
                 .format("parquet").option("path", str(tmp_path / "out"))
                 .option("checkpointLocation", checkpoint).trigger(availableNow=True)
                 .start())
        query.awaitTermination(120)
        assert query.exception() is None

    run()
    fill(tmp_path, "clicks-b", 7, partitions=1)
    run()
    rows = spark.read.parquet(str(tmp_path / "out")).collect()
    assert sorted({r.topic for r in rows}) == ["clicks-a", "clicks-b"]
    assert sorted(r.offset for r in rows if r.topic == "clicks-b") == list(range(7))
    assert len(rows) == 27


def test_register_is_explicit_and_repeatable(spark, read_path, tmp_path):
    """register(spark) registers the source by hand (auto-discovery already did)."""
    import pyspark_logkit
    pyspark_logkit.register(spark)
    pyspark_logkit.register(spark)
    fill(tmp_path, "events", 4, partitions=1)
    assert reader(spark, tmp_path, subscribe="events").count() == 4


def test_streaming_write_is_exactly_once_under_replay(spark, tmp_path):
    """A micro-batch replayed after a crash between the sink commit and the checkpoint
    (simulated by deleting Spark's commit file for it) adds no duplicates."""
    fill(tmp_path, "src", 120, partitions=2)
    checkpoint = str(tmp_path / "ck")

    def run():
        stream = (spark.readStream.format("logkit").option("path", str(tmp_path))
                  .option("subscribe", "src").option("startingOffsets", "earliest").load())
        query = (stream.select("key", "value").writeStream.format("logkit")
                 .option("path", str(tmp_path)).option("topic", "dst")
                 .option("sinkId", "copy-src-to-dst")
                 .option("checkpointLocation", checkpoint).trigger(availableNow=True).start())
        query.awaitTermination(120)

    run()
    dst = sorted(r.value for r in reader(spark, tmp_path, subscribe="dst").collect())
    assert len(dst) == 120
    commits = sorted(glob.glob(os.path.join(checkpoint, "commits", "[0-9]*")),
                     key=lambda p: int(os.path.basename(p)))
    last = commits[-1]                           # Spark "crashed" before checkpointing:
    os.unlink(last)                              # its commit file and Hadoop's checksum
    os.unlink(os.path.join(os.path.dirname(last), "." + os.path.basename(last) + ".crc"))
    run()                                        # ...so it replays that batch
    again = sorted(r.value for r in reader(spark, tmp_path, subscribe="dst").collect())
    assert again == dst                          # no duplicates
    fill(tmp_path, "src", 10, partitions=2)
    run()
    assert reader(spark, tmp_path, subscribe="dst").count() == 130
    assert staged_files(tmp_path) == []          # every micro-batch's staging is gone
    assert sink_keys(tmp_path) == ["copy-src-to-dst"]     # the sinkId option is used


def sink_keys(root):
    with logkit.Broker(root) as broker:
        with broker.meta.begin() as txn:
            return [key.decode() for key, _ in txn.cursor(db=broker.meta.db("spark"))]


def staged_files(root):
    return [os.path.join(d, f) for d, _, files in os.walk(os.path.join(root, ".spark-staging"))
            for f in files]


def test_two_queries_writing_one_topic_each_land_every_record(spark, tmp_path):
    """Exactly-once state is per query (its checkpoint), not per topic: a second query
    writing to the same topic is not mistaken for a replay of the first."""
    fill(tmp_path, "a", 30, partitions=1)
    fill(tmp_path, "b", 40, partitions=1)
    for source in ("a", "b"):
        stream = (spark.readStream.format("logkit").option("path", str(tmp_path))
                  .option("subscribe", source).option("startingOffsets", "earliest").load())
        query = (stream.select("key", "value").writeStream.format("logkit")
                 .option("path", str(tmp_path)).option("topic", "both")
                 .option("checkpointLocation", str(tmp_path / f"ck-{source}"))
                 .trigger(availableNow=True).start())
        query.awaitTermination(120)
        assert query.exception() is None
    assert reader(spark, tmp_path, subscribe="both").count() == 70
    assert staged_files(tmp_path) == []
    keys = sink_keys(tmp_path)                  # one commit log per query id
    assert len(keys) == 2 and all(k.startswith("query:") for k in keys)


def test_streaming_write_without_an_identity_is_refused(spark, tmp_path):
    """Exactly-once needs a stable identity. Spark demands a checkpoint, but with only
    the session's checkpoint root and no query name the sink sees neither: a clear
    error, not a silent at-least-once sink."""
    fill(tmp_path, "src", 5, partitions=1)
    stream = (spark.readStream.format("logkit").option("path", str(tmp_path))
              .option("subscribe", "src").option("startingOffsets", "earliest").load())
    spark.conf.set("spark.sql.streaming.checkpointLocation", str(tmp_path / "ck-root"))
    try:
        with pytest.raises(Exception, match="needs an identity that survives restarts"):
            query = (stream.select("value").writeStream.format("logkit")
                     .option("path", str(tmp_path)).option("topic", "dst")
                     .trigger(availableNow=True).start())
            query.awaitTermination(60)
            if query.exception() is not None:
                raise query.exception()
    finally:
        spark.conf.unset("spark.sql.streaming.checkpointLocation")


def test_exactly_once_commit_recovers_a_half_appended_batch(tmp_path, caplog):
    """A sink commit that died half-way appends only the missing staged batches, and
    says so in a WARNING."""
    pytest.importorskip("pyspark")
    from pyspark_logkit.writer import append_staged, stage
    import pyarrow as pa
    with logkit.Broker(tmp_path) as broker:
        broker.create_topic("dst", 1)
    batch = pa.RecordBatch.from_pydict({"key": [b"k"] * 5000, "value": [b"v"] * 5000})
    staged = stage(str(tmp_path), "w1", "dst", iter([batch]))
    from pyspark_logkit.brokers import broker_for
    broker = broker_for(str(tmp_path))
    partition = broker.topic("dst").partition(0)
    # Simulate the crash: record the intent and append only the first staged batch.
    import pyspark_logkit.writer as w
    frames = list(w.read_staged(staged.path))
    assert len(frames) == 3
    state = {"committed": -1, "intent": {"batch": 7, "starts": {"dst/0": 0}}}
    with broker.meta.begin(write=True) as txn:
        txn.put(b"sink", json.dumps(state).encode(), db=broker.meta.db("spark"))
    first = frames[0][2]
    logkit.stamp_producer(first, w._producer_id("sink"), 7, 0)
    partition.append_batch(first)
    with caplog.at_level("WARNING", logger="pyspark_logkit.writer"):
        appended = append_staged(str(tmp_path), [staged.path], sink_id="sink", batch_id=7)
    assert appended == 2 and partition.log_end_offset == 5000
    assert any("micro-batch 7 resumes" in r.getMessage() and "1 of its 3" in r.getMessage()
               for r in caplog.records)
    assert append_staged(str(tmp_path), [staged.path], sink_id="sink", batch_id=7) == 0
    assert partition.log_end_offset == 5000


@pytest.mark.parametrize("options, message", [
    ({"subscribe": "nope"}, "topic 'nope' does not exist"),
    ({"subscribe": "events", "startingOffsets": "{bad json"}, "could not parse"),
    ({"subscribe": "events", "startingOffsets": '{"events": {"0": -7}}'}, "must be >= 0"),
    ({}, "exactly one of"),
    ({"subscribe": "events", "maxOffsetsPerTrigger": "lots"}, "positive integer"),
    ({"subscribe": "events", "minPartitions": "0"}, "positive integer"),
    ({"assign": "[0, 1]"}, "option 'assign' must be JSON like"),
    ({"subscribe": "events", "endingOffsets": "earliest"}, "cannot be 'earliest'"),
])
def test_bad_options_fail_with_a_clear_message(spark, read_path, tmp_path, options, message):
    """Bad options raise an error whose message says what is wrong, from our code, not
    a Java stack trace."""
    fill(tmp_path, "events", 3)
    with pytest.raises(Exception) as info:
        reader(spark, tmp_path, **options).collect()
    assert message in str(info.value)
    assert "LogkitSparkError" in str(info.value)
    assert "at org.apache.spark" not in str(info.value)


def test_missing_path_is_named(spark, read_path):
    """Omitting 'path' says that 'path' is required."""
    with pytest.raises(Exception, match="option 'path' is required"):
        spark.read.format("logkit").option("subscribe", "x").load().collect()


@pytest.mark.parametrize("select, message", [
    ("CAST(id AS INT) AS value", "column 'value' must be binary or string, got int"),
    ("'v' AS value, id AS partition", "column 'partition' must be int, got bigint"),
    ("'v' AS key", "needs a 'value' column"),
])
def test_bad_write_columns_fail_before_any_task(spark, tmp_path, select, message):
    """Columns of the wrong type are named, with what to write instead."""
    df = spark.range(3).selectExpr(*select.split(", "))
    with pytest.raises(Exception, match=message):
        (df.write.format("logkit").option("path", str(tmp_path)).option("topic", "t")
         .mode("append").save())
    assert not os.path.exists(os.path.join(tmp_path, ".spark-staging"))


def test_failed_batch_write_leaves_no_records_and_no_staging(spark, tmp_path):
    """A write whose task fails (a row without a topic) aborts: nothing is appended and
    the staged files of every task attempt are removed."""
    with logkit.Broker(tmp_path) as broker:
        broker.create_topic("good", 1)
    rows = [("k%d" % i, "v%d" % i, "good" if i != 150 else None) for i in range(300)]
    df = spark.createDataFrame(rows, "key string, value string, topic string").repartition(2)
    with pytest.raises(Exception, match="has no topic"):
        df.write.format("logkit").option("path", str(tmp_path)).mode("append").save()
    assert reader(spark, tmp_path, subscribe="good").count() == 0
    staging = os.path.join(tmp_path, ".spark-staging")
    assert not os.path.exists(staging) or not os.listdir(staging)


@pytest.mark.parametrize("include_headers", [False, True])
def test_retention_during_a_read_is_data_loss(tmp_path, include_headers, caplog):
    """Retention that removes offsets while a task is reading them (the task is behind
    the new log start) fails the task with failOnDataLoss=true; with
    failOnDataLoss=false a read from below the log start skips to it, with a WARNING
    naming the offsets skipped."""
    pytest.importorskip("pyspark")
    from pyspark_logkit.brokers import broker_for
    from pyspark_logkit.options import LogkitSparkError
    from pyspark_logkit.reader import OffsetRange, read_range
    with logkit.Broker(tmp_path) as broker:
        topic = broker.create_topic("t", 1, config={"segment.bytes": 1 << 20,
                                                    "retention.ms": 3_600_000})
        for first in range(0, 60_000, 500):
            expired = first < 45_000                 # timestamps from 1970
            topic.partition(0).append([(b"k", b"v" * 100, None, 1000 if expired else None)
                                       for _ in range(500)])
    root = str(tmp_path)

    def offsets_from_zero(fail_on_data_loss):
        return read_range(OffsetRange(root, "t", 0, 0, 60_000, include_headers,
                                      fail_on_data_loss))

    reading = offsets_from_zero(True)
    assert next(reading).num_rows > 0                # the task has begun
    assert broker_for(root).enforce_retention() > 0  # ...and retention overtakes it
    with pytest.raises(LogkitSparkError, match="removed by retention"):
        list(reading)
    start = broker_for(root).topic("t").partition(0).log_start_offset
    assert start > 20_000
    with caplog.at_level("WARNING", logger="pyspark_logkit.reader"):
        got = [o for batch in offsets_from_zero(False) for o in batch.column(4).to_pylist()]
    assert got == list(range(start, 60_000))
    assert any(f"offsets 0..{start - 1} of t-0 were removed" in r.getMessage()
               for r in caplog.records)


def test_a_write_option_logkit_does_not_know_is_refused_on_the_driver(tmp_path):
    """Write options go through the same settings table as reads: a misspelt option is
    refused by name before any task runs, not silently taken."""
    from pyspark.sql.types import BinaryType, StructField, StructType
    from pyspark_logkit.options import LogkitSparkError
    from pyspark_logkit.writer import SinkOptions
    schema = StructType([StructField("value", BinaryType())])
    with pytest.raises(LogkitSparkError, match="topc"):
        SinkOptions({"path": str(tmp_path), "topc": "t"}, schema, streaming=False)
    options = SinkOptions({"path": str(tmp_path), "topic": "t"}, schema, streaming=False)
    assert options.topic == "t"


# ---- the JVM reader (spark/jvm) beside the Python source --------------------------------

def test_the_jvm_reader_jar_is_built_and_serves_format_logkit(spark, tmp_path):
    """Where javac is present the package's build made the jar, local_session() put it
    on the classpath, and format("logkit") batch reads go through it; with
    spark.logkit.jvm.enabled=false, and for options it does not read (headers), the
    Python source serves them."""
    import shutil

    from pyspark_logkit import jar_path, jvm_reader
    if shutil.which("javac") is None:
        pytest.skip("no javac: the Python source is the reader (as designed)")
    assert jar_path() is not None and jar_path().endswith("logkit-spark.jar")
    assert jvm_reader(spark)
    fill(tmp_path, "events", 20, partitions=1)
    assert read_plan(reader(spark, tmp_path, subscribe="events")) == "jvm"
    assert read_plan(reader(spark, tmp_path, subscribe="events",
                            includeHeaders="true")) == "python"
    spark.conf.set("spark.logkit.jvm.enabled", "false")
    try:
        assert read_plan(reader(spark, tmp_path, subscribe="events")) == "python"
    finally:
        spark.conf.unset("spark.logkit.jvm.enabled")


def _rows(df):
    return sorted((r.topic, r.partition, r.offset, r.key, r.value, r.timestamp,
                   r.timestampType) for r in df.collect())


def test_readers_agree_on_codecs_nulls_and_append_time(spark, read_path, tmp_path):
    """Every codec logkit writes, null keys and values, and LogAppendTime batches read
    the same as the log itself; pruned columns (only value, count) too."""
    with logkit.Broker(tmp_path) as broker:
        topic = broker.create_topic("mixed", 2)
        stamped = broker.create_topic("stamped", 1,
                                      config={"message.timestamp.type": "LogAppendTime"})
        expected = []
        for n, codec in enumerate([None, "gzip", "snappy", "lz4", "zstd"]):
            for p in range(2):
                rows = [(None if i % 3 == 0 else b"k%d" % i,
                         None if i % 4 == 1 else b"v%d-%s" % (i, str(codec).encode()),
                         None, 1_700_000_000_000 + i) for i in range(n * 10, n * 10 + 7)]
                topic.partition(p).append(rows, compression_type=codec)
        stamped.partition(0).append([(b"a", b"b", None, 1000)] * 3)
        for name in ("mixed", "stamped"):
            for part in broker.topic(name).partitions:
                expected += [(name, part.partition, r.offset, r.key, r.value, r.timestamp)
                             for r in part.read(0, 1000)]
    df = reader(spark, tmp_path, subscribePattern="mixed|stamped")
    assert read_plan(df) == read_path
    got = [(t, p, o, k, v, int(ts.timestamp() * 1000)) for t, p, o, k, v, ts, _ in _rows(df)]
    assert got == sorted(expected, key=lambda r: r[:3])
    assert {r.timestampType for r in df.select("timestampType").collect()} == {0}
    assert sorted(r.value for r in df.select("value").collect()
                  if r.value is not None) == sorted(e[4] for e in expected if e[4] is not None)
    assert df.count() == len(expected) == 73


def test_a_corrupt_batch_fails_the_read_naming_file_and_position(spark, read_path,
                                                                 tmp_path):
    """A batch whose bytes do not match its CRC-32C fails the query with the segment
    file and the batch's byte position; no row of it is returned."""
    with logkit.Broker(tmp_path) as broker:
        partition = broker.create_topic("bad", 1).partition(0)
        partition.append([(b"k", b"first", None, None)])
        partition.append([(b"k", b"second-value", None, None)])
        [(path, _, length)] = partition.batch_file_ranges(0)
        [(_, second, _)] = partition.batch_file_ranges(1)      # the second batch
    with open(path, "r+b") as f:
        data = f.read(length)
        at = data.rindex(b"second-value")
        f.seek(at)
        f.write(b"S")
    with pytest.raises(Exception) as info:
        reader(spark, tmp_path, subscribe="bad").collect()
    text = str(info.value)
    assert "CRC mismatch" in text and path in text
    assert f"position {second}" in text or f"position={second}" in text or \
        f"at {second}" in text, text[:2000]


def test_writers_agree_on_partitioning_nulls_and_all_or_nothing(spark, read_path, tmp_path):
    """A write with the `topic` option (the JVM writer's shape when the jar is there, the
    Python sink's otherwise): keyed rows land on murmur2(key) like the producer, a
    `partition` column picks the partition, null keys stick to one partition per task,
    string and binary columns, and a task that fails leaves no records and no staging."""
    with logkit.Broker(tmp_path) as broker:
        broker.create_topic("out", 4)
    root = str(tmp_path)
    keyed = spark.range(3000, numPartitions=2).selectExpr(
        "CASE WHEN id % 7 = 0 THEN NULL ELSE CAST(id AS STRING) END AS key",
        "CAST(repeat('v', CAST(id % 300 AS INT)) AS BINARY) AS value")
    keyed.write.format("logkit").option("path", root).option("topic", "out") \
        .mode("append").save()
    assert write_plan(spark) == read_path       # the JVM writer ran when it was on
    pinned = spark.range(10).selectExpr("CAST(CAST(id AS STRING) AS BINARY) AS key", "'p' AS value",
                                        "CAST(id % 2 + 2 AS INT) AS partition")
    pinned.write.format("logkit").option("path", root).option("topic", "out") \
        .mode("append").save()
    assert write_plan(spark) == read_path
    bad = spark.range(100, numPartitions=2).selectExpr(
        "'v' AS value", "CAST(IF(id = 77, 9, 0) AS INT) AS partition")
    with pytest.raises(Exception, match="partition 9 does not exist"):
        bad.write.format("logkit").option("path", root).option("topic", "out") \
            .mode("append").save()
    assert not os.listdir(os.path.join(root, ".spark-staging"))
    with logkit.Broker(tmp_path) as broker:
        topic = broker.topic("out")
        records = [r for p in topic.partitions for r in p.read(0, 10_000)]
    assert len(records) == 3010
    written = sorted((r.key or b"", r.key is None, r.value) for r in records
                     if r.value != b"p")
    assert written == sorted((b"" if i % 7 == 0 else str(i).encode(), i % 7 == 0,
                              b"v" * (i % 300)) for i in range(3000))
    assert all(r.partition == topic.partition_for(r.key) for r in records
               if r.key is not None and r.value != b"p")
    assert len({r.partition for r in records if r.key is None}) <= 2   # one per task
    assert {r.partition for r in records if r.value == b"p"} == {2, 3}


def test_overwrite_is_refused_as_append_only(spark, read_path, tmp_path):
    """mode("overwrite") is refused with the Python sink's message on both paths."""
    with logkit.Broker(tmp_path) as broker:
        broker.create_topic("out", 1)
    df = spark.range(3).selectExpr("CAST(id AS STRING) AS value")
    with pytest.raises(Exception, match="append-only"):
        df.write.format("logkit").option("path", str(tmp_path)).option("topic", "out") \
            .mode("overwrite").save()
    with logkit.Broker(tmp_path) as broker:
        assert broker.topic("out").partition(0).log_end_offset == 0


def test_the_jar_build_says_why_and_builds_nothing_without_javac(tmp_path, monkeypatch,
                                                                 capsys):
    """setup.py's build_py and `make jar` go on without a JDK: no jar, a reason, and the
    Python source stays the reader."""
    import runpy
    build = runpy.run_path(os.path.join(os.path.dirname(__file__), "..", "..", "spark", "jvm",
                                        "build_jar.py"))["build"]
    monkeypatch.setenv("PATH", str(tmp_path))
    out = tmp_path / "logkit-spark.jar"
    assert build(str(out)) is False
    assert not out.exists()
    assert "no javac" in capsys.readouterr().err
