"""Issue 31 section 6, the way out for real: `logkit mirror` copies a broker's topics,
records and translated group offsets into Apache Kafka, and resumes after SIGKILL
without duplicates; `logkit mirror --from` pulls a Kafka topic (with transaction markers
and an aborted transaction, so offsets with gaps) into a logkit directory, resumable the
same way, so production data can be replayed in a local test."""

from __future__ import annotations

import multiprocessing
import os
import signal
import subprocess
import sys
import time

import pytest

import logkit
from tests.helpers.kafka import create_topics
from tests.helpers.kafka_ecosystem import (kafka_rows, logkit_rows, unique, wait_for,
                                           without_offsets)

pytest.importorskip("confluent_kafka")

# An hour ago: Kafka 4 refuses records stamped over an hour ahead
# (message.timestamp.after.max.ms) and deletes those older than 7 days (retention.ms).
STAMP_MS = int(time.time() * 1000) - 3_600_000


def _fill(broker, topic, count, partitions=3):
    broker.create_topic(topic, partitions)
    producer = broker.producer()
    for n in range(count):
        producer.send(topic, b"value-%d" % n, key=b"key-%d" % (n % 13),
                      headers=[("n", b"%d" % n)], timestamp_ms=STAMP_MS + n)
    producer.flush()
    producer.close()


def _commit_logkit(broker, group, topic, offsets):
    broker.group(group).reset_offsets(
        {logkit.TopicPartition(topic, p): o for p, o in offsets.items()})


def _kafka_end(bootstrap, topic):
    """The sum of the topic's high watermarks in Kafka; 0 while it has none to give (not
    created yet, its leader still being chosen, or no answer in time on a loaded
    machine): a progress probe, not a measurement (that is `_kafka_end_now`)."""
    from confluent_kafka import KafkaException
    try:
        return _kafka_end_now(bootstrap, topic, timeout_s=10)
    except KafkaException:
        return 0


def _kafka_end_now(bootstrap, topic, timeout_s=60):
    """The sum of the topic's high watermarks in Kafka, asked again while the answer is
    a retriable error or a timeout, up to `timeout_s`; KafkaException past it."""
    from confluent_kafka import Consumer, KafkaException, TopicPartition
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": unique("probe")})
    deadline = time.monotonic() + timeout_s
    try:
        while True:
            try:
                if topic not in consumer.list_topics(timeout=10).topics:
                    return 0
                return sum(consumer.get_watermark_offsets(TopicPartition(topic, p),
                                                          timeout=10)[1] for p in range(3))
            except KafkaException:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)         # polling a state with a deadline
    finally:
        consumer.close()


def _kafka_committed(bootstrap, group):
    from confluent_kafka import ConsumerGroupTopicPartitions
    from confluent_kafka.admin import AdminClient
    admin = AdminClient({"bootstrap.servers": bootstrap})
    future = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)])
    result = future[group].result(timeout=30)
    return {(tp.topic, tp.partition): tp.offset for tp in result.topic_partitions
            if tp.offset >= 0}


def _alive(child):
    if not child.is_alive():
        raise AssertionError(f"the mirror process exited early ({child.exitcode})")
    return True


def _mirror_forever(source_path, bootstrap, topic):
    with logkit.Broker(source_path) as source:
        while True:
            logkit.mirror(source, bootstrap, topics=[topic], max_records=500)


