"""Large values are written where they are (issue 16, goal 5's values curve): a record
whose value is at least PARTS_MIN_VALUE_BYTES goes to the log as [head, value, tail] in
one pwritev, never copied into an encoded batch — the same bytes on disk as
encode_batch makes, checked here byte for byte and by the independent parser."""

from __future__ import annotations

import os
import threading

import pytest

import logkit
from logkit import crc as crc_module
from logkit.compression import CODEC_GZIP
from logkit.records import (PARTS_MIN_VALUE_BYTES, decode_batch, encode_batch,
                            encode_batch_parts, read_header)
from tests.helpers.procs import wait_until

BIG = PARTS_MIN_VALUE_BYTES


@pytest.mark.parametrize("key", [None, b"", b"k" * 300])
@pytest.mark.parametrize("size", [BIG, BIG + 1, 1 << 20])
def test_the_pieces_joined_are_the_batch_encode_batch_makes(key, size):
    for timestamp in (1_700_000_000_123, None):
        row = (key, os.urandom(size), None, timestamp)
        pieces = encode_batch_parts(row, now_ms=42)
        assert pieces[1] is row[1]                       # the value itself, not a copy
        assert bytes(b"".join(pieces)) == bytes(encode_batch([row], now_ms=42))


def test_the_pieces_crc_is_right_with_the_other_crc32c_implementation(monkeypatch):
    from logkit import records
    monkeypatch.setattr(records, "crc32c", crc_module.crc32c_crcmod)
    row = (b"k", os.urandom(BIG), None, 7)
    joined = bytearray(b"".join(encode_batch_parts(row)))
    [record] = decode_batch(joined, 0, read_header(joined, 0, len(joined)), "t", 0,
                            verify=True)
    assert record.value == row[1]


@pytest.mark.parametrize("row", [
    (b"k", b"v" * (BIG - 1), None, None),            # small: one copy is cheaper
    (b"k", bytearray(BIG), None, None),              # not bytes: copied as before
    (b"k", b"v" * BIG, [("h", b"1")], None),         # headers: the general encoder
    (b"k", None, None, None),                         # a tombstone
])
def test_other_records_are_encoded_whole(row):
    assert encode_batch_parts(row) is None


def test_a_producer_stores_large_values_readable_by_the_independent_parser(tmp_path):
    from kafka.record.default_records import DefaultRecordBatch
    values = [os.urandom(n) for n in (BIG, 3 * BIG + 5, 1 << 20)]
    with logkit.Broker(str(tmp_path), background=False) as broker:
        broker.create_topic("t", 1, config={"max.message.bytes": 2 << 20})
        with broker.producer(max_request_size=2 << 20) as producer:
            offsets = [producer.send("t", v, key=b"k").result().offset for v in values]
        partition = broker.topic("t").partition(0)
        assert offsets == [0, 1, 2]
        assert [r.value for r in partition.read(0, 10)] == values
        with open(os.path.join(partition.directory, "00000000000000000000.log"),
                  "rb") as f:
            data = f.read()
    position, seen = 0, []
    while position < len(data):
        length = int.from_bytes(data[position + 8:position + 12], "big")
        batch = DefaultRecordBatch(data[position:position + 12 + length])
        assert batch.validate_crc()
        seen += [bytes(r.value) for r in batch]
        position += 12 + length
    assert seen == values


@pytest.mark.parametrize("config", [{"message.timestamp.type": "LogAppendTime"},
                                    {"compression.type": "gzip"}])
def test_pieces_are_joined_when_the_topic_rewrites_batches(tmp_path, config):
    value = os.urandom(BIG)
    with logkit.Broker(str(tmp_path), background=False) as broker:
        partition = broker.create_topic("t", 1, config=config).partition(0)
        pieces = encode_batch_parts((None, value, None, 5))
        partition.append_batch_nowait(pieces, verify=True)
        partition.append_batch_nowait(encode_batch_parts((None, value, None, 5)),
                                      verify=False)
        records = partition.read(0, 10)
        assert [r.value for r in records] == [value, value]
        if "message.timestamp.type" in config:
            assert all(r.timestamp != 5 for r in records)
        else:                                   # recompressed, not written as given
            assert [h.codec for h in partition.batch_headers(0)] == [CODEC_GZIP] * 2


def test_a_batch_in_pieces_whose_length_field_lies_is_refused(tmp_path):
    with logkit.Broker(str(tmp_path), background=False) as broker:
        partition = broker.create_topic("t", 1).partition(0)
        pieces = encode_batch_parts((None, os.urandom(BIG), None, 5))
        pieces[2] = pieces[2] + b"\x00"                  # one byte more than it says
        with pytest.raises(logkit.CorruptRecordError):
            partition.append_batch_nowait(pieces, verify=False)
        assert partition.log_end_offset == 0


def test_a_batch_sealed_by_send_does_not_wake_the_sender_thread(tmp_path):
    """A record that fills its batch is appended by the sending thread itself; waking
    the idle sender thread as well only made the two fight over the GIL (values of
    100 KiB: 0.17x -> 0.28x os.write)."""
    with logkit.Broker(str(tmp_path), background=False) as broker:
        broker.create_topic("t", 1, config={"max.message.bytes": 1 << 20})
        with broker.producer(max_request_size=1 << 20) as producer:
            accumulator = producer._accumulator
            producer.send("t", b"warm").result()
            wakes = []
            real = accumulator.wake.notify

            def counted(*args):
                wakes.append(threading.current_thread().name)
                return real(*args)

            accumulator.wake.notify = counted
            # the sender must be idle first, or no wake would be sent either way
            wait_until(lambda: accumulator.sender_idle, 10, "the sender thread idle")
            # "warm"'s result() took the batch its wake-up was for, which stops the
            # wake-ups (accumulator.callers_take): turn them back on, or neither send
            # below could wake the sender thread and the first check would prove nothing
            accumulator.callers_take = False
            producer.send("t", os.urandom(BIG)).result()
            assert wakes == []
            producer.send("t", b"small").result()    # a batch left open: it is woken
            assert wakes == ["MainThread"]
            accumulator.wake.notify = real


def test_append_batch_takes_pieces_too_and_refuses_a_short_head(tmp_path):
    """`Partition.append_batch` (which waits for any sync) accepts the same pieces as
    `append_batch_nowait`; pieces whose first buffer cannot hold the header are joined
    and checked like any batch."""
    value = os.urandom(BIG)
    with logkit.Broker(str(tmp_path), background=False) as broker:
        partition = broker.create_topic("t", 1).partition(0)
        assert partition.append_batch(encode_batch_parts((b"k", value, None, 5))) == 0
        head, rest, tail = encode_batch_parts((b"k", value, None, 5))
        assert partition.append_batch([bytes(head[:10]), bytes(head[10:]), rest, tail]) == 1
        with pytest.raises(logkit.CorruptRecordError):
            partition.append_batch([bytearray(b"\x00" * 10)])
        assert [r.value for r in partition.read(0, 10)] == [value, value]
