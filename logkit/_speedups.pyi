"""Type stub of the optional C extension `logkit._speedups` (logkit/_speedups.c).

Each function mirrors a pure-Python one exactly (records.py, columns.py, murmur2.py)
and raises ValueError (or UnicodeDecodeError) where the Python version raises on
malformed bytes. Import it through `logkit._native`, which chooses once.
"""

from typing import Any, Sequence

def encode_records(records: Sequence[Sequence[Any]], now_ms: int,
                   room: int = -1) -> tuple[Any, int, int]:
    """The uncompressed records section of (key, value, headers, timestamp_ms) rows:
    (payload, base timestamp, max timestamp). A timestamp of None means now_ms. With
    room >= 0 the payload is a bytearray of `room` zero bytes, then the section (each
    key and value copied once); else bytes."""

def decode_records(buf: Any, pos: int, end: int, count: int, base_offset: int,
                   base_timestamp: int, append_time: int | None, topic: str,
                   partition: int, min_offset: int, record_type: type) -> list[Any]:
    """Records of the uncompressed section buf[pos:end] as `record_type` tuples
    (topic, partition, offset, timestamp, key, value, headers), offsets >= min_offset.
    `append_time` is None or the LogAppendTime timestamp."""

def check_records(buf: Any, pos: int, end: int, count: int,
                  base_timestamp: int) -> tuple[int, int]:
    """Walk the uncompressed section buf[pos:end] as decode_records reads it, building
    nothing: count records, framed right, offset deltas 0..count-1, timestamps within
    64 bits, no stray bytes. Returns (smallest, largest) record timestamp."""

def decode_columns(buf: Any, pos: int, end: int, count: int, base_offset: int,
                   base_timestamp: int, append_time: int, min_offset: int,
                   stop_offset: int, columns: list[bytearray]) -> int:
    """Append the records with min_offset <= offset < stop_offset to the seven column
    buffers (see columns.Columns); returns how many. append_time < 0: CreateTime."""

def murmur2(data: bytes) -> int:
    """Kafka's murmur2 (seed 0x9747b28c) as a signed 32-bit int."""

def walk_batches(buf: Any, base: int, pos: int, offset: int, size: int, topic: str,
                 partition: int, max_records: int, max_bytes: int, stop_offset: int,
                 exact: int, record_type: type, crc32c: Any) -> Any:
    """segment.LogSegment._read's batch walk for clean batches (records.walk_clean):
    (records, pos, last_pos, expected, last_offset, budget), or NotImplemented with
    nothing changed at any batch the Python walk must handle or report."""

def murmur3_128(data: Any) -> bytes:
    """MurmurHash3 x64 128 (seed 0) of data: h1 then h2, little-endian (cleaner.py's
    `murmur3_128` is the twin)."""

def map_get(table: Any, slots: int, key: bytes) -> int:
    """The offset cleaner.OffsetMap's table of `slots` 24-byte slots maps key to, or -1."""

def map_put(buf: Any, pos: int, end: int, count: int, base_offset: int, min_offset: int,
            table: bytearray, slots: int, size: int) -> int:
    """Map each keyed record of the uncompressed section buf[pos:end] at or past
    min_offset to its offset, in order; returns the keys the table then holds
    (ValueError when it would fill every slot)."""

def clean_records(buf: Any, pos: int, end: int, count: int, base_offset: int, table: Any,
                  slots: int, map_end: int, drop_tombstones: bool,
                  stamp_shift: int | None) -> tuple[bytes, int, bool, int | None]:
    """The records of buf[pos:end] a cleaning pass keeps, their bytes as they are (with
    stamp_shift added to each timestamp delta when a tombstone is kept and it is not
    None): (section, kept, tombstone kept, largest kept timestamp delta or None)."""
