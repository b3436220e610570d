"""Segments and their indexes on real files: Kafka's formats, lookups, sealing, and the
states a roll or an appender killed half-way leaves behind."""

from __future__ import annotations

import os
import struct

import pytest

import logkit
from logkit import CorruptRecordError
from logkit.index import OffsetIndex, TimeIndex
from logkit.segment import LogSegment, parse_segment_name, segment_file_name
from tests.helpers.tailpoke import batch_positions


def entries(path, fmt):
    size = struct.calcsize(fmt)
    with open(path, "rb") as f:
        data = f.read()
    return [struct.unpack_from(fmt, data, i) for i in range(0, len(data) - size + 1, size)]


def test_file_names():
    """Kafka's 20-digit names, and only those parse as segments."""
    assert segment_file_name(0, ".log") == "00000000000000000000.log"
    assert segment_file_name(2**63 - 1, ".index") == "09223372036854775807.index"
    assert parse_segment_name("00000000000000000042.log") == 42
    for name in ["00000000000000000042.index", "42.log", "0000000000000000004x.log",
                 "00000000000000000042.log.deleted", "logkit.tail"]:
        assert parse_segment_name(name) is None


def test_index_formats_are_kafkas(broker):
    """.index holds big-endian (relative offset int32, position int32) pointing at batch
    starts; .timeindex (timestamp int64, relative offset int32), both increasing."""
    p = broker.create_topic("t", 1, config={"index.interval.bytes": 300,
                                            "segment.bytes": 20_000}).partition(0)
    for n in range(150):
        p.append([(None, b"v" * 90, None, 10_000 + n)] * 2)
    p._log.roll()
    first = os.path.join(p.directory, "00000000000000000000")
    starts = batch_positions(first + ".log")
    offset_entries = entries(first + ".index", ">ii")
    time_entries = entries(first + ".timeindex", ">qi")
    assert len(offset_entries) > 5 and len(time_entries) > 5
    for relative, position in offset_entries:
        assert position in starts
        record = p.read(relative, max_records=1)[0]
        assert record.offset == relative
    assert [e[0] for e in offset_entries] == sorted({e[0] for e in offset_entries})
    assert [e[0] for e in time_entries] == sorted({e[0] for e in time_entries})
    assert time_entries[-1][0] == max(r.timestamp for r in p.read(0, max_records=10**6)
                                      if r.offset < p._log._bases[1])


def test_offset_index_lookup_semantics(tmp_path):
    """lookup() gives the last entry at or before an offset; before the first: 0."""
    index = OffsetIndex(str(tmp_path / "x.index"), 100, writable=True, entries=0,
                        create_bytes=80)
    assert index.capacity == 10 and index.lookup(150) == 0
    for relative, position in [(4, 500), (9, 1200), (20, 3000)]:
        index.append(100 + relative, position)
    assert [index.lookup(o) for o in (100, 103, 104, 105, 109, 119, 120, 10**6)] == \
        [0, 0, 500, 500, 1200, 1200, 3000, 3000]
    assert index.lookup_entry(110) == (109, 1200)
    index.trim()
    assert os.path.getsize(tmp_path / "x.index") == 24 and index.is_full
    index.close()


def test_time_index_skips_timestamps_that_do_not_grow(tmp_path):
    """The time index keeps only increasing timestamps; lookups start at or before."""
    index = TimeIndex(str(tmp_path / "x.timeindex"), 0, writable=True, entries=0,
                      create_bytes=120)
    for ts, offset in [(100, 3), (90, 5), (100, 6), (250, 9), (300, 12)]:
        index.append(ts, offset)
    assert [index.entry(n) for n in range(index.entries)] == [(100, 3), (250, 9), (300, 12)]
    assert index.lookup(50) == 0 and index.lookup(101) == 3 and index.lookup(301) == 12
    assert index.last_timestamp() == 300
    index.close()


def test_untrimmed_sealed_index_reads_as_its_entries(tmp_path):
    """A sealed index still preallocated (its roller died before trimming) counts only
    its real entries, not the zero padding."""
    path = str(tmp_path / "x.index")
    index = OffsetIndex(path, 0, writable=True, entries=0, create_bytes=4096)
    for n in range(1, 38):
        index.append(n * 3, n * 100)
    index.close()
    sealed = OffsetIndex(path, 0, writable=False)
    assert sealed.capacity == 512 and sealed.entries == 37
    assert sealed.lookup(10**9) == 3700
    sealed.close()
    time_path = str(tmp_path / "x.timeindex")
    index = TimeIndex(time_path, 0, writable=True, entries=0, create_bytes=1200)
    index.append(500, 4)
    index.close()
    sealed = TimeIndex(time_path, 0, writable=False)
    assert sealed.entries == 1 and sealed.last_timestamp() == 500
    sealed.close()


