"""Kafka record batch v2 (magic 2): the bytes on disk and the Python records they hold.

Owns: every byte of a batch. Encoding a list of records into one batch, decoding
batches back into `Record`s, validating a batch header and CRC, checking its records
as a reader will decode them without building them (`check_records`: `check()` asks it
of every stored batch; `validate_batch` adds the CRC and Kafka's timestamp checks: the
gate of a verified append, as a client's batch gets), walking the batches of a
buffer (`iter_batches`: the one walker that segment scans, recovery, `check()`,
`batches_since`, the CLI's `dump` and Spark use), rewriting header fields in place (one
helper per field family: `stamp_base_offset`, `stamp_leader_epoch`,
`stamp_log_append_time`, `stamp_producer`, the last two recomputing the CRC), and the
per-record size estimate used to size batches (`RECORD_OVERHEAD_BYTES`,
`record_size_estimate`). This is a hot path: struct objects are prebuilt, small varints
come from a table, each batch is built with one `join`; hot loops elsewhere that index
the raw `_HEADER` tuple use the `FIELD_*` positions defined here.

Batch layout (big-endian; docs/design.md §3):

    off  field                  type     off  field              type
    0    baseOffset             int64    35   maxTimestamp       int64
    8    batchLength            int32    43   producerId         int64
    12   partitionLeaderEpoch   int32    51   producerEpoch      int16
    16   magic (= 2)            int8     53   baseSequence       int32
    17   crc (CRC-32C of 21..)  uint32   57   recordsCount       int32
    21   attributes             int16    61   records...
    23   lastOffsetDelta        int32
    27   baseTimestamp          int64

Record: length varint, attributes int8, timestampDelta varlong, offsetDelta varint,
key (varint length, -1 = null), value (same), header count varint, headers (key as
varint-length UTF-8, value as varint-length bytes or null). Varints are zig-zag.

Invariant: a batch from `encode_batch` passes `check_batch` and `check_records`, and
a batch that passes those decodes without error; `decode_batch` never returns data
from a batch whose CRC, magic or lengths are wrong: it raises `CorruptRecordError`
with the file path and byte position instead.
"""

from __future__ import annotations

import logging
import mmap
import struct
import time
from typing import Any, Iterable, Iterator, NamedTuple, Sequence

from . import _native
from .compression import CODEC_NONE, CODEC_ZSTD, compress, decompress
from .crc import crc32c
from .errors import CorruptRecordError, InvalidRecordError, UnsupportedCompressionTypeError

__all__ = ["Record", "RecordMetadata", "BatchHeader", "encode_batch", "decode_batch",
           "read_header", "check_batch", "iter_batches", "stamp_base_offset",
           "stamp_leader_epoch", "stamp_log_append_time", "stamp_producer", "LOG_OVERHEAD",
           "RECORDS_OFFSET", "MIN_BATCH_LENGTH", "RECORD_OVERHEAD_BYTES",
           "record_size_estimate", "encode_batch_parts", "PARTS_MIN_VALUE_BYTES",
           "check_records", "validate_batch", "NO_TIMESTAMP", "encode_control_batch",
           "control_record_type", "CONTROL_ABORT", "CONTROL_COMMIT",
           "ATTR_DELETE_HORIZON", "rebuild_batch", "check_cleaned_records",
           "batch_section", "rebuild_batch_section"]

log = logging.getLogger(__name__)

# Field positions, each from the one before (docs/design.md §3).
BASE_OFFSET_OFFSET = 0
LENGTH_OFFSET = BASE_OFFSET_OFFSET + 8
LOG_OVERHEAD = LENGTH_OFFSET + 4                       # bytes before batchLength counts
PARTITION_LEADER_EPOCH_OFFSET = LOG_OVERHEAD
MAGIC_OFFSET = PARTITION_LEADER_EPOCH_OFFSET + 4
CRC_OFFSET = MAGIC_OFFSET + 1
ATTRIBUTES_OFFSET = CRC_OFFSET + 4
LAST_OFFSET_DELTA_OFFSET = ATTRIBUTES_OFFSET + 2
BASE_TIMESTAMP_OFFSET = LAST_OFFSET_DELTA_OFFSET + 4
MAX_TIMESTAMP_OFFSET = BASE_TIMESTAMP_OFFSET + 8
PRODUCER_ID_OFFSET = MAX_TIMESTAMP_OFFSET + 8
PRODUCER_EPOCH_OFFSET = PRODUCER_ID_OFFSET + 8
BASE_SEQUENCE_OFFSET = PRODUCER_EPOCH_OFFSET + 2
RECORDS_COUNT_OFFSET = BASE_SEQUENCE_OFFSET + 4
RECORDS_OFFSET = RECORDS_COUNT_OFFSET + 4              # == 61: the header's size
MIN_BATCH_LENGTH = RECORDS_OFFSET - LOG_OVERHEAD       # == 49: batchLength of no records
MAGIC = 2
NO_TIMESTAMP = -1                 # Kafka's RecordBatch.NO_TIMESTAMP

ATTR_CODEC_MASK = 0x07
ATTR_TIMESTAMP_TYPE = 0x08        # set: LogAppendTime
ATTR_TRANSACTIONAL = 0x10
ATTR_CONTROL = 0x20

