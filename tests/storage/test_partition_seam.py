"""The public seam between the storage and everything above it (docs/design.md §6, §5):
`Partition`'s methods, the whole-batch helpers (`BatchBuilder`, `stamp_producer`,
`iter_segment_batches`), the broker's logging and the clients' declared types."""

from __future__ import annotations

import logging
import os
import struct
import typing

import pytest

import logkit
from logkit import CorruptRecordError, OffsetOutOfRangeError

LENGTH = struct.Struct(">i")           # Kafka's batchLength, at byte 8 of a batch


def batch_of(*values: bytes, **options) -> bytearray:
    builder = logkit.BatchBuilder(**options)
    for n, value in enumerate(values):
        builder.append(b"k%d" % n, value, [("h", b"x")] if n == 0 else None)
    return builder.build()


def split_batches(data: bytes) -> list[bytes]:
    """Cut a run of stored batches at their length fields (an independent reading of
    Kafka's layout: 8-byte baseOffset, then a 4-byte length of what follows)."""
    out, pos = [], 0
    while pos < len(data):
        size = 12 + LENGTH.unpack_from(data, pos + 8)[0]
        out.append(data[pos:pos + size])
        pos += size
    return out


# ---- append_batch ----------------------------------------------------------------------

def test_append_batch_stamps_the_offset_and_stores_the_records(broker):
    """A built batch is appended whole at the log end; its records read back as built."""
    partition = broker.create_topic("t", 1).partition(0)
    assert partition.append_batch(batch_of(b"a", b"b")) == 0
    assert partition.append_batch(bytes(batch_of(b"c"))) == 2        # bytes work too
    records = partition.read(0)
    assert [(r.offset, r.key, r.value) for r in records] == [
        (0, b"k0", b"a"), (1, b"k1", b"b"), (2, b"k0", b"c")]
    assert records[0].headers == [("h", b"x")]
    partition.check()


def test_append_batch_with_a_bad_crc_writes_nothing(broker):
    """A batch whose bytes do not match its CRC raises CorruptRecordError naming the
    mismatch, and the log does not move."""
    partition = broker.create_topic("t", 1).partition(0)
    partition.append_batch(batch_of(b"first"))
    bad = batch_of(b"value")
    bad[-1] ^= 0xFF
    with pytest.raises(CorruptRecordError, match="CRC"):
        partition.append_batch(bad)
    assert partition.log_end_offset == 1
    assert [r.value for r in partition.read(0)] == [b"first"]


@pytest.mark.parametrize("cut", [1, 30])
def test_append_batch_whose_length_does_not_match_writes_nothing(broker, cut):
    """A truncated batch (its length field promises more bytes) is refused."""
    partition = broker.create_topic("t", 1).partition(0)
    with pytest.raises(CorruptRecordError):
        partition.append_batch(batch_of(b"value" * 10)[:-cut])
    assert partition.log_end_offset == 0


def test_append_batch_with_extra_bytes_writes_nothing(broker):
    """Two batches glued together are not one batch: refused."""
    partition = broker.create_topic("t", 1).partition(0)
    with pytest.raises(CorruptRecordError):
        partition.append_batch(batch_of(b"a") + batch_of(b"b"))
    assert partition.log_end_offset == 0


def test_append_batch_honours_max_message_bytes(broker):
    """A batch over the topic's max.message.bytes raises RecordTooLargeError."""
    partition = broker.create_topic("t", 1, config={"max.message.bytes": 2000}).partition(0)
    with pytest.raises(logkit.RecordTooLargeError):
        partition.append_batch(batch_of(b"x" * 5000))
    assert partition.log_end_offset == 0
    assert partition.config["max.message.bytes"] == 2000


# ---- reads -----------------------------------------------------------------------------

def test_read_stops_below_stop_offset(broker):
    """read(stop_offset=) returns no record at or past the stop, even mid-batch."""
    partition = broker.create_topic("t", 1).partition(0)
    partition.append_batch(batch_of(*[b"v%d" % n for n in range(10)]))
    assert [r.offset for r in partition.read(2, stop_offset=5)] == [2, 3, 4]
    assert partition.read(5, stop_offset=5) == []
    assert [r.offset for r in partition.read(8)] == [8, 9]
    with pytest.raises(OffsetOutOfRangeError):
        partition.read(11)


