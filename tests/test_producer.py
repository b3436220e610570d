"""Producer and consumer behaviour on a real broker: partitioning, batching, futures,
blocking poll across processes, positions, bad input."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import pytest

import logkit
from logkit import (ClosedError, ConfigError, LogkitTimeoutError, NoOffsetForPartitionError,
                    OffsetOutOfRangeError, RecordTooLargeError, TopicPartition,
                    UnknownTopicError)

ROOT_DIR = os.path.dirname(os.path.dirname(__file__))


def drain(consumer, idle_ms=300):
    out = []
    while True:
        batch = consumer.poll(timeout_ms=idle_ms)
        if not batch:
            return out
        out += batch


def test_keyed_records_follow_murmur2_and_keep_order(broker):
    """Keyed records land on Kafka's murmur2 partition, in send order per partition."""
    topic = broker.create_topic("t", 4)
    producer = broker.producer()
    futures = [producer.send("t", b"%d" % i, key=b"key-%d" % (i % 13)) for i in range(500)]
    producer.flush()
    for i, future in enumerate(futures):
        md = future.result(timeout=5)
        assert md.partition == topic.partition_for(b"key-%d" % (i % 13))
    for p in range(4):
        values = [int(r.value) for r in topic.partition(p).read(0, max_records=1000)]
        assert values == sorted(values)
    assert sum(topic.partition(p).log_end_offset for p in range(4)) == 500


def test_sticky_null_keys_fill_a_batch_then_move(broker):
    """Null-key records stick to one partition per batch, then move on."""
    topic = broker.create_topic("t", 3)
    producer = broker.producer(batch_size=2000, linger_ms=60_000)
    metas = [producer.send("t", b"x" * 100) for _ in range(200)]
    producer.flush()
    partitions = [m.result().partition for m in metas]
    runs = 1 + sum(1 for a, b in zip(partitions, partitions[1:]) if a != b)
    assert runs >= 5 and len(set(partitions)) > 1          # moves on...
    assert runs < 200 / 5                                  # ...but in batches
    from logkit.records import read_header
    with open(os.path.join(topic.partition(partitions[0]).directory,
                           "00000000000000000000.log"), "rb") as f:
        data = f.read()
    assert read_header(data, 0, len(data)).records_count > 5


def test_round_robin_partitioner(broker):
    """partitioner='round_robin' spreads null-key records evenly."""
    broker.create_topic("t", 3)
    producer = broker.producer(partitioner="round_robin")
    parts = [producer.send("t", b"v").result().partition for _ in range(9)]
    assert sorted(parts) == [0, 0, 0, 1, 1, 1, 2, 2, 2]


def test_linger_batches_and_futures_callbacks(broker):
    """linger_ms groups sends into one batch; callbacks fire with the metadata."""
    topic = broker.create_topic("t", 1)
    producer = broker.producer(linger_ms=200)
    got = []
    futures = [producer.send("t", b"%d" % i).add_callback(got.append) for i in range(10)]
    assert not futures[0].done()
    producer.flush()
    assert [f.result().offset for f in futures] == list(range(10))
    assert sorted(m.offset for m in got) == list(range(10))
    from logkit.records import read_header
    with open(os.path.join(topic.partition(0).directory, "00000000000000000000.log"),
              "rb") as f:
        data = f.read()
    assert read_header(data, 0, len(data)).records_count == 10


def test_serializers_headers_timestamps_compression(broker):
    """Serializers, headers, explicit timestamps and compression all round-trip."""
    broker.create_topic("t", 1)
    producer = broker.producer(key_serializer=str.encode, value_serializer=str.encode,
                               compression_type="gzip")
    producer.send("t", "hello", key="k", headers=[("h", b"1")], timestamp_ms=12345).result()
    consumer = broker.consumer("t", auto_offset_reset="earliest",
                               key_deserializer=bytes.decode, value_deserializer=bytes.decode)
    [record] = consumer.poll(timeout_ms=1000)
    assert (record.key, record.value, list(record.headers), record.timestamp) == \
        ("k", "hello", [("h", b"1")], 12345)


def test_threads_send_concurrently(broker):
    """Several threads share a producer; every record is stored exactly once."""
    broker.create_topic("t", 3)
    producer = broker.producer(linger_ms=1)

    def work(n):
        for i in range(500):
            producer.send("t", b"%d-%d" % (n, i), key=b"%d" % i)

    threads = [threading.Thread(target=work, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    producer.flush()
    consumer = broker.consumer("t", auto_offset_reset="earliest")
    values = [r.value for r in drain(consumer)]
    assert sorted(values) == sorted(b"%d-%d" % (n, i) for n in range(4) for i in range(500))


def test_producer_limits(broker):
    """max_request_size, topic max.message.bytes and buffer_memory are enforced."""
    broker.create_topic("t", 1, config={"max.message.bytes": 500})
    producer = broker.producer(max_request_size=2000)
    with pytest.raises(RecordTooLargeError):
        producer.send("t", b"x" * 5000)
    future = producer.send("t", b"x" * 1000)          # fits the producer, not the topic
    with pytest.raises(RecordTooLargeError):
        future.result(timeout=5)
    blocked = broker.producer(buffer_memory=1000, batch_size=10**6, linger_ms=10**6,
                              max_block_ms=100)
    blocked.send("t", b"x" * 400)
    blocked.send("t", b"x" * 400)
    with pytest.raises(LogkitTimeoutError):
        blocked.send("t", b"x" * 400)


def test_acks(broker):
    """acks=0 resolves at once with offset -1; acks='all' behaves as 1 without replicas."""
    broker.create_topic("t", 1)
    assert broker.producer(acks=0).send("t", b"v").result().offset == -1
    assert broker.producer(acks="all").send("t", b"v").result().offset >= 0
    with pytest.raises(ConfigError):
        broker.producer(acks=2)


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
        producer.send("t", b"%d" % i, timestamp_ms=1000 + i)
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
    found = consumer.offsets_for_times({tp: 1004})
    assert found[tp] == (4, 1004)
    assert consumer.offsets_for_times({tp: 99999})[tp] is None
    consumer.commit({tp: 5})                        # manual assignment, empty group
    assert consumer.committed(tp) == 5


def test_auto_offset_reset_and_retention(broker):
    """latest starts at the end, none raises, and a position lost to retention resets."""
    topic = broker.create_topic("t", 1, config={"segment.bytes": 2048, "retention.ms": 1,
                                                "file.delete.delay.ms": 0})
    producer = broker.producer()
    for i in range(50):
        producer.send("t", b"x" * 100, timestamp_ms=1000)
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
