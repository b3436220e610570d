"""The partition log: sorted segments, the shared tail state, appends, reads, recovery,
retention and the flush policy of one `<topic>-<partition>` directory.

Owns: everything in one partition directory. Several processes may have the same
partition open; they coordinate through two things in the directory:

* `logkit.tail` — a small mmap'd file, the *tail state*: log start/end offsets, the
  active segment's committed size and index entry counts, the high watermark, the
  recovery point and a segment-list version. It is written under a seqlock (an odd
  sequence number means "being written") so readers take no lock and never see a
  half-updated tail. Readers read only below the committed size, so they never see a
  batch an appender is still writing; they notice rolls and deletions through the
  segment-list version and rescan the directory.
* an exclusive `flock` on that file (plus a thread lock) serialises appends, rolls,
  retention and recovery across processes. The appender re-reads the tail after taking
  it and stamps offsets under it.

Durability: data goes to the page cache on append, so a process killed at any instant
loses nothing it had published; the torn bytes past the committed size are cut by the
next appender. After an OS crash (detected by a different boot id in the tail) or a
tail caught mid-update, recovery re-validates every batch from the recovery point by
CRC, rebuilds the indexes and truncates at the first bad byte. A clean close marks the
tail clean after an fsync, which lets the next boot skip recovery. `flush.messages` and
`flush.ms` set the fsync policy, as in Kafka.

Invariant: segments are contiguous in offsets; offsets below `log_end_offset` are in
exactly one segment; bytes below each segment's committed size are CRC-valid batches.
"""

from __future__ import annotations

import bisect
import errno
import fcntl
import logging
import mmap
import os
import struct
import threading
import time
from contextlib import contextmanager
from typing import Any, Iterator, Mapping, NamedTuple

from . import _fork
from .errors import (ClosedError, CorruptRecordError, LogkitTimeoutError, OffsetOutOfRangeError,
                     ReadOnlyError, RecordTooLargeError, StorageError, UnknownTopicError,
                     storage_error)
from .records import (ATTR_CODEC_MASK, ATTR_CONTROL, ATTRIBUTES_OFFSET, CRC_OFFSET, LOG_OVERHEAD,
                      RECORDS_OFFSET, Record, _CRC, _HEADER, check_batch, decode_batch,
                      encode_batch, read_header, stamp_base_offset)
from .crc import crc32c
from .segment import LogSegment, parse_segment_name, segment_file_name

__all__ = ["PartitionLog", "Tail", "RecoveryReport"]

TAIL_FILE = "logkit.tail"
TAIL_MAGIC = b"LKT1"
TAIL_FILE_BYTES = 4096
DELETED_SUFFIX = ".deleted"
FILE_MODE = 0o600                     # data files are the owner's alone (docs/storage.md)
LOCK_TIMEOUT_S = 30.0
MAX_OPEN_SEGMENTS = 8                 # per partition: sealed ones beyond are closed                 # default bound on waiting for the append lock
_LOCK_POLL_S = (0.00005, 0.005)       # first and longest sleep between flock tries

log = logging.getLogger("logkit.log")
MAX_FETCH_BYTES = 52428800            # Kafka's fetch.max.bytes default: one read's bound
BATCHES_SINCE_MAX_BYTES = 1 << 20     # batches_since() bound (one batch at least)
SEQLOCK_SPINS = 10000                 # reader retries before suspecting a dead writer


class Tail(NamedTuple):
    """The shared tail state (see module docstring). Offsets are logical record numbers;
    sizes and positions are bytes."""

    boot_id: bytes
    log_start_offset: int
    log_end_offset: int
    active_base_offset: int
    active_size: int
    index_entries: int
    timeindex_entries: int
    segments_version: int
    high_watermark: int
    max_timestamp: int           # of the active segment
    max_timestamp_offset: int
    recovery_point: int          # offsets below it are fsynced
    roll_time_ms: int            # wall-clock time of the active segment's first append
    clean: int                   # 1: fsynced at a clean close, nothing appended since
    unflushed_messages: int
    first_unflushed_ms: int
    leader_epoch: int
    deleted: int = 0             # 1: the topic was deleted; every use raises


_SEQ = struct.Struct("<Q")
_SEQ_OFFSET = 8
_BODY = struct.Struct("<16sqqqqqqQqqqqqqqqqq")
_BODY_OFFSET = 16
_DELETED_OFFSET = _BODY_OFFSET + _BODY.size - 8      # the last field: `deleted`
_MAGIC = struct.Struct("<4sI")


class RecoveryReport(NamedTuple):
    segments_checked: int
    bytes_checked: int
    bytes_truncated: int
    seconds: float


def _boot_id() -> bytes:
    try:
        with open("/proc/sys/kernel/random/boot_id", "rb") as f:
            return bytes.fromhex(f.read().strip().decode().replace("-", ""))[:16]
    except (OSError, ValueError):
        return b"\0" * 16        # unknown: every unclean open then runs recovery


BOOT_ID = _boot_id()


