"""Failover with fencing (docs/design.md §8, docs/replication.md "Leases and failover"): the
leader's lease, a Broker fenced by a newer holder, promote() taking the lease by a
conditional write (two racing processes: exactly one wins), automatic promotion of a
running follower when the leader is SIGKILLed, and the old leader coming back: it
refuses writes, rejoins as a follower and converges byte for byte."""

from __future__ import annotations

import filecmp
import os
import signal
import subprocess
import sys
import time

import pytest

import logkit
from logkit.leader.epochs import read_checkpoint
from logkit.leader.lease import (LeaseKeeper, read_lease, release, renew,
                                      replica_id, take_next)
from tests.helpers.procs import ROOT_DIR

HELPER = os.path.join(os.path.dirname(os.path.dirname(__file__)), "helpers", "failover_proc.py")
FAST = {"broker.session.timeout.ms": 1000}
RACE_ROUNDS = 200 if os.environ.get("LOGKIT_SLOW") == "1" else 25


def start(*args, stdin=None):
    proc = subprocess.Popen([sys.executable, HELPER, *map(str, args)],
                            stdin=stdin, stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": ROOT_DIR})
    assert proc.stdout.readline().strip() == "ready"
    return proc


def wait_for(condition, what, timeout_s=30.0):
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"{what} did not happen"
        time.sleep(0.02)


def produce(broker, count, prefix=b"v"):
    producer = broker.producer(linger_ms=0)
    for i in range(count):
        producer.send("t", prefix + b"%d" % i, partition=0)
    producer.flush()
    producer.close()


def copy_of(leader_path, follower_path, **options):
    follower = logkit.Follower(follower_path, logkit.DirectorySource(leader_path),
                               config=FAST, **options)
    follower.catch_up(timeout=30)
    return follower


def test_a_replicated_leader_takes_its_lease_and_renews_it(tmp_path):
    with logkit.Broker(tmp_path / "L", config=FAST) as leader:
        leader.create_topic("t", 1)
        produce(leader, 10)
        assert read_lease(leader.path) is None                 # not replicated yet
        copy_of(leader.path, tmp_path / "F")                   # reports progress
        wait_for(lambda: read_lease(leader.path) is not None, "the first lease")
        first = read_lease(leader.path)
        assert first.holder == replica_id(leader.path) and first.epoch == 0
        assert first.ttl_ms == 1000 and first.valid()
        wait_for(lambda: read_lease(leader.path).renewed_ms > first.renewed_ms,
                 "a renewal")
    released = read_lease(tmp_path / "L")
    assert released.holder == first.holder and not released.valid()   # closed: released


def test_a_broker_whose_lease_names_a_newer_holder_refuses_every_write(tmp_path):
    root = tmp_path / "old"
    with logkit.Broker(root) as broker:
        broker.create_topic("t", 1)
        produce(broker, 5)
    take_next(root, "new-leader", ttl_ms=1000, min_epoch=1)
    with logkit.Broker(root) as broker:
        p = broker.topic("t").partition(0)
        assert [r.value for r in p.read(0)] == [b"v%d" % i for i in range(5)]   # reads
        with pytest.raises(logkit.NotLeaderError, match="new-leader"):
            broker.create_topic("u", 1)
        with pytest.raises(logkit.NotLeaderError):
            broker.producer()
        with pytest.raises(logkit.NotLeaderError):
            p.append([(None, b"stale", None, None)])
        with pytest.raises(logkit.NotLeaderError):
            broker.alter_topic_config("t", {"retention.ms": 1000})
        consumer = broker.consumer(group_id="g", enable_auto_commit=False,
                                   auto_offset_reset="earliest")
        consumer.assign([logkit.TopicPartition("t", 0)])
        assert len(consumer.poll(timeout_ms=500)) == 5
        with pytest.raises(logkit.NotLeaderError):
            consumer.commit()
        consumer.close()
        assert p.log_end_offset == 5
        p.check()


def test_a_lease_keeper_fenced_through_its_public_method_refuses_writes(tmp_path):
    """LeaseKeeper.fence(): what the object-store shipper calls once the store's lease
    names another replica."""
    with logkit.Broker(tmp_path / "L") as broker:
        keeper = LeaseKeeper(broker.path, broker.config)
        keeper.check()                                       # unleased: writes allowed
        keeper.fence("the store's lease names replica r2")
        keeper.fence("a second call changes nothing")
        assert keeper.fenced and not keeper.leading
        with pytest.raises(logkit.NotLeaderError, match="names replica r2"):
            keeper.check()


def test_a_running_leader_fences_itself_once_a_newer_holder_takes_its_lease(tmp_path):
    with logkit.Broker(tmp_path / "L", config=FAST) as leader:
        leader.create_topic("t", 1)
        produce(leader, 10)
        copy_of(leader.path, tmp_path / "F")
        wait_for(lambda: read_lease(leader.path) is not None, "the first lease")
        renew(leader.path, "elsewhere", 5, ttl_ms=1000)       # a promotion elsewhere
        producer = leader.producer(linger_ms=0)

        def refused():
            try:
                producer.send("t", b"late", partition=0).result()
            except logkit.NotLeaderError:
                return True
            return False
        wait_for(refused, "the leader fencing itself")
        end = leader.topic("t").partition(0).log_end_offset
        with pytest.raises(logkit.NotLeaderError, match="elsewhere"):
            leader.topic("t").partition(0).append([(None, b"x", None, None)])
        assert leader.topic("t").partition(0).log_end_offset == end
    assert read_lease(tmp_path / "L").holder == "elsewhere"   # not released by the fenced


def test_promote_refuses_while_the_leaders_lease_is_valid_and_changes_nothing(tmp_path):
    with logkit.Broker(tmp_path / "L", config=FAST) as leader:
        leader.create_topic("t", 2)
        produce(leader, 20)
        follower = copy_of(leader.path, tmp_path / "F")
        wait_for(lambda: read_lease(leader.path) is not None, "the first lease")
        with pytest.raises(logkit.NotLeaderError, match="valid"):
            follower.promote()
        with logkit.Broker(tmp_path / "F", read_only=True) as copy:
            for q in copy.topic("t").partitions:
                assert q.leader_epoch == 0
                assert all(e.epoch == 0 for e in read_checkpoint(q.directory) or [])
        assert read_lease(leader.path).holder == replica_id(leader.path)
    follower.promote()                                        # the leader is gone
    lease = read_lease(tmp_path / "L")
    assert lease.holder == follower.follower_id and lease.epoch == 1
    own = read_lease(tmp_path / "F")
    assert (own.holder, own.epoch) == (follower.follower_id, 1)
    with logkit.Broker(tmp_path / "F") as new_leader:
        new_leader.topic("t").partition(0).append([(None, b"new", None, None)])
    with logkit.Broker(tmp_path / "L") as old:
        with pytest.raises(logkit.NotLeaderError):
            old.topic("t").partition(0).append([(None, b"stale", None, None)])


def test_promote_from_an_unreachable_source_needs_unclean(tmp_path):
    with logkit.Broker(tmp_path / "L") as leader:
        leader.create_topic("t", 1)
        produce(leader, 5)
    follower = copy_of(tmp_path / "L", tmp_path / "F")
    os.rename(tmp_path / "L", tmp_path / "gone")              # the leader's disk is away
    with pytest.raises(logkit.NotLeaderError, match="unclean"):
        follower.promote()
    with logkit.Broker(tmp_path / "F", read_only=True) as copy:
        assert copy.topic("t").partition(0).leader_epoch == 0
    follower.promote(unclean=True)
    with logkit.Broker(tmp_path / "F") as new_leader:
        p = new_leader.topic("t").partition(0)
        assert p.leader_epoch == 1
        p.append([(None, b"new", None, None)])


def test_two_processes_racing_to_promote_exactly_one_wins_every_round(tmp_path):
    leader_path = tmp_path / "L"
    with logkit.Broker(leader_path) as leader:
        leader.create_topic("t", 1)
        produce(leader, 50)
    followers = [tmp_path / "F1", tmp_path / "F2"]
    for path in followers:
        copy_of(leader_path, path)
    leader_id = replica_id(leader_path)
    procs = [start("promote", path, leader_path, stdin=subprocess.PIPE)
             for path in followers]
    wins = [0, 0]
    try:
        for _ in range(RACE_ROUNDS):
            current = read_lease(leader_path)
            epoch = current.epoch + 1 if current else 0
            renew(leader_path, leader_id, epoch, ttl_ms=1000)   # the old leader again,
            release(leader_path, leader_id, epoch)              # and now gone
            epochs_before = [_epochs(path) for path in followers]
            for proc in procs:
                proc.stdin.write("go\n")
            for proc in procs:
                proc.stdin.flush()
            results = [proc.stdout.readline().split() for proc in procs]
            assert sorted(r[0] for r in results) == ["lost", "won"], results
            loser = [r[0] for r in results].index("lost")
            assert results[loser][1] == "NotLeaderError"
            assert _epochs(followers[loser]) == epochs_before[loser]   # untouched
            winner = 1 - loser
            wins[winner] += 1
            assert read_lease(leader_path).holder == replica_id(followers[winner])
            assert _epochs(followers[winner])[-1] > epochs_before[winner][-1]
    finally:
        for proc in procs:
            proc.stdin.close()
            proc.wait(timeout=30)
    assert sum(wins) == RACE_ROUNDS


def _epochs(root):
    with logkit.Broker(root, read_only=True) as b:
        p = b.topic("t").partition(0)
        return [p.leader_epoch] + [e.epoch for e in read_checkpoint(p.directory) or []]


def kill(proc):
    proc.send_signal(signal.SIGKILL)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    return out


def acked_lines(out, writer_id):
    acked = {}
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 2:                           # a line cut by the kill has fewer
            acked[int(parts[0])] = b"%s-%s" % (writer_id, parts[1].encode())
    return acked


def test_a_follower_promotes_itself_when_the_leader_dies_and_the_old_leader_rejoins(
        tmp_path):
    """Real processes: the leader writes (acks=1) and renews its lease; a running
    follower copies; the leader is SIGKILLed; the follower promotes itself once the
    lease lapses; the new leader takes writes; the old leader, restarted, refuses
    writes, rejoins as a follower, and ends byte-identical to the new leader."""
    old_path, new_path = tmp_path / "L", tmp_path / "F"
    writer = start("lead", old_path, 1000, "w")
    follower = logkit.Follower(new_path, logkit.DirectorySource(old_path), config=FAST)
    follower.start()
    wait_for(lambda: read_lease(old_path) is not None, "the leader's first lease")
    wait_for(lambda: sum(follower.log_end_offsets().values()) > 200, "copying")
    out = kill(writer)
    assert follower.promoted.wait(30), follower.error
    follower.stop()
    assert read_lease(old_path).holder == follower.follower_id
    acked = acked_lines(out, b"w")
    with logkit.Broker(new_path) as new_leader:               # the follower's own prefix
        p = new_leader.topic("t").partition(0)
        common = p.log_end_offset
        assert p.leader_epoch == 1
        values = {r.offset: r.value for r in p.read(0, max_records=10 ** 6)}
        assert all(acked[o] == v for o, v in values.items() if o in acked)
        produce(new_leader, 30, prefix=b"new")
        new_end = p.log_end_offset
    with logkit.Broker(old_path, background=False) as old:    # recovers, then refuses
        q = old.topic("t").partition(0)
        q.check()
        assert q.log_end_offset >= common
        with pytest.raises(logkit.NotLeaderError):
            q.append([(None, b"stale", None, None)])
        with pytest.raises(logkit.NotLeaderError):
            old.producer()
    rejoin = logkit.Follower(old_path, logkit.DirectorySource(new_path), config=FAST)
    rejoin.catch_up(timeout=60)
    with logkit.Broker(old_path, read_only=True) as old, \
            logkit.Broker(new_path, read_only=True) as new:
        q, p = old.topic("t").partition(0), new.topic("t").partition(0)
        assert q.log_end_offset == p.log_end_offset == new_end
        q.check()
        for name in sorted(n for n in os.listdir(q.directory) if n.endswith(".log")):
            assert filecmp.cmp(os.path.join(q.directory, name),
                               os.path.join(p.directory, name), shallow=False), name
        assert [r.value for r in q.read(0, max_records=10 ** 6)] == \
            [r.value for r in p.read(0, max_records=10 ** 6)]


def test_a_follower_with_auto_promotion_off_stays_a_follower(tmp_path):
    with logkit.Broker(tmp_path / "L", config=FAST) as leader:
        leader.create_topic("t", 1)
        produce(leader, 10)
        follower = copy_of(leader.path, tmp_path / "F", auto_promote=False)
        wait_for(lambda: read_lease(leader.path) is not None, "the first lease")
        follower.start()
    assert not read_lease(tmp_path / "L").valid()              # released at close
    time.sleep(1.0)                                            # ten looks at the lease
    assert follower.running and not follower.promoted.is_set()
    follower.stop()
    assert read_lease(tmp_path / "L").holder != follower.follower_id


def test_automatic_promotion_uses_the_leaders_isr_a_follower_beyond_the_factor_waits(
        tmp_path):
    """Replication factor 2: the first follower to report is assigned, the second copies
    beyond the factor. When the leader goes, only the assigned one promotes itself."""
    with logkit.Broker(tmp_path / "L", config=FAST) as leader:
        leader.create_topic("t", 2, replication_factor=2)
        assigned = copy_of(leader.path, tmp_path / "A")
        extra = copy_of(leader.path, tmp_path / "B")
        leader.topic("t").partition(0).append([(None, b"x", None, None)])
        assigned.catch_up(timeout=30)
        extra.catch_up(timeout=30)
        isr = leader.topic("t").partition(0).in_sync_replicas()
        assert isr == ["leader", assigned.follower_id]
        wait_for(lambda: read_lease(leader.path) is not None, "the first lease")
        assert assigned._isr_rank() == (0, "")
        rank, why = extra._isr_rank()
        assert rank is None and "not among the assigned replicas" in why
        extra.start()
        assigned.start()
    assert assigned.promoted.wait(30), assigned.error
    assert read_lease(tmp_path / "L").holder == assigned.follower_id
    extra.stop()
    assert not extra.promoted.is_set()
    with logkit.Broker(tmp_path / "B", read_only=True) as copy:
        assert copy.topic("t").partition(0).leader_epoch == 0       # still a copy


def test_an_assigned_follower_out_of_the_isr_does_not_promote_itself(tmp_path):
    config = {**FAST, "replica.lag.time.max.ms": 1000}
    with logkit.Broker(tmp_path / "L", config=config) as leader:
        leader.create_topic("t", 1, replication_factor=2)
        follower = logkit.Follower(tmp_path / "F", logkit.DirectorySource(leader.path),
                                   config=config)
        follower.catch_up(timeout=30)
        wait_for(lambda: read_lease(leader.path) is not None, "the first lease")
        produce(leader, 5)                  # acks=1: the follower, stopped, falls behind
        p = leader.topic("t").partition(0)
        wait_for(lambda: p.in_sync_replicas() == ["leader"], "the follower leaving the ISR")
        rank, why = follower._isr_rank()
        assert rank is None and "not in the ISR of t-0" in why


def test_the_promote_command(tmp_path, capsys):
    from logkit.cli import main
    with logkit.Broker(tmp_path / "L", config=FAST) as leader:
        leader.create_topic("t", 1)
        produce(leader, 5)
        follower = copy_of(leader.path, tmp_path / "F")
        wait_for(lambda: read_lease(leader.path) is not None, "the first lease")
        assert main(["promote", str(tmp_path / "F")]) == 1          # the lease is held
        assert "valid" in capsys.readouterr().err
        with logkit.Broker(tmp_path / "F", read_only=True) as copy:
            assert copy.topic("t").partition(0).leader_epoch == 0
    assert main(["promote", str(tmp_path / "F")]) == 0
    out = capsys.readouterr().out
    assert "is the leader in leader epoch 1" in out
    assert read_lease(tmp_path / "L").holder == follower.follower_id
    with logkit.Broker(tmp_path / "F") as new_leader:
        assert new_leader.topic("t").partition(0).leader_epoch == 1
    assert main(["promote", str(tmp_path / "L")]) == 2          # not a follower's
    assert "not a follower's directory" in capsys.readouterr().err


def test_the_promote_command_through_a_tcp_source(tmp_path, capsys, monkeypatch):
    """A follower of tcp://: the lease is taken through the leader's server, with the
    secret from the environment as `logkit follow` takes it."""
    from logkit.cli import main
    secret = "failover secret"
    with logkit.Broker(tmp_path / "L", config=FAST) as leader:
        leader.create_topic("t", 1)
        produce(leader, 5)
        server = leader.serve_replication(secret=secret)
        follower = logkit.Follower(tmp_path / "F", logkit.TcpSource(
            server.host, server.port, secret=secret), config=FAST)
        follower.catch_up(timeout=30)
        wait_for(lambda: read_lease(leader.path) is not None, "the first lease")
        assert main(["promote", str(tmp_path / "F")]) == 2           # no secret
        assert "secret" in capsys.readouterr().err
        monkeypatch.setenv("LOGKIT_REPLICATION_SECRET", secret)
        assert main(["promote", str(tmp_path / "F")]) == 1           # the lease is held
        assert "valid" in capsys.readouterr().err
        leader._lease.close()                                        # a clean stop
        assert main(["promote", str(tmp_path / "F")]) == 0
        assert "is the leader in leader epoch 1" in capsys.readouterr().out
        assert read_lease(leader.path).holder == follower.follower_id


def test_the_promote_command_unclean(tmp_path, capsys):
    from logkit.cli import main
    with logkit.Broker(tmp_path / "L") as leader:
        leader.create_topic("t", 1)
        produce(leader, 5)
    copy_of(tmp_path / "L", tmp_path / "F")
    os.rename(tmp_path / "L", tmp_path / "gone")
    assert main(["promote", str(tmp_path / "F")]) == 1
    assert "--unclean" in capsys.readouterr().err
    assert main(["promote", str(tmp_path / "F"), "--unclean"]) == 0
    with logkit.Broker(tmp_path / "F") as new_leader:
        assert new_leader.topic("t").partition(0).leader_epoch == 1


# ---- the fault test: the leader SIGKILLed at random moments, acks="all" ---------------

KILLS = int(os.environ.get("LOGKIT_FAILOVER_KILLS",
                           1000 if os.environ.get("LOGKIT_SLOW") == "1" else 20))


class Node:
    """One replica process (failover_proc.py node) and the lines it printed."""

    def __init__(self, root, source, writer_id):
        import queue
        import threading
        self.root, self.writer_id = root, writer_id
        self.proc = subprocess.Popen(
            [sys.executable, HELPER, "node", str(root), str(source or "-"), writer_id,
             "gate"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
            env={**os.environ, "PYTHONPATH": ROOT_DIR})
        self.lines = queue.Queue()
        self.acked = {}                                 # offset -> value
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self):
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def _take(self, line):
        parts = line.split()
        if len(parts) == 2 and parts[0].isdigit() and parts[1].isdigit():
            self.acked[int(parts[0])] = b"%s-%s" % (self.writer_id.encode(),
                                                     parts[1].encode())
        return parts

    def expect(self, word, timeout_s=60.0):
        """Wait for the line starting with `word` (taking acked lines on the way)."""
        import queue
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"{self.root}: no {word!r} line in time") from None
            assert line is not None, f"{self.root} exited ({self.proc.wait()}) before " \
                f"{word!r}"
            parts = self._take(line)
            if parts and parts[0] == word:
                return parts[1:]
            assert not parts or parts[0] in ("ready", "first", "leading", "following") \
                or len(parts) == 2 and parts[0].isdigit(), line

    def acked_count(self):
        import queue
        while True:
            try:
                line = self.lines.get_nowait()
            except queue.Empty:
                return len(self.acked)
            if line is None:
                raise AssertionError(f"{self.root} exited ({self.proc.wait()})")
            self._take(line)

    def send(self, line):
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def kill(self):
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)
        self._reader.join(timeout=30)
        while True:
            line = self.lines.get()
            if line is None:
                break
            self._take(line)                           # a line cut by the kill: dropped

    def stop(self):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=30)
        self.proc.stdin.close()
        self.proc.stdout.close()


