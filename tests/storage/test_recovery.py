"""Recovery: clean shutdown, torn tails, flipped bytes, lost indexes and tails, format
versions — each on real files."""

from __future__ import annotations

import json
import os

import pytest

import logkit
from logkit import CorruptRecordError, IncompatibleFormatError
from tests.helpers.tailpoke import batch_positions, poke, simulate_reboot


def write(root, batches=20, config=None, per_batch=10):
    with logkit.Broker(root) as broker:
        p = broker.create_topic("t", 1, config=config).partition(0)
        for n in range(batches):
            p.append([(b"k", b"%d-%d" % (n, i), None, 1000 + n) for i in range(per_batch)])
        return p.directory


def reopen(root):
    broker = logkit.Broker(root)
    return broker, broker.topic("t").partition(0)


def test_clean_close_skips_recovery_even_after_reboot(tmp_path):
    """A clean close lets the next open, even on another boot, skip the scan."""
    directory = write(tmp_path)
    simulate_reboot(directory)
    poke(directory, clean=1)
    broker, p = reopen(tmp_path)
    with broker:
        assert p._log.last_recovery is None
        assert p.log_end_offset == 200


def test_torn_tail_after_crash_is_cut(tmp_path):
    """Garbage after the last batch is truncated by recovery; everything before stays."""
    directory = write(tmp_path)
    log_path = os.path.join(directory, "00000000000000000000.log")
    good = os.path.getsize(log_path)
    with open(log_path, "ab") as f:
        f.write(b"\x00\x00\x00\x00\x00\x00\x00\xc8\x00\x00\x01\x00torn")  # a partial batch
    simulate_reboot(directory)
    broker, p = reopen(tmp_path)
    with broker:
        report = p._log.last_recovery
        assert report is not None and report.bytes_truncated == 16
        assert os.path.getsize(log_path) == good
        assert p.log_end_offset == 200
        assert [r.value for r in p.read(195)] == [b"19-%d" % i for i in range(5, 10)]
        p.append([(None, b"after", None, None)])
        assert p.read(200)[0].value == b"after"
        p.check()


def test_flipped_byte_in_stored_batch_raises_on_read(tmp_path):
    """A flipped byte in a trusted segment raises CorruptRecordError with path and position."""
    directory = write(tmp_path)
    log_path = os.path.join(directory, "00000000000000000000.log")
    sixth = batch_positions(log_path)[5]
    with open(log_path, "r+b") as f:
        data = bytearray(f.read())
        data[sixth + 70] ^= 0x01                          # inside the sixth batch
        f.seek(0)
        f.write(data)
    broker, p = reopen(tmp_path)
    with broker:
        assert [r.offset for r in p.read(0, max_records=50)] == list(range(50))
        with pytest.raises(CorruptRecordError) as info:
            p.read(50)
        assert info.value.path == log_path
        assert info.value.position == sixth
        # a read that meets it returns the good records before it, never garbage; the
        # next read, from the bad batch, raises
        assert [r.offset for r in p.read(45, max_records=100)] == list(range(45, 50))
        with pytest.raises(CorruptRecordError):
            p.read(50, max_records=100)


def test_flipped_byte_after_reboot_truncates_there(tmp_path):
    """After an unclean reboot, recovery validates by CRC and cuts at the bad batch."""
    directory = write(tmp_path)
    log_path = os.path.join(directory, "00000000000000000000.log")
    size = os.path.getsize(log_path)
    thirteenth = batch_positions(log_path)[12]
    with open(log_path, "r+b") as f:
        f.seek(thirteenth + 80)
        byte = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([byte[0] ^ 0xFF]))
    simulate_reboot(directory, recovery_point=0)
    broker, p = reopen(tmp_path)
    with broker:
        assert p.log_end_offset == 120
        assert p._log.last_recovery.bytes_truncated == size - thirteenth
        assert p.read(110)[-1].offset == 119
        p.check()


