"""The Java client (Kafka 4's KafkaProducer and KafkaConsumer) with its defaults against
logkit's listener: an idempotent acks=all producer, consumer groups with the range and
the cooperative-sticky assignors, static membership (group.instance.id) and the KIP-848
consumer group protocol (group.protocol=consumer). The client runs as
tools/kafka/src/ClientScenarios.java; each test checks what a user of the client sees and
what logkit then holds.

What Apache Kafka 4.3.1 shows for the same scenarios (the same program against the real
broker, 2026-11-28) is the expectation each strict xfail asserts; its row in
docs/kafka-protocol.md ("Differences from Apache Kafka") says what logkit does instead."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

import logkit
from logkit.murmur2 import partition_for_key
from tests.helpers.kafka import skip_reason
from tests.helpers.kafka_tools import describe, fields, partitions, run_scenario, scenario_lines

pytestmark = pytest.mark.skipif(skip_reason() is not None, reason=str(skip_reason()))

RECORDS = 40
PARTITIONS = 4
_names = itertools.count()


def known(row: str):
    return pytest.mark.xfail(strict=True, reason=f"a known difference: docs/kafka-protocol.md,"
                             f" Differences from Apache Kafka, row '{row}'")


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    with logkit.Broker(tmp_path_factory.mktemp("logkit-java") / "data") as broker, \
            broker.serve() as server:
        yield broker, server.bootstrap_servers


@pytest.fixture
def topic(served):
    """A fresh topic of PARTITIONS partitions holding RECORDS records."""
    broker, _ = served
    name = f"java-{next(_names)}"
    broker.create_topic(name, PARTITIONS)
    for i in range(RECORDS):
        broker.topic(name).partition(i % PARTITIONS).append(
            [(b"k%d" % i, b"v%d" % i, None, None)])
    return name


def run_group(servers: str, topic: str, protocol: str, assignor: str, members: int,
              *extra: str):
    group = f"{topic}-{protocol}-{assignor}"
    proc = run_scenario("group", servers, topic, group, protocol, assignor, members, RECORDS,
                        *extra)
    return group, proc


def member_lines(proc) -> list[dict[str, str]]:
    return [fields(words) for words in scenario_lines(proc, "MEMBER")]


def check_group(broker, group: str, topic: str, proc) -> list[dict[str, str]]:
    """The group read every record once between its members, their partitions cover the
    topic without overlap, and the offsets they committed are the partitions' ends."""
    assert proc.returncode == 0, describe(proc)
    assert scenario_lines(proc, "CONSUMED") == [[str(RECORDS)]]
    members = member_lines(proc)
    held = [partitions(m["assigned"]) for m in members]
    assert sorted(p for ps in held for p in ps) == list(range(PARTITIONS))
    assert all(held)
    assert len({m["generation"] for m in members}) == 1
    committed = broker.group(group).committed()
    assert {tp.partition: offset for tp, offset in committed.items()} == {
        p.partition: p.high_watermark for p in broker.topic(topic).partitions}
    return members


def test_the_java_producer_with_its_defaults_is_idempotent_and_acks_all(served):
    """No settings but the serializers: Kafka 4's producer is idempotent with acks=all.
    Every send is acknowledged, each key lands on murmur2's partition for it (the Java
    partitioner), offsets follow send order per partition, and the stored batches carry
    the producer id and sequences the idempotent producer gave them."""
    broker, servers = served
    name = f"java-produce-{next(_names)}"
    broker.create_topic(name, PARTITIONS)
    proc = run_scenario("produce", servers, name, RECORDS)
    assert proc.returncode == 0, describe(proc)
    sent = [(int(p), int(o)) for p, o in scenario_lines(proc, "SENT")]
    assert len(sent) == RECORDS
    for i, (partition, _) in enumerate(sent):
        assert partition == partition_for_key(b"key-%d" % (i % 10), PARTITIONS)
    for p in range(PARTITIONS):
        offsets = [o for q, o in sent if q == p]
        assert offsets == list(range(len(offsets)))
    topic = broker.topic(name)
    stored = {(p.partition, r.offset): (r.key, r.value) for p in topic.partitions
              for r in p.read(0)}
    assert stored == {where: (b"key-%d" % (i % 10), b"value-%d" % i)
                      for i, where in enumerate(sent)}
    batches = [b for p in topic.partitions for segment in
               sorted(Path(p.directory).glob("*.log"))
               for b in logkit.iter_segment_batches(segment, decode=True)]
    producer_ids = {b.header.producer_id for b in batches}
    assert len(producer_ids) == 1 and min(producer_ids) >= 0
    assert all(b.header.base_sequence >= 0 for b in batches)


def test_a_group_with_the_range_assignor_splits_the_partitions_and_commits(served, topic):
    """Eager rebalancing: when the second member joins, the first gives up everything
    it held and the range assignor hands each member two neighbouring partitions."""
    broker, servers = served
    group, proc = run_group(servers, topic, "classic", "range", 2)
    members = check_group(broker, group, topic, proc)
    assert [partitions(m["assigned"]) for m in members] == [[0, 1], [2, 3]]
    assert members[0]["revoked"] == "[[0,1,2,3]]"


def test_a_group_with_the_cooperative_sticky_assignor_moves_only_what_it_must(served, topic):
    """Incremental rebalancing: the first member keeps the partitions it is assigned
    again and revokes only the two that move to the newcomer (Kafka shows the same)."""
    broker, servers = served
    group, proc = run_group(servers, topic, "classic", "cooperative-sticky", 2)
    members = check_group(broker, group, topic, proc)
    first, second = (partitions(m["assigned"]) for m in members)
    assert len(first) == len(second) == 2
    assert members[0]["revoked"] == f"[{members[1]['assigned']}]"
    assert members[1]["revoked"] == "[]"


def test_static_members_form_a_group(served, topic):
    """group.instance.id set on every member: the group forms, reads and commits."""
    broker, servers = served
    group = f"{topic}-static-form"
    proc = run_scenario("group", servers, topic, group, "classic", "range", 2, RECORDS,
                        "static")
    check_group(broker, group, topic, proc)


def test_a_restarted_static_member_gets_its_partitions_back_without_a_rebalance(served,
                                                                                 topic):
    """KIP-345: a static member's close sends no LeaveGroup; back within
    session.timeout.ms under the same group.instance.id it gets its old partitions and the
    group's generation is unchanged (Kafka: generation 2 before and after, nothing revoked
    from the other member)."""
    broker, servers = served
    group, proc = run_group(servers, topic, "classic", "range", 2, "static-restart")
    check_group(broker, group, topic, proc)
    restart = fields(scenario_lines(proc, "RESTART")[0])
    assert restart["generation_after"] == restart["generation_before"]
    assert restart["restarted_generation"] == restart["generation_before"]
    assert restart["assigned_after"] == restart["assigned_before"]
    assert restart["revoked_after"] == "[]"


@known("the consumer group protocol (KIP-848)")
def test_a_group_on_the_kip_848_protocol_splits_the_partitions(served, topic):
    """group.protocol=consumer: the broker assigns (its default uniform assignor) through
    ConsumerGroupHeartbeat. Today the client fails at once: "The node does not support
    CONSUMER_GROUP_HEARTBEAT" (UnsupportedVersionException)."""
    broker, servers = served
    group, proc = run_group(servers, topic, "consumer", "-", 2)
    check_group(broker, group, topic, proc)
