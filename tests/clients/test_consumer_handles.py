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


def test_a_partition_read_to_its_end_is_not_read_again_until_the_doorbell_moves(
        tmp_path, monkeypatch):
    from logkit.topic import Partition
    with logkit.Broker(tmp_path) as broker:
        broker.create_topic("t", 5)
        producer = broker.producer()
        for n in range(50):
            producer.send("t", b"v%d" % n, partition=n % 5)
        producer.flush()
        consumer = broker.consumer(auto_offset_reset="earliest")
        consumer.assign([TopicPartition("t", n) for n in range(5)])
        reads = []
        real = Partition.fetch_records

        def counting(self, offset, *args, **kwargs):
            reads.append((self.topic_partition.partition, offset))
            return real(self, offset, *args, **kwargs)
        monkeypatch.setattr(Partition, "fetch_records", counting)
        assert len(consumer.poll(timeout_ms=0, max_records=100)) == 50
        assert sorted(p for p, _ in reads) == [0, 1, 2, 3, 4]     # one read each
        reads.clear()
        assert consumer.poll(timeout_ms=0) == []
        assert reads == []                     # each was read to its end: none again
        producer.send("t", b"late", partition=3)
        producer.flush()
        got = consumer.poll(timeout_ms=1000)
        assert [(r.partition, r.offset, r.value) for r in got] == [(3, 10, b"late")]
        consumer.close()
        producer.close()


def test_a_poll_takes_the_high_watermark_from_its_read(tmp_path, monkeypatch):
    """Whether a partition was read to its end comes from the read itself
    (`Partition.fetch_records`), not from a second look at the partition's end per poll."""
    from logkit.topic import Partition
    with logkit.Broker(tmp_path) as broker:
        topic = broker.create_topic("t", 2)
        for n in range(6):
            topic.partition(n % 2).append([(None, b"v%d" % n, None, None)])
        consumer = broker.consumer("t", group_id=None, auto_offset_reset="earliest")
        looks = []
        real = Partition.high_watermark

        def counted(self):
            looks.append(self.topic_partition)
            return real.fget(self)
        monkeypatch.setattr(Partition, "high_watermark", property(counted))
        got = []
        for _ in range(20):
            got += consumer.poll(timeout_ms=50)
            if len(got) == 6:
                break
        assert sorted(r.value for r in got) == [b"v%d" % n for n in range(6)]
        assert looks == []
        assert consumer.poll(timeout_ms=0) == []     # both drained: not read again
        consumer.close()
