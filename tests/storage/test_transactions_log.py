"""Transactions in the partition log (docs/design.md §15): COMMIT/ABORT markers, the last
stable offset, the `.txnindex` of aborted transactions in Kafka's layout, read_committed
reads (stop at the LSO, aborted records left out, markers never returned) — in every
process, and after a SIGKILL mid-transaction or a recovery."""

from __future__ import annotations

import os
import signal
import struct
import subprocess
import sys

import pytest

import logkit
from logkit.errors import InvalidProducerEpochError
from logkit.records import encode_batch
from tests.helpers.procs import ROOT_DIR

TXN_ENTRY = struct.Struct(">hqqqq")         # version, producerId, first, last, LSO


def txn(pid, epoch, seq, n=2, *, tag=b"t"):
    return encode_batch([(b"k", b"%s%d" % (tag, seq + i), None, None) for i in range(n)],
                        producer_id=pid, producer_epoch=epoch, base_sequence=seq,
                        transactional=True)


def plain(p, value):
    return p.append([(b"k", value, None, None)])


def values(p, isolation_level="read_uncommitted", offset=0):
    return [r.value for r in p.read(offset, max_records=10**6,
                                    isolation_level=isolation_level)]


def txn_entries(directory):
    out = {}
    for name in sorted(os.listdir(directory)):
        if name.endswith(".txnindex"):
            with open(os.path.join(directory, name), "rb") as f:
                out[int(name[:20])] = list(TXN_ENTRY.iter_unpack(f.read()))
    return out


@pytest.fixture
def part(tmp_path):
    with logkit.Broker(tmp_path, background=False) as broker:
        broker.create_topic("t", 1)
        yield broker.topic("t").partition(0)


def test_the_lso_stops_at_the_oldest_open_transaction_until_its_marker(part):
    plain(part, b"a")                                        # 0
    part.append_batch(txn(1, 0, 0))                          # 1-2, producer 1 opens
    part.append_batch(txn(2, 0, 0))                          # 3-4, producer 2 opens
    plain(part, b"b")                                        # 5
    assert part.open_transactions() == {1: 1, 2: 3}
    assert part.last_stable_offset == 1
    assert part.high_watermark == 6
    assert part.append_control(2, 0, commit=True) == 6
    assert part.last_stable_offset == 1                      # producer 1's still open
    assert part.append_control(1, 0, commit=True) == 7
    assert part.last_stable_offset == part.high_watermark == 8
    assert part.open_transactions() == {}


def test_one_marker_per_finished_transaction_a_second_end_is_a_no_op(part):
    part.append_batch(txn(1, 0, 0))
    assert part.append_control(1, 0, commit=False) == 2
    assert part.append_control(1, 0, commit=False) == -1
    assert part.append_control(1, 0, commit=True) == -1
    assert part.append_control(9, 0, commit=True) == -1     # a producer never seen here
    assert part.log_end_offset == 3
    headers = part.batch_headers(0)
    assert [h.is_control for h in headers] == [False, True]


def test_a_marker_with_an_older_epoch_is_refused(part):
    part.append_batch(txn(1, 3, 0))
    with pytest.raises(InvalidProducerEpochError):
        part.append_control(1, 2, commit=True)
    assert part.open_transactions() == {1: 0}
    # a fencing abort carries the bumped epoch: it ends the transaction
    assert part.append_control(1, 4, commit=False) == 2
    assert part.open_transactions() == {}
    assert part.append_batch(txn(1, 4, 0)) == 3              # the new epoch starts at 0