def test_fetch_gives_the_records_of_read_and_the_high_watermark_they_stop_at(broker):
    """fetch() = read() plus the high watermark of the same look at the partition's end
    (a Kafka fetch response's high watermark), also when the read stops short of it."""
    partition = broker.create_topic("t", 1).partition(0)
    partition.append_batch(batch_of(*[b"v%d" % n for n in range(10)]))
    records, hw = partition.fetch(3, 4)
    assert ([r.offset for r in records], hw) == ([3, 4, 5, 6], 10)
    assert [r.offset for r in partition.fetch(8)[0]] == [8, 9]
    assert partition.fetch(10) == ([], 10)
    partition.append_batch(batch_of(b"late"))
    assert [(r.offset, r.value) for r in partition.fetch(10)[0]] == [(10, b"late")]
    assert partition.fetch(11, max_bytes=1) == ([], 11)
    with pytest.raises(OffsetOutOfRangeError):
        partition.fetch(12)
    with pytest.raises(ValueError):
        partition.fetch(0, 0)


def test_read_columns_gives_the_records_of_read(broker):
    """read_columns returns Columns holding exactly what read() returns, and the offset
    to go on from."""
    partition = broker.create_topic("t", 1).partition(0)
    for n in range(3):
        builder = logkit.BatchBuilder()
        builder.append(None, b"v%d" % n)
        builder.append(b"key", None)
        partition.append_batch(builder.build())
    columns, next_offset = partition.read_columns(1, stop_offset=5)
    assert isinstance(columns, logkit.Columns)
    assert next_offset == 5 and columns.count == 4
    offsets = struct.unpack(f"={columns.count}q", columns.offsets)
    assert list(offsets) == [1, 2, 3, 4]
    records = partition.read(1, stop_offset=5)
    assert columns.nulls == bytearray(
        (r.key is None) | (r.value is None) << 1 for r in records)
    assert bytes(columns.values) == b"".join(r.value or b"" for r in records)
    columns, next_offset = partition.read_columns(next_offset)
    assert (columns.count, next_offset) == (1, 6)


def test_batches_since_copies_a_partition_batch_for_batch(tmp_path):
    """Appending the batches of one partition, as batches_since returns them, to
    another gives the same offsets and records, and the same stored bytes (a follower's
    fetch loop over the public seam)."""
    with logkit.Broker(tmp_path / "a") as leader, logkit.Broker(tmp_path / "b") as follower:
        source = leader.create_topic("t", 1, config={"segment.bytes": 4096}).partition(0)
        producer = leader.producer(linger_ms=0)
        for n in range(300):
            producer.send("t", b"value-%d" % n, key=b"k%d" % (n % 7), partition=0)
            if n % 40 == 0:
                producer.flush()
        producer.flush()
        target = follower.create_topic("t", 1, config={"segment.bytes": 4096}).partition(0)
        copied = b""
        while target.log_end_offset < source.log_end_offset:
            data = source.batches_since(target.log_end_offset, upto=source.log_end_offset,
                                        max_bytes=2000)
            assert data
            for batch in split_batches(data):
                target.append_batch(batch)
            copied += data
        assert source.batches_since(source.log_end_offset) == b""
        assert target.read(0, 1000) == source.read(0, 1000)
        assert target.batches_since(0, max_bytes=1 << 30) == copied
        target.check()


def test_batch_headers_show_a_stamped_producer(broker):
    """stamp_producer's fields come back through batch_headers, and the stamped batch
    still passes append_batch's CRC check."""
    partition = broker.create_topic("t", 1).partition(0)
    partition.append_batch(batch_of(b"plain"))
    stamped = batch_of(b"a", b"b")
    logkit.stamp_producer(stamped, 1234567890123, 7, 42)
    assert partition.append_batch(stamped) == 1
    headers = partition.batch_headers(1)
    assert [(h.base_offset, h.producer_id, h.producer_epoch, h.base_sequence)
            for h in headers] == [(1, 1234567890123, 7, 42)]
    assert isinstance(headers[0], logkit.BatchHeader)
    assert [h.producer_id for h in partition.batch_headers(0)] == [-1, 1234567890123]


@pytest.mark.parametrize("args, error", [
    ((1 << 63, 0, 0), logkit.ConfigError),
    ((1, 1 << 15, 0), logkit.ConfigError),
    ((1, 0, -(1 << 31) - 1), logkit.ConfigError),
    ((1, 0, "7"), logkit.ConfigError),
])
def test_stamp_producer_refuses_values_that_do_not_fit(args, error):
    """Out-of-range or non-integer producer fields raise ConfigError; the batch is
    unchanged."""
    batch = batch_of(b"v")
    before = bytes(batch)
    with pytest.raises(error):
        logkit.stamp_producer(batch, *args)
    assert bytes(batch) == before