def test_roll_on_full_time_index_keeps_the_true_max_timestamp(broker):
    """Rolling because the time index is full still records the segment's max
    timestamp, so time lookups and time retention see every record."""
    p = broker.create_topic("t", 1, config={"segment.index.bytes": 64,      # 5 entries
                                            "index.interval.bytes": 0}).partition(0)
    for n in range(40):
        p.append([(None, b"v", None, 1000 + 10 * n)])
    assert len([n for n in os.listdir(p.directory) if n.endswith(".log")]) >= 4
    for n in range(40):
        assert p.offset_for_timestamp(1000 + 10 * n) == n
        assert p.offset_for_timestamp(1000 + 10 * n - 5) == n
    p.check()


def test_segment_read_checks_base_offsets_against_the_chain(tmp_path):
    """baseOffset is outside the CRC: a batch whose baseOffset disagrees with its index
    entry or the previous batch raises CorruptRecordError instead of renumbering."""
    with logkit.Broker(tmp_path) as broker:
        p = broker.create_topic("t", 1, config={"index.interval.bytes": 100}).partition(0)
        for n in range(20):
            p.append([(None, b"%d-%d" % (n, i), None, 5) for i in range(5)])
        directory = p.directory
    log_path = os.path.join(directory, "00000000000000000000.log")
    positions = batch_positions(log_path)
    for victim in (0, 7, 19):
        with open(log_path, "r+b") as f:
            f.seek(positions[victim] + 7)
            original = f.read(1)
            f.seek(positions[victim] + 7)
            f.write(bytes([original[0] ^ 0x02]))
        segment = LogSegment(directory, 0, active=False)
        size = segment.file_size()
        for start in range(0, 100, 3):
            try:
                records, _ = segment.read(start, size, "t", 0, max_records=100,
                                          max_bytes=10**6, stop_offset=100)
            except CorruptRecordError as exc:
                assert exc.path == log_path and exc.position in positions
                continue
            assert [r.offset for r in records] == list(range(start, start + len(records)))
            assert [r.value for r in records] == \
                [b"%d-%d" % divmod(o, 5) for o in range(start, start + len(records))]
        with pytest.raises(CorruptRecordError):
            list(segment.headers(0, size))
        segment.close()
        with open(log_path, "r+b") as f:
            f.seek(positions[victim] + 7)
            f.write(original)


def test_leftover_files_of_a_killed_roll_are_not_a_segment(tmp_path):
    """A roller killed after creating the next segment's files but before publishing
    them: a live appender keeps going, rolls later, and no offset is skipped."""
    with logkit.Broker(tmp_path, background=False) as broker:
        p = broker.create_topic("t", 1, config={"segment.bytes": 2048}).partition(0)
        for n in range(5):
            p.append([(None, b"x" * 150, None, 1000 + n)])
        # exactly what the killed roller left: next segment's three files, unpublished
        LogSegment(p.directory, p.log_end_offset, active=True,
                   create_index_bytes=10485760).close()
        for n in range(5, 40):
            p.append([(None, b"x" * 150, None, 1000 + n)])
        assert [r.offset for r in p.read(0, max_records=100)] == list(range(40))
        for offset in range(40):
            assert p.read(offset, max_records=1)[0].offset == offset
        p.check()
    with logkit.Broker(tmp_path, background=False) as broker:   # and a fresh open agrees
        p = broker.topic("t").partition(0)
        assert p._log.last_recovery is None
        assert [r.offset for r in p.read(0, max_records=100)] == list(range(40))
        p.check()


def test_roll_killed_after_publishing_leaves_a_readable_segment(tmp_path):
    """A sealed segment whose indexes were never trimmed (roller killed after publishing
    the new segment) still reads, looks up times and obeys time retention correctly."""
    config = {"segment.bytes": 4096, "index.interval.bytes": 200, "retention.ms": 10**12}
    with logkit.Broker(tmp_path, background=False) as broker:
        p = broker.create_topic("t", 1, config=config).partition(0)
        for n in range(40):
            p.append([(None, b"y" * 100, None, 5000 + n)])
        directory = p.directory
    first = os.path.join(directory, "00000000000000000000")
    for suffix in (".index", ".timeindex"):         # put the preallocated padding back
        os.truncate(first + suffix, 10485760)
    with logkit.Broker(tmp_path, background=False) as broker:
        p = broker.topic("t").partition(0)
        for n in range(40):
            assert p.read(n, max_records=1)[0].offset == n
            assert p.offset_for_timestamp(5000 + n) == n
        assert broker.enforce_retention(now_ms=5000 + 10**12 + 10) == 0
        p.check()
