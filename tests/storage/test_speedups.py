"""The compiled accelerator (logkit/_speedups.c) agrees with the pure-Python code on
the same inputs: encoded bytes, decoded records, malformed input, and murmur2."""

from __future__ import annotations

import os
import random
import struct

import pytest

from logkit import records as rec
from logkit.errors import CorruptRecordError
from logkit.murmur2 import murmur2_py

speedups = pytest.importorskip("logkit._speedups",
                               reason="the C accelerator was not built on this machine")

NOW = 1_700_000_000_000


def random_records(rng: random.Random, count: int) -> list:
    rows = []
    for i in range(count):
        key = None if rng.random() < 0.1 else rng.randbytes(rng.choice([0, 1, 10, 200]))
        value = None if rng.random() < 0.05 else rng.randbytes(rng.choice([0, 5, 100, 3000]))
        headers = None
        if rng.random() < 0.3:
            headers = [(rng.choice(["h", "trace-id", "ünïcode", ""]),
                        None if rng.random() < 0.2 else rng.randbytes(rng.randrange(20)))
                       for _ in range(rng.randrange(4))]
        ts = None if rng.random() < 0.1 else NOW + rng.randrange(-20_000, 20_000)
        rows.append((key, value, headers, ts))
    return rows


def compiled_decoder(buf, pos, end, header, topic, partition, min_offset):
    """records._decode_records_c, bound to the module even when LOGKIT_PURE_PYTHON is set."""
    append_time = header.max_timestamp if header.attributes & rec.ATTR_TIMESTAMP_TYPE else None
    return speedups.decode_records(buf, pos, end, header.records_count, header.base_offset,
                                   header.base_timestamp, append_time, topic, partition,
                                   min_offset, rec.Record)


def both_decoders(batch, header, min_offset=0):
    """(python result, compiled result); each a list of records or the exception type."""
    out = []
    for decoder in (rec._decode_records_py, compiled_decoder):
        saved = rec._decode_records
        rec._decode_records = decoder
        try:
            out.append(rec.decode_batch(batch, 0, header, "t", 1, min_offset=min_offset,
                                        verify=False))
        except CorruptRecordError:
            out.append(CorruptRecordError)
        finally:
            rec._decode_records = saved
    return out


@pytest.mark.parametrize("seed", range(8))
def test_encode_records_matches_python(seed):
    """Same records in, same bytes out: nulls, headers, negative and large timestamp
    deltas, None timestamps."""
    rng = random.Random(seed)
    rows = random_records(rng, rng.choice([1, 2, 50, 300]))
    assert speedups.encode_records(rows, NOW) == rec._encode_records_py(rows, NOW)


def test_encode_handles_many_records_and_list_rows():
    """Offset deltas past the small-varint table, and rows given as lists."""
    rows = [[b"k", b"v" * 3, None, NOW + i] for i in range(9000)]
    assert speedups.encode_records(rows, NOW) == rec._encode_records_py(rows, NOW)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("headers", [False, True])
def test_encode_records_with_room_matches_python(seed, headers):
    """With room for the header (encode_batch's call): a bytearray of that many zero
    bytes, then the same section as without it, from the one-copy loop (rows of bytes
    or None, no headers) and from the general loop (a row with headers, a bytearray
    value or a list row anywhere sends the whole batch there)."""
    rng = random.Random(300 + seed)
    rows = [(key, value, None, ts) for key, value, _, ts in
            random_records(rng, rng.choice([1, 2, 70, 400]))]
    if headers:
        odd = rng.randrange(len(rows))
        rows[odd] = rng.choice([(b"k", b"v", [("h", b"x")], None), (b"k", bytearray(b"v"),
                                None, NOW), [b"k", b"v", None, NOW - 5]])
    for room in (0, 1, rec.RECORDS_OFFSET):
        got, base, top = speedups.encode_records(rows, NOW, room)
        want, want_base, want_top = rec._encode_records_py(rows, NOW, room)
        assert type(got) is type(want) is bytearray
        assert (got, base, top) == (want, want_base, want_top)
        assert bytes(got[:room]) == bytes(room)
        assert bytes(got[room:]) == speedups.encode_records(rows, NOW)[0]


def test_encode_with_room_takes_timestamps_the_one_copy_loop_cannot():
    """A timestamp past 64 bits or of another type goes to the general loop, which
    raises what the Python encoder raises; a bool key is refused like any non-bytes."""
    for bad in ([(b"k", b"v", None, 2**70)], [(b"k", b"v", None, 1.5)],
                [(True, b"v", None, None)]):
        with pytest.raises((TypeError, OverflowError)):
            speedups.encode_records(bad, NOW, rec.RECORDS_OFFSET)
        with pytest.raises((TypeError, OverflowError, struct.error)):
            rec.encode_batch(bad, now_ms=NOW)


