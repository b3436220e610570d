"""Decoding record batches into column buffers, for readers that want columns (the
Spark data source builds Arrow arrays from them without a Python object per record).

Owns: `Columns`, seven growing buffers in native byte order: offsets int64, timestamps
int64, key end positions int32, key bytes, value end positions int32, value bytes, and
one null-flag byte per record (bit 0: null key, bit 1: null value). The end-position
buffers start with a 0, so they are Arrow's binary offsets as they stand.

Invariant: the buffers always describe `count` whole records in offset order; a batch
whose CRC or body is bad raises CorruptRecordError and adds nothing past the bad record.
The compiled `_speedups.decode_columns` does the work when `_native` chose it (a
module global here, looked up at each call, so tests can switch it off); the
pure-Python path (via the record decoder) gives the same buffers.
"""

from __future__ import annotations

import logging
import struct
from typing import Any

from ._native import speedups as _speedups
from .compression import decompress
from .errors import CorruptRecordError
from .records import (ATTR_CODEC_MASK, ATTR_TIMESTAMP_TYPE, LOG_OVERHEAD, RECORDS_OFFSET,
                      BatchHeader, _decode_records_py, check_batch)

__all__ = ["Columns"]

log = logging.getLogger(__name__)

_I64 = struct.Struct("=q")
_I32 = struct.Struct("=i")


class Columns:
    """Growing column buffers for one chunk of records (under 2 GiB of keys/values)."""

    def __init__(self) -> None:
        self.offsets = bytearray()
        self.timestamps = bytearray()
        self.key_ends = bytearray(_I32.pack(0))
        self.keys = bytearray()
        self.value_ends = bytearray(_I32.pack(0))
        self.values = bytearray()
        self.nulls = bytearray()
        self.count = 0

    def _buffers(self) -> list[bytearray]:
        return [self.offsets, self.timestamps, self.key_ends, self.keys, self.value_ends,
                self.values, self.nulls]

    def add_batch(self, buf: Any, pos: int, header: BatchHeader, *, min_offset: int,
                  stop_offset: int, path: str = "") -> int:
        """Append the batch's records in [min_offset, stop_offset); returns how many."""
        check_batch(buf, pos, header, path)
        end = pos + LOG_OVERHEAD + header.batch_length
        codec = header.attributes & ATTR_CODEC_MASK
        append_time = header.max_timestamp if header.attributes & ATTR_TIMESTAMP_TYPE else -1
        try:
            if codec:
                data: Any = decompress(codec, bytes(buf[pos + RECORDS_OFFSET:end]))
                start, stop = 0, len(data)
            else:
                data, start, stop = buf, pos + RECORDS_OFFSET, end
            if _speedups is not None:
                added = _speedups.decode_columns(
                    data, start, stop, header.records_count, header.base_offset,
                    header.base_timestamp, append_time, min_offset, stop_offset,
                    self._buffers())
            else:
                added = self._add_py(data, start, stop, header, min_offset, stop_offset)
        except (IndexError, ValueError, UnicodeDecodeError, struct.error) as exc:
            raise CorruptRecordError(f"record batch body is malformed: {exc}", path=path,
                                     position=pos) from None
        self.count += added
        return added

    def _add_py(self, data: Any, start: int, stop: int, header: BatchHeader,
                min_offset: int, stop_offset: int) -> int:
        if not isinstance(data, bytes):
            data, start, stop = bytes(data[start:stop]), 0, stop - start
        added = 0
        for record in _decode_records_py(data, start, stop, header, "", 0, min_offset):
            if record.offset >= stop_offset:
                break
            self.offsets += _I64.pack(record.offset)
            self.timestamps += _I64.pack(record.timestamp)
            if record.key is not None:
                self.keys += record.key
            if record.value is not None:
                self.values += record.value
            self.key_ends += _I32.pack(len(self.keys))
            self.value_ends += _I32.pack(len(self.values))
            self.nulls.append((record.key is None) | (record.value is None) << 1)
            added += 1
        return added
