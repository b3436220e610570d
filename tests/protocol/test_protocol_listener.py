"""The Kafka listener on a real socket, driven request by request (our codec on the
client side, so each answer can be checked field by field): ApiVersions and its KIP-511
fallback, Metadata with auto-creation, Produce with de-duplication of a retried batch,
Fetch returning the stored bytes and long-polling on the doorbell, ListOffsets,
CreateTopics/DeleteTopics/CreatePartitions, DescribeConfigs, and the handle's life."""

import multiprocessing
import socket
import struct
import threading

import pytest

import logkit
from logkit.protocol import errors as E
from tests.helpers.raw_kafka import Raw
from tests.helpers.waits import wait_for_doorbell_wait


@pytest.fixture
def broker(tmp_path):
    with logkit.Broker(tmp_path / "data", config={"num.partitions": 2}) as b:
        yield b


@pytest.fixture
def server(broker):
    with broker.serve() as s:
        yield s


@pytest.fixture
def raw(server):
    client = Raw(server)
    yield client
    client.close()


def _batch(values, key=b"k", producer=(-1, -1, -1)):
    builder = logkit.BatchBuilder()
    for value in values:
        builder.append(key, value)
    batch = builder.build()
    if producer[0] != -1:
        logkit.stamp_producer(batch, *producer)
    return bytes(batch)


def _produce(raw, topic, partition, records, version=9, acks=-1):
    body = {"transactional_id": None, "acks": acks, "timeout_ms": 5000,
            "topic_data": [{"name": topic, "partition_data": [
                {"index": partition, "records": records}]}]}
    if acks == 0:
        raw.send(0, version, body)
        return None
    return raw.call(0, version, body)["responses"][0]["partition_responses"][0]


def test_the_handle_has_its_address_and_closes_twice(broker):
    server = broker.serve()
    assert server.host == "127.0.0.1" and server.port > 0
    assert server.bootstrap_servers == f"127.0.0.1:{server.port}"
    server.close()
    server.close()
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", server.port), timeout=2).recv(1)


def test_the_listener_closes_with_its_broker(tmp_path):
    broker = logkit.Broker(tmp_path)
    server = broker.serve()
    broker.close()
    assert server.closed


def test_api_versions_lists_every_served_api_with_its_range(raw):
    answer = raw.call(18, 3, {"client_software_name": "t", "client_software_version": "1"})
    assert answer["error_code"] == 0
    ranges = {k["api_key"]: (k["min_version"], k["max_version"]) for k in answer["api_keys"]}
    assert ranges[0] == (0, 11) and ranges[1] == (4, 16) and ranges[18] == (0, 4)
    assert set(ranges) >= {0, 1, 2, 3, 8, 9, 10, 11, 12, 13, 14, 15, 16, 19, 20, 22, 32, 37}


def test_api_versions_above_our_maximum_gets_the_v0_shaped_fallback(raw):
    raw.correlation += 1
    frame = bytearray(struct.pack(">hhih", 18, 9, raw.correlation, 1) + b"x")
    frame += b"\x00garbage-of-a-future-version"
    raw.sock.sendall(struct.pack(">i", len(frame)) + frame)
    answer = raw.receive(18, 0)
    assert answer["error_code"] == E.UNSUPPORTED_VERSION
    assert any(k["api_key"] == 18 and k["max_version"] == 4 for k in answer["api_keys"])


def test_metadata_auto_creates_with_num_partitions_unless_told_not_to(raw, broker):
    answer = raw.call(3, 12, {"topics": [{"name": "made", "topic_id": bytes(16)}],
                              "allow_auto_topic_creation": True})
    topic = answer["topics"][0]
    assert topic["error_code"] == 0 and len(topic["partitions"]) == 2
    assert topic["topic_id"] == bytes.fromhex(broker.topic("made").topic_id)
    answer = raw.call(3, 12, {"topics": [{"name": "not-made", "topic_id": bytes(16)}],
                              "allow_auto_topic_creation": False})
    assert answer["topics"][0]["error_code"] == E.UNKNOWN_TOPIC_OR_PARTITION
    assert "not-made" not in broker.topics()
    assert answer["brokers"][0]["port"] == raw.sock.getpeername()[1]


