"""The open segments of one partition log: at most `MAX_OPEN_SEGMENTS` with descriptors
(the active one and one sealed), up to `PARKED_SEGMENTS` sealed ones parked without a
descriptor (their index maps kept), bounded across the process by `_PARK_BUDGET`.

Owns: finding or opening the segment of a base offset (`_segment`), evicting and
parking, and closing them all. Invariant: a segment handed out is open for the
caller's read; one removed by retention or a cut in another process is noticed through
the segment-list version and dropped here.

A mixin of `PartitionLog` (log.py), which owns the state it reads and writes.
"""

from __future__ import annotations

import logging
import threading

from .errors import ClosedError
from .segment import LogSegment
from .tail import Tail

log = logging.getLogger("logkit.log")

MAX_OPEN_SEGMENTS = 2                 # per partition: the active one and one sealed
PARKED_SEGMENTS = 64                  # per partition: sealed ones kept without a descriptor
class _ParkBudget:
    """How many segments this process may keep parked, over all its partitions: each
    keeps up to two index maps, and the kernel bounds a process's maps
    (vm.max_map_count, 65530 by default). A forked child starts with the whole
    budget (its parent's partitions are unusable there)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._used = 0
        self._lock = threading.Lock()

    def take(self) -> bool:
        with self._lock:
            if self._used >= self.limit:
                return False
            self._used += 1
            return True

    def give_back(self) -> None:
        with self._lock:
            self._used = max(0, self._used - 1)

    def reset(self) -> None:
        self._used = 0
        self._lock = threading.Lock()


_PARK_BUDGET = _ParkBudget(8192)


class _SegmentCache:
    """The segment cache of `PartitionLog` (see the module docstring)."""

    def _segment(self, base: int) -> LogSegment:
        """The open segment at `base` (of the listed segments), opening it if needed."""
        segment = self._segments.get(base)
        if segment is None:
            listed = self._listed
            if listed is None:
                raise ClosedError(f"partition {self.name} has no segment list")
            active = base == listed.active_base_offset
            segment = self._unpark(base) if self._parked and not active else None
            if segment is None:
                segment = LogSegment(self.directory, base, active=active,
                                     index_entries=listed.index_entries if active else None,
                                     timeindex_entries=listed.timeindex_entries if active
                                     else None, read_only=self.read_only)
            segment.gaps = self._gaps
            segments = self._segments
            if len(segments) >= MAX_OPEN_SEGMENTS:
                # Sealed segments are opened on demand and closed first-in first-out, so
                # a long log does not hold a descriptor per segment (Kafka maps its
                # indexes lazily for the same reason); a closed one is parked, so a
                # random reader does not pay for re-mapping its indexes each time.
                for old in list(segments):
                    if not segments[old].active:
                        log.debug("%s: closing segment %d (more than %d open)", self.name,
                                  old, MAX_OPEN_SEGMENTS)
                        self._park(segments.pop(old))
                        break
            segments[base] = segment
        return segment

    def _park(self, segment: LogSegment) -> None:
        """Keep a sealed segment evicted from the open ones parked (no descriptor, its
        index maps kept), within PARKED_SEGMENTS and the process's budget; else close
        it. The oldest parked one makes room."""
        parked = self._parked
        if len(parked) >= PARKED_SEGMENTS:
            self._close_parked(next(iter(parked)))
        if not _PARK_BUDGET.take():
            segment.close()
            return
        try:
            segment.park()
        except BaseException:
            _PARK_BUDGET.give_back()
            segment.close()
            raise
        parked[segment.base_offset] = segment

    def _unpark(self, base: int) -> LogSegment | None:
        """The parked segment at `base` with its `.log` open again, or None (it was not
        parked, or its file was replaced: then it is closed)."""
        segment = self._parked.pop(base, None)
        if segment is None:
            return None
        _PARK_BUDGET.give_back()
        try:
            if segment.unpark():
                return segment
        except BaseException:
            segment.close()
            raise
        return None

    def _close_parked(self, base: int) -> None:
        self._parked.pop(base).close()
        _PARK_BUDGET.give_back()

    def _sized(self, base: int, tail: Tail) -> tuple[LogSegment, int]:
        """The segment at `base` and its committed size; the active one adopts the
        tail's index entry counts (another process may have added entries)."""
        segment = self._segment(base)
        if segment.active:
            segment.set_index_entries(tail.index_entries, tail.timeindex_entries)
            return segment, tail.active_size
        return segment, segment.sealed_size

    def _close_segments(self) -> None:
        self._arm(None)
        for segment in self._segments.values():
            segment.close()
        self._segments.clear()
        for base in list(self._parked):
            self._close_parked(base)
        self._bases = []
        self._segments_version = -1
