"""Random reads of a long log (issue 16, goal 5: read latency flat in the log's size).
Sealed segments a reader has closed stay parked: their index maps are kept, with no
descriptor and no `.log` map, so a random reader does not re-map and re-fault a
segment's indexes on every read. Parked segments hold no descriptor, are bounded per
partition and per process, and are dropped when their file goes or is replaced. A seek
into a sealed segment that is not mapped reads by pread (`LogSegment._read_window`),
returning what the map would, and the map path reports any bad byte."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

import logkit
from logkit import index as index_module
from logkit import segment_cache as log_module
from logkit import segment as segment_module
from logkit.errors import CorruptRecordError

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc/self/fd"),
                                reason="counts /proc/self/fd and /proc/self/maps")

RECORD = b"v" * 100
CHECKOUT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def fill(partition, segments: int, per_segment: int = 20) -> list[int]:
    """Append records one batch each until the partition has `segments` sealed
    segments (segment.bytes is small); returns the base offset of each segment."""
    n = 0
    while len(partition._log.segment_bases()) <= segments:
        partition.append([(None, b"%06d" % n + RECORD, [], None)])
        n += 1
    return partition._log.segment_bases()


def fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def log_maps(root: str) -> set[str]:
    return {line.split()[-1] for line in open("/proc/self/maps")
            if root in line and line.rstrip().endswith(".log")}


@pytest.fixture
def long_log(tmp_path):
    broker = logkit.Broker(str(tmp_path / "data"), background=False)
    topic = broker.create_topic("t", config={"segment.bytes": 2048,
                                             "index.interval.bytes": 1})
    partition = topic.partition(0)
    bases = fill(partition, 8)
    yield broker, partition, bases
    broker.close()


def test_a_segment_read_again_reuses_its_parked_index(long_log, monkeypatch):
    """Reading segments A, B, C, then A again opens A's offset index once: A was parked
    when C evicted it, not closed. Before parking, A's index was mapped again."""
    broker, partition, bases = long_log
    opened: list[str] = []
    real = index_module.OffsetIndex.__init__

    def counting(self, path, *args, **kwargs):
        opened.append(os.path.basename(path))
        real(self, path, *args, **kwargs)

    monkeypatch.setattr(index_module.OffsetIndex, "__init__", counting)
    reader_broker = logkit.Broker(broker.path, background=False)
    reader = reader_broker.topic("t").partition(0)
    try:
        for base in (bases[0], bases[1], bases[2], bases[0], bases[1]):
            got = reader.read(base + 1, max_records=1)
            assert got[0].offset == base + 1
            assert got[0].value == b"%06d" % (base + 1) + RECORD
        sealed = [name for name in opened if not name.startswith("%020d" % bases[-1])]
        assert sorted(sealed) == sorted({"%020d.index" % b for b in bases[:3]}), opened
        assert len(reader._log._segments) <= 2
    finally:
        reader_broker.close()


def test_parked_segments_hold_no_descriptor_and_no_log_map(long_log):
    """Random reads over every sealed segment leave at most two segments open: the
    process holds the same descriptors and `.log` maps as after the first read."""
    broker, partition, bases = long_log
    reader_broker = logkit.Broker(broker.path, background=False)
    reader = reader_broker.topic("t").partition(0)
    try:
        reader.read(bases[0], max_records=1)
        reader.read(bases[1], max_records=1)
        before = fds()
        for _ in range(3):
            for base in bases[:-1]:
                assert reader.read(base, max_records=1)[0].offset == base
        assert fds() <= before, (before, fds())
        assert len(log_maps(broker.path)) <= 2, log_maps(broker.path)
        assert len(reader._log._segments) <= 2
        parked = reader._log._parked
        assert len(parked) == len(bases) - 3        # all sealed ones but the 2 open
        assert all(segment.parked for segment in parked.values())
    finally:
        reader_broker.close()
    assert not reader._log._parked                  # closed with the partition


def test_parked_segments_are_bounded_per_partition(long_log, monkeypatch):
    broker, partition, bases = long_log
    monkeypatch.setattr(log_module, "PARKED_SEGMENTS", 2)
    reader_broker = logkit.Broker(broker.path, background=False)
    reader = reader_broker.topic("t").partition(0)
    try:
        for base in bases:
            reader.read(base, max_records=1)
        assert list(reader._log._parked) == bases[-4:-2]     # the two parked last
        assert reader.read(bases[0], max_records=1)[0].offset == bases[0]
    finally:
        reader_broker.close()


