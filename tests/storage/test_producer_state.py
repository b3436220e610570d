"""The partition's producer state (Kafka's ProducerStateManager, docs/design.md §15): a
retried batch is stored once and answered with its original offset, a sequence gap or a
zombie's older epoch is refused with nothing stored, and the state is the same in every
process and after a reopen (rebuilt from Kafka's `.snapshot` files and the log)."""

from __future__ import annotations

import os
import struct
import subprocess
import sys
import time

import pytest

import logkit
import logkit._native
from logkit.crc import crc32c
from logkit.errors import (InvalidProducerEpochError, InvalidTxnStateError,
                           OutOfOrderSequenceError)
from logkit.producer_state import BATCHES_KEPT, INT32_MAX, snapshot_offsets
from logkit.records import encode_batch
from tests.helpers.procs import ROOT_DIR


NOW_MS = int(time.time() * 1000)    # the batches' timestamp (an old one would expire)


def batch(pid, epoch, seq, n=2, *, tag=b"v", txn=False):
    return encode_batch([(b"k", b"%s%d" % (tag, seq + i), None, NOW_MS) for i in range(n)],
                        producer_id=pid, producer_epoch=epoch, base_sequence=seq,
                        transactional=txn)


@pytest.fixture
def part(tmp_path):
    with logkit.Broker(tmp_path, background=False) as broker:
        broker.create_topic("t", 1)
        yield broker.topic("t").partition(0)


def values(p):
    return [r.value for r in p.read(0, max_records=10**6)]


def test_a_retried_batch_is_stored_once_and_answered_with_its_first_offset(part):
    assert part.append_batch(batch(7, 0, 0)) == 0
    assert part.append_batch(batch(7, 0, 2)) == 2
    assert part.append_batch(batch(7, 0, 0)) == 0           # the retry of the first
    assert part.append_batch(batch(7, 0, 2)) == 2
    assert part.log_end_offset == 4
    assert values(part) == [b"v0", b"v1", b"v2", b"v3"]
    part.check()


def test_only_the_last_five_batches_are_recognised_as_duplicates(part):
    for n in range(BATCHES_KEPT + 1):
        part.append_batch(batch(7, 0, 2 * n))
    end = part.log_end_offset
    assert part.append_batch(batch(7, 0, 2)) == 2           # the oldest kept
    with pytest.raises(OutOfOrderSequenceError):
        part.append_batch(batch(7, 0, 0))                   # fell out of the five
    assert part.log_end_offset == end


def test_a_sequence_gap_is_refused_and_nothing_is_stored(part):
    part.append_batch(batch(7, 0, 0))
    with pytest.raises(OutOfOrderSequenceError) as info:
        part.append_batch(batch(7, 0, 5))
    assert info.value.error_code == 45
    assert isinstance(info.value, logkit.LogkitError)
    assert part.log_end_offset == 2
    assert part.append_batch(batch(7, 0, 2)) == 2           # the right one still goes in


def test_an_older_epoch_is_refused_and_a_new_epoch_starts_at_sequence_zero(part):
    part.append_batch(batch(7, 0, 0))
    with pytest.raises(OutOfOrderSequenceError):
        part.append_batch(batch(7, 1, 2))                   # new epoch, not from 0
    assert part.append_batch(batch(7, 1, 0)) == 2
    with pytest.raises(InvalidProducerEpochError) as info:
        part.append_batch(batch(7, 0, 2))                   # the zombie
    assert info.value.error_code == 47
    assert part.log_end_offset == 4


def test_producers_are_checked_apart_and_an_unknown_producer_may_start_anywhere(part):
    part.append_batch(batch(7, 0, 0))
    assert part.append_batch(batch(8, 3, 40)) == 2
    assert part.append_batch(batch(7, 0, 2)) == 4
    assert part.append_batch(batch(8, 3, 42)) == 6
    assert part.append_batch(batch(8, 3, 40)) == 2
    states = {pid: (epoch, last) for pid, epoch, last, _ in part.producer_states()}
    assert states == {7: (0, 3), 8: (3, 43)}


def test_sequences_wrap_from_int32_max_to_zero(part):
    part.append_batch(batch(7, 0, INT32_MAX - 1, n=2))
    assert part.append_batch(batch(7, 0, 0, n=2)) == 2
    with pytest.raises(OutOfOrderSequenceError):
        part.append_batch(batch(7, 0, 5))


def test_a_plain_batch_inside_the_producers_open_transaction_is_refused(part):
    part.append_batch(batch(7, 0, 0, txn=True))
    with pytest.raises(InvalidTxnStateError):
        part.append_batch(batch(7, 0, 2))


