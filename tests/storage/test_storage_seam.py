"""The storage seam that Partition wires up: `read(stop_offset=)`, `batches_since()` and
`last_recovery` of the partition log, checked on real files; `batches_since()` bytes are
parsed by kafka-python's decoder (an independent implementation)."""

from __future__ import annotations

import os

import pytest

from logkit import OffsetOutOfRangeError

kafka_records = pytest.importorskip("kafka.record.memory_records",
                                    reason="kafka-python is a test dependency")
from kafka.record.memory_records import MemoryRecords  # noqa: E402


def storage(partition):
    """The partition's log (the seam under test)."""
    return partition._log


def fill(partition, batches, per_batch=10, value=b"v" * 100):
    for n in range(batches):
        partition.append([(b"k%d" % n, value + b"%d" % i, None, None)
                          for i in range(per_batch)])


def kafka_python_batches(data: bytes):
    """[(base offset, last offset, [(offset, key, value)])] per batch, via kafka-python,
    which also checks each CRC."""
    out = []
    records = MemoryRecords(data)
    while records.has_next():
        batch = records.next_batch()
        assert batch.validate_crc(), "kafka-python says the CRC is wrong"
        rows = [(r.offset, r.key, r.value) for r in batch]
        out.append((batch.base_offset, rows[-1][0], rows))
    return out


def segment_bytes(partition) -> bytes:
    """Every .log file of the partition, concatenated in offset order."""
    names = sorted(n for n in os.listdir(partition.directory) if n.endswith(".log"))
    data = b""
    for name in names:
        with open(os.path.join(partition.directory, name), "rb") as f:
            data += f.read()
    return data


def test_batches_since_is_byte_identical_and_parses_with_kafka_python(broker):
    """From offset 0 the bytes are the segment files' bytes, and kafka-python reads
    every record back with the offsets, keys and values we appended."""
    p = broker.create_topic("t", 1).partition(0)
    fill(p, 5)
    data = storage(p).batches_since(0)
    assert data == segment_bytes(p)
    batches = kafka_python_batches(data)
    assert [(b, last) for b, last, _ in batches] == [(n * 10, n * 10 + 9) for n in range(5)]
    rows = [row for _, _, rows in batches for row in rows]
    assert rows == [(n * 10 + i, b"k%d" % n, b"v" * 100 + b"%d" % i)
                    for n in range(5) for i in range(10)]


def test_batches_since_starts_at_the_whole_batch_holding_the_offset(broker):
    """An offset inside a batch returns that batch whole, from its base offset."""
    p = broker.create_topic("t", 1).partition(0)
    fill(p, 3)
    batches = kafka_python_batches(storage(p).batches_since(15))
    assert [(b, last) for b, last, _ in batches] == [(10, 19), (20, 29)]
    assert kafka_python_batches(storage(p).batches_since(20))[0][0] == 20


def test_batches_since_at_the_end_is_empty_and_outside_the_log_raises(broker):
    """b"" at the log end; OffsetOutOfRangeError below the log start or past the end."""
    p = broker.create_topic("t", 1).partition(0)
    fill(p, 2)
    log = storage(p)
    assert log.batches_since(20) == b""
    with pytest.raises(OffsetOutOfRangeError):
        log.batches_since(21)
    with pytest.raises(OffsetOutOfRangeError):
        log.batches_since(-1)


def test_batches_since_below_a_retention_start_raises(broker):
    """Once retention moved the log start, offsets below it are out of range."""
    p = broker.create_topic("t", 1, config={"segment.bytes": 4096,
                                            "retention.bytes": 10_000}).partition(0)
    fill(p, 20)
    log = storage(p)
    assert log.enforce_retention() > 0
    start = p.log_start_offset
    assert 0 < start < p.log_end_offset
    with pytest.raises(OffsetOutOfRangeError):
        log.batches_since(start - 1)
    assert kafka_python_batches(log.batches_since(start))[0][0] == start


def test_batches_since_crosses_a_roll(broker):
    """Batches come from every segment in order, with no gap at a segment boundary."""
    p = broker.create_topic("t", 1, config={"segment.bytes": 4096}).partition(0)
    fill(p, 20)
    assert len([n for n in os.listdir(p.directory) if n.endswith(".log")]) > 2
    data = storage(p).batches_since(0, max_bytes=1 << 30)
    assert data == segment_bytes(p)
    offsets = [row[0] for _, _, rows in kafka_python_batches(data) for row in rows]
    assert offsets == list(range(200))


def test_batches_since_upto_stops_before_the_first_batch_at_or_past_it(broker):
    """`upto` keeps whole batches: a batch that starts below it is returned whole even
    when it ends past it; one starting at or past it is not."""
    p = broker.create_topic("t", 1, config={"segment.bytes": 4096}).partition(0)
    fill(p, 20)
    log = storage(p)
    batches = kafka_python_batches(log.batches_since(0, upto=35, max_bytes=1 << 30))
    assert [(b, last) for b, last, _ in batches] == [(0, 9), (10, 19), (20, 29), (30, 39)]
    batches = kafka_python_batches(log.batches_since(0, upto=30, max_bytes=1 << 30))
    assert batches[-1][1] == 29
    assert log.batches_since(30, upto=30) == b""
    everything = log.batches_since(0, upto=p.log_end_offset, max_bytes=1 << 30)
    assert everything == segment_bytes(p)