def test_metadata_refuses_auto_creation_when_the_broker_disables_it(tmp_path):
    with logkit.Broker(tmp_path, config={"auto.create.topics.enable": False}) as b, \
            b.serve() as s:
        client = Raw(s)
        answer = client.call(3, 4, {"topics": [{"name": "x"}],
                                    "allow_auto_topic_creation": True})
        client.close()
        assert answer["topics"][0]["error_code"] == E.UNKNOWN_TOPIC_OR_PARTITION
        assert b.topics() == []


def test_produce_stores_the_batch_and_fetch_returns_the_same_bytes(raw, broker):
    broker.create_topic("t", 1)
    batch = _batch([b"a", b"b", b"c"])
    first = _produce(raw, "t", 0, batch)
    second = _produce(raw, "t", 0, _batch([b"d"]))
    assert (first["error_code"], first["base_offset"]) == (0, 0)
    assert (second["error_code"], second["base_offset"]) == (0, 3)
    assert [r.value for r in broker.topic("t").partition(0).read(0)] == [b"a", b"b", b"c",
                                                                         b"d"]
    answer = raw.call(1, 12, {"max_wait_ms": 0, "min_bytes": 1, "max_bytes": 1 << 20,
                              "isolation_level": 0, "session_id": 0, "session_epoch": -1,
                              "topics": [{"topic": "t", "partitions": [
                                  {"partition": 0, "fetch_offset": 1,
                                   "partition_max_bytes": 1 << 20}]}],
                              "forgotten_topics_data": [], "rack_id": ""})
    part = answer["responses"][0]["partitions"][0]
    assert part["high_watermark"] == 4
    # a fetch from the middle of a batch returns the whole batch, as stored
    assert part["records"] == broker.topic("t").partition(0).batches_since(0)
    # only baseOffset and partitionLeaderEpoch (bytes 0-16) were stamped
    assert part["records"][16:len(batch)] == batch[16:]


def test_a_retried_idempotent_batch_is_answered_with_its_offset_and_not_written(raw,
                                                                                broker):
    broker.create_topic("t", 1)
    answer = raw.call(22, 4, {"transactional_id": None, "transaction_timeout_ms": 60000,
                              "producer_id": -1, "producer_epoch": -1})
    producer_id = answer["producer_id"]
    assert answer["error_code"] == 0 and producer_id >= 0
    first = _batch([b"x1", b"x2"], producer=(producer_id, 0, 0))
    second = _batch([b"y1"], producer=(producer_id, 0, 2))
    assert _produce(raw, "t", 0, first)["base_offset"] == 0
    assert _produce(raw, "t", 0, second)["base_offset"] == 2
    again = _produce(raw, "t", 0, first)
    assert (again["error_code"], again["base_offset"]) == (0, 0)
    assert broker.topic("t").partition(0).log_end_offset == 3
    gap = _produce(raw, "t", 0, _batch([b"z"], producer=(producer_id, 0, 7)))
    assert gap["error_code"] == E.OUT_OF_ORDER_SEQUENCE_NUMBER
    assert broker.topic("t").partition(0).log_end_offset == 3


def test_a_retry_is_recognised_by_a_restarted_listener(tmp_path):
    path = tmp_path / "d"
    batch = _batch([b"once"], producer=(12345, 0, 0))
    for expected_end in (1, 1):
        with logkit.Broker(path) as b, b.serve() as s:
            if "t" not in b.topics():
                b.create_topic("t", 1)
            client = Raw(s)
            answer = _produce(client, "t", 0, batch)
            client.close()
            assert (answer["error_code"], answer["base_offset"]) == (0, 0)
            assert b.topic("t").partition(0).log_end_offset == expected_end


