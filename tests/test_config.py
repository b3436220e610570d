"""Config tables: Kafka's names and defaults, types, bounds, and broker-to-topic defaults."""

from __future__ import annotations

import pytest

import logkit
from logkit import ConfigError
from logkit.config import (BROKER_CONFIG, BROKER_TO_TOPIC, INT_MAX, TOPIC_CONFIG,
                           resolve_broker_config, resolve_topic_config)


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
