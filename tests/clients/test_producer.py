"""The producer on a real broker: partitioning, batching, linger, futures and callbacks,
threads, limits and backpressure, acks, bad input."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading

import pytest

import logkit
from logkit import accumulator as accumulator_module
from logkit import producer as producer_module
from logkit import ConfigError, LogkitTimeoutError, RecordTooLargeError, UnknownTopicError
from tests.helpers.clients import SEND_PATHS, drain, use_path
from tests.helpers.procs import wait_until






def test_the_compiled_send_path_is_used_when_built(broker):
    """Without LOGKIT_PURE_PYTHON, a built _sendpath serves send() (see benchmarks)."""
    if producer_module._CSender is None:
        pytest.skip("logkit._sendpath is not built or LOGKIT_PURE_PYTHON is set")
    producer = broker.producer()
    assert isinstance(producer.send, producer_module._CSender)
    assert not isinstance(broker.producer(value_serializer=str.encode).send,
                          producer_module._CSender)


@pytest.mark.parametrize("path", SEND_PATHS)
def test_keyed_records_follow_murmur2_and_keep_order(broker, path):
    """Keyed records land on Kafka's murmur2 partition, in send order per partition."""
    topic = broker.create_topic("t", 4)
    producer = use_path(broker.producer(), path)
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
    producer.send("t", "hello", key="k", headers=[("h", b"1")], timestamp_ms=1_700_000_012_345).result()
    consumer = broker.consumer("t", auto_offset_reset="earliest",
                               key_deserializer=bytes.decode, value_deserializer=bytes.decode)
    [record] = consumer.poll(timeout_ms=1000)
    assert (record.key, record.value, list(record.headers), record.timestamp) == \
        ("k", "hello", [("h", b"1")], 1_700_000_012_345)


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
    """max_request_size refuses a record at send(); a batch over the topic's
    max.message.bytes is split, and a single record over it fails its future."""
    broker.create_topic("t", 1, config={"max.message.bytes": 500})
    producer = broker.producer(max_request_size=2000, linger_ms=60_000)
    with pytest.raises(RecordTooLargeError):
        producer.send("t", b"x" * 5000)
    small = [producer.send("t", b"%03d" % i + b"y" * 60) for i in range(20)]
    future = producer.send("t", b"x" * 1000)          # fits the producer, not the topic
    producer.flush()
    with pytest.raises(RecordTooLargeError):
        future.result(timeout=5)
    assert isinstance(future.exception(timeout=5), RecordTooLargeError)
    offsets = [f.result(timeout=5).offset for f in small]
    assert offsets == list(range(20))                 # split batches keep the order
    records = broker.topic("t").partition(0).read(0, max_records=100)
    assert [r.value[:3] for r in records] == [b"%03d" % i for i in range(20)]


def test_full_buffer_blocks_send_then_times_out(broker):
    """When appends stall (another process holds the partition lock), buffer_memory
    fills and send() blocks for max_block_ms, then raises LogkitTimeoutError; once the
    lock is released, every accepted record is stored."""
    topic = broker.create_topic("t", 1)
    lock_path = os.path.join(topic.partition(0).directory, "logkit.tail")
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import fcntl, sys\nf = open(sys.argv[1], 'rb+')\nfcntl.flock(f, fcntl.LOCK_EX)\n"
         "print('locked', flush=True)\nsys.stdin.read()", lock_path],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        producer = broker.producer(buffer_memory=4096, batch_size=1024, max_block_ms=300)
        first = producer.send("t", b"0000" + b"v" * 200)     # the sender takes it, blocks
        wait_until(lambda: producer.metrics()["open_batches"] == 0, 30, "the sender")
        accepted = [first]
        with pytest.raises(LogkitTimeoutError):
            for i in range(1, 1000):                  # 4 batches' worth fits, then blocks
                accepted.append(producer.send("t", b"%04d" % i + b"v" * 200))
        assert 1 < len(accepted) < 1000
        assert not first.done()
    finally:
        holder.stdin.close()
        holder.wait(timeout=30)
    producer.flush(timeout=30)
    stored = [r.value[:4] for r in topic.partition(0).read(0, max_records=2000)]
    assert stored == [b"%04d" % i for i in range(len(accepted))]
    assert [f.result(timeout=5).offset for f in accepted] == list(range(len(accepted)))