def test_corruption_in_a_middle_segment_drops_later_segments(tmp_path):
    """As in Kafka, recovery drops every segment after a truncated one."""
    directory = write(tmp_path, batches=100, config={"segment.bytes": 4096})
    logs = sorted(n for n in os.listdir(directory) if n.endswith(".log"))
    assert len(logs) >= 3
    victim = os.path.join(directory, logs[1])
    with open(victim, "r+b") as f:
        f.seek(100)
        f.write(b"\xff\xff\xff")
    simulate_reboot(directory, recovery_point=0)
    broker, p = reopen(tmp_path)
    with broker:
        remaining = sorted(n for n in os.listdir(directory) if n.endswith(".log"))
        assert remaining == logs[:2]
        assert p.log_end_offset == int(logs[1][:20])      # cut at the victim's first batch
        p.check()
        p.append([(None, b"x", None, None)])
        p.check()


@pytest.mark.parametrize("suffix", [".index", ".timeindex"])
def test_missing_index_is_rebuilt(tmp_path, suffix):
    """A deleted index file is rebuilt from the log on open."""
    directory = write(tmp_path, batches=60, config={"segment.bytes": 4096,
                                                    "index.interval.bytes": 200})
    logs = sorted(n for n in os.listdir(directory) if n.endswith(".log"))
    for name in logs:
        os.unlink(os.path.join(directory, name[:20] + suffix))
    broker, p = reopen(tmp_path)
    with broker:
        assert all(os.path.exists(os.path.join(directory, n[:20] + suffix)) for n in logs)
        assert p.offset_for_timestamp(1030) == 300
        assert [r.offset for r in p.read(333, max_records=3)] == [333, 334, 335]
        p.check()


def test_lost_tail_file_is_rebuilt_from_segments(tmp_path):
    """Deleting logkit.tail triggers a full recovery that restores every offset."""
    directory = write(tmp_path, batches=30, config={"segment.bytes": 4096})
    os.unlink(os.path.join(directory, "logkit.tail"))
    broker, p = reopen(tmp_path)
    with broker:
        assert p.log_end_offset == 300 and p.log_start_offset == 0
        assert p._log.last_recovery.bytes_truncated == 0
        p.check()


def test_log_shorter_than_committed_size_is_recovered(tmp_path):
    """A .log truncated below its committed size is detected on open and recovered."""
    directory = write(tmp_path)
    log_path = os.path.join(directory, "00000000000000000000.log")
    size = os.path.getsize(log_path)
    os.truncate(log_path, size - 10)
    broker, p = reopen(tmp_path)
    with broker:
        assert p.log_end_offset == 190                      # the last batch is torn
        p.check()


def test_torn_seqlock_is_repaired(tmp_path):
    """A tail left odd (writer died mid-publish) is recovered, not waited on forever."""
    directory = write(tmp_path)
    with open(os.path.join(directory, "logkit.tail"), "r+b") as f:
        f.seek(8)
        f.write((12345).to_bytes(8, "little"))             # odd sequence number
    broker, p = reopen(tmp_path)
    with broker:
        assert p.log_end_offset == 200
        assert p._log.last_recovery is not None


def test_unknown_format_major_version_is_refused(tmp_path):
    """logkit.json with another major version raises IncompatibleFormatError."""
    write(tmp_path)
    with open(os.path.join(tmp_path, "logkit.json"), "w") as f:
        json.dump({"format_version": "9.0"}, f)
    with pytest.raises(IncompatibleFormatError, match="9.0"):
        logkit.Broker(tmp_path)
    with open(os.path.join(tmp_path, "logkit.json"), "w") as f:
        f.write("not json")
    with pytest.raises(IncompatibleFormatError):
        logkit.Broker(tmp_path)


def small_log(root):
    """Three batches (none, gzip, lz4) of five records; returns (directory, log bytes)."""
    with logkit.Broker(root, background=False) as broker:
        p = broker.create_topic("t", 1, config={"index.interval.bytes": 0}).partition(0)
        for n, codec in enumerate([None, "gzip", "lz4"]):
            p.append([(b"k%d" % i, b"v%d-%d" % (n, i), [("h", b"%d" % i)], 1000 + n)
                      for i in range(5)], compression_type=codec)
        directory = p.directory
    with open(os.path.join(directory, "00000000000000000000.log"), "rb") as f:
        return directory, f.read()


