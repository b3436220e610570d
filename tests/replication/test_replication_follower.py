"""logkit.Follower over a DirectorySource, in one process: byte-identical copies, topics,
configs and committed offsets, retention, promotion, a stale leader rejoining, refused
batches, and the lifecycle (start/stop/run/catch_up, one follower per directory)."""

from __future__ import annotations

import filecmp
import os
import threading

import pytest

import logkit
from logkit.leader.epochs import EpochEntry, read_checkpoint

SMALL = {"segment.bytes": 4096}


def produce(broker, topic, count, *, prefix=b"v", key_mod=7, pad=0):
    producer = broker.producer(linger_ms=0)
    for i in range(count):
        producer.send(topic, prefix + b"%d" % i + b"." * pad, key=b"k%d" % (i % key_mod))
    producer.flush()
    producer.close()


def assert_same_files(leader_partition, follower_partition, *, skip_first=False):
    """Every .log segment the two share is equal byte for byte; the follower has no
    segment the leader lacks above its first, and passes check()."""
    mine = sorted(n for n in os.listdir(follower_partition.directory) if n.endswith(".log"))
    theirs = sorted(n for n in os.listdir(leader_partition.directory) if n.endswith(".log"))
    assert mine and set(mine[1:]) <= set(theirs)
    for name in mine[1:] if skip_first else mine:
        assert filecmp.cmp(os.path.join(leader_partition.directory, name),
                           os.path.join(follower_partition.directory, name),
                           shallow=False), name
    follower_partition.check()


@pytest.fixture
def leader(tmp_path):
    with logkit.Broker(tmp_path / "leader") as b:
        yield b


def test_a_follower_copies_every_partition_byte_for_byte(leader, tmp_path):
    topic = leader.create_topic("orders", 3, config=SMALL)
    produce(leader, "orders", 1500)
    with logkit.Follower(tmp_path / "f", logkit.DirectorySource(leader.path)) as follower:
        follower.catch_up(timeout=30)
        produce(leader, "orders", 300, prefix=b"w")          # while it runs
        follower.catch_up(timeout=30)
        ends = follower.log_end_offsets()
    assert ends == {p.topic_partition: p.log_end_offset for p in topic.partitions}
    with logkit.Broker(tmp_path / "f", read_only=True) as copy:
        for p in topic.partitions:
            q = copy.topic("orders").partition(p.partition)
            assert q.segment_base_offsets() == p.segment_base_offsets()
            assert len(q.segment_base_offsets()) > 1             # rolled at least once
            assert_same_files(p, q)
            assert read_checkpoint(q.directory) == [EpochEntry(0, 0)]
            assert [r.value for r in q.read(0, max_records=5000)] == \
                [r.value for r in p.read(0, max_records=5000)]


def test_topics_configs_and_committed_offsets_follow_the_leader(leader, tmp_path):
    leader.create_topic("a", 2, config={"retention.ms": 3600000, "segment.bytes": 8192})
    leader.create_topic("b", 1)
    produce(leader, "a", 50)
    consumer = leader.consumer("a", group_id="billing", auto_offset_reset="earliest",
                               enable_auto_commit=False)
    seen = 0
    while seen < 20:
        seen += len(consumer.poll(timeout_ms=200, max_records=10))
    consumer.commit()
    consumer.close()
    committed = leader.group("billing").committed()
    assert committed
    follower = logkit.Follower(tmp_path / "f", logkit.DirectorySource(leader.path))
    follower.catch_up(timeout=30)                    # not started: it drives the copy
    with logkit.Broker(tmp_path / "f", read_only=True) as copy:
        assert copy.topics() == ["a", "b"]
        assert copy.topic("a").num_partitions == 2
        assert copy.topic("a").config["retention.ms"] == 3600000
        assert copy.topic("a").config["segment.bytes"] == 8192
        assert copy.group("billing").committed() == committed
    # changes on the leader: a config, a commit, a new topic, a deleted topic
    leader.alter_topic_config("a", {"retention.ms": None, "max.message.bytes": 20000})
    leader.group("billing").reset_offsets({logkit.TopicPartition("a", 0): 3})
    leader.create_topic("c", 1)
    leader.delete_topic("b")
    follower.catch_up(timeout=30)
    with logkit.Broker(tmp_path / "f", read_only=True) as copy:
        assert copy.topics() == ["a", "c"]
        config = copy.topic("a").config
        assert config["retention.ms"] == 604800000 and config["max.message.bytes"] == 20000
        assert copy.group("billing").committed()[logkit.TopicPartition("a", 0)] == 3


