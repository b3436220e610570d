"""An altered topic config takes effect in the brokers that have the topic open (Kafka's
dynamic topic configs): at once in the process that alters it, within the background
thread's period in another process, for retention, rolls (through the C appender),
compaction, keyless refusal and the batch size limit."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

import logkit
from logkit.errors import InvalidRecordError, RecordTooLargeError
from tests.helpers.procs import ROOT_DIR

HOUR_MS = 3600_000
DEADLINE_S = 20.0


def wait_for(predicate, what, deadline_s=DEADLINE_S):
    """Poll `predicate` until it holds, else fail after `deadline_s` naming `what`."""
    end = time.monotonic() + deadline_s
    while not predicate():
        if time.monotonic() > end:
            pytest.fail(f"not within {deadline_s} s: {what}")
        time.sleep(0.02)


def log_sizes(partition):
    """The sizes of the partition's segment files, oldest first."""
    names = sorted(n for n in os.listdir(partition.directory) if n.endswith(".log"))
    return [os.path.getsize(os.path.join(partition.directory, n)) for n in names]


def append_old(partition, batches, *, key=b"k", keys=1):
    """Append `batches` one-record batches stamped an hour ago (old for retention)."""
    old = int(time.time() * 1000) - HOUR_MS
    for n in range(batches):
        partition.append([(key + b"%d" % (n % keys), b"v" * 200, None, old)])


def test_lowered_retention_deletes_old_segments_at_the_next_check_in_the_same_process(
        tmp_path):
    """retention.ms lowered on an open topic: the next retention check uses it."""
    with logkit.Broker(tmp_path, background=False) as broker:
        broker.create_topic("t", 1, config={"segment.bytes": 1024})
        p = broker.topic("t").partition(0)
        append_old(p, 30)
        assert broker.enforce_retention() == 0 and p.log_start_offset == 0
        broker.alter_topic_config("t", {"retention.ms": 60_000})
        assert broker.topic("t").config["retention.ms"] == 60_000
        assert p.config["retention.ms"] == 60_000
        assert broker.enforce_retention() > 0
        assert p.log_start_offset > 0


HOLDER = r"""
import sys, logkit
root = sys.argv[1]
config = {"log.retention.check.interval.ms": 100, "log.flush.scheduler.interval.ms": 50,
          "log.cleaner.enable": False}
with logkit.Broker(root, config=config) as broker:
    partition = broker.topic("t").partition(0)
    print("ready", partition.config["retention.ms"], flush=True)
    sys.stdin.readline()                   # the test says when to go
"""


def test_lowered_retention_reaches_a_second_process_that_has_the_topic_open(tmp_path):
    """A second process's broker opened the topic with the old retention.ms; after this
    process alters it, that broker's background retention deletes the old segments
    (this process runs no retention itself)."""
    with logkit.Broker(tmp_path, background=False) as broker:
        broker.create_topic("t", 1, config={"segment.bytes": 1024})
        p = broker.topic("t").partition(0)
        append_old(p, 30)
        holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(tmp_path)],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                  env={**os.environ, "PYTHONPATH": ROOT_DIR})
        try:
            assert holder.stdout.readline().split() == ["ready", "604800000"]
            assert p.log_start_offset == 0
            broker.alter_topic_config("t", {"retention.ms": 60_000})
            wait_for(lambda: p.log_start_offset > 0,
                     "the other process's retention used the new retention.ms")
            holder.stdin.write("\n")
            holder.stdin.flush()
            assert holder.wait(timeout=30) == 0
        finally:
            if holder.poll() is None:
                holder.kill()
                holder.wait()


WATCHER = r"""
import sys, time, logkit
root = sys.argv[1]
config = {"log.retention.check.interval.ms": 3600000, "log.flush.scheduler.interval.ms": 50,
          "log.cleaner.enable": False}
with logkit.Broker(root, config=config) as broker:
    partition = broker.topic("t").partition(0)
    print("ready", flush=True)
    deadline = time.monotonic() + 20
    while partition.config["segment.bytes"] != 4096 and time.monotonic() < deadline:
        time.sleep(0.01)                    # its own background thread applies it
    print("segment.bytes", partition.config["segment.bytes"], flush=True)
"""


def test_another_process_background_thread_applies_the_change_without_a_retention_check(
        tmp_path):
    """A second process's broker with no retention check due: its background thread
    sees the doorbell's metadata counter move and applies the change within
    log.flush.scheduler.interval.ms, with nothing else in that process asking."""
    with logkit.Broker(tmp_path, background=False) as broker:
        broker.create_topic("t", 1)
        watcher = subprocess.Popen([sys.executable, "-c", WATCHER, str(tmp_path)],
                                   stdout=subprocess.PIPE, text=True,
                                   env={**os.environ, "PYTHONPATH": ROOT_DIR})
        try:
            assert watcher.stdout.readline().split() == ["ready"]
            broker.alter_topic_config("t", {"segment.bytes": 4096})
            assert watcher.stdout.readline().split() == ["segment.bytes", "4096"]
            assert watcher.wait(timeout=30) == 0
        finally:
            if watcher.poll() is None:
                watcher.kill()
                watcher.wait()