def test_bad_batches_are_refused_per_partition_and_nothing_is_written(raw, broker):
    broker.create_topic("t", 1)
    good = bytearray(_batch([b"a"]))
    flipped = bytearray(good)
    flipped[-1] ^= 0xFF
    assert _produce(raw, "t", 0, bytes(flipped))["error_code"] == E.CORRUPT_MESSAGE
    assert _produce(raw, "t", 0, bytes(good[:-3]))["error_code"] == E.CORRUPT_MESSAGE
    assert _produce(raw, "t", 0, bytes(good) * 2)["error_code"] == E.INVALID_RECORD
    old = bytearray(good)
    old[16] = 1
    assert _produce(raw, "t", 0, bytes(old))["error_code"] == \
        E.UNSUPPORTED_FOR_MESSAGE_FORMAT
    assert _produce(raw, "t", 5, bytes(good))["error_code"] == E.UNKNOWN_TOPIC_OR_PARTITION
    assert _produce(raw, "nope", 0, bytes(good))["error_code"] == \
        E.UNKNOWN_TOPIC_OR_PARTITION
    assert broker.topic("t").partition(0).log_end_offset == 0


def test_acks_zero_gets_no_answer_but_the_batch_is_stored(raw, broker):
    broker.create_topic("t", 1)
    _produce(raw, "t", 0, _batch([b"quiet"]), acks=0)
    answer = raw.call(18, 0, {})                 # answered next: nothing came before it
    assert answer["error_code"] == 0
    assert broker.topic("t").partition(0).log_end_offset == 1


def _append_when_told(path, topic, go):
    go.wait(30)
    with logkit.Broker(path, background=False) as b:
        b.topic(topic).partition(0).append([(b"k", b"late", None, None)])


def test_a_long_poll_fetch_is_woken_by_an_append_in_another_process(raw, broker):
    """The child appends only once the listener's Fetch handler is asleep on the
    doorbell (seen on its thread's stack), so the append is what ends the wait."""
    broker.create_topic("t", 1)
    ctx = multiprocessing.get_context("spawn")
    go = ctx.Event()
    child = ctx.Process(target=_append_when_told, args=(broker.path, "t", go))
    child.start()
    answers = []
    # max_wait 30 s: the socket's 20 s timeout fails the test if only the wait ends it
    fetching = threading.Thread(target=lambda: answers.append(raw.call(1, 11, {
        "max_wait_ms": 30000, "min_bytes": 1, "max_bytes": 1 << 20, "isolation_level": 0,
        "session_id": 0, "session_epoch": -1,
        "topics": [{"topic": "t", "partitions": [
            {"partition": 0, "fetch_offset": 0, "partition_max_bytes": 1 << 20}]}],
        "forgotten_topics_data": [], "rack_id": ""})))
    fetching.start()
    try:
        wait_for_doorbell_wait(under="fetch")
    finally:
        go.set()
    fetching.join(30)
    child.join(30)
    assert not fetching.is_alive() and child.exitcode == 0
    part = answers[0]["responses"][0]["partitions"][0]
    assert part["high_watermark"] == 1 and part["records"]


