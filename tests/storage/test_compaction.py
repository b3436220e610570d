"""Log compaction through the public API (DESIGN §16): what a pass keeps, its report,
tombstones and their horizon, keyless records, reads and seeks into removed offsets,
retention under each cleanup.policy, the background cleaner, and a reader in another
process whose cached segments a pass replaced."""

from __future__ import annotations

import multiprocessing
import os
import time

import pytest

import logkit
from logkit.errors import ConfigError, InvalidRecordError

DAY_MS = 86_400_000


@pytest.fixture
def broker(tmp_path):
    b = logkit.Broker(str(tmp_path / "root"), config={"log.cleaner.enable": False})
    yield b
    b.close()


def _compacted(broker, name="t", **config):
    conf = {"cleanup.policy": "compact", "segment.bytes": 2048}
    conf.update(config)
    broker.create_topic(name, 1, config=conf)
    return broker.topic(name).partition(0)


def _append(p, key, value, ts=None):
    return p.append([(key, value, [], ts)])


def test_a_pass_keeps_each_keys_latest_record_at_its_offset(broker):
    p = _compacted(broker)
    latest = {}
    for i in range(400):
        key = b"k%d" % (i % 17)
        latest[key] = (_append(p, key, b"v%d" % i), b"v%d" % i)
    p.roll()
    report = p.compact()
    assert isinstance(report, logkit.CleanReport)
    assert report.records_before == 400 and report.records_after == 17
    assert report.bytes_after < report.bytes_before
    got = {r.key: (r.offset, r.value) for r in p.read(0, max_records=1000)}
    assert got == latest
    assert p.first_dirty_offset == 400
    assert p.log_end_offset == 400                      # offsets never change
    p.check()


def test_the_active_segment_is_never_cleaned(broker):
    p = _compacted(broker, **{"segment.bytes": 1 << 20})
    for i in range(50):
        _append(p, b"k", b"v%d" % i)
    report = p.compact()                                  # no roll: all active
    assert report.records_before == 0
    assert len(p.read(0, max_records=100)) == 50


def test_reading_or_seeking_at_a_removed_offset_gives_the_next_survivor(broker):
    p = _compacted(broker)
    for i in range(100):
        _append(p, b"a" if i < 99 else b"b", b"%d" % i)
    _append(p, b"a", b"last-a")                           # offset 100
    p.roll()
    p.compact()
    assert [r.offset for r in p.read(0, max_records=10)] == [99, 100]
    assert [r.offset for r in p.read(37, max_records=10)] == [99, 100]
    fetched = p.fetch_records(0, max_records=1)
    assert [r.offset for r in fetched.records] == [99] and fetched.next_offset == 100
    consumer = broker.consumer(auto_offset_reset="earliest")
    tp = logkit.TopicPartition("t", 0)
    consumer.assign([tp])
    consumer.seek(tp, 12)
    records = consumer.poll(timeout_ms=2000)
    assert [r.offset for r in records] == [99, 100]
    consumer.close()


def test_fetch_records_moves_past_a_removed_range_that_reaches_the_end(broker):
    p = _compacted(broker)
    for i in range(60):
        _append(p, b"k", b"%d" % i)
    p.roll()
    p.compact()
    end = p.high_watermark
    fetched = p.fetch_records(0)
    assert [r.offset for r in fetched.records] == [59]
    assert fetched.next_offset == end == 60
    assert p.fetch_records(59).next_offset == 60


def test_tombstones_survive_until_their_delete_horizon(broker):
    p = _compacted(broker, **{"delete.retention.ms": DAY_MS})
    for i in range(30):
        _append(p, b"k%d" % (i % 3), b"v%d" % i)
    _append(p, b"k0", None)                               # a tombstone
    p.roll()
    now = int(time.time() * 1000)
    p.compact(now_ms=now)
    survivors = {r.key: r.value for r in p.read(0, max_records=100)}
    assert survivors[b"k0"] is None                       # kept: horizon not reached
    p.compact(now_ms=now + DAY_MS - 1)
    assert b"k0" in {r.key for r in p.read(0, max_records=100)}
    p.compact(now_ms=now + DAY_MS + 1)
    survivors = {r.key: r.value for r in p.read(0, max_records=100)}
    assert b"k0" not in survivors and set(survivors) == {b"k1", b"k2"}
    p.check()


def test_keyless_records_are_refused_on_a_compacted_topic(broker):
    p = _compacted(broker)
    with pytest.raises(InvalidRecordError):
        _append(p, None, b"v")
    batch = logkit.BatchBuilder()
    batch.append(None, b"v")
    with pytest.raises(InvalidRecordError):
        p.append_batch(batch.build())
    assert p.log_end_offset == 0


