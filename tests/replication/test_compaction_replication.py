"""Followers of a compacted topic copy the leader's cleaning: over a DirectorySource, a
TcpSource and an ObjectStoreSource, a follower ends with the leader's surviving records
at the same offsets, its segment files byte-identical to the leader's, whether it copied
before the pass (running or stopped), was behind it (its log end inside a range the
leader removed), or first copied after it; and a follower killed with SIGKILL in the
middle of installing a cleaned segment holds the old segment or the new one, whole."""

from __future__ import annotations

import filecmp
import os
import shutil
import signal
import subprocess
import sys
import time
from contextlib import contextmanager

import pytest

import logkit
from logkit.leader.epochs import EpochEntry, read_checkpoint

COMPACTED = {"cleanup.policy": "compact", "segment.bytes": 1024,
             "delete.retention.ms": 0}
LEADER = {"log.cleaner.enable": False, "ship.interval.ms": 50}   # the test cleans
FAST = {"replica.fetch.backoff.ms": 20, "replica.fetch.wait.max.ms": 50}
SECRET = "compaction-replication"
TRANSPORTS = ["directory", "tcp", "objectstore"]
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def write(partition, first, end, *, keys=7, tombstones=(), unique=True):
    """Keyed records `first`..`end`-1 in batches of 4 (key k<n % keys>, and u<n>, a
    key written once, for every fifth when `unique`, so survivors spread over the
    log), then one tombstone per key in `tombstones`."""
    for low in range(first, end, 4):
        partition.append([(b"u%d" % n if unique and n % 5 == 0 else b"k%d" % (n % keys),
                           b"v%d" % n,
                           None, None) for n in range(low, min(low + 4, end))])
    if tombstones:
        partition.append([(key, None, None, None) for key in tombstones])


def records(partition):
    """(offset, key, value) of every record from the log start, in offset order."""
    out, at = [], partition.log_start_offset
    while at < partition.high_watermark:
        got = partition.fetch_records(at, 1000)
        out += [(r.offset, r.key, r.value) for r in got.records]
        at = got.next_offset
    return out


def assert_same_copy(leader_partition, copy_partition):
    """The same surviving records at the same offsets, the same segments, each .log
    file byte-identical, and the copy passes check()."""
    assert records(copy_partition) == records(leader_partition)
    assert copy_partition.segment_base_offsets() == leader_partition.segment_base_offsets()
    for base in leader_partition.segment_base_offsets():
        name = f"{base:020d}.log"
        assert filecmp.cmp(os.path.join(leader_partition.directory, name),
                           os.path.join(copy_partition.directory, name), shallow=False), name
    copy_partition.check()


class Leader:
    """A leader broker with one compacted topic, reachable through one transport."""

    def __init__(self, root, kind, tmp_path):
        self.kind = kind
        self.broker = logkit.Broker(root, config=LEADER)
        self.partition = self.broker.create_topic("table", 1, config=COMPACTED).partition(0)
        self.server = self.shipper = None
        self.url = f"file://{tmp_path / 'bucket'}"
        if kind == "tcp":
            self.server = self.broker.serve_replication(secret=SECRET)
        elif kind == "objectstore":
            self.shipper = self.broker.ship(self.url)

    def source(self):
        if self.kind == "directory":
            return logkit.DirectorySource(self.broker.path)
        if self.kind == "tcp":
            return logkit.TcpSource(self.server.host, self.server.port, secret=SECRET)
        return logkit.ObjectStoreSource(self.url)

    def published(self):
        """Make what the leader holds visible through the transport (the shipper's
        pass, for the object store)."""
        if self.shipper is not None:
            self.shipper.flush()

    def compact(self):
        report = self.partition.compact()
        assert report.records_after < report.records_before
        self.published()
        return report

    def close(self):
        if self.server is not None:
            self.server.close()
        self.broker.close()