def test_a_consumer_group_goes_on_from_its_commit_on_the_promoted_copy(leader, tmp_path):
    leader.create_topic("t", 1)
    produce(leader, "t", 100, key_mod=1)
    consumer = leader.consumer("t", group_id="g", auto_offset_reset="earliest",
                               enable_auto_commit=False)
    got = []
    while len(got) < 40:
        got += consumer.poll(timeout_ms=200, max_records=40 - len(got))
    consumer.commit()
    consumer.close()
    follower = logkit.Follower(tmp_path / "f", logkit.DirectorySource(leader.path))
    follower.catch_up(timeout=30)
    leader.close()                      # gone: a lease it held is released
    follower.promote()
    with logkit.Broker(tmp_path / "f") as new_leader:
        consumer = new_leader.consumer("t", group_id="g", enable_auto_commit=False)
        rest = []
        while len(rest) < 60:
            rest += consumer.poll(timeout_ms=200)
        consumer.close()
    assert [r.offset for r in got + rest] == list(range(100))
    assert [r.value for r in rest][:1] == [b"v40"]


def test_the_follower_applies_the_leaders_retention(leader, tmp_path):
    topic = leader.create_topic("t", 1, config=SMALL)
    produce(leader, "t", 600, key_mod=1, pad=100)
    p = topic.partition(0)
    with logkit.Follower(tmp_path / "f", logkit.DirectorySource(leader.path)) as follower:
        follower.catch_up(timeout=30)
        bases = p.segment_base_offsets()
        p.increase_log_start_offset(bases[3] + 1)      # what retention.bytes/ms would do
        produce(leader, "t", 10, key_mod=1)
        follower.catch_up(timeout=30)
    with logkit.Broker(tmp_path / "f", read_only=True) as copy:
        q = copy.topic("t").partition(0)
        assert q.log_start_offset == p.log_start_offset == bases[3] + 1
        assert q.segment_base_offsets() == p.segment_base_offsets()
        assert_same_files(p, q)


def test_a_follower_started_after_retention_begins_at_the_leaders_log_start(leader, tmp_path):
    topic = leader.create_topic("t", 1, config=SMALL)
    produce(leader, "t", 500, key_mod=1, pad=100)
    p = topic.partition(0)
    p.increase_log_start_offset(p.segment_base_offsets()[2] + 5)   # inside a segment
    follower = logkit.Follower(tmp_path / "f", logkit.DirectorySource(leader.path))
    follower.catch_up(timeout=30)
    with logkit.Broker(tmp_path / "f", read_only=True) as copy:
        q = copy.topic("t").partition(0)
        assert q.log_start_offset == p.log_start_offset
        assert q.log_end_offset == p.log_end_offset
        assert_same_files(p, q, skip_first=True)


def test_promote_takes_the_next_epoch_and_the_directory_opens_as_the_leader(leader,
                                                                            tmp_path):
    leader.create_topic("t", 2)
    produce(leader, "t", 200)
    follower = logkit.Follower(tmp_path / "f", logkit.DirectorySource(leader.path))
    with follower:
        follower.catch_up(timeout=30)
    leader.close()                      # gone: a lease it held is released
    follower.promote()
    with logkit.Broker(tmp_path / "f") as new_leader:
        for q in new_leader.topic("t").partitions:
            end = q.log_end_offset
            assert read_checkpoint(q.directory) == [EpochEntry(0, 0), EpochEntry(1, end)]
            assert q.leader_epoch == 1
            q.append([(None, b"new", None, None)])
            assert q.batch_headers(end)[-1].leader_epoch == 1
            q.check()


