"""The Partition methods a follower and a promotion stand on: append_replicated,
truncate_to, truncate_fully_and_start_at, increase_log_start_offset, segment_base_offsets,
leader_epoch — on real directories, with check() after every change."""

from __future__ import annotations

import filecmp
import os

import pytest

import logkit

SMALL = {"segment.bytes": 4096, "retention.ms": -1}


def _fill(p, count, size=50):
    for i in range(count):
        p.append([(b"k%d" % i, b"v%d-" % i + b"x" * size, None, None)])


def _copy(leader, follower, max_bytes=3000):
    """Ship everything the way a follower does: whole batches from the follower's end."""
    while follower.log_end_offset < leader.log_end_offset:
        data = leader.batches_since(follower.log_end_offset, upto=leader.log_end_offset,
                                    max_bytes=max_bytes)
        follower.append_replicated(data,
                                   segment_base_offsets=leader.segment_base_offsets())


def _same_segments(a, b):
    names = sorted(n for n in os.listdir(a.directory) if n.endswith(".log"))
    assert names == sorted(n for n in os.listdir(b.directory) if n.endswith(".log"))
    for name in names:
        assert filecmp.cmp(os.path.join(a.directory, name), os.path.join(b.directory, name),
                           shallow=False), name


@pytest.fixture
def pair(tmp_path):
    with logkit.Broker(tmp_path / "leader", background=False) as leader, \
            logkit.Broker(tmp_path / "follower", background=False) as follower:
        yield (leader.create_topic("t", 1, config=SMALL).partition(0),
               follower.create_topic("t", 1, config=SMALL).partition(0))


def test_shipped_batches_make_byte_identical_segment_files(pair):
    """Same batches, base offsets, epochs and segment boundaries: the .log files are
    equal byte for byte, and the follower's log passes check()."""
    leader, follower = pair
    _fill(leader, 120)
    leader.set_leader_epoch(3)
    _fill(leader, 80)
    _copy(leader, follower)
    assert len(leader.segment_base_offsets()) > 3
    assert follower.segment_base_offsets() == leader.segment_base_offsets()
    _same_segments(leader, follower)
    follower.check()
    assert follower.leader_epoch == 3
    assert [h.leader_epoch for h in follower.batch_headers(0)] == \
        [h.leader_epoch for h in leader.batch_headers(0)]


def test_a_bit_flipped_shipped_batch_is_refused_and_nothing_is_written(pair):
    leader, follower = pair
    _fill(leader, 10)
    data = bytearray(leader.batches_since(0, upto=leader.log_end_offset))
    data[-3] ^= 0x10                                # inside the last batch's records
    with pytest.raises(logkit.CorruptRecordError, match="CRC"):
        follower.append_replicated(data)
    assert follower.log_end_offset == 0 and follower.size_bytes() == 0
    follower.check()


def test_a_gap_or_a_torn_batch_is_refused(pair):
    leader, follower = pair
    _fill(leader, 10)
    data = leader.batches_since(0, upto=leader.log_end_offset)
    with pytest.raises(logkit.CorruptRecordError):
        follower.append_replicated(data[:-5])                    # torn last batch
    later = leader.batches_since(5, upto=leader.log_end_offset)
    with pytest.raises(logkit.CorruptRecordError, match="sequence"):
        follower.append_replicated(later)                        # would leave a gap
    assert follower.log_end_offset == 0
    follower.append_replicated(data)
    assert follower.log_end_offset == 10


def test_truncate_to_cuts_whole_batches_and_the_log_goes_on(pair):
    """To a batch boundary inside a sealed segment: later segments go, the cut segment
    becomes the active one; mid-batch: the whole batch holding the offset goes."""
    leader, follower = pair
    p = leader
    for i in range(60):
        p.append([(None, b"%d" % i + b"y" * 60, None, None)] * 2)     # 2-record batches
    bases = p.segment_base_offsets()
    target = bases[1] + 4
    assert p.truncate_to(target) == target
    assert p.log_end_offset == target and p.segment_base_offsets() == bases[:2]
    p.check()
    assert p.truncate_to(target - 1) == target - 2              # the batch holding it goes
    p.check()
    assert p.truncate_to(bases[1]) == bases[1]                  # an empty active segment
    assert p.segment_base_offsets() == bases[:2]
    assert p.truncate_to(10 ** 6) == bases[1]                   # past the end: nothing
    p.check()
    assert p.append([(None, b"after", None, None)]) == bases[1]
    assert [r.value for r in p.read(bases[1])] == [b"after"]
    p.check()
    p.increase_log_start_offset(20)
    with pytest.raises(logkit.OffsetOutOfRangeError):
        p.truncate_to(10)                                      # below the log start


def test_truncation_survives_a_reopen(tmp_path):
    with logkit.Broker(tmp_path, background=False) as b:
        p = b.create_topic("t", 1, config=SMALL).partition(0)
        _fill(p, 200)
        p.truncate_to(123)
    with logkit.Broker(tmp_path, background=False) as b:
        p = b.topic("t").partition(0)
        assert p.log_end_offset == 123
        p.check()
        assert p.read(122)[0].value.startswith(b"v122-")


def test_truncate_fully_and_start_at_gives_an_empty_log_at_that_offset(pair):
    leader, _ = pair
    _fill(leader, 50)
    leader.truncate_fully_and_start_at(1000)
    assert (leader.log_start_offset, leader.log_end_offset) == (1000, 1000)
    assert leader.segment_base_offsets() == [1000]
    leader.check()
    assert leader.append([(None, b"z", None, None)]) == 1000
    leader.check()


def test_increase_log_start_offset_retires_whole_segments_below_it(pair):
    leader, follower = pair
    _fill(leader, 200)
    bases = leader.segment_base_offsets()
    assert leader.increase_log_start_offset(bases[2] + 3) == 2
    assert leader.log_start_offset == bases[2] + 3
    assert leader.segment_base_offsets() == bases[2:]
    assert leader.increase_log_start_offset(5) == 0                 # never moves down
    leader.check()
    assert leader.read(bases[2] + 3)[0].offset == bases[2] + 3
    with pytest.raises(logkit.OffsetOutOfRangeError):
        leader.read(bases[2])


def test_the_leader_epoch_only_grows_and_stamps_later_appends(pair):
    leader, _ = pair
    assert leader.leader_epoch == 0
    leader.set_leader_epoch(7)
    leader.append([(None, b"e7", None, None)])
    assert leader.batch_headers(0)[-1].leader_epoch == 7
    with pytest.raises(logkit.IllegalStateError):
        leader.set_leader_epoch(6)
