"""One cleaning pass of a compacted partition log (Kafka's Cleaner.doClean), and the
swap that puts its output in place.

Owns: `compact()` and `cleanable_bytes()`; the cleaner lock (`logkit.cleaner`, a flock:
one process cleans a partition at a time); the pass: the uncleanable bound (the active
segment, the high watermark, records younger than min.compaction.lag.ms), the key map
built over the dirty range from the cleaner checkpoint (the tail's `cleaned_offset`),
the sealed segments below the map's end rewritten group by group (consecutive segments
whose bytes fit in one segment.bytes) into `<base>.log.cleaned` files with their
indexes, and Kafka's swap: `.cleaned` renamed `.swap` (the decision, made durable),
the old segments renamed `.deleted`, the `.swap` files renamed live, the tail
published with the new checkpoint. Appends go on meanwhile: only the swap takes the
partition lock.

Invariant: offsets never change; every cleaned group keeps its last batch (empty when
none of its records survive), so a segment still ends where the next one begins; a
pass killed at any step leaves the old segments or the new ones, whole (`loader.
finish_swaps` decides at the next lock holder: the tail is published torn across the
swap, so every other process recovers or waits); readers in other processes keep their
mapped old files and re-list when the tail's version moves.

A mixin of `PartitionLog` (log.py), which owns the state it reads and writes.
"""

from __future__ import annotations

import fcntl
import logging
import os
import shutil
import threading
import time
from contextlib import contextmanager
from typing import Any, Iterator

from ._clock import now_ms as _now_ms
from ._files import fsync_path, open_file
from .cleaner import CleanReport, OffsetMap
from .config import is_compacted
from .errors import ConfigError, CorruptRecordError, LogkitTimeoutError, storage_error
from .loader import CLEANED_SUFFIX, CLEANER_STAGING, SWAP_SUFFIX
from .records import (ATTR_CONTROL, ATTR_DELETE_HORIZON, ATTR_TIMESTAMP_TYPE,
                      ATTR_TRANSACTIONAL, BatchHeader, batch_section, decode_batch,
                      iter_batches, rebuild_batch, rebuild_batch_section)
from .segment import DELETED_SUFFIX, LogSegment, retire_segment, segment_file_name
from .txn_index import AbortedTxn, append_entry, read_entries, txn_index_path

log = logging.getLogger("logkit.log")

CLEANER_LOCK_FILE = "logkit.cleaner"
CLEANER_LOCK_TIMEOUT_S = 120.0
_SUFFIXES = (".txnindex", ".index", ".timeindex", ".log")   # the .log last: the marker
_MAX_SPAN = (1 << 31) - 1                        # offsets relative to a base: int32


def retire_txn_index(directory: str, base: int) -> None:
    """Rename a segment's `.txnindex` `.deleted`, as its other files are."""
    path = txn_index_path(directory, base)
    try:
        os.rename(path, path + DELETED_SUFFIX)
    except FileNotFoundError:
        pass


def _unlink_all(paths: Any) -> None:
    for path in paths:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass


def _records_count(batch: Any) -> int:
    return int.from_bytes(bytes(batch[57:61]), "big", signed=True)


class _Aborted:
    """The aborted transactions a pass meets: which data batches it must drop."""

    def __init__(self, entries: list[AbortedTxn]) -> None:
        self._spans: dict[int, list[tuple[int, int]]] = {}
        for entry in entries:
            self._spans.setdefault(entry.producer_id, []).append(
                (entry.first_offset, entry.last_offset))

    def holds(self, header: BatchHeader) -> bool:
        """Whether a transactional data batch belongs to an aborted transaction."""
        if not header.attributes & ATTR_TRANSACTIONAL or header.attributes & ATTR_CONTROL:
            return False
        for first, last in self._spans.get(header.producer_id, ()):
            if first <= header.base_offset <= last:
                return True
        return False