def test_a_stale_leader_rejoins_by_truncating_where_the_epochs_part(tmp_path):
    """KIP-101/279 with real directories: A leads, B copies and is promoted; A (not
    told) writes on in epoch 0, B writes in epoch 1. A follows B: its unreplicated tail
    goes, and then it is a byte-identical copy of B."""
    a_path, b_path = tmp_path / "a", tmp_path / "b"
    with logkit.Broker(a_path, background=False) as a:    # keeps no lease: not told
        a.create_topic("t", 1, config=SMALL)
        produce(a, "t", 300, key_mod=1)
        follower = logkit.Follower(b_path, logkit.DirectorySource(a_path))
        follower.catch_up(timeout=30)
        follower.promote()
        common = a.topic("t").partition(0).log_end_offset
        produce(a, "t", 120, prefix=b"stale", key_mod=1)       # never acknowledged by B
        stale_end = a.topic("t").partition(0).log_end_offset
    with logkit.Broker(b_path) as b:
        produce(b, "t", 50, prefix=b"new", key_mod=1)
        b_end = b.topic("t").partition(0).log_end_offset
    rejoin = logkit.Follower(a_path, logkit.DirectorySource(b_path))
    rejoin.catch_up(timeout=30)
    with logkit.Broker(a_path, read_only=True) as a, logkit.Broker(b_path, read_only=True) as b:
        pa, pb = a.topic("t").partition(0), b.topic("t").partition(0)
        assert stale_end > common and pa.log_end_offset == b_end
        values = [r.value for r in pa.read(0, max_records=10000)]
        assert not any(v.startswith(b"stale") for v in values)
        assert values == [r.value for r in pb.read(0, max_records=10000)]
        assert read_checkpoint(pa.directory) == [EpochEntry(0, 0), EpochEntry(1, common)]
        assert_same_files(pb, pa)


def test_a_directory_with_another_history_is_refused(tmp_path):
    """Two independent leaders with the same topic: the copy would mix histories, so
    the follower stops with IllegalStateError instead of appending."""
    with logkit.Broker(tmp_path / "x") as x, logkit.Broker(tmp_path / "y") as y:
        x.create_topic("t", 1)
        y.create_topic("t", 1)
        produce(x, "t", 10, prefix=b"x", key_mod=1)
        produce(y, "t", 30, prefix=b"y", key_mod=1)
    follower = logkit.Follower(tmp_path / "x", logkit.DirectorySource(tmp_path / "y"))
    with pytest.raises(logkit.IllegalStateError, match="another history"):
        follower.catch_up(timeout=30)
    with logkit.Broker(tmp_path / "x", read_only=True) as x:
        assert [r.value for r in x.topic("t").partition(0).read(0)][:1] == [b"x0"]


