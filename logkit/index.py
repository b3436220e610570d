"""Sparse, mmap'd segment indexes in Kafka's formats.

Owns: `OffsetIndex` (8-byte entries: relative offset int32, position int32) and
`TimeIndex` (12-byte entries: timestamp int64, relative offset int32), both big-endian
like Kafka's. Files are sized to `segment.index.bytes` while their segment is active
and trimmed to their entries when it rolls.

Page cache and disk: an active index file is sparse past its entries, as Kafka's are;
real blocks are reserved (`posix_fallocate`) `RESERVE_STEP_BYTES` at a time just ahead
of the next entry, so a full disk raises OSError at the reservation, never a SIGBUS at
a store through the map. Every map is advised MADV_RANDOM: a fault reads one page, not
the device's read-ahead window of zeros, so index writes
grow the page cache by the pages they write.

Invariant: entries are strictly increasing in offset (and, for the time index, in
timestamp); only the first `entries` are meaningful. For an active segment the entry
count is published in the partition's tail state (see log.py), because several
processes share these files; for a sealed segment it is file size / entry size.

Thread-safety: one appender at a time (the partition lock); readers may look up
concurrently because they never read past the published entry count.
"""

from __future__ import annotations

import logging
import ctypes
import mmap
import os
import struct
import sys
from typing import Any

from .errors import CorruptRecordError

__all__ = ["OffsetIndex", "TimeIndex", "RESERVE_STEP_BYTES"]

log = logging.getLogger(__name__)

RESERVE_STEP_BYTES = 64 * 1024      # real blocks reserved ahead of the next index entry


class _FileMap:
    """A shared map of an index file that holds no descriptor, advised MADV_RANDOM.

    Python's `mmap.mmap` keeps a dup of the file's descriptor for as long as the map
    lives: two per active segment for the indexes alone, which made a producing
    process hold 5 descriptors per partition (600 partitions passed a 1024 limit).
    This maps with libc directly and exposes the bytes as a ctypes array (`buf`, which
    `struct` reads and writes in place). Unlike `mmap.mmap`, a use after `close()` is
    not caught: every use and the close run under the partition's thread lock
    (log.py), as they always have. Where libc cannot be loaded, `mmap.mmap` is used."""

    __slots__ = ("buf", "_addr", "_size", "_fallback")

    def __init__(self, fd: int, size: int, writable: bool) -> None:
        self._size = size
        self._fallback: mmap.mmap | None = None
        if _libc is None:
            mm = mmap.mmap(fd, size, access=mmap.ACCESS_WRITE if writable
                           else mmap.ACCESS_READ)
            if _MADV_RANDOM is not None:
                mm.madvise(_MADV_RANDOM)
            self._fallback = mm
            self.buf: Any = mm
            self._addr = 0
            return
        prot = mmap.PROT_READ | (mmap.PROT_WRITE if writable else 0)
        addr = _libc.mmap(None, size, prot, mmap.MAP_SHARED, fd, 0)
        if addr is None or addr == _MAP_FAILED:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err))
        self._addr = addr
        if _MADV_RANDOM is not None:
            _libc.madvise(addr, size, _MADV_RANDOM)     # advice only: failure is harmless
        self.buf = (ctypes.c_char * size).from_address(addr)

    def flush(self) -> None:
        if self._fallback is not None:
            self._fallback.flush()
        elif self._addr and _libc.msync(self._addr, self._size, _MS_SYNC) != 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err))

    def close(self) -> None:
        if self._fallback is not None:
            self._fallback.close()
            self._fallback = None
        elif self._addr:
            self.buf = None
            addr, self._addr = self._addr, 0
            _libc.munmap(addr, self._size)


def _load_libc() -> Any:
    try:
        libc = ctypes.CDLL(None, use_errno=True)     # the loaded libc: no ldconfig run
        libc.mmap.restype = ctypes.c_void_p
        libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int,
                              ctypes.c_int, ctypes.c_int, ctypes.c_long]
        for name in ("munmap", "madvise", "msync"):
            getattr(libc, name).argtypes = [ctypes.c_void_p, ctypes.c_size_t] + \
                ([ctypes.c_int] if name != "munmap" else [])
        return libc
    except (OSError, AttributeError):
        return None


_MADV_RANDOM = getattr(mmap, "MADV_RANDOM", None)
_MS_SYNC = 4                          # Linux's value (mman-common.h)
_MAP_FAILED = ctypes.c_void_p(-1).value
_libc = _load_libc() if sys.platform.startswith("linux") else None