def test_stamp_producer_needs_one_whole_batch_in_a_bytearray():
    """bytes cannot be stamped in place (TypeError); two batches are not one."""
    with pytest.raises(TypeError):
        logkit.stamp_producer(bytes(batch_of(b"v")), 1, 0, 0)
    with pytest.raises(CorruptRecordError):
        logkit.stamp_producer(batch_of(b"a") + batch_of(b"b"), 1, 0, 0)


# ---- chores and facts ------------------------------------------------------------------

def test_enforce_retention_through_the_partition(broker):
    """Partition.enforce_retention drops whole old segments and moves the log start."""
    topic = broker.create_topic("t", 1, config={"segment.bytes": 1024,
                                                "retention.bytes": 2048,
                                                "file.delete.delay.ms": 0})
    partition = topic.partition(0)
    for n in range(40):
        partition.append_batch(batch_of(b"x" * 200))
    deleted = partition.enforce_retention()
    assert deleted > 0
    assert partition.log_start_offset > 0
    assert partition.read(partition.log_start_offset)[0].offset == partition.log_start_offset
    partition.check()


def test_last_recovery_is_none_after_a_clean_close(tmp_path):
    """A partition closed cleanly opens without recovery: last_recovery is None."""
    with logkit.Broker(tmp_path) as broker:
        broker.create_topic("t", 1).partition(0).append_batch(batch_of(b"v"))
    with logkit.Broker(tmp_path) as broker:
        partition = broker.topic("t").partition(0)
        assert partition.log_end_offset == 1
        assert partition.last_recovery is None


def test_last_recovery_reports_the_bytes_cut_at_open(tmp_path):
    """A partition that needs recovery at open (its tail state is gone and its log
    ends in junk) reports what recovery checked and cut; the records survive."""
    with logkit.Broker(tmp_path) as broker:
        partition = broker.create_topic("t", 1).partition(0)
        partition.append_batch(batch_of(b"a", b"b"))
        directory = partition.directory
    os.unlink(os.path.join(directory, "logkit.tail"))
    with open(os.path.join(directory, "00000000000000000000.log"), "ab") as f:
        f.write(b"\x00" * 7)
    with logkit.Broker(tmp_path) as broker:
        partition = broker.topic("t").partition(0)
        report = partition.last_recovery
        assert isinstance(report, logkit.RecoveryReport)
        assert report.bytes_truncated == 7 and report.segments_checked == 1
        assert [r.value for r in partition.read(0)] == [b"a", b"b"]


# ---- whole-batch helpers ---------------------------------------------------------------

def test_batch_builder_keeps_to_its_limits():
    """try_append refuses a record that would pass limit_bytes or max_records, but the
    first record always goes in."""
    builder = logkit.BatchBuilder(limit_bytes=400)
    assert builder.try_append(b"k", b"x" * 1000)               # the first, though too big
    assert not builder.try_append(b"k", b"y")
    assert len(builder) == 1
    builder = logkit.BatchBuilder(limit_bytes=400)
    taken = 0
    while builder.try_append(b"k", b"v" * 50):
        taken += 1
    assert 2 <= taken <= 6 and builder.size_estimate_bytes <= 400
    assert len(builder.build()) <= builder.size_estimate_bytes
    counted = logkit.BatchBuilder(max_records=3)
    assert [counted.try_append(None, b"v") for _ in range(4)] == [True, True, True, False]


def test_batch_builder_compresses_and_refuses_bad_input(broker):
    """A compressed batch reads back the same; an empty build, a non-bytes value and a
    bad limit raise named errors."""
    partition = broker.create_topic("t", 1).partition(0)
    values = [b"same-value"] * 100
    batch = batch_of(*values, compression_type="gzip")
    assert len(batch) < len(batch_of(*values)) / 2
    partition.append_batch(batch)
    assert [r.value for r in partition.read(0, 1000)] == [b"same-value"] * 100
    with pytest.raises(logkit.IllegalStateError):
        logkit.BatchBuilder().build()
    with pytest.raises(TypeError):
        logkit.BatchBuilder().append(None, "text")
    with pytest.raises(logkit.ConfigError):
        logkit.BatchBuilder().append(None, b"v", [(b"bytes-key", b"v")])
    with pytest.raises(logkit.ConfigError):
        logkit.BatchBuilder(limit_bytes=10)
    with pytest.raises(logkit.ConfigError):
        logkit.BatchBuilder(compression_type="zip")


