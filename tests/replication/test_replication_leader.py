"""The leader's side of replication (docs/design.md §8, docs/replication.md): the replication
factor and the assigned replica set, the ISR by replica.lag.time.max.ms, the high
watermark as the minimum log end over the ISR (what consumers, in this process or
another, may read), and acks="all" waiting for it. Followers run in their own processes
(tests/helpers/leader_proc.py); "stopped" means SIGSTOP, so a paused follower can come
back with SIGCONT and rejoin the ISR."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

import logkit
from logkit.errors import ConfigError, LogkitTimeoutError, NotEnoughReplicasError
from logkit.leader.replicas import (HighWatermarkFile, ReplicatedPartition,
                                       _Report, in_sync_replicas)
from logkit.topic import Partition
from tests.helpers.procs import ROOT_DIR

HELPER = os.path.join(os.path.dirname(os.path.dirname(__file__)), "helpers", "leader_proc.py")
ENV = {**os.environ, "PYTHONPATH": ROOT_DIR}


class FollowerProcess:
    """A logkit.Follower in its own process; `id` once it has caught up."""

    def __init__(self, leader, directory, wait_ms=50):
        self.proc = subprocess.Popen([sys.executable, HELPER, "follow", str(leader),
                                      str(directory), str(wait_ms)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True, env=ENV)
        self.id = self.proc.stdout.readline().strip()
        assert self.id, "the follower process did not start"

    def pause(self):
        self.proc.send_signal(signal.SIGSTOP)

    def resume(self):
        self.proc.send_signal(signal.SIGCONT)

    def close(self):
        self.resume()
        self.proc.stdin.close()
        self.proc.wait(timeout=30)
        assert self.proc.returncode == 0


def eventually(condition, what, timeout=20.0):
    """Wait for `condition()` (bounded; never a timed assertion on the way there)."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"not reached in {timeout} s: {what}"
        time.sleep(0.01)


def produce(broker, topic, count, acks=1):
    producer = broker.producer(acks=acks)
    futures = [producer.send(topic, b"v%d" % i, partition=0) for i in range(count)]
    producer.flush()
    offsets = [f.result().offset for f in futures]
    producer.close()
    return offsets


# ---- replication factor -------------------------------------------------------------

def test_replication_factor_is_a_topic_setting_with_kafkas_default(tmp_path):
    """create_topic(replication_factor=) is stored in the topic record and read back
    after a reopen; default.replication.factor is the default; exist_ok compares it;
    bad values are ConfigErrors; a factor of 1 keeps plain Partitions (no new cost)."""
    with logkit.Broker(tmp_path, config={"default.replication.factor": 2}) as broker:
        assert broker.create_topic("dflt", 1).replication_factor == 2
        assert broker.create_topic("three", 2, replication_factor=3).replication_factor == 3
        one = broker.create_topic("one", 1, replication_factor=1)
        assert type(one.partition(0)) is Partition
        assert isinstance(broker.topic("three").partition(1), ReplicatedPartition)
        assert broker.create_topic("three", exist_ok=True).replication_factor == 3
        assert broker.create_topic("three", replication_factor=3, exist_ok=True)
        with pytest.raises(logkit.TopicExistsError, match="replication factor 3, not 2"):
            broker.create_topic("three", replication_factor=2, exist_ok=True)
        for bad in (0, -1, True, "2", 40000):
            with pytest.raises(ConfigError, match="replication_factor"):
                broker.create_topic("bad", 1, replication_factor=bad)
        assert "bad" not in broker.topics()
    with logkit.Broker(tmp_path) as broker:
        assert broker.topic("three").replication_factor == 3
        assert broker.topic("one").replication_factor == 1
        assert broker.create_topic("later", 1).replication_factor == 1


def test_a_follower_copies_the_replication_factor(tmp_path):
    """The topic record's factor reaches the follower's copy (TopicInfo)."""
    with logkit.Broker(tmp_path / "leader") as leader:
        leader.create_topic("r", 2, replication_factor=2)
        leader.create_topic("u", 1)
        logkit.Follower(tmp_path / "copy",
                        logkit.DirectorySource(tmp_path / "leader")).catch_up(timeout=30)
    with logkit.Broker(tmp_path / "copy", read_only=True) as copy:
        assert copy.topic("r").replication_factor == 2
        assert copy.topic("u").replication_factor == 1


