"""Compacted topics on the Kafka listener (DESIGN §16): CreateTopics takes every
compaction config and DescribeConfigs reports them with Kafka's sources and types;
IncrementalAlterConfigs APPENDs to and SUBTRACTs from cleanup.policy, a list config;
a keyless record produced to a compacted topic is INVALID_RECORD for its partition
alone; Fetch and ListOffsets over a cleaned partition with offset gaps let a client
move on to the high watermark (raw frames), and real clients (kafka-python,
confluent-kafka) read exactly the survivors to the end."""

from __future__ import annotations

import time

import pytest

import logkit
from logkit.protocol import errors as E
from logkit.records import decode_batch, iter_batches
from tests.helpers.compacted import NO_CLEANER, fill_and_compact, removed_offsets
from tests.helpers.raw_kafka import Raw

DYNAMIC_TOPIC, STATIC_BROKER, DEFAULT = 1, 4, 5            # Kafka's ConfigSource
TYPE_STRING, TYPE_LONG, TYPE_DOUBLE, TYPE_LIST = 2, 5, 6, 7     # Kafka's ConfigType
COMPACTION_CONFIGS = {"cleanup.policy": "compact", "min.cleanable.dirty.ratio": "0.1",
                      "min.compaction.lag.ms": "1000", "max.compaction.lag.ms": "60000",
                      "delete.retention.ms": "5000", "segment.ms": "600000"}


@pytest.fixture
def broker(tmp_path):
    config = {**NO_CLEANER, "log.cleaner.delete.retention.ms": 3_600_000}
    with logkit.Broker(tmp_path / "data", config=config) as b:
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


def _create(raw, name, configs, version=5):
    answer = raw.call(19, version, {"topics": [{
        "name": name, "num_partitions": 2, "replication_factor": 1, "assignments": [],
        "configs": [{"name": k, "value": v} for k, v in configs.items()]}],
        "timeout_ms": 5000, "validate_only": False})
    return answer["topics"][0]


def _describe(raw, name):
    answer = raw.call(32, 4, {"resources": [
        {"resource_type": 2, "resource_name": name, "configuration_keys": None}],
        "include_synonyms": True, "include_documentation": False})
    [result] = answer["results"]
    assert result["error_code"] == 0, result
    return {c["name"]: c for c in result["configs"]}


def _alter(raw, name, *changes):
    answer = raw.call(44, 1, {"resources": [{
        "resource_type": 2, "resource_name": name,
        "configs": [{"name": k, "config_operation": op, "value": v}
                    for k, op, v in changes]}], "validate_only": False})
    return answer["responses"][0]


def test_create_topics_takes_every_compaction_config_and_describe_reports_sources(
        raw, broker):
    """Each compaction config set at creation is stored and reported back as
    DYNAMIC_TOPIC_CONFIG with Kafka's type; one this broker's config changes is
    STATIC_BROKER_CONFIG, the rest DEFAULT_CONFIG with Kafka's default values; a policy
    given as "delete,compact" is Kafka's "compact,delete"; a policy set to the
    default's own value is still the topic's (DYNAMIC_TOPIC_CONFIG)."""
    created = _create(raw, "table", COMPACTION_CONFIGS)
    assert created["error_code"] == 0, created
    shown = {c["name"]: (c["value"], c["config_source"]) for c in created["configs"]}
    assert shown["cleanup.policy"] == ("compact", DYNAMIC_TOPIC)
    assert broker.topic("table").config["min.cleanable.dirty.ratio"] == 0.1
    configs = _describe(raw, "table")
    for key, value in COMPACTION_CONFIGS.items():
        assert (configs[key]["value"], configs[key]["config_source"]) == \
            (value, DYNAMIC_TOPIC), key
    assert configs["cleanup.policy"]["config_type"] == TYPE_LIST
    assert configs["min.cleanable.dirty.ratio"]["config_type"] == TYPE_DOUBLE
    assert configs["min.compaction.lag.ms"]["config_type"] == TYPE_LONG
    assert _create(raw, "both", {"cleanup.policy": "delete,compact"})["error_code"] == 0
    assert _create(raw, "plain", {"cleanup.policy": "delete"})["error_code"] == 0
    both, plain = _describe(raw, "both"), _describe(raw, "plain")
    assert both["cleanup.policy"]["value"] == "compact,delete"
    assert plain["cleanup.policy"]["config_source"] == DYNAMIC_TOPIC
    assert plain["cleanup.policy"]["synonyms"][0]["source"] == DYNAMIC_TOPIC
    for key, value, source in (("delete.retention.ms", "3600000", STATIC_BROKER),
                               ("min.cleanable.dirty.ratio", "0.5", DEFAULT),
                               ("min.compaction.lag.ms", "0", DEFAULT),
                               ("max.compaction.lag.ms", str((1 << 63) - 1), DEFAULT),
                               ("segment.ms", "604800000", DEFAULT)):
        assert (both[key]["value"], both[key]["config_source"]) == (value, source), key
    bad = _create(raw, "bad", {"cleanup.policy": "shred"})
    assert bad["error_code"] == E.INVALID_CONFIG
    ratio = _create(raw, "ratio", {"min.cleanable.dirty.ratio": "1.5"})
    assert ratio["error_code"] == E.INVALID_CONFIG
    assert "bad" not in broker.topics() and "ratio" not in broker.topics()