class FlippingSource(logkit.DirectorySource):
    """A directory source whose fetches come back with one bit flipped (a transport
    fault), `times` times, then clean."""

    def __init__(self, path, times):
        super().__init__(path)
        self.times = times

    def fetch(self, topic, partition, offset, *, max_bytes):
        data = super().fetch(topic, partition, offset, max_bytes=max_bytes)
        if data and self.times:
            self.times -= 1
            flipped = bytearray(data)
            flipped[len(flipped) // 2] ^= 0x04
            return bytes(flipped)
        return data


def test_a_bit_flipped_fetch_is_refused_then_fetched_again(leader, tmp_path):
    leader.create_topic("t", 1)
    produce(leader, "t", 50, key_mod=1)
    follower = logkit.Follower(tmp_path / "f", FlippingSource(leader.path, times=2))
    follower.catch_up(timeout=30)
    with logkit.Broker(tmp_path / "f", read_only=True) as copy:
        q = copy.topic("t").partition(0)
        q.check()
        assert [r.value for r in q.read(0, max_records=100)] == \
            [b"v%d" % i for i in range(50)]


def test_a_source_that_keeps_flipping_stops_the_follower_with_corrupt_record_error(
        leader, tmp_path):
    leader.create_topic("t", 1)
    produce(leader, "t", 50, key_mod=1)
    follower = logkit.Follower(tmp_path / "f", FlippingSource(leader.path, times=10 ** 6))
    follower.start()
    try:
        with pytest.raises(logkit.CorruptRecordError, match="CRC"):
            follower.catch_up(timeout=30)
        assert isinstance(follower.error, logkit.CorruptRecordError)
    finally:
        follower.stop()
    with logkit.Broker(tmp_path / "f", read_only=True) as copy:
        q = copy.topic("t").partition(0)
        assert q.log_end_offset == 0
        q.check()


def test_one_follower_per_directory_and_stop_releases_it(leader, tmp_path):
    leader.create_topic("t", 1)
    first = logkit.Follower(tmp_path / "f", logkit.DirectorySource(leader.path))
    second = logkit.Follower(tmp_path / "f", logkit.DirectorySource(leader.path))
    first.start()
    try:
        with pytest.raises(logkit.IllegalStateError, match="another Follower"):
            second.start()
    finally:
        first.stop()
        first.stop()                                    # idempotent
    second.start()
    second.catch_up(timeout=30)
    second.stop()
    assert first.follower_id == second.follower_id     # kept in follower.json


def test_run_in_the_foreground_until_stop(leader, tmp_path):
    leader.create_topic("t", 1)
    produce(leader, "t", 20, key_mod=1)
    follower = logkit.Follower(tmp_path / "f", logkit.DirectorySource(leader.path),
                               config={"replica.fetch.wait.max.ms": 50})
    runner = threading.Thread(target=follower.run)
    runner.start()
    try:
        follower.catch_up(timeout=30)
    finally:
        follower.stop()
        runner.join(timeout=30)
    assert not runner.is_alive()
    assert follower.log_end_offsets() == {logkit.TopicPartition("t", 0): 20}


class DownSource(logkit.DirectorySource):
    """A directory source whose leader answers metadata but no fetch (it is down)."""

    def fetch(self, topic, partition, offset, *, max_bytes):
        raise logkit.StorageError("the leader is down", operation="fetch", path=self.path)


def test_catch_up_times_out_naming_what_lags_and_the_last_error(leader, tmp_path):
    leader.create_topic("t", 1)
    produce(leader, "t", 5, key_mod=1)
    follower = logkit.Follower(tmp_path / "f", DownSource(leader.path),
                               config={"replica.fetch.backoff.ms": 10})
    with pytest.raises(logkit.LogkitTimeoutError, match="t-0 at 0 of 5.*the leader is down"):
        follower.catch_up(timeout=1)
    with follower:                                  # the same, with the thread running
        with pytest.raises(logkit.LogkitTimeoutError, match="the leader is down"):
            follower.catch_up(timeout=1)
        assert follower.running and follower.error is None



class UnreadableSource(logkit.DirectorySource):
    """A directory source whose leader cannot even say where its logs end."""

    def partition(self, topic, partition):
        raise logkit.StorageError("the leader's tail needs recovery", operation="read",
                                  path=self.path)


def test_catch_up_times_out_when_the_leaders_ends_cannot_be_read(leader, tmp_path):
    leader.create_topic("t", 1)
    follower = logkit.Follower(tmp_path / "f", UnreadableSource(leader.path),
                               config={"replica.fetch.backoff.ms": 10})
    with pytest.raises(logkit.LogkitTimeoutError, match="could not be read.*needs recovery"):
        follower.catch_up(timeout=0.5)


def test_follower_rejects_a_source_that_is_not_one(tmp_path):
    with pytest.raises(logkit.ConfigError, match="ReplicaSource"):
        logkit.Follower(tmp_path / "f", str(tmp_path / "leader"))
    with pytest.raises(logkit.ConfigError, match="replica.fetch.max.bytes"):
        logkit.Follower(tmp_path / "f", logkit.DirectorySource(tmp_path),
                        config={"replica.fetch.max.bytes": 0})


def test_the_follower_reports_its_progress_to_the_leader(leader, tmp_path):
    leader.create_topic("t", 2)
    produce(leader, "t", 30)
    source = logkit.DirectorySource(leader.path)
    follower = logkit.Follower(tmp_path / "f", source)
    follower.catch_up(timeout=30)
    progress = logkit.DirectorySource(leader.path).progress()
    assert list(progress) == [follower.follower_id]
    ends = progress[follower.follower_id]["log_end_offsets"]
    assert ends == {f"t-{p.partition}": p.log_end_offset
                    for p in leader.topic("t").partitions}


def test_the_replication_example_runs(tmp_path):
    """examples/replication.py: billing goes on after the failover from its commit, and
    the new leader's first write carries epoch 1."""
    import importlib.util
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(__file__))), "examples",
                        "replication.py")
    spec = importlib.util.spec_from_file_location("replication_example", path)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    result = example.run(str(tmp_path))
    assert sorted(result["billed"] + result["rest"]) == sorted(b"order-%d" % n
                                                               for n in range(10))
    assert result["epoch"] == 1


