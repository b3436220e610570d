"""Apache Kafka's own command-line tools against logkit's listener: kafka-topics,
kafka-configs, the console producer and consumer, kafka-consumer-groups,
kafka-get-offsets, kafka-delete-records, the two perf tests and the end-to-end latency
tool, each run from Kafka 4's classpath (tests/helpers/kafka.py) at a
`logkit.Broker(dir).serve()` in this process. Each test checks what the tool prints and
what the broker then holds, through logkit's own API.

A tool that fails for want of a Kafka API logkit does not serve is a strict xfail naming
its row in docs/kafka-protocol.md ("Differences from Apache Kafka"), so the test fails the
day the API is served and the row must go."""

from __future__ import annotations

import itertools
import json
import re
import subprocess
import sys

import pytest

import logkit
from tests.helpers.kafka import skip_reason
from tests.helpers.kafka_tools import parse_consumer_perf, parse_e2e_latency, parse_producer_perf
from tests.helpers.kafka_tools import tool as run_tool

pytestmark = pytest.mark.skipif(skip_reason() is not None, reason=str(skip_reason()))

_names = itertools.count()


def known(row: str):
    return pytest.mark.xfail(strict=True, reason=f"a known difference: docs/kafka-protocol.md,"
                             f" Differences from Apache Kafka, row '{row}'")


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """(broker, bootstrap servers): a broker in this process, served to the tools."""
    with logkit.Broker(tmp_path_factory.mktemp("logkit-tools") / "data") as broker, \
            broker.serve() as server:
        yield broker, server.bootstrap_servers


def fresh(prefix: str) -> str:
    return f"{prefix}-{next(_names)}"


def topics_tool(servers: str, *args: str):
    return run_tool("kafka-topics", "--bootstrap-server", servers, *args)


def produce_lines(servers: str, topic: str, lines: list[str]) -> None:
    """kafka-console-producer, `key:value` per line."""
    run_tool("kafka-console-producer", "--bootstrap-server", servers, "--topic", topic,
             "--reader-property", "parse.key=true", "--reader-property", "key.separator=:",
             input_text="".join(f"{line}\n" for line in lines))


def consume_group(servers: str, topic: str, group: str, count: int):
    return run_tool("kafka-console-consumer", "--bootstrap-server", servers, "--topic", topic,
                    "--group", group, "--from-beginning", "--max-messages", str(count),
                    "--formatter-property", "print.key=true",
                    "--formatter-property", "print.partition=true", "--timeout-ms", "30000")


def describe_rows(stdout: str) -> dict[int, dict[str, str]]:
    """kafka-topics --describe's partition lines, as {partition: {field: value}}."""
    rows = {}
    for line in stdout.splitlines():
        found = dict(re.findall(r"(\w+): (\S*)", line))
        if "Partition" in found and "PartitionCount" not in found:
            rows[int(found["Partition"])] = found
    return rows


def test_kafka_topics_creates_describes_grows_lists_and_deletes_a_topic(served):
    broker, servers = served
    topic = fresh("tools-topics")
    out = topics_tool(servers, "--create", "--topic", topic, "--partitions", "2",
                      "--config", "retention.ms=3600000").stdout
    assert f"Created topic {topic}." in out
    assert len(broker.topic(topic).partitions) == 2
    assert broker.topic(topic).config["retention.ms"] == 3600000

    described = topics_tool(servers, "--describe", "--topic", topic).stdout
    assert f"Topic: {topic}\t" in described and "PartitionCount: 2\t" in described
    assert "retention.ms=3600000" in described          # the topic's own configs
    rows = describe_rows(described)
    assert sorted(rows) == [0, 1]
    assert all(r["Leader"] == r["Replicas"] == r["Isr"] for r in rows.values())

    topics_tool(servers, "--alter", "--topic", topic, "--partitions", "5")
    assert len(broker.topic(topic).partitions) == 5
    assert sorted(describe_rows(topics_tool(servers, "--describe", "--topic",
                                            topic).stdout)) == [0, 1, 2, 3, 4]
    fewer = run_tool("kafka-topics", "--bootstrap-server", servers, "--alter", "--topic",
                     topic, "--partitions", "3", check=False)
    assert fewer.returncode != 0 and "InvalidPartitionsException" in fewer.stderr + fewer.stdout

    assert topic in topics_tool(servers, "--list").stdout.split()
    topics_tool(servers, "--delete", "--topic", topic)
    assert topic not in broker.topics()
    assert topic not in topics_tool(servers, "--list").stdout.split()