def test_batches_without_a_producer_id_are_not_checked(part):
    for _ in range(3):
        part.append([(b"k", b"plain", None, None)])
    part.append_batch(batch(7, 0, 0))
    part.append([(b"k", b"plain", None, None)])
    assert part.append_batch(batch(7, 0, 0)) == 3
    assert part.log_end_offset == 6


APPEND_IN_CHILD = r"""
import sys, logkit
from logkit.records import encode_batch
root, pid, epoch, first, count = sys.argv[1], *map(int, sys.argv[2:])
with logkit.Broker(root, background=False) as broker:
    p = broker.topic("t").partition(0)
    for seq in range(first, first + 2 * count, 2):
        b = encode_batch([(b"k", b"c%d" % (seq + i), None, None) for i in range(2)],
                         producer_id=pid, producer_epoch=epoch, base_sequence=seq)
        print(p.append_batch(b))
"""


def run_child(root, *args):
    out = subprocess.run([sys.executable, "-c", APPEND_IN_CHILD, str(root), *map(str, args)],
                         env={**os.environ, "PYTHONPATH": ROOT_DIR}, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return [int(line) for line in out.stdout.split()]


def test_another_process_sees_this_processs_batches_and_the_other_way_round(tmp_path):
    """The state is caught up under the append lock on what other processes appended:
    a retry through another process is still answered with the original offset, and a
    gap is still a gap."""
    with logkit.Broker(tmp_path, background=False) as broker:
        broker.create_topic("t", 1)
        p = broker.topic("t").partition(0)
        assert p.append_batch(batch(7, 0, 0)) == 0          # this process loads its state
        assert run_child(tmp_path, 7, 0, 0, 2) == [0, 2]    # a retry, then the next one
        assert p.append_batch(batch(7, 0, 2, tag=b"c")) == 2     # the child's, again
        with pytest.raises(OutOfOrderSequenceError):
            p.append_batch(batch(7, 0, 8))
        assert p.append_batch(batch(7, 0, 4)) == 4
        assert run_child(tmp_path, 7, 0, 4, 1) == [4]
        assert run_child(tmp_path, 7, 1, 0, 1) == [6]       # the child bumps the epoch
        with pytest.raises(InvalidProducerEpochError):
            p.append_batch(batch(7, 0, 6))                  # this process is the zombie
        assert p.log_end_offset == 8
        assert p.open_transactions() == {}


def test_the_state_survives_a_reopen_through_the_snapshot_in_kafkas_layout(tmp_path):
    with logkit.Broker(tmp_path, background=False) as broker:
        broker.create_topic("t", 1)
        p = broker.topic("t").partition(0)
        p.append_batch(batch(7, 2, 0))
        p.append_batch(batch(8, 0, 10, txn=True))
    directory = tmp_path / "t-0"
    assert snapshot_offsets(str(directory)) == [4]          # written at the clean close
    data = (directory / f"{4:020d}.snapshot").read_bytes()
    version, crc, count = struct.unpack_from(">hIi", data)
    assert (version, count, crc) == (1, 2, crc32c(data[6:]))
    entries = {e[0]: e for e in struct.iter_unpack(">qhiqiqiq", data[10:])}
    # producerId, epoch, lastSequence, lastOffset, offsetDelta, timestamp, coordinatorEpoch,
    # currentTxnFirstOffset
    assert entries[7] == (7, 2, 1, 1, 1, NOW_MS, -1, -1)
    assert entries[8] == (8, 0, 11, 3, 1, NOW_MS, -1, 2)
    with logkit.Broker(tmp_path, background=False) as broker:
        p = broker.topic("t").partition(0)
        assert p.append_batch(batch(7, 2, 0)) == 0           # the duplicate, recognised
        with pytest.raises(OutOfOrderSequenceError):
            p.append_batch(batch(7, 2, 5))
        assert p.open_transactions() == {8: 2}
        assert p.last_stable_offset == 2


def test_a_snapshot_is_written_at_each_roll(tmp_path):
    with logkit.Broker(tmp_path, background=False) as broker:
        broker.create_topic("t", 1, config={"segment.bytes": 1024})
        p = broker.topic("t").partition(0)
        for n in range(40):
            p.append_batch(batch(7, 0, 2 * n))
        bases = p.segment_base_offsets()
        assert len(bases) > 2
        assert snapshot_offsets(p.directory) == bases[-2:]  # the newest two are kept


def test_a_damaged_snapshot_is_ignored_and_the_state_rebuilt_from_the_log(tmp_path):
    with logkit.Broker(tmp_path, background=False) as broker:
        broker.create_topic("t", 1)
        p = broker.topic("t").partition(0)
        for n in range(3):
            p.append_batch(batch(7, 0, 2 * n))
    path = tmp_path / "t-0" / f"{6:020d}.snapshot"
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))
    with logkit.Broker(tmp_path, background=False) as broker:
        p = broker.topic("t").partition(0)
        assert p.append_batch(batch(7, 0, 2)) == 2
        assert p.append_batch(batch(7, 0, 6)) == 6
    assert snapshot_offsets(str(tmp_path / "t-0")) == [8]