def test_read_committed_stops_at_the_lso_and_leaves_out_aborted_records(part):
    plain(part, b"a")                                        # 0
    part.append_batch(txn(1, 0, 0, tag=b"x"))                # 1-2 aborted below
    part.append_batch(txn(2, 0, 0, tag=b"c"))                # 3-4 committed below
    part.append_batch(txn(1, 0, 2, tag=b"x"))                # 5-6 aborted below
    plain(part, b"b")                                        # 7
    assert values(part, "read_committed") == [b"a"]          # stops at the LSO (1)
    part.append_control(1, 0, commit=False)                  # 8
    assert values(part, "read_committed") == [b"a"]          # producer 2 still open (3)
    part.append_control(2, 0, commit=True)                   # 9
    plain(part, b"c")                                        # 10
    assert values(part, "read_committed") == [b"a", b"c0", b"c1", b"b", b"c"]
    assert values(part) == [b"a", b"x0", b"x1", b"c0", b"c1", b"x2", b"x3", b"b", b"c"]
    assert values(part, "read_committed", offset=5) == [b"b", b"c"]
    assert part.aborted_transactions(0, 11) == [(1, 1)]
    assert part.aborted_transactions(9, 11) == []
    records, bound = part.fetch(0, isolation_level="read_committed")
    assert bound == part.last_stable_offset == 11
    with pytest.raises(ValueError):
        part.read(0, isolation_level="read_dirty")


def test_read_committed_reads_past_a_run_of_aborted_batches(part):
    for n in range(10):
        part.append_batch(txn(1, 0, 2 * n, tag=b"x"))
    part.append_control(1, 0, commit=False)
    plain(part, b"after")
    assert values(part, "read_committed") == [b"after"]
    assert part.read(0, max_records=3, isolation_level="read_committed")[0].value == b"after"


def test_the_txnindex_holds_kafkas_34_byte_entries_in_the_markers_segment(tmp_path):
    with logkit.Broker(tmp_path, background=False) as broker:
        broker.create_topic("t", 1, config={"segment.bytes": 1024})
        p = broker.topic("t").partition(0)
        p.append_batch(txn(1, 0, 0))                         # 0-1
        p.append_batch(txn(2, 0, 0))                         # 2-3
        for n in range(30):                                  # rolls
            plain(p, b"filler %d" % n)
        marker = p.append_control(1, 0, commit=False)
        other = p.append_control(2, 0, commit=False)
        entries = txn_entries(p.directory)
        active = p.segment_base_offsets()[-1]
        assert marker >= active
        assert entries == {active: [(0, 1, 0, marker, 2), (0, 2, 2, other, other + 1)]}
        assert p.aborted_transactions(0, p.log_end_offset) == [(1, 0), (2, 2)]
        assert values(p, "read_committed")[:1] == [b"filler 0"]


READER = r"""
import sys, json, logkit
with logkit.Broker(sys.argv[1], background=False) as broker:
    p = broker.topic("t").partition(0)
    print(json.dumps({"lso": p.last_stable_offset, "open": p.open_transactions(),
                      "committed": [r.value.decode() for r in
                                    p.read(0, max_records=1000, isolation_level="read_committed")],
                      "aborted": p.aborted_transactions(0, 1000)}))
"""


def read_in_child(root):
    import json
    out = subprocess.run([sys.executable, "-c", READER, str(root)], capture_output=True,
                         text=True, timeout=120, env={**os.environ, "PYTHONPATH": ROOT_DIR})
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_another_process_sees_the_same_lso_and_committed_records(tmp_path):
    with logkit.Broker(tmp_path, background=False) as broker:
        broker.create_topic("t", 1)
        p = broker.topic("t").partition(0)
        plain(p, b"a")
        p.append_batch(txn(1, 0, 0, tag=b"x"))
        assert read_in_child(tmp_path) == {"lso": 1, "open": {"1": 1}, "committed": ["a"],
                                           "aborted": []}
        p.append_control(1, 0, commit=False)
        p.append_batch(txn(1, 0, 2, tag=b"c"))
        p.append_control(1, 0, commit=True)
        assert read_in_child(tmp_path) == {"lso": 7, "open": {}, "committed": ["a", "c2", "c3"],
                                           "aborted": [[1, 1]]}


KILLED_MID_TXN = r"""
import sys, logkit
from logkit.records import encode_batch
with logkit.Broker(sys.argv[1], background=False) as broker:
    p = broker.topic("t").partition(0)
    for seq in range(0, 20, 2):
        p.append_batch(encode_batch([(b"k", b"x", None, None)] * 2, producer_id=5,
                                    producer_epoch=0, base_sequence=seq, transactional=True))
    print("ready", flush=True)
    sys.stdin.readline()          # killed here, its transaction open
"""


