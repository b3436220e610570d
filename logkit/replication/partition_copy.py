"""The follower's copy of one partition: truncation where the histories diverge,
fetching whole batches from the log end, and a compacted log's copy of the leader's
cleaning.

Owns: per partition, comparing leader epochs with the leader's (KIP-101/KIP-279, checked
before every fetch as KIP-320 does) and truncating a tail that diverged, following the
leader's log start, appending shipped batches as they are (CRC-checked, base offsets and
leader epochs kept, rolled where the leader rolled), refusing a batch that fails its
checks (`MAX_CORRUPT_FETCHES` in a row stop the follower), and keeping the partition's
`leader-epoch-checkpoint` equal to the leader's over the copied prefix. For a compacted
log also: fetches that start past the log end (a gap the leader's cleaner left, kept
at the same offsets), and, whenever the leader's clean count moves, each sealed segment
the log holds whole compared by SHA-256 with the leader's listing (`segments()`) and,
where it differs, fetched and installed by the cleaner's swap
(`Partition.install_segment`); a segment held only in part waits until the log end
passes it. The count last copied is kept in follower.json (`clean_counts`).

Invariant: each partition's log is a prefix of the leader's history, batch for batch;
in a compacted log, below the log end it holds no record the leader's cleaning (as of
the count last copied) removed from the segments it holds whole, and those segment
files are byte-identical to the leader's.

A mixin of `Follower` (follower.py), which owns the state it reads and writes.
"""

from __future__ import annotations

import hashlib
import logging
import time
from typing import Any

from ..errors import CorruptRecordError, IllegalStateError, OffsetOutOfRangeError
from ..config import is_compacted
from ..records import BatchHeader, decode_batch, iter_batches, read_header
from ..topic import Partition, TopicPartition
from ..leader.epochs import (EpochEntry, divergence_offset, epochs_from_headers, read_checkpoint,
                     truncate_from_end, write_checkpoint)
from .directory import SegmentDigests
from .source import PartitionInfo, SegmentInfo

log = logging.getLogger("logkit.replication.follower")

MAX_CORRUPT_FETCHES = 3            # refused fetches in a row before the follower stops
MAX_SEGMENT_MISMATCHES = 3         # a leader segment's bytes unlike its listing, in a row
SEGMENT_FETCH_BYTES = 1 << 20      # asked per fetch when copying a cleaned segment


def _tp_name(tp: TopicPartition) -> str:
    return f"{tp.topic}-{tp.partition}"


def _has_gaps(p: Partition) -> bool:
    """Whether the partition's log may have offset gaps (a compacted topic, or one that
    was cleaned before its policy changed)."""
    return is_compacted(p.config) or p.clean_count > 0


def _cleaned_form(mine: bytes, theirs: bytes) -> bool:
    """Whether the leader's first batch in `theirs` is what a cleaning pass leaves of
    the batch `mine` begins with: gone (the leader's next batch starts past it), or
    the same offsets, leader epoch and producer with a subset of its records."""
    a, b = read_header(mine, 0, len(mine)), read_header(theirs, 0, len(theirs))
    if a is None or b is None:
        return False
    if b.base_offset > a.last_offset:
        return True
    if (b.base_offset, b.last_offset, b.leader_epoch, b.producer_id) != \
            (a.base_offset, a.last_offset, a.leader_epoch, a.producer_id):
        return False
    def rows(data: bytes, header: BatchHeader) -> set[tuple[int, Any, Any]]:
        return {(r.offset, r.key, r.value)
                for r in decode_batch(data, 0, header, "", 0, verify=True)}
    try:
        return rows(theirs, b) <= rows(mine, a)
    except CorruptRecordError:
        return False