@pytest.fixture(params=TRANSPORTS)
def leader(request, tmp_path):
    made = Leader(tmp_path / "leader", request.param, tmp_path)
    yield made
    made.close()


@contextmanager
def copy_of(path):
    with logkit.Broker(path, read_only=True) as copy:
        yield copy.topic("table").partition(0)


def test_a_running_follower_copies_the_leaders_cleaning_byte_for_byte(leader, tmp_path):
    write(leader.partition, 0, 160, tombstones=[b"k1", b"k2"])
    leader.partition.roll()
    leader.published()
    with logkit.Follower(tmp_path / "f", leader.source(), config=FAST) as follower:
        follower.catch_up(timeout=30)
        with copy_of(tmp_path / "f") as copy:
            assert len(records(copy)) == 162                 # everything, before the pass
        leader.compact()
        follower.catch_up(timeout=30)
        with copy_of(tmp_path / "f") as copy:
            assert len(records(copy)) < 162
            assert_same_copy(leader.partition, copy)
        # a second pass (the tombstones' delete horizon has passed) is copied too
        leader.partition.compact(now_ms=int(time.time() * 1000) + 60_000)
        leader.published()
        write(leader.partition, 160, 170)
        leader.published()
        follower.catch_up(timeout=30)
    with copy_of(tmp_path / "f") as copy:
        assert not any(key in (b"k1", b"k2") and value is None
                       for _, key, value in records(copy))
        assert_same_copy(leader.partition, copy)


def test_a_follower_stopped_before_the_pass_catches_up_after_it(leader, tmp_path):
    write(leader.partition, 0, 150, tombstones=[b"k3"])
    leader.partition.roll()
    leader.published()
    follower = logkit.Follower(tmp_path / "f", leader.source(), config=FAST)
    follower.catch_up(timeout=30)                        # not started: copies, releases
    leader.compact()
    write(leader.partition, 150, 170)
    leader.published()
    follower.catch_up(timeout=30)                        # a new start after the pass
    with copy_of(tmp_path / "f") as copy:
        assert_same_copy(leader.partition, copy)


def test_a_follower_behind_the_cleaning_fetches_on_past_the_gap(leader, tmp_path):
    """The follower's log end lies inside a range the pass removed: it fetches on from
    the next surviving batch (offsets kept), and the segment it held only the start
    of becomes the leader's once it holds all of it."""
    write(leader.partition, 0, 51)
    leader.published()
    follower = logkit.Follower(tmp_path / "f", leader.source(), config=FAST)
    follower.catch_up(timeout=30)
    end = follower.log_end_offsets()[logkit.TopicPartition("table", 0)]
    assert end == 51
    write(leader.partition, 51, 160)
    leader.partition.roll()
    leader.compact()
    survivors = {offset for offset, _, _ in records(leader.partition)}
    assert not {51, 52, 53, 54} & survivors               # the batch after its end went
    assert end not in leader.partition.segment_base_offsets()   # inside a segment
    follower.catch_up(timeout=30)
    with copy_of(tmp_path / "f") as copy:
        assert_same_copy(leader.partition, copy)


def test_a_follower_that_starts_after_the_pass_copies_the_gaps(leader, tmp_path):
    write(leader.partition, 0, 8, unique=False)
    write(leader.partition, 8, 150, tombstones=[b"k4"])
    leader.partition.roll()
    leader.compact()
    assert records(leader.partition)[0][0] >= 8            # the first batches are gone
    with logkit.Follower(tmp_path / "f", leader.source(), config=FAST) as follower:
        follower.catch_up(timeout=30)
    with copy_of(tmp_path / "f") as copy:
        assert copy.log_start_offset == leader.partition.log_start_offset == 0
        assert_same_copy(leader.partition, copy)


