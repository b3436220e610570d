"""One log segment: a `.log` file of record batches plus its offset and time indexes.

Owns: Kafka's file names (`%020d.log`, `.index`, `.timeindex`) and removing a segment's
files (`unlink_segment`, `retire_segment` to `.deleted`), appending a stamped batch at
a byte position, finding and decoding the batches at or after an offset, the time
lookup, and recovery of this one file (validate each batch, rebuild both indexes,
truncate at the first bad byte, report the bytes cut and why). Batch bytes are walked
with `records.iter_batches`; the two hot read loops (`_find`, `_read`) are its inlined
twins, with the same errors.

Invariant: bytes [0, size) of the `.log` file are whole, CRC-valid batches with
contiguous offsets starting at `base_offset`. The CRC leaves out baseOffset, so reads
check it instead against the chain: each batch starts one past the previous batch's
last offset, and the first batch scanned matches its index entry (or `base_offset`). `size` comes from the caller
(the partition's tail state for the active segment, the file size for sealed ones), so a
reader never looks at bytes an appender in another process is still writing.

Readers map the file with mmap and remap only when asked to read past the mapped length;
a seek into a sealed segment that is not mapped preads the bytes it needs instead
(`_read_window`), and a sealed segment can be parked (`park`): its `.log` closed, its
index maps kept, so a random reader neither maps a file nor re-maps an index per read.
"""

from __future__ import annotations

import errno
import logging
import mmap
import os
from typing import Any, Iterator, NamedTuple

from ._native import appendpath
from .errors import CorruptRecordError
from .index import OffsetIndex, TimeIndex
from .records import (ATTR_CONTROL, FIELD_BASE_OFFSET, FIELD_BATCH_LENGTH,
                      FIELD_LAST_OFFSET_DELTA, FIELD_MAGIC, LOG_OVERHEAD, MAGIC,
                      MIN_BATCH_LENGTH, RECORDS_OFFSET, TORN_BATCH, BatchHeader, Record,
                      _HEADER, decode_batch, iter_batches, out_of_sequence, read_header,
                      walk_clean)

__all__ = ["LogSegment", "SegmentRecovery", "segment_file_name", "parse_segment_name",
           "unlink_segment", "retire_segment", "DELETED_SUFFIX"]

log = logging.getLogger(__name__)

PREAD_MAX_BYTES = 1 << 20      # tail reads up to this size use pread instead of a remap
# A seek into an unmapped sealed segment preads the headers from its index entry on,
# HOP_BYTES at a time, for at most MAX_HOPS batches, then the batch it wants and, when
# the read wants more, up to WINDOW_BYTES after it (`_read_window`).
HOP_BYTES = 8 << 10
MAX_HOPS = 64
WINDOW_BYTES = 64 << 10
# A reader drops the map's pages it has read past, in steps of this many bytes, keeping
# the last DROP_BEHIND_KEEP_BYTES below its position: see `_drop_behind`.
DROP_BEHIND_BYTES = 8 << 20
DROP_BEHIND_KEEP_BYTES = 1 << 20
SEGMENT_SUFFIXES = (".log", ".index", ".timeindex")
DELETED_SUFFIX = ".deleted"

_unpack_header = _HEADER.unpack_from
_make_header = BatchHeader._make


# A batch's pwrite keeps the GIL up to 256 KiB (logkit/_appendpath.c; see log.py's flock).
_pwrite = os.pwrite if appendpath is None else appendpath.pwrite


def segment_file_name(base_offset: int, suffix: str) -> str:
    return f"{base_offset:020d}{suffix}"


def parse_segment_name(name: str) -> int | None:
    """Base offset of a `.log` file name, or None if it is not one."""
    if len(name) == 24 and name.endswith(".log") and name[:20].isdigit():
        return int(name[:20])
    return None


def unlink_segment(directory: str, base_offset: int) -> int:
    """Remove a segment's three files; returns the log bytes removed."""
    removed = 0
    for suffix in SEGMENT_SUFFIXES:
        path = os.path.join(directory, segment_file_name(base_offset, suffix))
        if os.path.exists(path):
            if suffix == ".log":
                removed = os.path.getsize(path)
            os.unlink(path)
    return removed


