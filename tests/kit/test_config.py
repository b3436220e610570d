"""The one settings table: Kafka's names and defaults, types, bounds, broker-to-topic
defaults; every row documented, read by the code or flagged, and the page generated from
it; the keys the issue named, decided and tested by behaviour."""

from __future__ import annotations

import ast
import importlib.util
import logging
import pathlib

import pytest

import logkit
from logkit import ConfigError
from logkit.config import (BROKER_CONFIG, BROKER_TO_TOPIC, HONOURED, IGNORED, INT_MAX,
                           REFUSED, SCOPES, SETTINGS, TABLE, TOPIC_CONFIG, coerce,
                           resolve, resolve_broker_config, resolve_topic_config)


def test_kafka_defaults():
    """Unset topic keys take Kafka's defaults."""
    config = resolve_topic_config(None, resolve_broker_config(None))
    assert config["retention.ms"] == 604800000 and config["retention.bytes"] == -1
    assert config["segment.bytes"] == 1073741824 and config["segment.ms"] == 604800000
    assert config["segment.index.bytes"] == 10485760
    assert config["index.interval.bytes"] == 4096
    assert config["max.message.bytes"] == 1048588
    assert config["message.timestamp.type"] == "CreateTime"
    assert config["compression.type"] == "producer"
    assert config["file.delete.delay.ms"] == 60000
    assert set(config) == set(TOPIC_CONFIG)


@pytest.mark.parametrize("key, value, match", [
    ("segment.bytes", 2**31, "<= 2147483647"),       # positions in an index are int32
    ("segment.index.bytes", INT_MAX + 1, "<="),
    ("max.message.bytes", 2**40, "<="),
    ("index.interval.bytes", -1, ">= 0"),
    ("retention.ms", 1.5, "integer"),
    ("retention.ms", True, "integer"),
    ("retention.ms", None, "integer"),
    ("retention.ms", "1e3", "integer"),
    ("message.timestamp.type", "WallClock", "one of"),
    ("compression.type", 1, "string"),
    ("preallocate", 1, "boolean"),
    ("flush.messages", 0, ">= 1"),
    ("Retention.ms", 5, "unknown topic config"),
])
def test_bad_topic_values(key, value, match):
    """Wrong types, out-of-range values and unknown keys raise ConfigError naming them."""
    with pytest.raises(ConfigError, match=match) as info:
        resolve_topic_config({key: value}, resolve_broker_config(None))
    assert repr(key) in str(info.value)


def test_strings_are_coerced_as_kafka_properties_are():
    """'5' and 'true' are accepted where Kafka's .properties strings would be."""
    config = resolve_topic_config({"retention.ms": "5", "preallocate": "TRUE",
                                   "segment.bytes": str(INT_MAX)}, resolve_broker_config(None))
    assert config["retention.ms"] == 5 and config["preallocate"] is True
    assert config["segment.bytes"] == INT_MAX


def test_every_broker_log_key_sets_its_topic_default():
    """Each log.* broker setting becomes the default of its topic key; overrides win."""
    for broker_key, topic_key in BROKER_TO_TOPIC.items():
        assert broker_key in BROKER_CONFIG and topic_key in TOPIC_CONFIG
    broker = resolve_broker_config({"log.segment.bytes": 4096, "log.roll.ms": 77,
                                    "message.max.bytes": 999,
                                    "log.message.timestamp.type": "LogAppendTime"})
    topic = resolve_topic_config({"segment.ms": 88}, broker)
    assert (topic["segment.bytes"], topic["segment.ms"], topic["max.message.bytes"],
            topic["message.timestamp.type"]) == (4096, 88, 999, "LogAppendTime")


def test_bad_broker_config_is_refused_before_touching_the_directory(tmp_path):
    """Broker(config=...) validates first: nothing is created for a bad config."""
    root = tmp_path / "never"
    for config in ({"num.partitions": 0}, {"log.segment.bytes": 2**31}, {"no.such": 1},
                   ["num.partitions", 1]):
        with pytest.raises(ConfigError):
            logkit.Broker(root, config=config)
    assert not root.exists()


