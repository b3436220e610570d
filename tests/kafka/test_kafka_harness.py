"""The Kafka harness itself (tests/helpers/kafka.py): every tool it names is a main class
of the resolved classpath, and the broker the session starts answers Kafka's own
command-line tools, run by the helper."""

from __future__ import annotations

import zipfile

import pytest

from tests.helpers.kafka import (LIB_DIR, TOOLS, create_topics, run_tool, skip_reason,
                                 wait_until_known)

pytestmark = pytest.mark.skipif(skip_reason() is not None, reason=str(skip_reason()))


def test_every_tool_the_helper_names_is_a_class_on_the_classpath():
    classes = set()
    for jar in LIB_DIR.glob("*.jar"):
        with zipfile.ZipFile(jar) as z:
            classes.update(n[:-len(".class")].replace("/", ".") for n in z.namelist()
                           if n.endswith(".class"))
    assert {tool: cls for tool, cls in TOOLS.items() if cls not in classes} == {}


def test_kafka_topics_creates_and_describes_on_the_sessions_broker(kafka):
    AdminClient = pytest.importorskip("confluent_kafka.admin").AdminClient
    servers = ("--bootstrap-server", kafka.bootstrap_servers)
    run_tool("kafka-topics", *servers, "--create", "--topic", "harness-topics",
             "--partitions", "3", "--config", "retention.ms=3600000")
    # --create returns once the controller committed the topic; --describe asks the
    # broker, whose metadata may not show it yet ("does not exist as expected")
    wait_until_known(AdminClient({"bootstrap.servers": kafka.bootstrap_servers}),
                     "harness-topics", 3)
    out = run_tool("kafka-topics", *servers, "--describe", "--topic", "harness-topics").stdout
    assert "PartitionCount: 3" in out and "retention.ms=3600000" in out
    assert [line.split()[3] for line in out.splitlines() if "Partition: " in line] == \
        ["0", "1", "2"]


def test_a_topic_create_topics_made_is_described_at_once(kafka):
    """tests.helpers.kafka.create_topics returns once the broker's metadata shows each
    topic, so a DescribeConfigs sent right after never gets UNKNOWN_TOPIC_OR_PART (after
    a bare CreateTopics it often does: the broker learns of the topic a moment after
    the controller answers)."""
    admin_module = pytest.importorskip("confluent_kafka.admin")
    admin = admin_module.AdminClient({"bootstrap.servers": kafka.bootstrap_servers})
    failed = []
    for n in range(20):
        topic = f"harness-known-{n}"
        create_topics(kafka.bootstrap_servers, [admin_module.NewTopic(topic, 2, 1)])
        resource = admin_module.ConfigResource("topic", topic)
        try:
            admin.describe_configs([resource])[resource].result(timeout=30)
        except Exception as exc:        # KafkaException(UNKNOWN_TOPIC_OR_PART)
            failed.append((topic, exc))
    assert failed == []
