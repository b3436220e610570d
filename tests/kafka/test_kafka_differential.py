"""Apache Kafka as the oracle: the same client script runs against the real Kafka (the
session's `kafka` fixture) and against logkit's listener (`Broker.serve()`), and what a
client can observe must be the same — the partition each client's default partitioner
picks for a key, offsets, high watermarks, ListOffsets by time, the DescribeConfigs
values of every topic config logkit reports, and the error each bad request gets.

A difference found is a `pytest.param(..., marks=KNOWN)` case whose reason names its row
in docs/kafka-protocol.md ("Differences from Apache Kafka"); it is strict, so the case
fails the day the difference goes away and the row must go too."""

from __future__ import annotations

import functools
import itertools
import time
from collections.abc import Callable

import pytest

import logkit
from tests.helpers.kafka import skip_reason, wait_until_known

pytestmark = pytest.mark.skipif(skip_reason() is not None, reason=str(skip_reason()))

TIMEOUT_S = 30
# recent, so neither broker's time retention (7 days by default) deletes a record mid-test
BASE_TIMESTAMP_MS = (int(time.time()) - 3600) * 1000
_names = itertools.count()


def known(row: str):
    return pytest.mark.xfail(strict=True, reason=f"a known difference: docs/kafka-protocol.md,"
                             f" Differences from Apache Kafka, row '{row}'")


@pytest.fixture(scope="module")
def logkit_server(tmp_path_factory):
    with logkit.Broker(tmp_path_factory.mktemp("logkit-diff") / "data") as broker, \
            broker.serve() as server:
        yield server


@pytest.fixture(scope="module")
def targets(kafka, logkit_server) -> dict[str, str]:
    """Bootstrap servers by name: the real Kafka and logkit's listener."""
    yield {"kafka": kafka.bootstrap_servers, "logkit": logkit_server.bootstrap_servers}
    admin.cache_clear()                 # before the listener closes under its clients


def on_both(targets: dict[str, str], scenario: Callable[[str, str], object]) -> dict:
    """Run `scenario(bootstrap_servers, topic)` on each target, each with a fresh topic
    name (the session's Kafka is shared), and return what each observed."""
    topic = f"diff-{scenario.__name__.strip('_')}-{next(_names)}"
    return {name: scenario(servers, topic) for name, servers in targets.items()}


@functools.cache
def admin(servers: str):
    """One AdminClient per target, kept: a dropped one fails its pending futures."""
    from confluent_kafka.admin import AdminClient
    return AdminClient({"bootstrap.servers": servers})


def create_topic(servers: str, topic: str, partitions: int, config=None) -> None:
    from confluent_kafka.admin import NewTopic
    future = admin(servers).create_topics([NewTopic(topic, partitions, 1,
                                                    config=config or {})])[topic]
    future.result(timeout=TIMEOUT_S)
    # KRaft answers CreateTopics before the broker's metadata cache knows the topic: a
    # DescribeConfigs in that moment gets UNKNOWN_TOPIC_OR_PART (a CI run did)
    wait_until_known(admin(servers), topic, partitions)


def error_name(call: Callable[[], object]) -> str:
    """'ok', or the name of the Kafka error the call failed with."""
    from confluent_kafka import KafkaException
    try:
        call()
    except KafkaException as exc:
        return exc.args[0].name()
    return "ok"


# ---- partitions, offsets and high watermarks ----------------------------------------

KEYS = [b"key-%d" % (i % 37) for i in range(120)]


def _keyed_confluent(servers: str, topic: str) -> dict:
    """confluent-kafka's default partitioner (consistent_random) and its offsets."""
    from confluent_kafka import Consumer, Producer, TopicPartition
    create_topic(servers, topic, 6)
    producer = Producer({"bootstrap.servers": servers, "linger.ms": 0})
    placed: list[tuple] = []
    for i, key in enumerate(KEYS):
        producer.produce(topic, b"v%d" % i, key=key, timestamp=BASE_TIMESTAMP_MS + i,
                         on_delivery=lambda err, m: placed.append(
                             (err, m.key(), m.partition(), m.offset(), m.timestamp())))
        producer.flush(TIMEOUT_S)               # one at a time: offsets are in send order
    consumer = Consumer({"bootstrap.servers": servers, "group.id": f"{topic}-g"})
    marks = [consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=TIMEOUT_S)
             for p in range(6)]
    consumer.close()
    return {"placed": placed, "watermarks": marks}