def test_a_producer_sigkilled_mid_transaction_leaves_it_open_after_a_reopen(tmp_path):
    with logkit.Broker(tmp_path, background=False) as broker:
        broker.create_topic("t", 1, config={"segment.bytes": 1024})
        plain(broker.topic("t").partition(0), b"before")
    child = subprocess.Popen([sys.executable, "-c", KILLED_MID_TXN, str(tmp_path)],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                             env={**os.environ, "PYTHONPATH": ROOT_DIR})
    try:
        assert child.stdout.readline() == "ready\n"
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=60)
    finally:
        if child.poll() is None:
            child.kill()
    with logkit.Broker(tmp_path, background=False) as broker:
        p = broker.topic("t").partition(0)
        assert p.open_transactions() == {5: 1}
        assert p.last_stable_offset == 1
        assert values(p, "read_committed") == [b"before"]
        with pytest.raises(logkit.LogkitError):
            p.append_batch(encode_batch([(b"k", b"x", None, None)], producer_id=5,
                                        producer_epoch=0, base_sequence=40,
                                        transactional=True))
        marker = p.append_control(5, 1, commit=False)        # the coordinator's abort
        assert p.last_stable_offset == p.high_watermark == marker + 1
        assert values(p, "read_committed") == [b"before"]
        assert p.aborted_transactions(0, marker + 1) == [(5, 1)]


def test_recovery_re_adds_a_missing_txnindex_entry_and_drops_a_stale_one(tmp_path):
    with logkit.Broker(tmp_path, background=False) as broker:
        broker.create_topic("t", 1)
        p = broker.topic("t").partition(0)
        p.append_batch(txn(1, 0, 0, tag=b"x"))
        p.append_control(1, 0, commit=False)
        plain(p, b"a")
        directory = p.directory
    index = os.path.join(directory, f"{0:020d}.txnindex")
    os.unlink(index)                                         # lost, as in an OS crash
    with logkit.Broker(tmp_path, background=False) as broker:
        p = broker.topic("t").partition(0)
        p.recover()
        assert txn_entries(directory) == {0: [(0, 1, 0, 2, 3)]}
        assert values(p, "read_committed") == [b"a"]
        # a writer killed between its entry and its marker leaves an entry past the end
        with open(index, "ab") as f:
            f.write(TXN_ENTRY.pack(0, 9, 0, p.log_end_offset, p.log_end_offset + 1))
        p.recover()
        assert txn_entries(directory) == {0: [(0, 1, 0, 2, 3)]}


def test_an_entry_whose_marker_never_landed_hides_no_committed_record(part):
    """The index entry is written before its marker; one whose writer died in between
    names an offset that later holds another batch, and is not believed."""
    part.append_batch(txn(1, 0, 0))                          # 0-1
    end = part.log_end_offset
    with open(os.path.join(part.directory, f"{0:020d}.txnindex"), "ab") as f:
        f.write(TXN_ENTRY.pack(0, 1, 0, end, end + 1))      # no marker was written
    part.append_batch(txn(1, 0, 2))                          # 2-3 take the entry's offset
    part.append_control(1, 0, commit=True)
    assert values(part, "read_committed") == [b"t0", b"t1", b"t2", b"t3"]
    assert part.aborted_transactions(0, part.log_end_offset) == []


def test_a_transaction_open_across_rolls_keeps_the_lso_after_reopen(tmp_path):
    with logkit.Broker(tmp_path, background=False) as broker:
        broker.create_topic("t", 1, config={"segment.bytes": 1024})
        p = broker.topic("t").partition(0)
        p.append_batch(txn(3, 0, 0))
        for n in range(40):
            plain(p, b"p%d" % n)
        assert len(p.segment_base_offsets()) > 2
    with logkit.Broker(tmp_path, background=False) as broker:
        p = broker.topic("t").partition(0)
        assert p.last_stable_offset == 0
        p.append_control(3, 0, commit=True)
        assert len(values(p, "read_committed")) == 42


# ---- Kafka's own DumpLogSegments reads the markers, the .txnindex and the .snapshot ------