def test_explicit_partition_callbacks_and_errbacks(broker):
    """An explicit partition is honoured; callbacks get metadata, errbacks the error;
    a callback added after completion runs at once."""
    broker.create_topic("t", 3)
    producer = broker.producer(linger_ms=60_000)
    seen, errors = [], []
    future = producer.send("t", b"v", key=b"k", partition=2).add_callback(seen.append)
    producer.flush()
    assert seen == [future.result()] and seen[0].partition == 2
    late = []
    future.add_callback(late.append)
    assert late == seen
    with pytest.raises(UnknownTopicError):
        producer.send("t", b"v", partition=3)
    bad = broker.producer()
    broker.create_topic("small", 1, config={"max.message.bytes": 200})
    bad.send("small", b"x" * 500).add_errback(errors.append).exception(timeout=5)
    assert len(errors) == 1 and isinstance(errors[0], RecordTooLargeError)


def test_record_order_and_offsets_survive_many_batches(broker):
    """Across many full batches and a lingering tail, futures report exactly the offsets
    the records were stored at, and each partition holds its records in send order."""
    topic = broker.create_topic("t", 3)
    producer = broker.producer(batch_size=2048, linger_ms=5)
    futures = [(i, producer.send("t", b"%05d" % i, key=b"k%d" % (i % 7))) for i in range(3000)]
    producer.flush()
    for i, future in futures:
        md = future.result(timeout=5)
        [record] = topic.partition(md.partition).read(md.offset, max_records=1)
        assert record.value == b"%05d" % i and md.timestamp == record.timestamp
    for p in range(3):
        values = [r.value for r in topic.partition(p).read(0, max_records=5000)]
        assert values == sorted(values)


def test_unknown_option_and_bad_values_raise_config_error(broker):
    """Unknown keywords and out-of-range values are ConfigError (Kafka's names only)."""
    for options in ({"linger.ms": 5}, {"bogus": 1}, {"acks": 2}, {"acks": True},
                    {"batch_size": -1}, {"buffer_memory": "big"},
                    {"compression_type": "rar"}, {"partitioner": "random"},
                    {"value_serializer": 5}):
        with pytest.raises(ConfigError):
            broker.producer(**options)


def test_acks(broker):
    """acks=0 resolves at once with offset -1; acks='all' behaves as 1 without replicas."""
    broker.create_topic("t", 1)
    assert broker.producer(acks=0).send("t", b"v").result().offset == -1
    assert broker.producer(acks="all").send("t", b"v").result().offset >= 0
    with pytest.raises(ConfigError):
        broker.producer(acks=2)



@pytest.mark.parametrize("path", SEND_PATHS)
def test_concurrent_sends_seals_and_flushes_lose_and_duplicate_nothing(broker, path):
    """Threads race the lock-free send path against batch sealing (tiny batches, the
    sender thread with linger_ms=0, a thread flushing in a loop) with a switch interval
    of 1 µs: every future reports the offset its own record was stored at, and each
    partition holds each thread's records in that thread's send order."""
    topic = broker.create_topic("t", 2)
    producer = use_path(broker.producer(batch_size=300, linger_ms=0), path)
    results: dict[int, list] = {}
    stop = threading.Event()

    def work(n):
        results[n] = [(b"%d-%05d" % (n, i),
                       producer.send("t", b"%d-%05d" % (n, i), key=b"%d" % (i % 3)))
                      for i in range(2000)]

    def flusher():
        while not stop.is_set():
            producer.flush()

    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        threads = [threading.Thread(target=work, args=(n,)) for n in range(4)]
        background = threading.Thread(target=flusher)
        background.start()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        stop.set()
        background.join()
        producer.flush()
    finally:
        sys.setswitchinterval(old)
    stored = {p: [r.value for r in topic.partition(p).read(0, max_records=10_000)]
              for p in range(2)}
    assert sum(len(v) for v in stored.values()) == 8000
    for n, sent in results.items():
        for value, future in sent:
            md = future.result(timeout=10)
            assert stored[md.partition][md.offset] == value
    for values in stored.values():
        for n in range(4):
            mine = [v for v in values if v.startswith(b"%d-" % n)]
            assert mine == sorted(mine)


