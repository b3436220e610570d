"""DESIGN §15-§18 (exactly-once, compaction, web and asyncio, Spark beyond one machine)
hold as written, checked from outside: every public name those sections state is where
they say it is, with the keywords and defaults they give, and each mismatch an audit
found (2026-11-28) stays fixed. Each test names the behaviour it keeps."""

from __future__ import annotations

import inspect
import json
import subprocess
import sys
import urllib.error
import urllib.request

import pytest

import logkit


def call(url, method="GET", body=None, content_type="application/json"):
    """(status, raw body) of one HTTP request to a live REST proxy."""
    data = None if body is None else (body if isinstance(body, bytes)
                                      else json.dumps(body).encode())
    headers = {"Content-Type": content_type} if data is not None else {}
    request = urllib.request.Request(url, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


# ---- the names ------------------------------------------------------------------------

def test_every_public_name_of_design_15_to_18_is_where_design_says_it_is():
    for name in ("Broker", "TopicPartition", "Producer", "Consumer", "Partition",
                 "ConsumerGroupMetadata", "CleanReport", "RecordMetadata", "Record",
                 "ProducerFencedError", "InvalidTxnStateError", "InvalidRecordError",
                 "ConfigError", "ClosedError", "LogkitTimeoutError"):
        assert name in logkit.__all__ and hasattr(logkit, name), name
    for error in ("ProducerFencedError", "InvalidTxnStateError", "InvalidRecordError",
                  "ConfigError", "ClosedError", "LogkitTimeoutError"):
        assert issubclass(getattr(logkit, error), logkit.LogkitError), error
    # §15: the transactional producer, the consumer's group metadata, the LSO
    for method in ("init_transactions", "begin_transaction", "send_offsets_to_transaction",
                   "commit_transaction", "abort_transaction", "transaction"):
        assert callable(getattr(logkit.Producer, method)), method
    assert callable(logkit.Consumer.group_metadata)
    assert isinstance(inspect.getattr_static(logkit.Partition, "last_stable_offset"),
                      property)
    for reader in (logkit.Partition.read, logkit.testing.read_all):
        parameter = inspect.signature(reader).parameters["isolation_level"]
        assert parameter.default == "read_uncommitted", reader
    # §16: one pass now, a roll, and a report with at least these attributes
    assert callable(logkit.Partition.compact) and callable(logkit.Partition.roll)
    for field in ("records_before", "records_after", "bytes_before", "bytes_after"):
        assert field in logkit.CleanReport._fields, field
    # §17: the asyncio clients, aiokafka-shaped, and the REST proxy's signature
    from logkit.aio import AIOConsumer, AIOProducer
    assert logkit.aio.AIOProducer is AIOProducer and logkit.aio.AIOConsumer is AIOConsumer
    send = inspect.signature(AIOProducer.send).parameters
    assert list(send)[1:3] == ["topic", "value"]
    assert all(send[k].default is None for k in ("key", "headers", "partition"))
    getmany = inspect.signature(AIOConsumer.getmany).parameters
    assert (getmany["timeout_ms"].default, getmany["max_records"].default) == (0, None)
    for coroutine in (AIOProducer.start, AIOProducer.stop, AIOProducer.send,
                      AIOProducer.send_and_wait, AIOConsumer.start, AIOConsumer.stop,
                      AIOConsumer.getone, AIOConsumer.getmany, AIOConsumer.commit,
                      AIOConsumer.position):
        assert inspect.iscoroutinefunction(coroutine), coroutine
    assert not inspect.iscoroutinefunction(AIOConsumer.seek)        # a plain call
    assert inspect.signature(AIOConsumer.commit).parameters["offsets"].default is None
    for client in (AIOProducer, AIOConsumer):
        assert hasattr(client, "__aenter__") and hasattr(client, "__aexit__")
    assert hasattr(AIOConsumer, "__aiter__") and hasattr(AIOConsumer, "__anext__")
    rest = inspect.signature(logkit.Broker.serve_rest).parameters
    assert (rest["host"].default, rest["port"].default) == ("127.0.0.1", 0)
    assert rest["users"].default is None and rest["ssl_context"].default is None
    assert rest["max_body_bytes"].default == 16 << 20
    for keyword in ("users", "ssl_context", "max_body_bytes"):
        assert rest[keyword].kind is inspect.Parameter.KEYWORD_ONLY, keyword
    # §18: the shipper whose flush() publishes, and the Spark source named logkit
    assert "storage_options" in inspect.signature(logkit.Broker.ship).parameters
    pytest.importorskip("pyspark", reason="the spark extra is not installed")
    from pyspark_logkit import LogkitDataSource
    assert LogkitDataSource.name() == "logkit"


def test_import_logkit_then_logkit_aio_and_logkit_testing_work_without_a_second_import():
    """DESIGN writes `logkit.aio.AIOProducer`; a fresh `import logkit` (which loads
    neither asyncio nor the aio module) reaches it, and `logkit.testing`, on first use."""
    script = ("import sys, logkit\n"
              "assert 'logkit.aio' not in sys.modules and 'asyncio' not in sys.modules\n"
              "assert logkit.aio.AIOProducer.__name__ == 'AIOProducer'\n"
              "assert callable(logkit.testing.read_all)\n"
              "try:\n    logkit.no_such_name\nexcept AttributeError:\n    pass\n"
              "else:\n    raise SystemExit('an unknown attribute did not raise')\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr


# ---- §16: compaction ----------------------------------------------------------------------

def test_a_topic_whose_min_compaction_lag_exceeds_its_max_is_refused_as_kafka_refuses_it(
        broker):
    """Kafka's LogConfig refuses min.compaction.lag.ms > max.compaction.lag.ms on create
    and on alter ("conflict topic config setting"); nothing is stored."""
    lags = {"cleanup.policy": "compact", "min.compaction.lag.ms": 1000,
            "max.compaction.lag.ms": 500}
    with pytest.raises(logkit.ConfigError, match="min.compaction.lag.ms"):
        broker.create_topic("c", config=lags)
    assert "c" not in broker.topics()
    broker.create_topic("c", config={"cleanup.policy": "compact",
                                     "max.compaction.lag.ms": 500})
    with pytest.raises(logkit.ConfigError, match="max.compaction.lag.ms"):
        broker.alter_topic_config("c", {"min.compaction.lag.ms": 501})
    broker.alter_topic_config("c", {"min.compaction.lag.ms": 500})      # equal is fine


# ---- §17: the REST proxy ------------------------------------------------------------------

def test_a_kafka_error_in_a_v3_produce_report_carries_confluents_50002(broker):
    """Confluent's mapper answers a Kafka error it has no code for (here: a keyless
    record for a compacted topic, Kafka's INVALID_RECORD) with HTTP 500 and error_code
    50002, as logkit's v2 produce already did; nothing is written."""
    broker.create_topic("c", 1, config={"cleanup.policy": "compact"})
    with broker.serve_rest() as server:
        url = f"{server.url}/v3/clusters/{server.cluster_id}/topics/c/records"
        status, raw = call(url, "POST", {"value": {"type": "STRING", "data": "x"}})
        assert status == 500, raw
        body = json.loads(raw)
        assert body["error_code"] == 50002 and "key" in body["message"], raw
        keyed = {"key": {"type": "STRING", "data": "k"}, "value": {"type": "STRING",
                                                                   "data": "v"}}
        status, raw = call(url, "POST", json.dumps({"value": {"type": "STRING", "data": "y"}})
                           .encode() + json.dumps(keyed).encode())
        reports = [json.loads(line) for line in
                   raw.decode().replace("}{", "}\n{").splitlines()]
        assert [r["error_code"] for r in reports] == [50002, 200], raw
    assert [r.value for r in broker.topic("c").partition(0).read(0)] == [b"v"]


def test_v3_create_topic_with_validate_only_checks_and_creates_nothing(broker):
    """Confluent's v3 CreateTopic body takes `validate_only`: the request is checked as
    a real one (name, existence, partitions, configs) and answered, and no topic is made."""
    broker.create_topic("taken", 1)
    with broker.serve_rest() as server:
        url = f"{server.url}/v3/clusters/{server.cluster_id}/topics"
        status, raw = call(url, "POST", {"topic_name": "dry", "partitions_count": 3,
                                         "configs": [{"name": "cleanup.policy",
                                                      "value": "compact"}],
                                         "validate_only": True})
        assert status == 201, raw
        body = json.loads(raw)
        assert (body["topic_name"], body["partitions_count"]) == ("dry", 3), raw
        assert "dry" not in broker.topics()
        refused = [
            ({"topic_name": "taken", "validate_only": True}, 400, 40002),
            ({"topic_name": "bad name", "validate_only": True}, 400, 400),
            ({"topic_name": "dry", "partitions_count": 0, "validate_only": True}, 400, 400),
            ({"topic_name": "dry", "validate_only": True,
              "configs": [{"name": "cleanup.policy", "value": "sometimes"}]}, 400, 400),
        ]
        for request, want_status, want_code in refused:
            status, raw = call(url, "POST", request)
            assert (status, json.loads(raw)["error_code"]) == (want_status, want_code), raw
        assert sorted(broker.topics()) == ["taken"]
        status, raw = call(url, "POST", {"topic_name": "dry", "validate_only": False})
        assert status == 201 and "dry" in broker.topics(), raw


# ---- found by the audit, fixed in the owners' files -------------------------------------

def test_partition_read_refuses_an_unknown_isolation_level_with_config_error(broker):
    broker.create_topic("t", 1)
    with pytest.raises(logkit.ConfigError, match="isolation_level"):
        broker.topic("t").partition(0).read(0, isolation_level="serializable")


def test_a_compacted_topics_active_segment_rolls_once_older_than_max_compaction_lag(broker):
    import time
    topic = broker.create_topic("c", config={"cleanup.policy": "compact",
                                             "max.compaction.lag.ms": 1})
    producer = broker.producer()
    producer.send("c", b"v", key=b"k").result()
    aged = time.time() + 0.01
    while time.time() < aged:            # the segment's wall-clock age passes 1 ms
        time.sleep(0.001)
    producer.send("c", b"w", key=b"k").result()
    assert topic.partition(0).segment_base_offsets() == [0, 1]


def test_spark_reads_a_shipped_store_read_committed_as_it_reads_the_directory(
        broker, tmp_path):
    pytest.importorskip("pyspark", reason="the spark extra is not installed")
    from pyspark_logkit import LogkitDataSource

    def values(path, **options):
        source = LogkitDataSource({"path": path, "subscribe": "t", **options})
        reader = source.reader(source.schema())
        return [v for part in reader.partitions() for batch in reader.read(part)
                for v in batch.column("value").to_pylist()]
    broker.create_topic("t", 1)
    producer = broker.producer(transactional_id="w")
    producer.init_transactions()
    with producer.transaction():
        producer.send("t", b"kept")
    producer.begin_transaction()
    producer.send("t", b"aborted")
    producer.abort_transaction()
    url = (tmp_path / "store").as_uri()
    with broker.ship(url) as shipper:
        shipper.flush()
        committed = {"kafka.isolation.level": "read_committed"}
        assert values(str(broker.path), **committed) == [b"kept"]
        assert values(url, **committed) == [b"kept"]