def test_a_symlink_planted_for_the_follower_state_file_is_refused(leader, tmp_path):
    """The follower's own state file is read without following a link: a link planted
    in its directory is refused by name, never read through."""
    leader.create_topic("orders", 1)
    produce(leader, "orders", 10)
    path = tmp_path / "f"
    with logkit.Follower(path, logkit.DirectorySource(leader.path)) as follower:
        follower.catch_up(timeout=30)
    decoy = tmp_path / "decoy.json"
    decoy.write_text('{"follower_id": "planted"}')
    os.replace(path / "follower.json", tmp_path / "saved.json")
    os.symlink(decoy, path / "follower.json")
    with pytest.raises(logkit.StorageError, match="symbolic link"):
        with logkit.Follower(path, logkit.DirectorySource(leader.path)) as follower:
            follower.catch_up(timeout=30)


def _leave_unpublished_bytes(partition) -> int:
    """What a writer SIGKILLed between its write and its publish leaves: a whole valid
    batch (a copy of the last one) past the committed end of the active segment file.
    Returns the committed file size."""
    base = partition.segment_base_offsets()[-1]
    path = os.path.join(partition.directory, f"{base:020d}.log")
    committed = os.path.getsize(path)
    last = partition.batches_since(partition.log_end_offset - 1, max_bytes=1)
    with open(path, "ab") as f:
        f.write(last)
    assert os.path.getsize(path) > committed
    return committed


def test_unpublished_bytes_a_killed_writer_left_are_cut_under_the_lock(tmp_path):
    """Partition.cut_unpublished: the file ends where the log does again; the log reads
    the same; a second call cuts nothing."""
    with logkit.Broker(tmp_path) as broker:
        broker.create_topic("t", 1)
        produce(broker, "t", 20)
        p = broker.topic("t").partition(0)
        before = [r.value for r in p.read(0, max_records=100)]
        committed = _leave_unpublished_bytes(p)
        assert p.cut_unpublished() > 0
        base = p.segment_base_offsets()[-1]
        assert os.path.getsize(os.path.join(p.directory, f"{base:020d}.log")) == committed
        assert [r.value for r in p.read(0, max_records=100)] == before
        assert p.cut_unpublished() == 0
        # a roll killed after making the next segment's files, before naming it
        dead = os.path.join(p.directory, f"{p.log_end_offset:020d}.log")
        with open(dead, "wb") as f:
            f.write(b"\0" * 100)
        assert p.cut_unpublished() == 100 and not os.path.exists(dead)
        assert p.segment_base_offsets() == [base]
        produce(broker, "t", 3)
        assert [r.value for r in p.read(0, max_records=100)][:20] == before
        p.check()


def test_a_follower_over_a_killed_writers_directory_holds_only_the_log(leader, tmp_path):
    """The directory of a leader killed mid-append (the bytes of an unpublished batch
    past its end) rejoins as a follower of a leader with the same history: once caught
    up, before anything new is copied, its files equal the leader's byte for byte
    (the test of failover found the old leader's file longer than the new one's)."""
    leader.create_topic("t", 1)
    produce(leader, "t", 30)
    with logkit.Follower(tmp_path / "f", logkit.DirectorySource(leader.path)) as follower:
        follower.catch_up(timeout=30)
    with logkit.Broker(tmp_path / "f", background=False) as copy:
        q = copy.topic("t").partition(0)
        _leave_unpublished_bytes(q)
        with open(os.path.join(q.directory, f"{q.log_end_offset + 5:020d}.log"), "wb"):
            pass                                   # and a killed roll's new segment
    with logkit.Follower(tmp_path / "f", logkit.DirectorySource(leader.path)) as follower:
        follower.catch_up(timeout=30)
        with logkit.Broker(tmp_path / "f", read_only=True) as copy:
            assert_same_files(leader.topic("t").partition(0), copy.topic("t").partition(0))