def test_incremental_alter_configs_appends_to_and_subtracts_from_cleanup_policy(raw):
    """cleanup.policy is a list config: APPEND compact to delete gives compact,delete,
    SUBTRACT delete leaves compact; SET and DELETE work on the other compaction
    configs; APPEND to a config that is not a list is INVALID_CONFIG; legacy
    AlterConfigs sets the whole config (the keys left out go back to defaults)."""
    _SET, _DELETE, _APPEND, _SUBTRACT = 0, 1, 2, 3
    assert _create(raw, "t", {})["error_code"] == 0
    assert _alter(raw, "t", ("cleanup.policy", _APPEND, "compact"))["error_code"] == 0
    assert _describe(raw, "t")["cleanup.policy"]["value"] == "compact,delete"
    assert _alter(raw, "t", ("cleanup.policy", _SUBTRACT, "delete"),
                  ("min.compaction.lag.ms", _SET, "250"))["error_code"] == 0
    configs = _describe(raw, "t")
    assert configs["cleanup.policy"]["value"] == "compact"
    assert (configs["min.compaction.lag.ms"]["value"],
            configs["min.compaction.lag.ms"]["config_source"]) == ("250", DYNAMIC_TOPIC)
    assert _alter(raw, "t", ("min.compaction.lag.ms", _DELETE, None))["error_code"] == 0
    assert _describe(raw, "t")["min.compaction.lag.ms"]["config_source"] == DEFAULT
    refused = _alter(raw, "t", ("delete.retention.ms", _APPEND, "5"))
    assert refused["error_code"] == E.INVALID_CONFIG
    legacy = raw.call(33, 2, {"resources": [{
        "resource_type": 2, "resource_name": "t",
        "configs": [{"name": "max.compaction.lag.ms", "value": "90000"}]}],
        "validate_only": False})
    assert legacy["responses"][0]["error_code"] == 0
    configs = _describe(raw, "t")
    assert configs["cleanup.policy"]["value"] == "delete"          # back to the default
    assert configs["max.compaction.lag.ms"]["value"] == "90000"


def _batch(rows):
    builder = logkit.BatchBuilder()
    for key, value in rows:
        builder.append(key, value)
    return bytes(builder.build())


def test_a_keyless_record_to_a_compacted_topic_is_invalid_record_for_its_partition(
        raw, broker):
    """One Produce request for three partitions: the compacted partition given a batch
    with one keyless record answers INVALID_RECORD and holds nothing; the compacted
    partition given keyed records and the plain topic given a keyless one are
    written."""
    table = broker.create_topic("table", 2, config={"cleanup.policy": "compact"})
    plain = broker.create_topic("plain", 1)
    answer = raw.call(0, 9, {"transactional_id": None, "acks": -1, "timeout_ms": 5000,
                             "topic_data": [
        {"name": "table", "partition_data": [
            {"index": 0, "records": _batch([(b"k", b"a"), (None, b"b")])},
            {"index": 1, "records": _batch([(b"k", b"a"), (b"j", None)])}]},
        {"name": "plain", "partition_data": [
            {"index": 0, "records": _batch([(None, b"free")])}]}]})
    codes = {(t["name"], p["index"]): p["error_code"] for t in answer["responses"]
             for p in t["partition_responses"]}
    assert codes == {("table", 0): E.INVALID_RECORD, ("table", 1): 0, ("plain", 0): 0}
    assert table.partition(0).high_watermark == 0
    assert table.partition(1).high_watermark == 2
    assert plain.partition(0).high_watermark == 1


FETCH = {"max_wait_ms": 0, "min_bytes": 0, "max_bytes": 1 << 20, "isolation_level": 0,
         "session_id": 0, "session_epoch": -1, "forgotten_topics_data": [], "rack_id": ""}