def _keyed_kafka_python(servers: str, topic: str) -> dict:
    """kafka-python's default partitioner (murmur2, as the Java client) and its offsets."""
    from kafka import KafkaConsumer, KafkaProducer
    from kafka import TopicPartition as KpTopicPartition
    create_topic(servers, topic, 6)
    producer = KafkaProducer(bootstrap_servers=servers, linger_ms=0)
    placed = []
    for i, key in enumerate(KEYS):
        md = producer.send(topic, b"v%d" % i, key=key,
                           timestamp_ms=BASE_TIMESTAMP_MS + i).get(timeout=TIMEOUT_S)
        placed.append((key, md.partition, md.offset, md.timestamp))
    producer.close()
    consumer = KafkaConsumer(bootstrap_servers=servers)
    parts = [KpTopicPartition(topic, p) for p in range(6)]
    ends = consumer.end_offsets(parts)
    starts = consumer.beginning_offsets(parts)
    consumer.close()
    return {"placed": placed, "watermarks": [(starts[tp], ends[tp]) for tp in parts]}


@pytest.mark.parametrize("scenario", [_keyed_confluent, _keyed_kafka_python],
                         ids=["confluent-kafka", "kafka-python"])
def test_keys_land_on_the_same_partitions_at_the_same_offsets(targets, scenario):
    seen = on_both(targets, scenario)
    assert seen["kafka"]["placed"] and all(p[0] is None for p in seen["kafka"]["placed"]
                                           if scenario is _keyed_confluent)
    assert seen["logkit"] == seen["kafka"]


def _timestamp(i: int) -> int:
    """Record i's timestamp: rising in steps of about 10 ms, and every eleventh one
    earlier than the record before it (a producer's clock is not the log's order)."""
    return BASE_TIMESTAMP_MS + 10 * i + (i % 3) - (95 if i % 11 == 10 else 0)


PROBES = [0, BASE_TIMESTAMP_MS - 1, BASE_TIMESTAMP_MS, BASE_TIMESTAMP_MS + 101,
          BASE_TIMESTAMP_MS + 105, BASE_TIMESTAMP_MS + 200, BASE_TIMESTAMP_MS + 490,
          BASE_TIMESTAMP_MS + 491, BASE_TIMESTAMP_MS + 10_000]


def _produce_timed(servers: str, topic: str) -> None:
    from confluent_kafka import Producer
    create_topic(servers, topic, 1)
    producer = Producer({"bootstrap.servers": servers, "linger.ms": 0})
    for i in range(50):
        producer.produce(topic, b"v%d" % i, partition=0, timestamp=_timestamp(i))
        if i % 7 == 6:
            producer.flush(TIMEOUT_S)           # several batches
    producer.flush(TIMEOUT_S)


def _offsets_for_times_confluent(servers: str, topic: str) -> list:
    """ListOffsets by timestamp (before the first record, on one, between two, past the
    last), then earliest (-2) and latest (-1), as confluent-kafka asks."""
    from confluent_kafka import Consumer, TopicPartition
    _produce_timed(servers, topic)
    consumer = Consumer({"bootstrap.servers": servers, "group.id": f"{topic}-g"})
    # one probe a call: librdkafka answers a list naming one partition twice with the
    # last probe's offset for every entry
    found = [consumer.offsets_for_times([TopicPartition(topic, 0, t)], timeout=TIMEOUT_S)[0]
             for t in PROBES + [-2, -1]]
    consumer.close()
    return [(tp.offset, tp.error) for tp in found]


def _offsets_for_times_kafka_python(servers: str, topic: str) -> list:
    """The same probes as kafka-python asks them (offset and the record's timestamp)."""
    from kafka import KafkaConsumer
    from kafka import TopicPartition as KpTopicPartition
    _produce_timed(servers, topic)
    consumer = KafkaConsumer(bootstrap_servers=servers)
    tp = KpTopicPartition(topic, 0)
    found = [consumer.offsets_for_times({tp: t})[tp] for t in PROBES]
    edges = (consumer.beginning_offsets([tp])[tp], consumer.end_offsets([tp])[tp])
    consumer.close()
    return [None if f is None else (f.offset, f.timestamp) for f in found] + [edges]


