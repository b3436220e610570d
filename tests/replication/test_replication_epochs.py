"""Leader epochs: Kafka's leader-epoch-checkpoint file and the KIP-101/KIP-279 truncation
rule (logkit/leader/epochs.py), on real files and as pure functions."""

from __future__ import annotations

import os

import pytest

import logkit
from logkit.leader.epochs import (CHECKPOINT_FILE, EpochEntry, assign,
                                       divergence_offset, end_offset_for,
                                       epochs_from_headers, read_checkpoint,
                                       truncate_from_end, write_checkpoint)

E = EpochEntry


def test_the_checkpoint_is_kafkas_text_format_and_reads_back(tmp_path):
    """version line, count line, then 'epoch startOffset' lines, as Kafka writes it."""
    write_checkpoint(str(tmp_path), [E(0, 0), E(1, 150), E(4, 152)])
    assert (tmp_path / CHECKPOINT_FILE).read_bytes() == b"0\n3\n0 0\n1 150\n4 152\n"
    assert read_checkpoint(str(tmp_path)) == [E(0, 0), E(1, 150), E(4, 152)]
    write_checkpoint(str(tmp_path), [])
    assert (tmp_path / CHECKPOINT_FILE).read_bytes() == b"0\n0\n"
    assert read_checkpoint(str(tmp_path)) == []


def test_a_missing_checkpoint_reads_as_none_and_the_rewrite_leaves_no_temporary(tmp_path):
    assert read_checkpoint(str(tmp_path)) is None
    write_checkpoint(str(tmp_path), [E(2, 10)])
    write_checkpoint(str(tmp_path), [E(2, 10), E(3, 20)])
    assert sorted(os.listdir(tmp_path)) == [CHECKPOINT_FILE]


@pytest.mark.parametrize("body, why", [
    (b"1\n0\n", "version"),
    (b"0\n2\n0 0\n", "count"),
    (b"0\n1\n0\n", "epoch startOffset"),
    (b"0\n1\nzero 0\n", "epoch startOffset"),
    (b"0\n2\n3 10\n2 20\n", "does not follow"),
    (b"0\n2\n1 10\n2 5\n", "does not follow"),
    (b"0\n1\n-1 0\n", "epoch startOffset"),
    (b"0\n", "no version and count"),
    (b"\xff\xfe", "ASCII"),
])
def test_a_malformed_checkpoint_raises_corrupt_record_error_naming_the_file(tmp_path, body,
                                                                            why):
    (tmp_path / CHECKPOINT_FILE).write_bytes(body)
    with pytest.raises(logkit.CorruptRecordError, match=why) as info:
        read_checkpoint(str(tmp_path))
    assert CHECKPOINT_FILE in str(info.value)


def test_epochs_come_from_batch_headers_when_a_directory_has_no_checkpoint(broker):
    """A log's batches carry partitionLeaderEpoch: the entries are where each epoch's
    first batch starts."""
    p = broker.create_topic("t", 1).partition(0)
    p.append([(None, b"a", None, None)] * 3)
    p.set_leader_epoch(2)
    p.append([(None, b"b", None, None)])
    p.append([(None, b"c", None, None)])
    p.set_leader_epoch(5)
    p.append([(None, b"d", None, None)] * 2)
    assert epochs_from_headers(p.batch_headers(0)) == [E(0, 0), E(2, 3), E(5, 5)]


def test_assign_and_truncate_follow_kafkas_cache():
    """A new epoch displaces entries of that epoch or later, or starting at or after
    its start offset; truncation from the end drops entries starting at or past it."""
    assert assign([E(0, 0), E(1, 100)], 2, 150) == [E(0, 0), E(1, 100), E(2, 150)]
    assert assign([E(0, 0), E(1, 100)], 2, 100) == [E(0, 0), E(2, 100)]
    assert assign([E(0, 0), E(3, 100)], 2, 150) == [E(0, 0), E(2, 150)]
    assert assign([E(0, 0)], 0, 0) == [E(0, 0)]
    assert truncate_from_end([E(0, 0), E(1, 100), E(2, 150)], 150) == [E(0, 0), E(1, 100)]
    assert truncate_from_end([E(0, 0), E(1, 100)], 100) == [E(0, 0)]


def test_end_offset_for_answers_as_kafkas_offsets_for_leader_epoch():
    entries = [E(1, 10), E(3, 50), E(4, 80)]
    assert end_offset_for(entries, 4, 120) == (4, 120)       # the latest: the log end
    assert end_offset_for(entries, 3, 120) == (3, 80)
    assert end_offset_for(entries, 2, 120) == (1, 50)        # largest epoch <= 2
    assert end_offset_for(entries, 0, 120) == (0, 10)        # older than every entry
    assert end_offset_for(entries, 7, 120) == (-1, -1)       # newer than any
    assert end_offset_for([], 0, 5) == (-1, -1)


@pytest.mark.parametrize("local, local_end, leader, leader_end, expected", [
    # a follower that is a prefix keeps everything
    ([E(0, 0)], 50, [E(0, 0)], 80, 50),
    ([E(0, 0), E(1, 100)], 110, [E(0, 0), E(1, 100)], 200, 110),
    ([E(0, 0)], 50, [E(0, 0), E(1, 100)], 150, 50),
    # a stale leader wrote on in epoch 0 after the new one took epoch 1 at 100
    ([E(0, 0)], 150, [E(0, 0), E(1, 100)], 120, 100),
    # a stale leader that had taken epoch 2 at 130 the leader never heard of
    ([E(0, 0), E(2, 130)], 140, [E(0, 0), E(1, 100)], 120, 100),
    # KIP-279's case: the follower saw epochs the leader skipped
    ([E(0, 0), E(1, 40), E(2, 60)], 70, [E(0, 0), E(3, 50)], 90, 40),
    # the leader has less in the same epoch: cut to its end
    ([E(0, 0)], 90, [E(0, 0)], 60, 60),
    # nothing here, or no epochs on either side
    ([], 0, [E(0, 0)], 10, 0),
    ([], 30, [], 20, 20),
    ([E(0, 0)], 30, [], 40, 30),
])
def test_divergence_offset_finds_where_the_logs_part(local, local_end, leader, leader_end,
                                                     expected):
    assert divergence_offset(local, local_end, leader, leader_end) == expected