def test_encode_rejects_what_python_rejects():
    """Bad rows raise in both implementations."""
    for bad in ([(b"k", b"v", None)], [(b"k", "not bytes", None, None)],
                [(b"k", b"v", [("h",)], None)]):
        with pytest.raises((TypeError, ValueError)):
            speedups.encode_records(bad, NOW)
        with pytest.raises((TypeError, ValueError, IndexError)):
            rec._encode_records_py(bad, NOW)


@pytest.mark.parametrize("seed", range(8))
def test_decode_records_matches_python(seed):
    """Same batch in, same records out, also from a min_offset inside the batch."""
    rng = random.Random(100 + seed)
    rows = random_records(rng, rng.choice([1, 3, 80, 400]))
    batch = rec.encode_batch(rows, base_offset=12345, now_ms=NOW)
    header = rec.read_header(batch, 0, len(batch))
    python, compiled = both_decoders(batch, header)
    assert python == compiled
    assert [r.value for r in compiled] == [r[1] for r in rows]
    python, compiled = both_decoders(batch, header, min_offset=12345 + len(rows) // 2)
    assert python == compiled


def test_decode_log_append_time():
    """With the LogAppendTime attribute every record takes the batch's max timestamp."""
    batch = rec.encode_batch([(b"a", b"b", None, NOW), (None, None, None, NOW + 5)],
                             log_append_time=True, now_ms=NOW + 99)
    header = rec.read_header(batch, 0, len(batch))
    python, compiled = both_decoders(batch, header)
    assert python == compiled
    assert {r.timestamp for r in compiled} == {NOW + 99}


def test_decode_corrupted_bodies_agree():
    """Random byte flips in the records section: both raise, or both return the same
    records (a flip inside a value is invisible without the CRC)."""
    rng = random.Random(7)
    rows = random_records(rng, 40)
    clean = rec.encode_batch(rows, now_ms=NOW)
    for _ in range(400):
        batch = bytearray(clean)
        for _ in range(rng.randrange(1, 4)):
            pos = rng.randrange(rec.RECORDS_OFFSET, len(batch))
            batch[pos] = rng.randrange(256)
        header = rec.read_header(batch, 0, len(batch))
        python, compiled = both_decoders(batch, header)
        assert python == compiled


def test_murmur2_matches_python_and_kafka_vectors():
    """Kafka's published vectors and random inputs of every tail length."""
    assert speedups.murmur2(b"21") == -973932308
    assert speedups.murmur2(b"foobar") == -790332482
    assert speedups.murmur2(b"abc") == 479470107
    rng = random.Random(3)
    for length in range(0, 70):
        data = rng.randbytes(length)
        assert speedups.murmur2(data) == murmur2_py(data)


def test_speedups_are_in_use():
    """When built, the package uses them (LOGKIT_PURE_PYTHON unset in the test run)."""
    if os.environ.get("LOGKIT_PURE_PYTHON"):
        pytest.skip("pure Python forced")
    assert rec.SPEEDUPS
    assert rec._encode_records is speedups.encode_records


def test_pure_python_switch_is_read_once_by_native_for_every_twin():
    """LOGKIT_PURE_PYTHON=1 makes `_native` choose pure Python for every module with a
    compiled twin (records, columns, murmur2, the producer's send path)."""
    import subprocess
    import sys
    code = ("import sys, logkit, logkit.columns as c, logkit.records as r, logkit._native as n;"
            "m = sys.modules['logkit.murmur2'];"
            "print(r.SPEEDUPS, c._speedups is None, n.sendpath is None,"
            " m.murmur2 is m.murmur2_py, r._encode_records is r._encode_records_py)")
    env = {k: v for k, v in os.environ.items() if k != "LOGKIT_PURE_PYTHON"}
    forced = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            env={**env, "LOGKIT_PURE_PYTHON": "1"}, check=True)
    assert forced.stdout.split() == ["False", "True", "True", "True", "True"]
    default = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             env=env, check=True)
    assert default.stdout.split()[:2] == ["True", "False"]        # built: compiled codec


def _stored_log(tmp_path, seed):
    """A partition holding every kind of batch a read walks: plain, with headers,
    compressed, LogAppendTime-stamped, control, one-record and many-record."""
    import logkit
    rng = random.Random(seed)
    broker = logkit.Broker(tmp_path / f"walk{seed}", background=False)
    partition = broker.create_topic("t", 1).partition(0)
    for n in range(40):
        kind = rng.choice(["plain", "plain", "headers", "gzip", "append", "control"])
        rows = [(rng.choice([None, b"k%d" % n]), rng.randbytes(rng.choice([0, 3, 90])),
                 [("h", b"x")] if kind == "headers" else None,
                 None if rng.random() < 0.5 else NOW + n) for _ in range(rng.choice([1, 1, 4, 30]))]
        if kind == "gzip":
            partition.append(rows, compression_type="gzip")
        elif kind in ("append", "control"):
            partition.append_batch(rec.encode_batch(rows, log_append_time=kind == "append",
                                                    control=kind == "control"))
        else:
            partition.append(rows)
    return broker, partition