def _records_from(root, offset):
    """The records of t-0 from `offset` on (past the high watermark too), and the
    partition checked whole; returns (records, log end offset)."""
    from logkit.topic import Partition
    with logkit.Broker(root, read_only=True) as b:
        p = b.topic("t").partition(0)
        p.check()
        out, end = [], Partition.log_end_offset.fget(p)
        while offset < end:
            got = Partition.read(p, offset, 5000, stop_offset=end)
            out += [(r.offset, r.value) for r in got]
            offset = got[-1].offset + 1
        return out, end


def _same_prefix(follower_root, leader_root):
    """Every segment file of the follower is a byte prefix of the leader's (equal for
    rolled segments): the copy holds the new leader's history and nothing else."""
    fdir, ldir = os.path.join(follower_root, "t-0"), os.path.join(leader_root, "t-0")
    names = sorted(n for n in os.listdir(fdir) if n.endswith(".log"))
    assert names
    for name in names:
        with open(os.path.join(fdir, name), "rb") as f:
            mine = f.read()
        with open(os.path.join(ldir, name), "rb") as f:
            theirs = f.read()
        assert theirs[:len(mine)] == mine, name
        if name != names[-1]:
            assert theirs == mine, name


@pytest.mark.timeout(max(300, 10 * KILLS))
def test_the_leader_sigkilled_at_random_moments_loses_no_acknowledged_record(tmp_path):
    """Two replica processes, acks="all", min.insync.replicas=2, replication factor 2,
    lease TTL 1 s. Each round: the leader is SIGKILLed after a random number of
    acknowledged records (every third round with the follower SIGSTOPped first and
    resumed once the lease lapsed, so the old leader keeps an unacknowledged tail the
    new one never copied); the follower promotes itself; every acknowledged record is on
    the new leader exactly once at its offset and its files pass check(); the old
    leader, restarted, refuses a write, rejoins as a follower, drops its divergent tail
    and becomes a byte prefix of the new leader (the next round kills that leader)."""
    import random
    rng = random.Random(int(os.environ.get("LOGKIT_FAILOVER_SEED", "0")) or None)
    roots = [tmp_path / "A", tmp_path / "B"]
    nodes = [Node(roots[0], None, "w0"), Node(roots[1], roots[0], "w1")]
    divergent, standby, tenure = 0, None, 0
    try:
        nodes[0].send("go")
        nodes[0].expect("leading")
        nodes[1].send("go")
        nodes[1].expect("following")
        for kill_round in range(KILLS):
            leader, follower = nodes
            standby = Node(leader.root, follower.root, f"w{kill_round + 2}")  # ahead:
            wanted = rng.randint(1, 100)
            wait_for(lambda: leader.acked_count() >= wanted, "acknowledged records", 60)
            if kill_round == 0:
                wait_for(lambda: read_lease(leader.root) is not None, "the first lease")
            time.sleep(rng.uniform(0, 0.1))
            paused = kill_round % 3 == 2
            if paused:                  # the follower stops copying: the leader appends
                follower.proc.send_signal(signal.SIGSTOP)   # records it cannot ack
                time.sleep(0.05)
            leader.kill()
            if paused:                  # resumed after the lease lapsed: it promotes
                lease = read_lease(leader.root)             # without the unacked tail
                time.sleep(max(0.0, lease.expires_ms / 1000 - time.time()) + 0.05)
                follower.proc.send_signal(signal.SIGCONT)
            follower.expect("promoted")
            # the killed leader wrote only from `tenure` on (its values are its own)
            records, promoted_end = _records_from(follower.root, tenure)
            where = {value: offset for offset, value in records}
            assert len(where) == len(records), "a record stored twice"
            for offset, value in leader.acked.items():
                assert where.get(value) == offset, (kill_round, offset, value)
            tenure = promoted_end
            follower.send("lead")
            follower.expect("leading")
            rejoined = standby                       # the round's cost is the kill
            rejoined.expect("ready")
            rejoined.send("go")
            old_end = int(rejoined.expect("refused")[0])
            divergent += old_end > promoted_end
            rejoined.expect("following")
            _same_prefix(rejoined.root, follower.root)
            leader.stop()
            nodes = [follower, rejoined]
            standby = None
    finally:
        if standby is not None:
            standby.stop()
        for node in nodes:
            node.stop()
    print(f"{KILLS} kills, {divergent} with a divergent unacknowledged tail dropped")