def test_a_follower_promoted_after_copying_a_cleaning_leads_with_the_survivors(tmp_path):
    made = Leader(tmp_path / "leader", "directory", tmp_path)
    try:
        write(made.partition, 0, 120)
        made.partition.roll()
        follower = logkit.Follower(tmp_path / "f", made.source(), config=FAST)
        follower.catch_up(timeout=30)
        made.compact()
        follower.catch_up(timeout=30)
        expected = records(made.partition)
    finally:
        made.close()
    follower.promote()
    with logkit.Broker(tmp_path / "f", config={"log.cleaner.enable": False}) as promoted:
        p = promoted.topic("table").partition(0)
        assert records(p) == expected
        write(p, 120, 130)                                 # it leads: appends, cleans
        p.roll()
        p.compact()
        assert {key for _, key, _ in records(p)} >= {key for _, key, _ in expected}


# ---- a kill in the middle of an install ------------------------------------------------

KILLER = r"""
import os, signal, sys
sys.path.insert(0, {root!r})
import logkit
from logkit import log_clean
target = int(sys.argv[1])
seen = [0]
inside = [False]
def counting(fn):
    def call(*args, **kwargs):
        if inside[0]:
            seen[0] += 1
            if seen[0] == target:
                os.kill(os.getpid(), signal.SIGKILL)
        return fn(*args, **kwargs)
    return call
os.replace, os.rename, os.unlink = (counting(os.replace), counting(os.rename),
                                    counting(os.unlink))
install = log_clean._LogClean.install_segment
def watched(self, *args, **kwargs):
    inside[0] = True
    try:
        return install(self, *args, **kwargs)
    finally:
        inside[0] = False
log_clean._LogClean.install_segment = watched
follower = logkit.Follower(sys.argv[2], logkit.DirectorySource(sys.argv[3]),
                           config={{"replica.fetch.backoff.ms": 20}})
follower.catch_up(timeout=60)
print("steps", seen[0])
"""


def test_a_follower_killed_mid_install_holds_the_old_segment_or_the_new_one(tmp_path):
    """SIGKILL before each rename and unlink of the installs (every step of the
    .cleaned/.swap swap): reopened, each leader segment's range in the copy holds the
    records from before the pass or after it, never a mix nor a loss, the copy passes
    check(), and a follower started again ends byte-identical to the leader."""
    made = Leader(tmp_path / "leader", "directory", tmp_path)
    try:
        write(made.partition, 0, 100)
        made.partition.roll()
        template = tmp_path / "template"
        logkit.Follower(template, made.source(), config=FAST).catch_up(timeout=30)
        before = records(made.partition)
        made.compact()
        after = records(made.partition)
        bases = made.partition.segment_base_offsets()
        script = tmp_path / "killer.py"
        script.write_text(KILLER.format(root=ROOT))
        ranges = list(zip(bases, bases[1:]))
        assert len(ranges) >= 2
        step, outcomes = 0, set()
        while True:
            step += 1
            trial = tmp_path / f"trial{step}"
            shutil.copytree(template, trial)
            run = subprocess.run([sys.executable, str(script), str(step), str(trial),
                                  made.broker.path], capture_output=True, text=True,
                                 timeout=120)
            killed = run.returncode == -signal.SIGKILL
            assert killed or run.returncode == 0, run.stderr
            with logkit.Broker(trial, config={"log.cleaner.enable": False}) as opened:
                copy = opened.topic("table").partition(0)
                copy.check()
                got = records(copy)
            state = []
            for low, high in ranges:                # each range old or new, whole
                mine = [r for r in got if low <= r[0] < high]
                old = [r for r in before if low <= r[0] < high]
                new = [r for r in after if low <= r[0] < high]
                assert mine in (old, new), (step, low, high)
                state.append(mine == new)
            outcomes.add(tuple(state))
            if not killed:
                break
            logkit.Follower(trial, made.source(), config=FAST).catch_up(timeout=30)
            with copy_of(trial) as copy:
                assert_same_copy(made.partition, copy)
            shutil.rmtree(trial)
        assert step > 8                                     # every step was a trial
        assert (False,) * len(ranges) in outcomes and (True,) * len(ranges) in outcomes
    finally:
        made.close()


