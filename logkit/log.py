"""The partition log: the sorted segments of one `<topic>-<partition>` directory, and
appends, rolls, reads, retention and the flush policy over them.

`PartitionLog` is put together from its jobs, one module each (as Kafka splits LocalLog,
UnifiedLog and the log manager): `partition_lock.py` the append lock across threads and
processes, `segment_cache.py` the open and parked segments, `log_append.py` the three
append tiers and rolls, `group_commit.py` syncs and group commit, `log_read.py` every
read, `log_trim.py` retention and truncation, `log_clean.py` a compaction pass,
`log_txn.py` idempotent producers, transaction markers and the last stable offset
(over `producer_state.py` and `txn_index.py`). This module keeps opening and recovery,
the tail, leader epochs, close and `check()`.

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

import logging
import os
import threading
from typing import Any, Mapping

from . import _fork, loader
from ._files import check_directory, open_file
from .config import is_compacted
from .errors import (
    ClosedError,
    CorruptRecordError,
    IllegalStateError,
    LogkitTimeoutError,
    StorageError,
    UnknownTopicError,
    storage_error,
)
from .group_commit import SyncTicket, _GroupCommit
from .loader import RecoveryReport, leftovers, live_bases
from .log_append import _LogAppends
from .log_clean import _LogClean
from .log_read import BATCHES_SINCE_MAX_BYTES, MAX_FETCH_BYTES, _LogReads
from .log_trim import _LogTrim
from .log_txn import _LogTransactions
from .notify import change_slot
from .partition_lock import LOCK_TIMEOUT_S, _PartitionLock
from .producer_state import ProducerStateManager
from .records import check_cleaned_records, check_records
from .segment import DELETED_SUFFIX, LogSegment
from .segment_cache import _PARK_BUDGET, _SegmentCache
from .tail import BOOT_ID, TAIL_FILE, Tail, TailFile
from .txn_index import TxnIndexCache

# Names other modules import from here (broker.py, topic.py, tests): they moved to
# tail.py and loader.py and stay importable from this module.
__all__ = ["PartitionLog", "Tail", "TailFile", "RecoveryReport", "check_directory",
           "open_file", "live_bases", "leftovers", "BOOT_ID", "TAIL_FILE", "DELETED_SUFFIX",
           "MAX_FETCH_BYTES", "BATCHES_SINCE_MAX_BYTES", "LOCK_TIMEOUT_S", "SyncTicket"]

log = logging.getLogger(__name__)

_fork.at_fork_in_child(_PARK_BUDGET.reset)


class PartitionLog(_LogAppends, _PartitionLock, _SegmentCache, _GroupCommit, _LogReads, _LogTrim,
                   _LogTransactions, _LogClean):
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
        # Idempotence and transactions (log_txn.py): this process's producer state, the
        # segment-list version it was checked against, the parsed `.txnindex` files,
        # and which index entries' markers were found in the log.
        self._producers: ProducerStateManager | None = None
        self._producers_version = -1
        self._txn_indexes = TxnIndexCache(directory)
        self._txn_markers_seen: dict[tuple[int, int], bool] = {}
        # A compacted log may have offset gaps (segment.py's `gaps`); so may one cleaned
        # once, whatever its policy now. `_clean_count`: the cleaning passes this
        # process's cached segments have seen (a pass replaces sealed segment files).
        self._gaps = is_compacted(self.config)
        self._clean_count = 0
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

    # ---- config ----------------------------------------------------------------------

    def apply_config(self, config: Mapping[str, Any]) -> None:
        """Take a topic's new resolved config at once (Kafka's LogManager updating a live
        log's config; `Broker.alter_topic_config` in any process): appends, rolls,
        retention, flushes and cleaning read `self.config` each time, so they follow it
        from their next call. What was derived from the old one is dropped: the C
        appender (`_arm` made it with that moment's segment.bytes, roll age,
        index.interval.bytes, flush.messages, max.message.bytes and compression; the
        next general append makes another), and a log turned compacted may have offset
        gaps from its first cleaning on (a log that was compacted keeps allowing them).

        The dict is replaced whole, so a reader sees the old config or the new one,
        never a mix. The config goes in before the appender goes, and `_arm` drops an
        appender made from a config that was replaced meanwhile, so none outlives it.
        When no appender of this process holds the append lock, the fast segment goes
        too, so the next append is a general one and arms a new appender at once;
        otherwise that waits for the next roll (`_append_fast` reads the config live)."""
        self.config = dict(config)
        self._appender = None
        if self._append_lock.acquire(blocking=False):
            try:
                self._arm(None)
            finally:
                self._append_lock.release()
        if is_compacted(self.config) and not self._gaps:
            with self._thread_lock:
                self._gaps = True
                for segment in (*self._segments.values(), *self._parked.values()):
                    segment.gaps = True

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
        self._sweep_cleaner_leftovers()   # a cleaning pass killed before its swap

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
            tail = self._tail_under_lock()
            self._refresh(tail)
            if not self.read_only:
                self._after_recovery(tail)    # producer state and .txnindex (log_txn.py)
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
            # A listing races a roll, a retention run or a cleaning pass's swap in
            # another process: it is the list of `tail` only if the tail still says so
            # (the read starts over otherwise: `_with_tail`).
            now = self._tail_file.read_locked()
            if now is None or now.segments_version != tail.segments_version:
                raise FileNotFoundError(f"{self.directory}: the segment list changed "
                                        "while it was listed")
        if tail.clean_count != self._clean_count:
            # A pass swapped sealed segment files in: every cached one may be stale.
            self._gaps = True
            self._clean_count = tail.clean_count
            self._sealed_sizes.clear()
            for base in [b for b, seg in self._segments.items() if not seg.active]:
                self._segments.pop(base).close()
            for base in list(self._parked):
                self._close_parked(base)
        stale = [b for b, seg in self._segments.items()
                 if b not in bases or seg.active != (b == tail.active_base_offset)]
        for base in stale:
            self._segments.pop(base).close()
        for base in [b for b in self._parked
                     if b not in bases or b == tail.active_base_offset]:
            self._close_parked(base)
        self._bases = bases
        self._segments_version = tail.segments_version

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

    # ---- flush -----------------------------------------------------------------------

    # ---- group commit (module docstring) ------------------------------------------------

    # ---- read ------------------------------------------------------------------------

    # ---- retention -------------------------------------------------------------------

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
            self._snapshot_producer_state(tail, sync=True)   # Kafka's, at a clean close
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
                if segment.gaps:                                  # what a reader decodes
                    check_cleaned_records(buf, pos, header, segment.path)
                else:
                    check_records(buf, pos, header, segment.path)
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


