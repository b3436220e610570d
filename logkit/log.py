"""The partition log: the sorted segments of one `<topic>-<partition>` directory, and
appends, rolls, reads, retention and the flush policy over them.

Owns: the live log. Its neighbours own the rest of the directory's story: `tail.py` the
shared tail state and its seqlock, `loader.py` the open-time checks and recovery (the
partition log calls them), `segment.py` one segment's files, `records.py` every batch
byte. Several processes may have the same partition open; they coordinate through two
things in the directory:

* `logkit.tail` — the tail state (`tail.Tail`): log start/end offsets, the active
  segment's committed size and index entry counts, the high watermark, the recovery
  point and a segment-list version, written under a seqlock so readers take no lock and
  never see a half-updated tail. Readers read only below the committed size, so they
  never see a batch an appender is still writing; they notice rolls and deletions
  through the segment-list version and rescan the directory.
* an exclusive `flock` on that file (plus thread locks) serialises appends, rolls,
  retention and recovery across processes. Every mutation runs inside `_locked_tail()`,
  which takes the lock, reads the tail (repairing a tail torn by a writer that died
  mid-update, by recovery: the same way on every path), and refreshes the segment list.

Durability: data goes to the page cache on append, so a process killed at any instant
loses nothing it had published; the torn bytes past the committed size are cut by the
next appender. After an OS crash (detected by a different boot id in the tail) or a
tail caught mid-update, recovery re-validates every batch from the recovery point by
CRC, rebuilds the indexes and truncates at the first bad byte. A clean close marks the
tail clean after an fsync, which lets the next boot skip recovery. `flush.messages` and
`flush.ms` set the fsync policy, as in Kafka.

Group commit (an append that `flush.messages` makes durable): the appender writes and
publishes its batch under the lock — the log end moves, the high watermark and the
recovery point do not — releases the lock, then waits for an fdatasync that covers its
end. One waiter of the process at a time is the flusher: it reads the log end, syncs
the file outside every lock, so batches appended meanwhile wait for the next round,
then publishes recovery point = high watermark = that end under the lock and wakes the
rest. A waiter whose end the shared recovery point already passes (another process
synced it) returns without syncing. A failed sync is the error of every waiter it
covered, and the bytes above the recovery point are cut (`truncate_to`), so nothing a
reader can see was left unsynced; a waiter whose batch was cut raises too. A waiter
tells a cut from a roll by the segment-list version: when it moved, it looks its batch
up (base offset and CRC) before it returns. `append_batch_nowait` returns a `SyncTicket`
instead of waiting, for a caller that waits elsewhere: the producer's `SyncWaiter`
thread, so its sender appends on while a sync runs.

Invariant: segments are contiguous in offsets; offsets below `log_end_offset` are in
exactly one segment; bytes below each segment's committed size are CRC-valid batches.
Bad stored bytes raise CorruptRecordError (path, position); nothing here asserts on data.

Logging (`logkit.log`): DEBUG for rolls and segment cache evictions; INFO for the
segments retention deletes; WARNING when bytes past the committed size are cut.
"""

from __future__ import annotations

import bisect
import fcntl
import logging
import os
import threading
import time
from contextlib import contextmanager
from typing import Any, Callable, Container, Iterator, Mapping, NamedTuple, TypeVar

from . import _fork, loader
from ._native import shortio
from .compression import CODEC_NAMES, TOPIC_COMPRESSION_TYPE
from .errors import (ClosedError, CorruptRecordError, IllegalStateError, LogkitError,
                     LogkitTimeoutError,
                     OffsetOutOfRangeError, ReadOnlyError, RecordTooLargeError, StorageError,
                     UnknownTopicError, UnsupportedCompressionTypeError,
                     storage_error)
from .loader import RecoveryReport, leftovers, live_bases
from .notify import change_offset, change_slot
from .records import (ATTR_CONTROL, RECORDS_OFFSET, BatchHeader, Record, check_records,
                      decode_batch, encode_batch, iter_batches, read_header,
                      stamp_base_offset, stamp_log_append_time, validate_batch)
from .segment import (DELETED_SUFFIX, LogSegment, parse_segment_name, retire_segment,
                      segment_file_name, unlink_segment)
from ._files import check_directory, open_file
from .tail import BOOT_ID, TAIL_FILE, Tail, TailFile

# Names other modules import from here (broker.py, topic.py, tests): they moved to
# tail.py and loader.py and stay importable from this module.
__all__ = ["PartitionLog", "Tail", "TailFile", "RecoveryReport", "check_directory",
           "open_file", "live_bases", "leftovers", "BOOT_ID", "TAIL_FILE", "DELETED_SUFFIX",
           "MAX_FETCH_BYTES", "BATCHES_SINCE_MAX_BYTES", "LOCK_TIMEOUT_S", "SyncTicket"]

log = logging.getLogger(__name__)

LOCK_TIMEOUT_S = 30.0                 # default bound on waiting for the append lock
MAX_OPEN_SEGMENTS = 2                 # per partition: the active one and one sealed
PARKED_SEGMENTS = 64                  # per partition: sealed ones kept without a descriptor
_LOCK_POLL_S = (0.00005, 0.005)       # first and longest sleep between flock tries
# A try for the flock and its release that keep the GIL (logkit/_shortio.c): each
# GIL hand-over around a system call costs two context switches when another thread
# of the process is busy, as a producer's sender thread is.
_flock_now = fcntl.flock if shortio is None else shortio.flock
# The common append under the lock in one C call (logkit/_shortio.c, `_append_fast`).
_append_common = None if shortio is None else shortio.append_common
# ... and the whole uncontended append, locks and doorbell included (`_arm`).
_Appender = None if shortio is None else shortio.Appender
MAX_FETCH_BYTES = 52428800            # Kafka's fetch.max.bytes default: one read's bound
BATCHES_SINCE_MAX_BYTES = 1 << 20     # batches_since() bound (one batch at least)
READ_RETRIES = 100                    # a retention run may pull segments from a read
SYNC_WAIT_S = 0.05                    # a group-commit waiter re-checks at least this often
SYNC_FAILURES_KEPT = 16               # failed syncs remembered for their waiters

