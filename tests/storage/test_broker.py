"""Broker and topic management: names, configs, partition counts, lifecycle."""

from __future__ import annotations

import os

import pytest

import logkit
from logkit import (ClosedError, ConfigError, InvalidTopicError, TopicExistsError,
                    UnknownTopicError)


@pytest.mark.parametrize("name", ["", ".", "..", "a/b", "../etc", "a b", "x" * 250, "é",
                                  None, 5, b"bytes"])
def test_invalid_topic_names_are_refused(broker, name):
    """Names outside Kafka's rule raise InvalidTopicError and create nothing."""
    before = set(os.listdir(broker.path))
    with pytest.raises(InvalidTopicError):
        broker.create_topic(name, 1)
    assert set(os.listdir(broker.path)) == before


def test_legal_edge_names(broker):
    """Kafka's legal characters and the 249-character limit are accepted."""
    for name in ["a", "A.b_c-9", "x" * 249, "..a"]:
        broker.create_topic(name, 1)
    assert len(broker.topics()) == 4


@pytest.mark.parametrize("partitions", [0, -1, 1.5, "3", True, 10**6])
def test_bad_partition_counts(broker, partitions):
    """Zero, negative, non-integer, bool and absurd partition counts raise ConfigError."""
    with pytest.raises(ConfigError):
        broker.create_topic("t", partitions)
    assert broker.topics() == []


@pytest.mark.parametrize("config, match", [
    ({"retention.mss": 5}, "unknown topic config"),
    ({"retention.ms": "soon"}, "integer"),
    ({"retention.ms": -5}, ">= -1"),
    ({"segment.bytes": 10}, ">= 1024"),
    ({"cleanup.policy": "compacted"}, "'delete', 'compact' or"),
    ({"preallocate": "maybe"}, "boolean"),
    ("retention.ms=5", "dict"),
])
def test_bad_topic_configs(broker, config, match):
    """Unknown keys and bad values raise ConfigError naming the problem."""
    with pytest.raises(ConfigError, match=match):
        broker.create_topic("t", 1, config=config)


def test_broker_config_names_and_defaults(tmp_path):
    """Broker settings use Kafka's names; log.* settings are topic defaults."""
    with pytest.raises(ConfigError, match="unknown broker config"):
        logkit.Broker(tmp_path, config={"num_partitions": 3})
    with logkit.Broker(tmp_path, config={"num.partitions": 3, "log.retention.ms": 5000,
                                         "auto.create.topics.enable": False}) as broker:
        topic = broker.create_topic("t")
        assert topic.num_partitions == 3
        assert topic.config["retention.ms"] == 5000
        assert topic.config["segment.bytes"] == 1073741824          # Kafka's default
        with pytest.raises(UnknownTopicError):
            broker.get_or_create_topic("auto")
    with logkit.Broker(tmp_path) as broker:
        assert broker.get_or_create_topic("auto").num_partitions == 1


def test_create_list_delete_recreate(broker):
    """Topics are created, listed, deleted with their files, and re-created empty."""
    topic = broker.create_topic("orders", 2, config={"retention.ms": 1000})
    topic.partition(1).append([(None, b"x", None, None)])
    with pytest.raises(TopicExistsError):
        broker.create_topic("orders", 2)
    assert broker.topics() == ["orders"]
    assert sorted(d for d in os.listdir(broker.path) if d.startswith("orders")) == \
        ["orders-0", "orders-1"]
    broker.delete_topic("orders")
    assert broker.topics() == []
    assert not [d for d in os.listdir(broker.path) if d.startswith("orders")]
    with pytest.raises(UnknownTopicError):
        broker.topic("orders")
    with pytest.raises(UnknownTopicError):
        broker.delete_topic("orders")
    again = broker.create_topic("orders", 1)
    assert again.partition(0).log_end_offset == 0
    with pytest.raises(UnknownTopicError):
        again.partition(1)


def test_partition_for_uses_kafka_murmur2(broker):
    """Topic.partition_for is Kafka's (murmur2(key) & 0x7fffffff) % partitions."""
    topic = broker.create_topic("t", 3)
    assert topic.partition_for(b"21") == (-973932308 & 0x7FFFFFFF) % 3
    assert topic.partition_for(b"foobar") == (-790332482 & 0x7FFFFFFF) % 3


def test_close_is_idempotent_and_later_calls_fail(tmp_path):
    """close() twice is fine; using a closed broker raises ClosedError."""
    broker = logkit.Broker(tmp_path)
    p = broker.create_topic("t", 1).partition(0)
    broker.close()
    broker.close()
    with pytest.raises(ClosedError):
        broker.create_topic("u", 1)
    with pytest.raises(ClosedError):
        broker.topics()
    with pytest.raises(ClosedError):
        p.read(0)
    with pytest.raises(ClosedError):
        p.append([(None, b"x", None, None)])


def test_two_brokers_in_one_process_share_the_directory(tmp_path):
    """Two Broker objects on one root in one process see each other's writes."""
    with logkit.Broker(tmp_path) as a, logkit.Broker(tmp_path) as b:
        a.create_topic("t", 1).partition(0).append([(None, b"from-a", None, None)])
        assert b.topic("t").partition(0).read(0)[0].value == b"from-a"
        b.topic("t").partition(0).append([(None, b"from-b", None, None)])
        assert [r.value for r in a.topic("t").partition(0).read(0)] == [b"from-a", b"from-b"]


def test_create_topic_exist_ok_returns_the_same_topic(broker):
    """exist_ok=True makes a create idempotent (a script run twice); other settings for
    an existing name still raise TopicExistsError naming the difference."""
    first = broker.create_topic("orders", 3, config={"retention.ms": 1000})
    again = broker.create_topic("orders", 3, config={"retention.ms": 1000}, exist_ok=True)
    assert again.topic_id == first.topic_id
    assert broker.create_topic("orders", exist_ok=True, config={"retention.ms": 1000}) \
        .num_partitions == 3
    with pytest.raises(TopicExistsError, match="exist_ok=True"):
        broker.create_topic("orders", 3, config={"retention.ms": 1000})
    with pytest.raises(TopicExistsError, match="3 partition"):
        broker.create_topic("orders", 2, config={"retention.ms": 1000}, exist_ok=True)
    with pytest.raises(TopicExistsError, match="config overrides"):
        broker.create_topic("orders", 3, exist_ok=True)
    assert broker.create_topic("new", 2, exist_ok=True).num_partitions == 2


def test_broker_refuses_a_file_and_a_foreign_directory(tmp_path):
    """Broker(<a file>) and Broker(<a non-empty folder that is not logkit's>) raise
    ConfigError naming the path and write nothing; adopt=True takes the folder."""
    a_file = tmp_path / "notes.txt"
    a_file.write_text("hello")
    with pytest.raises(ConfigError, match=f"{a_file} is not a directory"):
        logkit.Broker(a_file)
    with pytest.raises(ConfigError, match="is not a directory"):
        logkit.Broker(a_file, read_only=True)
    assert a_file.read_text() == "hello"
    project = tmp_path / "project"
    project.mkdir()
    (project / "setup.py").write_text("")
    with pytest.raises(ConfigError, match=rf"{project} is not empty .*setup\.py.*adopt=True"):
        logkit.Broker(project)
    assert os.listdir(project) == ["setup.py"]
    with logkit.Broker(project, adopt=True) as broker:
        broker.create_topic("t", 1)
    with logkit.Broker(project) as broker:                 # a logkit root from now on
        assert broker.topics() == ["t"]
    empty = tmp_path / "empty"
    empty.mkdir()
    with logkit.Broker(empty) as broker:
        assert broker.topics() == []
