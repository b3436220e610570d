"""Record batch v2 codec: round trips, CRC, corruption, codecs."""

from __future__ import annotations

import struct
import sys

import pytest

from logkit import CorruptRecordError
from logkit.compression import CODEC_GZIP, CODEC_LZ4, CODEC_NONE, CODEC_SNAPPY, CODEC_ZSTD
from logkit.crc import crc32c, crc32c_crcmod
from logkit.errors import CodecUnavailableError
from logkit.records import (CRC_OFFSET, decode_batch, encode_batch, encode_varint,
                            read_header, _read_varint)

ALL_CODECS = [CODEC_NONE, CODEC_GZIP, CODEC_SNAPPY, CODEC_LZ4, CODEC_ZSTD]


def roundtrip(records, **kw):
    batch = encode_batch(records, **kw)
    header = read_header(batch, 0, len(batch))
    return header, decode_batch(bytes(batch), 0, header, "t", 3)


def test_crc32c_check_value_for_both_implementations():
    """Both CRC-32C implementations give the standard check value."""
    assert crc32c(b"123456789") == 0xE3069283
    assert crc32c_crcmod(b"123456789") == 0xE3069283
    data = bytes(range(256)) * 40
    assert crc32c(data) == crc32c_crcmod(data)


@pytest.mark.parametrize("value", [0, 1, -1, 63, -64, 64, 8191, 8192, -8193, 2**31 - 1,
                                   -2**31, 2**63 - 1, -2**63])
def test_varint_boundaries(value):
    """Zig-zag varints round-trip at every length boundary."""
    encoded = encode_varint(value)
    assert _read_varint(encoded, 0) == (value, len(encoded))


@pytest.mark.parametrize("codec", ALL_CODECS)
def test_roundtrip_every_field_every_codec(codec):
    """Keys, values, headers, timestamps and offsets survive encode/decode."""
    records = [
        (b"k1", b"v1", None, 1_000),
        (None, b"no key", [("h", b"x"), ("\u00e9t\u00e9", None)], 999),   # older timestamp
        (b"k3", None, [], 5_000_000_000),                                  # null value
        (b"", b"", [("", b"")], 1_000),
        (b"big", b"x" * 300_000, None, 1_001),
    ] + [(b"k%d" % i, b"v" * (i % 200), None, 2_000 + i) for i in range(1000)]
    header, out = roundtrip(records, codec=codec, base_offset=7)
    assert header.codec == codec and header.records_count == len(records)
    assert header.base_timestamp == 1_000 and header.max_timestamp == 5_000_000_000
    assert [r.offset for r in out] == list(range(7, 7 + len(records)))
    for (key, value, headers, ts), got in zip(records, out):
        assert (got.key, got.value, got.timestamp) == (key, value, ts)
        assert list(got.headers) == list(headers or [])


def test_min_offset_skips_earlier_records_of_a_batch():
    """Decoding from the middle of a batch returns only the later records."""
    batch = encode_batch([(None, b"%d" % i, None, 1) for i in range(10)], base_offset=100)
    header = read_header(batch, 0, len(batch))
    out = decode_batch(batch, 0, header, "t", 0, min_offset=105)
    assert [r.offset for r in out] == [105, 106, 107, 108, 109]


def test_flipped_byte_raises_with_path_and_position():
    """A flipped byte anywhere after the CRC field is caught, never returned as data."""
    batch = encode_batch([(b"k", b"value-%d" % i, None, 5) for i in range(20)])
    for position in range(CRC_OFFSET + 4, len(batch), 7):
        damaged = bytearray(b"\x00" * 9 + batch)             # batch at position 9
        damaged[9 + position] ^= 0x40
        header = read_header(damaged, 9, len(damaged), "seg.log")
        with pytest.raises(CorruptRecordError) as info:
            decode_batch(damaged, 9, header, "t", 0, path="seg.log")
        assert info.value.path == "seg.log" and info.value.position == 9


def test_bad_magic_and_lengths_are_corruption():
    """A header that cannot be a magic-2 batch raises CorruptRecordError."""
    batch = encode_batch([(b"k", b"v", None, 5)])
    bad_magic = bytearray(batch)
    bad_magic[16] = 1
    with pytest.raises(CorruptRecordError, match="magic"):
        read_header(bad_magic, 0, len(bad_magic), "x.log")
    bad_length = bytearray(batch)
    struct.pack_into(">i", bad_length, 8, 3)
    with pytest.raises(CorruptRecordError):
        read_header(bad_length, 0, len(bad_length), "x.log")
    assert read_header(batch[:-1], 0, len(batch) - 1) is None      # torn: not complete


def test_lying_record_length_is_corruption_even_with_a_valid_crc():
    """A body whose record lengths disagree with its fields is rejected after the CRC."""
    batch = encode_batch([(b"k", b"v", None, 5)])
    assert batch[61] == 0x10                            # zig-zag of 8, the true length
    batch[61] = 0x12                                    # claim 9 bytes
    from logkit.records import ATTRIBUTES_OFFSET, _CRC
    _CRC.pack_into(batch, CRC_OFFSET, crc32c(bytes(batch[ATTRIBUTES_OFFSET:])))
    header = read_header(batch, 0, len(batch))
    with pytest.raises(CorruptRecordError, match="malformed"):
        decode_batch(batch, 0, header, "t", 0, path="p")


