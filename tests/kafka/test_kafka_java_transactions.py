"""The Java client's transactions (Kafka 4's KafkaProducer with transactional.id and a
read_committed KafkaConsumer; tools/kafka/src/TransactionScenarios.java) and Kafka
Streams with processing.guarantee=exactly_once_v2 (tools/kafka/src/StatelessStreams.java)
against logkit's listener: committed records are read once, aborted ones never by
read_committed, offsets sent in a transaction are committed with it, a second producer
of the id fences the first, and the exactly-once topology gives the at-least-once
topology's output."""

from __future__ import annotations

import itertools
import subprocess
import time

import pytest

import logkit
from logkit import TopicPartition
from tests.helpers.kafka import compile_java, create_topics, java_command, skip_reason
from tests.helpers.kafka_ecosystem import kafka_rows, unique, without_offsets
from tests.helpers.kafka_tools import QUICK_JVM_FLAGS, describe, scenario_lines, tool
from tests.helpers.txn_waits import wait_all_completed

pytestmark = pytest.mark.skipif(skip_reason() is not None, reason=str(skip_reason()))

PARTITIONS = 2
RUN_TIMEOUT_S = 150
STAMP_MS = int(time.time() * 1000) - 60_000   # both runs' input records: one timestamp set
_names = itertools.count()


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    with logkit.Broker(tmp_path_factory.mktemp("logkit-java-txn") / "data") as broker, \
            broker.serve() as server:
        yield broker, server.bootstrap_servers


def _run(name, *args):
    command = java_command(name, *map(str, args), extra_classpath=compile_java(name))
    command[1:1] = QUICK_JVM_FLAGS
    return subprocess.run(command, capture_output=True, text=True, timeout=RUN_TIMEOUT_S,
                          stdin=subprocess.DEVNULL)


def test_java_transactions_commit_abort_and_read_committed(served):
    broker, servers = served
    n = next(_names)
    out, source, group = f"jt-out-{n}", f"jt-in-{n}", f"jt-group-{n}"
    broker.create_topic(out, PARTITIONS)
    broker.create_topic(source, 1)
    proc = _run("TransactionScenarios", "transactions", servers, out, PARTITIONS, source,
                group)
    assert proc.returncode == 0, describe(proc)
    wait_all_completed(broker)      # the listener answers EndTxn before the markers
    reads = {words[0]: sorted(words[1:]) for words in scenario_lines(proc, "READ")}
    committed = [f"c1-{i}" for i in range(6)] + [f"c2-{i}" for i in range(3)]
    aborted = [f"ab-{i}" for i in range(4)]
    assert reads == {"read_committed": sorted(committed),
                     "read_uncommitted": sorted(committed + aborted)}
    # both consumers end past the last marker: the log's end on every partition
    ends = [str(p.high_watermark) for p in broker.topic(out).partitions]
    assert {words[0]: words[1:] for words in scenario_lines(proc, "POSITION")} == {
        "read_committed": ends, "read_uncommitted": ends}
    assert broker.group(group).committed() == {TopicPartition(source, 0): 7}
    for p in broker.topic(out).partitions:
        assert p.last_stable_offset == p.high_watermark and not p.open_transactions()


def test_java_transactions_leave_the_same_offsets_as_at_kafka(served, kafka):
    """The same scenario against the real Kafka 4.3.1: the same records read under
    both isolation levels, and the consumers end at the same positions, so each
    transaction left one marker per partition, at the same offsets."""
    pytest.importorskip("confluent_kafka")
    from confluent_kafka.admin import NewTopic
    broker, servers = served
    answers = []
    for bootstrap in (kafka.bootstrap_servers, servers):
        out, source, group = unique("jt-out"), unique("jt-in"), unique("jt-group")
        create_topics(bootstrap, [NewTopic(out, PARTITIONS, 1), NewTopic(source, 1, 1)])
        proc = _run("TransactionScenarios", "transactions", bootstrap, out, PARTITIONS,
                    source, group)
        assert proc.returncode == 0, describe(proc)
        answers.append((scenario_lines(proc, "READ"), scenario_lines(proc, "POSITION")))
    assert answers[0] == answers[1]