def _read_or_error(partition, offset, max_records, max_bytes, stop):
    try:
        return partition.fetch(offset, max_records, max_bytes=max_bytes) if stop is None \
            else (partition.read(offset, max_records, max_bytes=max_bytes,
                                 stop_offset=stop), None)
    except CorruptRecordError as exc:
        return ("error", exc.position, str(exc))


@pytest.mark.parametrize("seed", range(4))
def test_reads_walked_in_c_match_the_python_walk(tmp_path, monkeypatch, seed):
    """Every read (offsets inside batches, record and byte limits, stop offsets, reads
    that follow the cursor and reads that seek) returns the same records through the
    compiled walk as through the Python walk; over a log with a flipped byte both
    raise the same error at the same position, or return the same records."""
    rng = random.Random(seed)
    broker, partition = _stored_log(tmp_path, seed)
    end = partition.high_watermark
    plan = [(rng.randrange(end), rng.choice([1, 3, 500]), rng.choice([1, 200, 1 << 20]),
             rng.choice([None, None, rng.randrange(end + 1)])) for _ in range(60)]
    plan += [(o, 1, 1 << 20, None) for o in range(end)]          # cursor-following
    walked = []
    handled = []
    real_walk = speedups.walk_batches       # the compiled walk, even under LOGKIT_PURE_PYTHON

    def counted(*args):
        got = real_walk(*args)
        handled.append(got is not NotImplemented)
        return got
    for walk in (counted, None):
        monkeypatch.setattr(rec, "_walk", walk)
        walked.append([_read_or_error(partition, *step) for step in plan])
    assert walked[0] == walked[1]
    assert sum(handled) > len(plan) // 2 and not all(handled)   # both walks were used
    path = os.path.join(partition.directory, "00000000000000000000.log")
    data = bytearray(open(path, "rb").read())
    stored = [(data.find(r.value), r.offset) for r in partition.read(0, end)
              if len(r.value) == 90]
    inside = [(at + 45, offset) for at, offset in stored if at >= 0][:4]  # a value's byte
    assert inside
    for _, offset in inside[:2]:        # the magic and baseOffset of the next batch
        _, at, length = partition.batch_file_ranges(offset, max_bytes=1)[0]
        inside += [(at + length + 16, offset), (at + length + 7, offset)]
    for flip, offset in [(at, 0) for at in rng.sample(range(len(data)), 6)] + inside:
        broken = bytearray(data)
        broken[flip] ^= 0x40
        with open(path, "r+b") as f:
            f.write(broken)
        outcomes = []
        for walk in (real_walk, None):
            monkeypatch.setattr(rec, "_walk", walk)
            partition._log._segments_version = -1          # drop cursors and maps
            outcomes.append([_read_or_error(partition, o, limit, 1 << 20, None)
                             for o, limit in ((0, 500), (end // 2, 500), (end - 1, 500),
                                              (offset, 1), (offset, 500))])
        assert outcomes[0] == outcomes[1], f"byte {flip} flipped"
    with open(path, "r+b") as f:
        f.write(data)
    broker.close()


def test_the_c_walk_hands_back_a_batch_whose_offsets_pass_64_bits():
    """A header whose last offset (baseOffset + lastOffsetDelta) does not fit 64 bits
    is not walked in C (where it would wrap): the Python walk, with Python's ints,
    takes the read. A control batch, so no record decode would catch it either."""
    from logkit.crc import crc32c
    rows = [(b"k", b"v", None, None)] * 11
    base = 2**63 - 6
    batch = bytes(rec.encode_batch(rows, base_offset=base, control=True, now_ms=NOW))
    assert rec.read_header(batch, 0, len(batch)).last_offset >= 2**63
    got = speedups.walk_batches(batch, 0, 0, base, len(batch), "t", 0, 500, 1 << 20,
                                2**63 - 1, -1, rec.Record, crc32c)
    assert got is NotImplemented
    fits = bytes(rec.encode_batch(rows, base_offset=base - 10, control=True, now_ms=NOW))
    walked = speedups.walk_batches(fits, 0, 0, base - 10, len(fits), "t", 0, 500,
                                   1 << 20, 2**63 - 1, -1, rec.Record, crc32c)
    assert walked[0] == [] and walked[3] == base + 1      # control: no records; next
