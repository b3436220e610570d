"""Real clients' transactions against the listener: confluent-kafka (librdkafka 2),
kafka-python 3 and aiokafka (the v0 transaction APIs) each run a committed, an aborted
and a committed transaction with consumed offsets sent into it; a read_committed
consumer of the same client then reads exactly the committed records, a
read_uncommitted one every record, the group's committed offset appears with the
commit, and the log holds one marker per partition per transaction. A second producer
of the same transactional id fences the first (confluent-kafka)."""

from __future__ import annotations

import asyncio
import itertools

import pytest

import logkit
from logkit import TopicPartition
from tests.helpers.txn_waits import wait_all_completed, wait_completed, wait_stable

PARTITIONS = 2
_names = itertools.count()

COMMITTED_1 = [b"c1-%d" % n for n in range(6)]
ABORTED = [b"ab-%d" % n for n in range(4)]
COMMITTED_2 = [b"c2-%d" % n for n in range(3)]
INPUT_OFFSET = 7                         # the offset each client sends in its last txn


@pytest.fixture
def broker(tmp_path):
    with logkit.Broker(tmp_path / "data") as b:
        yield b


@pytest.fixture
def server(broker):
    with broker.serve() as s:
        yield s


@pytest.fixture
def topics(broker):
    n = next(_names)
    out, source = f"out-{n}", f"in-{n}"
    broker.create_topic(out, PARTITIONS)
    broker.create_topic(source, 1)
    return out, source, f"group-{n}"


def _embedded(broker, topic, isolation_level):
    values = []
    for p in broker.topic(topic).partitions:
        values += [r.value for r in p.read(0, max_records=1000,
                                           isolation_level=isolation_level)]
    return sorted(values)


def _check_log(broker, out, source, group, committed_values):
    """What any reader sees afterwards: read_committed the committed values alone,
    read_uncommitted every value, the LSO at the high watermark, the input offset
    committed for the group, and one control record per partition per transaction.
    The listener answers EndTxn before the markers and offsets: waits for them."""
    wait_all_completed(broker)
    assert _embedded(broker, out, "read_committed") == sorted(committed_values)
    assert _embedded(broker, out, "read_uncommitted") == sorted(
        COMMITTED_1 + ABORTED + COMMITTED_2)
    for p in broker.topic(out).partitions:
        assert p.last_stable_offset == p.high_watermark
        assert p.open_transactions() == {}
    assert broker.group(group).committed()[TopicPartition(source, 0)] == INPUT_OFFSET
    markers = sum(p.high_watermark for p in broker.topic(out).partitions) - len(
        COMMITTED_1 + ABORTED + COMMITTED_2)
    touched = 3 * PARTITIONS                 # every transaction wrote to every partition
    assert markers == touched


def _keys(values):
    return [(b"k%d" % i, v) for i, v in enumerate(values)]


# ---- confluent-kafka ----------------------------------------------------------------


def _ck_consume(ck, servers, topic, isolation, expected):
    consumer = ck.Consumer({"bootstrap.servers": servers, "group.id": f"r-{next(_names)}",
                            "auto.offset.reset": "earliest", "enable.auto.commit": False,
                            "isolation.level": isolation})
    consumer.subscribe([topic])
    got = []
    deadline = 40
    try:
        while len(got) < expected and deadline > 0:
            msg = consumer.poll(0.5)
            deadline -= 0.5
            if msg is not None and msg.error() is None:
                got.append(msg.value())
        # a little more, to see that nothing else arrives
        for _ in range(4):
            msg = consumer.poll(0.25)
            if msg is not None and msg.error() is None:
                got.append(msg.value())
    finally:
        consumer.close()
    return sorted(got)


