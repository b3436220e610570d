"""The cleaner's fast path (cleaner.OffsetMap, _speedups.map_put / map_get /
clean_records and their pure-Python twins): the twins agree byte for byte, the filter
keeps what `keep_records` keeps, the map's memory stays within the dedupe buffer, and a
full map stops a pass at a batch boundary."""

from __future__ import annotations

import random
import tracemalloc

import pytest

import logkit
from logkit import cleaner
from logkit import records as rec
from logkit.cleaner import OffsetMap, keep_records, murmur3_128

try:
    from logkit import _speedups
except ImportError:                                   # pragma: no cover - no compiler
    _speedups = None

needs_c = pytest.mark.skipif(_speedups is None, reason="the C accelerator was not built")
NOW = 1_700_000_000_000


def test_murmur3_128_matches_the_published_vectors():
    assert murmur3_128(b"") == bytes(16)
    assert murmur3_128(b"The quick brown fox jumps over the lazy dog").hex() == \
        "6c1b07bc7bbc4be347939ac4a93c437a"


@needs_c
def test_murmur3_128_twins_agree():
    rng = random.Random(3)
    for n in list(range(40)) + [100, 1000]:
        data = rng.randbytes(n)
        assert _speedups.murmur3_128(data) == murmur3_128(data)


def _batches(rng: random.Random, count: int, keys: int) -> list[tuple[bytearray, rec.BatchHeader]]:
    out = []
    offset = 0
    for _ in range(count):
        rows = []
        for _ in range(rng.randrange(1, 40)):
            k = rng.randrange(keys)
            key = None if rng.random() < 0.05 else (
                b"k%d" % k if k % 2 else b"a-long-key-over-sixteen-bytes-%d" % k)
            value = None if rng.random() < 0.15 else rng.randbytes(rng.randrange(30))
            headers = [("h", b"x")] if rng.random() < 0.2 else None
            rows.append((key, value, headers, NOW + rng.randrange(-5000, 5000)))
        batch = rec.encode_batch(rows, base_offset=offset, now_ms=NOW)
        header = rec.read_header(batch, 0, len(batch))
        out.append((batch, header))
        offset = header.last_offset + 1
    return out


def _twins():
    pure = (cleaner._map_put_py, cleaner._map_get_py, cleaner._clean_records_py)
    if _speedups is None:
        return [pure]
    return [pure, (_speedups.map_put, _speedups.map_get, _speedups.clean_records)]


@pytest.mark.parametrize("twin", range(2))
def test_the_filter_keeps_what_keep_records_keeps(twin):
    if twin >= len(_twins()):
        pytest.skip("the C accelerator was not built")
    put, get, clean = _twins()[twin]
    rng = random.Random(11 + twin)
    batches = _batches(rng, 60, 50)
    reference = OffsetMap(1 << 20)
    slots = reference.slots
    table = bytearray(slots * cleaner.ENTRY_BYTES)
    size = 0
    map_end = batches[40][1].base_offset               # the map stops short of the end
    for batch, header in batches[:40]:
        reference.put_all(rec.decode_batch(batch, 0, header, "t", 0))
        size = put(batch, rec.RECORDS_OFFSET, len(batch), header.records_count,
                   header.base_offset, 0, table, slots, size)
    assert bytes(table) == bytes(reference._table) and size == len(reference)
    for key in [b"k1", b"k3", b"a-long-key-over-sixteen-bytes-2", b"absent"]:
        assert get(table, slots, key) == reference.latest(key)
    for batch, header in batches:
        records = rec.decode_batch(batch, 0, header, "t", 0)
        for drop in (False, True):
            want = keep_records(records, reference, map_end, now_ms=1,
                                horizon_ms=0 if drop else None)
            section, kept, tombstone, max_delta = clean(
                batch, rec.RECORDS_OFFSET, len(batch), header.records_count,
                header.base_offset, table, slots, map_end, drop, None)
            assert kept == len(want)
            assert tombstone == any(r.value is None for r in want)
            rebuilt = rec.rebuild_batch_section(
                header, section, kept, header.max_timestamp if max_delta is None
                else header.base_timestamp + max_delta)
            got = rec.decode_batch(rebuilt, 0, rec.read_header(rebuilt, 0, len(rebuilt)),
                                   "t", 0)
            assert [tuple(r) for r in got] == [tuple(r) for r in want]
            if want:
                assert rec.read_header(rebuilt, 0, len(rebuilt)).max_timestamp == \
                    max(r.timestamp for r in want)
            # a delete horizon restamps each kept record's delta; timestamps stay
            horizon = NOW + 86_400_000
            section, kept, tombstone, _ = clean(
                batch, rec.RECORDS_OFFSET, len(batch), header.records_count,
                header.base_offset, table, slots, map_end, drop,
                header.base_timestamp - horizon)
            if tombstone:
                stamped = rec.rebuild_batch_section(header, section, kept, 0,
                                                    delete_horizon_ms=horizon)
                stamped_header = rec.read_header(stamped, 0, len(stamped))
                assert stamped_header.base_timestamp == horizon
                got = rec.decode_batch(stamped, 0, stamped_header, "t", 0)
                assert [tuple(r) for r in got] == [tuple(r) for r in want]