@pytest.mark.parametrize("codec, module, package", [
    (CODEC_SNAPPY, "snappy", "python-snappy"), (CODEC_LZ4, "lz4.frame", "lz4"),
    (CODEC_ZSTD, "zstandard", "zstandard")])
def test_missing_codec_package_is_named(monkeypatch, tmp_path, codec, module, package):
    """A codec whose package is absent raises CodecUnavailableError naming the package:
    when encoding, when reading a stored batch, and up front in Partition.append."""
    import logkit
    import logkit.compression as compression
    stored = encode_batch([(b"k", b"v" * 50, None, 1)], codec=codec)   # while present
    monkeypatch.setitem(sys.modules, module, None)                    # now "uninstalled"
    monkeypatch.setattr(compression, "_modules", {})
    with pytest.raises(CodecUnavailableError, match=package):
        encode_batch([(b"k", b"v", None, 1)], codec=codec)
    header = read_header(stored, 0, len(stored))
    with pytest.raises(CodecUnavailableError, match=package):
        decode_batch(stored, 0, header, "t", 0)
    name = {CODEC_SNAPPY: "snappy", CODEC_LZ4: "lz4", CODEC_ZSTD: "zstd"}[codec]
    with logkit.Broker(tmp_path, background=False) as broker:
        p = broker.create_topic("t", 1).partition(0)
        with pytest.raises(CodecUnavailableError, match=package):
            p.append([(None, b"v", None, None)], compression_type=name)
        assert p.log_end_offset == 0


@pytest.mark.parametrize("codec", ALL_CODECS)
def test_truncated_or_garbled_compressed_body_is_corruption(codec):
    """A compressed body cut short (CRC fixed up to match) raises CorruptRecordError,
    never a codec library's own exception or partial records."""
    from logkit.records import ATTRIBUTES_OFFSET, LENGTH_OFFSET, _CRC
    batch = encode_batch([(b"k%d" % i, b"value %d " % i * 20, None, 9) for i in range(50)],
                         codec=codec)
    cut = bytearray(batch[:len(batch) - 17])
    struct.pack_into(">i", cut, LENGTH_OFFSET, len(cut) - 12)
    _CRC.pack_into(cut, CRC_OFFSET, crc32c(bytes(cut[ATTRIBUTES_OFFSET:])))
    header = read_header(cut, 0, len(cut))
    with pytest.raises(CorruptRecordError) as info:
        decode_batch(cut, 0, header, "t", 0, path="cut.log")
    assert info.value.path == "cut.log" and info.value.position == 0


def test_log_append_time_attribute_overrides_record_timestamps():
    """With the LogAppendTime attribute every record carries the batch's max timestamp."""
    batch = encode_batch([(None, b"a", None, 5), (None, b"b", None, 9)],
                         log_append_time=True, now_ms=123_456)
    header = read_header(batch, 0, len(batch))
    assert header.attributes & 0x08
    assert [r.timestamp for r in decode_batch(batch, 0, header, "t", 0)] == [123_456] * 2


def test_varint_extremes_in_record_fields():
    """Huge positive and negative timestamp deltas and multi-byte lengths round-trip."""
    base = 2**61
    records = [(None, b"a", None, base), (b"k" * 20_000, b"b" * 70_000, None, 2**62),
               (None, None, [("k" * 300, b"v" * 20_000)] * 3, 0), (b"", b"", None, -1)]
    header, out = roundtrip(records)
    assert [(r.key, r.value, list(r.headers), r.timestamp) for r in out] == \
        [(k, v, list(h or []), t) for k, v, h, t in records]


@pytest.mark.parametrize("codec", [CODEC_GZIP, CODEC_SNAPPY, CODEC_LZ4, CODEC_ZSTD])
def test_garbled_compressed_body_is_corruption(codec):
    """Compressed bytes replaced by noise (CRC fixed up) raise CorruptRecordError."""
    from logkit.records import ATTRIBUTES_OFFSET, RECORDS_OFFSET, _CRC
    import random
    batch = encode_batch([(b"k", b"v" * 300, None, 9)] * 20, codec=codec)
    rng = random.Random(codec)
    for _ in range(20):
        bad = bytearray(batch)
        for _ in range(8):
            bad[rng.randrange(RECORDS_OFFSET, len(bad))] = rng.randrange(256)
        _CRC.pack_into(bad, CRC_OFFSET, crc32c(bytes(bad[ATTRIBUTES_OFFSET:])))
        header = read_header(bad, 0, len(bad))
        try:
            out = decode_batch(bad, 0, header, "t", 0)
        except CorruptRecordError:
            continue
        assert len(out) == 20          # noise that still inflates must parse completely