# ---- the ISR and the high watermark, pure parts --------------------------------------

def test_the_isr_rule_is_kafkas_last_caught_up_time():
    """In the ISR: an assigned follower caught up within replica.lag.time.max.ms; its
    log end counts at most up to the leader's; an unassigned or silent one never."""
    reports = {"a": _Report(1000, {"t-0": 90}, {"t-0": 950}),
               "b": _Report(1000, {"t-0": 100}, {"t-0": 500}),
               "c": _Report(1000, {"t-0": 100}, {"t-0": 990}),
               "d": _Report(1000, {"t-0": 120}, {})}
    assert in_sync_replicas(["a", "b", "d", "x"], reports, "t-0", 100, 1000, 300) == \
        {"a": 90, "d": 100}
    assert in_sync_replicas(["a"], reports, "t-1", 100, 1000, 300) == {}
    assert in_sync_replicas(["a"], reports, "t-0", 100, 1251, 300) == {}


def test_the_published_high_watermark_never_moves_back(tmp_path):
    """Only upwards, and never past the log end; after a truncation, down to it."""
    hw = HighWatermarkFile(str(tmp_path), writable=True, initial=0)
    assert hw.read() == 0
    assert hw.publish(10, 20) == (10, True)
    assert hw.publish(5, 20) == (10, False)
    assert hw.publish(30, 20) == (20, True)
    assert hw.publish(8, 12) == (12, True)                 # the log was cut to 12
    reader = HighWatermarkFile(str(tmp_path), writable=False, initial=0)
    assert reader.read() == 12
    reader.close()
    hw.close()


# ---- with follower processes ---------------------------------------------------------

def test_high_watermark_holds_at_what_the_isr_has_and_bounds_every_reader(tmp_path):
    """With the in-sync follower paused, records appended with acks=1 stay above the
    high watermark: reads, end offsets, group lag and a consumer in another process
    stop at it; once the follower runs again the high watermark reaches the log end
    and the other process sees everything."""
    leader_path = tmp_path / "leader"
    with logkit.Broker(leader_path) as broker:
        topic = broker.create_topic("t", 1, replication_factor=2)
        p = topic.partition(0)
        produce(broker, "t", 5)
        follower = FollowerProcess(leader_path, tmp_path / "copy")
        try:
            eventually(lambda: len(p.in_sync_replicas()) == 2, "the follower in the ISR")
            eventually(lambda: p.high_watermark == 5, "the high watermark at 5")
            follower.pause()
            produce(broker, "t", 7)
            assert (p.log_end_offset, p.high_watermark) == (12, 5)
            assert [r.offset for r in p.read(0, 100)] == [0, 1, 2, 3, 4]
            assert p.read(5) == []
            records, hw = p.fetch(0, 100)          # the consumer's read: the same stop
            assert ([r.offset for r in records], hw) == ([0, 1, 2, 3, 4], 5)
            assert p.fetch(5) == ([], 5)
            columns, next_offset = p.read_columns(0, 100)
            assert (columns.count, next_offset) == (5, 5)
            assert len(p.batches_since(0, upto=p.log_end_offset)) > len(p.batches_since(0))
            consumer = broker.consumer("t", group_id="g", auto_offset_reset="earliest")
            assert [r.offset for r in consumer.poll(timeout_ms=200)] == [0, 1, 2, 3, 4]
            assert consumer.end_offsets([logkit.TopicPartition("t", 0)]) == \
                {logkit.TopicPartition("t", 0): 5}
            consumer.commit()
            assert broker.group("g").lag() == {logkit.TopicPartition("t", 0): 0}
            out = subprocess.run([sys.executable, HELPER, "consume", str(leader_path), "t"],
                                 capture_output=True, text=True, env=ENV, timeout=60)
            hw, seen = out.stdout.split()
            assert (int(hw), seen) == (5, "0,1,2,3,4"), out.stderr
            follower.resume()
            eventually(lambda: p.high_watermark == 12, "the high watermark at the log end")
            out = subprocess.run([sys.executable, HELPER, "consume", str(leader_path), "t"],
                                 capture_output=True, text=True, env=ENV, timeout=60)
            assert out.stdout.split() == ["12", ",".join(map(str, range(12)))], out.stderr
            assert broker.group("g").lag() == {logkit.TopicPartition("t", 0): 7}
        finally:
            follower.close()