def test_the_process_budget_caps_parking_and_is_given_back(long_log, monkeypatch):
    broker, partition, bases = long_log
    budget = log_module._ParkBudget(3)
    monkeypatch.setattr(log_module, "_PARK_BUDGET", budget)
    reader_broker = logkit.Broker(broker.path, background=False)
    reader = reader_broker.topic("t").partition(0)
    try:
        for base in bases:
            reader.read(base, max_records=1)
        assert list(reader._log._parked) == bases[:3] and not budget.take()
        # bases[0] is unparked (its unit comes back) and the sealed segment it evicts
        # from the open ones takes that unit
        reader.read(bases[0], max_records=1)
        assert list(reader._log._parked) == [bases[1], bases[2], bases[-2]]
        assert not budget.take()
    finally:
        reader_broker.close()
    assert budget.take() and budget.take() and budget.take()   # all given back on close


def test_a_parked_segment_whose_file_was_replaced_is_opened_afresh(tmp_path):
    """Another process truncates into a segment this one has parked (the kept prefix is
    copied back under the same name: a new file), appends other records and rolls
    past it. The parked indexes belong to the old file, so the reader reopens the
    segment and returns the new records, never the old ones."""
    root = str(tmp_path / "data")
    writer_broker = logkit.Broker(root, background=False)
    topic = writer_broker.create_topic("t", config={"segment.bytes": 2048,
                                                    "index.interval.bytes": 1})
    writer = topic.partition(0)
    bases = fill(writer, 6)
    reader_broker = logkit.Broker(root, background=False)
    reader = reader_broker.topic("t").partition(0)
    try:
        target = bases[2]
        for base in bases[:-1]:                  # bases[2] ends up parked
            reader.read(base + 2, max_records=1)
        assert target in reader._log._parked
        writer._log.truncate_to(target + 2)      # bases[2] now holds 2 records
        for n in range(40):                      # new records, rolled past the cut
            writer.append([(None, b"new-%03d" % n, [], None)])
        assert writer._log.segment_bases()[2] == target
        assert target != writer._log.segment_bases()[-1]      # sealed again
        got = reader.read(target + 2, max_records=3)
        assert [r.offset for r in got] == [target + 2, target + 3, target + 4]
        assert [r.value for r in got] == [b"new-000", b"new-001", b"new-002"]
        assert target not in reader._log._parked
    finally:
        reader_broker.close()
        writer_broker.close()


def test_moving_the_log_start_closes_a_parked_segment_and_returns_its_budget(long_log, monkeypatch):
    broker, partition, bases = long_log
    budget = log_module._ParkBudget(100)
    monkeypatch.setattr(log_module, "_PARK_BUDGET", budget)
    for base in bases:
        partition.read(base, max_records=1)
    parked = dict(partition._log._parked)
    assert parked
    partition.increase_log_start_offset(bases[-1])
    assert not partition._log._parked
    assert all(not segment.parked for segment in parked.values())
    assert budget._used == 0


def test_a_seek_into_a_sealed_segment_maps_no_log_file(long_log):
    broker, partition, bases = long_log
    reader_broker = logkit.Broker(broker.path, background=False)
    reader = reader_broker.topic("t").partition(0)
    try:
        for base in reversed(bases[:-1]):
            got = reader.read(base + 3, max_records=2)
            assert [r.offset for r in got] == [base + 3, base + 4]
            assert got[0].value == b"%06d" % (base + 3) + RECORD
        assert not log_maps(broker.path), log_maps(broker.path)
    finally:
        reader_broker.close()


@pytest.fixture
def batched_log(tmp_path):
    """Sealed segments of 5-record batches of 1000-byte values (index entries every
    4096 bytes: seeks hop over batches; some reads want more than a window)."""
    broker = logkit.Broker(str(tmp_path / "data"), background=False)
    partition = broker.create_topic("t", config={"segment.bytes": 300_000}).partition(0)
    n = 0
    while len(partition._log.segment_bases()) < 4:
        partition.append([(None, b"%06d" % (n + i) + b"w" * 994, [], None)
                          for i in range(5)])
        n += 5
    yield broker, partition, partition._log.segment_bases()
    broker.close()