def test_kafkas_dump_tool_reads_the_markers_txnindex_and_snapshot(tmp_path):
    from tests.helpers.kafka import skip_reason
    if skip_reason() is not None:
        pytest.skip(str(skip_reason()))
    from tests.helpers.kafka_tools import tool
    with logkit.Broker(tmp_path, background=False) as broker:
        broker.create_topic("t", 1)
        p = broker.topic("t").partition(0)
        p.append_batch(txn(1, 0, 0))                         # 0-1, aborted at 4
        p.append_batch(txn(2, 3, 0))                         # 2-3, committed at 5
        p.append_control(1, 0, commit=False, coordinator_epoch=7)
        p.append_control(2, 3, commit=True)
        p.append_batch(txn(2, 3, 2))                         # 6-7, left open
        directory = p.directory
    files = [os.path.join(directory, f"{0:020d}.log"),
             os.path.join(directory, f"{0:020d}.txnindex"),
             os.path.join(directory, f"{8:020d}.snapshot")]
    out = tool("kafka-dump-log", "--deep-iteration", "--files", ",".join(files)).stdout
    assert "version: 0 producerId: 1 firstOffset: 0 lastOffset: 4 lastStableOffset: 2" in out
    assert "endTxnMarker: ABORT coordinatorEpoch: 7" in out
    assert "endTxnMarker: COMMIT coordinatorEpoch: 0" in out
    snapshot = [line for line in out.splitlines() if line.startswith("producerId:")]
    assert len(snapshot) == 2, out
    two = next(line for line in snapshot if line.startswith("producerId: 2 "))
    assert "producerEpoch: 3" in two and "currentTxnFirstOffset: OptionalLong[6]" in two
    assert "lastSequence: 3" in two and "lastOffset: 7" in two
    one = next(line for line in snapshot if line.startswith("producerId: 1 "))
    assert "coordinatorEpoch: 7" in one and "currentTxnFirstOffset: OptionalLong.empty" in one


def test_a_follower_copying_an_abort_marker_indexes_it_as_its_leader_did(tmp_path):
    with logkit.Broker(tmp_path, background=False) as broker:
        broker.create_topic("leader", 1, config={"segment.bytes": 1024})
        broker.create_topic("follower", 1, config={"segment.bytes": 1024})
        leader = broker.topic("leader").partition(0)
        follower = broker.topic("follower").partition(0)
        leader.append_batch(txn(1, 0, 0, tag=b"x"))
        for n in range(20):
            plain(leader, b"p%d" % n)
        leader.append_control(1, 0, commit=False)
        leader.append_batch(txn(2, 0, 0, tag=b"c"))
        leader.append_control(2, 0, commit=True)
        for n in range(20):                                  # a roll after the markers
            plain(leader, b"q%d" % n)
        assert follower.last_stable_offset == 0        # its producer state, loaded
        follower.append_replicated(leader.batches_since(0, max_bytes=10**7),
                                   segment_base_offsets=leader.segment_base_offsets())
        assert follower.segment_base_offsets() == leader.segment_base_offsets()
        assert txn_entries(follower.directory) == txn_entries(leader.directory) != {}
        assert values(follower, "read_committed") == values(leader, "read_committed")
        assert follower.last_stable_offset == leader.last_stable_offset


def test_retention_takes_the_txnindex_of_the_segments_it_deletes(tmp_path):
    with logkit.Broker(tmp_path, background=False) as broker:
        broker.create_topic("t", 1, config={"segment.bytes": 1024, "retention.bytes": 2048,
                                            "file.delete.delay.ms": 0})
        p = broker.topic("t").partition(0)
        p.append_batch(txn(1, 0, 0, tag=b"x"))
        p.append_control(1, 0, commit=False)
        assert list(txn_entries(p.directory)) == [0]
        for n in range(60):
            plain(p, b"filler %d" % n)
            p.enforce_retention()
        assert p.log_start_offset > 3
        plain(p, b"x" * 900)                                 # one more roll
        assert txn_entries(p.directory) == {}
        assert p.aborted_transactions(0, p.log_end_offset) == []


# ---- SIGKILL at random points of a transactional writer: the state always matches the log --

