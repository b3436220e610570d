"""Column decoding (the Spark reader's fast path) gives exactly the records the record
decoder gives, compiled or pure Python, and refuses corrupt batches."""

from __future__ import annotations

import random
import struct

import pytest

import logkit
import logkit.columns as columns_module
from logkit import CorruptRecordError
from logkit.columns import Columns
from logkit.records import encode_batch, read_header


def unpack(cols: Columns) -> list[tuple]:
    """(offset, timestamp, key, value) rows back out of the buffers."""
    n = cols.count
    offsets = struct.unpack(f"={n}q", cols.offsets)
    stamps = struct.unpack(f"={n}q", cols.timestamps)
    key_ends = struct.unpack(f"={n + 1}i", cols.key_ends)
    value_ends = struct.unpack(f"={n + 1}i", cols.value_ends)
    rows = []
    for i in range(n):
        key = None if cols.nulls[i] & 1 else bytes(cols.keys[key_ends[i]:key_ends[i + 1]])
        value = None if cols.nulls[i] & 2 else \
            bytes(cols.values[value_ends[i]:value_ends[i + 1]])
        rows.append((offsets[i], stamps[i], key, value))
    return rows


@pytest.fixture(params=["compiled", "pure"])
def implementation(request, monkeypatch):
    if request.param == "pure":
        monkeypatch.setattr(columns_module, "_speedups", None)
    elif columns_module._speedups is None:
        pytest.skip("the C accelerator is not built on this machine")
    return request.param


def test_columns_match_records_across_segments_codecs_and_ranges(tmp_path, implementation):
    """Random keys/values/nulls/headers/codecs: every range decodes to the same rows."""
    rng = random.Random(5)
    with logkit.Broker(tmp_path) as broker:
        p = broker.create_topic("t", 1, config={"segment.bytes": 4096}).partition(0)
        for n in range(150):
            p.append([(None if rng.random() < 0.2 else b"k%d" % i,
                       None if rng.random() < 0.1 else b"v" * rng.randint(0, 60),
                       [("h", b"x")] if i % 3 == 0 else None, 1000 + n + i)
                      for i in range(rng.randint(1, 9))],
                     compression_type=rng.choice([None, "gzip", "lz4", "zstd"]))
        end = p.log_end_offset
        records = p.read(0, max_records=10**6)
        for start, stop in [(0, end), (7, end - 5), (40, 41), (end, end)]:
            cols = Columns()
            nxt = start
            while nxt < stop:
                nxt = p._log.read_columns(nxt, cols, stop_offset=stop, max_records=50)
            assert unpack(cols) == [(r.offset, r.timestamp, r.key, r.value)
                                    for r in records if start <= r.offset < stop]


def test_corrupt_batch_raises(implementation):
    """A flipped byte raises CorruptRecordError; nothing garbage is appended."""
    batch = bytearray(encode_batch([(b"k", b"value", None, 1)] * 5))
    batch[70] ^= 0x20
    cols = Columns()
    with pytest.raises(CorruptRecordError):
        cols.add_batch(bytes(batch), 0, read_header(batch, 0, len(batch)), min_offset=0,
                       stop_offset=10, path="x.log")
    assert cols.count == 0
