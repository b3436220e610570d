"""Open-time checks and recovery of one partition directory (Kafka's LogLoader).

Owns: deciding, cheaply, whether a partition needs recovery when it is opened
(`needs_recovery`), and recovery itself (`recover`): finish an interrupted retention
run, finish or undo an interrupted cleaning pass's swap, sweep orphaned index
files, validate every batch from the recovery point by CRC,
rebuild the indexes, truncate at the first bad byte, drop the segments after a cut, and
publish a fresh tail. Also the view of which files make up the log (`live_bases`).

Invariant: after `recover` the directory holds exactly the segments the new tail names,
each made of whole CRC-valid batches with contiguous offsets (increasing ones in a
compacted partition), and their indexes agree
with them. Who may call: the partition log, holding the partition's append lock
(recovery writes files and the tail); `needs_recovery` and `live_bases` also without it.

Logging: a recovery that cuts bytes logs a WARNING naming `topic-partition`, the bytes
cut and where (docs/design.md §5); one that only re-validates logs at INFO; finishing an
interrupted retention or roll at INFO.
"""

from __future__ import annotations

import bisect
import logging
import os
import shutil
import time
from typing import Any, Callable, Iterable, Mapping, NamedTuple

from ._clock import now_ms as _now_ms
from ._files import fsync_path
from .config import is_compacted
from .records import iter_batches
from .segment import (DELETED_SUFFIX, LogSegment, SegmentRecovery, parse_segment_name,
                      retire_segment, segment_file_name, unlink_segment)
from .tail import BOOT_ID, Tail, TailFile
from .txn_index import txn_index_path

__all__ = ["RecoveryReport", "needs_recovery", "clean_open", "recover", "live_bases",
           "leftovers", "finish_swaps", "CLEANED_SUFFIX", "SWAP_SUFFIX", "CLEANER_STAGING"]

log = logging.getLogger(__name__)


class RecoveryReport(NamedTuple):
    """What one recovery did: segments and bytes validated, bytes cut, time taken."""

    segments_checked: int
    bytes_checked: int
    bytes_truncated: int
    seconds: float



def live_bases(names: Iterable[str], tail: Tail) -> list[int]:
    """Base offsets of the published segments: from the one holding the log start up to
    the active one (a roller's unpublished segment above it and retention's leftovers
    below the start are not part of the log)."""
    bases = sorted(b for b in map(parse_segment_name, names)
                   if b is not None and b <= tail.active_base_offset)
    first = max(0, bisect.bisect_right(bases, tail.log_start_offset) - 1)
    return bases[first:]


def _orphan_index(name: str, names: Any) -> bool:
    """An index file whose `.log` is gone (a retention or roll interrupted between its
    renames)."""
    return (name.endswith((".index", ".timeindex")) and name[:20].isdigit()
            and f"{name[:20]}.log" not in names)


def leftovers(names: Any, bases: list[int]) -> bool:
    """True when files other than the live segments' remain: segments below the log
    start, or index files without their log."""
    live = {segment_file_name(b, ".log") for b in bases}
    for name in names:
        if name.endswith(".log") and parse_segment_name(name) is not None:
            if name not in live and int(name[:20]) < bases[0]:
                return True
        elif _orphan_index(name, names):
            return True
    return False


_LOG, _INDEX, _TIMEINDEX, _OTHER_INDEX = 1, 2, 4, 8