def test_a_seek_by_pread_returns_what_the_map_returns(batched_log, monkeypatch):
    """Differential: reads of sealed segments by fresh readers (the pread window) and
    with the window turned off (MAX_HOPS = 0: the map) return the same records, for
    reads inside one batch, across batches, and wanting more than a window holds."""
    broker, partition, bases = batched_log
    cases = [(base + delta, max_records, max_bytes)
             for base in bases[:-1] for delta in (0, 1, 7, 133)
             for max_records, max_bytes in ((1, 1 << 20), (3, 1 << 20), (12, 1 << 20),
                                            (500, 1 << 20), (500, 20_000))]

    def read_all() -> list[list[tuple[int, bytes]]]:
        out = []
        for offset, max_records, max_bytes in cases:
            reader_broker = logkit.Broker(broker.path, background=False)
            got = reader_broker.topic("t").partition(0).read(
                offset, max_records=max_records, max_bytes=max_bytes)
            out.append([(r.offset, r.value) for r in got])
            reader_broker.close()
        return out

    by_window = read_all()
    monkeypatch.setattr(segment_module, "MAX_HOPS", 0)
    assert read_all() == by_window
    assert all(got and got[0][0] == case[0] for got, case in zip(by_window, cases))
    assert any(len(got) == 500 for got in by_window)     # a read past one window


def test_a_flipped_byte_in_a_batch_a_seek_reads_raises_with_its_position(batched_log):
    broker, partition, bases = batched_log
    sealed = bases[1]
    path = os.path.join(broker.path, "t-0", "%020d.log" % sealed)
    batch = 5 * 9                                # the tenth batch of the segment
    position = None
    with open(path, "r+b") as f:
        data = f.read()
        at = 0
        for _ in range(9):
            at += 12 + int.from_bytes(data[at + 8:at + 12], "big")
        position = at
        f.seek(at + 200)                         # inside a value: the CRC catches it
        f.write(bytes([data[at + 200] ^ 0x10]))
    reader_broker = logkit.Broker(broker.path, background=False)
    try:
        with pytest.raises(CorruptRecordError) as caught:
            reader_broker.topic("t").partition(0).read(sealed + batch + 2, max_records=1)
        assert caught.value.path == path and caught.value.position == position
    finally:
        reader_broker.close()


def test_a_bent_length_after_the_batch_a_seek_reads_raises_and_never_spins(batched_log):
    """The batch after the one a seek wants has its length field bent to -12, so its
    "end" is its own start. A read wanting more than one batch must still end — with
    the records before that batch, then CorruptRecordError at its position on the next
    read, from the map path — where the pread
    window once walked the batch ends in place for ever. Run in a child process so a
    spin fails the test (bounded) instead of hanging the suite."""
    broker, partition, bases = batched_log
    sealed = bases[1]
    path = os.path.join(broker.path, "t-0", "%020d.log" % sealed)
    with open(path, "r+b") as f:
        data = f.read()
        at = 0
        for _ in range(4):                       # the fifth batch's length field
            at += 12 + int.from_bytes(data[at + 8:at + 12], "big")
        f.seek(at + 8)
        f.write((-12).to_bytes(4, "big", signed=True))
    script = textwrap.dedent(f"""
        import logkit
        from logkit.errors import CorruptRecordError
        broker = logkit.Broker({broker.path!r}, background=False)
        p = broker.topic("t").partition(0)
        # The good records before the bad batch come first (issue 38); the read after
        # them starts at the bad batch and raises at its position.
        good = p.read({sealed + 5 * 3 + 1}, max_records=500)
        print("returned", [r.offset for r in good])
        try:
            p.read(good[-1].offset + 1, max_records=500)
        except CorruptRecordError as exc:
            print("raised", exc.position)
        else:
            print("returned again")
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=60, cwd=CHECKOUT)
    good = str([sealed + offset for offset in range(16, 20)]).split()
    assert done.stdout.split() == ["returned", *good, "raised", str(at)], (
        done.stdout, done.stderr)