def test_java_a_second_producer_of_the_id_fences_the_first(served):
    broker, servers = served
    topic = f"jt-fence-{next(_names)}"
    broker.create_topic(topic, 1)
    proc = _run("TransactionScenarios", "fence", servers, topic)
    assert proc.returncode == 0, describe(proc)
    wait_all_completed(broker)
    assert scenario_lines(proc, "FENCED") == [
        ["org.apache.kafka.common.errors.ProducerFencedException"]]
    partition = broker.topic(topic).partition(0)
    assert [r.value for r in partition.read(0, isolation_level="read_committed")] == [
        b"live"]


def test_kafka_transactions_tool_lists_and_describes_an_open_transaction(served):
    """Kafka's own kafka-transactions (TransactionsCommand: ListTransactions on every
    broker, FindCoordinator for the id, DescribeTransactions) sees an embedded
    producer's open transaction: one namespace of transactional ids."""
    broker, servers = served
    topic, txn_id = f"jt-tool-{next(_names)}", f"tool-{next(_names)}"
    broker.create_topic(topic, 1)
    with broker.producer(transactional_id=txn_id) as producer:
        producer.init_transactions()
        producer.begin_transaction()
        producer.send(topic, b"v", key=b"k")
        producer.flush()
        listed = tool("org.apache.kafka.tools.TransactionsCommand", "--bootstrap-server",
                      servers, "list").stdout.split("\n")
        described = tool("org.apache.kafka.tools.TransactionsCommand", "--bootstrap-server",
                         servers, "describe", "--transactional-id", txn_id).stdout
        producer.commit_transaction()
    assert listed[0].split() == ["TransactionalId", "Coordinator", "ProducerId",
                                 "TransactionState"]
    row = next(line.split() for line in listed if line.split()[:1] == [txn_id])
    assert row[3] == "Ongoing"
    header, values = (line.split() for line in described.strip().split("\n"))
    fields = dict(zip(header, values))
    assert (fields["TransactionalId"], fields["TransactionState"],
            fields["TopicPartitions"]) == (txn_id, "Ongoing", f"{topic}-0")
    assert fields["ProducerId"] == row[2]


def _streams(servers, tmp_path, guarantee, records):
    from confluent_kafka import Producer
    from confluent_kafka.admin import NewTopic
    source, sink = unique("eos-in"), unique("eos-out")
    create_topics(servers, [NewTopic(source, PARTITIONS, 1), NewTopic(sink, PARTITIONS, 1)])
    producer = Producer({"bootstrap.servers": servers, "linger.ms": 5})
    for i in range(records):
        value = f"drop-{i}" if i % 5 == 0 else f"value-{i}"
        producer.produce(source, value.encode(), f"k{i % 7}".encode(),
                         partition=i % PARTITIONS, timestamp=STAMP_MS + i)
    assert producer.flush(30) == 0
    proc = _run("StatelessStreams", servers, unique("eos-app"), source, sink, records,
                tmp_path / f"state-{guarantee}", guarantee)
    assert proc.returncode == 0, describe(proc)
    return sink, without_offsets(kafka_rows(servers, sink))


def test_kafka_streams_exactly_once_v2_gives_the_at_least_once_output(served, tmp_path):
    """The same stateless topology under both guarantees: the same records in the same
    partitions, in the same order per input partition, each kept input record exactly
    once (read_committed); the exactly-once output holds commit markers too, so only
    its offsets differ."""
    pytest.importorskip("confluent_kafka")
    broker, servers = served
    records = 400
    _, at_least_once = _streams(servers, tmp_path, "at_least_once", records)
    sink, exactly_once = _streams(servers, tmp_path, "exactly_once_v2", records)
    # an output partition interleaves the input partitions' tasks as they happen to run:
    # what Streams orders is each input partition's records
    assert _by_origin(exactly_once) == _by_origin(at_least_once)
    kept = [i for i in range(records) if i % 5]
    values = sorted(row[1] for rows in exactly_once.values() for row in rows)
    assert values == sorted(f"VALUE-{i}|k{i % 7}".encode() for i in kept)
    # it ran in transactions: the sink holds their commit markers past the records
    stored = sum(p.high_watermark for p in broker.topic(sink).partitions)
    assert stored > len(kept)
    assert all(not p.open_transactions() for p in broker.topic(sink).partitions)


def _by_origin(output):
    """{(output partition, input partition): [rows in output order]}; the input
    partition is n % PARTITIONS, n read back from the value."""
    out = {}
    for partition, rows in output.items():
        for row in rows:
            n = int(row[1].split(b"|")[0].split(b"-")[1])
            out.setdefault((partition, n % PARTITIONS), []).append(row)
    return out