def test_lowered_segment_bytes_makes_the_c_appender_roll_at_the_new_size(tmp_path):
    """segment.bytes lowered on an open topic: the armed C appender (made with the old
    size) is dropped, and the appends after the change roll at the new size."""
    with logkit.Broker(tmp_path, background=False) as broker:
        broker.create_topic("t", 1)
        p = broker.topic("t").partition(0)
        for _ in range(40):
            p.append([(b"k", b"v" * 500, None, None)])
        if p._log._appender is None:
            pytest.skip("no C appender in this build")
        assert len(log_sizes(p)) == 1
        broker.alter_topic_config("t", {"segment.bytes": 4096})
        for _ in range(100):
            p.append([(b"k", b"v" * 500, None, None)])
        assert p._log._appender is not None          # armed again, with the new size
        sizes = log_sizes(p)
        assert len(sizes) > 10
        assert all(size <= 4096 for size in sizes[1:-1]), sizes
        p.check()
        assert [r.offset for r in p.read(0, max_records=1000)] == list(range(140))


def test_delete_to_compact_makes_the_background_cleaner_compact_and_back_stops_it(
        tmp_path):
    """cleanup.policy delete -> compact on an open topic: keyless records are refused
    and the background cleaner compacts it; compact -> delete: keyless records are
    taken again and retention deletes its old segments (a compacted topic keeps them)."""
    config = {"log.cleaner.backoff.ms": 50, "log.retention.check.interval.ms": 3600_000}
    with logkit.Broker(tmp_path, config=config) as broker:
        broker.create_topic("t", 1, config={"segment.bytes": 2048})
        p = broker.topic("t").partition(0)
        append_old(p, 60, keys=3)
        appended = 60
        assert len(p.read(0, max_records=1000)) == appended
        broker.alter_topic_config("t", {"cleanup.policy": "compact"})
        with pytest.raises(InvalidRecordError):
            p.append([(None, b"keyless", None, None)])
        wait_for(lambda: len(p.read(0, max_records=1000)) < appended // 2,
                 "the background cleaner compacted the topic")
        survivors = p.read(0, max_records=1000)
        assert {r.key for r in survivors} == {b"k0", b"k1", b"k2"}
        broker.alter_topic_config("t", {"cleanup.policy": "delete", "retention.ms": 60_000})
        p.append([(None, b"keyless", None, None)])
        assert broker.enforce_retention() > 0
        assert p.log_start_offset > 0
        p.check()


def test_a_producer_already_sending_refuses_keyless_records_once_the_topic_compacts(
        tmp_path):
    """An embedded producer that sent to the topic before cleanup.policy became compact
    refuses a keyless send at its next send after the change (its compiled path took
    keyless sends until then), stores none, and takes them again once the topic is
    back to delete; keyed sends go on throughout."""
    with logkit.Broker(tmp_path) as broker:
        broker.create_topic("t", 1)
        producer = broker.producer(linger_ms=0)
        for i in range(50):                   # warm: the compiled path takes these
            producer.send("t", b"v%d" % i)
        producer.flush()
        broker.alter_topic_config("t", {"cleanup.policy": "compact"})
        producer.send("t", b"keyed", key=b"k").result()     # a batch: metadata re-read
        with pytest.raises(InvalidRecordError):
            producer.send("t", b"keyless")
        producer.send("t", b"keyed", key=b"k").result()
        broker.alter_topic_config("t", {"cleanup.policy": "delete"})
        producer.send("t", b"keyed", key=b"k").result()
        producer.send("t", b"keyless again").result()
        producer.close()
        values = [r.value for r in broker.topic("t").partition(0).read(0, max_records=100)]
        assert values[50:] == [b"keyed", b"keyed", b"keyed", b"keyless again"]


def test_raised_max_message_bytes_lets_a_larger_batch_in_at_once(tmp_path):
    """max.message.bytes raised on an open topic: the batch it refused is taken by the
    very next append (the C appender had the old limit)."""
    with logkit.Broker(tmp_path, background=False) as broker:
        broker.create_topic("t", 1, config={"max.message.bytes": 2000})
        p = broker.topic("t").partition(0)
        for _ in range(3):
            p.append([(b"k", b"small", None, None)])
        big = [(b"k", b"v" * 5000, None, None)]
        with pytest.raises(RecordTooLargeError):
            p.append(big)
        broker.alter_topic_config("t", {"max.message.bytes": 100_000})
        assert p.append(big) == 3
        broker.alter_topic_config("t", {"max.message.bytes": None})    # back to default
        assert p.config["max.message.bytes"] == broker.config["message.max.bytes"]


def test_a_partition_first_opened_after_the_change_opens_with_the_new_config(tmp_path):
    """Only partition 0 was open when the config changed: partition 1, opened after,
    has the new values too."""
    with logkit.Broker(tmp_path, background=False) as broker:
        broker.create_topic("t", 2)
        topic = broker.topic("t")
        topic.partition(0).log_end_offset
        broker.alter_topic_config("t", {"retention.ms": 60_000})
        assert topic.partition(1).config["retention.ms"] == 60_000
        assert topic.partition(0).config["retention.ms"] == 60_000


def test_a_read_only_broker_applies_the_change_at_its_next_topic_call(tmp_path):
    """A read-only Broker (inspection) that has the topic open sees the new config the
    next time it asks for the topic, as it sees new partitions."""
    with logkit.Broker(tmp_path, background=False) as broker:
        broker.create_topic("t", 1)
        broker.topic("t").partition(0).append([(b"k", b"v", None, None)])
        with logkit.Broker(tmp_path, read_only=True) as reader:
            p = reader.topic("t").partition(0)
            assert p.config["segment.bytes"] == 1073741824
            broker.alter_topic_config("t", {"segment.bytes": 1 << 20})
            assert reader.topic("t").config["segment.bytes"] == 1 << 20
            assert p.config["segment.bytes"] == 1 << 20
