"""Whole record batches for tools that move them: build one, stamp a producer's
identity on one, walk the batches of a segment file.

Owns: three public helpers (`BatchBuilder`, `stamp_producer`, `iter_segment_batches`)
that Spark's writer and the `logkit dump` command use instead of the private `records`
module (docs/design.md §5). Invariant: no byte layout lives here: sizes, offsets, CRCs and the
walk over a buffer are `records.py`'s, and these functions only check their arguments
and call it. Any thread may use them; a `BatchBuilder` belongs to one thread at a time.
"""

from __future__ import annotations

import mmap
import os
from typing import Any, Iterator, NamedTuple, Sequence

from . import records
from .compression import codec_id, require
from .errors import ConfigError, CorruptRecordError, IllegalStateError, storage_error
from .records import (RECORDS_OFFSET, BatchHeader, Record, encode_batch,
                      record_size_estimate)

__all__ = ["BatchBuilder", "SegmentBatch", "stamp_producer", "iter_segment_batches"]

DEFAULT_LIMIT_BYTES = 16384                    # Kafka's batch.size default


def _as_bytes(data: Any, what: str) -> bytes | None:
    if data is None or type(data) is bytes:
        return data
    if isinstance(data, (bytes, bytearray, memoryview)):
        return bytes(data)
    raise TypeError(f"a record's {what} must be bytes or None, got {type(data).__name__}")


def _as_headers(headers: Any) -> list[tuple[str, bytes | None]] | None:
    if not headers:
        return None
    out = []
    for pair in headers:
        if not isinstance(pair, (tuple, list)) or len(pair) != 2 \
                or not isinstance(pair[0], str):
            raise ConfigError(f"each header must be a (str, bytes) pair, got {pair!r}")
        out.append((pair[0], _as_bytes(pair[1], f"header {pair[0]!r} value")))
    return out


class BatchBuilder:
    """Collects records for one Kafka record batch (magic 2), as Kafka's
    MemoryRecordsBuilder does, and encodes them with `build()`.

    `try_append` takes a record only while the batch stays within `limit_bytes` (by
    records.py's per-record size estimate, an upper bound for uncompressed records)
    and `max_records`; the first record always goes in, so one record larger than the
    limit makes a batch of its own. `append` takes a record regardless.
    `build()` returns a bytearray ready for `Partition.append_batch`: baseOffset 0,
    no producer id (see `stamp_producer`), a timestamp of None meaning the build time.

        builder = logkit.BatchBuilder(limit_bytes=65536)
        for key, value in rows:
            if not builder.try_append(key, value):
                partition.append_batch(builder.build())
                builder = logkit.BatchBuilder(limit_bytes=65536)
                builder.append(key, value)
    """

    def __init__(self, *, limit_bytes: int = DEFAULT_LIMIT_BYTES,
                 max_records: int | None = None,
                 compression_type: str | None = None) -> None:
        if isinstance(limit_bytes, bool) or not isinstance(limit_bytes, int) \
                or limit_bytes <= RECORDS_OFFSET:
            raise ConfigError(f"limit_bytes must be an integer above {RECORDS_OFFSET} (a "
                              f"batch header), got {limit_bytes!r}")
        if max_records is not None and (isinstance(max_records, bool)
                                        or not isinstance(max_records, int)
                                        or max_records < 1):
            raise ConfigError(f"max_records must be None or a positive integer, got "
                              f"{max_records!r}")
        self._codec = codec_id(compression_type)
        require(self._codec)
        self.limit_bytes = limit_bytes
        self.max_records = max_records
        self._rows: list[tuple] = []
        self._size_bytes = RECORDS_OFFSET

    def __len__(self) -> int:
        return len(self._rows)

    def __repr__(self) -> str:
        return (f"BatchBuilder({len(self._rows)} record(s), about {self._size_bytes} of "
                f"{self.limit_bytes} bytes)")

    @property
    def size_estimate_bytes(self) -> int:
        """About how many bytes the batch takes uncompressed (an upper bound)."""
        return self._size_bytes

    def try_append(self, key: bytes | None, value: bytes | None,
                   headers: Sequence[tuple[str, bytes | None]] | None = None,
                   timestamp_ms: int | None = None) -> bool:
        """Add the record if it fits (see the class docstring); False, adding nothing,
        when it does not."""
        key, value = _as_bytes(key, "key"), _as_bytes(value, "value")
        headers = _as_headers(headers)
        size = record_size_estimate(key, value, headers)
        rows = self._rows
        if rows and (self._size_bytes + size > self.limit_bytes
                     or (self.max_records is not None and len(rows) >= self.max_records)):
            return False
        rows.append((key, value, headers, timestamp_ms))
        self._size_bytes += size
        return True

    def append(self, key: bytes | None, value: bytes | None,
               headers: Sequence[tuple[str, bytes | None]] | None = None,
               timestamp_ms: int | None = None) -> None:
        """Add the record whatever the limits."""
        key, value = _as_bytes(key, "key"), _as_bytes(value, "value")
        headers = _as_headers(headers)
        self._rows.append((key, value, headers, timestamp_ms))
        self._size_bytes += record_size_estimate(key, value, headers)

    def build(self, *, now_ms: int | None = None) -> bytearray:
        """The encoded batch of the records added so far (IllegalStateError when there
        are none); records without a timestamp get `now_ms`, default now."""
        if not self._rows:
            raise IllegalStateError("BatchBuilder.build(): no records were appended")
        return encode_batch(self._rows, codec=self._codec, now_ms=now_ms)


