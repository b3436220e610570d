"""Partition log behaviour: segments, indexes, rolls, reads, time lookups, retention,
flush policy and limits — on real files."""

from __future__ import annotations

import os
import time

import pytest

import logkit
from logkit import OffsetOutOfRangeError, RecordTooLargeError


def fill(partition, batches, per_batch=10, value=b"x" * 100, ts=None):
    for n in range(batches):
        partition.append([(b"k%d" % n, value, None, ts) for _ in range(per_batch)])


def names(partition, suffix):
    return sorted(n for n in os.listdir(partition.directory) if n.endswith(suffix))


def test_kafka_file_names_and_roll_on_segment_bytes(broker):
    """Segments roll at segment.bytes and are named by 20-digit base offsets."""
    p = broker.create_topic("t", 1, config={"segment.bytes": 8192}).partition(0)
    fill(p, 30)
    logs = names(p, ".log")
    assert len(logs) > 3
    assert logs[0] == "00000000000000000000.log"
    bases = [int(n[:20]) for n in logs]
    assert bases == sorted(bases) and all(len(n) == 24 for n in logs)
    for name in logs[:-1]:                                  # sealed: within the limit
        assert os.path.getsize(os.path.join(p.directory, name)) <= 8192
    assert names(p, ".index") == [n[:20] + ".index" for n in logs]
    assert names(p, ".timeindex") == [n[:20] + ".timeindex" for n in logs]
    assert [r.offset for r in p.read(0, max_records=10_000)] == list(range(300))
    p.check()


def test_sealed_indexes_are_trimmed_and_active_preallocated(broker):
    """A sealed segment's index holds just its entries; the active one is preallocated."""
    p = broker.create_topic("t", 1, config={"segment.bytes": 20_000,
                                            "index.interval.bytes": 1000,
                                            "segment.index.bytes": 4096}).partition(0)
    fill(p, 40)
    index_files = names(p, ".index")
    sizes = [os.path.getsize(os.path.join(p.directory, n)) for n in index_files]
    assert all(s % 8 == 0 and 0 < s < 4096 for s in sizes[:-1])
    assert sizes[-1] == 4096
    time_sizes = [os.path.getsize(os.path.join(p.directory, n))
                  for n in names(p, ".timeindex")]
    assert all(s % 12 == 0 and s > 0 for s in time_sizes[:-1])
    p.check()


def test_roll_when_index_is_full(broker):
    """A full offset index rolls the segment even below segment.bytes."""
    p = broker.create_topic("t", 1, config={"segment.index.bytes": 64,       # 8 entries
                                            "index.interval.bytes": 0}).partition(0)
    fill(p, 30, per_batch=1)
    assert len(names(p, ".log")) >= 3
    p.check()


def test_roll_on_segment_ms(broker):
    """A segment older than segment.ms rolls at the next append."""
    p = broker.create_topic("t", 1, config={"segment.ms": 50}).partition(0)
    fill(p, 1)
    time.sleep(0.12)
    fill(p, 1)
    assert len(names(p, ".log")) == 2


def test_reads_from_any_offset_across_segments(broker):
    """Every offset reads back as itself, whichever segment and index entry holds it."""
    p = broker.create_topic("t", 1, config={"segment.bytes": 4096,
                                            "index.interval.bytes": 200}).partition(0)
    fill(p, 50, per_batch=7, value=b"y" * 30)
    end = p.log_end_offset
    assert end == 350
    for offset in range(0, end, 13):
        got = p.read(offset, max_records=5)
        assert [r.offset for r in got] == list(range(offset, min(offset + 5, end)))
    assert p.read(end) == []
    with pytest.raises(OffsetOutOfRangeError):
        p.read(end + 1)
    with pytest.raises(OffsetOutOfRangeError):
        p.read(-1)


def test_max_bytes_bounds_a_read_but_returns_at_least_one_batch(broker):
    """A read stops near max_bytes, yet never returns nothing when data is there."""
    p = broker.create_topic("t", 1).partition(0)
    fill(p, 10, per_batch=10, value=b"z" * 1000)
    assert len(p.read(0, max_records=1000, max_bytes=1)) == 10
    assert len(p.read(0, max_records=1000, max_bytes=25_000)) == 30


def test_offset_for_timestamp(broker):
    """Time lookups find the first record at or after a timestamp, even out of order."""
    p = broker.create_topic("t", 1, config={"segment.bytes": 4096,
                                            "index.interval.bytes": 100}).partition(0)
    timestamps = [1000 + 10 * i for i in range(200)]
    timestamps[50] = 500                                      # one late record
    for i, ts in enumerate(timestamps):
        p.append([(None, b"v" * 40, None, ts)])
    assert p.offset_for_timestamp(0) == 0
    assert p.offset_for_timestamp(1000) == 0
    assert p.offset_for_timestamp(1001) == 1
    assert p.offset_for_timestamp(1500) == 50 + 1             # 50 holds ts 500
    assert p.offset_for_timestamp(2990) == 199
    assert p.offset_for_timestamp(3000) is None


def test_record_too_large(broker):
    """A batch above max.message.bytes is refused and nothing is written."""
    p = broker.create_topic("t", 1, config={"max.message.bytes": 1000}).partition(0)
    with pytest.raises(RecordTooLargeError):
        p.append([(None, b"x" * 2000, None, None)])
    assert p.log_end_offset == 0
    p.append([(None, b"x" * 100, None, None)])
    assert p.log_end_offset == 1