def test_a_stale_leader_of_a_compacted_topic_rejoins_where_the_epochs_part(tmp_path):
    """KIP-101/279 over gaps: A leads, B copies and is promoted; A (not told) writes on
    in epoch 0 and cleans, so the batch at the offset where the epochs part is gone
    from A; B writes in epoch 1 and cleans. A follows B: its stale tail goes (the
    truncation is not fooled by the gap) and it ends a byte-identical copy of B."""
    a_path, b_path = tmp_path / "a", tmp_path / "b"
    with logkit.Broker(a_path, background=False, config=LEADER) as a:   # keeps no lease
        pa = a.create_topic("table", 1, config=COMPACTED).partition(0)
        write(pa, 0, 100)
        follower = logkit.Follower(b_path, logkit.DirectorySource(a_path), config=FAST)
        follower.catch_up(timeout=30)
        follower.promote()
        common = pa.log_end_offset
        for low in range(common, common + 40, 4):      # stale: never copied by B
            pa.append([(b"k%d" % (n % 3), b"stale%d" % n, None, None)
                       for n in range(low, low + 4)])
        pa.roll()
        pa.compact()
        assert common not in {offset for offset, _, _ in records(pa)}   # a gap there
        stale_end = pa.log_end_offset
    with logkit.Broker(b_path, config={"log.cleaner.enable": False}) as b:
        pb = b.topic("table").partition(0)
        write(pb, common, common + 60)
        pb.roll()
        pb.compact()
        expected = records(pb)
    rejoin = logkit.Follower(a_path, logkit.DirectorySource(b_path), config=FAST)
    rejoin.catch_up(timeout=30)
    with copy_of(a_path) as pa, logkit.Broker(b_path, read_only=True) as b:
        pb = b.topic("table").partition(0)
        assert stale_end > common and records(pa) == expected
        assert not any(value.startswith(b"stale") for _, _, value in records(pa))
        assert read_checkpoint(pa.directory) == [EpochEntry(0, 0), EpochEntry(1, common)]
        assert_same_copy(pb, pa)


@pytest.mark.parametrize("kind", ["directory", "tcp"])
def test_a_follower_copies_a_leader_whose_cleaner_runs_while_it_produces(kind, tmp_path):
    """The leader's background cleaner passes over two partitions (every 20 ms) while
    a producer writes and the follower copies: listings overtaken by a pass, segments
    sealed after the follower last looked, installs racing new passes; once production
    stops and a last pass ran, catch_up() leaves a byte-identical copy."""
    config = {**COMPACTED, "segment.bytes": 4096, "min.cleanable.dirty.ratio": 0.01}
    with logkit.Broker(tmp_path / "leader", config={"log.cleaner.backoff.ms": 20}) as broker:
        topic = broker.create_topic("table", 2, config=config)
        server = broker.serve_replication(secret=SECRET) if kind == "tcp" else None
        source = logkit.DirectorySource(broker.path) if server is None else \
            logkit.TcpSource(server.host, server.port, secret=SECRET)
        with logkit.Follower(tmp_path / "f", source, config=FAST) as follower:
            with broker.producer(linger_ms=1) as producer:
                deadline = time.monotonic() + 60
                n = 0
                while min(p.clean_count for p in topic.partitions) < 5:
                    assert time.monotonic() < deadline, "the cleaner did not run"
                    for _ in range(200):
                        producer.send("table", b"v%d" % n, key=b"k%d" % (n % 50))
                        n += 1
                    producer.flush()
            for p in topic.partitions:
                p.roll()
                p.compact()
            follower.catch_up(timeout=60)
            with logkit.Broker(tmp_path / "f", read_only=True) as copy:
                for p in topic.partitions:
                    assert_same_copy(p, copy.topic("table").partition(p.partition))
        if server is not None:
            server.close()