def test_confluent_kafka_transactions_and_read_committed(broker, server, topics):
    ck = pytest.importorskip("confluent_kafka")
    out, source, group = topics
    servers = server.bootstrap_servers
    producer = ck.Producer({"bootstrap.servers": servers, "transactional.id": f"ck-{out}",
                            "linger.ms": 5})
    producer.init_transactions(30)
    for values, commit in ((COMMITTED_1, True), (ABORTED, False)):
        producer.begin_transaction()
        for i, (key, value) in enumerate(_keys(values)):
            producer.produce(out, value, key, partition=i % PARTITIONS)
        producer.flush(30)
        if commit:
            producer.commit_transaction(30)
        else:
            # an open transaction holds the LSO back: read_committed sees nothing of it
            first = broker.topic(out).partition(0)
            assert first.last_stable_offset < first.high_watermark
            producer.abort_transaction(30)
    producer.begin_transaction()
    for i, (key, value) in enumerate(_keys(COMMITTED_2)):
        producer.produce(out, value, key, partition=i % PARTITIONS)
    metadata = ck.Consumer({"bootstrap.servers": servers, "group.id": group})
    producer.send_offsets_to_transaction(
        [ck.TopicPartition(source, 0, INPUT_OFFSET)], metadata.consumer_group_metadata(),
        30)
    metadata.close()
    producer.commit_transaction(30)
    producer.flush(30)
    committed = COMMITTED_1 + COMMITTED_2
    _check_log(broker, out, source, group, committed)
    assert _ck_consume(ck, servers, out, "read_committed", len(committed)) == \
        sorted(committed)
    assert _ck_consume(ck, servers, out, "read_uncommitted", len(committed + ABORTED)) \
        == sorted(committed + ABORTED)


def test_confluent_kafka_a_second_producer_of_the_id_fences_the_first(broker, server,
                                                                      topics):
    """init_transactions of a new producer aborts the old one's open transaction and
    fences it: the old producer's commit fails fatally, its records never become
    visible to read_committed."""
    ck = pytest.importorskip("confluent_kafka")
    out, _, _ = topics
    conf = {"bootstrap.servers": server.bootstrap_servers,
            "transactional.id": f"fence-{out}"}
    old = ck.Producer(conf)
    old.init_transactions(30)
    old.begin_transaction()
    old.produce(out, b"zombie", b"k", partition=0)
    old.flush(30)
    new = ck.Producer(conf)
    new.init_transactions(30)
    with pytest.raises(ck.KafkaException) as raised:
        old.commit_transaction(30)
    assert raised.value.args[0].fatal() or raised.value.args[0].txn_requires_abort()
    new.begin_transaction()
    new.produce(out, b"live", b"k", partition=0)
    new.commit_transaction(30)
    wait_stable(broker, out)
    assert _embedded(broker, out, "read_committed") == [b"live"]
    assert _embedded(broker, out, "read_uncommitted") == [b"live", b"zombie"]


# ---- kafka-python 3 -----------------------------------------------------------------


def test_kafka_python_transactions_and_read_committed(broker, server, topics):
    kafka = pytest.importorskip("kafka")
    out, source, group = topics
    servers = server.bootstrap_servers
    producer = kafka.KafkaProducer(bootstrap_servers=servers, transactional_id=f"kp-{out}")
    producer.init_transactions()
    for values, commit in ((COMMITTED_1, True), (ABORTED, False)):
        producer.begin_transaction()
        for i, (key, value) in enumerate(_keys(values)):
            producer.send(out, value=value, key=key, partition=i % PARTITIONS)
        producer.flush()
        (producer.commit_transaction if commit else producer.abort_transaction)()
    producer.begin_transaction()
    for i, (key, value) in enumerate(_keys(COMMITTED_2)):
        producer.send(out, value=value, key=key, partition=i % PARTITIONS)
    producer.send_offsets_to_transaction(
        {kafka.TopicPartition(source, 0): kafka.OffsetAndMetadata(INPUT_OFFSET, "", -1)},
        group)
    producer.commit_transaction()
    producer.close()
    committed = COMMITTED_1 + COMMITTED_2
    _check_log(broker, out, source, group, committed)
    for isolation, expected in (("read_committed", committed),
                                ("read_uncommitted", committed + ABORTED)):
        consumer = kafka.KafkaConsumer(out, bootstrap_servers=servers,
                                       auto_offset_reset="earliest",
                                       isolation_level=isolation, consumer_timeout_ms=3000)
        got = [m.value for m in consumer]
        consumer.close()
        assert sorted(got) == sorted(expected), isolation