def test_acks_all_completes_once_the_follower_copied_and_times_out_when_it_stops(tmp_path):
    """acks="all": every future completes, pipelined, once the follower holds the
    record; with the follower paused (still in the ISR) the send fails with
    LogkitTimeoutError after request_timeout_ms, and the record stays in the log."""
    leader_path, copy_path = tmp_path / "leader", tmp_path / "copy"
    with logkit.Broker(leader_path) as broker:
        topic = broker.create_topic("t", 1, replication_factor=2,
                                    config={"min.insync.replicas": 2})
        p = topic.partition(0)
        follower = FollowerProcess(leader_path, copy_path)
        try:
            eventually(lambda: len(p.in_sync_replicas()) == 2, "the follower in the ISR")
            producer = broker.producer(acks="all", request_timeout_ms=20000)
            futures = [producer.send("t", b"%d" % i, partition=0) for i in range(2000)]
            last = futures[-1].result(timeout=60)
            assert [f.result().offset for f in futures] == list(range(2000))
            assert p.high_watermark >= last.offset + 1
            with logkit.Broker(copy_path, read_only=True) as copy:
                assert copy.topic("t").partition(0).log_end_offset >= last.offset + 1
            follower.pause()
            quick = broker.producer(acks="all", request_timeout_ms=300)
            future = quick.send("t", b"late", partition=0)
            with pytest.raises(LogkitTimeoutError, match="request_timeout_ms"):
                future.result(timeout=30)
            assert p.log_end_offset == 2001                  # stored on the leader
            assert p.high_watermark == 2000
            follower.resume()
            eventually(lambda: p.high_watermark == 2001, "the late record replicated")
            assert producer.send("t", b"again", partition=0).result(timeout=60).offset == 2001
        finally:
            follower.close()


def test_a_shrunk_isr_refuses_acks_all_and_a_caught_up_follower_rejoins(tmp_path):
    """A follower paused longer than replica.lag.time.max.ms leaves the ISR: acks="all"
    to a topic with min.insync.replicas=2 raises NotEnoughReplicasError with nothing
    written, acks=1 goes on and the high watermark follows the leader alone; resumed,
    the follower catches up, rejoins, and acks="all" works again."""
    leader_path = tmp_path / "leader"
    with logkit.Broker(leader_path, config={"replica.lag.time.max.ms": 300}) as broker:
        topic = broker.create_topic("t", 1, replication_factor=2,
                                    config={"min.insync.replicas": 2})
        p = topic.partition(0)
        follower = FollowerProcess(leader_path, tmp_path / "copy")
        try:
            eventually(lambda: len(p.in_sync_replicas()) == 2, "the follower in the ISR")
            assert produce(broker, "t", 3, acks="all") == [0, 1, 2]
            follower.pause()
            eventually(lambda: p.in_sync_replicas() == ["leader"], "the ISR shrunk")
            producer = broker.producer(acks="all")
            with pytest.raises(NotEnoughReplicasError, match="min.insync.replicas=2"):
                producer.send("t", b"refused", partition=0).result(timeout=30)
            assert p.log_end_offset == 3                     # nothing written
            assert produce(broker, "t", 2, acks=1) == [3, 4]
            assert p.high_watermark == 5                     # the ISR is the leader
            follower.resume()
            eventually(lambda: len(p.in_sync_replicas()) == 2, "the follower rejoined")
            assert producer.send("t", b"ok", partition=0).result(timeout=60).offset == 5
        finally:
            follower.close()