_HEADER = struct.Struct(">qiibIhiqqqhii")             # the 61-byte batch header
_BASE_OFFSET = struct.Struct(">q")
_LEADER_EPOCH = struct.Struct(">i")
_LENGTH = struct.Struct(">i")
_CRC = struct.Struct(">I")
_ATTRIBUTES = struct.Struct(">h")
_TIMESTAMPS = struct.Struct(">qq")                     # baseTimestamp, maxTimestamp
_PRODUCER = struct.Struct(">qhi")                      # producerId, epoch, baseSequence
assert _HEADER.size == RECORDS_OFFSET
assert _PRODUCER.size == RECORDS_COUNT_OFFSET - PRODUCER_ID_OFFSET


class Record(NamedTuple):
    """One consumed record. `headers` is a sequence of (str, bytes | None) pairs."""

    topic: str
    partition: int
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: Sequence[tuple[str, bytes | None]]


class RecordMetadata(NamedTuple):
    """Where a produced record landed."""

    topic: str
    partition: int
    offset: int
    timestamp: int


class BatchHeader(NamedTuple):
    """The fixed 61-byte header of a stored batch, plus where it sits."""

    base_offset: int
    batch_length: int
    leader_epoch: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    records_count: int

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta

    @property
    def size(self) -> int:
        return self.batch_length + LOG_OVERHEAD

    @property
    def codec(self) -> int:
        return self.attributes & ATTR_CODEC_MASK

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & ATTR_CONTROL)


# Positions of the fields in a raw `_HEADER.unpack_from` tuple (BatchHeader's order), for
# hot loops that index the tuple instead of building a BatchHeader.
FIELD_BASE_OFFSET = BatchHeader._fields.index("base_offset")
FIELD_BATCH_LENGTH = BatchHeader._fields.index("batch_length")
FIELD_MAGIC = BatchHeader._fields.index("magic")
FIELD_ATTRIBUTES = BatchHeader._fields.index("attributes")
FIELD_LAST_OFFSET_DELTA = BatchHeader._fields.index("last_offset_delta")


# ---- varints -------------------------------------------------------------------------