def matching_bases(directory: str, tail: Tail) -> list[int] | None:
    """The live segments' base offsets when the files agree with the tail, else None:
    the active segment is the tail's, every live segment has both indexes, nothing is
    left of a segment below the log start, no index is without its `.log`
    (`live_bases` and `leftovers`, in one pass over one listing: this runs on every
    open of every partition), and the active log holds at least the committed bytes.
    (Committed bytes are not re-checked here: a bad batch below the committed size
    raises CorruptRecordError when read, rather than being cut along with the good
    batches after it.) A segment above the active one was never published (a roller
    died before publishing it) and does not count; the next roll removes it."""
    kinds: dict[str, int] = {}      # 20-digit stem -> the segment files seen for it
    for name in os.listdir(directory):
        stem = name[:20]
        if not stem.isdigit():
            continue
        if name.endswith((SWAP_SUFFIX, CLEANED_SUFFIX)):
            return None               # a cleaning pass's files: recovery decides them
        if name.endswith(".log"):
            if len(name) == 24:
                kinds[stem] = kinds.get(stem, 0) | _LOG
        elif name.endswith(".index"):
            kinds[stem] = kinds.get(stem, 0) | (_INDEX if len(name) == 26 else _OTHER_INDEX)
        elif name.endswith(".timeindex"):
            kinds[stem] = kinds.get(stem, 0) | (_TIMEINDEX if len(name) == 30
                                                else _OTHER_INDEX)
    active = tail.active_base_offset
    logs = []
    for stem, seen in kinds.items():
        if not seen & _LOG:
            return None               # an index without its log: sweep it
        base = int(stem)
        if base <= active:
            logs.append(base)
    logs.sort()
    if not logs or logs[-1] != active:
        return None
    if bisect.bisect_right(logs, tail.log_start_offset) > 1:
        return None                   # below the start: an interrupted retention
    for base in logs:
        if kinds[f"{base:020d}"] & (_INDEX | _TIMEINDEX) != _INDEX | _TIMEINDEX:
            return None
    active_path = f"{directory}/{active:020d}.log"
    return logs if os.stat(active_path).st_size >= tail.active_size else None


def clean_open(directory: str, tail_file: TailFile) -> tuple[Tail, list[int]] | None:
    """(tail, live segment bases) when opening this partition needs no recovery, else
    None: the tail file is new or torn, the last writer ran on another boot and did
    not close cleanly (an OS crash may have lost unsynced bytes), or the files disagree
    with the tail. Without the lock the answer may be stale (another process
    mid-update): on None, decide again under it (`needs_recovery`)."""
    if not tail_file.valid() or tail_file.torn():
        return None
    tail = tail_file.read()
    if tail is None or (tail.boot_id != BOOT_ID and not tail.clean):
        return None
    bases = matching_bases(directory, tail)
    if bases is not None and tail.boot_id != BOOT_ID and os.stat(
            f"{directory}/{tail.active_base_offset:020d}.log").st_size != tail.active_size:
        # clean, but bytes past it: appends after the clean close whose tail stores an
        # OS crash lost (the mark is cleared in the map only); their syncs may have made
        # them durable, so recover them rather than cut them (docs/powercut.md)
        return None
    return None if bases is None else (tail, bases)


def needs_recovery(directory: str, tail_file: TailFile) -> bool:
    """Whether opening this partition must run recovery (`clean_open` found a reason)."""
    return clean_open(directory, tail_file) is None


CLEANED_SUFFIX = ".cleaned"     # a cleaning pass's new segment files, not yet decided
SWAP_SUFFIX = ".swap"           # ... decided: they replace the segments they cover
CLEANER_STAGING = "cleaner.tmp"  # where a pass writes them first (a directory)


