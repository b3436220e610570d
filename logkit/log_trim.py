"""Cutting one partition log at either end: retention and log-start moves at the front,
truncation at the back (a diverging follower, the cut after a failed sync).

Owns: `retention.ms` / `retention.bytes` (not applied when cleanup.policy is
'compact' alone; whole segments, oldest first, renamed
`.deleted` and unlinked after `file.delete.delay.ms`), `increase_log_start_offset`,
`truncate_to` and `truncate_fully_and_start_at`. Invariant: offsets stay dense from
the log start; a truncation publishes its tail torn before it swaps any file, so the
next lock holder in any process recovers before appending.

A mixin of `PartitionLog` (log.py), which owns the state it reads and writes.
"""

from __future__ import annotations

import logging
import os
import time

from ._clock import now_ms as _now_ms
from ._files import open_file
from .errors import OffsetOutOfRangeError, storage_error
from .segment import (
    DELETED_SUFFIX,
    LogSegment,
    parse_segment_name,
    retire_segment,
    segment_file_name,
)
from .tail import Tail

log = logging.getLogger("logkit.log")

def _copy_prefix(path: str, size: int) -> None:
    """Write the first `size` bytes of `path + DELETED_SUFFIX` to a new file at `path`
    (a temporary name, fsync, rename), so a reader mapping the old file keeps it."""
    tmp = path + ".truncating"
    with open(path + DELETED_SUFFIX, "rb") as src:
        fd = open_file(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        try:
            copied = 0
            while copied < size:
                done = os.copy_file_range(src.fileno(), fd, size - copied, copied, copied)
                if done <= 0:
                    raise OSError(f"{path}: short copy ({copied} of {size} bytes)")
                copied += done
            os.fsync(fd)
        finally:
            os.close(fd)
    os.replace(tmp, path)




class _LogTrim:
    """Retention and truncation for `PartitionLog` (see the module docstring)."""

    def truncate_to(self, offset: int) -> int:
        """Cut the log back to end at `offset` (Kafka's truncateTo, for a follower whose
        tail diverged from its leader's): the batch holding `offset` and all after it
        go, so the log ends at `offset` when it is a batch boundary, else at the base of
        the batch holding it. Returns the new log end; a no-op at or past the log end;
        OffsetOutOfRangeError below the log start. Logs a WARNING.

        Nothing is cut in place, so readers in other processes keep their mapped files:
        the segments from the cut on are renamed `.deleted`, the kept prefix of the cut
        one is copied back under its name, and recovery rebuilds its indexes and
        publishes the tail. Until then the tail reads as torn (`publish_torn`), so
        another process's appender recovers before it appends instead of writing to
        the swapped segment through its cached descriptor, and its readers wait. A
        kill at any step leaves a prefix of the old log that the next open, or the next
        lock holder, recovers."""
        with self._locked_tail("truncate") as tail:
            return self._truncate_locked(tail, offset, "truncate")

    def _truncate_locked(self, tail: Tail, offset: int, operation: str) -> int:
        """truncate_to's work, under the lock."""
        end = tail.log_end_offset
        if offset >= end:
            return end
        self._check_in_range(offset, tail, end)
        bases = list(self._bases)
        i = self._first_segment(offset, end)
        segment, size = self._sized(bases[i], tail)
        cut = segment.find(offset, size)
        try:
            # Torn until recovery publishes the new list: another process that has the
            # active segment open must not append to it once it is swapped (it recovers
            # first, also when we die mid-way).
            self._tail_file.publish_torn(tail._replace(
                recovery_point=min(tail.recovery_point, bases[i]), clean=0))
            self._tail_file.sync()
            self._close_segments()
            for base in reversed(bases[i:]):
                retire_segment(self.directory, base)
            _copy_prefix(os.path.join(self.directory, segment_file_name(
                bases[i], ".log")), cut)
            self._recover(full=False)
            new_end = self._tail_under_lock().log_end_offset
        except OSError as exc:
            raise storage_error(exc, operation, self.directory) from exc
        log.warning("%s: truncated the log from end offset %d to %d (%d segment(s) "
                    "rewritten or removed)", self.name, end, new_end, len(bases) - i)
        return new_end

    def truncate_fully_and_start_at(self, offset: int) -> None:
        """Drop every segment and start an empty log at `offset` (Kafka's
        truncateFullyAndStartAt: a follower whose log ends below its leader's log start,
        or is empty while the leader's first batch starts below it). Files are renamed
        `.deleted` first, as retention does; logs a WARNING."""
        if offset < 0:
            raise OffsetOutOfRangeError(f"{self.name}: cannot start the log at {offset}")
        with self._locked_tail("truncate") as tail:
            try:
                self._tail_file.publish(tail._replace(
                    log_start_offset=offset, log_end_offset=offset, high_watermark=offset,
                    active_base_offset=offset, active_size=0, index_entries=0,
                    timeindex_entries=0, segments_version=tail.segments_version + 1,
                    max_timestamp=-1, max_timestamp_offset=-1, recovery_point=offset,
                    roll_time_ms=-1, clean=0, unflushed_messages=0, first_unflushed_ms=-1))
                self._tail_file.sync()
                self._close_segments()
                for name in os.listdir(self.directory):
                    base = parse_segment_name(name)
                    if base is not None:
                        retire_segment(self.directory, base)
                self._recover(full=True)
            except OSError as exc:
                raise storage_error(exc, "truncate", self.directory) from exc
        log.warning("%s: dropped the whole log (end offset was %d); it starts again at "
                    "offset %d", self.name, tail.log_end_offset, offset)

    def increase_log_start_offset(self, offset: int) -> int:
        """Move the log start up to `offset` (at most the log end), retiring the
        segments wholly below it (Kafka's maybeIncrementLogStartOffset: a follower
        applying its leader's retention). Returns the segments retired."""
        with self._locked_tail("retention") as tail:
            offset = min(offset, tail.log_end_offset)
            if offset <= tail.log_start_offset:
                return 0
            bases = self._bases
            ends = bases[1:] + [tail.log_end_offset if tail.active_size else offset + 1]
            doomed = sum(1 for end in ends if end <= offset)
            try:
                self._delete_front(tail, doomed, offset)
            except OSError as exc:
                raise storage_error(exc, "retention", self.directory) from exc
            return doomed

    def enforce_retention(self, now_ms: int | None = None) -> int:
        """Delete whole segments past retention.ms / retention.bytes; returns how many.

        Order, for a crash or an error at any step: the new log start is published (and
        synced) first, then the files are renamed `.deleted` and unlinked after
        file.delete.delay.ms, so a reader holding one open keeps reading. Files left
        below the published start by an interrupted run are swept at the next open."""
        now_ms = _now_ms() if now_ms is None else now_ms
        config = self.config
        retention_ms, retention_bytes = config["retention.ms"], config["retention.bytes"]
        if config["cleanup.policy"] == "compact":      # compaction alone: kept for ever
            retention_ms = retention_bytes = -1
        if retention_ms < 0 and retention_bytes < 0:
            with self._thread_lock:
                self._check_usable()
                self._unlink_deleted()
            return 0
        with self._locked_tail("retention") as tail:
            try:
                return self._enforce_retention(tail, now_ms, retention_ms, retention_bytes)
            except OSError as exc:
                raise storage_error(exc, "retention", self.directory) from exc

    def _enforce_retention(self, tail: Tail, now_ms: int, retention_ms: int,
                           retention_bytes: int) -> int:
        bases = self._bases
        sizes = [self._sealed_size(b) for b in bases[:-1]]
        sizes.append(tail.active_size)
        excess = sum(sizes) - retention_bytes if retention_bytes >= 0 else 0
        doomed = 0
        for i, base in enumerate(bases):
            if i == len(bases) - 1:
                newest = tail.max_timestamp
                if sizes[i] == 0:
                    break
            else:
                newest = self._sealed_max_timestamp(base)
            by_time = retention_ms >= 0 and newest < now_ms - retention_ms
            by_size = excess > 0 and excess - sizes[i] >= 0
            if not (by_time or by_size):
                break
            excess -= sizes[i]
            doomed += 1
        if doomed:
            self._delete_front(tail, doomed, None)
        self._unlink_deleted()
        return doomed

    def _delete_front(self, tail: Tail, doomed: int, log_start: int | None) -> Tail:
        """Publish a new log start (`log_start`, or the base of the first segment kept)
        and retire the first `doomed` segments after it (rolling first when they are all
        of them). Caller holds the lock; retention and a follower's log start use it."""
        bases = self._bases
        if doomed == len(bases):                  # the active segment too: roll first
            tail = self._roll(tail)
            bases = self._bases
        tail = tail._replace(log_start_offset=bases[doomed] if log_start is None
                             else log_start, segments_version=tail.segments_version + 1)
        self._tail_file.publish(tail)
        self._tail_file.sync()
        for base in bases[:doomed]:
            segment = self._segments.pop(base, None)
            if segment is not None:
                segment.close()
            if base in self._parked:
                self._close_parked(base)
            self._sealed_sizes.pop(base, None)
            retire_segment(self.directory, base)
            log.debug("%s: retention retired segment %d", self.name, base)
        if doomed:
            log.warning("%s: retention deleted %d segment(s) below offset %d (the new log "
                        "start)", self.name, doomed, tail.log_start_offset)
        self._refresh(tail)
        return tail

    def _sealed_size(self, base: int) -> int:
        """A sealed segment's size, without keeping its file open."""
        size = self._sealed_sizes.get(base)
        if size is None:
            segment = self._segments.get(base) or self._parked.get(base)
            size = segment.sealed_size if segment is not None else os.stat(
                os.path.join(self.directory, segment_file_name(base, ".log"))).st_size
            self._sealed_sizes[base] = size
        return size

    def _sealed_max_timestamp(self, base: int) -> int:
        """A sealed segment's largest timestamp: its time index's last entry."""
        segment = self._segments.get(base) or self._parked.get(base)
        if segment is not None:
            return segment.time_index.last_timestamp()
        return LogSegment.read_last_timestamp(self.directory, base)

    def _unlink_deleted(self) -> None:
        delay_s = self.config["file.delete.delay.ms"] / 1000
        for name in os.listdir(self.directory):
            if name.endswith(DELETED_SUFFIX):
                path = os.path.join(self.directory, name)
                try:
                    if time.time() - os.stat(path).st_ctime >= delay_s:
                        os.unlink(path)
                except FileNotFoundError:
                    pass