def test_iter_segment_batches_walks_a_file_and_stops_at_a_torn_tail(broker):
    """The valid batches of a segment file come out with their records; a torn final
    batch raises CorruptRecordError at its position, after them."""
    partition = broker.create_topic("t", 1).partition(0)
    partition.append_batch(batch_of(b"a", b"b"))
    partition.append_batch(batch_of(b"c"))
    partition.flush()
    path = os.path.join(partition.directory, "00000000000000000000.log")
    batches = list(logkit.iter_segment_batches(path, decode=True))
    assert [(b.header.base_offset, [r.value for r in b.records]) for b in batches] == [
        (0, [b"a", b"b"]), (2, [b"c"])]
    assert [b.records for b in logkit.iter_segment_batches(path)] == [None, None]
    torn = path + ".copy"
    with open(path, "rb") as f, open(torn, "wb") as out:
        out.write(f.read() + bytes(batch_of(b"d"))[:40])
    seen = []
    with pytest.raises(CorruptRecordError) as info:
        for batch in logkit.iter_segment_batches(torn):
            seen.append(batch.position)
    assert seen == [b.position for b in batches]
    assert info.value.position == batches[-1].position + batches[-1].header.size
    with pytest.raises(logkit.StorageError):
        list(logkit.iter_segment_batches(path + ".missing"))


# ---- the broker: types and logging -----------------------------------------------------

def test_client_factories_declare_their_types():
    """Broker.producer/consumer/group are typed, so a type checker sees misspelt calls."""
    for method, cls in [(logkit.Broker.producer, logkit.Producer),
                        (logkit.Broker.consumer, logkit.Consumer),
                        (logkit.Broker.group, logkit.ConsumerGroup)]:
        assert typing.get_type_hints(method)["return"] is cls


def test_broker_closed_property(tmp_path):
    """Broker.closed turns true on close()."""
    broker = logkit.Broker(tmp_path)
    assert broker.closed is False
    broker.close()
    assert broker.closed is True


def test_topic_create_and_delete_log_at_debug(broker, caplog):
    """Creating and deleting a topic each leave a DEBUG line in logkit.broker."""
    with caplog.at_level(logging.DEBUG, logger="logkit.broker"):
        broker.create_topic("orders", 2)
        broker.delete_topic("orders")
    lines = [(r.levelno, r.getMessage()) for r in caplog.records if r.name == "logkit.broker"]
    assert any(level == logging.DEBUG and "created topic orders" in text
               for level, text in lines)
    assert any(level == logging.DEBUG and "deleted topic orders" in text
               for level, text in lines)


def test_an_interrupted_delete_finished_at_open_logs_a_warning(tmp_path, caplog):
    """A topic flagged deleted but never removed (a crash after step 1) is removed when
    next opened, with a WARNING naming it."""
    with logkit.Broker(tmp_path) as broker:
        broker.create_topic("doomed", 2).mark_deleted()
    with caplog.at_level(logging.WARNING, logger="logkit.broker"):
        with logkit.Broker(tmp_path) as broker:
            with pytest.raises(logkit.UnknownTopicError):
                broker.topic("doomed")
            assert broker.topics() == []
    assert any(r.levelno == logging.WARNING and "interrupted deletion of topic doomed"
               in r.getMessage() for r in caplog.records)


def test_an_orphan_directory_moved_away_logs_a_warning(broker, caplog):
    """A partition directory no topic record owns is moved away on create, with a
    WARNING; its records are not adopted."""
    orphan = os.path.join(broker.path, "orders-0")
    os.makedirs(orphan)
    with open(os.path.join(orphan, "00000000000000000000.log"), "wb") as f:
        f.write(bytes(batch_of(b"old")))
    with caplog.at_level(logging.WARNING, logger="logkit.broker"):
        partition = broker.create_topic("orders", 1).partition(0)
    assert partition.log_end_offset == 0
    assert any(r.levelno == logging.WARNING and "orders-0" in r.getMessage()
               and "orphan" in r.getMessage() for r in caplog.records)
