"""Differential tests against an independent implementation: kafka-python's record
batch builder and parser (a test-only dependency)."""

from __future__ import annotations

import glob
import os

import pytest

kafka_records = pytest.importorskip("kafka.record.default_records",
                                    reason="kafka-python is a test dependency")
from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder  # noqa: E402
from kafka.record.memory_records import MemoryRecords  # noqa: E402

import logkit  # noqa: E402
from logkit.records import decode_batch, encode_batch, read_header  # noqa: E402

CODECS = [0, 1, 2, 3, 4]          # none, gzip, snappy, lz4, zstd: both implement all


def sample(n=300):
    return [(b"key-%d" % i if i % 7 else None, (b"v%d-" % i) * (i % 50),
             [("trace", b"%d" % i), ("none", None)] if i % 3 == 0 else [], 1_700_000_000_000 + i)
            for i in range(n)]


def kafka_python_read(buffer: bytes):
    """(offset, timestamp, key, value, headers) of every record, via kafka-python."""
    out = []
    records = MemoryRecords(buffer)
    while records.has_next():
        batch = records.next_batch()
        assert batch.validate_crc(), "kafka-python says the CRC is wrong"
        for record in batch:
            out.append((record.offset, record.timestamp, record.key, record.value,
                        [(k, v) for k, v in record.headers]))
    return out


@pytest.mark.parametrize("codec", CODECS)
def test_kafka_python_reads_our_batches(codec):
    """Batches we encode decode identically with kafka-python, for every codec."""
    records = sample()
    batch = bytes(encode_batch(records, codec=codec, base_offset=1000))
    got = kafka_python_read(batch)
    expected = [(1000 + i, ts, k, v, list(h)) for i, (k, v, h, ts) in enumerate(records)]
    assert got == expected


@pytest.mark.parametrize("codec", CODECS)
def test_we_read_kafka_python_batches(codec):
    """Batches built by kafka-python's builder decode identically with ours."""
    records = sample()
    builder = DefaultRecordBatchBuilder(magic=2, compression_type=codec, is_transactional=False,
                                        producer_id=-1, producer_epoch=-1, base_sequence=-1,
                                        batch_size=10**8)
    for i, (k, v, h, ts) in enumerate(records):
        assert builder.append(i, timestamp=ts, key=k, value=v, headers=h) is not None
    batch = bytes(builder.build())
    header = read_header(batch, 0, len(batch))
    got = decode_batch(batch, 0, header, "t", 0)
    assert [(r.offset, r.timestamp, r.key, r.value, list(r.headers)) for r in got] == \
        [(i, ts, k, v, list(h)) for i, (k, v, h, ts) in enumerate(records)]


def test_kafka_python_reads_a_brokers_log_files(tmp_path):
    """Whole .log segment files written by a Broker parse with kafka-python, in order."""
    with logkit.Broker(tmp_path) as broker:
        topic = broker.create_topic("t", partitions=1, config={"segment.bytes": 4096})
        partition = topic.partition(0)
        written = []
        for n in range(40):
            rows = [(b"k%d" % n, b"value-%d-%d" % (n, i), [("n", b"%d" % n)], 1000 + n)
                    for i in range(10)]
            partition.append(rows, compression_type=[None, "gzip", "lz4"][n % 3])
            written.extend(rows)
    files = sorted(glob.glob(os.path.join(tmp_path, "t-0", "*.log")))
    assert len(files) > 1, "the test wants several segments"
    got = []
    for path in files:
        with open(path, "rb") as f:
            got.extend(kafka_python_read(f.read()))
    assert [g[0] for g in got] == list(range(len(written)))
    assert [(g[2], g[3], g[4]) for g in got] == [(k, v, list(h)) for k, v, h, _ in written]


def test_kafka_python_header_view_matches_ours():
    """kafka-python's view of our batch header fields agrees with ours."""
    batch = bytes(encode_batch(sample(20), codec=1, base_offset=5, producer_id=9,
                               producer_epoch=2, base_sequence=11))
    theirs = DefaultRecordBatch(batch)
    ours = read_header(batch, 0, len(batch))
    assert (theirs.base_offset, theirs.last_offset_delta, theirs.producer_id,
            theirs.producer_epoch, theirs.base_sequence, theirs.max_timestamp,
            theirs.compression_type) == (ours.base_offset, ours.last_offset_delta,
                                         ours.producer_id, ours.producer_epoch,
                                         ours.base_sequence, ours.max_timestamp, ours.codec)