@needs_c
def test_the_twins_write_the_same_table_and_bytes():
    rng = random.Random(5)
    batches = _batches(rng, 80, 300)
    slots = 1000
    tables = [bytearray(slots * cleaner.ENTRY_BYTES) for _ in range(2)]
    sizes = [0, 0]
    for batch, header in batches:
        for i, put in enumerate((cleaner._map_put_py, _speedups.map_put)):
            sizes[i] = put(batch, rec.RECORDS_OFFSET, len(batch), header.records_count,
                           header.base_offset, header.base_offset + 3, tables[i], slots,
                           sizes[i])
    assert tables[0] == tables[1] and sizes[0] == sizes[1]
    map_end = batches[60][1].base_offset
    for batch, header in batches:
        for drop in (False, True):
            for shift in (None, 0, -86_400_000):
                args = (batch, rec.RECORDS_OFFSET, len(batch), header.records_count,
                        header.base_offset, tables[0], slots, map_end, drop, shift)
                assert cleaner._clean_records_py(*args) == _speedups.clean_records(*args)


def test_the_map_memory_stays_within_the_dedupe_buffer():
    buffer = 1 << 16                                  # 2457 keys: fewer than the data's
    rows = [(b"a-key-longer-than-sixteen-%06d" % i if i % 2 else b"k%06d" % i, b"v", None,
             NOW) for i in range(4000)]
    batches = [rec.encode_batch(rows[i:i + 100], base_offset=i, now_ms=NOW)
               for i in range(0, len(rows), 100)]
    tracemalloc.start()
    try:
        offset_map = OffsetMap(buffer)
        for batch in batches:
            header = rec.read_header(batch, 0, len(batch))
            if header.records_count > offset_map.room():
                break
            offset_map.put_section(batch, rec.RECORDS_OFFSET, len(batch),
                                   header.records_count, header.base_offset, 0)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert offset_map.memory_bytes <= buffer
    assert len(offset_map) == offset_map.capacity // 100 * 100
    assert offset_map.latest(b"k000000") == 0
    assert offset_map.latest(b"a-key-longer-than-sixteen-000001") == 1
    assert peak <= buffer + 16 * 1024, f"the map took {peak} bytes for a {buffer}-byte buffer"


def test_a_full_map_stops_the_pass_at_a_batch_boundary(tmp_path):
    broker = logkit.Broker(str(tmp_path / "root"), config={
        "log.cleaner.enable": False, "log.cleaner.dedupe.buffer.size": 1 << 16})
    try:
        broker.create_topic("t", 1, config={"cleanup.policy": "compact",
                                            "segment.bytes": 16384})
        p = broker.topic("t").partition(0)
        for start in range(0, 4000, 100):                # 4000 distinct keys, 40 batches
            p.append([(b"key-%05d" % i, b"v%d" % i, [], NOW) for i in range(start,
                                                                           start + 100)])
        p.append([(b"key-00000", b"last", [], NOW)])
        p.roll()
        capacity = int((1 << 16) // 24 * 0.9)            # 2457 keys: not all 4000
        report = p.compact(now_ms=NOW)
        assert report.first_dirty_offset % 100 == 0       # a batch's end
        assert 0 < report.first_dirty_offset <= capacity
        passes = 1
        end = p.segment_base_offsets()[-1]
        while p.first_dirty_offset < end and passes < 10:
            p.compact(now_ms=NOW)
            passes += 1
        assert p.first_dirty_offset == end and passes >= 2
        got = {r.key: (r.offset, r.value) for r in p.read(0, max_records=10_000)}
        assert len(got) == 4000 and got[b"key-00000"] == (4000, b"last")
        assert got[b"key-03999"] == (3999, b"v3999")
    finally:
        broker.close()