def finish_swaps(directory: str, name: str) -> int:
    """Finish or undo what a cleaning pass left (Kafka's `.cleaned`/`.swap` protocol,
    cleaner.py): a `<base>.log.swap` is a decided swap: the live segments it covers
    (bases from its own to its last offset) are retired and its files take the live
    names; `.cleaned` files and `.swap` index files without their `.log.swap` are an
    undecided pass and are removed, as is the staging directory. Returns the swaps
    finished. The caller holds the partition lock (or opens the directory alone)."""
    names = os.listdir(directory)
    finished = 0
    for swap in sorted(n for n in names if n.endswith(".log" + SWAP_SUFFIX)):
        base = parse_segment_name(swap[:-len(SWAP_SUFFIX)])
        if base is None:
            continue
        swap_path = os.path.join(directory, swap)
        last = base - 1
        with open(swap_path, "rb") as f:
            data = f.read()
        for _, header in iter_batches(data, 0, len(data), swap_path, gaps=True):
            last = header.last_offset
        for other in sorted(b for b in map(parse_segment_name, os.listdir(directory))
                            if b is not None and base <= b <= last):
            retire_segment(directory, other)
            index = txn_index_path(directory, other)
            if os.path.exists(index) and not os.path.exists(index + SWAP_SUFFIX):
                os.rename(index, index + DELETED_SUFFIX)
        fsync_path(directory)           # the old names gone on disk before the new one
        for suffix in (".txnindex", ".index", ".timeindex", ".log"):
            path = os.path.join(directory, segment_file_name(base, suffix))
            if os.path.exists(path + SWAP_SUFFIX):
                os.replace(path + SWAP_SUFFIX, path)
        finished += 1
        log.warning("%s: finished a cleaning pass's swap of segment %d (it covers offsets "
                    "up to %d)", name, base, last)
    # Every decided swap was finished above: what is left of a pass is undecided.
    for leftover in os.listdir(directory):
        if leftover.endswith((CLEANED_SUFFIX, SWAP_SUFFIX)) and leftover[:20].isdigit():
            try:
                os.unlink(os.path.join(directory, leftover))
            except FileNotFoundError:
                pass
    shutil.rmtree(os.path.join(directory, CLEANER_STAGING), ignore_errors=True)
    if finished:
        fsync_path(directory)
    return finished



def _sweep_orphans(directory: str) -> None:
    """Remove index files whose `.log` is gone."""
    names = set(os.listdir(directory))
    for name in names:
        if _orphan_index(name, names):
            try:
                os.unlink(os.path.join(directory, name))
            except FileNotFoundError:
                pass


def recover(directory: str, tail_file: TailFile, config: Mapping[str, Any], *, full: bool,
            name: str, adopt: Callable[[LogSegment], None] | None = None
            ) -> RecoveryReport:
    """Validate from the recovery point (everything when `full` or when the tail is
    unreadable), rebuild indexes, truncate at the first bad byte, drop later segments,
    publish a fresh tail. `name` is `topic-partition`, for the log. The caller holds
    the partition lock and has closed its segments. A first segment made here (a new
    partition) is handed to `adopt` still open, once the tail naming it is published,
    so the caller's first append does not open and map its files again; without
    `adopt`, or when recovery fails, it is closed."""
    started = time.perf_counter()
    valid = tail_file.valid()
    old = tail_file.read() if valid and not tail_file.torn() else None
    # A torn tail's fields are each old or new, so its version is >= every version
    # a reader cached: count on from it, or readers could miss the new segment list.
    # Its recovery point, old or new, is one: a writer publishes a recovery point
    # only after the fsync of the bytes below it. So a SIGKILL mid-update costs a
    # scan from there, not of the whole partition.
    previous = old if old is not None else tail_file.read_torn() if valid else None
    full = full or previous is None
    finish_swaps(directory, name)       # a cleaning pass cut short (cleaner.py)
    previous_start = previous.log_start_offset if previous is not None else None
    bases = sorted(b for b in map(parse_segment_name, os.listdir(directory))
                   if b is not None)
    fresh = not bases and tail_file.created
    if previous_start is not None and bases:
        # Segments wholly below the published log start are retention's leftovers
        # (it publishes the new start before renaming): finish their deletion
        # rather than bring deleted records back.
        keep = max(0, bisect.bisect_right(bases, previous_start) - 1)
        if keep:
            log.warning("%s: finishing an interrupted retention run: %d segment(s) below "
                        "log start %d", name, keep, previous_start)
        for base in bases[:keep]:
            retire_segment(directory, base)
        bases = bases[keep:]
    names = set(os.listdir(directory))
    _sweep_orphans(directory)
    index_bytes = config["segment.index.bytes"]
    made: LogSegment | None = None
    if not bases:
        start = previous_start if previous_start is not None else 0
        made = LogSegment(directory, start, active=True, create_index_bytes=index_bytes)
        if adopt is None or not fresh:    # else recovery below opens it again
            made.close()
            made = None
        bases = [start]
    try:
        report = _recover_from(directory, tail_file, config, full=full, name=name,
                               bases=bases, names=names, fresh=fresh, previous=previous,
                               previous_start=previous_start, started=started)
    except BaseException:
        if made is not None:
            made.close()
        raise
    if made is not None and adopt is not None:
        adopt(made)
    return report