def test_batches_since_max_bytes_bounds_the_answer_but_returns_one_batch(broker):
    """max_bytes stops at a whole batch; a bound smaller than one batch still returns
    that batch, so a follower always makes progress."""
    p = broker.create_topic("t", 1).partition(0)
    fill(p, 6)
    log = storage(p)
    one = log.batches_since(0, max_bytes=1)
    assert [(b, last) for b, last, _ in kafka_python_batches(one)] == [(0, 9)]
    two = log.batches_since(0, max_bytes=2 * len(one))
    assert [(b, last) for b, last, _ in kafka_python_batches(two)] == [(0, 9), (10, 19)]
    # a follower that keeps asking from where it got to ends with the whole log
    got, offset = b"", 0
    while True:
        data = log.batches_since(offset, max_bytes=len(one) + 1)
        if not data:
            break
        got += data
        offset = kafka_python_batches(data)[-1][1] + 1
    assert got == segment_bytes(p)


def test_read_stop_offset_bounds_records(broker):
    """read(stop_offset=) returns only records below it."""
    p = broker.create_topic("t", 1).partition(0)
    fill(p, 3)
    log = storage(p)
    assert [r.offset for r in log.read(5, stop_offset=13)] == list(range(5, 13))
    assert [r.offset for r in log.read(0, stop_offset=None)] == list(range(30))
    assert log.read(13, stop_offset=13) == []


def test_last_recovery_is_none_after_a_clean_open_and_a_report_after_a_cut(tmp_path):
    """A cleanly closed log opens without recovery; a torn tail is recovered and the
    report says how many bytes were cut."""
    import logkit
    with logkit.Broker(tmp_path / "d") as b:
        p = b.create_topic("t", 1).partition(0)
        fill(p, 3)
        path = os.path.join(p.directory, "00000000000000000000.log")
    with logkit.Broker(tmp_path / "d") as b:
        assert storage(b.topic("t").partition(0)).last_recovery is None
    size = os.path.getsize(path)
    with open(path, "ab") as f:                 # garbage past the end, then a dirty tail
        f.write(b"\x00" * 37)
    tail = os.path.join(os.path.dirname(path), "logkit.tail")
    with open(tail, "r+b") as f:
        f.seek(8)
        f.write((1).to_bytes(8, "little"))      # a seqlock left odd: a writer died
    with logkit.Broker(tmp_path / "d") as b:
        report = storage(b.topic("t").partition(0)).last_recovery
        assert report is not None and report.bytes_truncated == 37
        assert os.path.getsize(path) == size


def test_check_names_the_file_and_position_of_a_flipped_byte(tmp_path):
    """check() verifies stored data with named errors, never assert (python -O keeps
    it): a flipped byte in a batch body is reported at that batch's position."""
    import logkit
    from logkit import CorruptRecordError
    from tests.helpers.tailpoke import batch_positions
    with logkit.Broker(tmp_path / "d") as b:
        p = b.create_topic("t", 1).partition(0)
        fill(p, 4)
        p.check()
        path = os.path.join(p.directory, "00000000000000000000.log")
    third = batch_positions(path)[2]
    with open(path, "r+b") as f:
        f.seek(third + 70)
        byte = f.read(1)
        f.seek(third + 70)
        f.write(bytes([byte[0] ^ 0x55]))
    with logkit.Broker(tmp_path / "d") as b:
        p = b.topic("t").partition(0)
        with pytest.raises(CorruptRecordError) as info:
            p.check()
        assert (info.value.path, info.value.position) == (path, third)


def test_batches_since_across_more_segments_than_stay_open(broker):
    """One answer that spans more segments than a partition keeps open, with the early
    segments already open (so opening a later one closes the oldest): every byte comes
    back, none from a closed file (found by a follower fetch: Bad file descriptor)."""
    from logkit.segment_cache import MAX_OPEN_SEGMENTS
    p = broker.create_topic("t", 1, config={"segment.bytes": 2048}).partition(0)
    fill(p, 40)
    logs = [n for n in os.listdir(p.directory) if n.endswith(".log")]
    assert len(logs) > 2 * MAX_OPEN_SEGMENTS
    for offset in range(0, 400, 10):                 # open segments in offset order
        p.read(offset, 1)
    expected = segment_bytes(p)
    assert storage(p).batches_since(0, max_bytes=1 << 30) == expected
    ranges = storage(p).batch_file_ranges(0, max_bytes=1 << 30)
    assert len(ranges) == len(logs)
    pieces = []
    for path, position, length in ranges:
        with open(path, "rb") as f:
            f.seek(position)
            pieces.append(f.read(length))
    assert b"".join(pieces) == expected
