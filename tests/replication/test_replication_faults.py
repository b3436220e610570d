"""Replication under faults, with real processes and SIGKILL: a follower killed in the
middle of copying restarts and converges; a leader killed while producing with acks=1
leaves the follower a prefix of its log, never a gap. After each: the follower's files
pass check() and its segments are the leader's, byte for byte.

The default run kills a handful of times (a few seconds); LOGKIT_SLOW=1 runs 50 kills of
each kind (minutes), for a wider search of kill instants."""

from __future__ import annotations

import filecmp
import os
import random
import signal
import subprocess
import sys
import time

import logkit
from tests.helpers.procs import ROOT_DIR

HELPER = os.path.join(os.path.dirname(os.path.dirname(__file__)), "helpers", "replica_proc.py")
KILLS = 50 if os.environ.get("LOGKIT_SLOW") == "1" else 4


def start(*args):
    proc = subprocess.Popen([sys.executable, HELPER, *map(str, args)],
                            stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": ROOT_DIR})
    assert proc.stdout.readline().strip() == "ready"
    return proc


def kill(proc):
    proc.send_signal(signal.SIGKILL)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    return out


def assert_prefix_of(leader_partition, follower_partition):
    """The follower's log is the leader's up to its own end: sealed segments equal,
    the active one a byte prefix of the leader's file of that name; check() passes."""
    follower_partition.check()
    names = sorted(n for n in os.listdir(follower_partition.directory) if n.endswith(".log"))
    for i, name in enumerate(names):
        mine = os.path.join(follower_partition.directory, name)
        theirs = os.path.join(leader_partition.directory, name)
        if i < len(names) - 1:
            assert filecmp.cmp(mine, theirs, shallow=False), name
        else:
            with open(mine, "rb") as a, open(theirs, "rb") as b:
                data = a.read()
                assert b.read(len(data)) == data, name


def test_a_follower_sigkilled_mid_copy_restarts_and_converges(tmp_path):
    rng = random.Random(10)
    leader_path, copy_path = tmp_path / "leader", tmp_path / "copy"
    with logkit.Broker(leader_path) as leader:
        p = leader.create_topic("t", 1, config={"segment.bytes": 16384}).partition(0)
        for i in range(1500):
            p.append([(b"k", b"%d-" % i + b"x" * 40, None, None)] * 5)
        kills_mid_copy = 0
        for _ in range(KILLS):
            proc = start("follow", leader_path, copy_path, 512)      # many small fetches
            time.sleep(rng.uniform(0.05, 0.6))
            kill(proc)
            with logkit.Broker(copy_path, background=False) as copy:  # a restart's open
                q = copy.topic("t").partition(0)
                assert_prefix_of(p, q)
                kills_mid_copy += 0 < q.log_end_offset < p.log_end_offset
        assert kills_mid_copy >= 1, "no kill landed in the middle of the copy"
        follower = logkit.Follower(copy_path, logkit.DirectorySource(leader_path))
        follower.catch_up(timeout=60)
        with logkit.Broker(copy_path, read_only=True) as copy:
            q = copy.topic("t").partition(0)
            assert q.log_end_offset == p.log_end_offset
            assert q.segment_base_offsets() == p.segment_base_offsets()
            assert_prefix_of(p, q)


def test_a_leader_sigkilled_while_producing_leaves_the_follower_a_prefix(tmp_path):
    rng = random.Random(20)
    leader_path, copy_path = tmp_path / "leader", tmp_path / "copy"
    follower = logkit.Follower(copy_path, logkit.DirectorySource(leader_path),
                               config={"replica.fetch.backoff.ms": 20})
    acked: dict[int, bytes] = {}
    copied_during = 0
    for round_number in range(KILLS):
        writer = start("produce", leader_path, "t", "w%d" % round_number)
        follower.start()
        time.sleep(rng.uniform(0.2, 0.7))
        out = kill(writer)
        follower.stop()                               # freeze the copy as it stands
        for line in out.splitlines():
            parts = line.split()
            if len(parts) == 2:                        # a line cut by the kill has fewer
                acked[int(parts[0])] = b"w%d-%s" % (round_number, parts[1].encode())
        with logkit.Broker(leader_path, background=False) as leader:   # recovers it
            p = leader.topic("t").partition(0)
            p.check()
            with logkit.Broker(copy_path, read_only=True) as copy:
                q = copy.topic("t").partition(0)
                assert q.log_end_offset <= p.log_end_offset
                assert_prefix_of(p, q)
                mine = q.read(0, max_records=10 ** 6)
                assert [r.offset for r in mine] == list(range(q.log_end_offset))   # no gap
                assert [r.value for r in mine] == \
                    [r.value for r in p.read(0, max_records=q.log_end_offset)]
                assert all(acked[r.offset] == r.value for r in mine if r.offset in acked)
                copied_during += q.log_end_offset > 0
    assert copied_during >= 1 and len(acked) > 50, "the writer and the follower did run"
    follower.catch_up(timeout=60)
    with logkit.Broker(leader_path, read_only=True) as leader, \
            logkit.Broker(copy_path, read_only=True) as copy:
        p, q = leader.topic("t").partition(0), copy.topic("t").partition(0)
        assert q.log_end_offset == p.log_end_offset
        assert_prefix_of(p, q)
        values = {r.offset: r.value for r in q.read(0, max_records=10 ** 6)}
        assert all(values[offset] == value for offset, value in acked.items())