def _encode_unsigned(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def encode_varint(value: int) -> bytes:
    """Zig-zag varint (64-bit range) of a signed int."""
    return _encode_unsigned((value << 1) ^ (value >> 63))


_SMALL = 1 << 13                                      # 0..8191 zig-zag into <= 2 bytes
_VARINT = [_encode_unsigned(n << 1) for n in range(_SMALL)]
_NULL = encode_varint(-1)


def _varint(value: int) -> bytes:
    if 0 <= value < _SMALL:
        return _VARINT[value]
    return _encode_unsigned((value << 1) ^ (value >> 63))


def _read_varint(buf: Any, pos: int) -> tuple[int, int]:
    """Decode a zig-zag varint at `pos`; returns (value, next position)."""
    shift = 0
    raw = 0
    while True:
        byte = buf[pos]
        pos += 1
        raw |= (byte & 0x7F) << shift
        if byte < 0x80:
            if raw >> 64:
                raise ValueError("varint does not fit 64 bits")
            return (raw >> 1) ^ -(raw & 1), pos
        shift += 7
        if shift > 63:
            raise ValueError("varint longer than 10 bytes")


# ---- encode ----------------------------------------------------------------------------

RecordInput = tuple  # (key, value, headers, timestamp_ms)


# The one per-record size estimate (batch sizing: the producer's batch_size, Spark's
# staged batches): a record's framing without headers — length, attributes, timestamp
# and offset deltas, key and value lengths, header count — is at most this many bytes
# for the deltas and lengths a batch normally holds. `_sendpath.c` has the same number
# as its RECORD_OVERHEAD_BYTES. Each header adds HEADER_OVERHEAD_BYTES, its value and
# up to 4 bytes per character of its key (UTF-8).
RECORD_OVERHEAD_BYTES = 21
HEADER_OVERHEAD_BYTES = 10


def record_size_estimate(key: bytes | None, value: bytes | None, headers: Any) -> int:
    """Bytes a record adds to an uncompressed batch, for batch sizing (an estimate that
    errs high: see RECORD_OVERHEAD_BYTES)."""
    size = RECORD_OVERHEAD_BYTES + (len(key) if key is not None else 0) + \
        (len(value) if value is not None else 0)
    if headers:
        for hkey, hvalue in headers:
            size += HEADER_OVERHEAD_BYTES + len(hkey) * 4 + \
                (len(hvalue) if hvalue is not None else 0)
    return size


def _encode_headers(headers: Iterable[tuple[str, bytes | None]]) -> bytes:
    parts = []
    count = 0
    for hkey, hvalue in headers:
        raw_key = hkey.encode("utf-8")
        parts.append(_varint(len(raw_key)))
        parts.append(raw_key)
        if hvalue is None:
            parts.append(_NULL)
        else:
            parts.append(_varint(len(hvalue)))
            parts.append(hvalue)
        count += 1
    return _varint(count) + b"".join(parts)


def _encode_records_py(records: Sequence[RecordInput], now_ms: int, room: int = -1
                       ) -> tuple[Any, int, int]:
    """The uncompressed records section; returns (payload, base timestamp, max timestamp).
    With `room` >= 0 the payload is a bytearray of `room` zero bytes (the batch header's
    place) and then the section, else bytes. Pure Python; `_speedups.encode_records` is
    the compiled twin (which copies each key and value once)."""
    timestamps = [now_ms if r[3] is None else r[3] for r in records]
    base_ts = timestamps[0]
    max_ts = max(timestamps)
    parts: list[bytes] = []
    append = parts.append
    varint = _varint
    table = _VARINT
    no_headers = _VARINT[0]
    null = _NULL
    for delta, (key, value, headers, _ts) in enumerate(records):
        ts_delta = timestamps[delta] - base_ts
        body = [b"\x00", table[ts_delta] if 0 <= ts_delta < _SMALL else varint(ts_delta),
                table[delta] if delta < _SMALL else varint(delta)]
        if key is None:
            body.append(null)
        else:
            body.append(varint(len(key)))
            body.append(key)
        if value is None:
            body.append(null)
        else:
            body.append(varint(len(value)))
            body.append(value)
        body.append(_encode_headers(headers) if headers else no_headers)
        encoded = b"".join(body)
        append(varint(len(encoded)))
        append(encoded)
    if room >= 0:
        return bytearray(room) + b"".join(parts), base_ts, max_ts
    return b"".join(parts), base_ts, max_ts


def encode_batch(records: Sequence[RecordInput], *, base_offset: int = 0, codec: int = 0,
                 log_append_time: bool = False, producer_id: int = -1,
                 producer_epoch: int = -1, base_sequence: int = -1,
                 leader_epoch: int = -1, transactional: bool = False,
                 control: bool = False, now_ms: int | None = None) -> bytearray:
    """Encode (key, value, headers, timestamp_ms) tuples as one magic-2 batch.

    A timestamp of None means now. Keys and values are bytes or None; headers a
    sequence of (str, bytes | None) or None/empty.
    """
    if not records:
        raise ValueError("a batch holds at least one record")
    if now_ms is None:
        now_ms = int(time.time() * 1000)
    if codec == CODEC_NONE:        # the section written after the header's place
        batch, base_ts, max_ts = _encode_records(records, now_ms, RECORDS_OFFSET)
    else:
        payload, base_ts, max_ts = _encode_records(records, now_ms)
        payload = compress(codec, payload)
        batch = bytearray(RECORDS_OFFSET + len(payload))
        batch[RECORDS_OFFSET:] = payload
    attributes = codec
    if log_append_time:
        attributes |= ATTR_TIMESTAMP_TYPE
        base_ts = max_ts = now_ms
    if transactional:
        attributes |= ATTR_TRANSACTIONAL
    if control:
        attributes |= ATTR_CONTROL
    _HEADER.pack_into(batch, 0, base_offset, len(batch) - LOG_OVERHEAD, leader_epoch, MAGIC, 0,
                      attributes, len(records) - 1, base_ts, max_ts, producer_id,
                      producer_epoch, base_sequence, len(records))
    _restamp_crc(batch, 0)
    return batch


PARTS_MIN_VALUE_BYTES = 64 * 1024     # a value this big is written in place, not copied


def encode_batch_parts(record: RecordInput, *, now_ms: int | None = None
                       ) -> list[Any] | None:
    """One record with a large value (at least PARTS_MIN_VALUE_BYTES of bytes, no
    headers) as an uncompressed batch in three pieces, [head, value, tail]: `head` (a
    bytearray) holds the whole batch header and the record up to its value, `value` is
    the caller's object itself (not copied), `tail` the rest. Joined, they are exactly
    `encode_batch([record])`; the CRC covers all three. None for any other record.
    `PartitionLog.append_batch_nowait` writes the pieces with one `pwritev`."""
    key, value, headers, timestamp = record
    if type(value) is not bytes or len(value) < PARTS_MIN_VALUE_BYTES or headers:
        return None
    if timestamp is None:
        timestamp = int(time.time() * 1000) if now_ms is None else now_ms
    # attributes, timestampDelta 0, offsetDelta 0, key, value length; value; 0 headers
    before_value = b"\x00" + _VARINT[0] + _VARINT[0] + \
        (_NULL if key is None else _varint(len(key)) + key) + _varint(len(value))
    tail = _VARINT[0]
    body_length = len(before_value) + len(value) + len(tail)
    prefix = _varint(body_length) + before_value
    head = bytearray(RECORDS_OFFSET + len(prefix))
    total = len(head) + len(value) + len(tail)
    _HEADER.pack_into(head, 0, 0, total - LOG_OVERHEAD, -1, MAGIC, 0, CODEC_NONE, 0,
                      timestamp, timestamp, -1, -1, -1, 1)
    head[RECORDS_OFFSET:] = prefix
    crc = crc32c(memoryview(head)[ATTRIBUTES_OFFSET:])
    crc = crc32c(tail, crc32c(value, crc))
    _CRC.pack_into(head, CRC_OFFSET, crc)
    return [head, value, tail]


# ---- header rewrites -------------------------------------------------------------------
# One helper per field family. baseOffset and partitionLeaderEpoch are outside the CRC;
# every other field is inside it, so its helper recomputes the CRC. `pos` is where the
# batch starts in `batch` (a buffer of several batches); the batch must be whole.

def _restamp_crc(batch: Any, pos: int) -> None:
    end = pos + LOG_OVERHEAD + _LENGTH.unpack_from(batch, pos + LENGTH_OFFSET)[0]
    _CRC.pack_into(batch, pos + CRC_OFFSET,
                   crc32c(memoryview(batch)[pos + ATTRIBUTES_OFFSET:end]))


def stamp_base_offset(batch: bytearray, base_offset: int, leader_epoch: int = -1) -> None:
    """Set baseOffset and partitionLeaderEpoch in place (the appender's stamp); the CRC
    does not cover them."""
    _BASE_OFFSET.pack_into(batch, BASE_OFFSET_OFFSET, base_offset)
    _LEADER_EPOCH.pack_into(batch, PARTITION_LEADER_EPOCH_OFFSET, leader_epoch)


def stamp_leader_epoch(batch: Any, leader_epoch: int, *, pos: int = 0) -> None:
    """Set partitionLeaderEpoch of the batch at `pos` in place (not covered by the CRC)."""
    _LEADER_EPOCH.pack_into(batch, pos + PARTITION_LEADER_EPOCH_OFFSET, leader_epoch)


def stamp_log_append_time(batch: Any, now_ms: int, *, pos: int = 0) -> None:
    """Make the batch at `pos` a LogAppendTime batch stamped `now_ms` (Kafka's broker
    side timestamp: the timestamp-type bit set, base and max timestamp = now; each
    record then reads as now) and recompute its CRC."""
    attributes = _ATTRIBUTES.unpack_from(batch, pos + ATTRIBUTES_OFFSET)[0]
    _ATTRIBUTES.pack_into(batch, pos + ATTRIBUTES_OFFSET, attributes | ATTR_TIMESTAMP_TYPE)
    _TIMESTAMPS.pack_into(batch, pos + BASE_TIMESTAMP_OFFSET, now_ms, now_ms)
    _restamp_crc(batch, pos)


def stamp_producer(batch: Any, producer_id: int, producer_epoch: int, base_sequence: int,
                   *, pos: int = 0) -> None:
    """Set producerId, producerEpoch and baseSequence of the batch at `pos` (an
    idempotent writer's identity) and recompute its CRC."""
    _PRODUCER.pack_into(batch, pos + PRODUCER_ID_OFFSET, producer_id, producer_epoch,
                        base_sequence)
    _restamp_crc(batch, pos)


# ---- control batches (transaction markers) ----------------------------------------------
# Kafka's EndTransactionMarker: one record in a batch with the transactional and control
# attributes, baseSequence -1; key = version int16 (0) + type int16 (ControlRecordType),
# value = version int16 (0) + coordinatorEpoch int32.

CONTROL_ABORT = 0                 # ControlRecordType.ABORT
CONTROL_COMMIT = 1                # ControlRecordType.COMMIT
_CONTROL_KEY = struct.Struct(">hh")
_END_TXN_VALUE = struct.Struct(">hi")


def encode_control_batch(producer_id: int, producer_epoch: int, *, commit: bool,
                         coordinator_epoch: int = 0, now_ms: int | None = None) -> bytearray:
    """The COMMIT or ABORT marker of `producer_id`'s transaction, as one control batch."""
    key = _CONTROL_KEY.pack(0, CONTROL_COMMIT if commit else CONTROL_ABORT)
    value = _END_TXN_VALUE.pack(0, coordinator_epoch)
    return encode_batch([(key, value, None, now_ms)], producer_id=producer_id,
                        producer_epoch=producer_epoch, base_sequence=-1,
                        transactional=True, control=True, now_ms=now_ms)


def control_record_type(buf: Any, pos: int, header: BatchHeader, path: str = "") -> int:
    """The ControlRecordType (CONTROL_ABORT, CONTROL_COMMIT, ...) of the control batch at
    `pos`, from its first record's key; CorruptRecordError when there is none to read."""
    records = decode_batch(buf, pos, header, "", 0, path=path, verify=False)
    key = records[0].key if records else None
    if key is None or len(key) < _CONTROL_KEY.size:
        raise CorruptRecordError("control batch without a control record key", path=path,
                                 position=pos, expected="version + type", actual=key)
    return _CONTROL_KEY.unpack_from(key)[1]


# ---- decode ----------------------------------------------------------------------------

def read_header(buf: Any, pos: int, end: int, path: str = "") -> BatchHeader | None:
    """Parse the header at `pos`; None when fewer than a whole header's bytes remain
    or the batch runs past `end` (a torn tail). Raises CorruptRecordError on a header
    that cannot be a magic-2 batch."""
    if end - pos < RECORDS_OFFSET:
        return None
    header = BatchHeader._make(_HEADER.unpack_from(buf, pos))
    if header.magic != MAGIC:
        raise CorruptRecordError("record batch has an unknown magic byte", path=path,
                                 position=pos, expected=MAGIC, actual=header.magic)
    if header.batch_length < MIN_BATCH_LENGTH or header.records_count < 0 \
            or header.last_offset_delta < 0:
        raise CorruptRecordError("record batch header has impossible lengths", path=path,
                                 position=pos, expected=f">= {MIN_BATCH_LENGTH} bytes",
                                 actual=header.batch_length)
    if pos + LOG_OVERHEAD + header.batch_length > end:
        return None
    return header


def check_batch(buf: Any, pos: int, header: BatchHeader, path: str = "") -> None:
    """Raise CorruptRecordError unless the batch's CRC-32C matches its bytes."""
    end = pos + LOG_OVERHEAD + header.batch_length
    actual = crc32c(memoryview(buf)[pos + ATTRIBUTES_OFFSET:end])
    if actual != header.crc:
        raise CorruptRecordError("record batch CRC mismatch", path=path, position=pos,
                                 expected=header.crc, actual=actual)


TORN_BATCH = "batch runs past the end of the data"
OUT_OF_SEQUENCE = "record batch base offset out of sequence"


def out_of_sequence(path: str, position: int, expected: int,
                    actual: int) -> CorruptRecordError:
    """The error for a batch whose baseOffset does not follow the previous batch."""
    return CorruptRecordError(OUT_OF_SEQUENCE, path=path, position=position,
                              expected=expected, actual=actual)


def iter_batches(buffer: Any, start: int, end: int, path: str = "", *,
                 first_offset: int | None = None, verify: bool = False,
                 max_batch_bytes: int | None = None,
                 gaps: bool = False) -> Iterator[tuple[int, BatchHeader]]:
    """Yield (position, header) of each batch in buffer[start:end], in order: the one
    batch walker (segment scans, recovery, check(), batches_since, dump, Spark).

    Bad bytes are handled one way: the walk raises CorruptRecordError whose `position`
    is the start of the first batch that is not whole and valid, so a reader reports
    it and recovery truncates there. That batch is one that is torn (fewer bytes left
    before `end` than its header or its batchLength needs), has an impossible header,
    is bigger than `max_batch_bytes` (when given), starts out of sequence (offsets are
    contiguous: the first batch must start at `first_offset` when given, each later
    one one past the previous batch's last offset; with `gaps`, for a compacted log,
    at or past it), or, with `verify`, fails its CRC.
    Every batch yielded before the error is whole and passed these checks."""
    pos = start
    expected = first_offset
    while pos < end:
        header = read_header(buffer, pos, end, path)
        if header is None:
            raise CorruptRecordError(TORN_BATCH, path=path, position=pos, expected=end)
        if max_batch_bytes is not None and header.size > max_batch_bytes:
            raise CorruptRecordError("record batch is bigger than max.message.bytes allows",
                                     path=path, position=pos, expected=max_batch_bytes,
                                     actual=header.size)
        if expected is not None and header.base_offset != expected and not (
                gaps and header.base_offset > expected):
            raise out_of_sequence(path, pos, expected, header.base_offset)
        if verify:
            check_batch(buffer, pos, header, path)
        expected = header.last_offset + 1
        yield pos, header
        pos += header.size


def decode_batch(buf: Any, pos: int, header: BatchHeader, topic: str, partition: int,
                 *, min_offset: int = 0, path: str = "", verify: bool = True) -> list[Record]:
    """Records of the batch at `pos` with offset >= min_offset (CRC checked first)."""
    if verify:
        check_batch(buf, pos, header, path)
    end = pos + LOG_OVERHEAD + header.batch_length
    try:
        if header.attributes & ATTR_CODEC_MASK:
            data: Any = decompress(header.attributes & ATTR_CODEC_MASK,
                                   bytes(buf[pos + RECORDS_OFFSET:end]))
            start, stop = 0, len(data)
        elif isinstance(buf, (bytes, mmap.mmap)):
            data, start, stop = buf, pos + RECORDS_OFFSET, end     # slices are bytes
        else:
            data, start, stop = bytes(buf[pos + RECORDS_OFFSET:end]), 0, end - pos - \
                RECORDS_OFFSET
        return _decode_records(data, start, stop, header, topic, partition, min_offset)
    except (IndexError, ValueError, UnicodeDecodeError, struct.error) as exc:
        raise CorruptRecordError(f"record batch body is malformed: {exc}", path=path,
                                 position=pos) from None


# ---- validate: what a reader needs, checked before an append and by check() ---------

def check_records(buf: Any, pos: int, header: BatchHeader, path: str = "") -> tuple[int, int]:
    """Check the records of the batch at `pos` as a reader decodes them, building
    nothing: a codec Kafka defines (UnsupportedCompressionTypeError), a section that
    inflates (CorruptRecordError), recordsCount = lastOffsetDelta + 1 records, each
    framed right, with offset deltas 0..count-1 in order, no stray bytes and timestamps
    within 64 bits (InvalidRecordError). Nothing here compacts a log, so every stored
    batch meets this too. Returns the smallest and largest record timestamp (as the
    records were written: before any LogAppendTime). The CRC is `check_batch`'s."""
    codec = header.attributes & ATTR_CODEC_MASK
    if codec > CODEC_ZSTD:
        raise UnsupportedCompressionTypeError(
            f"record batch names compression codec {codec}; Kafka defines 0-{CODEC_ZSTD}",
            path=path, position=pos, expected=f"0-{CODEC_ZSTD}", actual=codec)
    count = header.records_count
    if count != header.last_offset_delta + 1:
        raise InvalidRecordError(
            "record batch's recordsCount and lastOffsetDelta disagree", path=path,
            position=pos, expected=header.last_offset_delta + 1, actual=count)
    end = pos + LOG_OVERHEAD + header.batch_length
    if codec:
        try:
            data: Any = decompress(codec, bytes(buf[pos + RECORDS_OFFSET:end]))
        except ValueError as exc:
            raise CorruptRecordError(f"record batch does not decompress: {exc}", path=path,
                                     position=pos) from None
        start, stop = 0, len(data)
    else:
        data, start, stop = buf, pos + RECORDS_OFFSET, end
    try:
        return _check_records(data, start, stop, count, header.base_timestamp)
    except (IndexError, ValueError, UnicodeDecodeError, struct.error) as exc:
        raise InvalidRecordError(f"record batch body is malformed: {exc}", path=path,
                                 position=pos) from None


def validate_batch(buf: Any, pos: int, header: BatchHeader, path: str = "") -> None:
    """Kafka's checks of a batch a client hands in (its LogValidator), before anything
    is written: the CRC (`check_batch`), the records (`check_records`), and timestamps
    that can be: each record's at least NO_TIMESTAMP, and for CreateTime a
    maxTimestamp equal to the largest record's (the time index and retention trust
    it). Raises CorruptRecordError, or its subclasses InvalidRecordError and
    UnsupportedCompressionTypeError, naming what is wrong."""
    check_batch(buf, pos, header, path)
    smallest, largest = check_records(buf, pos, header, path)
    if smallest < NO_TIMESTAMP:
        raise InvalidRecordError("record batch holds a timestamp before the epoch",
                                 path=path, position=pos, expected=f">= {NO_TIMESTAMP}",
                                 actual=smallest)
    if not header.attributes & ATTR_TIMESTAMP_TYPE and header.max_timestamp != largest:
        raise InvalidRecordError("record batch's maxTimestamp is not its records' largest",
                                 path=path, position=pos, expected=largest,
                                 actual=header.max_timestamp)


_INT64 = (-(1 << 63), (1 << 63) - 1)


def _check_records_py(buf: Any, pos: int, end: int, count: int,
                      base_timestamp: int) -> tuple[int, int]:
    """Pure-Python twin of `_speedups.check_records`: the reader's own decoder over the
    section, then the offset deltas and timestamps. Raises ValueError/IndexError."""
    if count < 0 or count > (end - pos) // 7 + 1:      # a record takes >= 7 bytes
        raise ValueError(f"records count {count} does not fit in {end - pos} bytes")
    header = BatchHeader(0, 0, -1, MAGIC, 0, 0, count - 1, base_timestamp, 0, -1, -1, -1,
                         count)
    records = _decode_records_py(buf, pos, end, header, "", 0, _INT64[0])
    for delta, record in enumerate(records):
        if record.offset != delta:
            raise ValueError(f"record {delta} has offset delta {record.offset}")
        if not _INT64[0] <= record.timestamp <= _INT64[1]:
            raise ValueError("record timestamp overflows 64 bits")
    timestamps = [r.timestamp for r in records]
    return (min(timestamps), max(timestamps)) if timestamps else (_INT64[1], _INT64[0])


_new = tuple.__new__
_EMPTY: tuple = ()


def _decode_records_py(buf: Any, pos: int, end: int, header: BatchHeader, topic: str,
                       partition: int, min_offset: int) -> list[Record]:
    """Pure-Python decoder of an uncompressed records section; the compiled twin is
    `_speedups.decode_records`. Raises ValueError/IndexError on malformed bytes."""
    base_offset = header.base_offset
    base_ts = header.base_timestamp
    append_time = header.max_timestamp if header.attributes & ATTR_TIMESTAMP_TYPE else None
    out: list[Record] = []
    append = out.append
    read_varint = _read_varint
    for _ in range(header.records_count):
        byte = buf[pos]
        if byte < 0x80:
            length = (byte >> 1) ^ -(byte & 1)
            pos += 1
        else:
            length, pos = read_varint(buf, pos)
        record_end = pos + length
        pos += 1                                          # record attributes: unused
        byte = buf[pos]
        if byte < 0x80:
            ts_delta = (byte >> 1) ^ -(byte & 1)
            pos += 1
        else:
            ts_delta, pos = read_varint(buf, pos)
        byte = buf[pos]
        if byte < 0x80:
            offset_delta = (byte >> 1) ^ -(byte & 1)
            pos += 1
        else:
            offset_delta, pos = read_varint(buf, pos)
        byte = buf[pos]
        if byte < 0x80:
            key_length = (byte >> 1) ^ -(byte & 1)
            pos += 1
        else:
            key_length, pos = read_varint(buf, pos)
        if key_length < 0:
            key = None
        else:
            key = buf[pos:pos + key_length]
            pos += key_length
        byte = buf[pos]
        if byte < 0x80:
            value_length = (byte >> 1) ^ -(byte & 1)
            pos += 1
        else:
            value_length, pos = read_varint(buf, pos)
        if value_length < 0:
            value = None
        else:
            value = buf[pos:pos + value_length]
            pos += value_length
        header_count = buf[pos]
        if header_count == 0:
            headers: Sequence[Any] = _EMPTY
            pos += 1
        else:
            header_count, pos = read_varint(buf, pos)
            headers, pos = _decode_headers(buf, pos, header_count)
        if pos != record_end or pos > end:
            raise ValueError(f"record length field says {length}, fields use "
                             f"{length + pos - record_end}")
        offset = base_offset + offset_delta
        if offset >= min_offset:
            append(_new(Record, (topic, partition, offset,
                                 base_ts + ts_delta if append_time is None else append_time,
                                 key, value, headers)))
    if pos != end:
        raise ValueError(f"{end - pos} stray bytes after the last record")
    return out


def _decode_headers(buf: Any, pos: int, count: int) -> tuple[list[tuple[str, bytes | None]], int]:
    if count < 0 or count > 1_000_000:
        raise ValueError(f"impossible header count {count}")
    headers = []
    for _ in range(count):
        key_length, pos = _read_varint(buf, pos)
        if key_length < 0:
            raise ValueError("null header key")
        key = bytes(buf[pos:pos + key_length]).decode("utf-8")
        pos += key_length
        value_length, pos = _read_varint(buf, pos)
        if value_length < 0:
            value = None
        else:
            value = bytes(buf[pos:pos + value_length])
            pos += value_length
        headers.append((key, value))
    return headers, pos


# ---- the compiled accelerator ----------------------------------------------------------
# `logkit._speedups` (built from _speedups.c when a compiler is present) replaces the two
# loops above; `_native` makes the choice once (LOGKIT_PURE_PYTHON=1 forces pure Python).
# tests/storage/test_speedups.py checks both agree byte for byte. The benchmarks compare them by
# rebinding `_encode_records` / `_decode_records` here: encode_batch and decode_batch look
# those two names up at each call, so keep them module globals.

_speedups = _native.speedups
SPEEDUPS = _speedups is not None


def _decode_records_c(buf: Any, pos: int, end: int, header: BatchHeader, topic: str,
                      partition: int, min_offset: int) -> list[Record]:
    return _c_decode(buf, pos, end, header.records_count, header.base_offset,
                     header.base_timestamp,
                     header.max_timestamp if header.attributes & ATTR_TIMESTAMP_TYPE else None,
                     topic, partition, min_offset, Record)


def walk_clean(buf: Any, base: int, pos: int, offset: int, size: int, topic: str,
               partition: int, max_records: int, max_bytes: int, stop_offset: int,
               exact: bool | None) -> tuple | None:
    """A read's walk over buf (file position `base` at buf[0]) from `pos`, in C, when
    every batch it meets is whole, valid, uncompressed, in sequence and matches its CRC
    (the first one starting at `offset` when `exact`, holding it when False, checked
    already when None): (records with offsets in [offset, stop_offset), the position
    the walk stopped at, the last batch's position, the offset after the last batch
    looked at, that batch's last offset or -1, max_bytes less the bytes walked).
    None, having changed nothing, for anything else and without the compiled
    accelerator: the caller's Python walk then reports what is wrong, precisely."""
    if _walk is None:
        return None
    got = _walk(buf, base, pos, offset, size, topic, partition, max_records, max_bytes,
                stop_offset, -1 if exact is None else int(exact), Record, crc32c)
    return None if got is NotImplemented else got


if _speedups is not None:
    _walk = _speedups.walk_batches
    _c_decode = _speedups.decode_records
    _decode_records = _decode_records_c
    _encode_records = _speedups.encode_records
    _check_records = _speedups.check_records
else:
    _walk = None
    _decode_records = _decode_records_py
    _encode_records = _encode_records_py
    _check_records = _check_records_py


# ---- a cleaned batch (cleaner.py) ------------------------------------------------------

ATTR_DELETE_HORIZON = 0x40        # KIP-534: baseTimestamp holds the tombstones' horizon


def rebuild_batch(buf: Any, pos: int, header: BatchHeader, kept: Sequence[Record], *,
                  delete_horizon_ms: int | None = None) -> bytearray:
    """The batch at `pos` with only the records `kept` (a subset of its own, decoded
    from it), as Kafka's cleaner rewrites one (MemoryRecords.filterTo): baseOffset,
    lastOffsetDelta, partitionLeaderEpoch, codec, timestamp type and the producer fields
    stay, so offsets never change and the batch still ends where it ended; each record
    keeps its offset delta and timestamp. With `delete_horizon_ms` the batch is stamped
    with that horizon (ATTR_DELETE_HORIZON; baseTimestamp = horizon). An empty `kept`
    makes an empty batch (recordsCount 0), which still carries the offsets' span."""
    attributes = header.attributes
    append_time = attributes & ATTR_TIMESTAMP_TYPE
    if delete_horizon_ms is not None:
        attributes |= ATTR_DELETE_HORIZON
        base_ts = delete_horizon_ms
    elif attributes & ATTR_DELETE_HORIZON:
        base_ts = header.base_timestamp
    else:
        base_ts = kept[0].timestamp if kept and not append_time else header.base_timestamp
    base_offset = header.base_offset
    parts: list[bytes] = []
    for record in kept:
        ts_delta = 0 if append_time else record.timestamp - base_ts
        key, value = record.key, record.value
        body = [b"\x00", _varint(ts_delta), _varint(record.offset - base_offset),
                _NULL if key is None else _varint(len(key)) + bytes(key),
                _NULL if value is None else _varint(len(value)) + bytes(value),
                _encode_headers(record.headers) if record.headers else _VARINT[0]]
        encoded = b"".join(body)
        parts.append(_varint(len(encoded)))
        parts.append(encoded)
    payload = b"".join(parts)
    codec = attributes & ATTR_CODEC_MASK
    if not kept:
        attributes &= ~ATTR_CODEC_MASK        # nothing to compress: an empty section
    elif codec != CODEC_NONE:
        payload = compress(codec, payload)
    if append_time:
        max_ts = header.max_timestamp
    else:
        max_ts = max((r.timestamp for r in kept), default=header.max_timestamp)
    batch = bytearray(RECORDS_OFFSET) + payload
    _HEADER.pack_into(batch, 0, base_offset, len(batch) - LOG_OVERHEAD,
                      header.leader_epoch, MAGIC, 0, attributes,
                      header.last_offset_delta, base_ts, max_ts, header.producer_id,
                      header.producer_epoch, header.base_sequence, len(kept))
    _restamp_crc(batch, 0)
    return batch


def batch_section(buf: Any, pos: int, header: BatchHeader) -> tuple[Any, int, int]:
    """The uncompressed records section of the batch at `pos`: (data, start, stop), the
    batch's own bytes when it is uncompressed, else its section decompressed. Raises
    ValueError when it does not decompress."""
    end = pos + LOG_OVERHEAD + header.batch_length
    codec = header.attributes & ATTR_CODEC_MASK
    if codec:
        data = decompress(codec, bytes(buf[pos + RECORDS_OFFSET:end]))
        return data, 0, len(data)
    return buf, pos + RECORDS_OFFSET, end


def rebuild_batch_section(header: BatchHeader, section: bytes, kept: int, max_ts: int, *,
                          delete_horizon_ms: int | None = None) -> bytearray:
    """`rebuild_batch` from the kept records' raw bytes (`section`, uncompressed, `kept`
    records whose timestamp deltas are relative to the batch's baseTimestamp, or to
    `delete_horizon_ms` when given: the batch is then stamped with it). The batch keeps
    its header fields as `rebuild_batch` does, and its baseTimestamp unless stamped, so
    a kept record's bytes need not change; `max_ts` is the kept records' largest
    timestamp (the header's own for LogAppendTime)."""
    attributes = header.attributes
    base_ts = header.base_timestamp
    if delete_horizon_ms is not None:
        attributes |= ATTR_DELETE_HORIZON
        base_ts = delete_horizon_ms
    codec = attributes & ATTR_CODEC_MASK
    if not kept:
        attributes &= ~ATTR_CODEC_MASK
        section = b""
        max_ts = header.max_timestamp
    elif codec != CODEC_NONE:
        section = compress(codec, section)
    if attributes & ATTR_TIMESTAMP_TYPE:
        max_ts = header.max_timestamp
    batch = bytearray(RECORDS_OFFSET + len(section))
    batch[RECORDS_OFFSET:] = section
    _HEADER.pack_into(batch, 0, header.base_offset, len(batch) - LOG_OVERHEAD,
                      header.leader_epoch, MAGIC, 0, attributes,
                      header.last_offset_delta, base_ts, max_ts, header.producer_id,
                      header.producer_epoch, header.base_sequence, kept)
    _restamp_crc(batch, 0)
    return batch


def check_cleaned_records(buf: Any, pos: int, header: BatchHeader, path: str = "") -> None:
    """`check_records` for a batch a cleaning pass may have rewritten: at most
    lastOffsetDelta + 1 records (none at all in the empty batch that keeps a cleaned
    group's end), their offsets increasing within the batch's span. Raises
    InvalidRecordError, CorruptRecordError as `check_records` does."""
    if header.records_count == header.last_offset_delta + 1:
        check_records(buf, pos, header, path)
        return
    if not 0 <= header.records_count <= header.last_offset_delta + 1:
        raise InvalidRecordError(
            "record batch holds more records than its offsets span", path=path,
            position=pos, expected=f"<= {header.last_offset_delta + 1}",
            actual=header.records_count)
    previous = header.base_offset - 1
    for record in decode_batch(buf, pos, header, "", 0, path=path, verify=False):
        if not previous < record.offset <= header.last_offset:
            raise InvalidRecordError("record offsets in a cleaned batch are out of order",
                                     path=path, position=pos,
                                     expected=f"({previous}, {header.last_offset}]",
                                     actual=record.offset)
        previous = record.offset
