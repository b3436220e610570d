"""Hostile Produce and Fetch requests on a real listener (issue 38, findings 1-4), sent as
raw frames because no client library builds them: a batch whose CRC is right but whose
contents lie (a record count over fewer records, garbage records, a gzip flag over junk,
lastOffsetDelta 2^31-1 over one record, codec 5/6/7) is refused per partition with
Kafka's code and nothing is written, while the other partitions of the same request are
answered; a poisoned batch already stored fails `check()` and costs a reader only the
records from it on; a Fetch listing one partition 72 times with max_bytes=-1 gets one
bounded answer. confluent-kafka and kafka-python still produce and consume every codec."""

import os
import struct
import subprocess
import sys
import textwrap
import types

import pytest

import logkit
from logkit import records as rec
from logkit.crc import crc32c
from logkit.errors import (CorruptRecordError, InvalidRecordError,
                           UnsupportedCompressionTypeError)
from logkit.protocol import errors as E
from tests.helpers.raw_kafka import Raw

NOW = 1_700_000_000_000
ROOT_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture
def broker(tmp_path):
    with logkit.Broker(tmp_path / "data") as b:
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


def _good(values=(b"a",), **fields):
    return rec.encode_batch([(b"k", v, None, NOW) for v in values], now_ms=NOW, **fields)


def _restamp(batch):
    """Make the CRC right again after a header or body edit."""
    struct.pack_into(">i", batch, 8, len(batch) - 12)
    struct.pack_into(">I", batch, 17, crc32c(bytes(batch[21:])))
    return bytes(batch)


def _with(batch, *, count=None, last_delta=None, attributes=None, body=None):
    batch = bytearray(batch)
    if body is not None:
        batch[61:] = body
    if count is not None:
        struct.pack_into(">i", batch, 57, count)
    if last_delta is not None:
        struct.pack_into(">i", batch, 23, last_delta)
    if attributes is not None:
        struct.pack_into(">h", batch, 21, attributes)
    return _restamp(batch)


def _produce(raw, topic, parts, acks=-1, version=9):
    """Produce {partition: records} in one request; returns {partition: answer}."""
    body = {"transactional_id": None, "acks": acks, "timeout_ms": 5000,
            "topic_data": [{"name": topic, "partition_data": [
                {"index": index, "records": records} for index, records in parts.items()]}]}
    answer, _ = raw.call_sized(0, version, body)
    return {p["index"]: p for p in answer["responses"][0]["partition_responses"]}


# One real record under each lie the issue lists.
def _count_over_one_record():
    return _with(_good(), count=1000, last_delta=999)


def _garbage_records():
    good = _good([b"x" * 40])
    return _with(good, body=bytes(range(7, 7 + len(good) - 61)))


def _gzip_over_junk():
    return _with(_good([b"y" * 40]), attributes=1)       # gzip


def _huge_last_delta():
    return _with(_good(), last_delta=2**31 - 1)


HOSTILE = [("count 1000 over one record", _count_over_one_record, E.INVALID_RECORD),
           ("garbage record bytes", _garbage_records, E.INVALID_RECORD),
           ("gzip flag over junk", _gzip_over_junk, E.CORRUPT_MESSAGE),
           ("lastOffsetDelta 2^31-1", _huge_last_delta, E.INVALID_RECORD)]


@pytest.mark.parametrize("name,make,code", HOSTILE, ids=[h[0] for h in HOSTILE])
def test_a_lying_batch_is_refused_and_its_neighbour_is_written(broker, raw, name, make,
                                                               code):
    broker.create_topic("t", 2)
    answers = _produce(raw, "t", {0: make(), 1: _good([b"fine"])})
    assert answers[0]["error_code"] == code, name
    assert answers[1]["error_code"] == E.NONE and answers[1]["base_offset"] == 0
    topic = broker.topic("t")
    assert topic.partition(0).log_end_offset == 0      # nothing of the lie was stored
    assert [r.value for r in topic.partition(1).read(0)] == [b"fine"]
    for p in topic.partitions:
        p.check()


@pytest.mark.parametrize("codec", [5, 6, 7])
def test_an_unknown_codec_costs_only_its_own_partition(broker, raw, codec):
    broker.create_topic("t", 3)
    bad = _with(_good([b"z"]), attributes=codec)
    answers = _produce(raw, "t", {0: _good([b"before"]), 1: bad, 2: _good([b"after"])})
    assert answers[1]["error_code"] == E.UNSUPPORTED_COMPRESSION_TYPE
    assert answers[0]["error_code"] == answers[2]["error_code"] == E.NONE
    # the connection still serves: a retry of the same request duplicates nothing
    again = _produce(raw, "t", {0: _good([b"before"]), 1: bad, 2: _good([b"after"])})
    assert again[1]["error_code"] == E.UNSUPPORTED_COMPRESSION_TYPE
    topic = broker.topic("t")
    assert [topic.partition(p).log_end_offset for p in range(3)] == [2, 0, 2]