class _PartitionCopy:
    """Partition copying for `Follower` (see the module docstring)."""

    def _refused(self, tp: TopicPartition, exc: CorruptRecordError) -> None:
        count = self._corrupt.get(tp, 0) + 1
        self._corrupt[tp] = count
        log.warning("%s: %s: refused a fetch from %s (%d in a row): %s", self.path,
                    _tp_name(tp), self.source.describe(), count, exc)
        if count >= MAX_CORRUPT_FETCHES:
            exc.fatal = True                          # type: ignore[attr-defined]
            raise exc

    def _local_partition(self, tp: TopicPartition) -> Partition:
        """The follower's partition; topic handles are kept until the next metadata
        sync (only this follower changes the directory's topics)."""
        topic = self._topics.get(tp.topic)
        if topic is None:
            topic = self._topics[tp.topic] = self._require_broker().topic(tp.topic)
        return topic.partition(tp.partition)

    def _sync_partition(self, tp: TopicPartition) -> bool:
        """Align one partition with its leader and copy one fetch; returns whether
        anything was appended."""
        p = self._local_partition(tp)
        if tp not in self._epochs:
            self._epochs[tp] = self._load_epochs(p)
        asked_ms = int(time.time() * 1000)         # the leader's log end as of now:
        info = self.source.partition(tp.topic, tp.partition)
        self._leader_ends[tp] = info.log_end_offset
        self._note_leader_epoch(tp, info)
        if tp not in self._checked:
            # a writer killed mid-append (this directory's old leader) may have left
            # bytes past the end: the copy's files must hold only the log
            p.cut_unpublished()
        end = self._align(tp, p, info)
        if tp not in self._checked:
            self._check_same_history(tp, p)
            self._checked.add(tp)
            end = p.log_end_offset
        self._ends[tp] = end
        gaps = _has_gaps(p)
        if end >= info.log_end_offset:
            self._caught_up_ms[tp] = asked_ms      # ... reached: caught up at asked_ms
            self._mirror_epochs(tp, p, info, end)
            if gaps:
                self._copy_cleaning(tp, p, info)
            return False
        data = self.source.fetch(tp.topic, tp.partition, end,
                                 max_bytes=self.config["replica.fetch.max.bytes"])
        if not data:
            return False
        where = f"a fetch of {_tp_name(tp)} from {self.source.describe()}"
        headers = [h for _, h in iter_batches(data, 0, len(data), where, gaps=gaps)]
        first, new_end = headers[0].base_offset, headers[-1].last_offset + 1
        # A compacted log's fetch may start past the end: the leader's cleaner removed
        # the batches between, and the copy keeps the gap at the same offsets.
        if first < end or (first > end and not gaps):
            end = self._restart_at(tp, p, first, end)
        # Batches the leader had published when `info` was read had their segments
        # published too: ask again only for the segment bases of newer ones.
        after = info if new_end <= info.log_end_offset else \
            self.source.partition(tp.topic, tp.partition)
        self._mirror_epochs(tp, p, after, new_end)
        p.append_replicated(data, segment_base_offsets=after.segment_base_offsets)
        if p.log_start_offset < after.log_start_offset:
            p.increase_log_start_offset(after.log_start_offset)
        self._corrupt.pop(tp, None)
        if gaps:
            self._copy_cleaning(tp, p, after)
        self._ends[tp] = p.log_end_offset
        if self._ends[tp] >= info.log_end_offset:
            self._caught_up_ms[tp] = asked_ms
        return True

    def _load_epochs(self, p: Partition) -> list[EpochEntry]:
        """The partition's epochs: its checkpoint file, else what its batches carry
        (one scan), without entries past the log end (a kill between the checkpoint
        write and the append it announced)."""
        entries = read_checkpoint(p.directory)
        if entries is None:
            entries = epochs_from_headers(p.batch_headers(p.log_start_offset))
        end = p.log_end_offset
        return [e for e in entries if e.start_offset <= end]

    def _note_leader_epoch(self, tp: TopicPartition, info: PartitionInfo) -> None:
        """Remember the newest leader epoch seen, so a promotion never reuses it."""
        if info.epochs:
            key = _tp_name(tp)
            newest = info.epochs[-1].epoch
            if newest > self._state["leader_epochs"].get(key, -1):
                self._state["leader_epochs"][key] = newest
                self._save_state()

    def _align(self, tp: TopicPartition, p: Partition, info: PartitionInfo) -> int:
        """Make the local log a prefix of the leader's and its start no lower than
        the leader's; returns the log end offset."""
        epochs = self._epochs[tp]
        end = p.log_end_offset
        cut = divergence_offset(epochs, end, info.epochs, info.log_end_offset)
        if cut < end:
            log.warning("%s: %s: the log (end %d, latest epochs %s) diverges from the "
                        "leader's (end %d, latest epochs %s) at offset %d: truncating",
                        self.path, _tp_name(tp), end, epochs[-3:], info.log_end_offset,
                        list(info.epochs[-3:]), cut)
            if cut < p.log_start_offset:
                p.truncate_fully_and_start_at(max(cut, info.log_start_offset))
            else:
                p.truncate_to(cut)
            end = p.log_end_offset
            self._save_epochs(tp, p, truncate_from_end(epochs, end))
        if end < info.log_start_offset:
            log.warning("%s: %s: the log ends at %d, below the leader's log start %d: "
                        "starting over there", self.path, _tp_name(tp), end,
                        info.log_start_offset)
            p.truncate_fully_and_start_at(info.log_start_offset)
            end = p.log_end_offset
            self._save_epochs(tp, p, [])
        elif p.log_start_offset < info.log_start_offset:
            p.increase_log_start_offset(info.log_start_offset)
        return end

    def _restart_at(self, tp: TopicPartition, p: Partition, first: int, end: int) -> int:
        """The leader's batch holding offset `end` starts at `first` < `end`: this log
        ends inside one of the leader's batches (it began at a log start inside a batch,
        or holds other bytes). Start again at that batch."""
        if first > end:
            raise CorruptRecordError(f"{_tp_name(tp)}: the leader answered a fetch at "
                                     f"{end} with batches from {first}", expected=end,
                                     actual=first)
        if p.log_start_offset == end:             # nothing here yet: start at the batch
            p.truncate_fully_and_start_at(first)
        else:
            log.warning("%s: %s: the log ends at %d, inside the leader's batch at %d: "
                        "truncating to it", self.path, _tp_name(tp), end, first)
            p.truncate_to(first)
        new_end = p.log_end_offset
        if new_end != first:
            raise IllegalStateError(f"{_tp_name(tp)}: cannot line the log up with the "
                                    f"leader's batch at {first} (the log ends at "
                                    f"{new_end}); this directory holds another history")
        self._save_epochs(tp, p, truncate_from_end(self._epochs[tp], new_end))
        return new_end

    def _check_same_history(self, tp: TopicPartition, p: Partition) -> None:
        """Once per start: the last local batch must be the leader's batch at that
        offset, byte for byte (a directory copied from elsewhere, or a second leader
        that wrote in the same epoch, fails here rather than mixing histories)."""
        end = p.log_end_offset
        if end <= p.log_start_offset:
            return
        last = p.batch_headers(end - 1)
        if not last:
            return
        base = last[-1].base_offset
        mine = p.batches_since(base, upto=end, max_bytes=1)
        try:
            theirs = self.source.fetch(tp.topic, tp.partition, base, max_bytes=1)
        except OffsetOutOfRangeError:
            return                                # gone by retention there: nothing to compare
        if theirs[:len(mine)] != mine and not (_has_gaps(p) and _cleaned_form(mine, theirs)):
            raise IllegalStateError(
                f"{self.path}: {_tp_name(tp)} is not a copy of {self.source.describe()}: "
                f"the batch at offset {base} differs from the leader's (this directory "
                "holds another history; follow into an empty directory)")

    def _mirror_epochs(self, tp: TopicPartition, p: Partition, info: PartitionInfo,
                       end: int) -> None:
        """Keep the checkpoint equal to the leader's entries that start at or below
        `end` (the local log being a prefix of the leader's, they are its history)."""
        wanted = [e for e in info.epochs if e.start_offset <= end]
        if wanted != self._epochs.get(tp):
            self._save_epochs(tp, p, wanted)

    def _save_epochs(self, tp: TopicPartition, p: Partition,
                     entries: list[EpochEntry]) -> None:
        write_checkpoint(p.directory, entries)
        self._epochs[tp] = entries

    # ---- a compacted log: the leader's cleaning ---------------------------------------

    def _roll_where_the_leader_did(self, p: Partition, info: PartitionInfo,
                                   end: int) -> None:
        """Caught up to a leader whose segment starts at the log end (it rolled, or its
        active segment is empty): roll here too, so the segment below is sealed as
        the leader's is, and a cleaning of it can be copied."""
        if end in info.segment_base_offsets and p.segment_base_offsets()[-1] < end:
            p.roll()

    def _copy_cleaning(self, tp: TopicPartition, p: Partition, info: PartitionInfo
                       ) -> None:
        """Copy the leader's cleaning (the module docstring): when its clean count
        moved since the last copy, list its sealed segments and make every one this
        log holds whole byte-identical to it; a segment this log holds only part of
        (it copied the start before the leader cleaned it) waits until the log end
        passes it. Runs before the log end is reported, so `catch_up()` never sees a
        copy that holds more than the leader's survivors below its end."""
        end = p.log_end_offset
        self._roll_where_the_leader_did(p, info, end)
        pending = self._clean_pending.get(tp)
        synced = self._state["clean_counts"].get(_tp_name(tp))
        if synced == info.clean_count and (pending is None or pending.end > end):
            return
        if synced != info.clean_count:
            listing = self.source.segments(tp.topic, tp.partition)
            todo = list(listing) if listing is not None else []
        else:
            todo = [pending] if pending is not None else []
        self._clean_pending.pop(tp, None)
        for segment in todo:
            if segment.end > end:
                if segment.base < end:                # copied in part: wait for the rest
                    self._clean_pending[tp] = segment
                break
            if not self._copy_segment(tp, p, segment):
                return                                # the leader moved on: list again
        if synced != info.clean_count:
            self._state["clean_counts"][_tp_name(tp)] = info.clean_count
            self._save_state()

    def _copy_segment(self, tp: TopicPartition, p: Partition, segment: SegmentInfo
                      ) -> bool:
        """Make this log's segment `segment.base` byte-identical to the leader's;
        False when the leader's bytes no longer match its listing (it cleaned again)
        or the segments do not line up (yet): the caller lists again, up to
        MAX_SEGMENT_MISMATCHES times in a row, then keeps what it has."""
        bases = p.segment_base_offsets()
        if segment.end == p.log_end_offset and bases[-1] < segment.end:
            p.roll()                 # the leader sealed it after `info` was read
            bases = p.segment_base_offsets()
        whole = segment.base in bases and segment.end in bases and \
            bases[bases.index(segment.base) + 1] == segment.end
        wanted = (segment.size, segment.sha256)
        data: bytes | None = None
        if whole:
            digests = self._local_digests.setdefault(tp, SegmentDigests())
            mine = digests.segment(p, segment.base, segment.end, segment.first_offset)
            if (mine.size, mine.sha256) == wanted:
                return True                           # the same bytes already
        else:                                         # the same batches in other files?
            data = _read_range(lambda at, upto, n: p.batches_since(at, upto, max_bytes=n),
                               segment.first_offset, segment.end)
            if (len(data), hashlib.sha256(data).hexdigest()) != wanted:
                data = None
        if data is None:
            data = _read_range(lambda at, upto, n: self.source.fetch(
                tp.topic, tp.partition, at, max_bytes=n), segment.first_offset, segment.end)
            if (len(data), hashlib.sha256(data).hexdigest()) != wanted:
                return self._segment_missed(tp, f"the leader's segment {segment.base} "
                                            "changed while it was copied")
        if not p.install_segment(segment.base, segment.end, data):
            return self._segment_missed(tp, f"the leader's cleaned segment {segment.base} "
                                        f"(offsets up to {segment.end - 1}) does not line "
                                        f"up with this log's segments {bases[:20]}")
        self._clean_mismatches.pop(tp, None)
        return True

    def _segment_missed(self, tp: TopicPartition, why: str) -> bool:
        """A segment not copied: False (list again) the first MAX_SEGMENT_MISMATCHES - 1
        times in a row, then True with a warning (this log keeps its own copy of those
        offsets until the leader cleans them again)."""
        count = self._clean_mismatches.get(tp, 0) + 1
        self._clean_mismatches[tp] = count
        if count < MAX_SEGMENT_MISMATCHES:
            log.info("%s: %s: %s (%d in a row); listing again", self.path, _tp_name(tp),
                     why, count)
            return False
        self._clean_mismatches.pop(tp, None)
        self._warn_once(f"segments {tp} {why}", "%s: %s: %s, %d times in a row; it keeps "
                        "its own copy of those offsets", self.path, _tp_name(tp), why, count)
        return True


def _read_range(fetch: Any, first: int, end: int) -> bytes:
    """The whole batches from the one holding `first` up to offset `end` - 1, by
    `fetch(offset, upto, max_bytes)` calls (a batch past `end` is left out)."""
    out = bytearray()
    at = first
    while at < end:
        data = fetch(at, end, SEGMENT_FETCH_BYTES)
        if not data:
            break
        taken = 0
        for pos, header in iter_batches(data, 0, len(data), gaps=True):
            if header.base_offset >= end:
                break
            taken = pos + header.size
            at = header.last_offset + 1
        if taken == 0:
            break
        out += data[:taken]
    return bytes(out)