def test_kafka_configs_describes_a_topics_configs_and_their_sources(served):
    broker, servers = served
    topic = fresh("tools-configs")
    broker.create_topic(topic, 1, config={"retention.ms": 3600000})
    dynamic = run_tool("kafka-configs", "--bootstrap-server", servers, "--describe",
                       "--entity-type", "topics", "--entity-name", topic).stdout
    assert f"Dynamic configs for topic {topic} are:" in dynamic
    assert "retention.ms=3600000 sensitive=false" in dynamic
    every = run_tool("kafka-configs", "--bootstrap-server", servers, "--describe", "--all",
                     "--entity-type", "topics", "--entity-name", topic).stdout
    assert "synonyms={DYNAMIC_TOPIC_CONFIG:retention.ms=3600000" in every
    assert "cleanup.policy=delete sensitive=false synonyms={DEFAULT_CONFIG:cleanup.policy=delete}" \
        in every
    assert "max.message.bytes=1048588 " in every        # Kafka's default


def stored_topic_config(broker, topic: str) -> dict:
    """The topic's config as a new Broker over the same directory reads it (`logkit
    topics describe --configs`, another process): what alter_topic_config stored."""
    proc = subprocess.run([sys.executable, "-m", "logkit.cli", "topics", "describe",
                           "--configs", "--json", str(broker.path), topic],
                          capture_output=True, text=True, timeout=60, check=True)
    return json.loads(proc.stdout)["config"]


def test_kafka_configs_alters_a_topic_config(served):
    broker, servers = served
    topic = fresh("tools-alter")
    broker.create_topic(topic, 1, config={"segment.ms": 3600000})
    proc = run_tool("kafka-configs", "--bootstrap-server", servers, "--alter",
                    "--entity-type", "topics", "--entity-name", topic,
                    "--add-config", "retention.ms=1000", "--delete-config", "segment.ms",
                    check=False)
    assert proc.returncode == 0, proc.stderr
    assert f"Completed updating config for topic {topic}." in proc.stdout
    stored = stored_topic_config(broker, topic)
    assert stored["retention.ms"] == 1000 and stored["segment.ms"] == 604800000
    bad = run_tool("kafka-configs", "--bootstrap-server", servers, "--alter",
                   "--entity-type", "topics", "--entity-name", topic,
                   "--add-config", "retention.ms=soon", check=False)
    assert bad.returncode != 0 and "InvalidConfigurationException" in bad.stderr + bad.stdout
    assert stored_topic_config(broker, topic)["retention.ms"] == 1000


def test_an_altered_topic_config_applies_at_once_in_the_serving_broker(served):
    broker, servers = served
    topic = fresh("tools-alter-live")
    broker.create_topic(topic, 1)
    run_tool("kafka-configs", "--bootstrap-server", servers, "--alter", "--entity-type",
             "topics", "--entity-name", topic, "--add-config", "retention.ms=1000")
    # today: stored (a new Broker reads 1000), applied when this broker reopens the topic
    assert broker.topic(topic).config["retention.ms"] == 1000


def test_the_console_producer_and_consumer_carry_keyed_records_and_commit(served):
    broker, servers = served
    topic = fresh("tools-console")
    broker.create_topic(topic, 3)
    lines = [f"key-{i % 4}:value {i}" for i in range(12)]
    produce_lines(servers, topic, lines)
    stored = sorted((r.key, r.value) for p in broker.topic(topic).partitions
                    for r in p.read(0))
    assert stored == sorted((f"key-{i % 4}".encode(), f"value {i}".encode()) for i in range(12))

    proc = consume_group(servers, topic, f"{topic}-g", 12)
    assert "Processed a total of 12 messages" in proc.stderr
    printed = [line.split("\t") for line in proc.stdout.splitlines() if line]
    assert sorted((key, value) for _, key, value in printed) == sorted(
        tuple(line.split(":")) for line in lines)
    # each key on one partition, as logkit stored it
    where = {r.key.decode(): p.partition for p in broker.topic(topic).partitions
             for r in p.read(0)}
    assert all(int(part.removeprefix("Partition:")) == where[key] for part, key, _ in printed)
    # the consumer committed where it stopped: the end of every partition
    committed = broker.group(f"{topic}-g").committed()
    assert {tp.partition: off for tp, off in committed.items()} == {
        p.partition: p.high_watermark for p in broker.topic(topic).partitions}


def group_rows(stdout: str, group: str) -> list[list[str]]:
    return [line.split() for line in stdout.splitlines() if line.split()[:1] == [group]]


