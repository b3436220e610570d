"""Real Kafka clients, really started, against the listener on 127.0.0.1: kafka-python
3, aiokafka and confluent-kafka (librdkafka) each create a topic, produce keyed records
with every compression codec they support, consume them in a group, commit, and a new
consumer resumes exactly after the commits. Records cross between the wire and the
embedded API both ways, and commits are the broker's own LMDB offsets."""

import asyncio
import logging

import pytest

import logkit

CODECS = ["none", "gzip", "snappy", "lz4", "zstd"]
PER_CODEC = 20


@pytest.fixture
def broker(tmp_path):
    with logkit.Broker(tmp_path / "data") as b:
        yield b


@pytest.fixture
def server(broker):
    with broker.serve() as s:
        yield s


def _expected(broker, topic):
    out = []
    for p in broker.topic(topic).partitions:
        out += [(r.key, r.value) for r in p.read(0, max_records=100000)]
    return sorted(out)


def _sent():
    return sorted((f"key-{n % 7}".encode(), f"{codec}-{n}".encode())
                  for codec in CODECS for n in range(PER_CODEC))


def _check_keyed_partitioning(broker, topic):
    topic_handle = broker.topic(topic)
    for p in topic_handle.partitions:
        for r in p.read(0, max_records=100000):
            assert topic_handle.partition_for(r.key) == p.partition


def test_kafka_python_end_to_end(broker, server):
    kafka = pytest.importorskip("kafka")
    from kafka.admin import NewTopic
    admin = kafka.KafkaAdminClient(bootstrap_servers=server.bootstrap_servers)
    admin.create_topics([NewTopic("kp", 3, 1)])
    admin.close()
    assert broker.topic("kp").num_partitions == 3
    for codec in CODECS:
        producer = kafka.KafkaProducer(bootstrap_servers=server.bootstrap_servers,
                                       compression_type=None if codec == "none" else codec)
        for n in range(PER_CODEC):
            producer.send("kp", key=f"key-{n % 7}".encode(), value=f"{codec}-{n}".encode())
        producer.flush()
        producer.close()
    assert _expected(broker, "kp") == _sent()
    _check_keyed_partitioning(broker, "kp")

    consumer = kafka.KafkaConsumer("kp", bootstrap_servers=server.bootstrap_servers,
                                   group_id="g", auto_offset_reset="earliest",
                                   enable_auto_commit=False, consumer_timeout_ms=3000)
    got = []
    for message in consumer:
        got.append((message.key, message.value))
        if len(got) == 60:
            break
    consumer.commit()
    consumer.close()
    committed = broker.group("g").committed()
    assert sum(committed.values()) == 60
    # a new member resumes exactly after the commits
    resumed = kafka.KafkaConsumer("kp", bootstrap_servers=server.bootstrap_servers,
                                  group_id="g", auto_offset_reset="earliest",
                                  enable_auto_commit=False, consumer_timeout_ms=3000)
    rest = [(m.key, m.value) for m in resumed]
    resumed.close()
    assert sorted(got + rest) == _sent()


def test_confluent_kafka_end_to_end_with_idempotence(broker, server):
    ck = pytest.importorskip("confluent_kafka")
    from confluent_kafka.admin import AdminClient, NewTopic
    admin = AdminClient({"bootstrap.servers": server.bootstrap_servers})
    for future in admin.create_topics([NewTopic("ck", 3, 1)]).values():
        assert future.result(timeout=20) is None
    for codec in CODECS:
        producer = ck.Producer({"bootstrap.servers": server.bootstrap_servers,
                                "compression.type": codec, "enable.idempotence": True,
                                "linger.ms": 5,
                                # Kafka's (and logkit's) keyed partitioner; librdkafka's
                                # default hashes keys with CRC32 instead
                                "partitioner": "murmur2_random"})
        for n in range(PER_CODEC):
            producer.produce("ck", key=f"key-{n % 7}".encode(),
                             value=f"{codec}-{n}".encode())
        assert producer.flush(20) == 0
    assert _expected(broker, "ck") == _sent()
    _check_keyed_partitioning(broker, "ck")

    def consume(limit):
        consumer = ck.Consumer({"bootstrap.servers": server.bootstrap_servers,
                                "group.id": "g", "auto.offset.reset": "earliest",
                                "enable.auto.commit": False})
        consumer.subscribe(["ck"])
        got, idle = [], 0
        while len(got) < limit and idle < 20:
            message = consumer.poll(0.25)
            if message is None:
                idle += 1
                continue
            assert message.error() is None, message.error()
            got.append((message.key(), message.value()))
        consumer.commit(asynchronous=False)
        consumer.close()
        return got

    first = consume(60)
    assert sum(broker.group("g").committed().values()) == 60
    rest = consume(10 ** 6)
    assert sorted(first + rest) == _sent()


