"""Syncs of one partition log: `flush()`, the `flush.messages` / `flush.ms` policy, and
group commit — many durable appenders, in any thread or process, sharing one fdatasync.

Owns: the sync rounds (one waiter of the process at a time is the flusher: it reads the
log end, syncs outside every lock, then publishes recovery point = high watermark = that
end under the lock and wakes the rest), `SyncTicket` waits, and what a failed sync
cuts: the bytes above the recovery point, and every waiter the sync covered raises.
Invariant: the high watermark of a `flush.messages` topic never passes the recovery
point, so no reader sees a record a sync has not covered.

A mixin of `PartitionLog` (log.py), which owns the state it reads and writes.
"""

from __future__ import annotations

import logging
import os
from typing import NamedTuple

from ._clock import now_ms as _now_ms
from .errors import (
    CorruptRecordError,
    LogkitError,
    OffsetOutOfRangeError,
    StorageError,
    storage_error,
)
from .tail import Tail

log = logging.getLogger("logkit.log")

SYNC_WAIT_S = 0.05                    # a group-commit waiter re-checks at least this often
SYNC_FAILURES_KEPT = 16               # failed syncs remembered for their waiters

class SyncTicket(NamedTuple):
    """A durable append waiting for its sync (`PartitionLog.append_batch_nowait`): the
    log end it needs synced, the segment-list version it was appended under, and the
    batch's base offset and CRC (to find it again when the segment list changed)."""

    end: int
    version: int
    base_offset: int
    crc: int




class _GroupCommit:
    """Syncs and group commit for `PartitionLog` (see the module docstring)."""

    def flush(self) -> None:
        """fsync everything appended so far and advance the recovery point."""
        with self._locked_tail("flush") as tail:
            if tail.unflushed_messages or tail.recovery_point < tail.log_end_offset:
                try:
                    self._segment(tail.active_base_offset).flush()
                    self._sync_directory_once(tail.active_base_offset)
                    self._tail_file.publish(tail._replace(
                        recovery_point=tail.log_end_offset, unflushed_messages=0,
                        first_unflushed_ms=-1,
                        high_watermark=max(tail.high_watermark, tail.log_end_offset)))
                    self._tail_file.sync()
                except OSError as exc:
                    raise storage_error(exc, "flush", self.directory) from exc

    def _sync_directory_once(self, base: int) -> None:
        """fsync the partition directory once per active segment (per process), so the
        segment file's own entry is durable before anything in it is acknowledged as
        synced: fdatasync and fsync of a file do not promise its directory entry."""
        if base == self._dir_synced_base:
            return
        fd = os.open(self.directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        self._dir_synced_base = base

    def wait_synced(self, ticket: SyncTicket) -> None:
        """Return once a sync covering the ticket's batch is done and published (by this
        process or another): its records are then readable and may be acknowledged.
        Raises StorageError when the sync that covered it failed, or when the batch was
        cut after a failed sync (its records are not stored)."""
        end, version, base_offset, crc = ticket
        cond = self._sync_cond
        while True:
            with cond:
                for failed_end, failed_version, error in self._sync_failures:
                    if failed_end >= end and failed_version == version:
                        raise error
            tail = self.tail()
            if tail.segments_version != version:      # a roll, retention or a cut
                if not self._still_stored(tail, base_offset, crc):
                    raise self._cut_error(base_offset)
                version = tail.segments_version
            if tail.recovery_point >= end:
                return
            with cond:
                if self._syncing:
                    cond.wait(SYNC_WAIT_S)
                    continue
                self._syncing = True
            try:
                self._sync_round()
            finally:
                with cond:
                    self._syncing = False
                    cond.notify_all()

    def _sync_round(self) -> None:
        """The flusher's round: fdatasync the active `.log` up to the log end read now,
        outside every lock (appends go on meanwhile and wait for the next round), then
        publish that end as the recovery point and high watermark. A failed sync is
        recorded for the waiters it covered, and the unsynced batches are cut."""
        tail = self.tail()
        target, version, base = (tail.log_end_offset, tail.segments_version,
                                 tail.active_base_offset)
        if tail.recovery_point >= target:
            return
        try:
            with self._thread_lock:
                self._refresh(tail)
                fd = self._segment(base).dup_log_fd()
        except OSError as exc:
            if self.tail().segments_version != version:
                return                   # rolled or cut meanwhile: the caller looks again
            raise storage_error(exc, "fsync", self.directory) from exc
        try:
            try:
                os.fdatasync(fd)
            finally:
                os.close(fd)
            self._sync_directory_once(base)
        except OSError as exc:
            self._sync_failed(target, version, exc)
            return
        self.sync_count += 1
        with self._locked_tail("fsync") as now:
            if now.segments_version == version and \
                    now.recovery_point < target <= now.log_end_offset:
                done = target == now.log_end_offset
                self._tail_file.publish(now._replace(
                    recovery_point=target,
                    high_watermark=max(now.high_watermark, target),
                    unflushed_messages=0 if done else now.unflushed_messages,
                    first_unflushed_ms=-1 if done else now.first_unflushed_ms))
        if self._doorbell is not None:
            self._doorbell.ring(self._change_slot)

    def _sync_failed(self, target: int, version: int, exc: OSError) -> None:
        """A failed sync: its error goes to every waiter whose batch ends at or below
        `target`, and every batch above the recovery point is cut — the page cache may
        have dropped them already, and they must never be read, sealed or acknowledged
        (a later sync could report success without them)."""
        error = storage_error(exc, "fsync", self.directory)
        error.__cause__ = exc
        with self._sync_cond:
            self._sync_failures = self._sync_failures[-(SYNC_FAILURES_KEPT - 1):] + [
                (target, version, error)]
        log.warning("%s: fdatasync failed (%s); cutting the batches above the recovery "
                    "point", self.name, exc)
        try:
            with self._locked_tail("fsync") as tail:
                if tail.recovery_point < tail.log_end_offset:
                    self._truncate_locked(tail, tail.recovery_point, "fsync")
        except LogkitError as cut:
            # The batches stay past the recovery point, unacknowledged and below no
            # reader's high watermark; the next open after a crash cuts them.
            log.warning("%s: could not cut the unsynced batches: %s", self.name, cut)

    def _still_stored(self, tail: Tail, base_offset: int, crc: int) -> bool:
        """Whether the batch at `base_offset` with `crc` is still in the log (asked when
        the segment list changed while it waited for its sync)."""
        if base_offset < tail.log_start_offset:
            return True               # retention took its sealed (so synced) segment
        if base_offset >= tail.log_end_offset:
            return False
        try:
            headers = self._with_tail(self._batch_headers, base_offset)
        except (CorruptRecordError, OffsetOutOfRangeError):
            return False
        return bool(headers) and headers[0].base_offset == base_offset \
            and headers[0].crc == crc

    def _cut_error(self, base_offset: int) -> StorageError:
        with self._sync_cond:
            cause = self._sync_failures[-1][2] if self._sync_failures else None
        error = StorageError(f"{self.name}: the batch at offset {base_offset} was cut "
                             "before it was synced (a sync failed)", operation="fsync",
                             path=self.directory)
        error.__cause__ = cause
        return error

    def maybe_flush(self, now_ms: int | None = None) -> bool:
        """The flush.ms policy: fsync if the oldest unflushed append is old enough."""
        tail = self.tail()
        if tail.first_unflushed_ms < 0:
            return False
        now_ms = _now_ms() if now_ms is None else now_ms
        if now_ms - tail.first_unflushed_ms < self.config["flush.ms"]:
            return False
        self.flush()
        return True