def test_retention_by_time_renames_then_unlinks(broker):
    """retention.ms removes old segments via .deleted files and advances the start."""
    p = broker.create_topic("t", 1, config={"segment.bytes": 4096, "retention.ms": 1000,
                                            "file.delete.delay.ms": 0}).partition(0)
    fill(p, 20, ts=10_000)                        # old records...
    fill(p, 20, ts=int(time.time() * 1000))       # ...then fresh ones
    before = names(p, ".log")
    deleted = broker.enforce_retention()
    assert deleted > 0
    after = names(p, ".log")
    assert len(after) == len(before) - deleted
    assert p.log_start_offset == int(after[0][:20])
    assert p.log_start_offset <= 200                           # the fresh records stay
    with pytest.raises(OffsetOutOfRangeError):
        p.read(0)
    assert p.read(p.log_start_offset)[0].offset == p.log_start_offset
    assert not [n for n in os.listdir(p.directory) if n.endswith(".deleted")]
    p.check()


def test_retention_keeps_deleted_files_for_the_delay(broker):
    """With file.delete.delay.ms, retired segments stay as .deleted for a while."""
    p = broker.create_topic("t", 1, config={"segment.bytes": 4096, "retention.ms": 1,
                                            "file.delete.delay.ms": 60_000}).partition(0)
    fill(p, 20, ts=10_000)
    assert broker.enforce_retention() > 0
    assert any(n.endswith(".log.deleted") for n in os.listdir(p.directory))
    assert p.log_start_offset == p.log_end_offset == 200      # all expired: rolled too
    p.append([(None, b"new", None, None)])
    assert [r.value for r in p.read(200)] == [b"new"]


def test_retention_by_size(broker):
    """retention.bytes deletes the oldest segments while the log is bigger."""
    p = broker.create_topic("t", 1, config={"segment.bytes": 4096,
                                            "retention.bytes": 10_000}).partition(0)
    fill(p, 60)
    broker.enforce_retention()
    assert 0 < p.log_start_offset
    assert p.size_bytes() <= 10_000 + 4096
    p.check()


def test_log_append_time(broker):
    """message.timestamp.type=LogAppendTime stamps the append time on every record."""
    p = broker.create_topic("t", 1, config={"message.timestamp.type": "LogAppendTime"}) \
        .partition(0)
    before = int(time.time() * 1000)
    p.append([(None, b"a", None, 5), (None, b"b", None, 6)])
    got = p.read(0)
    assert all(before <= r.timestamp <= int(time.time() * 1000) for r in got)
    p.check()


def test_topic_compression_type_recompresses(broker):
    """A topic compression.type re-encodes incoming batches with that codec."""
    from logkit.records import read_header
    p = broker.create_topic("t", 1, config={"compression.type": "gzip"}).partition(0)
    p.append([(b"k", b"v" * 500, [("h", b"1")], 7)] * 5)
    with open(os.path.join(p.directory, "00000000000000000000.log"), "rb") as f:
        data = f.read()
    assert read_header(data, 0, len(data)).codec == 1
    assert [(r.key, r.value, list(r.headers)) for r in p.read(0)] == \
        [(b"k", b"v" * 500, [("h", b"1")])] * 5


def test_flush_messages_one_fsyncs_every_append(broker):
    """flush.messages=1 moves the recovery point with every append."""
    p = broker.create_topic("t", 1, config={"flush.messages": 1}).partition(0)
    fill(p, 3)
    assert p._log.tail().recovery_point == 30
    q = broker.create_topic("u", 1).partition(0)
    fill(q, 3)
    assert q._log.tail().recovery_point == 0
    q.flush()
    assert q._log.tail().recovery_point == 30


def test_flush_ms_runs_in_the_background(tmp_path):
    """flush.ms is honoured by the broker's scheduler thread."""
    with logkit.Broker(tmp_path, config={"log.flush.scheduler.interval.ms": 10}) as broker:
        p = broker.create_topic("t", 1, config={"flush.ms": 20}).partition(0)
        fill(p, 2)
        deadline = time.monotonic() + 10
        while p._log.tail().recovery_point < 20 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert p._log.tail().recovery_point == 20


def test_log_append_time_with_a_topic_codec_does_both(broker):
    """LogAppendTime and a topic compression.type together: recompressed and stamped."""
    from logkit.records import read_header
    p = broker.create_topic("t", 1, config={"message.timestamp.type": "LogAppendTime",
                                            "compression.type": "zstd"}).partition(0)
    before = int(time.time() * 1000)
    p.append([(b"k", b"v" * 300, None, 5)] * 4)
    with open(os.path.join(p.directory, "00000000000000000000.log"), "rb") as f:
        data = f.read()
    header = read_header(data, 0, len(data))
    assert header.codec == 4 and header.attributes & 0x08
    got = p.read(0)
    assert [r.value for r in got] == [b"v" * 300] * 4
    assert all(r.timestamp >= before for r in got)
    p.check()


def test_segment_bytes_beyond_int32_is_refused(broker):
    """segment.bytes is an int32 in Kafka (index positions are int32): 2**31 is refused."""
    with pytest.raises(logkit.ConfigError, match="segment.bytes"):
        broker.create_topic("t", 1, config={"segment.bytes": 2**31})