def test_a_row_appended_after_its_batch_was_drained_is_sent_again(broker):
    """The lock-free send path's race with a sealer, forced (a thread pre-empted between
    reading the open batch and adding to it): compiled, the sealed batch refuses the row
    (check and add are one step); pure Python, a row that lands in the inbox after the
    sealer drained it is taken back out. Either way it is stored exactly once, in a
    later batch."""
    topic = broker.create_topic("t", 1)
    producer = broker.producer(linger_ms=60_000)
    first = producer.send("t", b"first")
    state = producer._states["t"]
    batch = state.open[0]
    producer.flush()                                    # sealed, drained, appended
    late = (None, b"late", None, None)
    if accumulator_module.DIRECT_ROWS:
        assert batch.sealed and not batch.offer(late, 30)
        assert late not in batch.rows
        future = producer._enqueue(state, 0, late, 30)
    else:
        batch.inbox.append(late)                        # the pre-empted thread's append
        future = producer._rescue(state, 0, batch, late, 30)
        assert not batch.inbox
    producer.flush()
    assert first.result(timeout=5).offset == 0
    assert future.result(timeout=5).offset == 1
    assert [r.value for r in topic.partition(0).read(0)] == [b"first", b"late"]


def test_flush_inside_a_callback_is_refused(broker):
    """flush() from a send callback would wait for its own batch: IllegalStateError."""
    broker.create_topic("t", 1)
    producer = broker.producer(linger_ms=60_000)       # appended by the flush below
    errors = []

    def callback(metadata):
        try:
            producer.flush()
        except logkit.IllegalStateError as exc:
            errors.append(exc)

    producer.send("t", b"v").add_callback(callback)
    producer.flush(timeout=10)
    assert len(errors) == 1


def test_a_raising_send_callback_is_logged_and_the_others_still_run(broker, caplog):
    """A user callback's exception does not reach the producer: it is logged at ERROR
    on logkit.producer with its traceback, and the next callbacks run."""
    broker.create_topic("t", 1)
    producer = broker.producer(linger_ms=60_000)
    ran = []

    def bad(metadata):
        raise RuntimeError("callback bug")

    producer.send("t", b"a").add_callback(bad)
    producer.send("t", b"b").add_callback(lambda md: ran.append(md.offset))
    with caplog.at_level(logging.ERROR, logger="logkit.producer"):
        producer.flush()
    assert ran == [1]
    [record] = [r for r in caplog.records if r.name == "logkit.producer"]
    assert "callback" in record.getMessage() and record.exc_info[0] is RuntimeError
    producer.close()


def test_an_error_that_is_not_logkits_reaches_the_futures_and_the_log(
        broker, caplog, monkeypatch):
    """A bug while appending (simulated: the batch encoder raises TypeError) fails that
    batch's futures with it, is logged with its traceback, and the producer goes on."""
    broker.create_topic("t", 1)
    producer = broker.producer(linger_ms=60_000)
    real = producer_module.encode_batch
    monkeypatch.setattr(producer_module, "encode_batch",
                        lambda *a, **k: (_ for _ in ()).throw(TypeError("encoder bug")))
    futures = [producer.send("t", b"%d" % i) for i in range(3)]
    with caplog.at_level(logging.ERROR, logger="logkit.producer"):
        producer.flush()
    assert all(isinstance(f.exception(), TypeError) for f in futures)
    assert any(r.exc_info and r.exc_info[0] is TypeError for r in caplog.records
               if r.name == "logkit.producer")
    monkeypatch.setattr(producer_module, "encode_batch", real)
    assert producer.send("t", b"after").result(timeout=10).offset == 0
    producer.close()