def retire_segment(directory: str, base_offset: int) -> None:
    """Rename a segment's files `.deleted` (unlinked after file.delete.delay.ms, so a
    reader that has one open keeps reading)."""
    for suffix in SEGMENT_SUFFIXES:
        path = os.path.join(directory, segment_file_name(base_offset, suffix))
        try:
            os.rename(path, path + DELETED_SUFFIX)
        except FileNotFoundError:
            pass


class SegmentRecovery(NamedTuple):
    """What `LogSegment.recover` found: the valid size and the bytes cut after it, the
    offset after the last valid batch, the largest timestamp and its offset, and why
    the cut was made (None when nothing was cut)."""

    size: int
    bytes_cut: int
    next_offset: int
    max_timestamp: int
    max_timestamp_offset: int
    cause: CorruptRecordError | None


class LogSegment:
    """A `.log` file and its two indexes. Not thread-safe; the partition log serialises."""

    def __init__(self, directory: str, base_offset: int, *, active: bool,
                 index_entries: int | None = None, timeindex_entries: int | None = None,
                 create_index_bytes: int = 0, read_only: bool = False) -> None:
        """Open a segment. `active` maps its indexes writable with entry counts given
        by the tail state; a sealed segment's entries are its index file sizes.
        `create_index_bytes` > 0 creates all three files (appender, under the lock)."""
        self.directory = directory
        self.base_offset = base_offset
        self.path = os.path.join(directory, segment_file_name(base_offset, ".log"))
        self.index_path = os.path.join(directory, segment_file_name(base_offset, ".index"))
        self.timeindex_path = os.path.join(directory,
                                           segment_file_name(base_offset, ".timeindex"))
        self.active = active
        self._index_entries = index_entries
        self._timeindex_entries = timeindex_entries
        self._offset_index: OffsetIndex | None = None
        self._time_index: TimeIndex | None = None
        self.read_only = read_only     # an inspection open: no file is changed
        flags = os.O_RDONLY if read_only else \
            os.O_RDWR | (os.O_CREAT | os.O_EXCL if create_index_bytes else 0)
        self._flags = flags & ~(os.O_CREAT | os.O_EXCL) | os.O_NOFOLLOW | os.O_CLOEXEC
        self._fd = os.open(self.path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        self._identity: tuple[int, int] | None = None   # (st_dev, st_ino) once sealed
        self._mmap: mmap.mmap | None = None
        self._mapped = 0
        self._dropped = 0              # pages of the map below this were dropped
        # (next offset, position of the first batch whose last offset >= it, whether
        # that batch must start exactly at next offset): where the previous read
        # stopped, so a sequential reader skips the index scan.
        self._cursor: tuple[int, int, bool] | None = None
        # Set by each read: whether it scanned to the end of the segment, and the offset
        # after the last batch it saw there (the caller checks the next segment starts
        # exactly there).
        self.scanned_to_end = False
        self.scan_end_offset = -1
        # A compacted partition's segments (the owner sets it): batches may start past
        # the previous one's end and hold fewer records than their offset span.
        self.gaps = False
        try:
            self.sealed_size = -1
            if not active:
                self._adopt_sealed_file()
            if create_index_bytes:
                self._create_indexes(create_index_bytes)
        except BaseException:
            self.close()
            raise

    # ---- files ---------------------------------------------------------------------

    def file_size(self) -> int:
        return os.fstat(self._fd).st_size

    def _adopt_sealed_file(self) -> None:
        """Take the open `.log` file as this sealed segment's: its size, and which file
        it is (so `unpark` knows whether the name still means the same file)."""
        stat = os.fstat(self._fd)
        self.sealed_size = stat.st_size
        self._identity = (stat.st_dev, stat.st_ino)

    @property
    def identity(self) -> tuple[int, int] | None:
        """(st_dev, st_ino) of a sealed segment's `.log` file: which file it is."""
        return self._identity

    # ---- parking (a sealed segment kept without a descriptor) ------------------------

    @property
    def parked(self) -> bool:
        return self._fd < 0 and self._identity is not None

    def park(self) -> None:
        """Close the `.log` file (its descriptor and map) of this sealed segment but keep
        its index maps, which hold no descriptor (index.py), its size and its read
        cursor: a later read `unpark`s it without re-mapping and re-faulting the
        indexes, the bulk of reopening a segment. A parked segment holds no descriptor
        and no resident `.log` pages."""
        if self.active or self._identity is None:
            raise ValueError("only a sealed segment is parked")
        self._release_view()
        self._dropped = 0
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def unpark(self) -> bool:
        """Reopen a parked segment's `.log`. False (and the segment closed) when the name
        no longer means the file that was parked — removed, or replaced by a
        truncation's copy — so the caller opens the segment afresh; the kept indexes
        belong to the old file."""
        try:
            fd = os.open(self.path, self._flags)
        except FileNotFoundError:
            self.close()
            return False
        try:
            stat = os.fstat(fd)
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        if (stat.st_dev, stat.st_ino) != self._identity or stat.st_size != self.sealed_size:
            self.close()
            return False
        return True

    @property
    def offset_index(self) -> OffsetIndex:
        if self._offset_index is None:
            self._offset_index = OffsetIndex(self.index_path, self.base_offset,
                                             writable=self.active and not self.read_only,
                                             entries=self._index_entries)
        return self._offset_index

    @property
    def time_index(self) -> TimeIndex:
        if self._time_index is None:
            self._time_index = TimeIndex(self.timeindex_path, self.base_offset,
                                         writable=self.active and not self.read_only,
                                         entries=self._timeindex_entries)
        return self._time_index

    def _create_indexes(self, index_bytes: int) -> None:
        self._close_indexes()
        self._offset_index = OffsetIndex(self.index_path, self.base_offset, writable=True,
                                         entries=0, create_bytes=index_bytes)
        self._time_index = TimeIndex(self.timeindex_path, self.base_offset, writable=True,
                                     entries=0, create_bytes=index_bytes)
        self._index_entries = self._timeindex_entries = 0

    def index_entry_counts(self) -> tuple[int, int]:
        return self.offset_index.entries, self.time_index.entries

    def seal(self, max_timestamp: int, max_timestamp_offset: int, size: int) -> None:
        """The segment stops being active: final time entry, indexes trimmed."""
        self.time_index.append(max_timestamp, max_timestamp_offset)
        self.offset_index.trim()
        self.time_index.trim()
        self.active = False
        self.sealed_size = size

    def set_index_entries(self, offset_entries: int, time_entries: int) -> None:
        """Adopt entry counts published by the appender (active segment only)."""
        self._index_entries = offset_entries
        self._timeindex_entries = time_entries
        if self._offset_index is not None:
            self._offset_index.entries = min(offset_entries, self._offset_index.capacity)
        if self._time_index is not None:
            self._time_index.entries = min(time_entries, self._time_index.capacity)

    def view(self, size: int) -> Any:
        """The mmap covering at least [0, size)."""
        if size > self._mapped:
            if self._mmap is not None:
                self._mmap.close()
            length = self.file_size()
            if length < size:
                raise CorruptRecordError("segment file is shorter than its committed size",
                                         path=self.path, position=length, expected=size,
                                         actual=length)
            self._mmap = mmap.mmap(self._fd, length, access=mmap.ACCESS_READ)
            self._mapped = length
            self._dropped = 0
        return self._mmap

    def close(self) -> None:
        for index in (self._offset_index, self._time_index):
            if index is not None:
                index.close()
        self._offset_index = self._time_index = None
        if self._mmap is not None:
            self._mmap.close()
            self._mmap = None
            self._mapped = 0
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        self._identity = None

    # ---- write ---------------------------------------------------------------------

    def write(self, batch: Any, position: int) -> None:
        """Write a stamped batch at `position` (the committed end of this segment); a
        list of the batch's pieces with one pwritev."""
        if isinstance(batch, list):
            size = sum(map(len, batch))
            written = os.pwritev(self._fd, batch, position)
        else:
            size = len(batch)
            written = _pwrite(self._fd, batch, position)
        if written != size:         # a short write to a regular file: disk full
            raise OSError(errno.ENOSPC, f"short write ({written} of {size} bytes)",
                          self.path)

    def append_files(self) -> tuple[int, Any, int, Any, int] | None:
        """What `appendpath.append_common` writes through, for an open active segment whose
        index maps are open: (the `.log` descriptor, the offset index's map and its
        reserved bytes, the time index's map and its reserved bytes); else None."""
        if not self.active or self._fd < 0 or self._offset_index is None \
                or self._time_index is None:
            return None
        offsets, times = self._offset_index.store(), self._time_index.store()
        if offsets is None or times is None:
            return None
        return (self._fd, *offsets, *times)

    def index_batch(self, last_offset: int, position: int, interval_bytes: int,
                    max_timestamp: int, max_timestamp_offset: int) -> None:
        """Add index entries for a batch just written at `position`, Kafka's way: when
        more than `interval_bytes` passed since the last entry, an offset entry for this
        batch and a time entry for the segment's max timestamp so far (if it grew)."""
        index = self.offset_index
        if not index.is_full and position - index.last_position() > interval_bytes:
            index.append(last_offset, position)
            self.time_index.append(max_timestamp, max_timestamp_offset)

    def flush_log(self) -> None:
        """fdatasync the `.log` file alone (a replica's flush.messages policy): its
        size change is flushed with the data, which is all a read needs (docs/storage.md,
        "Group commit")."""
        os.fdatasync(self._fd)

    def dup_log_fd(self) -> int:
        """A new descriptor of the `.log` file, for an fdatasync outside the partition's
        locks (group commit): the segment may be closed meanwhile; the copy stays
        valid until its owner closes it."""
        return os.dup(self._fd)

    def flush(self) -> None:
        """fsync the log and both indexes (at a roll and a clean close)."""
        os.fsync(self._fd)
        for index in (self._offset_index, self._time_index):
            if index is not None:
                index.flush()

    def truncate(self, size: int) -> None:
        """Cut bytes past `size` (garbage left by a writer that died mid-write)."""
        self._release_view()
        os.ftruncate(self._fd, size)

    # ---- read ----------------------------------------------------------------------

    def headers(self, start: int, size: int, *,
                verify: bool = False) -> Iterator[tuple[int, BatchHeader]]:
        """(position, header) of the batches in [start, size), offsets chained (from
        `base_offset` when start is 0); CRCs checked only with `verify`. Bad bytes raise
        CorruptRecordError as `records.iter_batches` defines."""
        return iter_batches(self.view(size), start, size, self.path,
                            first_offset=self.base_offset if start == 0 else None,
                            verify=verify, gaps=self.gaps)

    def _out_of_sequence(self, position: int, expected: int, actual: int) -> CorruptRecordError:
        return out_of_sequence(self.path, position, expected, actual)

    def find(self, offset: int, size: int) -> int:
        """Position of the first batch whose last offset >= offset, or `size`; that
        batch's baseOffset is checked (CorruptRecordError if it is out of sequence)."""
        pos, exact = self._find(offset, size)
        if exact is not None and pos < size:
            header = _make_header(_unpack_header(self.view(size), pos))
            self._check_first(header, pos, offset, exact)
        return pos

    def _check_first(self, header: BatchHeader, pos: int, offset: int, exact: bool) -> None:
        """The batch a cursor pointed at must start at `offset` (exact) or hold it."""
        if header.base_offset != offset if exact else \
                not header.base_offset <= offset <= header.last_offset:
            if not (self.gaps and header.base_offset >= offset):
                raise self._out_of_sequence(pos, offset, header.base_offset)

    def _find(self, offset: int, size: int) -> tuple[int, bool | None]:
        """find() without the map: (position, None) when the batch there was checked,
        else (position, exact) for the caller to check as `_check_first` does."""
        if size == 0:
            return 0, None
        cursor = self._cursor
        if cursor is not None and cursor[0] == offset and cursor[1] <= size:
            pos = cursor[1]
            if pos == size:
                return pos, None
            if pos + RECORDS_OFFSET > self._mapped:
                # past the map (a tail reader that preads): the reader checks it
                return pos, cursor[2]
            fields = _unpack_header(self._mmap, pos)
            base = fields[FIELD_BASE_OFFSET]
            if (base == offset if cursor[2] else
                    base <= offset <= base + fields[FIELD_LAST_OFFSET_DELTA]) or (
                    self.gaps and base >= offset):
                return pos, None
            # not the batch the cursor promised: scan, which checks offsets
        buf = self.view(size)
        expected_last, pos = self._checked_index_entry(buf, offset, size)
        expected_base = self.base_offset if pos == 0 else -1
        path = self.path
        # The hot twin of records.iter_batches (raw tuples, no header objects), with the
        # same errors: a torn batch, an impossible header, an out-of-sequence offset.
        while pos < size:
            if size - pos < RECORDS_OFFSET:
                raise CorruptRecordError(TORN_BATCH, path=path, position=pos, expected=size)
            fields = _unpack_header(buf, pos)
            base = fields[FIELD_BASE_OFFSET]
            length = fields[FIELD_BATCH_LENGTH]
            if fields[FIELD_MAGIC] != MAGIC or length < MIN_BATCH_LENGTH:
                read_header(buf, pos, size, path)          # raises the precise error
            delta = fields[FIELD_LAST_OFFSET_DELTA]
            last = base + delta
            # baseOffset is outside the CRC: check it against the index entry or the chain
            if expected_base >= 0 and base != expected_base and not (
                    self.gaps and base > expected_base):
                raise self._out_of_sequence(pos, expected_base, base)
            if expected_base < 0 and last != expected_last:
                raise self._out_of_sequence(pos, expected_last - delta, base)
            if last >= offset:
                return pos, None
            expected_base = last + 1
            if pos + LOG_OVERHEAD + length > size:     # a batchLength bent by a flipped bit
                raise CorruptRecordError(TORN_BATCH, path=path, position=pos, expected=size,
                                         actual=pos + LOG_OVERHEAD + length)
            pos += LOG_OVERHEAD + length
        return size, None

    def _checked_index_entry(self, buf: Any, offset: int, size: int) -> tuple[int, int]:
        """`_index_entry`, checked against the log in [0, size): a whole batch header
        must start at the entry's position and that batch must end at its offset. The
        index is derived data, so a false entry is logged and the scan starts at the
        segment's start instead (-1, 0) — slower, never wrong."""
        last, pos = self._index_entry(offset)
        if pos == 0:
            return last, pos
        if pos <= size - RECORDS_OFFSET:
            fields = _unpack_header(buf, pos)
            length = fields[FIELD_BATCH_LENGTH]
            if (fields[FIELD_MAGIC] == MAGIC and length >= MIN_BATCH_LENGTH
                    and pos + LOG_OVERHEAD + length <= size
                    and fields[FIELD_BASE_OFFSET] + fields[FIELD_LAST_OFFSET_DELTA] == last):
                return last, pos
        log.warning("%s: offset index entry (offset %d, position %d) does not match the "
                    "log; scanning from the segment's start", self.index_path, last, pos)
        return -1, 0

    def _index_entry(self, offset: int) -> tuple[int, int]:
        """(last offset of the batch there or -1, position) to scan for `offset` from."""
        try:
            return self.offset_index.lookup_entry(offset)
        except FileNotFoundError:      # a reader meeting a lost index scans from 0
            return -1, 0

    def read(self, offset: int, size: int, topic: str, partition: int, *,
             max_records: int, max_bytes: int, stop_offset: int) -> tuple[list[Record], int]:
        """Records from `offset` (below stop_offset), up to max_records and about
        max_bytes of batches (always at least one batch); also the batch bytes read."""
        if self._mmap is None and not self.active:
            cursor = self._cursor
            if cursor is None or cursor[0] != offset:      # a seek into an unmapped file
                got = self._read_window(offset, size, topic, partition, max_records,
                                        max_bytes, stop_offset)
                if got is not None:
                    return got
        pos, exact = self._find(offset, size)
        if pos >= size:
            self.scanned_to_end = True
            self.scan_end_offset = self.end_offset(size)
            return [], 0
        if size <= self._mapped or size - pos > PREAD_MAX_BYTES:
            if pos - self._dropped >= DROP_BEHIND_BYTES and self._mmap is not None:
                self._drop_behind(pos)
            return self._read(self.view(size), 0, pos, offset, size, topic, partition,
                              max_records, max_bytes, stop_offset, exact)
        # The tail grew past the map: one pread of the new bytes beats remapping the
        # file (munmap + mmap + page faults) on every poll of a reader that keeps up.
        window = os.pread(self._fd, size - pos, pos)
        try:
            return self._read(window, pos, pos, offset, size, topic, partition,
                              max_records, max_bytes, stop_offset, exact)
        except CorruptRecordError:     # report it with file positions, from the map
            self._cursor = None
            return self._read(self.view(size), 0, pos, offset, size, topic, partition,
                              max_records, max_bytes, stop_offset, exact)

    def _read_window(self, offset: int, size: int, topic: str, partition: int,
                     max_records: int, max_bytes: int, stop_offset: int
                     ) -> tuple[list[Record], int] | None:
        """read() of a sealed segment that is not mapped, by pread: the batch headers
        from the index entry for `offset` to the batch holding it (HOP_BYTES at a time),
        then that batch — with up to WINDOW_BYTES after it when the read wants more
        than it holds. A seek (a random reader, a parked segment) then costs no map of
        the file. None — the caller reads through the map, which reports every problem
        precisely — unless the window answers the whole read: the index entry checks
        out, the batch holding `offset` is found by the offset chain within
        MAX_HOPS batches, and the read stops before the window's end (or at the
        segment's end)."""
        last, pos = self._index_entry(offset)
        expected_base = self.base_offset if pos == 0 else -1
        chunk, chunk_at = b"", pos
        for _ in range(MAX_HOPS):      # `_find`'s scan, over preads of the headers
            if not 0 <= pos <= size - RECORDS_OFFSET:   # an index entry bent by a flip
                return None
            if pos + RECORDS_OFFSET > chunk_at + len(chunk):
                chunk, chunk_at = os.pread(self._fd, min(size - pos, HOP_BYTES), pos), pos
                if len(chunk) < RECORDS_OFFSET:
                    return None
            fields = _unpack_header(chunk, pos - chunk_at)
            length = fields[FIELD_BATCH_LENGTH]
            base = fields[FIELD_BASE_OFFSET]
            batch_last = base + fields[FIELD_LAST_OFFSET_DELTA]
            if fields[FIELD_MAGIC] != MAGIC or length < MIN_BATCH_LENGTH or (
                    base != expected_base if expected_base >= 0 else batch_last != last):
                return None
            if batch_last >= offset:
                break
            expected_base = batch_last + 1
            pos += LOG_OVERHEAD + length
        else:
            return None
        first = LOG_OVERHEAD + length
        if base > offset or pos + first > size:
            return None
        wanted = first if batch_last - offset + 1 >= max_records or first >= max_bytes \
            else max(first, WINDOW_BYTES)
        end = min(size, pos + wanted)
        if chunk_at + len(chunk) >= end:
            buf, at = chunk, chunk_at
        else:
            buf, at = os.pread(self._fd, end - pos, pos), pos
            if len(buf) != end - pos:
                return None
        whole = pos + first            # the end of the window's last whole batch
        while whole + RECORDS_OFFSET <= end:
            length = _unpack_header(buf, whole - at)[FIELD_BATCH_LENGTH]
            if length < MIN_BATCH_LENGTH or whole + LOG_OVERHEAD + length > end:
                break                  # (a bent length: the map path reports it)
            whole += LOG_OVERHEAD + length
        self._cursor = None
        try:
            got = self._read(buf, at, pos, offset, whole, topic, partition,
                             max_records, max_bytes, stop_offset)
        except CorruptRecordError:     # the map path reports it (_read set no cursor)
            return None
        if self.scanned_to_end and whole < size:
            if len(got[0]) < max_records and got[1] < max_bytes:
                self._cursor = None    # the window ran out before the read did
                return None
            self.scanned_to_end = False
        return got

    def _drop_behind(self, pos: int) -> None:
        """Drop from this process the map's pages a reader has gone past (below `pos`,
        less the last DROP_BEHIND_KEEP_BYTES). The map is a shared map of the file, so
        MADV_DONTNEED only unmaps them here: the page cache keeps them, and a reader
        that seeks back faults them in again with the same bytes. Without this, every
        page read through a segment's map stayed in the reader's RSS until the segment
        closed (~2 GiB per partition with the default 1 GiB segments). Records are
        copies (`decode_records`), so nothing handed out points into these pages."""
        end = (pos - DROP_BEHIND_KEEP_BYTES) & ~(mmap.PAGESIZE - 1)
        if end > self._dropped:
            try:
                self._mmap.madvise(mmap.MADV_DONTNEED, self._dropped, end - self._dropped)
            except (OSError, AttributeError):   # not Linux: the pages stay, as before
                pass
            self._dropped = end

    def _read(self, buf: Any, base: int, pos: int, offset: int, size: int, topic: str,
              partition: int, max_records: int, max_bytes: int,
              stop_offset: int, exact: bool | None = None) -> tuple[list[Record], int]:
        """read() over `buf`, which holds the file's bytes from position `base`;
        `exact` as `_find` returned it for the first batch. The walk runs in C when
        every batch is clean (`records.walk_clean`), else here, which names the fault."""
        clean = walk_clean(buf, base, pos, offset, size, topic, partition, max_records,
                           max_bytes, stop_offset, exact)
        if clean is not None:
            out, pos, last_pos, expected, last_offset, budget = clean
            self.scanned_to_end = pos >= size
            self.scan_end_offset = expected
            return self._finish_read(out, pos, last_pos, last_offset, max_records,
                                     max_bytes - budget)
        out: list[Record] = []
        budget = max_bytes
        path = self.path
        last_pos = pos
        expected = -1                  # the first batch: checked by _find or just below
        # The hot twin of records.iter_batches over a window of the file (`base`), with
        # the same errors, decoding as it goes.
        while pos < size and len(out) < max_records:
            try:
                header = read_header(buf, pos - base, size - base, path)
                if header is None:
                    raise CorruptRecordError(TORN_BATCH, path=path, position=pos,
                                             expected=size)
                if exact is not None:
                    self._check_first(header, pos, offset, exact)
                    exact = None
                elif expected >= 0 and header.base_offset != expected and not (
                        self.gaps and header.base_offset > expected):
                    raise self._out_of_sequence(pos, expected, header.base_offset)
                records = None
                if header.base_offset < stop_offset and \
                        not header.attributes & ATTR_CONTROL:   # control batches: not data
                    records = decode_batch(buf, pos - base, header, topic, partition,
                                           min_offset=offset, path=path)
            except CorruptRecordError:
                if not out:
                    raise
                # The records before the bad batch first; the next read starts at it
                # (the cursor says so) and raises.
                self.scanned_to_end = False
                self.scan_end_offset = expected
                return self._finish_read(out, pos, last_pos, out[-1].offset, max_records,
                                         max_bytes - budget)
            expected = header.last_offset + 1
            if header.base_offset >= stop_offset:
                break
            if records is not None:
                if header.last_offset >= stop_offset:
                    records = [r for r in records if r.offset < stop_offset]
                if out:
                    out.extend(records)
                else:
                    out = records
            last_pos = pos
            budget -= header.size
            pos += header.size
            if budget <= 0:
                break
        self.scanned_to_end = pos >= size
        self.scan_end_offset = expected
        return self._finish_read(out, pos, last_pos, header.last_offset if out else -1,
                                 max_records, max_bytes - budget)

    def _finish_read(self, out: list[Record], pos: int, last_pos: int, last_offset: int,
                     max_records: int, used: int) -> tuple[list[Record], int]:
        """The end of a read's walk: at most max_records, and the cursor for the next
        read (`last_offset`: that of the last batch the walk looked at)."""
        if len(out) > max_records:
            del out[max_records:]
        if out:
            next_offset = out[-1].offset + 1
            # the last batch read holds next_offset when it was cut short; else the next
            if next_offset > last_offset:
                self._cursor = (next_offset, pos, True)     # the next batch starts there
            else:
                self._cursor = (next_offset, last_pos, False)
        return out, used

    def end_offset(self, size: int) -> int:
        """The offset after the last batch in [0, size) (base_offset when empty)."""
        end = self.base_offset
        start = self._checked_index_entry(self.view(size), self.base_offset + 2**31 - 1,
                                          size)[1] if size else 0
        for _, header in self.headers(start, size):
            end = header.last_offset + 1
        return end

    @staticmethod
    def read_last_timestamp(directory: str, base_offset: int) -> int:
        """The last time index entry's timestamp of a sealed segment (-1 if none),
        without keeping the file open."""
        index = TimeIndex(os.path.join(directory, segment_file_name(base_offset,
                                                                    ".timeindex")),
                          base_offset, writable=False)
        try:
            return index.last_timestamp()
        finally:
            index.close()

    def _time_entry_matches(self, n: int, size: int) -> bool:
        """Whether time index entry `n` agrees with the log in [0, size), as the appender
        and recovery write them: the batch holding its offset ends at that offset and
        its max timestamp is the entry's (the segment's largest so far)."""
        timestamp, relative = self.time_index.entry(n)
        offset = self.base_offset + relative
        if relative < 0:
            return False
        pos = self.find(offset, size)
        if pos >= size:
            return False                     # past the log's end
        header = _make_header(_unpack_header(self.view(size), pos))
        return header.last_offset == offset and header.max_timestamp == timestamp

    def _time_entry_or_start(self, timestamp: int, size: int) -> int:
        """The offset a scan for the first record with ts >= `timestamp` starts from:
        the time index's entry, checked against the log (`_time_entry_matches`). The
        index is derived data, so a false entry is logged and the scan starts at the
        segment's start instead — slower, never wrong."""
        try:
            found = self.time_index.lookup_entry(timestamp)
        except FileNotFoundError:          # a reader meeting a lost index scans from 0
            return self.base_offset
        if found < 0:
            return self.base_offset
        if not self._time_entry_matches(found, size):
            log.warning("%s: time index entry %d %s does not match the log; scanning "
                        "from the segment's start", self.timeindex_path, found,
                        self.time_index.entry(found))
            return self.base_offset
        return self.base_offset + self.time_index.entry(found)[1]

    def largest_timestamp(self, size: int) -> int:
        """The largest record timestamp in [0, size) of a sealed segment: its time
        index's last entry (the seal writes the segment's largest there) when that
        entry matches the log, else read from the batch headers (-1 when empty)."""
        try:
            index = self.time_index
            if index.entries and self._time_entry_matches(index.entries - 1, size):
                return index.entry(index.entries - 1)[0]
        except FileNotFoundError:
            pass
        if size:
            log.warning("%s: the last time index entry does not match the log; reading "
                        "the largest timestamp from the batch headers",
                        self.timeindex_path)
        return max((header.max_timestamp for _, header in self.headers(0, size)),
                   default=-1)

    def offset_for_timestamp(self, timestamp: int, size: int) -> int | None:
        """First offset whose record timestamp >= timestamp, None if none here."""
        start_offset = self._time_entry_or_start(timestamp, size)
        pos = self.find(start_offset, size)
        buf = self.view(size)
        for pos, header in self.headers(pos, size):
            if header.max_timestamp >= timestamp and not header.is_control:
                for record in decode_batch(buf, pos, header, "", 0, path=self.path):
                    if record.timestamp >= timestamp:
                        return record.offset
        return None

    # ---- recovery ------------------------------------------------------------------

    def recover(self, *, max_message_bytes: int, interval_bytes: int, index_bytes: int,
                start_offset: int) -> SegmentRecovery:
        """Validate every batch (CRC, lengths, offsets contiguous from `start_offset`,
        at most max.message.bytes), rebuild both indexes, truncate at the first bad byte.

        The indexes are left writable and preallocated; the caller seals the segment if
        it is not the last. Must be called with the partition lock held."""
        length = self.file_size()
        self._create_indexes(index_bytes)                 # derived data: rebuilt below
        self._release_view()
        buf = self.view(length) if length else b""
        valid = 0
        next_offset = start_offset
        max_timestamp = max_timestamp_offset = -1
        cause = None
        try:
            for pos, header in iter_batches(buf, 0, length, self.path,
                                            first_offset=start_offset, verify=True,
                                            max_batch_bytes=max_message_bytes + LOG_OVERHEAD,
                                            gaps=self.gaps):
                if header.max_timestamp > max_timestamp:
                    max_timestamp = header.max_timestamp
                    max_timestamp_offset = header.last_offset
                self.index_batch(header.last_offset, pos, interval_bytes, max_timestamp,
                                 max_timestamp_offset)
                next_offset = header.last_offset + 1
                valid = pos + header.size
        except CorruptRecordError as exc:
            cause = exc                                   # cut at the bad batch's start
        self._release_view()
        if valid < length:
            os.ftruncate(self._fd, valid)
        self.active = True
        self._index_entries, self._timeindex_entries = self.index_entry_counts()
        return SegmentRecovery(valid, length - valid, next_offset, max_timestamp,
                               max_timestamp_offset, cause)

    def _close_indexes(self) -> None:
        for index in (self._offset_index, self._time_index):
            if index is not None:
                index.close()
        self._offset_index = self._time_index = None

    def _release_view(self) -> None:
        self._cursor = None
        if self._mmap is not None:
            self._mmap.close()
            self._mmap = None
            self._mapped = 0