@pytest.mark.parametrize("scenario", [_offsets_for_times_confluent,
                                      _offsets_for_times_kafka_python],
                         ids=["confluent-kafka", "kafka-python"])
def test_list_offsets_by_time_answers_the_same_offsets(targets, scenario):
    seen = on_both(targets, scenario)
    assert seen["logkit"] == seen["kafka"]


# ---- DescribeConfigs ----------------------------------------------------------------

def _topic_configs(servers: str, topic: str) -> dict:
    from confluent_kafka.admin import ConfigResource
    create_topic(servers, topic, 1)
    resource = ConfigResource("topic", topic)
    entries = admin(servers).describe_configs([resource])[resource].result(timeout=TIMEOUT_S)
    return {name: (entry.value, entry.source) for name, entry in entries.items()}


@pytest.fixture(scope="module")
def topic_configs(targets) -> dict[str, dict]:
    return on_both(targets, _topic_configs)


def test_logkit_reports_only_configs_kafka_has(topic_configs):
    assert set(topic_configs["logkit"]) <= set(topic_configs["kafka"])


# the topic configs whose default DescribeConfigs shows with a source other than
# Kafka's (value equal): their rows in docs/kafka-protocol.md
SOURCE_DIFFERENCES = {"min.insync.replicas": "min.insync.replicas' source"}


def test_every_reported_default_equals_kafkas(topic_configs):
    mine, theirs = topic_configs["logkit"], topic_configs["kafka"]
    assert {k: v[0] for k, v in mine.items()} == {k: theirs[k][0] for k in mine}
    assert {k: v[1] for k, v in mine.items() if k not in SOURCE_DIFFERENCES} == \
        {k: theirs[k][1] for k in mine if k not in SOURCE_DIFFERENCES}


@pytest.mark.parametrize("name", [pytest.param(n, marks=known(row))
                                  for n, row in SOURCE_DIFFERENCES.items()])
def test_the_default_config_source_equals_kafkas(topic_configs, name):
    assert topic_configs["logkit"][name][1] == topic_configs["kafka"][name][1]


SET_CONFIGS = {"retention.ms": "3600000", "retention.bytes": "10485760",
               "segment.bytes": "2097152", "segment.ms": "7200000",
               "max.message.bytes": "2000000", "cleanup.policy": "delete",
               "message.timestamp.type": "LogAppendTime", "min.insync.replicas": "1"}


def _set_configs(servers: str, topic: str) -> dict:
    """Configs given at CreateTopics, as DescribeConfigs shows them (value, source)."""
    from confluent_kafka.admin import ConfigResource
    create_topic(servers, topic, 1, config=SET_CONFIGS)
    resource = ConfigResource("topic", topic)
    entries = admin(servers).describe_configs([resource])[resource].result(timeout=TIMEOUT_S)
    return {name: (entries[name].value, entries[name].source) for name in SET_CONFIGS}


# set to the value their default has: Kafka still shows them as the topic's own
SET_TO_DEFAULT = ("cleanup.policy", "min.insync.replicas")


@pytest.fixture(scope="module")
def set_configs(targets) -> dict[str, dict]:
    return on_both(targets, _set_configs)


def test_configs_set_at_creation_read_back_as_kafka_shows_them(set_configs):
    mine, theirs = set_configs["logkit"], set_configs["kafka"]
    assert {k: v[0] for k, v in mine.items()} == {k: v[0] for k, v in theirs.items()}
    assert {k: v for k, v in mine.items() if k not in SET_TO_DEFAULT} == \
        {k: v for k, v in theirs.items() if k not in SET_TO_DEFAULT}


def test_a_config_set_to_its_default_value_keeps_the_topics_source(set_configs):
    assert {k: set_configs["logkit"][k] for k in SET_TO_DEFAULT} == \
        {k: set_configs["kafka"][k] for k in SET_TO_DEFAULT}


def _auto_created(servers: str, topic: str) -> tuple:
    """A producer's first send to a missing topic: Kafka's default
    auto.create.topics.enable and num.partitions (1) make it, and the record lands."""
    from kafka import KafkaProducer
    producer = KafkaProducer(bootstrap_servers=servers, linger_ms=0)
    md = producer.send(topic, b"first", key=b"k").get(timeout=TIMEOUT_S)
    partitions = sorted(producer.partitions_for(topic))
    producer.close()
    return partitions, md.partition, md.offset