TXN_WRITER = r"""
import random, sys, logkit
from logkit.records import encode_batch
root, seed = sys.argv[1], int(sys.argv[2])
rng = random.Random(seed)
with logkit.Broker(root, background=False) as broker:
    p = broker.topic("t").partition(0)
    states = {pid: [epoch, last + 1] for pid, epoch, last, _ in p.producer_states()}
    while True:
        pid = rng.choice((1, 2, 3))
        epoch, seq = states.setdefault(pid, [0, 0])
        if rng.random() < 0.25:
            p.append_control(pid, epoch, commit=rng.random() < 0.5)
        else:
            n = rng.randint(1, 3)
            p.append_batch(encode_batch([(b"k", b"%d" % pid, None, None)] * n,
                                        producer_id=pid, producer_epoch=epoch,
                                        base_sequence=seq, transactional=True))
            states[pid][1] = seq + n
        print(".", flush=True)
"""


def expected_from_the_log(p):
    """What the producer state and the index must say, from every batch header and
    marker: the open transactions, the aborted (producer, first offset) pairs, and the
    offsets read_committed returns below the LSO."""
    from logkit.records import CONTROL_ABORT, control_record_type, iter_batches
    open_txns, aborted, ranges, visible = {}, [], {}, set()
    data = p.batches_since(0, max_bytes=10**8)
    for pos, h in iter_batches(data, 0, len(data)):
        pid = h.producer_id
        if h.is_control:
            first = open_txns.pop(pid, None)
            if first is None:
                continue
            offsets = ranges.pop(pid)
            if control_record_type(data, pos, h) == CONTROL_ABORT:
                aborted.append((pid, first))
            else:
                visible.update(offsets)
        else:
            open_txns.setdefault(pid, h.base_offset)
            ranges.setdefault(pid, []).extend(range(h.base_offset, h.last_offset + 1))
    return open_txns, aborted, visible


def test_a_transactional_writer_killed_at_random_points_leaves_a_consistent_state(tmp_path):
    import random
    with logkit.Broker(tmp_path, background=False) as broker:
        broker.create_topic("t", 1, config={"segment.bytes": 2048})
    rng = random.Random(33)
    for round_ in range(12):
        child = subprocess.Popen([sys.executable, "-c", TXN_WRITER, str(tmp_path),
                                  str(round_)], stdout=subprocess.PIPE, text=True,
                                 env={**os.environ, "PYTHONPATH": ROOT_DIR})
        try:
            for _ in range(rng.randint(1, 60)):          # killed after that many steps,
                assert child.stdout.readline() == ".\n"   # somewhere in the next one
            child.send_signal(signal.SIGKILL)
            child.wait(timeout=60)
        finally:
            if child.poll() is None:
                child.kill()
        with logkit.Broker(tmp_path, background=False) as broker:
            p = broker.topic("t").partition(0)
            p.check()
            open_txns, aborted, visible = expected_from_the_log(p)
            assert p.open_transactions() == open_txns
            lso = min([*open_txns.values(), p.log_end_offset])
            assert p.last_stable_offset == lso
            assert p.aborted_transactions(0, p.log_end_offset) == aborted
            committed = [r.offset for r in p.read(0, max_records=10**6,
                                                  isolation_level="read_committed")]
            assert committed == sorted(o for o in visible if o < lso)


def test_fetch_records_read_committed_moves_past_markers_and_aborted_records(part):
    """A reader that takes `next_offset` as its position reaches the LSO with no stall,
    and sees no record of an aborted transaction and no marker."""
    plain(part, b"a")                                         # 0
    for n in range(3):
        part.append_batch(txn(1, 0, 2 * n, tag=b"x"))         # 1-6
    part.append_control(1, 0, commit=False)                   # 7
    part.append_batch(txn(2, 0, 0, tag=b"c"))                 # 8-9
    part.append_control(2, 0, commit=True)                    # 10
    part.append_batch(txn(3, 0, 0, tag=b"o"))                 # 11-12, open
    position, seen, reads = 0, [], 0
    while True:
        fetched = part.fetch_records(position, max_records=1,
                                     isolation_level="read_committed")
        reads += 1
        assert reads < 20
        seen.extend(r.value for r in fetched.records)
        if fetched.next_offset == position:
            break
        position = fetched.next_offset
    assert seen == [b"a", b"c0", b"c1"]
    assert position == fetched.last_stable_offset == 11
    assert fetched.high_watermark == 13
