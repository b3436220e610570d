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
import fcntl
import mmap
import os
import struct
import threading
import time
from contextlib import contextmanager
from typing import Any, Iterator, Mapping, NamedTuple

from .errors import ClosedError, CorruptRecordError, OffsetOutOfRangeError, RecordTooLargeError
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
MAX_FETCH_BYTES = 52428800            # Kafka's fetch.max.bytes default: one read's bound
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


_SEQ = struct.Struct("<Q")
_SEQ_OFFSET = 8
_BODY = struct.Struct("<16sqqqqqqQqqqqqqqqq")
_BODY_OFFSET = 16
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

    def __init__(self, path: str) -> None:
        self.path = path
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        self.created = os.fstat(self.fd).st_size < TAIL_FILE_BYTES
        if self.created:
            os.ftruncate(self.fd, TAIL_FILE_BYTES)
        self.mm = mmap.mmap(self.fd, TAIL_FILE_BYTES)

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


class PartitionLog:
    """One partition directory. Thread-safe; process-safe through the tail file."""

    def __init__(self, directory: str, topic: str, partition: int,
                 config: Mapping[str, Any], *, doorbell: Any = None) -> None:
        self.directory = directory
        self._doorbell = doorbell      # rung after each append (notify.Doorbell)
        self.topic = topic
        self.partition = partition
        self.config = dict(config)
        self._thread_lock = threading.RLock()
        self._segments: dict[int, LogSegment] = {}
        self._bases: list[int] = []
        self._segments_version = -1
        self._dirty = False            # this process appended since its last clean flush
        self._closed = False
        self.last_recovery: RecoveryReport | None = None
        os.makedirs(directory, exist_ok=True)
        self._tail_file = TailFile(os.path.join(directory, TAIL_FILE))
        self._open_checks()

    # ---- locking and tail ------------------------------------------------------------

    @contextmanager
    def _locked(self) -> Iterator[None]:
        with self._thread_lock:
            if self._closed:
                raise ClosedError(f"partition {self.topic}-{self.partition} is closed")
            fcntl.flock(self._tail_file.fd, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(self._tail_file.fd, fcntl.LOCK_UN)

    def tail(self) -> Tail:
        """The current tail; repairs a tail left torn by a writer that died mid-update."""
        tail = self._tail_file.read()
        if tail is None:
            with self._locked():
                if self._tail_file.torn():
                    self._recover(full=False)
                tail = self._tail_file.read()
                assert tail is not None
        return tail

    def _publish(self, tail: Tail) -> None:
        self._tail_file.write(tail._replace(boot_id=BOOT_ID))

    # ---- opening and recovery --------------------------------------------------------

    def _open_checks(self) -> None:
        """Decide, cheaply, whether this partition needs recovery, and run it."""
        tail_file = self._tail_file
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
        bases = sorted(b for b in map(parse_segment_name, names)
                       if b is not None and b <= tail.active_base_offset)
        if not bases or bases[-1] != tail.active_base_offset:
            return False
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
        self._publish(Tail(BOOT_ID, bases[0], next_offset, bases[-1], size, entries,
                           time_entries, version, next_offset, max_ts, max_ts_offset,
                           min(recovery_point, next_offset), _now_ms() if size else -1, 0, 0,
                           -1, previous.leader_epoch if previous is not None else 0))
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
        names = os.listdir(self.directory)
        bases = sorted(b for b in map(parse_segment_name, names)
                       if b is not None and b <= tail.active_base_offset)
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
                                 timeindex_entries=tail.timeindex_entries if active else None)
            self._segments[base] = segment
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
        self._refresh(tail)
        return sum(self._segment(b).sealed_size for b in self._bases[:-1]) + tail.active_size

    # ---- append ----------------------------------------------------------------------

    def append_records(self, records: list[tuple], *, codec: int = 0, **batch_fields: Any) -> int:
        """Encode records as one batch and append it; returns its base offset."""
        return self.append_batch(encode_batch(records, codec=codec, **batch_fields))

    def append_batch(self, batch: bytearray, *, verify: bool = False) -> int:
        """Append one encoded batch (baseOffset is stamped here); returns base offset.

        `verify` re-checks the CRC first (for batches that did not come from our own
        encoder). Raises RecordTooLargeError above max.message.bytes."""
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
        with self._locked():
            tail = self._tail_file.read()
            if tail is None:
                self._recover(full=False)
                tail = self._tail_file.read()
            assert tail is not None
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
            segment.write(batch, position)
            last_offset = base_offset + count - 1
            max_ts, max_ts_offset = tail.max_timestamp, tail.max_timestamp_offset
            if header.max_timestamp > max_ts:
                max_ts, max_ts_offset = header.max_timestamp, last_offset
            segment.index_batch(last_offset, position, config["index.interval.bytes"],
                                max_ts, max_ts_offset)
            entries, time_entries = segment.index_entry_counts()
            unflushed = tail.unflushed_messages + count
            tail = tail._replace(
                log_end_offset=last_offset + 1, active_size=position + size,
                index_entries=entries, timeindex_entries=time_entries,
                high_watermark=last_offset + 1, max_timestamp=max_ts,
                max_timestamp_offset=max_ts_offset,
                roll_time_ms=now if tail.roll_time_ms < 0 else tail.roll_time_ms, clean=0,
                unflushed_messages=unflushed,
                first_unflushed_ms=now if tail.first_unflushed_ms < 0 else
                tail.first_unflushed_ms)
            if unflushed >= config["flush.messages"]:
                # The log file only: the active segment's indexes are derived data that
                # recovery rebuilds after an OS crash, and an fsync of each (dirty) index
                # map would triple the device flushes per durable append.
                segment.flush_log()
                tail = tail._replace(recovery_point=last_offset + 1, unflushed_messages=0,
                                     first_unflushed_ms=-1)
            self._publish(tail)
            self._dirty = True
        if self._doorbell is not None:
            self._doorbell.ring()
        return base_offset

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
                self._roll(tail)

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
                self._segment(tail.active_base_offset).flush()
                self._publish(tail._replace(recovery_point=tail.log_end_offset,
                                            unflushed_messages=0, first_unflushed_ms=-1))
                self._tail_file.sync()

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
             upto_offset: int | None = None) -> list[Record]:
        """Records from `offset` below the high watermark (or `upto_offset`).

        Raises OffsetOutOfRangeError outside [log_start_offset, high_watermark]; returns
        [] at the high watermark. Always returns at least one batch's records if any
        are available, even when that batch is bigger than `max_bytes`."""
        if max_records <= 0:
            raise ValueError("max_records must be positive")
        with self._thread_lock:        # segments and their maps are shared by threads
            return self._read(offset, max_records, max_bytes, upto_offset)

    def _read(self, offset: int, max_records: int, max_bytes: int,
              upto_offset: int | None) -> list[Record]:
        if self._closed:
            raise ClosedError(f"partition {self.topic}-{self.partition} is closed")
        tail = self._tail_file.read() or self.tail()
        if tail.segments_version != self._segments_version:
            self._refresh(tail)
        end = tail.high_watermark if upto_offset is None else min(upto_offset,
                                                                  tail.high_watermark)
        if offset < tail.log_start_offset or offset > tail.high_watermark:
            raise OffsetOutOfRangeError(
                f"offset {offset} is outside [{tail.log_start_offset}, "
                f"{tail.high_watermark}] of {self.topic}-{self.partition}")
        bases = self._bases
        i = max(0, bisect.bisect_right(bases, offset) - 1)
        out: list[Record] = []
        while offset < end and i < len(bases) and len(out) < max_records and max_bytes > 0:
            base = bases[i]
            try:
                segment = self._segment(base)
            except FileNotFoundError:      # retention removed it since we listed
                self._segments_version = -1
                return out or self._read(offset, max_records, max_bytes, upto_offset)
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
            i += 1
            if i < len(bases):
                offset = max(offset, bases[i])
        return out

    def read_columns(self, offset: int, columns: Any, *, stop_offset: int,
                     max_records: int) -> int:
        """Decode records from `offset` (below stop_offset and the high watermark) into
        `columns` (a columns.Columns), adding at least one batch's records and about
        max_records; returns the next offset to read. Raises OffsetOutOfRangeError like
        read()."""
        with self._thread_lock:
            if self._closed:
                raise ClosedError(f"partition {self.topic}-{self.partition} is closed")
            tail = self.tail()
            self._refresh(tail)
            if offset < tail.log_start_offset or offset > tail.high_watermark:
                raise OffsetOutOfRangeError(
                    f"offset {offset} is outside [{tail.log_start_offset}, "
                    f"{tail.high_watermark}] of {self.topic}-{self.partition}")
            end = min(stop_offset, tail.high_watermark)
            bases = list(self._bases)
            i = max(0, bisect.bisect_right(bases, offset) - 1)
            target = columns.count + max_records
            while offset < end and i < len(bases) and columns.count < target:
                segment = self._segment(bases[i])
                if segment.active:
                    segment.set_index_entries(tail.index_entries, tail.timeindex_entries)
                size = tail.active_size if segment.active else segment.sealed_size
                buf = segment.view(size)
                for pos, header in segment.headers(segment.find(offset, size), size):
                    if header.base_offset >= end:
                        break
                    if not header.attributes & ATTR_CONTROL:
                        columns.add_batch(buf, pos, header, min_offset=offset,
                                          stop_offset=end, path=segment.path)
                    offset = min(header.last_offset + 1, end)
                    if columns.count >= target or offset >= end:
                        return offset              # stopped inside this segment
                i += 1                             # this segment is done: the next one
                if i < len(bases):
                    offset = max(offset, bases[i])
            return offset

    def batch_headers(self, start_offset: int) -> list[Any]:
        """Headers of the committed batches whose last offset >= start_offset (CRC not
        checked). For idempotence checks that look for a producer's batches."""
        with self._thread_lock:
            tail = self.tail()
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
        with self._thread_lock:
            return self._offset_for_timestamp(timestamp_ms)

    def _offset_for_timestamp(self, timestamp_ms: int) -> int | None:
        tail = self.tail()
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

        Deleted segments are renamed `.deleted` and unlinked after file.delete.delay.ms,
        so a reader holding one open keeps reading."""
        now_ms = _now_ms() if now_ms is None else now_ms
        config = self.config
        deleted = 0
        with self._locked():
            tail = self._tail_file.read()
            assert tail is not None
            self._refresh(tail)
            retention_ms, retention_bytes = config["retention.ms"], config["retention.bytes"]
            sizes = [self._segment(b).sealed_size for b in self._bases[:-1]]
            sizes.append(tail.active_size)
            excess = sum(sizes) - retention_bytes if retention_bytes >= 0 else 0
            doomed = 0
            for i, base in enumerate(self._bases):
                segment = self._segment(base)
                if segment.active:
                    newest = tail.max_timestamp
                    if sizes[i] == 0:
                        break
                else:
                    newest = segment.time_index.last_timestamp()
                by_time = retention_ms >= 0 and newest < now_ms - retention_ms
                by_size = excess > 0 and excess - sizes[i] >= 0
                if not (by_time or by_size):
                    break
                excess -= sizes[i]
                doomed += 1
            if doomed == len(self._bases):        # the active segment too: roll first
                tail = self._roll(tail)
            for base in self._bases[:doomed]:
                self._segments.pop(base).close()
                for suffix in (".log", ".index", ".timeindex"):
                    path = os.path.join(self.directory, segment_file_name(base, suffix))
                    if os.path.exists(path):
                        os.rename(path, path + DELETED_SUFFIX)
                deleted += 1
            if deleted:
                remaining = self._bases[doomed:]
                tail = tail._replace(log_start_offset=remaining[0],
                                     segments_version=tail.segments_version + 1)
                self._publish(tail)
                self._refresh(tail)
            self._unlink_deleted()
        return deleted

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
        """Flush and mark the tail clean if this process appended; safe to call twice."""
        with self._thread_lock:
            if self._closed:
                return
            if self._dirty:
                with self._locked():
                    tail = self._tail_file.read()
                    assert tail is not None
                    self._refresh(tail)
                    self._segment(tail.active_base_offset).flush()
                    self._publish(tail._replace(recovery_point=tail.log_end_offset,
                                                unflushed_messages=0, first_unflushed_ms=-1,
                                                clean=1))
                    self._tail_file.sync()
            self._closed = True
            self._close_segments()
            self._tail_file.close()

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


_CODEC_NAME = {0: "uncompressed", 1: "gzip", 2: "snappy", 3: "lz4", 4: "zstd"}