def test_a_send_to_a_missing_topic_creates_it_as_kafka_does(targets):
    seen = on_both(targets, _auto_created)
    assert seen["logkit"] == seen["kafka"]


# ---- the error each bad request gets -------------------------------------------------

def _create(config=None, partitions=1, name_suffix=""):
    def case(servers: str, topic: str) -> str:
        from confluent_kafka.admin import NewTopic
        new = NewTopic(topic + name_suffix, partitions, 1, config=config or {})
        return error_name(lambda: admin(servers).create_topics(
            [new])[new.topic].result(timeout=TIMEOUT_S))
    return case


def _shrink(servers: str, topic: str) -> str:
    from confluent_kafka.admin import NewPartitions
    create_topic(servers, topic, 2)
    return error_name(lambda: admin(servers).create_partitions(
        [NewPartitions(topic, 1)])[topic].result(timeout=TIMEOUT_S))


def _grow_unknown(servers: str, topic: str) -> str:
    from confluent_kafka.admin import NewPartitions
    return error_name(lambda: admin(servers).create_partitions(
        [NewPartitions(topic, 4)])[topic].result(timeout=TIMEOUT_S))


def _describe_unknown(servers: str, topic: str) -> str:
    from confluent_kafka import TopicCollection
    return error_name(lambda: admin(servers).describe_topics(
        TopicCollection([topic]))[topic].result(timeout=TIMEOUT_S))


def _configs_of_unknown(servers: str, topic: str) -> str:
    from confluent_kafka.admin import ConfigResource
    resource = ConfigResource("topic", topic)
    return error_name(lambda: admin(servers).describe_configs(
        [resource])[resource].result(timeout=TIMEOUT_S))


def _alter_bad_value(servers: str, topic: str) -> str:
    from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource
    create_topic(servers, topic, 1)
    resource = ConfigResource("topic", topic, incremental_configs=[
        ConfigEntry("retention.ms", "soon", incremental_operation=AlterConfigOpType.SET)])
    return error_name(lambda: admin(servers).incremental_alter_configs(
        [resource])[resource].result(timeout=TIMEOUT_S))


def _alter(config: dict, *, create: bool = True, validate_only: bool = False,
           operation: str = "SET"):
    """IncrementalAlterConfigs of `config` on the topic (made first unless `create` is
    False); with validate_only, also that nothing changed."""
    def case(servers: str, topic: str) -> str:
        from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource
        if create:
            create_topic(servers, topic, 1)
        resource = ConfigResource("topic", topic, incremental_configs=[
            ConfigEntry(k, v, incremental_operation=getattr(AlterConfigOpType, operation))
            for k, v in config.items()])
        name = error_name(lambda: admin(servers).incremental_alter_configs(
            [resource], validate_only=validate_only)[resource].result(timeout=TIMEOUT_S))
        if validate_only and create:
            shown = admin(servers).describe_configs([ConfigResource("topic", topic)])
            entries = next(iter(shown.values())).result(timeout=TIMEOUT_S)
            name += " " + " ".join(f"{k}={entries[k].value}" for k in sorted(config))
        return name
    return case


def _delete_records(offset: int, *, create: bool = True):
    """DeleteRecords up to `offset` on partition 0 (after five records, when `create`)."""
    def case(servers: str, topic: str) -> str:
        from confluent_kafka import Producer, TopicPartition
        if create:
            create_topic(servers, topic, 1)
            producer = Producer({"bootstrap.servers": servers, "linger.ms": 0})
            for i in range(5):
                producer.produce(topic, b"v%d" % i, partition=0)
            producer.flush(TIMEOUT_S)
        wanted = TopicPartition(topic, 0, offset)
        out: list = []
        name = error_name(lambda: out.append(admin(servers).delete_records(
            [wanted])[wanted].result(timeout=TIMEOUT_S)))
        return name if name != "ok" else f"ok low_watermark={out[0].low_watermark}"
    return case


