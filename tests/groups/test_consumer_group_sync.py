"""A group member's poll reads its generation from LMDB only when the doorbell's
rebalance or metadata counter moved (or GENERATION_RECHECK_S passed): the steady state
costs no store read, and a rebalance, a grown topic or a missed hint is still learned
by the next poll that may learn it."""

from __future__ import annotations

import pytest

import logkit
from logkit import TopicPartition, coordinator


@pytest.fixture
def no_recheck(monkeypatch):
    """Only the doorbell's counters can send a poll to the store."""
    monkeypatch.setattr(coordinator, "GENERATION_RECHECK_S", 3600.0)


def _spy_generation(consumer) -> list[int]:
    """Counts the member's generation reads (the store is real; only counted)."""
    group = consumer._coordinator.group
    calls: list[int] = []
    read = group.generation

    def counted() -> int:
        calls.append(1)
        return read()

    group.generation = counted
    return calls


def test_steady_polls_skip_the_store_and_a_join_is_seen_at_once(broker, no_recheck):
    broker.create_topic("t", 4)
    first = broker.consumer("t", group_id="g", auto_offset_reset="earliest",
                            enable_auto_commit=False)
    first.poll(timeout_ms=0)
    first.poll(timeout_ms=0)          # the second sync after the member's own writes
    assert len(first.assignment()) == 4
    reads = _spy_generation(first)
    for _ in range(50):
        first.poll(timeout_ms=0)
    assert reads == []
    second = broker.consumer("t", group_id="g", auto_offset_reset="earliest",
                             enable_auto_commit=False)
    second.poll(timeout_ms=0)         # joined: the group moved to a new generation
    first.poll(timeout_ms=0)
    assert reads
    assert len(first.assignment()) == 2
    assert first.assignment() | second.assignment() == {TopicPartition("t", p)
                                                         for p in range(4)}
    first.close()
    second.close()


def test_a_grown_topic_is_seen_by_the_next_poll(broker, no_recheck):
    broker.create_topic("t", 1)
    member = broker.consumer("t", group_id="g", auto_offset_reset="earliest",
                             enable_auto_commit=False)
    member.poll(timeout_ms=0)
    member.poll(timeout_ms=0)
    broker.create_partitions("t", 3)
    member.poll(timeout_ms=0)
    assert member.assignment() == {TopicPartition("t", p) for p in range(3)}
    member.close()


def test_a_missed_hint_is_caught_by_the_periodic_reread(broker, no_recheck):
    """A rebalance whose bump was lost (its writer killed between commit and bump,
    simulated by putting the counter back) is learned once the re-read is due."""
    broker.create_topic("t", 4)
    first = broker.consumer("t", group_id="g", auto_offset_reset="earliest",
                            enable_auto_commit=False)
    first.poll(timeout_ms=0)
    first.poll(timeout_ms=0)
    doorbell = broker.doorbell
    before = doorbell.groups_version()
    second = broker.consumer("t", group_id="g", auto_offset_reset="earliest",
                             enable_auto_commit=False)
    assert doorbell.groups_version() != before          # the join announced itself
    doorbell._groups.value = before                     # ... and the hint is lost
    first.poll(timeout_ms=0)
    assert len(first.assignment()) == 4                 # not learned yet
    first._coordinator._recheck_at = 0.0                # the re-read is due
    first.poll(timeout_ms=0)
    assert len(first.assignment()) == 2
    first.close()
    second.close()


def test_a_read_only_broker_reads_the_generation_on_every_poll(tmp_path):
    """Without a doorbell (read-only) there is no hint: each poll reads the store."""
    with logkit.Broker(tmp_path) as broker:
        broker.create_topic("t", 1)
        member = broker.consumer("t", group_id="g", auto_offset_reset="earliest",
                                 enable_auto_commit=False)
        member.poll(timeout_ms=0)
        member._coordinator.broker = _NoDoorbell(broker)
        reads = _spy_generation(member)
        for _ in range(3):
            member.poll(timeout_ms=0)
        assert len(reads) == 3
        member.close()


class _NoDoorbell:
    """The broker as a read-only broker shows it to the coordinator: no doorbell."""

    doorbell = None

    def __init__(self, broker: logkit.Broker) -> None:
        self._broker = broker

    def __getattr__(self, name: str):
        return getattr(self._broker, name)
