"""The embedded clients over compacted topics (DESIGN §16): the producer refuses a
keyless record at send(); the consumer reads exactly the survivors of a cleaning pass,
its position moves past the offsets compaction removed (so poll never stalls below the
high watermark and a group's lag reaches zero), and seek() into a removed offset
returns the next survivor."""

from __future__ import annotations

import time

import pytest

import logkit
from logkit.testing import wait_for_no_lag
from tests.helpers.compacted import NO_CLEANER, fill_and_compact, removed_offsets


@pytest.fixture
def broker(tmp_path):
    with logkit.Broker(tmp_path / "data", config=NO_CLEANER) as b:
        yield b


def _read_to_end(consumer, partition, deadline_s=10.0):
    """poll() until the consumer's position reaches the high watermark."""
    tp = partition.topic_partition
    end = partition.high_watermark
    got = []
    deadline = time.monotonic() + deadline_s
    while consumer.position(tp) < end:
        assert time.monotonic() < deadline, \
            f"position stuck at {consumer.position(tp)} below the high watermark {end}"
        got += consumer.poll(timeout_ms=100, max_records=7)
    return [(r.offset, r.key, r.value) for r in got]


@pytest.mark.parametrize("policy", ["compact", "compact,delete"])
def test_a_keyless_send_to_a_compacted_topic_raises_at_the_call(broker, policy):
    """Every form of keyless send (sticky partition, explicit partition, a topic the
    producer has sent to before, a str value) raises InvalidRecordError and writes
    nothing; keyed records and tombstones go through; other topics keep null keys."""
    topic = broker.create_topic("table", 2, config={"cleanup.policy": policy})
    broker.create_topic("plain", 1)
    with broker.producer(linger_ms=0) as producer:
        for attempt in ({}, {"partition": 1}, {}, {"partition": 0}):
            with pytest.raises(logkit.InvalidRecordError, match="needs a key"):
                producer.send("table", b"v", **attempt)
        producer.send("table", b"v", key=b"k").get(timeout=10)
        with pytest.raises(logkit.InvalidRecordError):
            producer.send("table", b"again")         # after a keyed send, too
        producer.send("table", None, key=b"k").get(timeout=10)     # a tombstone
        producer.send("plain", b"no key").get(timeout=10)
    assert sum(p.high_watermark for p in topic.partitions) == 2
    assert all(r.key == b"k" for p in topic.partitions for r in p.read(0))


def test_the_consumer_reads_the_survivors_and_moves_past_the_gaps(broker):
    """A consumer from the log start returns exactly the records the cleaning pass
    kept, in offset order, and its position ends at the high watermark."""
    expected = fill_and_compact(broker, "table", records=200, keys=9, batch=5)[0]
    partition = broker.topic("table").partition(0)
    assert removed_offsets(partition, expected)             # there are gaps
    with broker.consumer(auto_offset_reset="earliest") as consumer:
        consumer.assign([partition.topic_partition])
        assert _read_to_end(consumer, partition) == expected
        assert consumer.position(partition.topic_partition) == partition.high_watermark


def test_poll_does_not_stall_below_the_high_watermark_when_the_rest_was_removed(broker):
    """Every key tombstoned and the tombstones cleaned away: nothing survives, yet one
    poll() moves the position to the high watermark (it used to stay on the first
    removed offset, each poll returning nothing until its timeout)."""
    keys = [b"k%d" % n for n in range(5)]
    expected = fill_and_compact(broker, "gone", records=60, keys=5, unique_every=0,
                                tombstones=keys)[0]
    assert expected == []
    partition = broker.topic("gone").partition(0)
    tp = partition.topic_partition
    assert partition.high_watermark > 60
    with broker.consumer(auto_offset_reset="earliest") as consumer:
        consumer.assign([tp])
        consumer.seek(tp, 0)
        assert consumer.poll(timeout_ms=0) == []
        assert consumer.position(tp) == partition.high_watermark


def test_seek_into_a_removed_offset_returns_the_next_survivor(broker):
    """seek(tp, o) for a removed offset o: the next record polled is the first
    survivor after o (and nothing when none is left)."""
    expected = fill_and_compact(broker, "table", records=150, keys=6, batch=3)[0]
    partition = broker.topic("table").partition(0)
    tp = partition.topic_partition
    with broker.consumer() as consumer:
        consumer.assign([tp])
        for removed in removed_offsets(partition, expected)[::7]:
            consumer.seek(tp, removed)
            following = [row for row in expected if row[0] > removed]
            got = _read_to_end(consumer, partition)
            assert got == following, removed


def test_a_group_reading_a_compacted_topic_commits_to_the_end_with_no_lag(broker):
    """A group member reads every partition of a compacted topic and commits its
    positions: the group's lag is zero (positions past the gaps, at the end)."""
    expected = fill_and_compact(broker, "table", partitions=2, records=80, keys=5)
    with broker.consumer("table", group_id="g", auto_offset_reset="earliest",
                         enable_auto_commit=False) as consumer:
        got = []
        deadline = time.monotonic() + 15
        topic = broker.topic("table")
        while any(consumer.position(p.topic_partition) < p.high_watermark
                  for p in topic.partitions if p.topic_partition in consumer.assignment()) \
                or not consumer.assignment():
            assert time.monotonic() < deadline, "the member did not reach the end"
            got += [(r.partition, r.offset, r.key, r.value)
                    for r in consumer.poll(timeout_ms=100)]
        consumer.commit()
        assert sorted(got) == sorted((p, *row) for p, rows in expected.items()
                                     for row in rows)
        assert set(broker.group("g").lag().values()) == {0}
        wait_for_no_lag(broker, "g", timeout=5)