def test_a_keyboard_interrupt_while_appending_propagates_after_resolving_the_batch(
        broker, monkeypatch):
    """KeyboardInterrupt is not swallowed into a future: flush() raises it, and the
    batch's futures are resolved first, so nobody waits on them forever."""
    broker.create_topic("t", 1)
    producer = broker.producer(linger_ms=60_000)
    real = producer_module.encode_batch
    monkeypatch.setattr(producer_module, "encode_batch",
                        lambda *a, **k: (_ for _ in ()).throw(KeyboardInterrupt()))
    future = producer.send("t", b"v")
    with pytest.raises(KeyboardInterrupt):
        producer.flush()
    assert future.done() and isinstance(future.exception(timeout=0), KeyboardInterrupt)
    monkeypatch.setattr(producer_module, "encode_batch", real)
    producer.close()
    assert broker.topic("t").partition(0).log_end_offset == 0


def test_producer_options_come_from_the_settings_table(broker):
    """The producer's options and defaults are the table's "producer" rows; strings
    are read as Kafka's .properties are; refused keys say why."""
    from logkit.config import TABLE
    producer = broker.producer(linger_ms="5", acks="all", enable_idempotence="true")
    assert producer.config["linger_ms"] == 5 and producer.config["enable_idempotence"]
    assert set(producer.config) == {key for key, row in TABLE["producer"].items()
                                    if row.status != "refused"}
    producer.close()
    with pytest.raises(ConfigError, match="enable_idempotence=True needs acks='all'"):
        broker.producer(enable_idempotence=True)
    with pytest.raises(ConfigError, match="bootstrap_servers.*not supported"):
        broker.producer(bootstrap_servers="localhost:9092")


def test_a_producer_follows_a_topic_deleted_and_created_again(tmp_path):
    """After delete_topic and create_topic of the same name, a producer's next sends
    go to the new topic (Kafka's producer refreshes its metadata); before, every send
    failed with ClosedError from the old topic's closed handle."""
    with logkit.Broker(str(tmp_path), background=False) as broker:
        broker.create_topic("t", 2)
        with broker.producer() as producer:
            assert producer.send("t", b"a", partition=1).result().offset == 0
            broker.delete_topic("t")
            broker.create_topic("t", 3)
            assert producer.send("t", b"b", partition=1).result().offset == 0
            assert producer.send("t", b"c", partition=2).result().offset == 0
            assert producer.partitions_for("t") == {0, 1, 2}
        topic = broker.topic("t")
        assert [r.value for r in topic.partition(1).read(0)] == [b"b"]
        assert [r.value for r in topic.partition(2).read(0)] == [b"c"]


def test_a_send_to_a_deleted_topic_fails_its_future_with_unknown_topic(tmp_path):
    with logkit.Broker(str(tmp_path), background=False,
                       config={"auto.create.topics.enable": False}) as broker:
        broker.create_topic("t", 1)
        with broker.producer() as producer:
            producer.send("t", b"a").result()
            broker.delete_topic("t")
            with pytest.raises(logkit.UnknownTopicError):
                producer.send("t", b"b").result(timeout=10)
        assert "t" not in broker.topics()


def test_a_too_large_record_s_errors_each_name_both_settings(broker):
    """A 2 MB value fails first at the producer, then (once max_request_size is raised)
    at the topic: each error names both settings, so one reading is enough."""
    broker.create_topic("t", 1)
    with pytest.raises(RecordTooLargeError) as producer_side:
        broker.producer().send("t", b"x" * 2_000_000)
    with pytest.raises(RecordTooLargeError) as topic_side:
        broker.producer(max_request_size=4_000_000).send("t", b"x" * 2_000_000).result(10)
    for error in (producer_side.value, topic_side.value):
        assert "max_request_size" in str(error) and "max.message.bytes" in str(error)