_T = TypeVar("_T")


class SyncTicket(NamedTuple):
    """A durable append waiting for its sync (`PartitionLog.append_batch_nowait`): the
    log end it needs synced, the segment-list version it was appended under, and the
    batch's base offset and CRC (to find it again when the segment list changed)."""

    end: int
    version: int
    base_offset: int
    crc: int


def _now_ms() -> int:
    return int(time.time() * 1000)


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
_fork.at_fork_in_child(_PARK_BUDGET.reset)


class PartitionLog:
    """One partition directory. Thread-safe; process-safe through the tail file."""

    def __init__(self, directory: str, topic: str, partition: int,
                 config: Mapping[str, Any], *, doorbell: Any = None,
                 read_only: bool = False) -> None:
        self.directory = directory
        self._doorbell = doorbell      # rung after each append (notify.Doorbell)
        self._change_slot = change_slot(topic, partition)   # ... naming this partition
        self.topic = topic
        self.partition = partition
        self.name = f"{topic}-{partition}"
        self.config = dict(config)
        # Two thread locks: `_append_lock` queues this process's appenders (flock is per
        # open file, so it cannot tell our own threads apart) and is held while waiting
        # for the flock; `_thread_lock` guards the cached segments and maps, and is only
        # ever held for short, local work, so a reader never waits on another process.
        self._append_lock = threading.Lock()
        self._thread_lock = threading.RLock()
        self._pid = _fork.owner_pid()
        self.read_only = read_only      # inspection: reads only, no recovery, no writes
        self._segments: dict[int, LogSegment] = {}
        # Sealed segments evicted from `_segments` keep their index maps here, with no
        # descriptor (LogSegment.park), oldest first, within a process-wide budget.
        self._parked: dict[int, LogSegment] = {}
        self._sealed_sizes: dict[int, int] = {}
        self._bases: list[int] = []
        self._segments_version = -1
        self._listed: Tail | None = None    # the tail the segment list was built from
        self._dirty = False            # this process appended since its last clean flush
        # Group commit (see the module docstring): `_sync_cond` guards the three fields
        # below; at most one thread of the process is the flusher (`_syncing`).
        self._sync_cond = threading.Condition(threading.Lock())
        self._syncing = False
        self._sync_failures: list[tuple[int, int, BaseException]] = []  # end, version, error
        self._dir_synced_base = -1     # the active segment whose directory entry we synced
        self._deferred: tuple[int, int] | None = None   # (end, segment-list version) of
        #                                 a deferred append, set and taken under the lock
        self.sync_count = 0            # fdatasyncs of the group-commit path (benchmarks)
        # The active segment the last general append wrote to, for `_append_fast`, and
        # the C appender for it (`_arm`); both None whenever the segment list changes
        # (`_refresh`, `_close_segments`) or the tail file is reopened (`_funlock`).
        self._fast_segment: LogSegment | None = None
        self._appender: Any = None
        self._closed = False
        self._last_recovery: RecoveryReport | None = None
        try:
            check_directory(directory, create=not read_only)
            self._tail_file = TailFile(os.path.join(directory, TAIL_FILE),
                                       read_only=read_only)
        except OSError as exc:
            raise storage_error(exc, "open partition", directory) from exc
        try:
            self._open_checks()
        except OSError as exc:
            self._tail_file.close()
            raise storage_error(exc, "open partition", directory) from exc
        except BaseException:
            self._tail_file.close()
            raise

    @property
    def last_recovery(self) -> RecoveryReport | None:
        """What recovery did when this log was opened (or last recovered), None when no
        recovery ran."""
        return self._last_recovery

    # ---- locking and tail ------------------------------------------------------------

    def _check_usable(self) -> None:
        """Raise for a closed partition, a forked process, or a deleted topic."""
        _fork.check_owner(self._pid, f"partition {self.name}")
        if self._closed:
            raise ClosedError(f"partition {self.name} is closed")
        if self._tail_file.deleted():
            raise UnknownTopicError(f"topic {self.topic!r} was deleted")

    def _acquire(self, timeout_s: float | None) -> None:
        """Take the append lock: this process's appenders queue on `_append_lock`, then
        the flock excludes other processes, then `_thread_lock` excludes our readers for
        the (short) mutation. Waits at most `timeout_s` (None: no bound) in all, then
        raises LogkitTimeoutError; the deleted flag is checked once the lock is held.
        On any error nothing stays held. `_release` undoes it."""
        self._check_usable()
        if self.read_only:
            raise ReadOnlyError(f"partition {self.name} is open read-only")
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        if not self._append_lock.acquire(timeout=-1 if timeout_s is None else timeout_s):
            raise self._lock_timeout(timeout_s)
        try:
            self._flock(deadline, timeout_s)
            try:
                self._thread_lock.acquire()
                try:
                    self._check_usable()
                except BaseException:
                    self._thread_lock.release()
                    raise
            except BaseException:
                self._funlock()
                raise
        except BaseException:
            self._append_lock.release()
            raise

    def _release(self) -> None:
        """Release what `_acquire` took, innermost first."""
        try:
            self._thread_lock.release()
            self._funlock()
        finally:
            self._append_lock.release()

    @contextmanager
    def _locked(self, timeout_s: float | None = LOCK_TIMEOUT_S) -> Iterator[None]:
        """The append lock alone (recovery and opening use it; every other mutation
        uses `_locked_tail`)."""
        self._acquire(timeout_s)
        try:
            yield
        finally:
            self._release()

    @contextmanager
    def _locked_tail(self, operation: str,
                     timeout_s: float | None = LOCK_TIMEOUT_S) -> Iterator[Tail]:
        """The append lock, with the current tail (repaired first if torn) and the
        segment list refreshed to it: the prelude of every mutation. An I/O error in
        the prelude raises StorageError naming `operation`. (The append takes the
        prelude without this generator, which costs it a microsecond per batch.)"""
        tail = self._lock_tail(operation, timeout_s)
        try:
            yield tail
        finally:
            self._release()

    def _lock_tail(self, operation: str, timeout_s: float | None) -> Tail:
        """`_locked_tail`'s prelude: the lock taken, the tail read and the segment list
        refreshed; the caller `_release`s. On any error nothing stays held."""
        self._acquire(timeout_s)
        try:
            tail = self._tail_under_lock()
            self._refresh(tail)
        except BaseException as exc:
            self._release()
            if isinstance(exc, OSError):
                raise storage_error(exc, operation, self.directory) from exc
            raise
        return tail

    def _tail_under_lock(self) -> Tail:
        """The tail, read under the lock. No live writer can be mid-update, so a torn or
        invalid tail was left by a writer that died: recovery repairs it (the one way a
        torn tail is handled, whichever path meets it)."""
        tail = self._tail_file.read_locked()
        if tail is None:
            self._recover(full=not self._tail_file.valid())
            tail = self._tail_file.read_locked()
            if tail is None:    # recovery just published it, and we hold the lock
                raise StorageError(f"the tail state of {self.name} stays torn after "
                                   "recovery", operation="recover",
                                   path=self._tail_file.path)
        return tail

    def _lock_timeout(self, timeout_s: float | None) -> LogkitTimeoutError:
        return LogkitTimeoutError(f"the append lock of {self.name} was not free within "
                                  f"{timeout_s} s (another process holds it: "
                                  f"{self._tail_file.path})")

    def _flock(self, deadline: float | None, timeout_s: float | None) -> None:
        fd = self._tail_file.fd
        try:
            sleep_s = _LOCK_POLL_S[0]
            while True:
                try:
                    _flock_now(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # first: the common case
                    return
                except BlockingIOError:
                    pass
                if deadline is None:
                    fcntl.flock(fd, fcntl.LOCK_EX)                  # waits, GIL released
                    return
                left = deadline - time.monotonic()
                if left <= 0:
                    raise self._lock_timeout(timeout_s) from None
                time.sleep(min(sleep_s, left))
                sleep_s = min(sleep_s * 2, _LOCK_POLL_S[1])
        except LogkitTimeoutError:
            raise                         # a TimeoutError is an OSError: not an I/O fault
        except OSError as exc:
            raise storage_error(exc, "lock", self._tail_file.path) from exc

    def _funlock(self) -> None:
        """Release the flock. What was done under it is done: a failing unlock must not
        turn a stored append into an error, so fall back to closing the descriptor,
        which releases the lock with it, and reopen the tail file."""
        try:
            _flock_now(self._tail_file.fd, fcntl.LOCK_UN)
        except OSError as exc:
            log.warning("unlock of %s failed (%s); reopening it to release the lock",
                        self._tail_file.path, exc)
            old = self._tail_file
            self._arm(None)                   # it names the old handle
            try:
                self._tail_file = TailFile(old.path)
            except OSError:
                log.error("could not reopen %s; the partition is closed", old.path)
                self._closed = True
            old.close()

    def tail(self) -> Tail:
        """The current tail, lock-free; repairs a tail left torn by a writer that died
        mid-update (under the lock, as every path does)."""
        if self._closed or self._pid != _fork._pid:
            self._check_usable()
        tail = self._tail_file.read()
        if tail is None:                  # torn for a long time: its writer may be dead
            with self._locked():
                tail = self._tail_under_lock()
        if tail.deleted:
            raise UnknownTopicError(f"topic {self.topic!r} was deleted")
        return tail

    def mark_deleted(self) -> None:
        """Flag the partition deleted (topic deletion's first step): from the moment the
        lock is released, every process's appends and reads of it raise."""
        if self._tail_file.deleted():
            return
        try:
            with self._locked_tail("delete topic") as tail:
                self._tail_file.publish(tail._replace(deleted=1))
                self._tail_file.sync()
        except UnknownTopicError:
            pass                          # another process flagged it meanwhile
        except OSError as exc:
            raise storage_error(exc, "delete topic", self.directory) from exc

    @property
    def deleted(self) -> bool:
        """True once the topic was deleted (by any process)."""
        return self._tail_file.deleted()

    # ---- opening and recovery (loader.py does the work) ------------------------------

    def _open_checks(self) -> None:
        """Decide, cheaply, whether this partition needs recovery, and run it."""
        tail_file = self._tail_file
        if self.read_only:             # inspect as it is: a valid tail is all we need
            tail = tail_file.read() if tail_file.valid() else None
            if tail is None:
                raise StorageError(f"{tail_file.path} needs recovery; open the directory "
                                   "read-write once", operation="open", path=tail_file.path)
            self._refresh(tail)
            return
        found = loader.clean_open(self.directory, tail_file)
        if found is None:
            with self._locked():
                # Decide again under the lock: without it we may have listed the files
                # in the middle of another process's roll or retention.
                if loader.needs_recovery(self.directory, tail_file):
                    self._recover(full=not tail_file.valid())
                self._refresh(self._tail_under_lock())
        else:                             # the listing that checked the files is the
            self._refresh(*found)         # segment list (one listing per open)

    def _recover(self, *, full: bool) -> RecoveryReport:
        """loader.recover with this log's segments closed first and re-listed after.
        Caller holds the lock."""
        self._close_segments()
        made: list[LogSegment] = []
        report = loader.recover(self.directory, self._tail_file, self.config, full=full,
                                name=self.name,
                                adopt=None if self.read_only else made.append)
        self._last_recovery = report
        try:
            self._refresh(self._tail_under_lock())
        except BaseException:
            for segment in made:
                segment.close()
            raise
        # A new partition's first segment, still open: kept as the active one, so the
        # first append does not open and map its files again.
        for segment in made:
            listed = self._listed
            if listed is not None and not self._segments \
                    and segment.base_offset == listed.active_base_offset:
                self._segments[segment.base_offset] = segment
            else:
                segment.close()
        return report

    def recover(self) -> RecoveryReport:
        """Force a full recovery scan (what an unclean open does), under the lock."""
        with self._locked():
            return self._recover(full=True)

    # ---- segment list ----------------------------------------------------------------

    def _refresh(self, tail: Tail, bases: list[int] | None = None) -> None:
        """Bring the cached segment list in line with the tail's version (`bases`: the
        live segments of that tail, when the caller has just listed them)."""
        self._listed = tail
        if tail.segments_version == self._segments_version:
            return
        self._arm(None)
        if bases is None:
            bases = live_bases(os.listdir(self.directory), tail)
        stale = [b for b, seg in self._segments.items()
                 if b not in bases or seg.active != (b == tail.active_base_offset)]
        for base in stale:
            self._segments.pop(base).close()
        for base in [b for b in self._parked
                     if b not in bases or b == tail.active_base_offset]:
            self._close_parked(base)
        self._bases = bases
        self._segments_version = tail.segments_version

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

    # ---- offsets ---------------------------------------------------------------------

    @property
    def log_start_offset(self) -> int:
        return self.tail().log_start_offset

    @property
    def log_end_offset(self) -> int:
        return self.tail().log_end_offset

    @property
    def high_watermark(self) -> int:
        return self.tail().high_watermark

    def size_bytes(self) -> int:
        return self._with_tail(self._size_bytes)

    def _size_bytes(self, tail: Tail) -> int:
        self._refresh(tail)
        return sum(self._sealed_size(b) for b in self._bases[:-1]) + tail.active_size

    # ---- append ----------------------------------------------------------------------

    def append_records(self, records: list[tuple], *, codec: int = 0, **batch_fields: Any) -> int:
        """Encode records as one batch and append it; returns its base offset."""
        return self.append_batch(encode_batch(records, codec=codec, **batch_fields))

    def append_batch(self, batch: bytearray, *, verify: bool = False,
                     lock_timeout_s: float | None = LOCK_TIMEOUT_S) -> int:
        """Append one encoded batch (baseOffset is stamped here); returns base offset.
        When `flush.messages` makes it durable, returns once a sync covers it
        (`append_batch_nowait` + `wait_synced`).

        `verify` checks the batch first as Kafka's broker checks a client's
        (`records.validate_batch`: CRC, every record's framing, recordsCount and
        lastOffsetDelta against the records, decompression, timestamps), for batches
        that did not come from our own encoder. Raises CorruptRecordError when the
        length field does not match the bytes or the check fails (InvalidRecordError,
        UnsupportedCompressionTypeError: its subclasses, for contents that lie and for
        codecs 5-7, the latter also unverified), RecordTooLargeError above
        max.message.bytes, LogkitTimeoutError when the append lock is not free within
        `lock_timeout_s`, StorageError (with the OSError as its cause) when a write or
        fsync fails — and then nothing of the batch is
        stored: the file is cut back to the published end before the lock is released,
        and a later roll never seals bytes past that end either."""
        base_offset, ticket = self.append_batch_nowait(batch, verify=verify,
                                                       lock_timeout_s=lock_timeout_s)
        if ticket is not None:
            self.wait_synced(ticket)
        return base_offset

    def append_batch_nowait(self, batch: bytearray, *, verify: bool = False,
                            lock_timeout_s: float | None = LOCK_TIMEOUT_S
                            ) -> tuple[int, SyncTicket | None]:
        """`append_batch` without the wait for its sync: (base offset, None) when the
        batch needs no sync, else (base offset, ticket) — the batch is stored but not
        readable, and not acknowledged, until `wait_synced(ticket)` returns (which any
        thread may call; the producer's SyncWaiter does).

        `batch` may also be a list of buffers that together hold one batch, the first a
        bytearray with the whole header (records.encode_batch_parts: a large value is
        then written from where it is, by one pwritev, never copied into a batch); when
        the batch is to be verified or rewritten, the pieces are joined first."""
        appender = self._appender
        if appender is not None and not verify:
            # The whole append in one C call when nothing stands in the way (`_arm`);
            # -1: it changed nothing, and the append below decides.
            try:
                base_offset = appender.append(batch)
            except OSError as exc:          # cut back under the lock (`_cut_back_fast`)
                raise storage_error(exc, "append", self.directory) from exc
            if base_offset >= 0:
                return base_offset, None
        config = self.config
        if type(batch) is list:
            batch = _pieces(batch)
        header = _whole_batch_header(batch)
        size = header.size
        if size > config["max.message.bytes"]:      # the whole batch, as Kafka counts it
            raise RecordTooLargeError(
                f"record batch of {size} bytes exceeds max.message.bytes="
                f"{config['max.message.bytes']} of topic {self.topic!r}; a batch this "
                f"large needs both that topic setting and the producer's "
                f"max_request_size (max.request.size) raised")
        recompress = config["compression.type"] not in ("producer",
                                                        TOPIC_COMPRESSION_TYPE[header.codec])
        append_time = config["message.timestamp.type"] == "LogAppendTime"
        if type(batch) is _Pieces and (verify or recompress or append_time):
            batch = bytearray(b"".join(batch.pieces))    # checked or rewritten whole
        if verify:
            validate_batch(batch, 0, header)   # CRC, records, timestamps: before any lock
        if recompress:
            batch = self._recompress(batch, header)
            header = _whole_batch_header(batch)
            size = header.size
        if append_time:
            stamp_log_append_time(batch, _now_ms())
            header = _whole_batch_header(batch)
        count = header.last_offset_delta + 1
        self._acquire(lock_timeout_s)
        try:
            try:
                base_offset = -1
                if self._fast_segment is not None and type(batch) is bytearray:
                    base_offset = self._append_fast(batch)
                if base_offset < 0:
                    # `_locked_tail`'s prelude, then the general append
                    tail = self._tail_under_lock()
                    self._refresh(tail)
                    base_offset = self._append_locked(batch, header, size, count, tail)
            except OSError as exc:
                raise storage_error(exc, "append", self.directory) from exc
            deferred, self._deferred = self._deferred, None
        finally:
            self._release()
        if deferred is not None:
            return base_offset, SyncTicket(deferred[0], deferred[1], base_offset,
                                           header.crc)
        if self._doorbell is not None:
            self._doorbell.ring(self._change_slot)
        return base_offset, None

    def _append_fast(self, batch: bytearray) -> int:
        """The common append in one C call (`shortio.append_common`, the twin of
        `_append_locked` for an append that needs no roll, sync, index reservation or
        repair): the base offset, or -1 with nothing changed when `_append_locked` must
        decide. Called under the lock, only after a general append of this process
        (`_dirty`) set `_fast_segment`; the C call checks that the tail still names
        that segment and segment list. A failed write is cut back, as `_append_locked`
        does."""
        segment = self._fast_segment
        files = segment.append_files()
        if files is None:
            return -1
        config = self.config
        try:
            return _append_common(
                self._tail_file.mm, batch, *files, segment.base_offset,
                self._segments_version, BOOT_ID, config["segment.bytes"],
                config["segment.ms"], config["index.interval.bytes"],
                config["flush.messages"])
        except OSError:
            tail = self._tail_file.read_locked()       # unchanged: nothing was published
            if tail is not None:
                self._cut_back(segment, tail.active_size)
            raise

    def _arm(self, segment: LogSegment | None) -> None:
        """Set the segment the next append may take in one C call (None: none). The
        C appender (shortio.Appender) takes the locks without waiting, appends as
        `_append_fast` does, releases and rings, or changes nothing and hands the
        append back. It is made here, after a general append, with the handles and
        index reservations of that moment, and dropped with the segment. A topic that
        rewrites batches (LogAppendTime) gets none, nor one whose every append syncs
        (flush.messages=1: each would be handed back)."""
        self._fast_segment = segment
        self._appender = None
        if segment is None or _Appender is None:
            return
        files = segment.append_files()
        config = self.config
        if files is None or config["message.timestamp.type"] == "LogAppendTime" \
                or config["flush.messages"] <= 1:
            return
        codec = config["compression.type"]
        tail_file = self._tail_file
        doorbell = self._doorbell
        self._appender = _Appender(
            self._pid, self._append_lock, self._thread_lock, tail_file.fd, tail_file.mm,
            *files, segment.base_offset, self._segments_version, BOOT_ID,
            config["segment.bytes"], config["segment.ms"], config["index.interval.bytes"],
            config["flush.messages"], config["max.message.bytes"],
            -1 if codec == "producer" else CODEC_NAMES[codec], doorbell,
            change_offset(self._change_slot), self._cut_back_fast, self._funlock)

    def _cut_back_fast(self, position: int) -> None:
        """The C appender's write failed at `position`: cut back (under the lock)."""
        segment = self._fast_segment
        if segment is not None:
            self._cut_back(segment, position)

    def _append_locked(self, batch: bytearray, header: BatchHeader, size: int, count: int,
                       tail: Tail, shipped_roll: bool | None = None) -> int:
        config = self.config
        # Another process may have added index entries since this one last
        # appended: take the published counts, or we would overwrite theirs.
        self._segment(tail.active_base_offset).set_index_entries(
            tail.index_entries, tail.timeindex_entries)
        now = _now_ms()
        if shipped_roll is None:
            if self._must_roll(tail, size, count, now):
                tail = self._roll(tail)
        elif shipped_roll and tail.active_size:     # a replica rolls where its leader did
            tail = self._roll(tail)
        segment = self._segment(tail.active_base_offset)
        if not self._dirty:               # this process's first append: a dead writer
            self._cut_unpublished(segment, tail)    # may have left bytes past the end
        base_offset = tail.log_end_offset
        stamp_base_offset(batch.pieces[0] if type(batch) is _Pieces else batch, base_offset,
                          tail.leader_epoch)
        position = tail.active_size
        last_offset = base_offset + count - 1
        flush = tail.unflushed_messages + count >= config["flush.messages"]
        # Our own appends that must be durable sync after the lock (group commit, see
        # the module docstring); a replica's batches still sync here.
        deferred = flush and shipped_roll is None
        if deferred:
            flush = False
        try:
            segment.write(batch.pieces if type(batch) is _Pieces else batch, position)
            if flush:
                # The log file only: the active segment's indexes are derived data that
                # recovery rebuilds after an OS crash, and an fsync of each (dirty) index
                # map would triple the device flushes per durable append.
                segment.flush_log()
                self._sync_directory_once(tail.active_base_offset)
        except OSError:
            self._cut_back(segment, position)
            raise
        max_ts, max_ts_offset = tail.max_timestamp, tail.max_timestamp_offset
        if header.max_timestamp > max_ts:
            max_ts, max_ts_offset = header.max_timestamp, last_offset
        segment.index_batch(last_offset, position, config["index.interval.bytes"],
                            max_ts, max_ts_offset)
        entries, time_entries = segment.index_entry_counts()
        # Every field, in Tail's order (one construction: `_replace` with eleven
        # keywords costs more than the write it describes)
        tail = Tail(
            tail.boot_id, tail.log_start_offset, last_offset + 1,
            tail.active_base_offset, position + size, entries, time_entries,
            tail.segments_version,
            tail.high_watermark if deferred else last_offset + 1,     # high_watermark
            max_ts, max_ts_offset,
            last_offset + 1 if flush else tail.recovery_point,        # recovery_point
            now if tail.roll_time_ms < 0 else tail.roll_time_ms,      # roll_time_ms
            0,                                                        # clean
            0 if flush else tail.unflushed_messages + count,          # unflushed_messages
            -1 if flush else now if tail.first_unflushed_ms < 0
            else tail.first_unflushed_ms,                             # first_unflushed_ms
            tail.leader_epoch, tail.deleted)
        self._tail_file.publish(tail)
        self._dirty = True
        if _append_common is not None:
            self._arm(segment)
        if deferred:
            self._deferred = (last_offset + 1, tail.segments_version)
        return base_offset

    def _cut_back(self, segment: LogSegment, position: int) -> None:
        """After a failed write or fsync, cut the file back to the published end so the
        failed batch can never be sealed or recovered as data. If even that fails, the
        bytes stay past the committed size, where no reader looks and the next roll or
        append cuts them."""
        try:
            segment.truncate(position)
        except OSError as exc:
            log.warning("%s: could not cut %s back to %d after a failed append: %s",
                        self.name, segment.path, position, exc)

    def _cut_unpublished(self, segment: LogSegment, tail: Tail) -> None:
        """Cut bytes past the committed size: never acknowledged (a writer died between
        its write and its publish, or its write failed). Appends write at the committed
        end and a sealed segment is read to its file size, so they must go first."""
        file_size = segment.file_size()
        if file_size > tail.active_size:
            log.warning("%s: cutting %d unpublished bytes past the committed end %d of %s "
                        "(a writer died mid-append)", self.name,
                        file_size - tail.active_size, tail.active_size, segment.path)
            segment.truncate(tail.active_size)

    def _must_roll(self, tail: Tail, size: int, count: int, now: int) -> bool:
        if tail.active_size == 0:
            return False
        config = self.config
        segment = self._segment(tail.active_base_offset)
        return (tail.active_size + size > config["segment.bytes"]
                or segment.offset_index.is_full or segment.time_index.is_full
                or now - tail.roll_time_ms > config["segment.ms"]
                or tail.log_end_offset + count - tail.active_base_offset >= 2**31)

    def _roll(self, tail: Tail) -> Tail:
        """Seal the active segment (fsync it, trim its indexes) and start a new one.

        The order survives a SIGKILL at any step, with other processes still using the
        partition: the final time entry and the fsync come first; a new segment's files
        are created (after removing any a killed roller left) before the tail names
        them; the old indexes are trimmed only after that, when no process appends to
        them any more (a sealed index left untrimmed reads as its non-zero entries)."""
        sealed = tail
        old = self._segment(tail.active_base_offset)
        self._cut_unpublished(old, tail)
        old.set_index_entries(tail.index_entries, tail.timeindex_entries)
        old.time_index.append(tail.max_timestamp, tail.max_timestamp_offset)
        old.flush()
        # its name too: the recovery point is about to pass it (fsync does not make a
        # file's directory entry durable; docs/storage.md "The directory entry")
        self._sync_directory_once(tail.active_base_offset)
        new_base = tail.log_end_offset
        for name in os.listdir(self.directory):       # never published: a dead roller's
            base = parse_segment_name(name)
            if base is not None and base > tail.active_base_offset:
                unlink_segment(self.directory, base)
        LogSegment(self.directory, new_base, active=True,
                   create_index_bytes=self.config["segment.index.bytes"]).close()
        tail = tail._replace(active_base_offset=new_base, active_size=0, index_entries=0,
                             timeindex_entries=0,
                             segments_version=tail.segments_version + 1,
                             max_timestamp=-1, max_timestamp_offset=-1, roll_time_ms=-1,
                             recovery_point=new_base, unflushed_messages=0,
                             first_unflushed_ms=-1,        # the old segment was fsynced
                             high_watermark=max(tail.high_watermark, new_base))
        self._tail_file.publish(tail)
        old.seal(sealed.max_timestamp, sealed.max_timestamp_offset, sealed.active_size)
        self._segments.pop(sealed.active_base_offset, None)   # a reader reopens it:
        old.close()                                # appenders hold no sealed segment
        self._refresh(tail)
        log.debug("%s: rolled segment %d (%d bytes) to a new one at offset %d", self.name,
                  sealed.active_base_offset, sealed.active_size, new_base)
        return tail

    def roll(self) -> None:
        """Start a new segment now (Kafka's forced roll), unless the active one is empty."""
        with self._locked_tail("roll") as tail:
            if tail.active_size:
                try:
                    self._roll(tail)
                except OSError as exc:
                    raise storage_error(exc, "roll", self.directory) from exc

    # ---- a follower's log (logkit/replication) --------------------------------------

    def segment_bases(self) -> list[int]:
        """Base offsets of the live segments, oldest first."""
        return self._with_tail(self._segment_bases)

    def _segment_bases(self, tail: Tail) -> list[int]:
        self._refresh(tail)
        return list(self._bases)

    @property
    def leader_epoch(self) -> int:
        """The partitionLeaderEpoch this log stamps on the batches it appends."""
        return self.tail().leader_epoch

    def set_leader_epoch(self, epoch: int) -> None:
        """Stamp later appends with `epoch` (a promotion); it may only grow."""
        with self._locked_tail("set the leader epoch") as tail:
            if epoch < tail.leader_epoch:
                raise IllegalStateError(f"{self.name}: leader epoch {epoch} is below the "
                                        f"current {tail.leader_epoch}")
            if epoch != tail.leader_epoch:
                self._tail_file.publish(tail._replace(leader_epoch=epoch))
                self._tail_file.sync()

    def append_replicated(self, data: Any, *, segment_bases: Container[int] = (),
                          lock_timeout_s: float | None = LOCK_TIMEOUT_S) -> int:
        """Append whole batches as a leader stored them (a follower's append): base
        offsets and partitionLeaderEpoch kept, nothing rewritten, and a new segment
        started before each batch whose base offset is in `segment_bases` (where the
        leader started one), so the segment files come out byte-identical to the
        leader's. Every batch is checked before any is written — whole, CRC-valid, the
        first starting at the log end, the rest contiguous — else CorruptRecordError
        and nothing is written. The tail's leader epoch follows the batches. Returns
        the new log end offset."""
        size = len(data)
        with self._locked_tail("replicate", lock_timeout_s) as tail:
            batches = list(iter_batches(data, 0, size, f"batches shipped to {self.name}",
                                        first_offset=tail.log_end_offset, verify=True))
            try:
                for pos, header in batches:
                    self._append_locked(bytearray(data[pos:pos + header.size]), header,
                                        header.size, header.last_offset_delta + 1,
                                        tail._replace(leader_epoch=header.leader_epoch),
                                        shipped_roll=header.base_offset in segment_bases)
                    tail = self._tail_under_lock()
            except OSError as exc:
                raise storage_error(exc, "replicate", self.directory) from exc
        if batches and self._doorbell is not None:
            self._doorbell.ring(self._change_slot)
        return tail.log_end_offset

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

    def _recompress(self, batch: bytearray, header: BatchHeader) -> bytearray:
        """Re-encode with the topic's compression.type (Kafka's broker-side override)."""
        records = decode_batch(batch, 0, header, self.topic, self.partition, verify=False)
        from .compression import codec_id
        codec = codec_id(self.config["compression.type"])
        return encode_batch([(r.key, r.value, r.headers, r.timestamp) for r in records],
                            codec=codec, producer_id=header.producer_id,
                            producer_epoch=header.producer_epoch,
                            base_sequence=header.base_sequence)

    # ---- flush -----------------------------------------------------------------------

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

    # ---- group commit (module docstring) ------------------------------------------------

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

    # ---- read ------------------------------------------------------------------------

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
             stop_offset: int | None = None) -> list[Record]:
        """Records from `offset` below the high watermark and below `stop_offset` (None:
        up to the high watermark).

        Raises OffsetOutOfRangeError outside [log_start_offset, high_watermark]; returns
        [] at the high watermark. Always returns at least one batch's records if any
        are available, even when that batch is bigger than `max_bytes`."""
        if max_records <= 0:
            raise ValueError("max_records must be positive")
        return self._with_tail(self._read, offset, max_records, max_bytes, stop_offset)

    def fetch(self, offset: int, *, max_records: int = 500,
              max_bytes: int = MAX_FETCH_BYTES) -> tuple[list[Record], int]:
        """`read(offset)` and the high watermark it read below, from one tail snapshot
        (a Kafka fetch response carries the partition's high watermark the same way):
        a reader whose position reached it has read everything there was."""
        if max_records <= 0:
            raise ValueError("max_records must be positive")
        return self._with_tail(self._fetch, offset, max_records, max_bytes)

    def _fetch(self, tail: Tail, offset: int, max_records: int,
               max_bytes: int) -> tuple[list[Record], int]:
        return self._read(tail, offset, max_records, max_bytes, None), tail.high_watermark

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
            if len(out) >= max_records or max_bytes <= 0 or not segment.scanned_to_end:
                break
            i += 1
            if i < len(bases):
                offset = max(offset, self._next_base(segment, size, segment.scan_end_offset,
                                                     bases[i]))
        return out

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
                    break
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

    # ---- retention -------------------------------------------------------------------

    def enforce_retention(self, now_ms: int | None = None) -> int:
        """Delete whole segments past retention.ms / retention.bytes; returns how many.

        Order, for a crash or an error at any step: the new log start is published (and
        synced) first, then the files are renamed `.deleted` and unlinked after
        file.delete.delay.ms, so a reader holding one open keeps reading. Files left
        below the published start by an interrupted run are swept at the next open."""
        now_ms = _now_ms() if now_ms is None else now_ms
        config = self.config
        retention_ms, retention_bytes = config["retention.ms"], config["retention.bytes"]
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

    # ---- lifecycle -------------------------------------------------------------------

    def close(self) -> None:
        """Flush and mark the tail clean if this process appended; safe to call twice.
        The files are released even when the flush fails; the error (a StorageError) is
        raised after, and the tail is then left unclean, so the next open recovers. In a
        forked child it releases nothing the parent still uses and touches no file."""
        if self._closed:
            return
        if self._pid != _fork.owner_pid():
            self._closed = True           # the parent's maps and locks: leave them be
            return
        error: BaseException | None = None
        if self._dirty and not self._tail_file.deleted():
            try:
                self._mark_clean()        # takes the locks itself: not under _thread_lock
            except (OSError, StorageError, LogkitTimeoutError, ClosedError) as exc:
                error = exc
        with self._thread_lock:
            if self._closed:
                return
            self._closed = True
            self._close_segments()
            self._tail_file.close()
        if isinstance(error, OSError):
            raise storage_error(error, "close", self.directory) from error
        if error is not None:
            raise error

    def _mark_clean(self) -> None:
        with self._locked_tail("close") as tail:
            self._segment(tail.active_base_offset).flush()
            self._sync_directory_once(tail.active_base_offset)
            self._tail_file.publish(tail._replace(
                recovery_point=tail.log_end_offset, unflushed_messages=0,
                first_unflushed_ms=-1, clean=1,
                high_watermark=max(tail.high_watermark, tail.log_end_offset)))
            self._tail_file.sync()

    def check(self) -> None:
        """Full consistency check (tests call it after mutations): every batch whole,
        CRC-valid and decoding as a reader decodes it (`records.check_records`: framing,
        count, offset deltas, codec), offsets contiguous from the log start to the log
        end across segments, every offset index entry pointing at a batch start. Raises
        CorruptRecordError naming the file and position of the first inconsistency."""
        self._with_tail(self._check)

    def _check(self, tail: Tail) -> None:
        self._refresh(tail)
        bases = self._bases
        self._first_segment(tail.log_start_offset, tail.log_end_offset)
        expected = bases[0] if bases else tail.log_start_offset
        segment = None
        size = 0
        for base in bases:
            segment, size = self._sized(base, tail)
            if base != expected:
                raise CorruptRecordError(
                    "segment does not begin where the previous one ends (missing or "
                    "truncated segment)", path=segment.path, position=0,
                    expected=expected, actual=base)
            starts = set()
            buf = segment.view(size)
            for pos, header in segment.headers(0, size, verify=True):
                check_records(buf, pos, header, segment.path)     # what a reader decodes
                expected = header.last_offset + 1
                starts.add(pos)
            index = segment.offset_index
            for n in range(index.entries):
                position = index.entry(n)[1]
                if position not in starts:
                    raise CorruptRecordError(
                        "offset index entry does not point at a batch start",
                        path=segment.index_path, position=n * index.entry_size,
                        expected="a batch start", actual=position)
        if expected != tail.log_end_offset:
            raise CorruptRecordError(
                "the log does not end at the log end offset", path=segment.path
                if segment is not None else self.directory, position=size,
                expected=tail.log_end_offset, actual=expected)


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