def test_the_storage_seam_refuses_the_same_lies_with_named_errors(broker):
    partition = broker.create_topic("t", 1).partition(0)
    for name, make, code in HOSTILE:
        with pytest.raises(CorruptRecordError) as caught:
            partition.append_batch(make())
        expected = InvalidRecordError if code == E.INVALID_RECORD \
            else CorruptRecordError
        assert isinstance(caught.value, expected), name
    with pytest.raises(UnsupportedCompressionTypeError):
        partition.append_batch(_with(_good(), attributes=6))
    with pytest.raises(UnsupportedCompressionTypeError):      # unverified too
        partition.append_batch(_with(_good(), attributes=7), verify=False)
    assert partition.log_end_offset == 0
    partition.append_batch(_good([b"ok"]))
    assert [r.value for r in partition.read(0)] == [b"ok"]


def test_timestamps_that_cannot_be_are_refused(broker):
    partition = broker.create_topic("t", 1).partition(0)
    lying_max = bytearray(_good([b"a", b"b"]))
    struct.pack_into(">q", lying_max, 35, 2**62)       # maxTimestamp far past the records
    before_epoch = bytearray(_good())
    struct.pack_into(">qq", before_epoch, 27, -5, -5)
    for batch in (lying_max, before_epoch):
        with pytest.raises(InvalidRecordError):
            partition.append_batch(_restamp(batch))
    assert partition.log_end_offset == 0


def test_a_control_batch_from_a_client_is_refused(broker, raw):
    broker.create_topic("t", 1)
    answers = _produce(raw, "t", {0: bytes(_good(control=True))})
    assert answers[0]["error_code"] == E.INVALID_RECORD
    assert broker.topic("t").partition(0).log_end_offset == 0


def test_real_batches_of_every_codec_pass(broker, raw):
    broker.create_topic("t", 1)
    for codec in range(5):
        batch = _good([b"v%d" % n for n in range(50)], codec=codec)
        assert _produce(raw, "t", {0: bytes(batch)})[0]["error_code"] == E.NONE
    partition = broker.topic("t").partition(0)
    assert partition.log_end_offset == 250
    partition.check()


# ---- a poisoned batch already stored (written before this check existed) -------------

def _poison(partition, make):
    partition.append([(b"k", b"good-%d" % n, None, NOW) for n in range(3)])
    partition.append_batch(bytearray(make()), verify=False)
    return partition


@pytest.mark.parametrize("make", [_count_over_one_record, _garbage_records,
                                  _gzip_over_junk, _huge_last_delta])
def test_check_decodes_what_a_reader_decodes(broker, make):
    partition = _poison(broker.create_topic("t", 1).partition(0), make)
    with pytest.raises(CorruptRecordError):
        partition.check()


@pytest.mark.parametrize("make", [_count_over_one_record, _garbage_records,
                                  _gzip_over_junk])
def test_a_reader_gets_the_records_before_a_poisoned_batch_then_the_error(broker, make):
    partition = _poison(broker.create_topic("t", 1).partition(0), make)
    partition.append([(b"k", b"after", None, NOW)])
    assert [r.value for r in partition.read(0)] == [b"good-0", b"good-1", b"good-2"]
    with pytest.raises(CorruptRecordError):
        partition.read(3)
    records, _ = partition.fetch(0)
    assert [r.offset for r in records] == [0, 1, 2]


def test_a_consumer_polls_the_good_records_before_a_poisoned_batch(broker):
    _poison(broker.create_topic("t", 1).partition(0), _garbage_records)
    consumer = broker.consumer(group_id=None, auto_offset_reset="earliest")
    consumer.assign([logkit.TopicPartition("t", 0)])
    got = consumer.poll(timeout_ms=2000)
    assert [r.value for r in got] == [b"good-0", b"good-1", b"good-2"]
    with pytest.raises(CorruptRecordError):
        consumer.poll(timeout_ms=2000)
    consumer.close()


# ---- the same checks in C and in pure Python ----------------------------------------

