"""The consumer on a real broker: blocking poll across processes, iteration, positions,
seek/pause, offset reset, auto-commit, bad input."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time

import pytest

import logkit
from logkit import (ClosedError, ConfigError, NoOffsetForPartitionError,
                    OffsetOutOfRangeError, SerializationError, TopicPartition,
                    UnknownTopicError)
from tests.helpers.clients import drain
from tests.helpers.procs import ROOT_DIR

T0 = 1_700_000_000_000             # record timestamps in milliseconds (2023-11-14)


def test_blocking_poll_wakes_on_another_process(tmp_path):
    """poll() blocks until a record produced by another process arrives, then returns it."""
    with logkit.Broker(tmp_path) as broker:
        broker.create_topic("t", 2)
        consumer = broker.consumer("t", auto_offset_reset="latest")
        assert consumer.poll(timeout_ms=0) == []
        child = subprocess.Popen(
            [sys.executable, "-c",
             "import sys, time, logkit\ntime.sleep(0.5)\n"
             "with logkit.Broker(sys.argv[1]) as b:\n"
             "    b.producer().send('t', b'wake', key=b'k').result()", str(tmp_path)],
            env={**os.environ, "PYTHONPATH": ROOT_DIR})
        started = time.monotonic()
        records = consumer.poll(timeout_ms=30_000)
        waited = time.monotonic() - started
        child.wait(timeout=30)
        assert [r.value for r in records] == [b"wake"]
        assert waited < 30                                  # it woke, it did not time out


def test_positions_seek_pause_and_offsets_for_times(broker):
    """seek, seek_to_*, position, pause/resume and offsets_for_times behave like Kafka."""
    broker.create_topic("t", 1)
    producer = broker.producer()
    for i in range(10):
        producer.send("t", b"%d" % i, timestamp_ms=T0 + i)
    producer.flush()
    tp = TopicPartition("t", 0)
    consumer = broker.consumer(group_id="g", auto_offset_reset="earliest")
    consumer.assign([tp])
    assert consumer.position(tp) == 0
    consumer.seek(tp, 7)
    assert [r.offset for r in consumer.poll(timeout_ms=100)] == [7, 8, 9]
    consumer.seek_to_beginning(tp)
    consumer.pause(tp)
    assert consumer.poll(timeout_ms=50) == []
    consumer.resume(tp)
    assert len(consumer.poll(timeout_ms=100)) == 10
    consumer.seek_to_end(tp)
    assert consumer.position(tp) == 10
    found = consumer.offsets_for_times({tp: T0 + 4})
    assert found[tp] == (4, T0 + 4)
    assert consumer.offsets_for_times({tp: T0 + 99999})[tp] is None
    consumer.commit({tp: 5})                        # manual assignment, empty group
    assert consumer.committed(tp) == 5


def test_auto_offset_reset_and_retention(broker):
    """latest starts at the end, none raises, and a position lost to retention resets."""
    topic = broker.create_topic("t", 1, config={"segment.bytes": 2048, "retention.ms": 1,
                                                "file.delete.delay.ms": 0})
    producer = broker.producer()
    for i in range(50):
        producer.send("t", b"x" * 100, timestamp_ms=T0)     # long past retention.ms
    producer.flush()
    assert broker.consumer("t", auto_offset_reset="latest").poll(timeout_ms=100) == []
    with pytest.raises(NoOffsetForPartitionError):
        broker.consumer("t", group_id="n", auto_offset_reset="none").poll(timeout_ms=10)
    consumer = broker.consumer(auto_offset_reset="earliest")
    consumer.assign([TopicPartition("t", 0)])
    consumer.seek(TopicPartition("t", 0), 3)
    broker.enforce_retention()
    assert topic.partition(0).log_start_offset > 3
    producer.send("t", b"fresh").result()
    records = drain(consumer)
    assert records[0].offset == topic.partition(0).log_start_offset


def test_auto_commit(broker):
    """enable_auto_commit commits positions on the interval and on close."""
    broker.create_topic("t", 1)
    producer = broker.producer()
    for i in range(5):
        producer.send("t", b"%d" % i)
    producer.flush()
    consumer = broker.consumer("t", group_id="auto", auto_offset_reset="earliest",
                               auto_commit_interval_ms=1)
    assert len(drain(consumer)) == 5
    assert consumer.committed(TopicPartition("t", 0)) == 5
    consumer.close()


def test_bad_input_raises_named_errors(tmp_path):
    """Unknown topics, bad options, bad offsets and closed clients raise named errors."""
    with logkit.Broker(tmp_path, config={"auto.create.topics.enable": False}) as broker:
        broker.create_topic("t", 1)
        with pytest.raises(UnknownTopicError):
            broker.consumer("missing")
        with pytest.raises(UnknownTopicError):
            broker.producer().send("missing", b"v")
        with pytest.raises(ConfigError):
            broker.consumer("t", bogus_option=1)
        with pytest.raises(ConfigError):
            broker.consumer("t", auto_offset_reset="sometimes")
        with pytest.raises(ConfigError):
            broker.producer(linger_ms=-1)
        with pytest.raises(ConfigError):
            broker.producer(compression_type="rar")
        with pytest.raises(logkit.IllegalStateError):
            broker.consumer().poll(timeout_ms=0)         # neither subscribed nor assigned
        with pytest.raises(UnknownTopicError):
            broker.consumer().assign([TopicPartition("t", 5)])
        consumer = broker.consumer("t")
        with pytest.raises(OffsetOutOfRangeError):
            consumer.seek(TopicPartition("t", 0), -1)
        with pytest.raises(logkit.IllegalStateError):
            consumer.seek(TopicPartition("other", 0), 1)
        with pytest.raises(logkit.IllegalStateError):
            consumer.commit()                              # no group_id
        consumer.close()
        consumer.close()
        with pytest.raises(ClosedError):
            consumer.poll()
        producer = broker.producer()
        producer.close()
        with pytest.raises(ClosedError):
            producer.send("t", b"v")


def test_groups_are_pub_sub_and_members_share_the_work(broker):
    """Each group receives every record; within one group the members split them."""
    broker.create_topic("t", 4)
    producer = broker.producer()
    for i in range(200):
        producer.send("t", b"%d" % i, key=b"%d" % i)
    producer.close()
    expected = sorted(b"%d" % i for i in range(200))
    for group in ("billing", "audit"):
        consumer = broker.consumer("t", group_id=group, auto_offset_reset="earliest")
        assert sorted(r.value for r in drain(consumer)) == expected
        consumer.close()
    a = broker.consumer("t", group_id="shared", auto_offset_reset="earliest",
                        enable_auto_commit=False)
    b = broker.consumer("t", group_id="shared", auto_offset_reset="earliest",
                        enable_auto_commit=False)
    got_a, got_b = [], []
    deadline = time.monotonic() + 20
    while len(got_a) + len(got_b) < 200 and time.monotonic() < deadline:
        got_a += a.poll(timeout_ms=20)
        got_b += b.poll(timeout_ms=20)
    assert got_a and got_b
    assert sorted(r.value for r in got_a + got_b) == expected        # complete, no twice
    assert not {r.partition for r in got_a} & {r.partition for r in got_b}


def test_iteration_ends_after_consumer_timeout_ms(broker):
    """`for record in consumer` blocks for data and ends after consumer_timeout_ms."""
    broker.create_topic("t", 2)
    producer = broker.producer(value_serializer=str.encode)
    for i in range(30):
        producer.send("t", str(i), partition=i % 2)
    producer.flush()
    consumer = broker.consumer("t", auto_offset_reset="earliest", consumer_timeout_ms=300,
                               value_deserializer=bytes.decode)
    values = [record.value for record in consumer]
    assert sorted(values, key=int) == [str(i) for i in range(30)]


def test_a_refused_auto_commit_is_logged_and_polling_goes_on(broker, caplog):
    """Auto-commit is best effort, as Kafka's: a manually assigned consumer whose group
    has an active member cannot commit (CommitFailedError); poll() still returns its
    records, and the refusal is logged on logkit.coordinator instead of raised or lost."""
    broker.create_topic("t", 1)
    producer = broker.producer()
    for i in range(3):
        producer.send("t", b"%d" % i)
    producer.flush()
    member = broker.consumer("t", group_id="g")             # the group is not empty
    manual = broker.consumer(group_id="g", auto_offset_reset="earliest",
                             auto_commit_interval_ms=1)
    manual.assign([TopicPartition("t", 0)])
    time.sleep(0.01)                                       # the interval has passed
    with caplog.at_level(logging.DEBUG, logger="logkit.coordinator"):
        assert [r.value for r in manual.poll(timeout_ms=1000)] == [b"0", b"1", b"2"]
    assert any("refused" in r.getMessage() and "active members" in r.getMessage()
               for r in caplog.records if r.name == "logkit.coordinator")
    assert manual.committed(TopicPartition("t", 0)) is None
    manual.close(autocommit=False)
    member.close()


def test_consumer_options_come_from_the_settings_table(broker):
    """The consumer's options and defaults are the table's "consumer" rows; a dotted
    Kafka name is refused with the keyword to write."""
    from logkit.config import TABLE
    broker.create_topic("t", 1)
    consumer = broker.consumer("t", max_poll_records="7", partition_assignment_strategy=[
        "roundrobin", "range"])
    assert consumer.config["max_poll_records"] == 7
    assert set(consumer.config) == {key for key, row in TABLE["consumer"].items()
                                    if row.status != "refused"}
    consumer.close()
    with pytest.raises(ConfigError, match="write the keyword group_id="):
        broker.consumer("t", **{"group.id": "g"})
    with pytest.raises(ConfigError, match="partition_assignment_strategy"):
        broker.consumer("t", partition_assignment_strategy=["range", "fastest"])


def _strict_decode(data: bytes) -> str:
    """A deserializer that refuses b"bad" (as a schema'd one refuses foreign bytes)."""
    if data == b"bad":
        raise ValueError("not a record of ours")
    return data.decode()


def test_an_undecodable_record_stops_poll_there_until_seek_moves_past_it(broker):
    """docs/design.md §11 across partitions: poll() returns the records before an undecodable
    one, then every poll raises SerializationError (topic, partition, offset, the
    deserializer's error as its cause) with the position left on it — commit() stores
    that position, pausing the partition lets the others flow — until seek() moves past;
    then every other record arrives exactly once."""
    broker.create_topic("t", 2)
    producer = broker.producer()
    for partition, values in ((0, [b"a0", b"a1", b"bad", b"a3"]), (1, [b"b0", b"b1"])):
        for value in values:
            producer.send("t", value, partition=partition)
    producer.flush()
    tp0, tp1 = TopicPartition("t", 0), TopicPartition("t", 1)
    consumer = broker.consumer("t", group_id="g", auto_offset_reset="earliest",
                               enable_auto_commit=False, value_deserializer=_strict_decode)
    seen = consumer.poll(timeout_ms=1000)
    assert [r.value for r in seen if r.partition == 0] == ["a0", "a1"]
    for _ in range(2):                                  # raised again, not once
        with pytest.raises(SerializationError, match="value deserializer") as raised:
            consumer.poll(timeout_ms=100)
        error = raised.value
        assert (error.topic, error.partition, error.offset) == ("t", 0, 2)
        assert isinstance(error.__cause__, ValueError)
        assert consumer.position(tp0) == 2
    consumer.commit()
    assert consumer.committed(tp0) == 2                 # at-least-once: not past it
    producer.send("t", b"b2", partition=1).result(timeout=10)
    with pytest.raises(SerializationError):             # partition 0 first, always
        consumer.poll(timeout_ms=100)
    consumer.pause(tp0)
    flowed = drain(consumer, idle_ms=100)
    assert (1, 2, "b2") in [(r.partition, r.offset, r.value) for r in flowed]
    seen += flowed
    consumer.resume(tp0)
    with pytest.raises(SerializationError):
        consumer.poll(timeout_ms=100)
    consumer.seek(tp0, 3)
    seen += drain(consumer, idle_ms=100)
    assert sorted((r.partition, r.offset, r.value) for r in seen) == [
        (0, 0, "a0"), (0, 1, "a1"), (0, 3, "a3"), (1, 0, "b0"), (1, 1, "b1"),
        (1, 2, "b2")]
    assert consumer.position(tp0) == 4 and consumer.position(tp1) == 3
    consumer.close()


def test_an_undecodable_key_raises_while_iterating_after_the_records_before_it(broker):
    """The key deserializer's failure takes the same path, and iteration yields the
    records before the undecodable one, then raises."""
    broker.create_topic("t", 1)
    producer = broker.producer()
    for key in (b"k0", b"k1", b"bad"):
        producer.send("t", b"v", key=key)
    producer.flush()
    consumer = broker.consumer("t", auto_offset_reset="earliest", consumer_timeout_ms=2000,
                               key_deserializer=_strict_decode)
    keys = []
    with pytest.raises(SerializationError, match="key deserializer") as raised:
        for record in consumer:
            keys.append(record.key)
    assert keys == ["k0", "k1"] and raised.value.offset == 2
    assert consumer.position(TopicPartition("t", 0)) == 2
    consumer.close()


def test_a_consumer_of_a_missing_topic_warns_that_it_was_auto_created(broker, caplog):
    """Kafka's default auto-creates a topic a consumer names; a misspelt name would poll
    [] for ever, so the broker logs a WARNING naming the topic it created."""
    broker.create_topic("orders", 1)
    with caplog.at_level(logging.WARNING, logger="logkit.broker"):
        consumer = broker.consumer("ordres", group_id="g")
        assert consumer.poll(timeout_ms=10) == []
        consumer.close()
    created = [r for r in caplog.records if "auto-created topic 'ordres'" in r.getMessage()]
    assert len(created) == 1
    assert "ordres" in broker.topics()
    with caplog.at_level(logging.WARNING, logger="logkit.broker"):
        caplog.clear()
        broker.consumer("orders", group_id="g2").close()     # an existing topic: quiet
    assert not [r for r in caplog.records if "auto-created" in r.getMessage()]