def test_kafka_consumer_groups_lists_describes_and_resets_a_group(served):
    broker, servers = served
    topic = fresh("tools-groups")
    group = f"{topic}-g"
    broker.create_topic(topic, 2)
    produce_lines(servers, topic, [f"k{i}:v{i}" for i in range(10)])
    consume_group(servers, topic, group, 10)
    tool = ("kafka-consumer-groups", "--bootstrap-server", servers)

    assert group in run_tool(*tool, "--list").stdout.split()
    rows = group_rows(run_tool(*tool, "--describe", "--group", group).stdout, group)
    # GROUP TOPIC PARTITION CURRENT-OFFSET LOG-END-OFFSET LAG CONSUMER-ID HOST CLIENT-ID
    ends = {p.partition: p.high_watermark for p in broker.topic(topic).partitions}
    assert sorted((int(r[2]), int(r[3]), int(r[4]), int(r[5])) for r in rows) == [
        (p, end, end, 0) for p, end in sorted(ends.items())]
    state = group_rows(run_tool(*tool, "--describe", "--group", group, "--state").stdout, group)
    assert state and state[0][-2:] == ["Empty", "0"]

    reset = run_tool(*tool, "--reset-offsets", "--group", group, "--topic", topic,
                     "--to-earliest", "--execute").stdout
    assert sorted((int(r[2]), int(r[3])) for r in group_rows(reset, group)) == [(0, 0), (1, 0)]
    assert set(broker.group(group).committed().values()) == {0}
    assert sum(broker.group(group).lag().values()) == 10

    shifted = run_tool(*tool, "--reset-offsets", "--group", group, "--topic", f"{topic}:1",
                       "--shift-by", "2", "--execute").stdout
    assert [(int(r[2]), int(r[3])) for r in group_rows(shifted, group)] == [(1, min(2, ends[1]))]


def test_kafka_consumer_groups_deletes_a_group(served):
    broker, servers = served
    topic = fresh("tools-delgroup")
    group = f"{topic}-g"
    broker.create_topic(topic, 1)
    produce_lines(servers, topic, ["k:v"])
    consume_group(servers, topic, group, 1)
    proc = run_tool("kafka-consumer-groups", "--bootstrap-server", servers, "--delete",
                    "--group", group)
    assert f"Deletion of requested consumer groups ('{group}') was successful." in proc.stdout
    assert group not in broker.groups()


def test_kafka_get_offsets_prints_each_partitions_end_and_start(served):
    broker, servers = served
    topic = fresh("tools-offsets")
    broker.create_topic(topic, 3)
    for p, count in enumerate((4, 0, 7)):
        if count:
            broker.topic(topic).partition(p).append([(b"k", b"v", None, None)] * count)

    def offsets(*args: str) -> list[str]:
        return run_tool("kafka-get-offsets", "--bootstrap-server", servers, "--topic", topic,
                        *args).stdout.split()

    assert offsets() == [f"{topic}:0:4", f"{topic}:1:0", f"{topic}:2:7"]     # latest
    assert offsets("--time", "-2") == [f"{topic}:0:0", f"{topic}:1:0", f"{topic}:2:0"]
    assert offsets("--time", "-1", "--partitions", "2") == [f"{topic}:2:7"]


def test_kafka_delete_records_moves_the_log_start_offset(served, tmp_path):
    broker, servers = served
    topic = fresh("tools-delrec")
    broker.create_topic(topic, 1)
    broker.topic(topic).partition(0).append([(b"k", b"v", None, None)] * 5)
    spec = tmp_path / "offsets.json"
    spec.write_text(json.dumps({"version": 1, "partitions": [
        {"topic": topic, "partition": 0, "offset": 3}]}))
    proc = run_tool("kafka-delete-records", "--bootstrap-server", servers,
                    "--offset-json-file", str(spec))
    assert f"partition: {topic}-0\tlow_watermark: 3" in proc.stdout
    assert broker.topic(topic).partition(0).log_start_offset == 3


def test_the_perf_tools_and_the_latency_tool_run_to_the_end(served):
    """kafka-producer-perf-test (the Java producer's defaults: acks=all, idempotent),
    kafka-consumer-perf-test and the end-to-end latency tool finish and print their
    summaries; the records they counted are the ones logkit holds. Small runs: the
    figures themselves are benchmarks/kafka.py's."""
    broker, servers = served
    topic = fresh("tools-perf")
    broker.create_topic(topic, 2)
    produced = parse_producer_perf(run_tool(
        "kafka-producer-perf-test", "--topic", topic, "--num-records", "20000",
        "--record-size", "100", "--throughput", "-1",
        "--command-property", f"bootstrap.servers={servers}").stdout)
    assert produced["records"] == 20000 and produced["records_per_s"] > 0
    assert sum(p.high_watermark for p in broker.topic(topic).partitions) == 20000
    assert {len(r.value) for r in broker.topic(topic).partition(0).read(0, max_records=50)} \
        == {100}

    consumed = parse_consumer_perf(run_tool(
        "kafka-consumer-perf-test", "--bootstrap-server", servers, "--topic", topic,
        "--num-records", "20000", "--timeout", "30000").stdout)
    assert consumed["records"] == 20000
    assert consumed["mb"] == pytest.approx(20000 * 100 / 2**20, rel=1e-3)

    latency_topic = fresh("tools-e2e")
    broker.create_topic(latency_topic, 1)
    latency = parse_e2e_latency(run_tool(
        "kafka-e2e-latency", "--bootstrap-server", servers, "--topic", latency_topic,
        "--num-records", "200", "--producer-acks", "all", "--record-size", "100").stdout)
    assert 0 <= latency["latency_ms_p50"] <= latency["latency_ms_p99"]
    assert broker.topic(latency_topic).partition(0).high_watermark == 200
