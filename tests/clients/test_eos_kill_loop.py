"""Exactly once under SIGKILL (issue 33's headline, docs/clients.md "Delivery
semantics"): a consume-transform-produce copier in a child process, killed at random
points and restarted with the same transactional id, copies its input exactly once —
and every kill leaves a state where read_committed shows exactly the transformed input
below the group's committed offsets, none twice (tests/helpers/eos_copier.py).

A bounded slice of each: the copier as a confluent-kafka client of the listener, and
as an embedded client (tests/clients/test_transactions.py has the embedded loop checked
at its end; this one checks after every kill). tools/eos_kill_loop.py runs the long form
(docs/testing.md has its last result)."""

from __future__ import annotations

import pytest

import logkit
from tests.helpers.eos_copier import KillLoop


def test_a_confluent_kafka_copier_killed_at_random_points_copies_its_input_once(tmp_path):
    pytest.importorskip("confluent_kafka")
    with logkit.Broker(tmp_path) as broker, broker.serve() as server:
        loop = KillLoop(broker, "confluent", server.bootstrap_servers, seed=331,
                        chunk_records=300)
        outcome = loop.run(kills=15)
    assert not outcome.failures, outcome.failures
    assert outcome.kills == 15 and outcome.checks >= 15
    assert outcome.kills_mid_stream >= 5, outcome        # the kills hit the copying
    assert outcome.transactions >= 2 * outcome.kills, outcome


def test_an_embedded_copier_killed_at_random_points_keeps_the_invariant_at_every_kill(
        tmp_path):
    with logkit.Broker(tmp_path) as broker:
        loop = KillLoop(broker, "embedded", str(tmp_path), seed=332, chunk_records=300)
        outcome = loop.run(kills=12)
    assert not outcome.failures, outcome.failures
    assert outcome.kills == 12 and outcome.checks >= 12
    assert outcome.kills_mid_stream >= 5, outcome


def test_the_check_sees_a_duplicate_and_a_loss(tmp_path):
    """The invariant is not vacuous: a record copied twice, and one whose offset was
    committed without its copy, are both reported."""
    with logkit.Broker(tmp_path) as broker:
        loop = KillLoop(broker, "embedded", str(tmp_path))
        loop.feed(3)
        group = broker.group("copy")
        with broker.producer(transactional_id="by-hand") as producer:
            producer.init_transactions()
            with producer.transaction():
                for value in (b"RECORD-0000000", b"RECORD-0000000", b"RECORD-0000001"):
                    producer.send("out", value, key=b"k")
                producer.send_offsets_to_transaction({logkit.TopicPartition("in", 0): 0,
                                                      logkit.TopicPartition("in", 1): 0},
                                                     "copy")
        assert group.committed()
        [failure] = loop.check(final=False)
        assert "3 extra" in failure and "1 twice" in failure, failure
        with broker.producer(transactional_id="by-hand") as producer:
            producer.init_transactions()
            with producer.transaction():
                producer.send_offsets_to_transaction(
                    {logkit.TopicPartition("in", n): p.high_watermark
                     for n, p in enumerate(broker.topic("in").partitions)}, "copy")
        [failure] = loop.check(final=False)
        assert "missing" in failure and "RECORD-0000002" in failure, failure