EXPECTED = [(o, b"k%d" % (o % 5), b"v%d-%d" % divmod(o, 5)) for o in range(15)]


def test_no_flipped_byte_anywhere_returns_wrong_data(tmp_path):
    """Flip each byte of a stored log in turn: every read from every offset either
    raises CorruptRecordError (with the file's path) or returns exactly what was
    written — all of it, or the records before the damaged batch, when the read from
    where it stopped raises. (Only the leader epoch field is free to change.)"""
    directory, original = small_log(tmp_path)
    log_path = os.path.join(directory, "00000000000000000000.log")
    harmless = 0
    for position in range(len(original)):
        damaged = bytearray(original)
        damaged[position] ^= 0x10
        with open(log_path, "r+b") as f:
            f.write(damaged)
        with logkit.Broker(tmp_path, background=False) as broker:
            p = broker.topic("t").partition(0)
            clean = True
            for start in (0, 4, 5, 9, 10, 14):
                try:
                    got = p.read(start, max_records=100)
                    assert [(r.offset, r.key, r.value) for r in got] == \
                        EXPECTED[start:start + len(got)]
                    if start + len(got) < len(EXPECTED):     # stopped before the damage
                        p.read(start + len(got), max_records=100)
                        raise AssertionError(f"a short read at {start} with no fault after")
                except CorruptRecordError as exc:
                    assert exc.path == log_path
                    clean = False
                    continue
            harmless += clean
    with open(log_path, "r+b") as f:
        f.write(original)
    assert harmless == 3 * 4           # the three batches' partitionLeaderEpoch bytes


def test_after_a_reboot_recovery_cuts_at_any_flipped_byte(tmp_path):
    """After an unclean reboot, a flipped byte anywhere in the tail segment makes
    recovery cut from the damaged batch on; the batches before it stay readable."""
    directory, original = small_log(tmp_path)
    log_path = os.path.join(directory, "00000000000000000000.log")
    starts = batch_positions(log_path)
    for position in range(0, len(original), 3):
        damaged = bytearray(original)
        damaged[position] ^= 0x81
        with open(log_path, "wb") as f:
            f.write(damaged)
        simulate_reboot(directory, recovery_point=0)
        with logkit.Broker(tmp_path, background=False) as broker:
            p = broker.topic("t").partition(0)
            batch = max(i for i, s in enumerate(starts) if s <= position)
            in_epoch = 12 <= position - starts[batch] < 16
            kept = 3 if in_epoch else batch                 # whole batches kept
            assert p.log_end_offset == 5 * kept, position
            assert p._log.last_recovery.bytes_truncated == \
                (0 if in_epoch else len(original) - starts[batch])
            got = p.read(0, max_records=100)
            assert [(r.offset, r.key, r.value) for r in got] == EXPECTED[:5 * kept]
            p.check()
            assert p.append([(None, b"next", None, None)]) == 5 * kept
    with open(log_path, "wb") as f:
        f.write(original)


def test_torn_tail_recovery_moves_the_segment_list_version_forward(tmp_path):
    """Recovering a tail torn mid-update publishes a segment-list version above the one
    readers cached, so a reader that stays open sees the rebuilt segment list."""
    directory = write(tmp_path, batches=40, config={"segment.bytes": 4096})
    with logkit.Broker(tmp_path, background=False) as reader_broker:
        reader = reader_broker.topic("t").partition(0)
        assert reader.read(0)[0].offset == 0
        cached = reader._log._segments_version
        with open(os.path.join(directory, "logkit.tail"), "r+b") as f:
            f.seek(8)
            sequence = int.from_bytes(f.read(8), "little")
            f.seek(8)
            f.write((sequence | 1).to_bytes(8, "little"))     # a writer died mid-update
        broker, p = reopen(tmp_path)
        with broker:
            assert p._log.last_recovery is not None
            assert p._log.tail().segments_version > cached
            p.append([(None, b"after", None, None)])
        assert reader.read(400)[0].value == b"after"
        assert [r.offset for r in reader.read(0, max_records=1000)] == list(range(401))