def test_the_compiled_and_python_record_checks_agree():
    if rec._speedups is None:
        pytest.skip("the compiled accelerator is not built")
    good = bytes(_good([b"a" * n for n in range(1, 30)]))
    headers = bytes(rec.encode_batch([(b"k", b"v", [("h", b"1"), ("\u00e9", None)], NOW)],
                                     now_ms=NOW))
    bad_utf8 = headers.replace("\u00e9".encode(), b"\xff\xfe")
    cases = [good, headers, _restamp(bytearray(bad_utf8)), _count_over_one_record(),
             _garbage_records(), _huge_last_delta(),
             _with(_good([b"a", b"b"]), count=1, last_delta=0),
             _with(good, body=good[61:] + b"\x00"), _with(good, body=good[61:-1])]
    for batch in cases:
        header = rec.read_header(batch, 0, len(batch))
        outcomes = []
        for check in (rec._speedups.check_records, rec._check_records_py):
            try:
                outcomes.append(check(batch, 61, len(batch), header.records_count,
                                      header.base_timestamp))
            except (ValueError, IndexError) as exc:
                outcomes.append(type(exc) if isinstance(exc, UnicodeDecodeError)
                                else ValueError)
        assert outcomes[0] == outcomes[1], batch


def test_pure_python_refuses_the_same_lies(tmp_path):
    script = textwrap.dedent(f"""
        import logkit, tests.protocol.test_hostile_produce as t
        from logkit.errors import CorruptRecordError, InvalidRecordError
        assert logkit.records._speedups is None
        with logkit.Broker({str(tmp_path / "d")!r}) as b:
            p = b.create_topic("t", 1).partition(0)
            for name, make, code in t.HOSTILE:
                try:
                    p.append_batch(make())
                except InvalidRecordError:
                    assert code == t.E.INVALID_RECORD, name
                except CorruptRecordError:
                    assert code == t.E.CORRUPT_MESSAGE, name
                else:
                    raise AssertionError(name)
            assert p.log_end_offset == 0
        print("ok")
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          env={**os.environ, "LOGKIT_PURE_PYTHON": "1",
                               "PYTHONPATH": ROOT_DIR}, timeout=120)
    assert done.stdout.strip() == "ok", done.stderr


# ---- Fetch: one bounded answer ------------------------------------------------------

def _fetch(raw, topic, partitions, *, max_bytes=-1, partition_max_bytes=2**31 - 1,
           version=11):
    body = {"replica_id": -1, "max_wait_ms": 0, "min_bytes": 0, "max_bytes": max_bytes,
            "isolation_level": 0, "session_id": 0, "session_epoch": -1,
            "topics": [{"topic": topic, "topic_id": bytes(16), "partitions": [
                {"partition": p, "current_leader_epoch": -1, "fetch_offset": 0,
                 "last_fetched_epoch": -1, "log_start_offset": -1,
                 "partition_max_bytes": partition_max_bytes} for p in partitions]}],
            "forgotten_topics_data": [], "rack_id": ""}
    return raw.call_sized(1, version, body)


def _fill(partition, mib, value_bytes=256 * 1024):
    value = b"\x5a" * value_bytes
    for _ in range(mib * (1 << 20) // value_bytes // 3):
        partition.append([(None, value, None, NOW)] * 3)


def test_a_partition_listed_72_times_is_answered_once(broker, raw):
    partition = broker.create_topic("t", 1).partition(0)
    _fill(partition, 4)
    answer, size = _fetch(raw, "t", [0] * 72)
    parts = answer["responses"][0]["partitions"]
    assert len(parts) == 1 and parts[0]["error_code"] == E.NONE
    assert len(parts[0]["records"]) <= partition.size_bytes()
    assert size < partition.size_bytes() + 4096


def test_repeated_partitions_merge_and_the_last_listing_wins(broker, raw):
    topic = broker.create_topic("t", 2)
    for p in topic.partitions:
        p.append([(b"k", b"v%d" % n, None, NOW) for n in range(5)])
    body = {"replica_id": -1, "max_wait_ms": 0, "min_bytes": 0, "max_bytes": 1 << 20,
            "isolation_level": 0, "session_id": 0, "session_epoch": -1,
            "topics": [{"topic": "t", "topic_id": bytes(16), "partitions": [
                {"partition": p, "current_leader_epoch": -1, "fetch_offset": offset,
                 "last_fetched_epoch": -1, "log_start_offset": -1,
                 "partition_max_bytes": 1 << 20}
                for p, offset in ((1, 0), (0, 0), (1, 5))]}],
            "forgotten_topics_data": [], "rack_id": ""}
    answer, _ = raw.call_sized(1, 11, body)
    parts = answer["responses"][0]["partitions"]
    assert [p["partition_index"] for p in parts] == [1, 0]     # first-seen order
    assert parts[0]["records"] == b"" and parts[0]["high_watermark"] == 5
    assert len(parts[1]["records"]) > 0


def test_max_bytes_minus_one_is_capped_at_fetch_max_bytes(tmp_path):
    from logkit.protocol.handlers import FETCH_MAX_BYTES
    config = {"max.message.bytes": 8 << 20}
    with logkit.Broker(tmp_path / "d", config={"message.max.bytes": 8 << 20}) as b, \
            b.serve() as server:
        topic = b.create_topic("t", 1, config=config)
        value = b"\x5a" * (1 << 20)
        while topic.partition(0).size_bytes() < FETCH_MAX_BYTES + (8 << 20):
            topic.partition(0).append([(None, value, None, NOW)] * 6)
        raw = Raw(server)
        answer, size = _fetch(raw, "t", [0])
        records = answer["responses"][0]["partitions"][0]["records"]
        assert 0 < len(records) <= FETCH_MAX_BYTES and size <= FETCH_MAX_BYTES + 4096
        raw.close()


def test_per_partition_limits_are_honoured(broker, raw):
    topic = broker.create_topic("t", 3)
    for p in topic.partitions:
        _fill(p, 1, value_bytes=64 * 1024)
    answer, _ = _fetch(raw, "t", [0, 1, 2], max_bytes=1 << 20,
                       partition_max_bytes=300 * 1024)
    sizes = [len(p["records"]) for p in answer["responses"][0]["partitions"]]
    assert all(0 < s <= 300 * 1024 for s in sizes), sizes


SERVER_CHILD = """
import os, resource, sys
resource.setrlimit(resource.RLIMIT_AS, (int(sys.argv[2]), int(sys.argv[2])))
import logkit
with logkit.Broker(sys.argv[1]) as b, b.serve() as s:
    print(s.port, flush=True)
    sys.stdin.read()
    with open("/proc/self/status") as f:
        print([l.split()[1] for l in f if l.startswith("VmHWM")][0], flush=True)
"""


def test_the_fetch_attack_leaves_the_server_memory_bounded(tmp_path):
    """The issue's attack on a server in a child process (its address space capped at
    1.5 GiB, so a regression fails instead of swapping the machine): 28 MiB in one
    partition, fetched 72 times over in one request with max_bytes=-1."""
    path = tmp_path / "d"
    with logkit.Broker(path) as b:
        _fill(b.create_topic("t", 1).partition(0), 28)
    child = subprocess.Popen([sys.executable, "-c", SERVER_CHILD, str(path),
                              str(3 << 29)], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True,
                             env={**os.environ, "PYTHONPATH": ROOT_DIR})
    try:
        port = int(child.stdout.readline())

        raw = Raw(types.SimpleNamespace(host="127.0.0.1", port=port))
        answer, size = _fetch(raw, "t", [0] * 72)
        raw.close()
        assert size <= 29 << 20
        child.stdin.close()
        peak_kib = int(child.stdout.readline())
        assert peak_kib < 400 * 1024, f"server peak RSS {peak_kib} KiB"
    finally:
        child.kill()
        child.wait(30)


# ---- real clients, after all this ---------------------------------------------------

@pytest.mark.parametrize("codec", ["none", "gzip", "snappy", "lz4", "zstd"])
def test_real_clients_still_produce_and_consume(broker, server, codec):
    ck = pytest.importorskip("confluent_kafka")
    kafka = pytest.importorskip("kafka")
    broker.create_topic("t", 2)
    producer = ck.Producer({"bootstrap.servers": server.bootstrap_servers,
                            "compression.type": codec, "linger.ms": 5,
                            "enable.idempotence": True})
    for n in range(300):
        producer.produce("t", b"ck-%d" % n, key=b"k%d" % (n % 7))
    assert producer.flush(30) == 0
    other = kafka.KafkaProducer(bootstrap_servers=server.bootstrap_servers,
                                compression_type=None if codec == "none" else codec,
                                linger_ms=5)
    for n in range(300):
        other.send("t", b"kp-%d" % n, key=b"k%d" % (n % 7))
    other.flush(30)
    other.close()
    consumer = ck.Consumer({"bootstrap.servers": server.bootstrap_servers,
                            "group.id": "g-" + codec, "auto.offset.reset": "earliest"})
    consumer.subscribe(["t"])
    got = []
    for _ in range(200):
        if len(got) >= 600:
            break
        for message in consumer.consume(1000, 0.5):
            assert message.error() is None, message.error()
            got.append(message.value())
    consumer.close()
    assert sorted(got) == sorted([b"ck-%d" % n for n in range(300)]
                                 + [b"kp-%d" % n for n in range(300)])
    reader = kafka.KafkaConsumer("t", bootstrap_servers=server.bootstrap_servers,
                                 auto_offset_reset="earliest", consumer_timeout_ms=3000)
    assert len([m for m in reader]) == 600
    reader.close()
    for p in broker.topic("t").partitions:
        p.check()