class _Index:
    ENTRY = struct.Struct(">ii")

    def __init__(self, path: str, base_offset: int, *, writable: bool,
                 entries: int | None = None, create_bytes: int = 0) -> None:
        """Map an index file. `create_bytes` > 0 creates it preallocated to that size
        (the appender does this under the partition lock); otherwise it must exist."""
        self.path = path
        self.base_offset = base_offset
        self.entry_size = self.ENTRY.size
        self._mmap: Any = None          # the entries' bytes (`_map.buf`)
        self._map: _FileMap | None = None
        self._reserved = 0             # bytes from 0 known to have real blocks
        flags = os.O_RDWR if writable else os.O_RDONLY
        if create_bytes:
            flags |= os.O_CREAT | os.O_TRUNC
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            if create_bytes:
                # Sparse to its full size (what readers and the roll check see), with
                # real blocks for the first entries: on a full disk this raises OSError
                # here instead of a SIGBUS at the first store through the map.
                length = create_bytes - create_bytes % self.entry_size
                os.ftruncate(fd, length)
                self._reserved = min(RESERVE_STEP_BYTES, length)
                os.posix_fallocate(fd, 0, self._reserved)
            for attempt in range(3):
                size = os.fstat(fd).st_size
                if not size:
                    break
                mapping = _FileMap(fd, size, writable)
                if os.fstat(fd).st_size >= size:
                    self._map, self._mmap = mapping, mapping.buf
                    break
                mapping.close()         # another process's roll trimmed it meanwhile
                if attempt == 2:
                    raise ValueError(f"{path} keeps shrinking while it is mapped")
            self.capacity = size // self.entry_size
            sealed = entries is None
            if sealed:              # its size, less any zero padding a roller killed
                entries = self._entries_before_padding(fd)   # before the trim left
        finally:                                             # (or not trimmed yet)
            os.close(fd)
        if sealed:
            entries = self._sealed_entries(entries)
        self.entries = min(entries, self.capacity)

    def _sealed_entries(self, entries: int) -> int:
        """How many of a sealed file's entries to use: `_sane_prefix` (every entry in
        order). OffsetIndex overrides it with a constant-time check, because its
        entries are checked where they are used."""
        return self._sane_prefix(entries)

    def _sane_prefix(self, entries: int) -> int:
        """Derived data is checked before it is trusted: a sealed index is used only up
        to its first entry that breaks the order (both fields strictly increasing from
        a non-negative start). Fewer entries only mean longer scans, never wrong data."""
        if not entries or self._mmap is None:
            return 0
        unpack, size, mm = self.ENTRY.unpack_from, self.entry_size, self._mmap
        previous = unpack(mm, 0)
        if previous[0] < 0 or previous[1] < 0:
            return 0
        for n in range(1, entries):
            entry = unpack(mm, n * size)
            if entry[0] <= previous[0] or entry[1] <= previous[1]:
                return n
            previous = entry
        return entries

    def _entries_before_padding(self, fd: int) -> int:
        """Entries of a sealed file: all of them, unless a roll died between publishing
        the new segment and trimming this one, leaving preallocated zeros — or is about
        to trim it (a roll publishes the new segment first). A real entry is never all
        zero (an offset entry's position is > 0), so binary-search for the first
        all-zero entry. Read with pread, never through the map: a trim racing this
        search shortens the file, and a read of the map past the new end would be a
        SIGBUS; a short pread reads as padding instead."""
        if not self.capacity or self._mmap is None:
            return 0
        size, zero = self.entry_size, bytes(self.entry_size)

        def is_zero(n: int) -> bool:
            got = os.pread(fd, size, n * size)
            return len(got) < size or got == zero

        if not is_zero(self.capacity - 1):
            return self.capacity
        lo, hi = 0, self.capacity - 1          # the first zero entry is in [lo, hi]
        while lo < hi:
            mid = (lo + hi) >> 1
            if is_zero(mid):
                hi = mid
            else:
                lo = mid + 1
        return lo

    @property
    def is_full(self) -> bool:
        return self.entries >= self.capacity

    def close(self) -> None:
        if self._map is not None:
            self._mmap = None
            self._map.close()
            self._map = None

    def flush(self) -> None:
        if self._map is not None:
            self._map.flush()

    def trim(self) -> None:
        """Cut the file to its entries (the segment is sealed)."""
        valid = self.entries * self.entry_size
        self.close()
        os.truncate(self.path, valid)
        self.capacity = self.entries
        if valid:
            fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
            try:
                self._map = _FileMap(fd, valid, False)
                self._mmap = self._map.buf
            finally:
                os.close(fd)

    def store(self) -> tuple[Any, int] | None:
        """(the map, the bytes from its start with real blocks) of a mapped index, for
        the append path in C (logkit/_appendpath.c), which stores entries below the
        reserved end only; None when it is not mapped."""
        return None if self._mmap is None else (self._mmap, self._reserved)

    def entry(self, n: int) -> tuple[int, int]:
        assert 0 <= n < self.entries and self._mmap is not None
        return self.ENTRY.unpack_from(self._mmap, n * self.entry_size)

    def _write(self, a: int, b: int) -> None:
        assert self._mmap is not None and not self.is_full
        position = self.entries * self.entry_size
        if position + self.entry_size > self._reserved:
            self._reserve(position)
        self.ENTRY.pack_into(self._mmap, position, a, b)
        self.entries += 1

    def _reserve(self, position: int) -> None:
        """Real blocks for the next RESERVE_STEP_BYTES from `position` (OSError on a full
        disk, before any store through the map could fault). Another process appending
        in turn may have reserved them already: fallocate of allocated blocks is a
        no-op."""
        end = min(position + RESERVE_STEP_BYTES, self.capacity * self.entry_size)
        fd = os.open(self.path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            os.posix_fallocate(fd, position, end - position)
        finally:
            os.close(fd)
        self._reserved = end

    def _search(self, key: int, field: int) -> int:
        """Index of the last entry whose `field` <= key, or -1."""
        lo, hi = 0, self.entries - 1
        unpack = self.ENTRY.unpack_from
        mm = self._mmap
        size = self.entry_size
        found = -1
        while lo <= hi:
            mid = (lo + hi) >> 1
            if unpack(mm, mid * size)[field] <= key:
                found = mid
                lo = mid + 1
            else:
                hi = mid - 1
        return found


class OffsetIndex(_Index):
    """offset -> position, every `index.interval.bytes` of log.

    A sealed offset index is not walked when it is opened (a 1 GiB segment has ~260k
    entries: ~12 ms of Python on every reopen of a sealed segment, which a random
    reader pays again and again). As Kafka's sanity check does, it is only sized and
    its first entry checked; every entry a lookup returns is then checked against the
    log where it is used (`LogSegment._find`: the batch at its position must end at
    its offset, else the reader scans from the segment's start). A lookup over entries
    out of order still returns an entry at or below the key, so a lying entry costs a
    longer scan, never wrong records or a skipped offset."""

    ENTRY = struct.Struct(">ii")

    def _sealed_entries(self, entries: int) -> int:
        if not entries or self._mmap is None:
            return 0
        first_offset, first_position = self.entry_at(0)
        return entries if first_offset >= 0 and first_position >= 0 else 0

    def entry_at(self, n: int) -> tuple[int, int]:
        """Entry `n` of the mapped file (no check against `entries`)."""
        return self.ENTRY.unpack_from(self._mmap, n * self.entry_size)

    def append(self, offset: int, position: int) -> None:
        relative = offset - self.base_offset
        assert 0 <= relative < 2**31 and 0 <= position < 2**31   # the roll keeps them so
        if self.entries:
            last_offset, _ = self.entry(self.entries - 1)
            if relative <= last_offset:        # the file's last entry is not ours
                raise CorruptRecordError(
                    "offset index entry is not below the offset being indexed",
                    path=self.path, position=(self.entries - 1) * self.entry_size,
                    expected=f"< {relative}", actual=last_offset)
        self._write(relative, position)

    def last_position(self) -> int:
        return self.entry(self.entries - 1)[1] if self.entries else 0

    def lookup(self, offset: int) -> int:
        """Byte position from which to scan for `offset` (0 if before the first entry)."""
        return self.lookup_entry(offset)[1]

    def lookup_entry(self, offset: int) -> tuple[int, int]:
        """(last offset of the batch at that position or -1, position) to scan from."""
        found = self._search(offset - self.base_offset, 0)
        if found < 0:
            return -1, 0
        relative, position = self.entry(found)
        return self.base_offset + relative, position

    def truncate_to_position(self, position: int) -> None:
        """Drop entries pointing at `position` or beyond (the log was cut there)."""
        while self.entries and self.entry(self.entries - 1)[1] >= position:
            self.entries -= 1


class TimeIndex(_Index):
    """max timestamp so far -> offset, for offset_for_timestamp()."""

    ENTRY = struct.Struct(">qi")

    def append(self, timestamp: int, offset: int) -> None:
        relative = offset - self.base_offset
        if self.entries:
            last_ts, last_rel = self.entry(self.entries - 1)
            if timestamp <= last_ts or relative <= last_rel:
                return                                    # not newer: nothing to index
        if not self.is_full:
            self._write(timestamp, relative)

    def last_timestamp(self) -> int:
        return self.entry(self.entries - 1)[0] if self.entries else -1

    def lookup(self, timestamp: int) -> int:
        """Offset from which to scan for the first record with ts >= timestamp."""
        found = self.lookup_entry(timestamp)
        return self.base_offset if found < 0 else self.base_offset + self.entry(found)[1]

    def lookup_entry(self, timestamp: int) -> int:
        """Number of the last entry whose timestamp is below `timestamp` (the one a scan
        for the first record with ts >= timestamp starts from), or -1. Its offset is
        trusted only once checked against the log (`LogSegment.offset_for_timestamp`)."""
        return self._search(timestamp - 1, 0)

    def truncate_to_offset(self, offset: int) -> None:
        while self.entries and self.base_offset + self.entry(self.entries - 1)[1] >= offset:
            self.entries -= 1
