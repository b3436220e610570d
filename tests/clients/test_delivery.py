"""Delivery semantics with a consumer process SIGKILLed mid-stream: at-least-once
(process, then commit) loses nothing; at-most-once (commit, then process) never delivers
a record twice. Two member processes share the group; one is killed while it works, the
survivor takes its partitions after the session timeout and finishes the stream."""

from __future__ import annotations

import pytest

import logkit
from tests.helpers.procs import Worker, wait_until

RECORDS = 3000


def produce(root, n, partitions=4):
    with logkit.Broker(root) as broker:
        broker.create_topic("t", partitions)
        producer = broker.producer(linger_ms=1)
        for i in range(n):
            producer.send("t", b"%d" % i, key=b"%d" % (i % 50))
        producer.close()


def expected_records(root):
    with logkit.Broker(root) as broker:
        topic = broker.topic("t")
        return {(p, o) for p in range(topic.num_partitions)
                for o in range(topic.partition(p).log_end_offset)}


def group_caught_up(root, group):
    with logkit.Broker(root) as broker:
        g = broker.group(group)
        return len(g.committed()) == broker.topic("t").num_partitions and \
            all(lag == 0 for lag in g.lag().values())


@pytest.mark.parametrize("mode", ["alo", "amo"])
def test_delivery_semantics_when_a_member_is_killed_mid_stream(tmp_path, mode):
    """alo: every record is delivered at least once; amo: none is delivered twice."""
    produce(tmp_path, RECORDS)
    victim = Worker(tmp_path, "d", "t", mode)
    survivor = Worker(tmp_path, "d", "t", mode)
    try:
        wait_until(lambda: len(victim.records()) > 200 and survivor.records(), 60,
                   "both members to make progress")
        victim.kill()                                  # mid-stream, between any two lines
        wait_until(lambda: group_caught_up(tmp_path, "d"), 90,
                   "the survivor to take over and finish")
    finally:
        survivor.stop()
        victim.stop()
    delivered = victim.records() + survivor.records()
    unique = set(delivered)
    expected = expected_records(tmp_path)
    assert unique <= expected
    if mode == "alo":
        assert unique == expected                      # nothing lost
    else:
        assert len(delivered) == len(unique)           # nothing twice