class _Pieces:
    """A batch in pieces (see `append_batch_nowait`): `len()` is the batch's size, the
    stamps go into the first piece (which holds the header), `LogSegment.write` writes
    the list with one pwritev."""

    __slots__ = ("pieces", "size")

    def __init__(self, pieces: list[Any]) -> None:
        self.pieces = pieces
        self.size = sum(map(len, pieces))

    def __len__(self) -> int:
        return self.size


def _pieces(pieces: list[Any]) -> Any:
    """A batch given as a list of buffers: `_Pieces` when the first holds the whole
    header in a bytearray (where the stamps go), else the buffers joined."""
    head = pieces[0] if pieces else None
    if type(head) is bytearray and len(head) >= RECORDS_OFFSET:
        return _Pieces(pieces)
    return bytearray(b"".join(pieces))


def _whole_batch_header(batch: Any) -> BatchHeader:
    """The header of a batch given as its exact bytes, else CorruptRecordError (its
    subclass UnsupportedCompressionTypeError for a codec Kafka does not define)."""
    size = len(batch)
    # in pieces, the header is all in the first one (`_pieces` checked)
    header = read_header(batch.pieces[0] if type(batch) is _Pieces else batch, 0, size)
    if header is None or header.size != size:
        raise CorruptRecordError("append of a batch whose length field does not match "
                                 "its bytes", expected=size,
                                 actual=None if header is None else header.size)
    if header.codec not in TOPIC_COMPRESSION_TYPE:
        raise UnsupportedCompressionTypeError(
            f"append of a batch with compression codec {header.codec}: Kafka defines "
            f"{min(TOPIC_COMPRESSION_TYPE)}-{max(TOPIC_COMPRESSION_TYPE)}",
            expected=sorted(TOPIC_COMPRESSION_TYPE), actual=header.codec)
    return header