class TailFile:
    """The mmap'd tail state file and its seqlock. Writes need the partition lock."""

    def __init__(self, path: str, *, read_only: bool = False) -> None:
        self.path = path
        self.fd = open_file(path, os.O_RDONLY if read_only else os.O_RDWR | os.O_CREAT)
        try:
            self.created = os.fstat(self.fd).st_size < TAIL_FILE_BYTES
            if read_only:
                if self.created:
                    raise StorageError(f"{path} is not a complete tail file; open the "
                                       "directory read-write once to recover it",
                                       operation="open", path=path)
                self.mm = mmap.mmap(self.fd, TAIL_FILE_BYTES, access=mmap.ACCESS_READ)
                return
            if self.created:      # real blocks, so a full disk fails here, not as SIGBUS
                os.posix_fallocate(self.fd, 0, TAIL_FILE_BYTES)
            self.mm = mmap.mmap(self.fd, TAIL_FILE_BYTES)
        except BaseException:
            os.close(self.fd)
            raise

    def deleted(self) -> bool:
        return bool(struct.unpack_from("<q", self.mm, _DELETED_OFFSET)[0])

    def valid(self) -> bool:
        magic, version = _MAGIC.unpack_from(self.mm, 0)
        return magic == TAIL_MAGIC and version == 1

    def torn(self) -> bool:
        """True when a writer died between the two halves of a seqlock update."""
        return bool(_SEQ.unpack_from(self.mm, _SEQ_OFFSET)[0] & 1)

    def read(self) -> Tail | None:
        """A consistent snapshot, or None after SEQLOCK_SPINS torn reads in a row."""
        mm = self.mm
        for spin in range(SEQLOCK_SPINS):
            seq = _SEQ.unpack_from(mm, _SEQ_OFFSET)[0]
            if not seq & 1:
                body = _BODY.unpack_from(mm, _BODY_OFFSET)
                if _SEQ.unpack_from(mm, _SEQ_OFFSET)[0] == seq:
                    return Tail._make(body)
            if spin > 100:
                time.sleep(0.0001)
        return None

    def read_torn(self) -> Tail:
        """The fields as a writer that died mid-update left them (each old or new)."""
        return Tail._make(_BODY.unpack_from(self.mm, _BODY_OFFSET))

    def write(self, tail: Tail) -> None:
        mm = self.mm
        seq = _SEQ.unpack_from(mm, _SEQ_OFFSET)[0]
        seq = seq + 1 if seq & 1 else seq + 2     # a torn odd value from a dead writer
        _SEQ.pack_into(mm, _SEQ_OFFSET, seq - 1 | 1)
        _MAGIC.pack_into(mm, 0, TAIL_MAGIC, 1)
        _BODY.pack_into(mm, _BODY_OFFSET, *tail)
        _SEQ.pack_into(mm, _SEQ_OFFSET, seq)

    def sync(self) -> None:
        self.mm.flush()

    def close(self) -> None:
        self.mm.close()
        os.close(self.fd)


def _now_ms() -> int:
    return int(time.time() * 1000)


def open_file(path: str, flags: int) -> int:
    """os.open that never follows a symbolic link at `path` (a link planted in the data
    directory must not redirect our writes); raises StorageError naming the path."""
    try:
        return os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, FILE_MODE)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise StorageError(f"refusing to open {path}: it is a symbolic link",
                               operation="open", path=path, errno=exc.errno) from exc
        raise


def check_directory(path: str) -> None:
    """A partition directory must be a real directory, not a link to one elsewhere."""
    if os.path.islink(path):
        raise StorageError(f"refusing to use {path}: it is a symbolic link",
                           operation="open", path=path, errno=errno.ELOOP)


