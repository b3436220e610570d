"""What one poll() fetches across partitions: `max_records` and `fetch_max_bytes` bound
it (the byte budget counts the stored values, at least one batch always comes back),
the partitions are read in turn, and every record comes back once, in offset order per
partition — also when a deserializer turns values into objects without a length."""

from __future__ import annotations

import logkit
from logkit import TopicPartition

VALUE = b"v" * 100                  # 10 of them: 1,000 value bytes per partition


def _load(broker: logkit.Broker, partitions: int = 3, per_partition: int = 10) -> None:
    """`per_partition` records of VALUE (values b"0".., padded) in one batch each."""
    broker.create_topic("t", partitions)
    for p in range(partitions):
        broker.topic("t").partition(p).append(
            [(None, b"%d" % i + VALUE[len(b"%d" % i):], None, None)
             for i in range(per_partition)])


def _by_partition(records) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for r in records:
        out.setdefault(r.partition, []).append(r.offset)
    return out


def test_fetch_max_bytes_stops_after_the_partition_that_spends_it(broker):
    """With 1,500 bytes a poll reads one partition whole (1,000 bytes), then at least
    one batch of the next, and stops there; the next poll starts at the third."""
    _load(broker)
    consumer = broker.consumer("t", auto_offset_reset="earliest", fetch_max_bytes=1500)
    first = consumer.poll(timeout_ms=0, max_records=100)
    assert [len(v) for v in _by_partition(first).values()] == [10, 10]
    second = consumer.poll(timeout_ms=0, max_records=100)
    assert len(second) == 10
    assert set(_by_partition(first)) | set(_by_partition(second)) == {0, 1, 2}
    assert consumer.poll(timeout_ms=0) == []
    every = _by_partition(first + second)
    assert every == {p: list(range(10)) for p in range(3)}


def test_a_poll_reads_every_partition_within_the_default_budget(broker):
    _load(broker)
    consumer = broker.consumer("t", auto_offset_reset="earliest")
    records = consumer.poll(timeout_ms=0, max_records=100)
    assert _by_partition(records) == {p: list(range(10)) for p in range(3)}
    assert {consumer.position(TopicPartition("t", p)) for p in range(3)} == {10}


def test_max_records_cuts_the_last_partition_read_and_resumes_there(broker):
    _load(broker)
    consumer = broker.consumer("t", auto_offset_reset="earliest")
    first = consumer.poll(timeout_ms=0, max_records=15)
    assert sorted(len(v) for v in _by_partition(first).values()) == [5, 10]
    rest = []
    while records := consumer.poll(timeout_ms=0, max_records=15):
        rest += records
    assert _by_partition(first + rest) == {p: list(range(10)) for p in range(3)}


def test_the_budget_counts_stored_bytes_not_deserialized_values(broker):
    """Values deserialized to ints (no len()) still spend the byte budget by their
    stored size: the poll stops where the stored bytes say."""
    _load(broker)
    consumer = broker.consumer("t", auto_offset_reset="earliest", fetch_max_bytes=1500,
                               value_deserializer=lambda v: int(v.rstrip(b"v")))
    first = consumer.poll(timeout_ms=0, max_records=100)
    assert [len(v) for v in _by_partition(first).values()] == [10, 10]
    assert sorted({r.value for r in first}) == list(range(10))
    assert len(consumer.poll(timeout_ms=0, max_records=100)) == 10