def test_topic_config_is_stored_and_reloaded(tmp_path):
    """A topic's overrides persist in LMDB and resolve again on reopen."""
    with logkit.Broker(tmp_path, config={"log.retention.bytes": 10**6}) as broker:
        broker.create_topic("t", 2, config={"retention.ms": "1000", "segment.bytes": 4096})
    with logkit.Broker(tmp_path) as broker:
        config = broker.topic("t").config
        assert (config["retention.ms"], config["segment.bytes"]) == (1000, 4096)
        assert config["retention.bytes"] == -1        # broker default of *this* open


# ---- the one table ------------------------------------------------------------------------

ROOT = pathlib.Path(__file__).resolve().parent.parent.parent


def _code_strings(files) -> set[str]:
    """Every string literal in `files`, docstrings left out: where a key is read
    (settings["linger_ms"], config["retention.ms"], options["maxOffsetsPerTrigger"])."""
    found: set[str] = set()
    for path in files:
        tree = ast.parse(path.read_text(encoding="utf-8"))
        docstrings = {id(node.value) for node in ast.walk(tree)
                      if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)}
        found |= {node.value for node in ast.walk(tree)
                  if isinstance(node, ast.Constant) and isinstance(node.value, str)
                  and id(node) not in docstrings}
    return found


def _readers(scope: str) -> list[pathlib.Path]:
    """The files that read a scope's keys: each client its own module, the storage
    anything in logkit/ but the table, the Spark source its package."""
    if scope in ("producer", "consumer"):
        return [ROOT / "logkit" / f"{scope}.py"]
    if scope in ("spark read", "spark write"):
        return list((ROOT / "spark" / "pyspark_logkit").glob("*.py"))
    return [f for f in (ROOT / "logkit").rglob("*.py") if f.name != "config.py"]


def test_every_row_is_documented_typed_and_its_default_passes_its_own_bounds():
    """Each row has a doc, a known kind and status, a reason when it is not honoured,
    a unit when its name carries one, and a default its own coercion accepts."""
    assert len({(row.scope, row.key) for row in SETTINGS}) == len(SETTINGS)
    for row in SETTINGS:
        assert row.scope in SCOPES and row.doc, row
        assert row.kind in ("int", "bool", "str", "callable", "any"), row
        assert row.status in (HONOURED, IGNORED, REFUSED), row
        if row.status != HONOURED:
            assert row.why, f"{row.key} is {row.status} without saying why"
        if row.kind == "any" and row.status != REFUSED:
            assert row.check is not None and row.shape, row
        for suffix, unit in ((".ms", "ms"), ("_ms", "ms"), ("Ms", "ms"),
                             (".bytes", "bytes"), (".minutes", "minutes")):
            if row.key.endswith(suffix):
                assert row.unit == unit, row
        if row.required or row.status == REFUSED:
            continue
        assert coerce(row, row.default) == row.default, row


def test_a_topic_default_is_written_once_on_its_broker_key():
    """Topic keys with a broker default take default, type and bounds from that row."""
    assert BROKER_TO_TOPIC["log.retention.ms"] == "retention.ms"
    for broker_key, topic_key in BROKER_TO_TOPIC.items():
        topic, broker = TOPIC_CONFIG[topic_key], BROKER_CONFIG[broker_key]
        assert (topic.default, topic.kind, topic.minimum, topic.maximum, topic.choices) == \
            (broker.default, broker.kind, broker.minimum, broker.maximum, broker.choices)


def test_every_honoured_key_is_read_by_the_code():
    """A key the table calls honoured is read somewhere (as a string literal outside
    the table): a setting nobody reads would be taken silently. A broker key that only
    supplies a topic default counts through its topic key; a key with one allowed value
    has nothing to read."""
    strings = {scope: _code_strings(_readers(scope)) for scope in SCOPES}
    for row in SETTINGS:
        if row.status != HONOURED or (row.choices is not None and len(row.choices) == 1):
            continue
        key = BROKER_TO_TOPIC.get(row.key, row.key) if row.scope == "broker" else row.key
        assert key in strings[row.scope], \
            f"{row.scope} key {row.key!r} is honoured but never read"


def test_the_keys_the_issue_named_are_each_decided():
    """The keys found accepted-and-unused are now honoured (tested below), or flagged
    ignored with a reason."""
    decided = {
        ("producer", "enable_idempotence"): HONOURED,     # docs/design.md §15
        ("producer", "retries"): IGNORED,
        ("producer", "request_timeout_ms"): HONOURED,     # acks="all", replicated
        ("consumer", "isolation_level"): HONOURED,        # docs/design.md §15
        ("topic", "min.insync.replicas"): HONOURED,
        ("broker", "min.insync.replicas"): HONOURED,
        ("topic", "preallocate"): IGNORED, ("broker", "log.preallocate"): IGNORED,
        ("broker", "group.initial.rebalance.delay.ms"): IGNORED,
        ("broker", "offsets.retention.minutes"): IGNORED,
    }
    for (scope, key), status in decided.items():
        assert TABLE[scope][key].status == status, (scope, key)