def test_a_truncated_log_is_not_answered_from_the_state_of_the_cut_batches(tmp_path):
    """A follower's truncation cuts batches the state took in: the state is rebuilt, so a
    batch cut away is appended again rather than answered as a duplicate."""
    with logkit.Broker(tmp_path, background=False) as broker:
        broker.create_topic("t", 1)
        p = broker.topic("t").partition(0)
        for n in range(3):
            p.append_batch(batch(7, 0, 2 * n))
        p.truncate_to(2)
        assert p.append_batch(batch(7, 0, 2)) == 2
        assert p.log_end_offset == 4
        assert values(p) == [b"v0", b"v1", b"v2", b"v3"]


# ---- the hot path: a producer's next batch in one C call --------------------------------

needs_c = pytest.mark.skipif(logkit._native.appendpath is None,
                             reason="the C append path is not built")


def appended_in_one_call(p):
    appender = p._log._appender
    return 0 if appender is None else appender.appended


@needs_c
def test_a_producers_next_batch_is_appended_in_one_c_call(part):
    part.append_batch_nowait(batch(7, 0, 0), verify=False)  # the checked path loads state
    part.append([(b"k", b"plain", None, None)])              # ... and arms the C appender
    part.append_batch_nowait(batch(7, 0, 2), verify=False)   # caught up under the lock
    before = appended_in_one_call(part)
    for n in range(2, 12):
        assert part.append_batch_nowait(batch(7, 0, 2 * n), verify=False) == (
            2 * n + 1, None)
    assert appended_in_one_call(part) - before == 10
    # a duplicate or a gap is never taken by the one-call path
    assert part.append_batch_nowait(batch(7, 0, 22), verify=False) == (23, None)
    with pytest.raises(OutOfOrderSequenceError):
        part.append_batch_nowait(batch(7, 0, 40), verify=False)
    assert appended_in_one_call(part) - before == 10
    assert part.producer_states() == [(7, 0, 23, -1)]


@needs_c
def test_the_one_call_path_refuses_a_batch_when_another_process_appended_since(tmp_path):
    """This process's state says seq 6 follows; another process stored seq 6 meanwhile.
    The C appender sees the log end moved and hands the batch back: it is answered as
    the duplicate it is, not written twice."""
    with logkit.Broker(tmp_path, background=False) as broker:
        broker.create_topic("t", 1)
        p = broker.topic("t").partition(0)
        p.append_batch_nowait(batch(7, 0, 0), verify=False)
        p.append([(b"k", b"plain", None, None)])
        assert p.append_batch_nowait(batch(7, 0, 2), verify=False) == (3, None)
        assert p.append_batch_nowait(batch(7, 0, 4), verify=False) == (5, None)
        assert run_child(tmp_path, 7, 0, 6, 1) == [7]
        before = appended_in_one_call(p)
        assert p.append_batch_nowait(batch(7, 0, 6, tag=b"c"), verify=False) == (7, None)
        assert appended_in_one_call(p) == before
        assert p.log_end_offset == 9
        assert p.append_batch_nowait(batch(7, 0, 8), verify=False) == (9, None)
        assert values(p) == [b"v0", b"v1", b"plain", b"v2", b"v3", b"v4", b"v5", b"c6",
                             b"c7", b"v8", b"v9"]


def test_a_producer_idle_for_producer_id_expiration_ms_is_forgotten_at_the_next_snapshot(part):
    old = encode_batch([(b"k", b"old", None, 1000)], producer_id=7, producer_epoch=0,
                       base_sequence=0)                      # a timestamp from 1970
    part.append_batch(old)
    part.append_batch(encode_batch([(b"k", b"v", None, None)], producer_id=8,
                                   producer_epoch=0, base_sequence=0))     # now
    part.append_batch(encode_batch([(b"k", b"v", None, 1000)], producer_id=9,
                                   producer_epoch=0, base_sequence=0, transactional=True))
    part.roll()                          # 9 is as old as 7, but its transaction is open
    assert sorted(pid for pid, *_ in part.producer_states()) == [8, 9]
    assert part.append_batch(old) == 3                       # unknown again: appended