class PartitionLog:
    """One partition directory. Thread-safe; process-safe through the tail file."""

    def __init__(self, directory: str, topic: str, partition: int,
                 config: Mapping[str, Any], *, doorbell: Any = None,
                 read_only: bool = False) -> None:
        self.directory = directory
        self._doorbell = doorbell      # rung after each append (notify.Doorbell)
        self.topic = topic
        self.partition = partition
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
        self._sealed_sizes: dict[int, int] = {}
        self._bases: list[int] = []
        self._segments_version = -1
        self._dirty = False            # this process appended since its last clean flush
        self._closed = False
        self.last_recovery: RecoveryReport | None = None
        try:
            if not read_only:
                os.makedirs(directory, mode=0o700, exist_ok=True)
            check_directory(directory)
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

    # ---- locking and tail ------------------------------------------------------------

    def _check_usable(self) -> None:
        """Raise for a closed partition, a forked process, or a deleted topic."""
        _fork.check_owner(self._pid, f"partition {self.topic}-{self.partition}")
        if self._closed:
            raise ClosedError(f"partition {self.topic}-{self.partition} is closed")
        if self._tail_file.deleted():
            raise UnknownTopicError(f"topic {self.topic!r} was deleted")

    @contextmanager
    def _locked(self, timeout_s: float | None = LOCK_TIMEOUT_S) -> Iterator[None]:
        """The append lock: this process's appenders queue on `_append_lock`, then the
        flock excludes other processes, then `_thread_lock` excludes our readers for
        the (short) mutation. Waits at most `timeout_s` (None: no bound) in all, then
        raises LogkitTimeoutError; the deleted flag is checked once the lock is held."""
        self._check_usable()
        if self.read_only:
            raise ReadOnlyError(f"partition {self.topic}-{self.partition} is open read-only")
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        if not self._append_lock.acquire(timeout=-1 if timeout_s is None else timeout_s):
            raise self._lock_timeout(timeout_s)
        try:
            self._flock(deadline, timeout_s)
            try:
                with self._thread_lock:
                    self._check_usable()
                    yield
            finally:
                self._funlock()
        finally:
            self._append_lock.release()

    def _lock_timeout(self, timeout_s: float | None) -> LogkitTimeoutError:
        return LogkitTimeoutError(f"the append lock of {self.topic}-{self.partition} was "
                                  f"not free within {timeout_s} s (another process holds "
                                  f"it: {self._tail_file.path})")

    def _flock(self, deadline: float | None, timeout_s: float | None) -> None:
        fd = self._tail_file.fd
        try:
            if deadline is None:
                fcntl.flock(fd, fcntl.LOCK_EX)
                return
            sleep_s = _LOCK_POLL_S[0]
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    return
                except BlockingIOError:
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
            fcntl.flock(self._tail_file.fd, fcntl.LOCK_UN)
        except OSError as exc:
            log.warning("unlock of %s failed (%s); reopening it to release the lock",
                        self._tail_file.path, exc)
            old = self._tail_file
            try:
                self._tail_file = TailFile(old.path)
            except OSError:
                log.error("could not reopen %s; the partition is closed", old.path)
                self._closed = True
            old.close()

    def tail(self) -> Tail:
        """The current tail; repairs a tail left torn by a writer that died mid-update."""
        if self._closed or self._pid != _fork._pid:
            self._check_usable()
        tail = self._tail_file.read()
        if tail is None:
            with self._locked():
                if self._tail_file.torn():
                    self._recover(full=False)
                tail = self._tail_file.read()
                assert tail is not None
        if tail.deleted:
            raise UnknownTopicError(f"topic {self.topic!r} was deleted")
        return tail

    def mark_deleted(self) -> None:
        """Flag the partition deleted (topic deletion's first step): from the moment the
        lock is released, every process's appends and reads of it raise."""
        if self._tail_file.deleted():
            return
        try:
            with self._locked():
                tail = self._tail_file.read()
                assert tail is not None
                self._publish(tail._replace(deleted=1))
                self._tail_file.sync()
        except UnknownTopicError:
            pass                          # another process flagged it meanwhile
        except OSError as exc:
            raise storage_error(exc, "delete topic", self.directory) from exc

    @property
    def deleted(self) -> bool:
        """True once the topic was deleted (by any process)."""
        return self._tail_file.deleted()

    def _publish(self, tail: Tail) -> None:
        self._tail_file.write(tail._replace(boot_id=BOOT_ID))

    # ---- opening and recovery --------------------------------------------------------

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
        needs = not tail_file.valid() or tail_file.torn()
        if not needs:
            tail = tail_file.read()
            needs = tail is None or (tail.boot_id != BOOT_ID and not tail.clean)
            if not needs:
                needs = not self._files_match(tail)
        if needs:
            with self._locked():
                # Decide again under the lock: without it we may have listed the files
                # in the middle of another process's roll or retention.
                tail = tail_file.read() if tail_file.valid() else None
                if tail is None or (tail.boot_id != BOOT_ID and not tail.clean) \
                        or not self._files_match(tail):
                    self._recover(full=not tail_file.valid())
                else:
                    self._refresh(tail)
        else:
            self._refresh(tail_file.read())

    def _files_match(self, tail: Tail) -> bool:
        """The files agree with the tail: every segment has its indexes and the active
        log holds at least the committed bytes. (Committed bytes are not re-checked
        here: a bad batch below the committed size raises CorruptRecordError when read,
        rather than being cut along with the good batches after it.)"""
        names = set(os.listdir(self.directory))
        # A segment above the active one was never published (a roller died before
        # publishing it); the next roll removes it.
        bases = live_bases(names, tail)
        if not bases or bases[-1] != tail.active_base_offset:
            return False
        if leftovers(names, bases):
            return False                  # an interrupted retention or roll: sweep them
        for base in bases:
            if (segment_file_name(base, ".index") not in names
                    or segment_file_name(base, ".timeindex") not in names):
                return False
        active_path = os.path.join(self.directory, segment_file_name(bases[-1], ".log"))
        return os.stat(active_path).st_size >= tail.active_size

    def _recover(self, *, full: bool) -> RecoveryReport:
        """Validate from the recovery point (everything when `full`), rebuild indexes,
        truncate at the first bad byte, drop later segments, publish a fresh tail.
        Caller holds the lock."""
        started = time.perf_counter()
        valid = self._tail_file.valid()
        old = self._tail_file.read() if valid and not self._tail_file.torn() else None
        # A torn tail's fields are each old or new, so its version is >= every version
        # a reader cached: count on from it, or readers could miss the new segment list.
        torn = self._tail_file.read_torn() if valid and old is None else None
        full = full or old is None
        previous_start = (old or torn).log_start_offset if (old or torn) else None
        self._close_segments()
        names = set(os.listdir(self.directory))
        bases = sorted(b for b in map(parse_segment_name, names) if b is not None)
        if previous_start is not None and bases:
            # Segments wholly below the published log start are retention's leftovers
            # (it publishes the new start before renaming): finish their deletion
            # rather than bring deleted records back.
            keep = max(0, bisect.bisect_right(bases, previous_start) - 1)
            for base in bases[:keep]:
                self._retire_segment(base)
            bases = bases[keep:]
        self._sweep_orphans(set(os.listdir(self.directory)))
        config = self.config
        index_bytes = config["segment.index.bytes"]
        if not bases:
            start = previous_start if previous_start is not None else 0
            LogSegment(self.directory, start, active=True,
                       create_index_bytes=index_bytes).close()
            bases = [start]
        recovery_point = 0 if full or old is None else old.recovery_point
        first = max(0, bisect.bisect_right(bases, recovery_point) - 1)
        checked = truncated = segments_checked = 0
        for i, base in enumerate(bases):
            last = i == len(bases) - 1
            has_indexes = (segment_file_name(base, ".index") in names
                           and segment_file_name(base, ".timeindex") in names)
            if i < first and has_indexes:
                continue                  # below the recovery point: fsynced, trusted
            segment = LogSegment(self.directory, base, active=True)
            size, cut, next_offset, max_ts, max_ts_offset = segment.recover(
                max_message_bytes=config["max.message.bytes"],
                interval_bytes=config["index.interval.bytes"],
                index_bytes=index_bytes, start_offset=base)
            segments_checked += 1
            checked += size
            truncated += cut
            if cut and not last:          # Kafka drops every segment after a cut
                for later in bases[i + 1:]:
                    truncated += self._unlink_segment(later)
                bases = bases[:i + 1]
                last = True
            if last:
                entries, time_entries = segment.index_entry_counts()
                segment.close()
                break
            segment.seal(max_ts, max_ts_offset, size)
            segment.close()
        previous = old if old is not None else torn
        version = (previous.segments_version + 1) if previous is not None else 1
        start = bases[0]
        if previous_start is not None and start < previous_start <= next_offset:
            start = previous_start        # a log start inside the first segment stays
        self._publish(Tail(BOOT_ID, start, next_offset, bases[-1], size, entries,
                           time_entries, version, next_offset, max_ts, max_ts_offset,
                           min(recovery_point, next_offset), _now_ms() if size else -1, 0, 0,
                           -1, previous.leader_epoch if previous is not None else 0,
                           previous.deleted if previous is not None else 0))
        self._tail_file.sync()
        report = RecoveryReport(segments_checked, checked, truncated,
                                time.perf_counter() - started)
        self.last_recovery = report
        self._refresh(self._tail_file.read())
        return report

    def _unlink_segment(self, base: int) -> int:
        """Remove a segment's three files; returns the log bytes removed."""
        removed = 0
        for suffix in (".log", ".index", ".timeindex"):
            path = os.path.join(self.directory, segment_file_name(base, suffix))
            if os.path.exists(path):
                if suffix == ".log":
                    removed = os.path.getsize(path)
                os.unlink(path)
        return removed

    def _retire_segment(self, base: int) -> None:
        """Rename a segment's files `.deleted` (unlinked after file.delete.delay.ms)."""
        for suffix in (".log", ".index", ".timeindex"):
            path = os.path.join(self.directory, segment_file_name(base, suffix))
            try:
                os.rename(path, path + DELETED_SUFFIX)
            except FileNotFoundError:
                pass

    def _sweep_orphans(self, names: set[str]) -> None:
        """Remove index files whose `.log` is gone (a retention or roll interrupted
        between its renames)."""
        for name in names:
            if name.endswith((".index", ".timeindex")) and name[:20].isdigit() \
                    and f"{name[:20]}.log" not in names:
                try:
                    os.unlink(os.path.join(self.directory, name))
                except FileNotFoundError:
                    pass

    def recover(self) -> RecoveryReport:
        """Force a full recovery scan (what an unclean open does), under the lock."""
        with self._locked():
            return self._recover(full=True)

    # ---- segment list ----------------------------------------------------------------

    def _refresh(self, tail: Tail | None) -> None:
        """Bring the cached segment list in line with the tail's version."""
        assert tail is not None
        if tail.segments_version == self._segments_version:
            return
        bases = live_bases(os.listdir(self.directory), tail)
        stale = [b for b, seg in self._segments.items()
                 if b not in bases or seg.active != (b == tail.active_base_offset)]
        for base in stale:
            self._segments.pop(base).close()
        self._bases = bases
        self._segments_version = tail.segments_version

    def _segment(self, base: int) -> LogSegment:
        segment = self._segments.get(base)
        if segment is None:
            tail = self._tail_file.read()
            assert tail is not None
            active = base == tail.active_base_offset
            segment = LogSegment(self.directory, base, active=active,
                                 index_entries=tail.index_entries if active else None,
                                 timeindex_entries=tail.timeindex_entries if active else None,
                                 read_only=self.read_only)
            segments = self._segments
            if len(segments) >= MAX_OPEN_SEGMENTS:
                # Sealed segments are opened on demand and closed first-in first-out, so
                # a long log does not hold a descriptor per segment (Kafka maps its
                # indexes lazily for the same reason).
                for old in list(segments):
                    if not segments[old].active:
                        segments.pop(old).close()
                        break
            segments[base] = segment
        return segment

    def _close_segments(self) -> None:
        for segment in self._segments.values():
            segment.close()
        self._segments.clear()
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
        tail = self.tail()
        with self._thread_lock:
            self._refresh(tail)
            return sum(self._sealed_size(b) for b in self._bases[:-1]) + tail.active_size

    # ---- append ----------------------------------------------------------------------

    def append_records(self, records: list[tuple], *, codec: int = 0, **batch_fields: Any) -> int:
        """Encode records as one batch and append it; returns its base offset."""
        return self.append_batch(encode_batch(records, codec=codec, **batch_fields))

    def append_batch(self, batch: bytearray, *, verify: bool = False,
                     lock_timeout_s: float | None = LOCK_TIMEOUT_S) -> int:
        """Append one encoded batch (baseOffset is stamped here); returns base offset.

        `verify` re-checks the CRC first (for batches that did not come from our own
        encoder). Raises RecordTooLargeError above max.message.bytes, LogkitTimeoutError
        when the append lock is not free within `lock_timeout_s`, StorageError (with the
        OSError as its cause) when a write or fsync fails — and then nothing of the
        batch is stored: the file is cut back to the published end before the lock is
        released, and a later roll never seals bytes past that end either."""
        config = self.config
        size = len(batch)
        header = read_header(batch, 0, size)
        if header is None or header.size != size:
            raise CorruptRecordError("append of a batch whose length field does not match "
                                     "its bytes", expected=size)
        if verify:
            check_batch(batch, 0, header)
        if size > config["max.message.bytes"]:      # the whole batch, as Kafka counts it
            raise RecordTooLargeError(
                f"record batch of {size} bytes exceeds max.message.bytes="
                f"{config['max.message.bytes']} of topic {self.topic!r}")
        if config["compression.type"] not in ("producer", _CODEC_NAME[header.codec]):
            batch = self._recompress(batch, header)
            size = len(batch)
            header = read_header(batch, 0, size)
        if config["message.timestamp.type"] == "LogAppendTime":
            batch = self._log_append_time(batch)
            header = read_header(batch, 0, size)
        assert header is not None
        count = header.last_offset_delta + 1
        with self._locked(lock_timeout_s):
            tail = self._tail_file.read()
            if tail is None:
                self._recover(full=False)
                tail = self._tail_file.read()
            assert tail is not None
            try:
                base_offset = self._append_locked(batch, header, size, count, tail)
            except OSError as exc:
                raise storage_error(exc, "append", self.directory) from exc
        if self._doorbell is not None:
            self._doorbell.ring()
        return base_offset

    def _append_locked(self, batch: bytearray, header: Any, size: int, count: int,
                       tail: Tail) -> int:
        config = self.config
        self._refresh(tail)
        # Another process may have added index entries since this one last
        # appended: take the published counts, or we would overwrite theirs.
        self._segment(tail.active_base_offset).set_index_entries(
            tail.index_entries, tail.timeindex_entries)
        now = _now_ms()
        if self._must_roll(tail, size, count, now):
            tail = self._roll(tail)
        segment = self._segment(tail.active_base_offset)
        if not self._dirty:
            self._first_append(segment, tail)
        base_offset = tail.log_end_offset
        stamp_base_offset(batch, base_offset, tail.leader_epoch)
        position = tail.active_size
        last_offset = base_offset + count - 1
        flush = tail.unflushed_messages + count >= config["flush.messages"]
        try:
            segment.write(batch, position)
            if flush:
                # The log file only: the active segment's indexes are derived data that
                # recovery rebuilds after an OS crash, and an fsync of each (dirty) index
                # map would triple the device flushes per durable append.
                segment.flush_log()
        except OSError:
            self._cut_back(segment, position)
            raise
        max_ts, max_ts_offset = tail.max_timestamp, tail.max_timestamp_offset
        if header.max_timestamp > max_ts:
            max_ts, max_ts_offset = header.max_timestamp, last_offset
        segment.index_batch(last_offset, position, config["index.interval.bytes"],
                            max_ts, max_ts_offset)
        entries, time_entries = segment.index_entry_counts()
        tail = tail._replace(
            log_end_offset=last_offset + 1, active_size=position + size,
            index_entries=entries, timeindex_entries=time_entries,
            high_watermark=last_offset + 1, max_timestamp=max_ts,
            max_timestamp_offset=max_ts_offset,
            roll_time_ms=now if tail.roll_time_ms < 0 else tail.roll_time_ms, clean=0,
            unflushed_messages=0 if flush else tail.unflushed_messages + count,
            first_unflushed_ms=-1 if flush else
            now if tail.first_unflushed_ms < 0 else tail.first_unflushed_ms)
        if flush:
            tail = tail._replace(recovery_point=last_offset + 1)
        self._publish(tail)
        self._dirty = True
        return base_offset

    def _cut_back(self, segment: LogSegment, position: int) -> None:
        """After a failed write or fsync, cut the file back to the published end so the
        failed batch can never be sealed or recovered as data. If even that fails, the
        bytes stay past the committed size, where no reader looks and the next roll or
        append cuts them."""
        try:
            segment.truncate(position)
        except OSError as exc:
            log.warning("could not cut %s back to %d after a failed append: %s",
                        segment.path, position, exc)

    def _first_append(self, segment: LogSegment, tail: Tail) -> None:
        """Cut bytes a dead writer left past the committed size before writing."""
        if segment.file_size() > tail.active_size:
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
        if old.file_size() > tail.active_size:
            # Bytes past the committed size were never acknowledged (a writer died
            # between its write and its publish, or its write failed): a sealed segment
            # is read to its file size, so they must go before it is sealed.
            old.truncate(tail.active_size)
        old.set_index_entries(tail.index_entries, tail.timeindex_entries)
        old.time_index.append(tail.max_timestamp, tail.max_timestamp_offset)
        old.flush()
        new_base = tail.log_end_offset
        for name in os.listdir(self.directory):       # never published: a dead roller's
            base = parse_segment_name(name)
            if base is not None and base > tail.active_base_offset:
                self._unlink_segment(base)
        LogSegment(self.directory, new_base, active=True,
                   create_index_bytes=self.config["segment.index.bytes"]).close()
        tail = tail._replace(active_base_offset=new_base, active_size=0, index_entries=0,
                             timeindex_entries=0,
                             segments_version=tail.segments_version + 1,
                             max_timestamp=-1, max_timestamp_offset=-1, roll_time_ms=-1,
                             recovery_point=new_base, unflushed_messages=0,
                             first_unflushed_ms=-1)        # the old segment was fsynced
        self._publish(tail)
        old.seal(sealed.max_timestamp, sealed.max_timestamp_offset, sealed.active_size)
        self._refresh(tail)
        return tail

    def roll(self) -> None:
        """Start a new segment now (Kafka's forced roll), unless the active one is empty."""
        with self._locked():
            tail = self._tail_file.read()
            assert tail is not None
            self._refresh(tail)
            if tail.active_size:
                try:
                    self._roll(tail)
                except OSError as exc:
                    raise storage_error(exc, "roll", self.directory) from exc

    def _log_append_time(self, batch: bytearray) -> bytearray:
        now = _now_ms()
        attributes = struct.unpack_from(">h", batch, ATTRIBUTES_OFFSET)[0] | 0x08
        struct.pack_into(">hiqq", batch, ATTRIBUTES_OFFSET, attributes,
                         struct.unpack_from(">i", batch, ATTRIBUTES_OFFSET + 2)[0], now, now)
        _CRC.pack_into(batch, CRC_OFFSET, crc32c(memoryview(batch)[ATTRIBUTES_OFFSET:]))
        return batch

    def _recompress(self, batch: bytearray, header: Any) -> bytearray:
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
        with self._locked():
            tail = self._tail_file.read()
            assert tail is not None
            self._refresh(tail)
            if tail.unflushed_messages or tail.recovery_point < tail.log_end_offset:
                try:
                    self._segment(tail.active_base_offset).flush()
                    self._publish(tail._replace(recovery_point=tail.log_end_offset,
                                                unflushed_messages=0, first_unflushed_ms=-1))
                    self._tail_file.sync()
                except OSError as exc:
                    raise storage_error(exc, "flush", self.directory) from exc

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

    def read(self, offset: int, *, max_records: int = 500, max_bytes: int = MAX_FETCH_BYTES,
             stop_offset: int | None = None,
             upto_offset: int | None = None) -> list[Record]:
        """Records from `offset` below the high watermark and below `stop_offset` (None:
        up to the high watermark).

        Raises OffsetOutOfRangeError outside [log_start_offset, high_watermark]; returns
        [] at the high watermark. Always returns at least one batch's records if any
        are available, even when that batch is bigger than `max_bytes`. `upto_offset`
        is the old name of `stop_offset`, accepted until its last caller switches."""
        if max_records <= 0:
            raise ValueError("max_records must be positive")
        if upto_offset is not None:
            if stop_offset is not None:
                raise TypeError("read() takes stop_offset or upto_offset, not both")
            stop_offset = upto_offset
        for _ in range(100):              # a retention run may pull a segment away
            tail = self.tail()            # may take the lock: never under _thread_lock
            with self._thread_lock:       # segments and their maps are shared by threads
                self._check_usable()
                try:
                    return self._read(tail, offset, max_records, max_bytes, stop_offset)
                except FileNotFoundError:
                    self._segments_version = -1
                except OSError as exc:
                    raise storage_error(exc, "read", self.directory) from exc
        raise LogkitTimeoutError(f"{self.topic}-{self.partition}: segments kept vanishing "
                                 "under a read")

    def _read(self, tail: Tail, offset: int, max_records: int, max_bytes: int,
              stop_offset: int | None) -> list[Record]:
        if tail.segments_version != self._segments_version:
            self._refresh(tail)
        end = tail.high_watermark if stop_offset is None else min(stop_offset,
                                                                  tail.high_watermark)
        if offset < tail.log_start_offset or offset > tail.high_watermark:
            raise OffsetOutOfRangeError(
                f"offset {offset} is outside [{tail.log_start_offset}, "
                f"{tail.high_watermark}] of {self.topic}-{self.partition}")
        bases = self._bases
        i = max(0, bisect.bisect_right(bases, offset) - 1)
        if offset < end:
            self._check_covered(bases, i, offset)
        out: list[Record] = []
        while offset < end and i < len(bases) and len(out) < max_records and max_bytes > 0:
            base = bases[i]
            segment = self._segment(base)
            if segment.active:
                segment.set_index_entries(tail.index_entries, tail.timeindex_entries)
                size = tail.active_size
            else:
                size = segment.sealed_size
            records, used = segment.read(offset, size, self.topic, self.partition,
                                         max_records=max_records - len(out),
                                         max_bytes=max_bytes, upto_offset=end)
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
                self._check_contiguous(segment, bases[i])
                offset = max(offset, bases[i])
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
        for _ in range(100):              # a retention run may pull a segment away
            tail = self.tail()            # may take the lock: never under _thread_lock
            with self._thread_lock:
                self._check_usable()
                try:
                    return self._batches_since(tail, offset, upto, max_bytes)
                except FileNotFoundError:
                    self._segments_version = -1
                except OSError as exc:
                    raise storage_error(exc, "read", self.directory) from exc
        raise LogkitTimeoutError(f"{self.topic}-{self.partition}: segments kept vanishing "
                                 "under a read")

    def _batches_since(self, tail: Tail, offset: int, upto: int | None,
                       max_bytes: int) -> bytes:
        self._refresh(tail)
        if offset < tail.log_start_offset or offset > tail.log_end_offset:
            raise OffsetOutOfRangeError(
                f"offset {offset} is outside [{tail.log_start_offset}, "
                f"{tail.log_end_offset}] of {self.topic}-{self.partition}")
        end = tail.high_watermark if upto is None else min(upto, tail.log_end_offset)
        if offset >= end:
            return b""
        bases = list(self._bases)
        i = max(0, bisect.bisect_right(bases, offset) - 1)
        self._check_covered(bases, i, offset)
        chunks: list[bytes] = []
        budget = max_bytes
        while i < len(bases):
            segment = self._segment(bases[i])
            if segment.active:
                segment.set_index_entries(tail.index_entries, tail.timeindex_entries)
            size = tail.active_size if segment.active else segment.sealed_size
            start = stop = segment.find(offset, size)
            segment_end = None
            full = False
            for pos, header in segment.headers(start, size):
                if header.base_offset >= end or (header.size > budget
                                                 and (chunks or stop > start)):
                    full = True
                    break
                budget -= header.size
                stop = pos + header.size
                segment_end = header.last_offset + 1
            if stop > start:
                chunks.append(bytes(segment.view(size)[start:stop]))
            i += 1
            if full or i == len(bases) or (segment_end is not None and segment_end >= end):
                break
            segment.scan_end_offset = (segment.end_offset(size) if segment_end is None
                                       else segment_end)
            self._check_contiguous(segment, bases[i])
            offset = bases[i]
        return b"".join(chunks)

    def _check_covered(self, bases: list[int], i: int, offset: int) -> None:
        """The segment list must hold `offset` (>= the log start): a first segment that
        begins above it means files are missing at the start of the log."""
        if not bases or bases[i] > offset:
            first = bases[i] if bases else None
            raise CorruptRecordError(
                f"{self.topic}-{self.partition}: offset {offset} is in no segment (the "
                f"first segment starts at {first}); segment files are missing",
                path=self.directory, position=0, expected=offset, actual=first)

    def _check_contiguous(self, segment: LogSegment, next_base: int) -> None:
        """A segment read to its end must end where the next one begins: no silent gap
        from a missing or truncated segment."""
        if segment.scan_end_offset != next_base:
            raise CorruptRecordError(
                "segment ends before the next segment begins (missing or truncated "
                "segment)", path=segment.path, position=segment.sealed_size,
                expected=next_base, actual=segment.scan_end_offset)

    def read_columns(self, offset: int, columns: Any, *, stop_offset: int,
                     max_records: int) -> int:
        """Decode records from `offset` (below stop_offset and the high watermark) into
        `columns` (a columns.Columns), adding at least one batch's records and about
        max_records; returns the next offset to read. Raises OffsetOutOfRangeError like
        read()."""
        tail = self.tail()
        with self._thread_lock:
            self._check_usable()
            self._refresh(tail)
            if offset < tail.log_start_offset or offset > tail.high_watermark:
                raise OffsetOutOfRangeError(
                    f"offset {offset} is outside [{tail.log_start_offset}, "
                    f"{tail.high_watermark}] of {self.topic}-{self.partition}")
            end = min(stop_offset, tail.high_watermark)
            bases = list(self._bases)
            i = max(0, bisect.bisect_right(bases, offset) - 1)
            if offset < end:
                self._check_covered(bases, i, offset)
            target = columns.count + max_records
            while offset < end and i < len(bases) and columns.count < target:
                segment = self._segment(bases[i])
                if segment.active:
                    segment.set_index_entries(tail.index_entries, tail.timeindex_entries)
                size = tail.active_size if segment.active else segment.sealed_size
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
                    segment.scan_end_offset = (segment.end_offset(size) if segment_end
                                               is None else segment_end)
                    self._check_contiguous(segment, bases[i])
                    offset = max(offset, bases[i])
            return offset

    def batch_headers(self, start_offset: int) -> list[Any]:
        """Headers of the committed batches whose last offset >= start_offset (CRC not
        checked). For idempotence checks that look for a producer's batches."""
        tail = self.tail()
        with self._thread_lock:
            self._check_usable()
            self._refresh(tail)
            bases = list(self._bases)
            out = []
            for i, base in enumerate(bases):
                if i + 1 < len(bases) and bases[i + 1] <= start_offset:
                    continue                      # wholly below start_offset
                segment = self._segment(base)
                if segment.active:
                    segment.set_index_entries(tail.index_entries, tail.timeindex_entries)
                size = tail.active_size if segment.active else segment.sealed_size
                start = segment.find(start_offset, size)
                out.extend(header for _, header in segment.headers(start, size))
            return out

    def offset_for_timestamp(self, timestamp_ms: int) -> int | None:
        """Earliest offset whose timestamp >= timestamp_ms, None if there is none."""
        tail = self.tail()
        with self._thread_lock:
            self._check_usable()
            return self._offset_for_timestamp(tail, timestamp_ms)

    def _offset_for_timestamp(self, tail: Tail, timestamp_ms: int) -> int | None:
        self._refresh(tail)
        for base in list(self._bases):
            segment = self._segment(base)
            if segment.active:
                segment.set_index_entries(tail.index_entries, tail.timeindex_entries)
                size, max_ts = tail.active_size, tail.max_timestamp
            else:
                size, max_ts = segment.sealed_size, segment.time_index.last_timestamp()
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
        with self._locked():
            try:
                return self._enforce_retention(now_ms, retention_ms, retention_bytes)
            except OSError as exc:
                raise storage_error(exc, "retention", self.directory) from exc

    def _enforce_retention(self, now_ms: int, retention_ms: int, retention_bytes: int) -> int:
        tail = self._tail_file.read()
        assert tail is not None
        self._refresh(tail)
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
        if doomed == len(bases):                  # the active segment too: roll first
            tail = self._roll(tail)
            bases = self._bases
        if doomed:
            tail = tail._replace(log_start_offset=bases[doomed],
                                 segments_version=tail.segments_version + 1)
            self._publish(tail)
            self._tail_file.sync()
            for base in bases[:doomed]:
                segment = self._segments.pop(base, None)
                if segment is not None:
                    segment.close()
                self._sealed_sizes.pop(base, None)
                self._retire_segment(base)
            self._refresh(tail)
        self._unlink_deleted()
        return doomed

    def _sealed_size(self, base: int) -> int:
        """A sealed segment's size, without keeping its file open."""
        size = self._sealed_sizes.get(base)
        if size is None:
            segment = self._segments.get(base)
            size = segment.sealed_size if segment is not None else os.stat(
                os.path.join(self.directory, segment_file_name(base, ".log"))).st_size
            self._sealed_sizes[base] = size
        return size

    def _sealed_max_timestamp(self, base: int) -> int:
        """A sealed segment's largest timestamp: its time index's last entry."""
        segment = self._segments.get(base)
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
        with self._locked():
            tail = self._tail_file.read()
            assert tail is not None
            self._refresh(tail)
            self._segment(tail.active_base_offset).flush()
            self._publish(tail._replace(recovery_point=tail.log_end_offset,
                                        unflushed_messages=0, first_unflushed_ms=-1,
                                        clean=1))
            self._tail_file.sync()

    def check(self) -> None:
        """Full consistency check (tests call it after mutations): every batch valid,
        offsets contiguous, indexes pointing at batch starts."""
        tail = self.tail()
        self._refresh(tail)
        expected = tail.log_start_offset
        for base in self._bases:
            segment = self._segment(base)
            size = tail.active_size if segment.active else segment.sealed_size
            assert base == expected, (base, expected)
            starts = set()
            for pos, header in segment.headers(0, size):
                check_batch(segment.view(size), pos, header, segment.path)
                assert header.base_offset == expected, (header.base_offset, expected)
                expected = header.last_offset + 1
                starts.add(pos)
            index = segment.offset_index
            if segment.active:
                index.entries = tail.index_entries
            for n in range(index.entries):
                assert index.entry(n)[1] in starts, (segment.path, n)
        assert expected == tail.log_end_offset, (expected, tail.log_end_offset)


def live_bases(names: Any, tail: Tail) -> list[int]:
    """Base offsets of the published segments: from the one holding the log start up to
    the active one (a roller's unpublished segment above it and retention's leftovers
    below the start are not part of the log)."""
    bases = sorted(b for b in map(parse_segment_name, names)
                   if b is not None and b <= tail.active_base_offset)
    first = max(0, bisect.bisect_right(bases, tail.log_start_offset) - 1)
    return bases[first:]


def leftovers(names: Any, bases: list[int]) -> bool:
    """True when files other than the live segments' remain: segments below the log
    start, or index files without their log."""
    live = {segment_file_name(b, ".log") for b in bases}
    for name in names:
        if name.endswith(".log") and parse_segment_name(name) is not None:
            if name not in live and int(name[:20]) < bases[0]:
                return True
        elif name.endswith((".index", ".timeindex")) and name[:20].isdigit() \
                and f"{name[:20]}.log" not in names:
            return True
    return False


_CODEC_NAME = {0: "uncompressed", 1: "gzip", 2: "snappy", 3: "lz4", 4: "zstd"}