def test_compact_on_a_delete_topic_raises_config_error(broker):
    broker.create_topic("plain", 1)
    with pytest.raises(ConfigError):
        broker.topic("plain").partition(0).compact()


@pytest.mark.parametrize("policy, deletes", [("compact", False), ("compact,delete", True)])
def test_retention_applies_only_with_delete_in_the_policy(broker, policy, deletes):
    p = _compacted(broker, **{"cleanup.policy": policy, "retention.ms": 1000})
    for i in range(200):
        _append(p, b"k%d" % i, b"v", ts=1)                # ancient timestamps
    p.roll()
    removed = p.enforce_retention()
    assert (removed > 0) is deletes
    assert (p.log_start_offset > 0) is deletes


def test_the_policy_is_kafkas_string_form(broker):
    broker.create_topic("both", 1, config={"cleanup.policy": "delete,compact"})
    assert broker.topic("both").config["cleanup.policy"] == "compact,delete"


def test_the_background_cleaner_cleans_a_due_partition(tmp_path):
    b = logkit.Broker(str(tmp_path / "root"), config={"log.cleaner.backoff.ms": 20})
    try:
        p = _compacted(b, **{"min.cleanable.dirty.ratio": "0.2"})
        for i in range(300):
            _append(p, b"k%d" % (i % 5), b"v%d" % i)
        p.roll()
        deadline = time.monotonic() + 20
        while p.first_dirty_offset < 300 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert p.first_dirty_offset == 300
        assert len(p.read(0, max_records=1000)) == 5
    finally:
        b.close()


def _reader(root, started, done, out):
    b = logkit.Broker(root, config={"log.cleaner.enable": False})
    p = b.topic("t").partition(0)
    out.put([r.offset for r in p.read(0, max_records=1000)])   # caches the segments
    started.set()
    done.wait(30)
    out.put([(r.offset, r.value) for r in p.read(0, max_records=1000)])
    b.close()


def test_a_reader_in_another_process_sees_the_cleaned_log(broker, tmp_path):
    p = _compacted(broker)
    for i in range(300):
        _append(p, b"k%d" % (i % 4), b"v%d" % i)
    p.roll()
    ctx = multiprocessing.get_context("spawn")
    started, done, out = ctx.Event(), ctx.Event(), ctx.Queue()
    child = ctx.Process(target=_reader, args=(broker.path, started, done, out))
    child.start()
    try:
        assert started.wait(60)
        assert out.get(timeout=10) == list(range(300))
        p.compact()
        done.set()
        after = out.get(timeout=30)
        assert after == [(r.offset, r.value) for r in p.read(0, max_records=1000)]
        assert [o for o, _ in after] == [296, 297, 298, 299]
    finally:
        done.set()
        child.join(30)
    assert child.exitcode == 0
    assert not any(n.endswith((".cleaned", ".swap")) for n in os.listdir(p.directory))


def test_a_pass_drops_aborted_records_and_then_the_markers_past_their_horizon(broker):
    """Kafka's cleaner rules for transactions: an aborted transaction's records go (and
    never shadow a committed record of their key), a marker stays while its
    transaction keeps a record, then until its delete horizon."""
    p = _compacted(broker, **{"segment.bytes": 1024, "delete.retention.ms": 1000})
    producer = broker.producer(transactional_id="cleaner-txn", acks="all")
    producer.init_transactions()
    with producer.transaction():
        producer.send("t", b"committed", key=b"a")
    producer.begin_transaction()
    producer.send("t", b"aborted", key=b"a")
    producer.send("t", b"aborted", key=b"b")
    producer.abort_transaction()
    for i in range(30):
        with producer.transaction():
            producer.send("t", b"c%d" % i, key=b"k%d" % (i % 3))
    producer.close()
    p.roll()
    now = int(time.time() * 1000)
    p.compact(now_ms=now)
    committed = [(r.key, r.value) for r in p.read(0, max_records=1000,
                                                   isolation_level="read_committed")]
    everything = [(r.key, r.value) for r in p.read(0, max_records=1000)]
    assert committed == everything == [(b"a", b"committed"), (b"k0", b"c27"),
                                       (b"k1", b"c28"), (b"k2", b"c29")]
    markers_before = sum(h.attributes & 0x20 != 0 for h in p.batch_headers(0))
    p.compact(now_ms=now + 5000)                     # past every marker's horizon
    markers_after = sum(h.attributes & 0x20 != 0 for h in p.batch_headers(0))
    assert markers_after < markers_before
    assert [(r.key, r.value) for r in p.read(0, max_records=1000,
                                             isolation_level="read_committed")] == committed
    assert p.fetch_records(p.log_start_offset, max_records=1000,
                           isolation_level="read_committed").records[-1].value == b"c29"
    p.check()
