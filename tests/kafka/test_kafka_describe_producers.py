"""Kafka's own `kafka-transactions describe-producers` and `find-hanging`
(org.apache.kafka.tools.TransactionsCommand: Admin.describeProducers, DescribeProducers
v0 sent to the partition's leader) against logkit's listener and against the real
Kafka 4.3.1, after the same producer actions from confluent-kafka: an idempotent
producer, a committed transaction over two partitions and a transaction left open. Both
print the same columns, the same producers per partition (epoch, last sequence) and the
same CurrentTransactionStartOffset, and a last timestamp on every row; the coordinator
epoch column is not compared (Kafka's is its transaction-log partition's leader epoch,
which moves when the session's broker restarts).
An unknown partition is tests/protocol/test_describe_producers.py's: the Admin client
never sends it (its Metadata lookup retries it until default.api.timeout.ms)."""

from __future__ import annotations

import pytest

import logkit
from tests.helpers.kafka import create_topics, skip_reason
from tests.helpers.kafka_ecosystem import unique
from tests.helpers.kafka_tools import tool

pytestmark = pytest.mark.skipif(skip_reason() is not None, reason=str(skip_reason()))

TRANSACTIONS = "org.apache.kafka.tools.TransactionsCommand"
HEADERS = ["ProducerId", "ProducerEpoch", "LatestCoordinatorEpoch", "LastSequence",
           "LastTimestamp", "CurrentTransactionStartOffset"]
FLUSH_TIMEOUT_S = 30.0


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    with logkit.Broker(tmp_path_factory.mktemp("logkit-describe-producers") / "data") \
            as broker, broker.serve() as server:
        yield broker, server.bootstrap_servers


def _produce(producer, topic: str, partition: int, count: int) -> None:
    for i in range(count):
        producer.produce(topic, b"v%d" % i, b"k", partition=partition)
    assert producer.flush(FLUSH_TIMEOUT_S) == 0


def _act(servers: str, topic: str):
    """The producer actions, in one order on either broker; returns the producer whose
    transaction is left open (the caller aborts it after the tools ran)."""
    from confluent_kafka import Producer
    from confluent_kafka.admin import NewTopic
    create_topics(servers, [NewTopic(topic, 2, 1)])
    idempotent = Producer({"bootstrap.servers": servers, "enable.idempotence": True})
    _produce(idempotent, topic, 0, 3)
    done = Producer({"bootstrap.servers": servers, "transactional.id": unique("done")})
    done.init_transactions(FLUSH_TIMEOUT_S)
    done.begin_transaction()
    _produce(done, topic, 0, 1)
    _produce(done, topic, 1, 2)
    done.commit_transaction(FLUSH_TIMEOUT_S)
    left_open = Producer({"bootstrap.servers": servers, "transactional.id": unique("open")})
    left_open.init_transactions(FLUSH_TIMEOUT_S)
    left_open.begin_transaction()
    _produce(left_open, topic, 0, 2)
    return left_open


def _table(stdout: str) -> tuple[list[str], list[dict[str, str]]]:
    lines = [line.split() for line in stdout.strip().splitlines() if line.strip()]
    return lines[0], [dict(zip(lines[0], row)) for row in lines[1:]]


def _describe(servers: str, topic: str, partition: int):
    return _table(tool(TRANSACTIONS, "--bootstrap-server", servers, "describe-producers",
                       "--topic", topic, "--partition", partition).stdout)


def _seen(servers: str, topic: str) -> dict[int, object]:
    """Per partition: the printed columns and, per producer, (epoch, last sequence,
    current transaction start offset, whether a last timestamp is given), sorted
    (producer ids and times differ between brokers)."""
    out = {}
    for partition in (0, 1):
        header, rows = _describe(servers, topic, partition)
        out[partition] = (header, sorted(
            (r["ProducerEpoch"], r["LastSequence"], r["CurrentTransactionStartOffset"],
             int(r["LastTimestamp"]) > 0)
            for r in rows))
    return out


def test_describe_producers_prints_what_kafka_prints_for_the_same_producers(served, kafka):
    pytest.importorskip("confluent_kafka")
    _, servers = served
    seen = {}
    for name, bootstrap in (("kafka", kafka.bootstrap_servers), ("logkit", servers)):
        topic = unique("dp")
        left_open = _act(bootstrap, topic)
        try:
            seen[name] = _seen(bootstrap, topic)
            hanging = tool(TRANSACTIONS, "--bootstrap-server", bootstrap, "find-hanging",
                           "--topic", topic, "--max-transaction-timeout", "0").stdout
        finally:
            left_open.abort_transaction(FLUSH_TIMEOUT_S)
        # the open transaction's partition is in its coordinator's description: not
        # hanging, on either broker (ListTransactions and DescribeTransactions asked)
        assert _table(hanging) == (["Topic", "Partition", "ProducerId", "ProducerEpoch",
                                    "CoordinatorEpoch", "StartOffset", "LastTimestamp",
                                    "Duration(min)"], []), (name, hanging)
    assert seen["logkit"] == seen["kafka"]
    # p0: the idempotent producer (offsets 0-2, last sequence 2), the committed
    # transaction (3, its marker 4) and the open one's two records from 5; p1: the
    # committed transaction alone
    assert seen["logkit"] == {
        0: (HEADERS, [("0", "0", "None", True), ("0", "1", "5", True),
                      ("0", "2", "None", True)]),
        1: (HEADERS, [("0", "1", "None", True)])}


def test_describe_producers_of_a_partition_without_producers_prints_the_header_only(
        served):
    broker, servers = served
    topic = unique("dp-empty")
    broker.create_topic(topic, 1)
    assert _describe(servers, topic, 0) == (HEADERS, [])