def test_a_leader_killed_mid_update_of_its_tail_is_still_replaced(tmp_path):
    """A leader killed with its tail state torn (the sequence number odd) leaves a
    partition that a read-only DirectorySource cannot read (only a read-write open
    repairs it); the follower still promotes itself, judging the ISR by the leader's
    log end as it last read it."""
    import struct
    old_path, new_path = tmp_path / "L", tmp_path / "F"
    writer = start("lead", old_path, 1000, "w")
    follower = logkit.Follower(new_path, logkit.DirectorySource(old_path), config=FAST)
    follower.start()
    try:
        wait_for(lambda: read_lease(old_path) is not None, "the leader's first lease")
        wait_for(lambda: sum(follower.log_end_offsets().values()) > 50, "copying")
        writer.send_signal(signal.SIGSTOP)
        with open(old_path / "t-0" / "logkit.tail", "r+b") as f:
            f.seek(8)
            seq = struct.unpack("<Q", f.read(8))[0]
            f.seek(8)
            f.write(struct.pack("<Q", seq | 1))          # a writer mid-update
        out = kill(writer)
        assert follower.promoted.wait(30), follower.error
    finally:
        follower.stop()
    acked = acked_lines(out, b"w")
    with logkit.Broker(new_path) as new_leader:
        p = new_leader.topic("t").partition(0)
        p.check()
        values = {r.offset: r.value for r in p.read(0, max_records=10 ** 6)}
        assert values and all(acked[o] == v for o, v in values.items() if o in acked)


def test_an_object_store_follower_promotes_itself_by_its_own_progress(tmp_path):
    """Through an object store the leader's ISR cannot be read: a running follower that
    is caught up by its own progress promotes itself once the store's lease lapses."""
    config = {**FAST, "ship.interval.ms": 50}
    url = (tmp_path / "store").as_uri()
    with logkit.Broker(tmp_path / "L", config=config) as leader:
        leader.create_topic("t", 1)
        produce(leader, 20)
        shipper = leader.ship(url)
        shipper.flush()
        follower = logkit.Follower(tmp_path / "F", logkit.ObjectStoreSource(url),
                                   config=config)
        follower.start()
        follower.catch_up(timeout=30)
        wait_for(lambda: follower.source.lease() is not None, "the store's lease")
        assert not follower.promoted.is_set()
        shipper.close()                              # a clean stop releases the lease
    assert follower.promoted.wait(30), follower.error
    follower.stop()
    with logkit.Broker(tmp_path / "F") as new_leader:
        p = new_leader.topic("t").partition(0)
        assert p.leader_epoch == 1 and p.log_end_offset == 20