def test_every_bad_value_is_refused_naming_its_key():
    """A value of the wrong type names the key (and the Kafka name for a keyword)."""
    bad = {"int": "many", "bool": "maybe", "str": 42, "callable": 42, "any": object()}
    for row in SETTINGS:
        if row.status == REFUSED:
            continue
        with pytest.raises(ConfigError) as info:
            resolve(row.scope, {row.key: bad[row.kind]})
        assert repr(row.key) in str(info.value), str(info.value)
        if row.scope in ("producer", "consumer") and row.name and row.name != row.key:
            assert row.name in str(info.value)


def test_refused_keys_say_why():
    """A refused key raises ConfigError saying logkit does not support it, and why."""
    for row in SETTINGS:
        if row.status == REFUSED:
            with pytest.raises(ConfigError, match="not supported by logkit") as info:
                resolve(row.scope, {row.key: "x"})
            assert row.why in str(info.value)


def test_ignored_keys_are_accepted_and_a_changed_one_is_logged(caplog):
    """An ignored key takes its values and has no effect; a non-default value is
    logged at INFO on logkit.config naming the key and the reason."""
    with caplog.at_level(logging.INFO, logger="logkit.config"):
        settings = resolve("producer", {"retries": 5, "enable_idempotence": True})
    assert settings["retries"] == 5 and settings["enable_idempotence"] is True
    messages = [r.getMessage() for r in caplog.records if r.name == "logkit.config"]
    assert any("retries" in m and "ignored" in m and "never retried" in m
               for m in messages), messages
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="logkit.config"):
        resolve("producer", {"retries": 0})                   # the default: nothing to say
    assert not [r for r in caplog.records if r.name == "logkit.config"]


def test_client_keywords_not_dotted_names_and_typos_get_a_suggestion():
    """Clients take snake_case keywords; a dotted name or a typo says what to write."""
    with pytest.raises(ConfigError, match="write the keyword linger_ms="):
        resolve("producer", {"linger.ms": 5})
    with pytest.raises(ConfigError, match="did you mean 'retention.ms'"):
        resolve("topic", {"retention.mss": 5})
    with pytest.raises(ConfigError, match="did you mean 'auto_offset_reset'"):
        resolve("consumer", {"auto_ofset_reset": "earliest"})


def test_spark_options_ignore_case_refuse_unknowns_and_accept_kafka_ones():
    """Spark passes option names lower-cased: they still match; kafka.* is ignored; an
    unknown or unbuilt option is refused with the option named."""
    options = logkit.resolve_config("spark read", {
        "path": "data/", "maxoffsetspertrigger": "100", "INCLUDEHEADERS": "true",
        "kafka.bootstrap.servers": "localhost:9092"})
    assert options["maxOffsetsPerTrigger"] == 100 and options["includeHeaders"] is True
    assert options["failOnDataLoss"] is True and "kafka.bootstrap.servers" not in options
    with pytest.raises(ConfigError, match="did you mean 'startingOffsets'"):
        logkit.resolve_config("spark read", {"path": "d", "startingoffset": "earliest"})
    with pytest.raises(ConfigError, match="'startingTimestamp' is not supported"):
        logkit.resolve_config("spark read", {"path": "d", "startingTimestamp": "1"})
    with pytest.raises(ConfigError, match="'minPartitions' must be >= 1"):
        logkit.resolve_config("spark read", {"path": "d", "minPartitions": "0"})
    with pytest.raises(ConfigError, match="option 'path' is required"):
        logkit.resolve_config("spark write", {"topic": "t"})
    with pytest.raises(ConfigError, match="unknown config scope"):
        logkit.resolve_config("connector", {})


def test_resolve_config_of_a_topic_gives_every_key_with_kafka_defaults():
    config = logkit.resolve_config("topic", {"retention.ms": "1000"})
    assert set(config) == set(TOPIC_CONFIG) and config["retention.ms"] == 1000
    assert config["segment.bytes"] == BROKER_CONFIG["log.segment.bytes"].default


