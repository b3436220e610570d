"""The idempotent producer (docs/design.md §15, KIP-98): Kafka's rules between acks,
enable_idempotence and transactional_id; a producer id and epoch from the coordinator;
per-partition sequence numbers in every batch, contiguous across batches, split
batches and large values; producer ids unique across processes; a retried batch stored
once."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

import logkit
from logkit.config import TABLE

TP = logkit.TopicPartition


def headers(partition):
    return [h for h in partition.batch_headers(0) if not h.is_control]


@pytest.mark.parametrize("acks, expected", [("all", True), (-1, True), (1, False),
                                            (0, False)])
def test_idempotence_defaults_to_true_exactly_when_acks_is_all(logkit_broker, acks,
                                                              expected):
    producer = logkit_broker.producer(acks=acks)
    assert producer.config["enable_idempotence"] is expected
    producer.close()
    assert TABLE["producer"]["enable_idempotence"].default is None   # derived from acks


@pytest.mark.parametrize("acks", [0, 1, "1"])
def test_idempotence_with_acks_zero_or_one_is_a_config_error(logkit_broker, acks):
    with pytest.raises(logkit.ConfigError, match="acks='all'"):
        logkit_broker.producer(acks=acks, enable_idempotence=True)


def test_a_transactional_producer_implies_idempotence_and_acks_all(logkit_broker):
    producer = logkit_broker.producer(transactional_id="tx")
    assert producer.config["acks"] == "all" and producer.config["enable_idempotence"]
    producer.close()
    with pytest.raises(logkit.ConfigError, match="acks='all'"):
        logkit_broker.producer(transactional_id="tx", acks=1)
    with pytest.raises(logkit.ConfigError, match="enable_idempotence"):
        logkit_broker.producer(transactional_id="tx", enable_idempotence=False)
    logkit_broker.producer(transactional_id="tx", acks=-1).close()


def test_batches_carry_the_producer_id_and_contiguous_sequences(logkit_broker):
    logkit_broker.create_topic("t", 2)
    producer = logkit_broker.producer(acks="all", batch_size=200)
    for i in range(300):
        producer.send("t", b"value-%03d" % i, partition=i % 2)
    producer.flush()
    assert producer.producer_id >= 0 and producer.producer_epoch == 0
    for number in range(2):
        batches = headers(logkit_broker.topic("t").partition(number))
        assert len(batches) > 1
        assert {(h.producer_id, h.producer_epoch) for h in batches} == \
            {(producer.producer_id, 0)}
        expected = 0
        for h in batches:
            assert h.base_sequence == expected and not h.attributes & 0x10
            expected += h.records_count
        assert expected == 150
    producer.close()


def test_a_producer_that_is_not_idempotent_writes_no_producer_id(logkit_broker):
    logkit_broker.create_topic("t", 1)
    producer = logkit_broker.producer(acks=1)
    producer.send("t", b"v").result(timeout=10)
    [h] = headers(logkit_broker.topic("t").partition(0))
    assert (h.producer_id, h.producer_epoch, h.base_sequence) == (-1, -1, -1)
    producer.close()


def test_split_batches_and_large_values_keep_the_sequence(logkit_broker):
    logkit_broker.create_topic("t", 1, config={"max.message.bytes": 4096})
    producer = logkit_broker.producer(acks="all", batch_size=64 * 1024,
                                      linger_ms=10_000)
    futures = [producer.send("t", b"x" * 300) for _ in range(40)]    # one batch, split
    producer.flush()
    assert [f.result().offset for f in futures] == list(range(40))
    batches = headers(logkit_broker.topic("t").partition(0))
    assert len(batches) > 2
    expected = 0
    for h in batches:
        assert h.base_sequence == expected
        expected += h.records_count
    assert expected == 40
    logkit_broker.create_topic("big", 1)
    for i in range(2):                          # a large value: whole, not in pieces
        producer.send("big", b"y" * 200_000).result(timeout=10)
    assert [(h.producer_id, h.base_sequence) for h in
            headers(logkit_broker.topic("big").partition(0))] == \
        [(producer.producer_id, 0), (producer.producer_id, 1)]
    producer.close()


def test_a_retried_batch_is_stored_once_and_answered_with_its_offset(logkit_broker):
    logkit_broker.create_topic("t", 1)
    partition = logkit_broker.topic("t").partition(0)
    producer = logkit_broker.producer(acks="all")
    producer.send("t", b"first").result(timeout=10)
    producer.send("t", b"second").result(timeout=10)
    stored = bytearray(partition.batches_since(1))        # the second batch, as sent
    end = partition.log_end_offset
    assert partition.append_batch(stored) == 1            # the retry: its first offset
    assert partition.log_end_offset == end
    assert [r.value for r in partition.read(0)] == [b"first", b"second"]
    producer.close()


CHILD = textwrap.dedent("""
    import sys, logkit
    with logkit.Broker(sys.argv[1]) as broker:
        ids = []
        for _ in range(3):
            producer = broker.producer(acks="all")
            producer.send("t", b"v").result(timeout=10)
            ids.append(producer.producer_id)
            producer.close()
        print(" ".join(map(str, ids)))
""")


def test_producer_ids_are_unique_across_processes(tmp_path):
    with logkit.Broker(tmp_path) as broker:
        broker.create_topic("t", 1)
    children = [subprocess.Popen([sys.executable, "-c", CHILD, str(tmp_path)],
                                 stdout=subprocess.PIPE, text=True) for _ in range(3)]
    ids = []
    for child in children:
        out, _ = child.communicate(timeout=60)
        assert child.returncode == 0
        ids += [int(x) for x in out.split()]
    assert len(ids) == 9 and len(set(ids)) == 9


def test_a_batch_refused_as_out_of_sequence_fails_alone_and_the_producer_goes_on(
        logkit_broker):
    logkit_broker.create_topic("t", 1)
    producer = logkit_broker.producer(acks="all")
    producer.send("t", b"first").result(timeout=10)
    first_id = producer.producer_id
    producer._sequences[("t", 0)] += 5          # numbering and log disagree: a gap
    with pytest.raises(logkit.OutOfOrderSequenceError):
        producer.send("t", b"refused").result(timeout=10)
    producer.send("t", b"next").result(timeout=10)    # a new producer id, from 0
    assert producer.producer_id != first_id
    partition = logkit_broker.topic("t").partition(0)
    assert [r.value for r in partition.read(0)] == [b"first", b"next"]
    assert headers(partition)[-1].base_sequence == 0
    producer.close()