def _recover_from(directory: str, tail_file: TailFile, config: Mapping[str, Any], *,
                  full: bool, name: str, bases: list[int], names: set[str], fresh: bool,
                  previous: Tail | None, previous_start: int | None, started: float
                  ) -> RecoveryReport:
    """`recover` from the segment list on: scan, cut, publish the tail."""
    index_bytes = config["segment.index.bytes"]
    gaps = is_compacted(config) or (previous is not None and previous.clean_count > 0)
    recovery_point = 0 if full or previous is None else previous.recovery_point
    first = max(0, bisect.bisect_right(bases, recovery_point) - 1)
    checked = truncated = segments_checked = 0
    if fresh:       # a new partition: its empty segment was just made; nothing to scan
        found = SegmentRecovery(0, 0, bases[0], -1, -1, None)
        entries = time_entries = 0
    for i, base in enumerate([] if fresh else bases):
        last = i == len(bases) - 1
        has_indexes = (segment_file_name(base, ".index") in names
                       and segment_file_name(base, ".timeindex") in names)
        if i < first and has_indexes:
            continue                  # below the recovery point: fsynced, trusted
        segment = LogSegment(directory, base, active=True)
        segment.gaps = gaps
        found = segment.recover(max_message_bytes=config["max.message.bytes"],
                                interval_bytes=config["index.interval.bytes"],
                                index_bytes=index_bytes, start_offset=base)
        segments_checked += 1
        checked += found.size
        truncated += found.bytes_cut
        if found.bytes_cut:
            log.warning("%s: recovery cut %d bytes at position %d of %s (%s)", name,
                        found.bytes_cut, found.size, segment.path, found.cause)
        if found.bytes_cut and not last:      # Kafka drops every segment after a cut
            dropped = 0
            for later in bases[i + 1:]:
                dropped += unlink_segment(directory, later)
            truncated += dropped
            log.warning("%s: recovery dropped %d segment(s) (%d bytes) after the cut",
                        name, len(bases) - i - 1, dropped)
            bases = bases[:i + 1]
            last = True
        if last:
            entries, time_entries = segment.index_entry_counts()
            segment.close()
            break
        segment.seal(found.max_timestamp, found.max_timestamp_offset, found.size)
        segment.close()
    next_offset = found.next_offset
    version = (previous.segments_version + 1) if previous is not None else 1
    start = bases[0]
    if previous_start is not None and start < previous_start <= next_offset:
        start = previous_start        # a log start inside the first segment stays
    tail_file.publish(Tail(
        BOOT_ID, start, next_offset, bases[-1], found.size, entries, time_entries,
        version, next_offset, found.max_timestamp, found.max_timestamp_offset,
        min(recovery_point, next_offset), _now_ms() if found.size else -1, 0, 0, -1,
        previous.leader_epoch if previous is not None else 0,
        previous.deleted if previous is not None else 0,
        min(previous.cleaned_offset, next_offset) if previous is not None else 0,
        previous.clean_count if previous is not None else 0))
    if not fresh:   # a new partition's tail lost to an OS crash is rebuilt by recovery
        tail_file.sync()
    report = RecoveryReport(segments_checked, checked, truncated,
                            time.perf_counter() - started)
    if fresh:
        log.debug("%s: new partition, first segment at offset %d", name, start)
    elif truncated:
        log.warning("%s: recovered with %d bytes cut: %d segment(s), %d bytes valid, log "
                    "end offset %d, %.3f s", name, truncated, segments_checked, checked,
                    next_offset, report.seconds)
    else:
        log.warning("%s: recovered: %d segment(s), %d bytes valid, nothing cut, log end "
                    "offset %d, %.3f s", name, segments_checked, checked, next_offset,
                    report.seconds)
    return report
