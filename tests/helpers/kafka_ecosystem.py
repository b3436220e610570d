"""Test helper for issue 31's sections 5 and 6: the JVM ecosystem (Spark's Kafka
connector, Kafka Connect, Kafka Streams) on logkit's listener, and `logkit mirror` to
and from the real Kafka that tests/helpers/kafka.py starts.

Owns small reading and waiting helpers shared by those tests: the records of a Kafka
topic as confluent-kafka reads them, the records of a logkit topic in the same shape,
and a wait on a condition with a deadline. Invariant: nothing here sleeps as
synchronisation; every wait polls a state and fails with what it saw past its deadline.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any

Row = tuple[Any, ...]      # (key, value, headers, timestamp)


def unique(prefix: str) -> str:
    """A topic or group name no other test on the shared Kafka uses."""
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def wait_for(condition: Callable[[], Any], what: str, timeout_s: float = 60.0,
             interval_s: float = 0.05) -> Any:
    """Poll `condition` until it returns something true (returned) or the deadline."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what} "
                                 f"(last: {value!r})")
        time.sleep(interval_s)


def kafka_rows(bootstrap: str, topic: str, *, timeout_s: float = 60.0
               ) -> dict[int, list[tuple[int, Row]]]:
    """{partition: [(offset, (key, value, headers, timestamp))]} of a topic up to its end
    now, as a read_committed confluent-kafka consumer sees it."""
    from confluent_kafka import Consumer, KafkaError, TopicPartition
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": unique("reader"),
                         "enable.auto.commit": False, "enable.partition.eof": True,
                         "isolation.level": "read_committed"})
    try:
        metadata = consumer.list_topics(topic, timeout=timeout_s)
        partitions = sorted(metadata.topics[topic].partitions)
        out: dict[int, list[tuple[int, Row]]] = {p: [] for p in partitions}
        ends = {}
        for p in partitions:
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, p),
                                                       timeout=timeout_s)
            if high > low:
                ends[p] = high
        consumer.assign([TopicPartition(topic, p, 0) for p in ends])
        deadline = time.monotonic() + timeout_s
        while ends:
            if time.monotonic() > deadline:
                raise AssertionError(f"reading {topic} from Kafka: {ends} not reached")
            for message in consumer.consume(1000, 0.5):
                p = message.partition()
                if message.error() is not None:
                    if message.error().code() == KafkaError._PARTITION_EOF:
                        ends.pop(p, None)
                        continue
                    raise AssertionError(f"reading {topic}: {message.error()}")
                out[p].append((message.offset(), (
                    message.key(), message.value(), tuple(map(tuple, message.headers() or ())),
                    message.timestamp()[1])))
                if message.offset() + 1 >= ends.get(p, 0):
                    ends.pop(p, None)
        return out
    finally:
        consumer.close()


def logkit_rows(broker: Any, topic: str) -> dict[int, list[tuple[int, Row]]]:
    """The same shape for a logkit topic, read from its partitions directly."""
    out = {}
    for partition in broker.topic(topic).partitions:
        records = []
        position = partition.log_start_offset
        while position < partition.high_watermark:
            batch = partition.read(position, max_records=10_000)
            if not batch:
                break
            records += [(r.offset, (r.key, r.value, tuple(map(tuple, r.headers)), r.timestamp))
                        for r in batch]
            position = batch[-1].offset + 1
        out[partition.partition] = records
    return out


def without_offsets(rows: dict[int, list[tuple[int, Row]]]) -> dict[int, list[Row]]:
    return {p: [row for _, row in records] for p, records in rows.items()}