def test_mirror_into_kafka_resumes_after_sigkill_without_duplicates(kafka, tmp_path):
    """Records, partitions and group offsets reach the real Kafka; a mirror killed
    mid-copy and run again leaves each Kafka partition equal to the source's."""
    topic, group = unique("mirror-out"), unique("billing")
    source_dir = tmp_path / "src"
    with logkit.Broker(source_dir) as source:
        _fill(source, topic, 6000)
        _commit_logkit(source, group, topic, {0: 17, 1: 0, 2: 1500})
        expected = without_offsets(logkit_rows(source, topic))
    child = multiprocessing.get_context("spawn").Process(
        target=_mirror_forever, args=(str(source_dir), kafka.bootstrap_servers, topic))
    child.start()
    try:
        wait_for(lambda: _alive(child) and _kafka_end(kafka.bootstrap_servers, topic) > 1000,
                 "the first records in Kafka")
    finally:
        if child.is_alive():
            os.kill(child.pid, signal.SIGKILL)
        child.join(10)
    # measured, not probed: a timeout read as 0 here made the count below wrong
    killed_at = _kafka_end_now(kafka.bootstrap_servers, topic)
    assert 1000 < killed_at < 6000, "the mirror was not killed mid-copy"
    with logkit.Broker(source_dir) as source:
        report = logkit.mirror(source, kafka.bootstrap_servers, topics=[topic],
                               groups=[group])
    # Kafka still appends a produce request it had read whole when the killed mirror's
    # connection closed, possibly after killed_at was read: the second run copies what
    # Kafka lacks when it starts, at most 6000 - killed_at (exactly that when idle)
    assert 0 < sum(report["records"][topic].values()) <= 6000 - killed_at
    got = kafka_rows(kafka.bootstrap_servers, topic)
    assert without_offsets(got) == expected              # no record lost, none twice
    # the mirror began on empty Kafka partitions: offsets translate one to one
    assert _kafka_committed(kafka.bootstrap_servers, group) == {
        (topic, 0): 17, (topic, 1): 0, (topic, 2): 1500}


def _produce_to_kafka(bootstrap, topic):
    """Plain records, a committed and an aborted transaction into a 3-partition topic;
    returns nothing: the expected records are read back from Kafka itself."""
    from confluent_kafka import Producer
    from confluent_kafka.admin import NewTopic
    create_topics(bootstrap, [NewTopic(topic, 3, 1, config={"retention.ms": "-1"})])
    plain = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True,
                      "linger.ms": 5})
    for n in range(3000):
        plain.produce(topic, b"plain-%d" % n, b"k%d" % (n % 7), partition=n % 3,
                      headers=[("n", b"%d" % n)], timestamp=STAMP_MS + n)
        if n % 1000 == 999:
            plain.flush(30)
    plain.flush(30)
    for commit in (True, False, True):
        # a producer per transaction: librdkafka's second transaction on one producer
        # sometimes ended in INVALID_TXN_STATE against Kafka 4.3 (2026-11-28)
        txn = Producer({"bootstrap.servers": bootstrap,
                        "transactional.id": unique("txn")})
        txn.init_transactions(30)
        txn.begin_transaction()
        for n in range(300):
            txn.produce(topic, b"txn-%s-%d" % (b"c" if commit else b"a", n),
                        partition=n % 3, timestamp=STAMP_MS + 5000 + n)
        if commit:
            txn.commit_transaction(30)
        else:
            txn.abort_transaction(30)


def _commit_kafka(bootstrap, group, topic, offsets):
    from confluent_kafka import Consumer, TopicPartition
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group,
                         "enable.auto.commit": False})
    try:
        consumer.commit(offsets=[TopicPartition(topic, p, o) for p, o in offsets.items()],
                        asynchronous=False)
    finally:
        consumer.close()


def _pull_forever(directory, bootstrap, topic):
    with logkit.Broker(directory) as broker:
        while True:
            logkit.mirror_from(bootstrap, broker, topics=[topic], max_records=200)


