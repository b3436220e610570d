"""Reads of one partition log: records, columns, raw batches, batch headers, byte ranges
and time lookups, below the high watermark (or a caller's bound).

Owns: the one prelude every read goes through (`_with_tail`: the tail snapshot, the
retry when retention removes a segment mid-read, OSError as StorageError), finding
the first segment and the batch that holds an offset, and walking segments forward
within `max_records` / `max_bytes`. Invariant: a read takes no lock and returns only
whole batches' records below the committed end it started from; a bad batch raises
`CorruptRecordError` after the good records before it were returned.

A mixin of `PartitionLog` (log.py), which owns the state it reads.
"""

from __future__ import annotations

import bisect
import logging
from typing import Any, Callable, Iterator, NamedTuple, TypeVar

from . import _fork
from .errors import (
    CorruptRecordError,
    LogkitTimeoutError,
    OffsetOutOfRangeError,
    storage_error,
)
from .log_txn import check_isolation_level
from .records import ATTR_CONTROL, BatchHeader, Record
from .segment import LogSegment
from .tail import Tail

log = logging.getLogger("logkit.log")

MAX_FETCH_BYTES = 52428800            # Kafka's fetch.max.bytes default: one read's bound
BATCHES_SINCE_MAX_BYTES = 1 << 20     # batches_since() bound (one batch at least)
READ_RETRIES = 100                    # a retention run may pull segments from a read
_T = TypeVar("_T")




class Fetched(NamedTuple):
    """What `Partition.fetch_records` returns: the records, the offset the next read
    starts at (past offsets that held no record for the caller), and the partition's
    high watermark and last stable offset at the read."""

    records: list[Record]
    next_offset: int
    high_watermark: int
    last_stable_offset: int


