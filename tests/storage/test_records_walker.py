"""records.py owns every batch byte: the one batch walker (`iter_batches`) and its one
way of reporting bad bytes, the header-rewrite helpers (checked with kafka-python's
independent decoder) and the per-record size estimate."""

from __future__ import annotations

import random

import pytest

from logkit.errors import CorruptRecordError
from logkit.records import (CRC_OFFSET, LOG_OVERHEAD, PARTITION_LEADER_EPOCH_OFFSET,
                            RECORDS_OFFSET, check_batch, encode_batch, iter_batches,
                            read_header, record_size_estimate, stamp_base_offset,
                            stamp_leader_epoch, stamp_log_append_time, stamp_producer)

kafka_records = pytest.importorskip("kafka.record.memory_records",
                                    reason="kafka-python is a test dependency")
from kafka.record.memory_records import MemoryRecords  # noqa: E402

NOW = 1_700_000_000_000


def chain(counts, base=0):
    """Batches of `counts` records each, stamped with contiguous offsets from `base`,
    concatenated; also each batch's start position."""
    data = bytearray()
    starts = []
    offset = base
    for n, count in enumerate(counts):
        batch = encode_batch([(b"k", b"v%d-%d" % (n, i), None, NOW + i)
                              for i in range(count)], now_ms=NOW)
        stamp_base_offset(batch, offset)
        starts.append(len(data))
        data += batch
        offset += count
    return data, starts


def kafka_python_batches(data):
    records = MemoryRecords(bytes(data))
    out = []
    while records.has_next():
        batch = records.next_batch()
        assert batch.validate_crc(), "kafka-python says the CRC is wrong"
        out.append(batch)
    return out


def test_walker_yields_every_batch_with_its_position():
    """Positions and headers of every batch, offsets chained from first_offset."""
    data, starts = chain([3, 1, 5], base=40)
    walked = list(iter_batches(data, 0, len(data), "mem", first_offset=40, verify=True))
    assert [pos for pos, _ in walked] == starts
    assert [(h.base_offset, h.last_offset) for _, h in walked] == [(40, 42), (43, 43),
                                                                   (44, 48)]
    assert list(iter_batches(data, starts[1], len(data))) == walked[1:]


def test_walker_reports_a_torn_end_at_the_torn_batch():
    """A batch cut short (or a header cut short) raises at its own start position,
    after every whole batch before it was yielded."""
    data, starts = chain([2, 2, 2])
    for cut in (len(data) - 1, starts[2] + 10):
        seen = []
        with pytest.raises(CorruptRecordError) as info:
            for pos, _ in iter_batches(data, 0, cut, "mem"):
                seen.append(pos)
        assert seen == starts[:2]
        assert info.value.position == starts[2] and info.value.path == "mem"


def test_walker_reports_offsets_out_of_sequence():
    """The first batch must start at first_offset; each next one must follow."""
    data, starts = chain([2, 2])
    with pytest.raises(CorruptRecordError) as info:
        list(iter_batches(data, 0, len(data), first_offset=1))
    assert info.value.position == 0 and info.value.expected == 1
    gap = bytearray(data)
    gap[starts[1]:starts[1] + 8] = (7).to_bytes(8, "big")
    with pytest.raises(CorruptRecordError) as info:
        list(iter_batches(gap, 0, len(gap)))
    assert info.value.position == starts[1]
    assert (info.value.expected, info.value.actual) == (2, 7)


def test_walker_checks_crcs_only_when_asked_and_bounds_batch_size():
    """A flipped byte in a body passes the header walk, fails verify=True at that
    batch; a batch above max_batch_bytes raises at its position."""
    data, starts = chain([2, 2])
    data[starts[1] + RECORDS_OFFSET + 2] ^= 0xFF
    assert len(list(iter_batches(data, 0, len(data)))) == 2
    with pytest.raises(CorruptRecordError, match="CRC") as info:
        list(iter_batches(data, 0, len(data), verify=True))
    assert info.value.position == starts[1]
    with pytest.raises(CorruptRecordError) as info:
        list(iter_batches(data, 0, len(data), max_batch_bytes=starts[1] - 1))
    assert info.value.position == 0


def test_stamp_producer_recomputes_the_crc_and_kafka_python_reads_it():
    """Producer id, epoch and base sequence land where Kafka reads them; CRC valid."""
    batch = encode_batch([(None, b"a", None, NOW), (None, b"b", None, NOW)], now_ms=NOW)
    stamp_producer(batch, 123456789, 7, 4000)
    check_batch(batch, 0, read_header(batch, 0, len(batch)))
    [parsed] = kafka_python_batches(batch)
    assert (parsed.producer_id, parsed.producer_epoch, parsed.base_sequence) == \
        (123456789, 7, 4000)


def test_stamp_log_append_time_sets_every_record_timestamp():
    """LogAppendTime: the timestamp type bit, every record at the stamped time."""
    batch = encode_batch([(None, b"a", None, NOW), (None, b"b", None, NOW + 9)], now_ms=NOW)
    stamp_log_append_time(batch, NOW + 5000)
    [parsed] = kafka_python_batches(batch)
    assert parsed.timestamp_type == 1
    assert [r.timestamp for r in parsed] == [NOW + 5000, NOW + 5000]


def test_header_stamps_work_inside_a_buffer_of_batches():
    """`pos` addresses one batch of several; the others are untouched and valid."""
    data, starts = chain([2, 3, 1])
    before = bytes(data)
    stamp_producer(data, 5, 1, 0, pos=starts[1])
    stamp_leader_epoch(data, 9, pos=starts[2])
    walked = list(iter_batches(data, 0, len(data), verify=True))
    assert walked[1][1].producer_id == 5 and walked[2][1].leader_epoch == 9
    assert data[:starts[1]] == before[:starts[1]]
    # the leader epoch is outside the CRC: the stored CRC did not change
    assert data[starts[2] + CRC_OFFSET:starts[2] + CRC_OFFSET + 4] == \
        before[starts[2] + CRC_OFFSET:starts[2] + CRC_OFFSET + 4]
    assert data[starts[2] + PARTITION_LEADER_EPOCH_OFFSET:][:4] == (9).to_bytes(4, "big")


def test_record_size_estimate_is_not_below_the_encoded_size():
    """Batch sizing errs high: the estimates of a batch's records cover its records
    section, for keys and values up to 100 kB, headers, and timestamps spread over an
    hour."""
    rng = random.Random(5)
    for _ in range(50):
        rows = []
        for _ in range(rng.randrange(1, 200)):
            key = None if rng.random() < 0.2 else rng.randbytes(rng.choice([0, 10, 300]))
            value = rng.randbytes(rng.choice([0, 100, 5000, 100_000]))
            headers = [("trace", rng.randbytes(8)), ("é", None)] if rng.random() < 0.3 \
                else None
            rows.append((key, value, headers, NOW + rng.randrange(-3_600_000, 3_600_000)))
        batch = encode_batch(rows, now_ms=NOW)
        records_bytes = len(batch) - RECORDS_OFFSET
        assert sum(record_size_estimate(k, v, h) for k, v, h, _ in rows) >= records_bytes
        assert len(batch) - LOG_OVERHEAD == read_header(batch, 0, len(batch)).batch_length
