"""The consumer's partition handles: a many-partition assignment looks its topic up
once per topic (a metadata read each), not once per partition, and a topic deleted and
re-created behind the cached handles is found again."""

from __future__ import annotations

import logkit
from logkit import TopicPartition


def test_a_many_partition_assignment_looks_its_topic_up_once(tmp_path, monkeypatch):
    with logkit.Broker(tmp_path) as broker:
        broker.create_topic("t", 60)
        producer = broker.producer()
        for n in range(60):
            producer.send("t", b"v%d" % n, partition=n)
        producer.flush()
        lookups = []
        real = broker.topic

        def counting(name):
            lookups.append(name)
            return real(name)
        monkeypatch.setattr(broker, "topic", counting)
        consumer = broker.consumer(auto_offset_reset="earliest")
        consumer.assign([TopicPartition("t", n) for n in range(60)])
        got = []
        for _ in range(20):
            got.extend(r.value for r in consumer.poll(timeout_ms=50))
            if len(got) == 60:
                break
        assert sorted(got) == sorted(b"v%d" % n for n in range(60))
        assert len(lookups) <= 3, len(lookups)          # was one per partition: 60+
        consumer.close()


def test_a_topic_recreated_behind_the_cached_handles_is_read_again(tmp_path):
    with logkit.Broker(tmp_path) as broker:
        broker.create_topic("t", 3)
        producer = broker.producer()
        producer.send("t", b"old", partition=1)
        producer.flush()
        consumer = broker.consumer(auto_offset_reset="earliest")
        consumer.assign([TopicPartition("t", n) for n in range(3)])
        assert [r.value for r in consumer.poll(timeout_ms=100)] == [b"old"]
        broker.delete_topic("t")
        broker.create_topic("t", 3)
        producer.close()
        producer = broker.producer()
        producer.send("t", b"new-0", partition=0)
        producer.send("t", b"new-1", partition=1)
        producer.send("t", b"new-2", partition=1)
        producer.flush()
        consumer.seek(TopicPartition("t", 1), 0)
        got = []
        for _ in range(20):
            got.extend(r.value for r in consumer.poll(timeout_ms=50))
            if len(got) == 3:
                break
        assert sorted(got) == [b"new-0", b"new-1", b"new-2"]
        consumer.close()
        producer.close()