def test_fetch_out_of_range_and_unknown_topic_ids_are_errors(raw, broker):
    broker.create_topic("t", 1)
    body = {"max_wait_ms": 0, "min_bytes": 0, "max_bytes": 1 << 20, "isolation_level": 0,
            "session_id": 0, "session_epoch": -1, "forgotten_topics_data": [],
            "rack_id": ""}
    answer = raw.call(1, 12, {**body, "topics": [{"topic": "t", "partitions": [
        {"partition": 0, "fetch_offset": 5, "partition_max_bytes": 100}]}]})
    assert answer["responses"][0]["partitions"][0]["error_code"] == E.OFFSET_OUT_OF_RANGE
    # empty records, never null: librdkafka takes a null record set for a parse failure
    assert answer["responses"][0]["partitions"][0]["records"] == b""
    answer = raw.call(1, 13, {**body, "topics": [{"topic_id": b"\x01" * 16, "partitions": [
        {"partition": 0, "fetch_offset": 0, "partition_max_bytes": 100}]}]})
    assert answer["responses"][0]["partitions"][0]["error_code"] == E.UNKNOWN_TOPIC_ID
    topic_id = bytes.fromhex(broker.topic("t").topic_id)
    answer = raw.call(1, 13, {**body, "topics": [{"topic_id": topic_id, "partitions": [
        {"partition": 0, "fetch_offset": 0, "partition_max_bytes": 100}]}]})
    assert answer["responses"][0]["partitions"][0]["error_code"] == 0


def test_list_offsets_earliest_latest_and_by_timestamp(raw, broker):
    p = broker.create_topic("t", 1).partition(0)
    p.append([(b"k", b"a", None, 1000), (b"k", b"b", None, 2000)])
    p.append([(b"k", b"c", None, 3000)])

    def ask(timestamp, version=8):
        answer = raw.call(2, version, {"replica_id": -1, "isolation_level": 0, "topics": [
            {"name": "t", "partitions": [{"partition_index": 0, "timestamp": timestamp}]}]})
        return answer["topics"][0]["partitions"][0]

    assert ask(-2)["offset"] == 0
    assert ask(-1)["offset"] == 3
    assert (ask(1500)["offset"], ask(1500)["timestamp"]) == (1, 2000)
    assert ask(9999)["offset"] == -1
    assert (ask(-3)["offset"], ask(-3)["timestamp"]) == (2, 3000)
    assert ask(-1, version=0)["old_style_offsets"] == [3]


def test_create_delete_and_grow_topics(raw, broker):
    answer = raw.call(19, 7, {"topics": [
        {"name": "new", "num_partitions": 3, "replication_factor": 1, "assignments": [],
         "configs": [{"name": "retention.ms", "value": "1000"}]},
        {"name": "bad/name", "num_partitions": 1, "replication_factor": 1,
         "assignments": [], "configs": []},
        {"name": "wide", "num_partitions": 1, "replication_factor": 3, "assignments": [],
         "configs": []},
        {"name": "none", "num_partitions": 1, "replication_factor": 0, "assignments": [],
         "configs": []}],
        "timeout_ms": 1000, "validate_only": False})
    codes = [t["error_code"] for t in answer["topics"]]
    assert codes == [0, E.INVALID_TOPIC_EXCEPTION, 0, E.INVALID_REPLICATION_FACTOR]
    assert answer["topics"][2]["replication_factor"] == 3       # passed to create_topic
    assert broker.topic("wide").replication_factor == 3 and "none" not in broker.topics()
    assert broker.topic("new").num_partitions == 3
    assert broker.topic("new").config["retention.ms"] == 1000
    again = raw.call(19, 4, {"topics": [{"name": "new", "num_partitions": 1,
                                         "replication_factor": -1, "assignments": [],
                                         "configs": []}], "timeout_ms": 1000})
    assert again["topics"][0]["error_code"] == E.TOPIC_ALREADY_EXISTS
    smaller = raw.call(37, 3, {"topics": [{"name": "new", "count": 2, "assignments": None}],
                               "timeout_ms": 1000, "validate_only": False})
    assert smaller["results"][0]["error_code"] == E.INVALID_PARTITIONS
    deleted = raw.call(20, 4, {"topic_names": ["new", "ghost"], "timeout_ms": 1000})
    assert [r["error_code"] for r in deleted["responses"]] == \
        [0, E.UNKNOWN_TOPIC_OR_PARTITION]
    assert "new" not in broker.topics()