class _LogClean:
    """The cleaning pass of `PartitionLog` (see the module docstring)."""

    _cleaner_thread_lock = threading.Lock()      # one pass per process at a time
    # log.cleaner.dedupe.buffer.size and its load factor: the Broker sets its own
    dedupe_buffer_bytes = 134217728
    dedupe_load_factor = 0.9

    @contextmanager
    def _cleaner_locked(self, block: bool) -> Iterator[bool]:
        """The partition's cleaner lock (this process's threads, then other
        processes); yields False without it when `block` is False and it is taken."""
        if not self._cleaner_thread_lock.acquire(blocking=block,
                                                 timeout=CLEANER_LOCK_TIMEOUT_S if block
                                                 else -1):
            if block:
                raise LogkitTimeoutError(f"{self.name}: another thread kept the cleaner")
            yield False
            return
        try:
            fd = open_file(os.path.join(self.directory, CLEANER_LOCK_FILE),
                           os.O_RDWR | os.O_CREAT)
            try:
                deadline = time.monotonic() + CLEANER_LOCK_TIMEOUT_S
                while True:
                    try:
                        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                        break
                    except BlockingIOError:
                        if not block:
                            yield False
                            return
                        if time.monotonic() > deadline:
                            raise LogkitTimeoutError(
                                f"{self.name}: another process kept cleaning for "
                                f"{CLEANER_LOCK_TIMEOUT_S:.0f} s") from None
                        time.sleep(0.01)
                yield True
            finally:
                os.close(fd)                  # releases the flock
        finally:
            self._cleaner_thread_lock.release()

    def compact(self, now_ms: int | None = None, *, block: bool = True
                ) -> CleanReport | None:
        """One cleaning pass now (ignoring min.cleanable.dirty.ratio, honouring the lag
        settings and Kafka's rules: module docstring). Returns its report; None only
        with `block=False` when another thread or process is cleaning this partition.
        ConfigError for a partition whose topic is not compacted."""
        if not is_compacted(self.config):
            raise ConfigError(f"{self.name}: cleanup.policy is "
                              f"{self.config['cleanup.policy']!r}; compaction needs "
                              "'compact' or 'compact,delete'")
        self._check_usable()
        try:
            with self._cleaner_locked(block) as held:
                if not held:
                    return None
                return self._clean_pass(_now_ms() if now_ms is None else now_ms)
        except OSError as exc:
            raise storage_error(exc, "clean", self.directory) from exc

    def _sweep_cleaner_leftovers(self) -> None:
        """At open: remove what a pass killed before its swap left (the staging
        directory, `.cleaned` files), unless another process is cleaning right now."""
        if not os.path.lexists(os.path.join(self.directory, CLEANER_STAGING)):
            return
        with self._cleaner_locked(False) as held:
            if held:
                shutil.rmtree(os.path.join(self.directory, CLEANER_STAGING),
                              ignore_errors=True)
                for name in os.listdir(self.directory):
                    if name.endswith(CLEANED_SUFFIX):
                        try:
                            os.unlink(os.path.join(self.directory, name))
                        except FileNotFoundError:
                            pass

    @property
    def first_dirty_offset(self) -> int:
        """The cleaner checkpoint: offsets below it were cleaned (0: never cleaned)."""
        return self.tail().cleaned_offset

    @property
    def clean_count(self) -> int:
        """Swaps of cleaned segments so far (passes, and installs of a leader's)."""
        return self.tail().clean_count

    def cleanable_bytes(self, now_ms: int) -> tuple[int, int, int]:
        """(dirty bytes, cleanable bytes, the oldest dirty segment's newest timestamp or
        -1): the sealed segments below the uncleanable bound, split at the cleaner
        checkpoint (whole segments, as Kafka estimates)."""
        tail = self.tail()
        segments = self._cleanable_segments(tail, now_ms)
        first_dirty = max(tail.cleaned_offset, tail.log_start_offset)
        dirty = total = 0
        oldest = -1
        for base, end in segments:
            size = self._with_tail(lambda t, b=base: self._sealed_size(b))
            total += size
            if end > first_dirty:
                dirty += size
                if oldest < 0:
                    oldest = self._with_tail(lambda t, b=base: self._sealed_max_timestamp(b))
        return dirty, total, oldest

    def _cleanable_segments(self, tail: Any, now_ms: int) -> list[tuple[int, int]]:
        """(base, end offset) of the sealed segments a pass may clean: below the active
        segment, the high watermark, and the first segment holding a record younger than
        min.compaction.lag.ms (Kafka's firstUncleanableOffset)."""
        bases = self.segment_bases()
        active = tail.active_base_offset
        sealed = [b for b in bases if b < active]
        ends = sealed[1:] + [active]
        bound = min(active, tail.high_watermark, self._first_unstable_offset(tail))
        lag = self.config["min.compaction.lag.ms"]
        out = []
        for base, end in zip(sealed, ends):
            if end > bound:
                break
            if lag > 0 and self._with_tail(
                    lambda t, b=base: self._sealed_max_timestamp(b)) > now_ms - lag:
                break
            out.append((base, end))
        return out

    def _first_unstable_offset(self, tail: Any) -> int:
        """The first offset a pass must not pass for transactions (their open ones);
        the log end when there are none."""
        lso = getattr(self, "last_stable_offset", None)
        return tail.log_end_offset if lso is None or not isinstance(lso, int) else lso

    # ---- the pass ----------------------------------------------------------------------

    def _clean_pass(self, now_ms: int) -> CleanReport:
        started = time.perf_counter()
        tail = self.tail()
        segments = self._cleanable_segments(tail, now_ms)
        first_dirty = max(tail.cleaned_offset, tail.log_start_offset)
        staging = os.path.join(self.directory, CLEANER_STAGING)
        shutil.rmtree(staging, ignore_errors=True)
        offset_map = OffsetMap(self.dedupe_buffer_bytes, self.dedupe_load_factor,
                               expected_keys=self._dirty_records(segments, first_dirty))
        end = segments[-1][1] if segments else first_dirty
        aborted = _Aborted(self._with_tail(self._aborted_entries, tail.log_start_offset,
                                           end) if segments else [])
        map_end = self._build_map(segments, first_dirty, offset_map, aborted)
        chosen = [(b, e) for b, e in segments if b < map_end]
        producers_last = self._producers_last_batches(chosen)
        before = after = bytes_before = bytes_after = 0
        segments_after = 0
        txn_kept: dict[int, bool] = {}       # producer id -> its open txn kept a record
        for group in self._groups(chosen):
            got = self._clean_group(group, offset_map, map_end, now_ms, staging, aborted,
                                    producers_last, txn_kept)
            if got is None:
                continue                      # retention or a truncation got there first
            before += got[0]
            after += got[1]
            bytes_before += got[2]
            bytes_after += got[3]
            segments_after += 1
        shutil.rmtree(staging, ignore_errors=True)
        checkpoint = self._publish_checkpoint(map_end)
        report = CleanReport(before, after, bytes_before, bytes_after, len(chosen),
                             segments_after, checkpoint, time.perf_counter() - started)
        log.info("%s: cleaned %d segment(s) into %d: %d -> %d records, %d -> %d bytes, "
                 "checkpoint %d, %.3f s", self.name, len(chosen), segments_after, before,
                 after, bytes_before, bytes_after, checkpoint, report.seconds)
        return report

    def _open_sealed(self, base: int) -> tuple[LogSegment, int, tuple[int, int]]:
        """A sealed segment opened for the pass alone: (segment, size, file identity)."""
        segment = LogSegment(self.directory, base, active=False, read_only=True)
        segment.gaps = True
        return segment, segment.sealed_size, segment.identity

    def _producers_last_batches(self, segments: list[tuple[int, int]]) -> dict[int, int]:
        """Producer id -> the last offset of its last batch in `segments`: a pass keeps
        that batch (empty if need be), so the producer's state survives a rebuild from
        the log (Kafka keeps each active producer's last batch the same way)."""
        last: dict[int, int] = {}
        for base, _ in segments:
            segment, size, _ = self._open_sealed(base)
            try:
                for _, header in segment.headers(0, size):
                    if header.producer_id >= 0:
                        last[header.producer_id] = header.last_offset
            finally:
                segment.close()
        return last

    def _dirty_records(self, segments: list[tuple[int, int]], first_dirty: int) -> int:
        """The records of the dirty range's batches (headers only): the most keys the
        map can meet, which sizes its table below the dedupe buffer when it is small."""
        count = 0
        for base, end in segments:
            if end <= first_dirty:
                continue
            segment, size, _ = self._open_sealed(base)
            try:
                for _, header in segment.headers(0, size):
                    if header.last_offset >= first_dirty:
                        count += header.records_count
            finally:
                segment.close()
        return count

    def _build_map(self, segments: list[tuple[int, int]], first_dirty: int,
                   offset_map: OffsetMap, aborted: "_Aborted") -> int:
        """Map every key of the dirty range (from `first_dirty` through the cleanable
        segments) to its latest offset; returns the map's end: the offset after the last
        batch mapped (a pass keeps everything at or past it). Control batches and the
        batches of aborted transactions are not mapped. Stops at a batch that no longer
        fits in the map."""
        map_end = first_dirty
        for base, end in segments:
            if end <= first_dirty:
                continue
            segment, size, _ = self._open_sealed(base)
            try:
                buf = segment.view(size) if size else b""
                for pos, header in segment.headers(0, size, verify=True):
                    if header.last_offset < first_dirty or header.attributes & ATTR_CONTROL \
                            or aborted.holds(header):
                        map_end = max(map_end, header.last_offset + 1)
                        continue
                    if header.records_count > offset_map.room():
                        if len(offset_map) == 0:
                            raise ConfigError(
                                f"{self.name}: log.cleaner.dedupe.buffer.size holds "
                                f"{offset_map.capacity} keys, fewer than one batch's "
                                f"{header.records_count} records")
                        return map_end
                    try:
                        data, start, stop = batch_section(buf, pos, header)
                        offset_map.put_section(data, start, stop, header.records_count,
                                               header.base_offset, first_dirty)
                    except ValueError as exc:
                        raise CorruptRecordError(f"record batch body is malformed: {exc}",
                                                 path=segment.path, position=pos) from None
                    map_end = header.last_offset + 1
            finally:
                segment.close()
            map_end = max(map_end, end)
        return map_end

    def _groups(self, segments: list[tuple[int, int]]) -> list[list[tuple[int, int]]]:
        """Consecutive segments whose bytes fit in one segment.bytes and whose offsets
        fit an index's relative offsets: each group becomes one cleaned segment."""
        limit = self.config["segment.bytes"]
        groups: list[list[tuple[int, int]]] = []
        size = 0
        for base, end in segments:
            seg_size = self._with_tail(lambda t, b=base: self._sealed_size(b))
            if groups and size + seg_size <= limit and end - groups[-1][0][0] < _MAX_SPAN:
                groups[-1].append((base, end))
                size += seg_size
            else:
                groups.append([(base, end)])
                size = seg_size
        return groups

    def _clean_group(self, group: list[tuple[int, int]], offset_map: OffsetMap,
                     map_end: int, now_ms: int, staging: str, aborted: "_Aborted",
                     producers_last: dict[int, int], txn_kept: dict[int, bool]
                     ) -> tuple[int, int, int, int] | None:
        """Write the group's cleaned segment into the staging directory, then swap it
        in. Returns (records before, after, bytes before, after), or None when the group
        changed meanwhile (nothing swapped)."""
        config = self.config
        base = group[0][0]
        os.makedirs(staging, exist_ok=True)
        out = LogSegment(staging, base, active=True,
                         create_index_bytes=config["segment.index.bytes"])
        out.gaps = True
        horizon_after = now_ms + config["delete.retention.ms"]
        interval = config["index.interval.bytes"]
        identities = []
        before = after = bytes_before = position = 0
        max_ts = max_ts_offset = -1
        try:
            for n, (seg_base, _) in enumerate(group):
                segment, size, identity = self._open_sealed(seg_base)
                identities.append(identity)
                bytes_before += size
                try:
                    buf = segment.view(size) if size else b""
                    for pos, header in segment.headers(0, size, verify=True):
                        keep_anyway = (n == len(group) - 1 and pos + header.size >= size) or (
                            header.producer_id >= 0
                            and producers_last.get(header.producer_id) == header.last_offset)
                        if not header.attributes & ATTR_CONTROL:
                            before += header.records_count
                        data = self._cleaned_batch(
                            buf, pos, header, segment.path, offset_map, map_end, now_ms,
                            horizon_after, aborted, txn_kept, keep_anyway)
                        if data is None:
                            continue
                        if not header.attributes & ATTR_CONTROL:
                            after += _records_count(data)
                        batch_max = header.max_timestamp
                        if batch_max > max_ts:
                            max_ts, max_ts_offset = batch_max, header.last_offset
                        out.write(bytes(data), position)
                        out.index_batch(header.last_offset, position, interval, max_ts,
                                        max_ts_offset)
                        position += len(data)
                finally:
                    segment.close()
            out.seal(max_ts, max_ts_offset, position)
            out.flush()
        finally:
            out.close()
        cleaned = self._place_cleaned(staging, base, [b for b, _ in group])
        try:
            swapped = self._swap(group, identities, cleaned)
        except BaseException:
            _unlink_all(cleaned.values())     # those not renamed .swap (undecided)
            raise
        if not swapped:
            _unlink_all(cleaned.values())
            return None
        return before, after, bytes_before, position

    def _place_cleaned(self, staging: str, base: int, bases: list[int]) -> dict[str, str]:
        """Give the segment written in `staging` at `base` the `.txnindex` of the
        segments it replaces (`bases`: their aborted transactions, in order) and move
        its files into the partition directory as `.cleaned`; returns them by suffix."""
        entries = [e for seg_base in bases
                   for e in read_entries(txn_index_path(self.directory, seg_base))]
        for entry in entries:
            append_entry(txn_index_path(staging, base), entry)
        if entries:
            fsync_path(txn_index_path(staging, base))
        cleaned = {}
        for suffix in _SUFFIXES:
            if suffix == ".txnindex" and not entries:
                continue
            name = segment_file_name(base, suffix)
            cleaned[suffix] = os.path.join(self.directory, name + CLEANED_SUFFIX)
            os.replace(os.path.join(staging, name), cleaned[suffix])
        return cleaned

    def _cleaned_batch(self, buf: Any, pos: int, header: BatchHeader, path: str,
                       offset_map: OffsetMap, map_end: int, now_ms: int,
                       horizon_after: int, aborted: _Aborted, txn_kept: dict[int, bool],
                       keep_anyway: bool) -> Any:
        """The bytes a pass writes for one batch, or None to drop it (Kafka's rules:
        module docstring). Records of aborted transactions go; a COMMIT/ABORT marker
        stays while a record of its transaction stays, else until its delete horizon;
        `keep_anyway` (a group's last batch, a producer's last batch) keeps the batch,
        empty if nothing of it survives."""
        stamped = header.attributes & ATTR_DELETE_HORIZON
        if header.attributes & ATTR_CONTROL:
            if txn_kept.pop(header.producer_id, False):
                return buf[pos:pos + header.size]      # its transaction's records stay
            if stamped:
                if now_ms < header.base_timestamp or keep_anyway:
                    return buf[pos:pos + header.size]
                return None
            return rebuild_batch(buf, pos, header,
                                 decode_batch(buf, pos, header, self.topic, self.partition,
                                              path=path, verify=False),
                                 delete_horizon_ms=horizon_after)
        if not aborted.holds(header):
            append_time = header.attributes & ATTR_TIMESTAMP_TYPE
            try:
                data, start, stop = batch_section(buf, pos, header)
                section, kept, tombstone, max_delta = offset_map.clean_section(
                    data, start, stop, header.records_count, header.base_offset, map_end,
                    bool(stamped) and now_ms >= header.base_timestamp,
                    None if stamped or append_time
                    else header.base_timestamp - horizon_after)
            except ValueError as exc:
                raise CorruptRecordError(f"record batch body is malformed: {exc}",
                                         path=path, position=pos) from None
            if kept and header.attributes & ATTR_TRANSACTIONAL:
                txn_kept[header.producer_id] = True
            needs_horizon = not stamped and tombstone
            if kept == header.records_count and not needs_horizon:
                return buf[pos:pos + header.size]
            if kept:
                return rebuild_batch_section(
                    header, section, kept,
                    header.max_timestamp if max_delta is None
                    else header.base_timestamp + max_delta,
                    delete_horizon_ms=horizon_after if needs_horizon else None)
        if not keep_anyway:
            return None
        return rebuild_batch(buf, pos, header, [])

    def _swap(self, group: list[tuple[int, int]], identities: list[tuple[int, int]],
              cleaned: dict[str, str]) -> bool:
        """Kafka's swap, under the partition lock (module docstring). False, with
        nothing changed, when a segment of the group is no longer the file the pass
        read (retention or a truncation changed the log meanwhile)."""
        directory = self.directory
        base = group[0][0]
        with self._locked_tail("clean") as tail:
            bases = self._bases
            end = group[-1][1]
            for (seg_base, _), identity in zip(group, identities):
                try:
                    stat = os.stat(os.path.join(directory,
                                                segment_file_name(seg_base, ".log")))
                except FileNotFoundError:
                    return False
                if seg_base not in bases or (stat.st_dev, stat.st_ino) != identity:
                    return False
            if end not in bases:
                return False                  # the segment after the group moved
            # Torn from here until the new list is published: another process's
            # readers wait, and the next lock holder — any process, this one too
            # after an error below — recovers first, which finishes a decided swap
            # (a `.log.swap` exists) or removes an undecided one.
            self._tail_file.publish_torn(tail)
            for suffix in _SUFFIXES:          # the decision: .swap, made durable
                if suffix in cleaned:
                    os.replace(cleaned[suffix], cleaned[suffix][:-len(CLEANED_SUFFIX)]
                               + SWAP_SUFFIX)
            fsync_path(directory)
            for seg_base, _ in group:
                segment = self._segments.pop(seg_base, None)
                if segment is not None:
                    segment.close()
                if seg_base in self._parked:
                    self._close_parked(seg_base)
                self._sealed_sizes.pop(seg_base, None)
                retire_segment(directory, seg_base)
                retire_txn_index(directory, seg_base)
            # The old names must be gone on disk before a new one appears: a power cut
            # may keep directory changes in any order between two fsyncs, and the new
            # base segment beside an old one it covers would overlap it.
            fsync_path(directory)
            for suffix in _SUFFIXES:
                if suffix in cleaned:
                    live = os.path.join(directory, segment_file_name(base, suffix))
                    os.replace(live + SWAP_SUFFIX, live)
            forget = getattr(self, "_txn_indexes", None)
            if forget is not None:
                forget.forget()
            fsync_path(directory)
            tail = tail._replace(segments_version=tail.segments_version + 1,
                                 clean_count=tail.clean_count + 1)
            self._tail_file.publish(tail)
            self._tail_file.sync()
            self._refresh(tail)
        return True

    def _publish_checkpoint(self, map_end: int) -> int:
        """Move the cleaner checkpoint up to `map_end` (never down); returns it."""
        with self._locked_tail("clean") as tail:
            checkpoint = min(max(tail.cleaned_offset, map_end), tail.log_end_offset)
            if checkpoint != tail.cleaned_offset:
                self._tail_file.publish(tail._replace(cleaned_offset=checkpoint))
                self._tail_file.sync()
            return checkpoint

    # ---- a follower's copy of its leader's cleaning ------------------------------------

    def install_segment(self, base: int, end: int, data: Any) -> bool:
        """Put `data`, the whole batches of a leader's sealed segment holding offsets
        [base, end) (as a cleaning pass left it), in place of this log's sealed segments
        from `base` to `end`: a follower copying its leader's cleaning, whose file then
        comes out byte-identical to the leader's. The pass's swap does it (the file
        written beside, renamed `.cleaned`, `.swap`, the old segments retired, `.swap`
        renamed live), so a kill at any step leaves the old segments or the new one
        (`loader.finish_swaps`); their aborted-transaction entries are carried over as
        a pass carries them. Returns False, changing nothing, when `base` and `end` are
        not both segment bases here with sealed segments between them (the segments do
        not line up, or the log changed meanwhile). CorruptRecordError when `data` is
        not whole CRC-valid batches at or past `base`, the last ending at `end` - 1."""
        where = f"a segment installed in {self.name}"
        headers = [h for _, h in iter_batches(data, 0, len(data), where, verify=True,
                                              gaps=True)]
        if not headers or headers[0].base_offset < base or \
                headers[-1].last_offset + 1 != end:
            raise CorruptRecordError(
                f"the batches do not make segment {base} (offsets {base}..{end - 1})",
                path=where, position=0, expected=end,
                actual=headers[-1].last_offset + 1 if headers else None)
        self._check_usable()
        try:
            with self._cleaner_locked(True):
                return self._install_segment(base, end, data, headers)
        except OSError as exc:
            raise storage_error(exc, "install segment", self.directory) from exc

    def _install_segment(self, base: int, end: int, data: Any,
                         headers: list[BatchHeader]) -> bool:
        bases = self.segment_bases()
        if base not in bases or end not in bases:
            return False
        starts = [b for b in bases if base <= b < end]
        group = list(zip(starts, starts[1:] + [end]))
        identities = []
        for seg_base in starts:
            try:
                stat = os.stat(os.path.join(self.directory,
                                            segment_file_name(seg_base, ".log")))
            except FileNotFoundError:
                return False
            identities.append((stat.st_dev, stat.st_ino))
        staging = os.path.join(self.directory, CLEANER_STAGING)
        shutil.rmtree(staging, ignore_errors=True)
        os.makedirs(staging)
        out = LogSegment(staging, base, active=True,
                         create_index_bytes=self.config["segment.index.bytes"])
        out.gaps = True
        interval = self.config["index.interval.bytes"]
        position = 0
        max_ts = max_ts_offset = -1
        try:
            for header in headers:
                if header.max_timestamp > max_ts:
                    max_ts, max_ts_offset = header.max_timestamp, header.last_offset
                out.write(bytes(data[position:position + header.size]), position)
                out.index_batch(header.last_offset, position, interval, max_ts,
                                max_ts_offset)
                position += header.size
            out.seal(max_ts, max_ts_offset, position)
            out.flush()
        finally:
            out.close()
        cleaned = self._place_cleaned(staging, base, starts)
        shutil.rmtree(staging, ignore_errors=True)
        if self._swap(group, identities, cleaned):
            log.info("%s: installed a copy of the leader's segment %d (offsets up to %d, "
                     "%d bytes) in place of %d segment(s)", self.name, base, end - 1,
                     position, len(group))
            return True
        for path in cleaned.values():
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
        return False