class _LogReads:
    """The reads of `PartitionLog` (see the module docstring)."""

    def _with_tail(self, reader: Callable[..., _T], *args: Any) -> _T:
        """`reader(tail, *args)` under the thread lock, with a fresh tail: the prelude of
        every read. A segment file that retention renames away meanwhile makes the read
        start over with a new segment list; other I/O errors raise StorageError."""
        for _ in range(READ_RETRIES):
            tail = self.tail()            # may take the lock: never under _thread_lock
            with self._thread_lock:       # segments and their maps are shared by threads
                # closed meanwhile (under this lock) or forked: the full check raises;
                # the deleted flag was read with the tail, a moment ago
                if self._closed or self._pid != _fork._pid:
                    self._check_usable()
                try:
                    return reader(tail, *args)
                except FileNotFoundError:
                    self._segments_version = -1
                except OSError as exc:
                    raise storage_error(exc, "read", self.directory) from exc
        raise LogkitTimeoutError(f"{self.name}: segments kept vanishing under a read")

    def read(self, offset: int, *, max_records: int = 500, max_bytes: int = MAX_FETCH_BYTES,
             stop_offset: int | None = None,
             isolation_level: str = "read_uncommitted") -> list[Record]:
        """Records from `offset` below the high watermark and below `stop_offset` (None:
        up to the high watermark).

        Raises OffsetOutOfRangeError outside [log_start_offset, high_watermark]; returns
        [] at the high watermark. Always returns at least one batch's records if any
        are available, even when that batch is bigger than `max_bytes`.
        `isolation_level="read_committed"` stops at the last stable offset and leaves
        out the records of aborted transactions (log_txn.py); control batches are never
        returned."""
        if max_records <= 0:
            raise ValueError("max_records must be positive")
        if check_isolation_level(isolation_level):
            return self._with_tail(self._read_committed, offset, max_records, max_bytes,
                                   stop_offset)[0]
        return self._with_tail(self._read, offset, max_records, max_bytes, stop_offset)

    def fetch(self, offset: int, *, max_records: int = 500,
              max_bytes: int = MAX_FETCH_BYTES,
              isolation_level: str = "read_uncommitted") -> tuple[list[Record], int]:
        """`read(offset)` and the high watermark it read below, from one tail snapshot
        (a Kafka fetch response carries the partition's high watermark the same way):
        a reader whose position reached it has read everything there was. With
        read_committed, the records below the last stable offset and that offset."""
        if max_records <= 0:
            raise ValueError("max_records must be positive")
        if check_isolation_level(isolation_level):
            return self._with_tail(self._fetch_committed, offset, max_records, max_bytes)
        return self._with_tail(self._fetch, offset, max_records, max_bytes)

    def _fetch(self, tail: Tail, offset: int, max_records: int,
               max_bytes: int) -> tuple[list[Record], int]:
        return self._read(tail, offset, max_records, max_bytes, None), tail.high_watermark

    def _fetch_committed(self, tail: Tail, offset: int, max_records: int,
                         max_bytes: int) -> tuple[list[Record], int]:
        records = self._read_committed(tail, offset, max_records, max_bytes, None)[0]
        return records, self._last_stable(tail)

    def _check_in_range(self, offset: int, tail: Tail, last: int) -> None:
        """OffsetOutOfRangeError unless log_start_offset <= offset <= last."""
        if offset < tail.log_start_offset or offset > last:
            raise OffsetOutOfRangeError(f"offset {offset} is outside "
                                        f"[{tail.log_start_offset}, {last}] of {self.name}")

    def _first_segment(self, offset: int, end: int) -> int:
        """Index in the segment list of the segment holding `offset`; when there is
        something to read (offset < end), that segment must exist."""
        bases = self._bases
        i = max(0, bisect.bisect_right(bases, offset) - 1)
        if offset < end and (not bases or bases[i] > offset):
            first = bases[i] if bases else None
            raise CorruptRecordError(
                f"{self.name}: offset {offset} is in no segment (the first segment starts "
                f"at {first}); segment files are missing",
                path=self.directory, position=0, expected=offset, actual=first)
        return i

    def _next_base(self, segment: LogSegment, size: int, segment_end: int | None,
                   next_base: int) -> int:
        """Leaving `segment`, read to its end (`segment_end`: the offset after its last
        batch, None when the walk saw none): it must end where the next segment
        begins, or a missing or truncated segment would be a silent gap."""
        if segment_end is None:
            segment_end = segment.end_offset(size)
        if segment_end != next_base:
            raise CorruptRecordError(
                "segment ends before the next segment begins (missing or truncated "
                "segment)", path=segment.path, position=size, expected=next_base,
                actual=segment_end)
        return next_base

    def _read(self, tail: Tail, offset: int, max_records: int, max_bytes: int,
              stop_offset: int | None) -> list[Record]:
        if tail.segments_version != self._segments_version:
            self._refresh(tail)
        end = tail.high_watermark if stop_offset is None else min(stop_offset,
                                                                  tail.high_watermark)
        self._check_in_range(offset, tail, tail.high_watermark)
        bases = self._bases
        i = self._first_segment(offset, end)
        out: list[Record] = []
        walked = -1            # the offset after the last batch the walk looked at
        while offset < end and i < len(bases) and len(out) < max_records and max_bytes > 0:
            segment, size = self._sized(bases[i], tail)
            try:
                records, used = segment.read(offset, size, self.topic, self.partition,
                                             max_records=max_records - len(out),
                                             max_bytes=max_bytes, stop_offset=end)
            except CorruptRecordError:
                if out:          # the good records first; the next read starts there
                    break
                raise
            if records:
                if not out:
                    out = records
                else:
                    out.extend(records)
                offset = records[-1].offset + 1
            max_bytes -= used
            walked = segment.scan_end_offset
            if len(out) >= max_records or max_bytes <= 0 or not segment.scanned_to_end:
                break
            i += 1
            if i < len(bases):
                offset = max(offset, self._next_base(segment, size, segment.scan_end_offset,
                                                     bases[i]))
        self._walked_to = walked if walked >= 0 else offset
        return out

    def fetch_records(self, offset: int, *, max_records: int = 500,
                      max_bytes: int = MAX_FETCH_BYTES, stop_offset: int | None = None,
                      isolation_level: str = "read_uncommitted") -> Fetched:
        """`read(offset)` and where the next read starts: `Fetched(records,
        next_offset, high_watermark, last_stable_offset)`, from one tail snapshot.
        `next_offset` is past every batch the read walked, also those that gave the
        caller no record (a compacted log's removed records, control batches, aborted
        transactions), or one past the last record when `max_records` cut a batch
        short. A reader that moves its position to `next_offset` never stalls below
        the high watermark on offsets that hold no record."""
        if max_records <= 0:
            raise ValueError("max_records must be positive")
        if check_isolation_level(isolation_level):
            return self._with_tail(self._fetch_records_committed, offset, max_records,
                                   max_bytes, stop_offset)
        return self._with_tail(self._fetch_records, offset, max_records, max_bytes,
                               stop_offset)

    def _fetch_records(self, tail: Tail, offset: int, max_records: int, max_bytes: int,
                       stop_offset: int | None) -> Fetched:
        records, next_offset = self._read_next(tail, offset, max_records, max_bytes,
                                               stop_offset)
        return Fetched(records, next_offset, tail.high_watermark, self._last_stable(tail))

    def _fetch_records_committed(self, tail: Tail, offset: int, max_records: int,
                                 max_bytes: int, stop_offset: int | None) -> Fetched:
        records, next_offset = self._read_committed(tail, offset, max_records, max_bytes,
                                                    stop_offset)
        return Fetched(records, next_offset, tail.high_watermark, self._last_stable(tail))

    def _read_next(self, tail: Tail, offset: int, max_records: int, max_bytes: int,
                   stop_offset: int | None) -> tuple[list[Record], int]:
        """`_read` and the offset the next read starts at (see `fetch_records`)."""
        end = tail.high_watermark if stop_offset is None else min(stop_offset,
                                                                  tail.high_watermark)
        out = self._read(tail, offset, max_records, max_bytes, stop_offset)
        walked = self._walked_to
        if out and len(out) >= max_records:
            return out, out[-1].offset + 1
        next_offset = max(out[-1].offset + 1 if out else offset, walked)
        return out, max(offset, min(next_offset, end))

    def batches_since(self, offset: int, upto: int | None = None, *,
                      max_bytes: int = BATCHES_SINCE_MAX_BYTES) -> bytes:
        """The stored bytes of whole batches, from the batch holding `offset` up to the
        high watermark (or up to `upto`, at most the log end: a replica fetch passes
        upto=log_end_offset), byte-identical to the segment files.

        Batches are whole: the walk stops before the first batch whose base offset is
        >= the limit, and after about `max_bytes` (always at least one batch). Returns
        b"" at the limit; raises OffsetOutOfRangeError below the log start or above the
        log end."""
        return self._with_tail(self._batches_since, offset, upto, max_bytes)

    def _batches_since(self, tail: Tail, offset: int, upto: int | None,
                       max_bytes: int) -> bytes:
        return b"".join(bytes(segment.view(size)[start:stop]) for segment, size, start, stop
                        in self._batch_spans(tail, offset, upto, max_bytes))

    def batch_file_ranges(self, offset: int, upto: int | None = None, *,
                          max_bytes: int = BATCHES_SINCE_MAX_BYTES
                          ) -> list[tuple[str, int, int]]:
        """Where the bytes `batches_since` would return lie: (segment file path,
        position, length) per segment touched, in order, each a run of whole batches
        below the segment's committed size (for shipping them with sendfile)."""
        return self._with_tail(self._batch_file_ranges, offset, upto, max_bytes)

    def _batch_file_ranges(self, tail: Tail, offset: int, upto: int | None,
                           max_bytes: int) -> list[tuple[str, int, int]]:
        return [(segment.path, start, stop - start) for segment, _, start, stop
                in self._batch_spans(tail, offset, upto, max_bytes)]

    def _batch_spans(self, tail: Tail, offset: int, upto: int | None,
                     max_bytes: int) -> Iterator[tuple[LogSegment, int, int, int]]:
        """(segment, committed size, start, stop) of the runs of whole batches that
        batches_since() and batch_file_ranges() cover, one segment at a time: the
        caller takes what it needs from a span before the next segment is opened,
        because opening one may close another (MAX_OPEN_SEGMENTS)."""
        self._refresh(tail)
        self._check_in_range(offset, tail, tail.log_end_offset)
        end = tail.high_watermark if upto is None else min(upto, tail.log_end_offset)
        if offset >= end:
            return
        bases = list(self._bases)
        i = self._first_segment(offset, end)
        spans = 0
        budget = max_bytes
        while i < len(bases):
            segment, size = self._sized(bases[i], tail)
            start = stop = segment.find(offset, size)
            segment_end = None
            full = False
            for pos, header in segment.headers(start, size):
                if header.base_offset >= end or (header.size > budget
                                                 and (spans or stop > start)):
                    full = True
                    break
                budget -= header.size
                stop = pos + header.size
                segment_end = header.last_offset + 1
            i += 1
            last = full or i == len(bases) or (segment_end is not None
                                               and segment_end >= end)
            following = None if last else self._next_base(segment, size, segment_end,
                                                          bases[i])
            if stop > start:
                spans += 1
                yield segment, size, start, stop
            if last:
                break
            offset = following

    def read_columns(self, offset: int, columns: Any, *, stop_offset: int,
                     max_records: int) -> int:
        """Decode records from `offset` (below stop_offset and the high watermark) into
        `columns` (a columns.Columns), adding at least one batch's records and about
        max_records; returns the next offset to read. Raises OffsetOutOfRangeError like
        read()."""
        return self._with_tail(self._read_columns, offset, columns, stop_offset,
                               max_records)

    def _read_columns(self, tail: Tail, offset: int, columns: Any, stop_offset: int,
                      max_records: int) -> int:
        self._refresh(tail)
        self._check_in_range(offset, tail, tail.high_watermark)
        end = min(stop_offset, tail.high_watermark)
        bases = list(self._bases)
        i = self._first_segment(offset, end)
        target = columns.count + max_records
        while offset < end and i < len(bases) and columns.count < target:
            segment, size = self._sized(bases[i], tail)
            buf = segment.view(size)
            segment_end = None
            for pos, header in segment.headers(segment.find(offset, size), size):
                if header.base_offset >= end:
                    return end                 # every offset below `end` was read
                if not header.attributes & ATTR_CONTROL:
                    columns.add_batch(buf, pos, header, min_offset=offset,
                                      stop_offset=end, path=segment.path)
                segment_end = header.last_offset + 1
                offset = min(segment_end, end)
                if columns.count >= target or offset >= end:
                    return offset              # stopped inside this segment
            i += 1                             # this segment is done: the next one
            if i < len(bases):
                offset = max(offset, self._next_base(segment, size, segment_end, bases[i]))
        return offset

    def batch_headers(self, start_offset: int) -> list[BatchHeader]:
        """Headers of the committed batches whose last offset >= start_offset (CRC not
        checked). For idempotence checks that look for a producer's batches."""
        return self._with_tail(self._batch_headers, start_offset)

    def _batch_headers(self, tail: Tail, start_offset: int) -> list[BatchHeader]:
        self._refresh(tail)
        bases = list(self._bases)
        out = []
        for i, base in enumerate(bases):
            if i + 1 < len(bases) and bases[i + 1] <= start_offset:
                continue                      # wholly below start_offset
            segment, size = self._sized(base, tail)
            start = segment.find(start_offset, size)
            out.extend(header for _, header in segment.headers(start, size))
        return out

    def offset_for_timestamp(self, timestamp_ms: int) -> int | None:
        """Earliest offset whose timestamp >= timestamp_ms, None if there is none."""
        return self._with_tail(self._offset_for_timestamp, timestamp_ms)

    def _offset_for_timestamp(self, tail: Tail, timestamp_ms: int) -> int | None:
        self._refresh(tail)
        for base in list(self._bases):
            segment, size = self._sized(base, tail)
            max_ts = tail.max_timestamp if segment.active else \
                segment.largest_timestamp(size)
            if max_ts < timestamp_ms and not segment.active:
                continue
            found = segment.offset_for_timestamp(timestamp_ms, size)
            if found is not None and found < tail.high_watermark:
                return max(found, tail.log_start_offset)
        return None