def _delete_group(*, committed: bool, live: bool):
    """DeleteGroups of a group with committed offsets and/or a live member (or none:
    a group id the broker never saw); after a success, whether the offsets are gone."""
    def case(servers: str, topic: str) -> str:
        from confluent_kafka import Consumer, TopicPartition
        group = f"{topic}-g"
        member = None
        if committed or live:
            create_topic(servers, topic, 1)
        if committed:
            helper = Consumer({"bootstrap.servers": servers, "group.id": group})
            helper.commit(offsets=[TopicPartition(topic, 0, 0)], asynchronous=False)
            helper.close()
        if live:
            member = Consumer({"bootstrap.servers": servers, "group.id": group,
                               "session.timeout.ms": 10000})
            member.subscribe([topic])
            deadline = time.monotonic() + TIMEOUT_S
            while not member.assignment() and time.monotonic() < deadline:
                member.poll(0.2)
            assert member.assignment(), "the member never got its partition"
        try:
            name = error_name(lambda: admin(servers).delete_consumer_groups(
                [group])[group].result(timeout=TIMEOUT_S))
        finally:
            if member is not None:
                member.close()
        if name == "ok" and committed:
            reader = Consumer({"bootstrap.servers": servers, "group.id": group})
            left = reader.committed([TopicPartition(topic, 0)], timeout=TIMEOUT_S)
            reader.close()
            name += f" committed={left[0].offset}"
        return name
    return case


def _too_large(servers: str, topic: str) -> str:
    """A record above the topic's max.message.bytes (1048588), sent by a client whose
    own limit is higher, so the broker is the one that refuses it."""
    from confluent_kafka import Producer
    create_topic(servers, topic, 1)
    producer = Producer({"bootstrap.servers": servers, "message.max.bytes": 5_000_000,
                         "linger.ms": 0})
    errors: list = []
    producer.produce(topic, b"x" * 2_000_000, partition=0,
                     on_delivery=lambda err, _m: errors.append(err))
    producer.flush(TIMEOUT_S)
    return errors[0].name() if errors[0] is not None else "ok"


ERROR_CASES = {
    "unknown topic (DescribeTopics)": _describe_unknown,
    "unknown topic (DescribeConfigs)": _configs_of_unknown,
    "unknown topic (CreatePartitions)": _grow_unknown,
    "too-large record": _too_large,
    "zero partitions": _create(partitions=0),
    "fewer partitions": _shrink,
    "bad config value (CreateTopics)": _create({"retention.ms": "soon"}),
    "config value below its minimum": _create({"retention.ms": "-5"}),
    "unknown config name": _create({"no.such.config": "1"}),
    "bad config value (IncrementalAlterConfigs)": _alter_bad_value,
    "unknown config name (IncrementalAlterConfigs)": _alter({"no.such.config": "1"}),
    "unknown topic (IncrementalAlterConfigs)": _alter({"retention.ms": "1000"},
                                                      create=False),
    "APPEND to a config that is not a list": _alter({"retention.ms": "1000"},
                                                    operation="APPEND"),
    "validate_only changes nothing": _alter({"retention.ms": "1000"}, validate_only=True),
    "validate_only with a bad value": _alter({"retention.ms": "soon"}, validate_only=True),
    "records deleted up to an offset": _delete_records(3),
    "records deleted up to the high watermark (-1)": _delete_records(-1),
    "records deleted past the high watermark": _delete_records(6),
    "unknown topic (DeleteRecords)": _delete_records(0, create=False),
    "a group with committed offsets deleted": _delete_group(committed=True, live=False),
    "unknown group (DeleteGroups)": _delete_group(committed=False, live=False),
    "a group with a live member (DeleteGroups)": _delete_group(committed=True, live=True),
    "invalid topic name": _create(name_suffix="/x"),
    "segment.bytes below Kafka's 1 MiB": _create({"segment.bytes": "4096"}),
}
# cases that succeed on Kafka: what the two report afterwards must agree
SUCCESS_CASES = ("validate_only changes nothing", "records deleted up to an offset",
                 "records deleted up to the high watermark (-1)",
                 "a group with committed offsets deleted")
ERROR_DIFFERENCES = {"segment.bytes below Kafka's 1 MiB": "segment.bytes' minimum"}


@pytest.mark.parametrize("case", [
    pytest.param(name, marks=known(ERROR_DIFFERENCES[name]))
    if name in ERROR_DIFFERENCES else name for name in ERROR_CASES])
def test_a_bad_request_gets_kafkas_error(targets, case):
    scenario = ERROR_CASES[case]
    seen = on_both(targets, scenario)
    assert seen["kafka"] != "ok" or case in SUCCESS_CASES
    assert seen["logkit"] == seen["kafka"]