def test_a_follower_beyond_the_replication_factor_does_not_count(tmp_path):
    """Replication factor 2: the first follower to report is the assigned replica, kept
    across a reopen; a second follower copies but is never in the ISR, so pausing the
    assigned one holds the high watermark even though the other has everything."""
    leader_path = tmp_path / "leader"
    with logkit.Broker(leader_path) as broker:
        p = broker.create_topic("t", 1, replication_factor=2).partition(0)
        first = FollowerProcess(leader_path, tmp_path / "first")
        eventually(lambda: len(p.in_sync_replicas()) == 2, "the first follower assigned")
        second = FollowerProcess(leader_path, tmp_path / "second")
        try:
            assert p.in_sync_replicas() == ["leader", first.id]
            first.pause()
            produce(broker, "t", 4)
            def second_copied():
                report = broker.replica_state.reports().get(second.id)
                return report is not None and report.ends.get("t-0") == 4
            eventually(second_copied, "the second follower copied")
            assert p.high_watermark == 0
            assert p.in_sync_replicas() == ["leader", first.id]
            first.resume()
            eventually(lambda: p.high_watermark == 4, "the assigned follower copied")
        finally:
            first.close()
            second.close()
    with logkit.Broker(leader_path, read_only=True) as broker:
        p = broker.topic("t").partition(0)
        state = broker.replica_state
        assert state.assigned("t", broker.topic("t").topic_id, 2) == [first.id]
        assert state.describe(p, broker.topic("t").topic_id, 2).replicas == \
            ["leader", first.id]


def test_logkit_replicas_shows_replica_set_isr_lag_and_epochs(tmp_path, capsys):
    """`logkit replicas DIR`: per partition the factor, replicas, ISR, log end, high
    watermark, epochs and each follower's lag, as text and as JSON; read-only."""
    import json

    from logkit import cli
    leader_path = tmp_path / "leader"
    with logkit.Broker(leader_path) as broker:
        broker.create_topic("t", 1, replication_factor=2)
        broker.create_topic("u", 1)
        produce(broker, "t", 3)
        produce(broker, "u", 2)
        follower = logkit.Follower(tmp_path / "copy", logkit.DirectorySource(leader_path))
        follower.catch_up(timeout=30)
        produce(broker, "t", 2)                      # not copied: lag 2
    listing = os.listdir(leader_path)
    assert cli.main(["replicas", str(leader_path), "--json"]) == 0
    rows = {(r["topic"], r["partition"]): r for r in json.loads(capsys.readouterr().out)}
    t, u = rows[("t", 0)], rows[("u", 0)]
    fid = follower.follower_id
    assert (t["replication_factor"], t["replicas"], t["isr"]) == (2, ["leader", fid],
                                                                   ["leader", fid])
    assert (t["log_end_offset"], t["high_watermark"], t["leader_epochs"]) == (5, 3, [[0, 0]])
    assert (t["followers"][fid]["lag"], t["followers"][fid]["assigned"]) == (2, True)
    assert (u["replicas"], u["isr"], u["high_watermark"]) == (["leader"], ["leader"], 2)
    assert u["followers"][fid]["assigned"] is False
    assert cli.main(["replicas", str(leader_path)]) == 0
    text = capsys.readouterr().out
    assert f"leader,{fid}" in text and f"{fid}:3(lag:2)" in text
    assert os.listdir(leader_path) == listing                # wrote nothing


def test_a_follower_that_just_caught_up_counts_before_acks_all_refuses(tmp_path):
    """The leader lists new followers about once a second; a refusal looks again first,
    so a follower that caught up a moment after a refused send counts at once (it was
    refused for up to a second before)."""
    leader_dir = tmp_path / "leader"
    with logkit.Broker(leader_dir) as leader:
        leader.create_topic("t", 1, replication_factor=2,
                            config={"min.insync.replicas": 2})
        producer = leader.producer(acks="all", request_timeout_ms=20000)
        with pytest.raises(NotEnoughReplicasError):
            producer.send("t", b"early").result(timeout=20)
        with logkit.Follower(tmp_path / "replica",
                             logkit.DirectorySource(leader_dir)) as follower:
            follower.catch_up(timeout=30)
            assert producer.send("t", b"paid").result(timeout=20).offset == 0
        producer.close()