# ---- aiokafka -----------------------------------------------------------------------


def test_aiokafka_transactions_and_read_committed(broker, server, topics):
    aiokafka = pytest.importorskip("aiokafka")
    out, source, group = topics
    servers = server.bootstrap_servers

    async def produce():
        producer = aiokafka.AIOKafkaProducer(bootstrap_servers=servers,
                                             transactional_id=f"ak-{out}")
        await producer.start()
        try:
            async with producer.transaction():
                for i, (key, value) in enumerate(_keys(COMMITTED_1)):
                    await producer.send(out, value=value, key=key, partition=i % PARTITIONS)
            await producer.begin_transaction()
            for i, (key, value) in enumerate(_keys(ABORTED)):
                await producer.send_and_wait(out, value=value, key=key,
                                             partition=i % PARTITIONS)
            await producer.abort_transaction()
            async with producer.transaction():
                for i, (key, value) in enumerate(_keys(COMMITTED_2)):
                    await producer.send(out, value=value, key=key, partition=i % PARTITIONS)
                await producer.send_offsets_to_transaction(
                    {aiokafka.TopicPartition(source, 0): INPUT_OFFSET}, group)
        finally:
            await producer.stop()

    async def consume(isolation, expected):
        consumer = aiokafka.AIOKafkaConsumer(out, bootstrap_servers=servers,
                                             auto_offset_reset="earliest",
                                             isolation_level=isolation)
        await consumer.start()
        got = []
        try:
            for _ in range(20):
                batches = await consumer.getmany(timeout_ms=300)
                got += [m.value for ms in batches.values() for m in ms]
                if len(got) >= expected and not batches:
                    break
        finally:
            await consumer.stop()
        return sorted(got)

    asyncio.run(produce())
    committed = COMMITTED_1 + COMMITTED_2
    _check_log(broker, out, source, group, committed)
    assert asyncio.run(consume("read_committed", len(committed))) == sorted(committed)
    assert asyncio.run(consume("read_uncommitted", len(committed + ABORTED))) == sorted(
        committed + ABORTED)


def test_kafka_python_admin_lists_and_describes_an_open_transaction(broker, server, topics):
    """kafka-python's admin (ListTransactions, DescribeTransactions after FindCoordinator
    for the transactional id) sees the open transaction with its partitions, then its
    commit, in Kafka's state names."""
    kafka = pytest.importorskip("kafka")
    from kafka.admin import KafkaAdminClient
    out, _, _ = topics
    servers = server.bootstrap_servers
    txn_id = f"kp-admin-{out}"
    producer = kafka.KafkaProducer(bootstrap_servers=servers, transactional_id=txn_id)
    admin = KafkaAdminClient(bootstrap_servers=servers)
    try:
        producer.init_transactions()
        producer.begin_transaction()
        producer.send(out, value=b"v", key=b"k", partition=1)
        producer.flush()
        listed = [x for rows in admin.list_transactions(state_filters=["Ongoing"]).values()
                  for x in rows]
        assert [(x.transactional_id, str(x.state.value)) for x in listed] == [
            (txn_id, "Ongoing")]
        described = admin.describe_transactions([txn_id])[txn_id]
        assert described.state.value == "Ongoing"
        assert described.topic_partitions == {kafka.TopicPartition(out, 1)}
        assert described.transaction_start_time_ms > 0
        producer.commit_transaction()
        wait_completed(broker, txn_id)       # EndTxn is answered at PrepareCommit
        described = admin.describe_transactions([txn_id])[txn_id]
        assert described.state.value == "CompleteCommit" and not described.topic_partitions
    finally:
        admin.close()
        producer.close()
