"""Log compaction's decisions and its background thread (Kafka's LogCleaner).

Owns: the key -> latest-offset map of one pass (`OffsetMap`, bounded by
`log.cleaner.dedupe.buffer.size` counted as Kafka counts it, 24 bytes a key), which
record of a batch a pass keeps (`keep_records`: the latest of its key, tombstones until
their delete horizon, never a keyless record), the pass's report (`CleanReport`), the
dirty ratio that makes a partition due (`due`), and `LogCleaner`, the thread every
writable Broker runs. The pass itself — reading segments, writing `.cleaned` files and
swapping them in — is `log_clean.py`'s, a mixin of the partition log.

Invariant: a pass never changes an offset and never drops the latest record of a key
below the map's end; a tombstone goes only once `now` has passed the horizon stamped in
its batch by an earlier pass (KIP-534).
"""

from __future__ import annotations

import hashlib
import logging
import threading
from typing import Any, Callable, Iterable, NamedTuple, Sequence

from .config import is_compacted
from .records import Record

__all__ = ["CleanReport", "OffsetMap", "keep_records", "due", "LogCleaner",
           "ENTRY_BYTES"]

log = logging.getLogger(__name__)

ENTRY_BYTES = 24                  # Kafka's SkimpyOffsetMap: a 16-byte hash + an offset
_SHORT_KEY = 16                   # keys up to this long are kept as they are


class CleanReport(NamedTuple):
    """What one cleaning pass of one partition did. `first_dirty_offset` is the cleaner
    checkpoint after the pass (the offsets below it are clean)."""

    records_before: int
    records_after: int
    bytes_before: int
    bytes_after: int
    segments_before: int
    segments_after: int
    first_dirty_offset: int
    seconds: float


class OffsetMap:
    """Key -> the latest offset seen for it, for at most `capacity` keys
    (dedupe buffer bytes x load factor / 24, Kafka's accounting). A key longer than 16
    bytes is held by its MD5 digest, as Kafka holds every key; shorter keys as
    themselves, so they never collide."""

    def __init__(self, buffer_bytes: int, load_factor: float = 0.9) -> None:
        self.capacity = max(1, int(buffer_bytes * load_factor) // ENTRY_BYTES)
        self._offsets: dict[bytes, int] = {}

    def __len__(self) -> int:
        return len(self._offsets)

    def room(self) -> int:
        return self.capacity - len(self._offsets)

    @staticmethod
    def digest(key: Any) -> bytes:
        key = bytes(key)
        if len(key) <= _SHORT_KEY:
            return key
        return b"\x01" + hashlib.md5(key, usedforsecurity=False).digest()

    def put_all(self, records: Iterable[Record]) -> None:
        offsets = self._offsets
        digest = self.digest
        for record in records:
            if record.key is not None:
                offsets[digest(record.key)] = record.offset

    def latest(self, key: Any) -> int:
        """The latest offset mapped for `key`, or -1."""
        return self._offsets.get(self.digest(key), -1)


def keep_records(records: Sequence[Record], offset_map: OffsetMap, map_end: int, *,
                 now_ms: int, horizon_ms: int | None) -> list[Record]:
    """The records of one batch a pass keeps: a keyed record that is its key's latest
    (or past the map's end, which the map knows nothing of), less tombstones whose
    batch's delete horizon (`horizon_ms`, None when no pass stamped one yet) has passed.
    A keyless record is never kept (a compacted topic refuses them; one written before
    the topic became compacted goes at its first pass, as in Kafka)."""
    kept = []
    latest = offset_map.latest
    for record in records:
        if record.key is None:
            continue
        if record.offset < map_end and latest(record.key) > record.offset:
            continue                                   # a later record of its key
        if record.value is None and horizon_ms is not None and now_ms >= horizon_ms:
            continue                                   # a tombstone past its horizon
        kept.append(record)
    return kept


def due(partition: Any, now_ms: int) -> bool:
    """Whether a partition should be cleaned now: its uncleaned bytes are at least
    min.cleanable.dirty.ratio of its cleanable bytes, or its oldest uncleaned record
    is older than max.compaction.lag.ms (Kafka's LogCleanerManager rules)."""
    dirty, total, oldest_dirty_ms = partition.cleanable_bytes(now_ms)
    if dirty <= 0:
        return False
    config = partition.config
    if oldest_dirty_ms >= 0 and now_ms - oldest_dirty_ms >= config["max.compaction.lag.ms"]:
        return True
    return dirty / max(total, 1) >= config["min.cleanable.dirty.ratio"]


class LogCleaner:
    """The background cleaner of one Broker: a daemon thread that every
    `log.cleaner.backoff.ms` cleans each compacted partition that is due (see `due`)
    and that no other process is cleaning (the partition's cleaner lock, taken without
    waiting). `partitions` returns the broker's open partitions; errors are logged and
    the partition is tried again at the next round."""

    def __init__(self, partitions: Callable[[], Iterable[Any]], backoff_ms: int,
                 *, clock: Callable[[], int]) -> None:
        self._partitions = partitions
        self._backoff_s = backoff_ms / 1000
        self._clock = clock
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="logkit-log-cleaner",
                                        daemon=True)
        self.passes = 0

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout_s: float = 30.0) -> None:
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout_s)

    def _run(self) -> None:
        while not self._stop.wait(self._backoff_s):
            self.run_once()

    def run_once(self) -> int:
        """One round over the partitions; returns the passes made."""
        made = 0
        for partition in list(self._partitions()):
            if self._stop.is_set():
                break
            try:
                if not is_compacted(partition.config) or not due(partition, self._clock()):
                    continue
                if partition.compact(block=False) is not None:
                    made += 1
            except Exception as exc:        # a closed or deleted partition, a full disk
                log.warning("log cleaner: %r not cleaned this round: %s", partition, exc)
        self.passes += made
        return made