def test_describe_configs_returns_every_topic_config_with_its_source(raw, broker):
    broker.create_topic("t", 1, config={"retention.ms": 5000})
    answer = raw.call(32, 4, {"resources": [
        {"resource_type": 2, "resource_name": "t", "configuration_keys": None},
        {"resource_type": 2, "resource_name": "ghost", "configuration_keys": None}],
        "include_synonyms": False, "include_documentation": False})
    result, missing = answer["results"]
    configs = {c["name"]: c for c in result["configs"]}
    assert set(configs) == set(broker.topic("t").config)
    assert configs["retention.ms"]["value"] == "5000"
    assert configs["retention.ms"]["config_source"] == 1          # DYNAMIC_TOPIC_CONFIG
    assert configs["cleanup.policy"]["config_source"] == 5        # DEFAULT_CONFIG
    assert missing["error_code"] == E.UNKNOWN_TOPIC_OR_PARTITION


def test_an_unknown_api_key_closes_the_connection_and_others_go_on(server):
    bad, good = Raw(server), Raw(server)
    frame = struct.pack(">hhih", 999, 0, 1, -1)
    bad.sock.sendall(struct.pack(">i", len(frame)) + frame)
    assert bad.sock.recv(10) == b""
    assert good.call(18, 0, {})["error_code"] == 0
    bad.close()
    good.close()


def test_a_topic_deleted_and_recreated_elsewhere_is_seen_by_produce_and_fetch(raw, broker,
                                                                             tmp_path):
    broker.create_topic("t", 1)
    assert _produce(raw, "t", 0, _batch([b"old"]))["base_offset"] == 0
    with logkit.Broker(broker.path, background=False) as other:   # "another process"
        other.delete_topic("t")
        other.create_topic("t", 2)
    first = _produce(raw, "t", 0, _batch([b"new"]))
    assert first["error_code"] in (0, E.UNKNOWN_TOPIC_OR_PARTITION)
    if first["error_code"]:                                  # the client's retry
        first = _produce(raw, "t", 0, _batch([b"new"]))
    assert (first["error_code"], first["base_offset"]) == (0, 0)
    assert _produce(raw, "t", 1, _batch([b"p1"]))["error_code"] == 0
    assert [r.value for r in broker.topic("t").partition(0).read(0)] == [b"new"]


def test_create_topics_takes_a_replica_assignment_on_this_broker_only(raw, broker):
    def create(name, broker_ids):
        answer = raw.call(19, 7, {"topics": [
            {"name": name, "num_partitions": -1, "replication_factor": -1,
             "assignments": [{"partition_index": n, "broker_ids": broker_ids}
                             for n in range(3)], "configs": []}],
            "timeout_ms": 1000, "validate_only": False})
        return answer["topics"][0]["error_code"]

    assert create("placed", [1]) == 0
    assert broker.topic("placed").num_partitions == 3
    assert create("elsewhere", [2]) == E.INVALID_REPLICA_ASSIGNMENT
    assert "elsewhere" not in broker.topics()


def test_a_connection_with_no_thread_to_serve_it_is_refused_and_accepting_goes_on(
        server, monkeypatch):
    """Thread.start raising (the process is at its thread limit) used to end the accept
    loop: the listener stopped answering for good."""
    import threading
    real_start = threading.Thread.start
    failures = []

    def start(thread):
        if "-conn-" in thread.name and not failures:
            failures.append(thread.name)
            raise RuntimeError("can't start new thread")
        return real_start(thread)

    monkeypatch.setattr(threading.Thread, "start", start)
    refused = Raw(server, timeout_s=10.0)
    try:
        with pytest.raises((ConnectionError, OSError)):
            refused.call(18, 0, {})
    finally:
        refused.close()
    assert failures
    served = Raw(server, timeout_s=10.0)
    try:
        assert served.call(18, 0, {})["error_code"] == 0
    finally:
        served.close()