_PRODUCER_FIELDS = (("producer_id", 63), ("producer_epoch", 15), ("base_sequence", 31))


def stamp_producer(batch: bytearray, producer_id: int, producer_epoch: int,
                   base_sequence: int) -> None:
    """Set Kafka's idempotent-producer fields (producerId, producerEpoch, baseSequence)
    of one encoded batch in place and recompute its CRC, so that a writer can find its
    own batches again with `Partition.batch_headers` (Spark's exactly-once commit does).
    Each value is a signed integer of its Kafka width (int64, int16, int32); -1 means
    none."""
    if not isinstance(batch, bytearray):
        raise TypeError(f"stamp_producer changes a batch in place: pass a bytearray, got "
                        f"{type(batch).__name__}")
    values = (producer_id, producer_epoch, base_sequence)
    for (name, bits), value in zip(_PRODUCER_FIELDS, values):
        if isinstance(value, bool) or not isinstance(value, int) \
                or not -(1 << bits) <= value < 1 << bits:
            raise ConfigError(f"{name} must be an integer that fits in int{bits + 1}, got "
                              f"{value!r}")
    header = records.read_header(batch, 0, len(batch))
    if header is None or header.size != len(batch):
        raise CorruptRecordError("stamp_producer needs exactly one whole batch",
                                 expected=len(batch))
    records.stamp_producer(batch, producer_id, producer_epoch, base_sequence)


class SegmentBatch(NamedTuple):
    """One batch of a segment file: where it starts, its header, and its records when
    they were asked for (None otherwise; a control batch has [])."""

    position: int
    header: BatchHeader
    records: list[Record] | None


def iter_segment_batches(path: str | os.PathLike[str], *,
                         decode: bool = False) -> Iterator[SegmentBatch]:
    """Walk the batches of one segment file (`NNNNNNNNNNNNNNNNNNNN.log`) on its own,
    for inspection (`logkit dump`): no broker, no lock, nothing written.

    Every batch's CRC is checked before it is yielded; with `decode` its records are
    decoded too (offsets as stored, topic "" and partition 0, since a file does not
    know them). A torn or corrupt batch raises CorruptRecordError with the path and
    the batch's position, after the valid batches before it were yielded. An empty
    file yields nothing. An OSError becomes StorageError naming the path."""
    path = os.fspath(path)
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size == 0:
                return
            buffer = mmap.mmap(f.fileno(), size, access=mmap.ACCESS_READ)
    except OSError as exc:
        raise storage_error(exc, "read segment file", path) from exc
    try:
        for position, header in records.iter_batches(buffer, 0, size, path, verify=True):
            decoded = None
            if decode:
                decoded = [] if header.is_control else records.decode_batch(
                    buffer, position, header, "", 0, path=path, verify=False)
            yield SegmentBatch(position, header, decoded)
    finally:
        buffer.close()