def test_docs_configuration_md_is_the_table():
    """docs/configuration.md's generated blocks are what the table renders now
    (regenerate with tools/config_docs.py), one block per scope and per flag."""
    spec = importlib.util.spec_from_file_location("config_docs",
                                                  ROOT / "tools" / "config_docs.py")
    docs = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(docs)
    blocks = docs.blocks((ROOT / "docs" / "configuration.md").read_text(encoding="utf-8"))
    assert set(blocks) == set(SCOPES) | {IGNORED, REFUSED}
    for name, body in blocks.items():
        assert body == docs.render(name), f"docs/configuration.md block {name!r} is stale"
    for row in SETTINGS:
        if row.status != HONOURED:
            assert f"`{row.key}` ({row.scope}): {row.why}" in blocks[row.status]


# ---- the issue's keys, by behaviour -------------------------------------------------------

def test_isolation_level_takes_kafkas_two_values_only(tmp_path):
    """read_committed and read_uncommitted read the same records (no transactions);
    any other value is a ConfigError naming the key."""
    with logkit.Broker(tmp_path) as broker:
        broker.create_topic("t", 1)
        producer = broker.producer()
        for i in range(5):
            producer.send("t", b"%d" % i)
        producer.flush()
        seen = {}
        for level in ("read_uncommitted", "read_committed"):
            consumer = broker.consumer("t", auto_offset_reset="earliest",
                                       isolation_level=level)
            seen[level] = [r.value for r in consumer.poll(timeout_ms=1000)]
            consumer.close()
        assert seen["read_committed"] == seen["read_uncommitted"] == \
            [b"%d" % i for i in range(5)]
        for bad in ("bogus", "READ_COMMITTED", None, 1):
            with pytest.raises(ConfigError, match="isolation_level"):
                broker.consumer("t", isolation_level=bad)


def test_min_insync_replicas_above_one_fails_acks_all_and_writes_nothing(tmp_path):
    """Without replication the leader is the only in-sync replica: acks='all' to a
    topic asking for 2 fails with NotEnoughReplicasError and stores nothing (Kafka's
    answer with one replica); acks=1 does not look at it; the broker key sets the
    default of new topics."""
    with logkit.Broker(tmp_path, config={"min.insync.replicas": 2}) as broker:
        strict = broker.create_topic("strict", 1)
        broker.create_topic("relaxed", 1, config={"min.insync.replicas": 1})
        assert strict.config["min.insync.replicas"] == 2
        for acks in ("all", -1, "-1"):
            producer = broker.producer(acks=acks)
            future = producer.send("strict", b"v")
            with pytest.raises(logkit.NotEnoughReplicasError, match="min.insync.replicas"):
                future.result(timeout=10)
            assert producer.send("relaxed", b"v").result(timeout=10).offset >= 0
            producer.close()
        assert strict.partition(0).log_end_offset == 0
        assert broker.producer(acks=1).send("strict", b"v").result(timeout=10).offset == 0


def test_ignored_settings_change_nothing(tmp_path):
    """Keys flagged ignored are taken and leave behaviour as it was: a producer with
    retries and a request timeout stores each record once; a topic with
    preallocate writes a log file no bigger than its batches; a broker with an initial
    rebalance delay and an offsets retention forms a group at once and keeps offsets."""
    config = {"group.initial.rebalance.delay.ms": 60000, "offsets.retention.minutes": 1,
              "log.preallocate": True}
    with logkit.Broker(tmp_path, config=config) as broker:
        topic = broker.create_topic("t", 1, config={"preallocate": True})
        producer = broker.producer(retries=10, request_timeout_ms=1, client_id="mine")
        futures = [producer.send("t", b"%d" % i) for i in range(10)]
        producer.flush()
        assert [f.result().offset for f in futures] == list(range(10))
        [log_file] = pathlib.Path(topic.partition(0).directory).glob("*.log")
        assert 0 < log_file.stat().st_size < 4096       # not preallocated to segment.bytes
        consumer = broker.consumer("t", group_id="g", auto_offset_reset="earliest")
        assert len(consumer.poll(timeout_ms=2000)) == 10     # no initial delay
        consumer.commit()
        consumer.close()
        assert broker.group("g").committed() == {logkit.TopicPartition("t", 0): 10}
