"""The Spark source's `kafka.isolation.level` over a shipped object store (DESIGN §15 and
§18): the store reader returns, row for row, what the directory reader returns over the
same log, for read_uncommitted and read_committed alike — read_committed stops at the
last stable offset the manifest records and leaves out aborted transactions' batches
and control batches. The log: two transactional producers whose committed and aborted
transactions interleave batch by batch over two partitions and several segments, plain
records between them, and a third producer's transaction left open. A manifest shipped
before it recorded transactions is refused for read_committed, naming it, and still
reads read_uncommitted."""

from __future__ import annotations

import json
import random

import pytest

import logkit

pytest.importorskip("pyspark", reason="the spark extra is not installed")

LEVEL = "kafka.isolation.level"
COMMITTED = {LEVEL: "read_committed"}
LONG_TIMEOUT = 600_000                   # the open transaction outlives the test


@pytest.fixture
def shipped(broker, tmp_path):
    """(broker, store URL, the values read_committed must return, the open producer)."""
    broker.create_topic("tx", 2, config={"segment.bytes": 2048})
    rng = random.Random(7)
    writers = [broker.producer(transactional_id=name) for name in ("p", "q")]
    plain = broker.producer()
    for writer in writers:
        writer.init_transactions()
    committed = []
    for round_ in range(6):
        for writer in writers:
            writer.begin_transaction()
        sent = {id(w): [] for w in writers}
        for i in range(12):                     # batch by batch, interleaved
            writer = rng.choice(writers)
            value = b"r%d-%d-%d" % (round_, writers.index(writer), i) + b"." * 80
            writer.send("tx", value, key=b"k%d" % i, partition=rng.randrange(2),
                        headers=[("i", b"%d" % i)] if i % 3 else None)
            writer.flush()
            sent[id(writer)].append(value)
            if i % 5 == 0:
                plain.send("tx", b"plain-%d-%d" % (round_, i), partition=i % 2).result()
                committed.append(b"plain-%d-%d" % (round_, i))
        for writer in writers:
            if rng.random() < 0.5:
                writer.commit_transaction()
                committed.extend(sent[id(writer)])
            else:
                writer.abort_transaction()
    opened = broker.producer(transactional_id="open", transaction_timeout_ms=LONG_TIMEOUT)
    opened.init_transactions()
    opened.begin_transaction()
    opened.send("tx", b"open", partition=0)
    opened.flush()
    writers[0].begin_transaction()
    writers[0].send("tx", b"after-open", partition=0)
    writers[0].send("tx", b"after-open-1", partition=1)
    writers[0].commit_transaction()             # committed, but behind the open one on 0
    committed.append(b"after-open-1")
    for writer in (*writers, plain):
        writer.close()
    p0 = broker.topic("tx").partition(0)
    assert p0.last_stable_offset < p0.high_watermark
    assert p0.aborted_transactions(0, p0.log_end_offset)
    url = (tmp_path / "store").as_uri()
    with broker.ship(url) as shipper:
        shipper.flush()
    yield broker, url, committed, opened
    opened.close()


def rows(path, **options):
    """Every row the pure-Python source reads (driver plan, then each task), in order."""
    from pyspark_logkit import LogkitDataSource
    source = LogkitDataSource({"path": str(path), "subscribe": "tx", **options})
    reader = source.reader(source.schema())
    out = [row for part in reader.partitions() for batch in reader.read(part)
           for row in batch.to_pylist()]
    return sorted(out, key=lambda r: (r["partition"], r["offset"]))


def test_the_store_reader_returns_what_the_directory_reader_returns_at_both_levels(
        shipped):
    """Also with headers (the record path), input partitions cut inside transactions
    (maxRecordsPerPartition), an ending offset past the LSO, and a start inside an
    aborted transaction."""
    broker, url, committed, _ = shipped
    p0 = broker.topic("tx").partition(0)
    first_aborted = min(first for _, first in p0.aborted_transactions(0, p0.log_end_offset))
    variants = [{}, {"includeHeaders": "true"}, {"maxRecordsPerPartition": "3"},
                {"endingOffsets": json.dumps({"tx": {"0": p0.high_watermark, "1": -1}})},
                {"startingOffsets": json.dumps({"tx": {"0": first_aborted + 1, "1": -2}})}]
    for level in ({}, COMMITTED):
        for options in variants:
            got = rows(url, **level, **options)
            assert got == rows(broker.path, **level, **options), (level, options)
    everything = [r["value"] for r in rows(url)]
    assert b"open" in everything and b"after-open" in everything
    values = sorted(r["value"] for r in rows(url, **COMMITTED))
    assert values == sorted(committed)
    assert len(everything) > len(values)


def test_a_stream_from_the_store_stops_at_the_open_transaction_until_it_is_shipped_committed(
        shipped):
    from pyspark.sql.streaming.datasource import ReadAllAvailable
    from pyspark_logkit.objectstore import StoreStreamReader
    from pyspark_logkit.options import SourceOptions
    broker, url, committed, opened = shipped
    stream = StoreStreamReader(SourceOptions(
        {"path": url, "subscribe": "tx", "startingOffsets": "earliest", **COMMITTED},
        streaming=True))

    def batch(start):
        end = stream.latestOffset(start, ReadAllAvailable())
        return end, sorted(r["value"] for part in stream.partitions(start, end)
                           for b in stream.read(part) for r in b.to_pylist())

    end, values = batch(stream.initialOffset())
    assert values == sorted(committed)
    opened.commit_transaction()
    with broker.ship(url) as shipper:
        shipper.flush()
    _, values = batch(end)
    assert values == [b"after-open", b"open"]


def test_a_manifest_without_transactions_reads_uncommitted_and_refuses_committed(shipped):
    broker, url, _, _ = shipped
    path = url[len("file://"):] + "/manifest.json"
    with open(path) as f:
        body = json.load(f)
    for entry in body["partitions"]:            # as a shipper before them wrote it
        del entry["last_stable_offset"], entry["aborted_transactions"]
    with open(path, "w") as f:
        json.dump(body, f)
    assert rows(url) == rows(broker.path)
    with pytest.raises(logkit.ConfigError, match="manifest.json records no last stable"
                                                 ".*read_uncommitted only") as caught:
        rows(url, **COMMITTED)
    assert path in str(caught.value)


@pytest.mark.spark
def test_spark_reads_the_store_read_committed_as_it_reads_the_directory(spark, shipped):
    broker, url, committed, _ = shipped

    def collect(path, **options):
        df = spark.read.format("logkit").options(path=str(path), subscribe="tx",
                                                 **options).load()
        return sorted((r.partition, r.offset, r.value) for r in df.collect())

    got = collect(url, **COMMITTED)
    assert got == collect(broker.path, **COMMITTED)
    assert sorted(v for _, _, v in got) == sorted(committed)
