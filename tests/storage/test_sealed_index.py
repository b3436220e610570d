"""A sealed offset index is trusted as Kafka trusts it — sized and its first entry
checked when opened, not walked — and every entry a read uses is checked against the
log where it is used, so a flipped byte anywhere in a sealed `.index` costs a longer
scan, never a wrong record, an error on good data, or a skipped offset."""

from __future__ import annotations

import os
import random
import struct

import pytest

import logkit
from logkit.index import OffsetIndex

SEGMENT_BYTES = 4096


def _fill(root, batches=250, per_batch=3):
    """A partition of many sealed segments, every batch indexed; its values by offset."""
    values = []
    with logkit.Broker(root) as broker:
        p = broker.create_topic("t", 1, config={"segment.bytes": SEGMENT_BYTES,
                                                 "index.interval.bytes": 0}).partition(0)
        for b in range(batches):
            chunk = [b"v-%d-%d" % (b, i) for i in range(per_batch)]
            p.append([(None, v, None, None) for v in chunk])
            values.extend(chunk)
    return values


def _sealed_indexes(directory):
    names = sorted(n for n in os.listdir(directory) if n.endswith(".index"))
    return [os.path.join(directory, n) for n in names[:-1]]      # the last is active


def _check_every_offset(root, values):
    with logkit.Broker(root) as broker:
        p = broker.topic("t").partition(0)
        offsets = list(range(len(values)))
        random.Random(7).shuffle(offsets)              # a random reader: index lookups
        for offset in offsets:
            [record] = p.read(offset, max_records=1)
            assert (record.offset, record.value) == (offset, values[offset])
        got = []
        offset = 0
        while offset < len(values):                    # and a sequential one
            records = p.read(offset, max_records=50)
            got.extend(r.value for r in records)
            offset = records[-1].offset + 1
        assert got == values


@pytest.mark.parametrize("where", ["first-offset", "first-position", "middle-offset",
                                   "middle-position", "last-offset", "last-position",
                                   "swap", "random", "shifted"])
def test_a_flipped_byte_in_a_sealed_index_never_changes_what_is_read(tmp_path, where):
    values = _fill(tmp_path)
    directory = tmp_path / "t-0"
    sealed = _sealed_indexes(directory)
    assert len(sealed) >= 3
    rng = random.Random(where)
    for path in sealed:
        with open(path, "r+b") as f:
            data = bytearray(f.read())
            n = len(data) // 8
            assert n >= 3
            entry = {"first": 0, "middle": n // 2, "last": n - 1}
            if where == "swap":                         # two entries out of order
                a, b = 8 * 1, 8 * (n - 2)
                data[a:a + 8], data[b:b + 8] = data[b:b + 8], data[a:a + 8]
            elif where == "shifted":                    # in order, one byte off a batch
                at = 8 * (n - 1) + 4
                position = struct.unpack_from(">i", data, at)[0]
                struct.pack_into(">i", data, at, position + 1)
            elif where == "random":
                for _ in range(3):
                    data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
            else:
                name, field = where.split("-")
                at = 8 * entry[name] + (0 if field == "offset" else 4)
                data[at + rng.randrange(4)] ^= 1 << rng.randrange(8)
            f.seek(0)
            f.write(data)
    _check_every_offset(tmp_path, values)


def test_opening_a_sealed_offset_index_reads_a_constant_number_of_entries(tmp_path,
                                                                          monkeypatch):
    path = str(tmp_path / "x.index")
    index = OffsetIndex(path, 0, writable=True, entries=0, create_bytes=80000)
    for n in range(1, 10001):
        index.append(n, n * 100)
    index.close()

    class Counting:
        """OffsetIndex's entry Struct, counting unpack_from calls."""
        def __init__(self, inner):
            self.inner, self.size, self.calls = inner, inner.size, 0

        def unpack_from(self, *args):
            self.calls += 1
            return self.inner.unpack_from(*args)

        def pack_into(self, *args):
            return self.inner.pack_into(*args)

    counting = Counting(struct.Struct(">ii"))
    monkeypatch.setattr(OffsetIndex, "ENTRY", counting)
    sealed = OffsetIndex(path, 0, writable=False)
    assert sealed.entries == 10000
    assert counting.calls <= 2                         # not one per entry
    assert sealed.lookup(5000) == 500000               # a lookup is a binary search
    assert counting.calls <= 2 + 20
    sealed.close()