def _fetch_to_end(raw, topic, partition_max_bytes):
    """A Kafka client's loop over raw Fetch v12 answers: decode the batches, take
    lastOffset + 1 of the last batch as the next fetch offset, until the high
    watermark. Returns ((offset, key, value) list, fetches made)."""
    offset, got, fetches, high = 0, [], 0, None
    while high is None or offset < high:
        fetches += 1
        assert fetches < 1000, f"the fetch offset stalled at {offset}"
        answer = raw.call(1, 12, {**FETCH, "topics": [{"topic": topic, "partitions": [
            {"partition": 0, "fetch_offset": offset, "current_leader_epoch": -1,
             "last_fetched_epoch": -1, "log_start_offset": -1,
             "partition_max_bytes": partition_max_bytes}]}]})
        part = answer["responses"][0]["partitions"][0]
        assert part["error_code"] == 0, part
        high, data = part["high_watermark"], part["records"]
        batches = list(iter_batches(data, 0, len(data), gaps=True, verify=True))
        assert batches or offset == high
        for pos, header in batches:
            got += [(r.offset, r.key, r.value) for r in
                    decode_batch(data, pos, header, topic, 0, min_offset=offset)]
        if batches:
            offset = batches[-1][1].last_offset + 1
    return got, fetches


@pytest.mark.parametrize("partition_max_bytes", [1 << 20, 1])
def test_fetch_over_a_cleaned_partition_moves_on_to_the_high_watermark(
        raw, broker, partition_max_bytes):
    """Fetching from offset 0 (one batch at a time, or all at once) and going on at
    lastOffset + 1 of each answer's last batch returns exactly the survivors and ends
    at the high watermark; ListOffsets answers the log start and the end."""
    expected = fill_and_compact(broker, "table", records=160, keys=6, batch=4)[0]
    partition = broker.topic("table").partition(0)
    assert removed_offsets(partition, expected)
    got, _ = _fetch_to_end(raw, "table", partition_max_bytes)
    assert got == expected
    answer = raw.call(2, 7, {"replica_id": -1, "isolation_level": 0, "topics": [
        {"name": "table", "partitions": [
            {"partition_index": 0, "current_leader_epoch": -1, "timestamp": t}
            for t in (-2, -1)]}]})
    earliest, latest = answer["topics"][0]["partitions"]
    assert (earliest["offset"], latest["offset"]) == (0, partition.high_watermark)


def test_list_offsets_by_time_answers_surviving_records(raw, broker):
    """ListOffsets over a cleaned partition: the largest timestamp (-3) is a surviving
    record's, not that of a batch the cleaner emptied and kept (its header keeps the
    removed record's max timestamp); by time, the first survivor at or after it."""
    partition = broker.create_topic("t", 1, config={
        "cleanup.policy": "compact", "segment.bytes": 1024}).partition(0)
    partition.append([(b"y", b"1", None, 1000)])
    partition.append([(b"z", b"x" * 900, None, 9000)])      # fills its segment
    partition.append([(b"z", b"2", None, 500)])             # z's latest: 9000's goes
    partition.roll()
    partition.compact()
    assert [(h.base_offset, h.records_count) for h in partition.batch_headers(0)] == \
        [(0, 1), (1, 0), (2, 1)]                            # the emptied batch is kept

    answer = raw.call(2, 7, {"replica_id": -1, "isolation_level": 0, "topics": [
        {"name": "t", "partitions": [
            {"partition_index": 0, "current_leader_epoch": -1, "timestamp": t}
            for t in (-3, 900, 1001, 9000)]}]})
    got = [(p["offset"], p["timestamp"]) for p in answer["topics"][0]["partitions"]]
    assert got == [(0, 1000), (0, 1000), (-1, -1), (-1, -1)]


def test_fetch_of_a_partition_whose_records_were_all_removed_reaches_the_end(raw, broker):
    """Every key tombstoned and the tombstones cleaned away: the fetches return no
    record, yet the fetch offset reaches the high watermark (the cleaner's kept last
    batches carry it there)."""
    keys = [b"k%d" % n for n in range(4)]
    fill_and_compact(broker, "gone", records=40, keys=4, unique_every=0,
                     tombstones=keys)
    got, fetches = _fetch_to_end(raw, "gone", 1 << 20)
    assert got == [] and fetches <= 5


def _expected_pairs(expected):
    return [(key, value) for _, key, value in expected]


def test_kafka_python_reads_a_cleaned_topic_to_the_end(broker, server):
    """kafka-python, from the earliest offset: exactly the survivors, in order, and its
    position ends at the high watermark."""
    kafka = pytest.importorskip("kafka")
    expected = fill_and_compact(broker, "table", records=300, keys=11, batch=6)[0]
    end = broker.topic("table").partition(0).high_watermark
    consumer = kafka.KafkaConsumer(bootstrap_servers=server.bootstrap_servers,
                                   auto_offset_reset="earliest", enable_auto_commit=False)
    tp = kafka.TopicPartition("table", 0)
    consumer.assign([tp])
    got, deadline = [], time.monotonic() + 20
    while consumer.position(tp) < end:
        assert time.monotonic() < deadline, f"stuck at {consumer.position(tp)} < {end}"
        for records in consumer.poll(timeout_ms=200).values():
            got += [(r.offset, r.key, r.value) for r in records]
    consumer.close()
    assert got == expected


