"""Record batch v2 codec: round trips, CRC, corruption, codecs, murmur2."""

from __future__ import annotations

import struct
import sys

import pytest

from logkit import CorruptRecordError, murmur2
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


def test_missing_codec_package_is_named(monkeypatch):
    """A codec whose package is absent raises CodecUnavailableError naming it."""
    import logkit.compression as compression
    monkeypatch.setitem(sys.modules, "zstandard", None)
    monkeypatch.setattr(compression, "_modules", {})
    with pytest.raises(CodecUnavailableError, match="zstandard"):
        encode_batch([(b"k", b"v", None, 1)], codec=CODEC_ZSTD)


@pytest.mark.parametrize("data, expected", [
    (b"21", -973932308), (b"foobar", -790332482), (b"a-little-bit-long-string", -985981536),
    (b"a-little-bit-longer-string", -1486304829),
    (b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8", -58897971), (b"abc", 479470107),
    (b"", 275646681),
])
def test_murmur2_matches_kafka_vectors(data, expected):
    """Kafka's published murmur2 vectors (Kafka UtilsTest) hold."""
    assert murmur2(data) == expected