def test_aiokafka_end_to_end(broker, server):
    aiokafka = pytest.importorskip("aiokafka")
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic

    async def run():
        admin = AIOKafkaAdminClient(bootstrap_servers=server.bootstrap_servers)
        await admin.start()
        await admin.create_topics([NewTopic("ak", 3, 1)])
        await admin.close()
        for codec in CODECS:
            producer = aiokafka.AIOKafkaProducer(
                bootstrap_servers=server.bootstrap_servers,
                compression_type=None if codec == "none" else codec)
            await producer.start()
            for n in range(PER_CODEC):
                await producer.send("ak", key=f"key-{n % 7}".encode(),
                                    value=f"{codec}-{n}".encode())
            await producer.stop()

        async def consume(limit):
            consumer = aiokafka.AIOKafkaConsumer(
                "ak", bootstrap_servers=server.bootstrap_servers, group_id="g",
                auto_offset_reset="earliest", enable_auto_commit=False)
            await consumer.start()
            got, idle = [], 0
            while len(got) < limit and idle < 6:
                batch = await consumer.getmany(timeout_ms=500, max_records=limit - len(got))
                idle = 0 if batch else idle + 1
                for messages in batch.values():
                    got += [(m.key, m.value) for m in messages]
            await consumer.commit()
            await consumer.stop()
            return got

        first = await consume(60)
        committed = sum(broker.group("g").committed().values())
        rest = await consume(10 ** 6)
        return first, committed, rest

    first, committed, rest = asyncio.run(run())
    assert committed == 60
    assert sorted(first + rest) == _sent()
    assert _expected(broker, "ak") == _sent()
    _check_keyed_partitioning(broker, "ak")


def test_records_cross_between_the_wire_and_the_embedded_api(broker, server):
    kafka = pytest.importorskip("kafka")
    broker.create_topic("x", 1)
    embedded = broker.producer()
    embedded.send("x", b"from-embedded", key=b"e", headers=[("h", b"1")]).result()
    embedded.flush()
    producer = kafka.KafkaProducer(bootstrap_servers=server.bootstrap_servers)
    producer.send("x", key=b"w", value=b"from-wire", headers=[("h", b"2")],
                  timestamp_ms=1700000000000).get(timeout=20)
    producer.close()
    consumer = kafka.KafkaConsumer("x", bootstrap_servers=server.bootstrap_servers,
                                   auto_offset_reset="earliest", consumer_timeout_ms=2000)
    wire = [(m.key, m.value, m.headers) for m in consumer]
    consumer.close()
    assert wire == [(b"e", b"from-embedded", [("h", b"1")]),
                    (b"w", b"from-wire", [("h", b"2")])]
    local = broker.consumer("x", auto_offset_reset="earliest")
    records = local.poll(timeout_ms=2000)
    assert [(r.key, r.value, r.timestamp) for r in records][1] == \
        (b"w", b"from-wire", 1700000000000)


logging.getLogger("kafka").setLevel(logging.CRITICAL)


def test_the_kafka_clients_example_runs(tmp_path):
    """examples/kafka_clients.py: both clients' records reach the embedded API and the
    wire group's commits reach the broker."""
    pytest.importorskip("confluent_kafka")
    pytest.importorskip("kafka")
    import os
    import sys
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(__file__))), "examples"))
    import kafka_clients
    result = kafka_clients.run(str(tmp_path / "d"))
    expected = [b"order-0", b"order-1", b"order-2", b"order-9"]
    assert result == {"embedded": expected, "wire": expected, "committed": 4}


def _versions(server, prefix):
    seen = {}
    for (client_id, api, version), _ in server.versions_seen.items():
        if client_id.startswith(prefix):
            seen[api] = max(seen.get(api, -1), version)
    return seen


def test_each_client_negotiates_its_own_newest_versions(broker, server, capsys):
    """The matrix of client x API x version that ran, printed with -s; each client lands
    on its own maxima (flexible versions for kafka-python 3 and librdkafka)."""
    kafka = pytest.importorskip("kafka")
    ck = pytest.importorskip("confluent_kafka")
    broker.create_topic("v", 1)
    kp = kafka.KafkaProducer(bootstrap_servers=server.bootstrap_servers, client_id="kp-v")
    kp.send("v", b"1").get(timeout=20)
    kp.close()
    kc = kafka.KafkaConsumer("v", bootstrap_servers=server.bootstrap_servers,
                             client_id="kp-v", group_id="gv", auto_offset_reset="earliest",
                             consumer_timeout_ms=1500)
    assert [m.value for m in kc] == [b"1"]
    kc.commit()
    kc.close()
    producer = ck.Producer({"bootstrap.servers": server.bootstrap_servers,
                            "client.id": "ck-v"})
    producer.produce("v", b"2")
    assert producer.flush(20) == 0
    consumer = ck.Consumer({"bootstrap.servers": server.bootstrap_servers,
                            "client.id": "ck-v", "group.id": "gv2",
                            "auto.offset.reset": "earliest"})
    consumer.subscribe(["v"])
    got = []
    for _ in range(80):
        message = consumer.poll(0.25)
        if message is not None and message.error() is None:
            got.append(message.value())
        if len(got) == 2:
            break
    consumer.commit(asynchronous=False)
    consumer.close()
    assert got == [b"1", b"2"]
    matrix = {"kafka-python": _versions(server, "kp-v"),
              "confluent-kafka": _versions(server, "ck-v")}
    with capsys.disabled():
        for client, apis in matrix.items():
            print(f"\n{client}: " + ", ".join(f"{a} v{v}" for a, v in sorted(apis.items())))
    for client, apis in matrix.items():
        assert apis["Produce"] >= 9 and apis["Fetch"] >= 12 and apis["Metadata"] >= 9, \
            (client, apis)
        assert apis["OffsetCommit"] >= 8 and apis["JoinGroup"] >= 5, (client, apis)