def test_confluent_kafka_reads_a_cleaned_topic_to_the_end(broker, server):
    """librdkafka, from the earliest offset, with partition EOF events: exactly the
    survivors, then the end of the partition at the high watermark."""
    ck = pytest.importorskip("confluent_kafka")
    expected = fill_and_compact(broker, "table", records=300, keys=11, batch=6)[0]
    end = broker.topic("table").partition(0).high_watermark
    consumer = ck.Consumer({"bootstrap.servers": server.bootstrap_servers,
                            "group.id": "g", "auto.offset.reset": "earliest",
                            "enable.auto.commit": False, "enable.partition.eof": True})
    consumer.assign([ck.TopicPartition("table", 0, ck.OFFSET_BEGINNING)])
    got, deadline = [], time.monotonic() + 20
    while True:
        assert time.monotonic() < deadline, f"no end of partition; read {len(got)}"
        message = consumer.poll(0.2)
        if message is None:
            continue
        if message.error() is not None:
            assert message.error().code() == ck.KafkaError._PARTITION_EOF, message.error()
            assert message.offset() == end
            break
        got.append((message.offset(), message.key(), message.value()))
    consumer.close()
    assert got == expected


@pytest.fixture(scope="module")
def compaction_configs_on_both(kafka, tmp_path_factory):
    """Apache Kafka as the oracle (tests/helpers/kafka.py): {"kafka": ..., "logkit": ...},
    each a list of {compaction config: (value, source)} for a topic created with every
    compaction config, one with cleanup.policy=delete,compact and one given APPEND
    compact by IncrementalAlterConfigs, read through confluent-kafka's AdminClient."""
    ck_admin = pytest.importorskip("confluent_kafka.admin")
    keys = sorted(COMPACTION_CONFIGS)

    def scenario(servers):
        admin = ck_admin.AdminClient({"bootstrap.servers": servers})
        suffix = int(time.time() * 1000)
        names = {f"all-{suffix}": COMPACTION_CONFIGS,
                 f"both-{suffix}": {"cleanup.policy": "delete,compact"},
                 f"grown-{suffix}": {}}
        new = [ck_admin.NewTopic(name, 1, 1, config=config)
               for name, config in names.items()]
        for future in admin.create_topics(new).values():
            future.result(timeout=30)
        grown = ck_admin.ConfigResource("topic", f"grown-{suffix}", incremental_configs=[
            ck_admin.ConfigEntry("cleanup.policy", "compact",
                                 incremental_operation=ck_admin.AlterConfigOpType.APPEND)])
        for future in admin.incremental_alter_configs([grown]).values():
            future.result(timeout=30)
        seen = []
        for name in names:
            resource = ck_admin.ConfigResource("topic", name)
            deadline = time.monotonic() + 30
            while True:      # Kafka applies an alter through its metadata log: wait
                entries = admin.describe_configs([resource])[resource].result(timeout=30)
                if not name.startswith("grown") or \
                        entries["cleanup.policy"].value != "delete" \
                        or time.monotonic() > deadline:
                    break
                time.sleep(0.1)
            seen.append({key: (entries[key].value, entries[key].source) for key in keys})
        return seen

    root = tmp_path_factory.mktemp("oracle") / "data"
    with logkit.Broker(root) as broker, broker.serve() as server:
        mine = scenario(server.bootstrap_servers)
    return {"logkit": mine, "kafka": scenario(kafka.bootstrap_servers)}


def _policy_as_set(seen):
    return [{key: (set(value.split(",")), source) if key == "cleanup.policy"
             else (value, source) for key, (value, source) in configs.items()}
            for configs in seen]


def test_the_compaction_configs_read_back_as_kafka_shows_them(compaction_configs_on_both):
    """Every compaction config's value and source equal Kafka's in all three topics,
    cleanup.policy's as a set of policies (its order: the next test)."""
    assert _policy_as_set(compaction_configs_on_both["logkit"]) == \
        _policy_as_set(compaction_configs_on_both["kafka"])


@pytest.mark.xfail(strict=True, reason="a known difference: docs/kafka-protocol.md, "
                   "Differences from Apache Kafka, row 'cleanup.policy's order'")
def test_a_cleanup_policy_list_keeps_its_order(compaction_configs_on_both):
    assert compaction_configs_on_both["logkit"] == compaction_configs_on_both["kafka"]