def test_mirror_from_kafka_pulls_a_topic_into_a_logkit_directory(kafka, tmp_path):
    """Kafka's committed records (not the aborted ones, not the markers) land in the
    same partitions in order, a pull killed by SIGKILL resumes without duplicates, and
    a group's offsets point at the same records in the copy."""
    topic, group = unique("mirror-in"), unique("replay")
    bootstrap = kafka.bootstrap_servers
    _produce_to_kafka(bootstrap, topic)
    source = kafka_rows(bootstrap, topic)
    # offsets inside the plain records, and one just past a transaction's marker
    commits = {0: source[0][500][0], 1: source[1][-1][0] + 1, 2: source[2][1000][0]}
    _commit_kafka(bootstrap, group, topic, commits)
    directory = tmp_path / "replay"
    child = multiprocessing.get_context("spawn").Process(
        target=_pull_forever, args=(str(directory), bootstrap, topic))
    child.start()

    def pulled():
        try:
            with logkit.Broker(directory, read_only=True) as copy:
                return topic in copy.topics() and sum(
                    p.high_watermark for p in copy.topic(topic).partitions) > 600
        except logkit.LogkitError:
            return False
    try:
        wait_for(lambda: _alive(child) and pulled(), "the first records pulled")
    finally:
        if child.is_alive():
            os.kill(child.pid, signal.SIGKILL)
        child.join(10)
    with logkit.Broker(directory, read_only=True) as copy:
        killed_at = sum(p.high_watermark for p in copy.topic(topic).partitions)
    assert killed_at < 3600, "the pull was not killed mid-copy"
    proc = subprocess.run([sys.executable, "-m", "logkit.cli", "mirror", str(directory),
                           "--from", bootstrap, "--topics", topic, "--groups",
                           "--topic-config", "retention.ms=-1"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert f"{topic}: " in proc.stdout
    with logkit.Broker(directory) as copy:
        got = logkit_rows(copy, topic)
        assert without_offsets(got) == without_offsets(source)
        assert sum(len(r) for r in got.values()) == 3000 + 600   # the aborted 300 left out
        committed = copy.group(group).committed()
        for p, offset in commits.items():
            translated = committed[logkit.TopicPartition(topic, p)]
            after = [row for o, row in source[p] if o >= offset]
            assert [row for _, row in got[p][translated:]] == after


def _produce_error(bootstrap, topic, timestamp_ms):
    """The error a produce of one record stamped `timestamp_ms` gets, or None."""
    from confluent_kafka import Producer
    errors = []
    producer = Producer({"bootstrap.servers": bootstrap, "message.send.max.retries": 0})
    producer.produce(topic, b"v", timestamp=timestamp_ms,
                     on_delivery=lambda error, message: errors.append(error))
    producer.flush(30)
    assert len(errors) == 1
    return errors[0].name() if errors[0] is not None else None


@pytest.mark.xfail(strict=True, reason="docs/kafka-protocol.md, Differences from Apache "
                   "Kafka: message.timestamp.after.max.ms is not enforced, so a record "
                   "logkit took cannot be mirrored into Kafka")
def test_a_record_stamped_two_hours_ahead_is_refused_as_kafka_refuses_it(kafka, tmp_path):
    """Kafka 4 refuses a record stamped more than message.timestamp.after.max.ms (1 h)
    ahead of its clock; logkit takes it, and `logkit mirror` then fails on it."""
    ahead = int(time.time() * 1000) + 2 * 3_600_000
    topic = unique("ahead")
    kafka_error = _produce_error(kafka.bootstrap_servers, topic, ahead)
    assert kafka_error is not None
    with logkit.Broker(tmp_path / "data") as broker, broker.serve() as server:
        assert _produce_error(server.bootstrap_servers, topic, ahead) == kafka_error


def test_mirror_from_skips_what_a_killed_run_appended_past_its_checkpoint(kafka, tmp_path):
    """The instant a kill can fall between a batch appended to the copy and its
    checkpoint, made on purpose: the next run skips those records on the source (source
    offsets with gaps: after a transaction) instead of appending them twice."""
    from confluent_kafka import Producer
    topic = unique("mirror-gap")
    bootstrap = kafka.bootstrap_servers
    _produce_to_kafka(bootstrap, topic)
    extra = Producer({"bootstrap.servers": bootstrap})
    for n in range(50):                          # after the transactions' markers
        extra.produce(topic, b"late-%d" % n, partition=0, timestamp=STAMP_MS + 9000 + n)
    assert extra.flush(30) == 0
    source = kafka_rows(bootstrap, topic)
    with logkit.Broker(tmp_path / "replay") as copy:
        # a first run stops inside the first transaction's records in partition 0
        logkit.mirror_from(bootstrap, copy, topics=[topic], max_records=1050)
        partition = copy.topic(topic).partition(0)
        done = partition.high_watermark
        assert 0 < done < len(source[0])
        # "killed" after appending the next 120 records (across that transaction's
        # marker, the aborted one, and into the third), before their checkpoint
        partition.append([row for _, row in source[0][done:done + 120]])
        logkit.mirror_from(bootstrap, copy, topics=[topic])
        assert without_offsets(logkit_rows(copy, topic)) == without_offsets(source)
