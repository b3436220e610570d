"""The producer state of one partition (Kafka's ProducerStateManager): what an idempotent
or transactional producer last wrote here, and its `.snapshot` files.

Owns: per producer id, the latest epoch, the last BATCHES_KEPT batches (first and last
sequence, base and last offset), the first offset of its open transaction and the
coordinator epoch of its last marker; the checks of a new batch against them
(`check`: a duplicate of a kept batch answers the original base offset, a sequence gap
raises OutOfOrderSequenceError, an older epoch InvalidProducerEpochError, a new epoch
must start at sequence 0); applying a stored batch or marker (`apply`); the first
offset of the oldest open transaction (the last stable offset's bound); and the
snapshot files, in Kafka's layout (`kafka-dump-log` reads them):

    off  field                          type
    0    version (= 1)                  int16
    2    crc: CRC-32C of bytes 6..end   uint32
    6    entry count                    int32
    10   entries, 46 bytes each:
           producerId int64, producerEpoch int16, lastSequence int32, lastOffset int64,
           offsetDelta int32 (lastSequence - firstSequence of the last batch),
           timestamp int64, coordinatorEpoch int32, currentTxnFirstOffset int64 (-1: none)

named `%020d.snapshot` after the offset up to which they hold the state (the batches
below it). Invariant: a `ProducerStateManager` reflects exactly the batches below its
`end_offset`; it is derived data, rebuilt from a snapshot plus the batch headers after
it (log_txn.py does that), never trusted past a log it has not read.

Not thread-safe: the partition log calls it under its thread lock.
"""

from __future__ import annotations

import logging
import os
import struct
from collections import deque
from typing import Iterator, NamedTuple

from ._files import open_file
from .crc import crc32c
from .errors import InvalidProducerEpochError, InvalidTxnStateError, OutOfOrderSequenceError
from .records import ATTR_CONTROL, ATTR_TRANSACTIONAL, BatchHeader

__all__ = ["ProducerStateManager", "ProducerEntry", "ActiveProducer", "BATCHES_KEPT", "SNAPSHOT_SUFFIX",
           "snapshot_offsets", "snapshot_path", "read_snapshot", "write_snapshot",
           "delete_snapshots"]

log = logging.getLogger("logkit.log")

BATCHES_KEPT = 5                      # Kafka's ProducerStateEntry.NUM_BATCHES_TO_RETAIN
SNAPSHOT_SUFFIX = ".snapshot"
SNAPSHOTS_KEPT = 2                    # the newest snapshots a partition keeps
SNAPSHOT_VERSION = 1
INT32_MAX = 2**31 - 1
PRODUCER_ID_EXPIRATION_MS = 86400000  # Kafka's producer.id.expiration.ms default
NO_EPOCH = -1

_SNAPSHOT_HEAD = struct.Struct(">hIi")                 # version, crc, entry count
_SNAPSHOT_CRC_FROM = 6                                 # the CRC covers from the count on
_SNAPSHOT_ENTRY = struct.Struct(">qhiqiqiq")
assert _SNAPSHOT_ENTRY.size == 46


class KeptBatch(NamedTuple):
    first_sequence: int
    last_sequence: int
    base_offset: int
    last_offset: int


_kept = tuple.__new__          # KeptBatch without NamedTuple's slower constructor


class ActiveProducer(NamedTuple):
    """One producer as a partition knows it: the fields of Kafka's DescribeProducers
    (`Admin.describeProducers()`'s ProducerState); -1 where there is none."""

    producer_id: int
    producer_epoch: int
    last_sequence: int
    last_timestamp: int
    coordinator_epoch: int
    current_txn_start_offset: int


class ProducerEntry:
    """One producer id's state on this partition."""

    __slots__ = ("epoch", "batches", "txn_first_offset", "coordinator_epoch",
                 "last_timestamp")

    def __init__(self, epoch: int) -> None:
        self.epoch = epoch
        self.batches: deque[KeptBatch] = deque(maxlen=BATCHES_KEPT)
        self.txn_first_offset = -1
        self.coordinator_epoch = -1
        self.last_timestamp = -1

    def set_epoch(self, epoch: int) -> None:
        """A new epoch starts a new sequence: the kept batches of the old one go."""
        if epoch != self.epoch:
            self.epoch = epoch
            self.batches.clear()

    def last_sequence(self) -> int | None:
        return self.batches[-1].last_sequence if self.batches else None


def last_sequence_of(header: BatchHeader) -> int:
    """The batch's last sequence number (sequences wrap from INT32_MAX to 0, as Kafka's)."""
    base, delta = header.base_sequence, header.last_offset_delta
    if base > INT32_MAX - delta:
        return delta - (INT32_MAX - base) - 1
    return base + delta


def _in_sequence(last: int, first: int) -> bool:
    return first == last + 1 or (first == 0 and last == INT32_MAX)


class ProducerStateManager:
    """The producer state of one partition up to `end_offset` (see the module docstring)."""

    def __init__(self, end_offset: int = 0) -> None:
        self.producers: dict[int, ProducerEntry] = {}
        self.ongoing: dict[int, int] = {}       # producer id -> first offset of its open txn
        self.end_offset = end_offset
        self.last_batch: tuple[int, int] = (-1, 0)     # (base offset, crc) of the last
        #                                                batch applied: truncation checks

    # ---- a new batch (a producer's append) -------------------------------------------

    def check(self, header: BatchHeader) -> KeptBatch | None:
        """Check an incoming batch of `header.producer_id` (>= 0): its kept twin when it
        is a duplicate (the caller answers the twin's base offset and stores nothing),
        else None (append it, then `record` it). Raises InvalidProducerEpochError,
        OutOfOrderSequenceError, InvalidTxnStateError (a plain batch inside the
        producer's open transaction) with nothing changed."""
        entry = self.producers.get(header.producer_id)
        if entry is None:
            return None      # unknown producer (or its batches were all deleted): any
        epoch = header.producer_epoch          # sequence starts it, as Kafka's
        if epoch < entry.epoch:
            raise InvalidProducerEpochError(
                f"producer {header.producer_id} epoch {epoch} is older than the "
                f"partition's latest epoch {entry.epoch}")
        first = header.base_sequence
        if epoch == entry.epoch:
            last = last_sequence_of(header)
            for kept in entry.batches:
                if kept.first_sequence == first and kept.last_sequence == last:
                    return kept
            current = entry.last_sequence()
            if not _in_sequence(-1 if current is None else current, first):
                raise OutOfOrderSequenceError(
                    f"producer {header.producer_id} epoch {epoch}: sequence {first} does "
                    f"not follow {current} (the last stored batch's last sequence)")
        elif first != 0:
            raise OutOfOrderSequenceError(
                f"producer {header.producer_id}: a new epoch {epoch} (was {entry.epoch}) "
                f"must start at sequence 0, not {first}")
        if entry.txn_first_offset >= 0 and not header.attributes & ATTR_TRANSACTIONAL:
            raise InvalidTxnStateError(
                f"producer {header.producer_id} wrote a non-transactional batch inside "
                f"its open transaction (from offset {entry.txn_first_offset})")
        return None

    def follows(self, producer_id: int, epoch: int, first_sequence: int,
                attributes: int) -> bool:
        """The hot path's question: is this batch simply the next one of a producer
        this state knows (same epoch, the sequence right after its last batch, within
        the rules of its open transaction)? False sends it to `check`, which decides
        every other case (duplicates, gaps, epochs, new producers)."""
        entry = self.producers.get(producer_id)
        if entry is None or entry.epoch != epoch or not entry.batches:
            return False
        last = entry.batches[-1].last_sequence
        if first_sequence != last + 1 and not (first_sequence == 0 and last == INT32_MAX):
            return False
        return entry.txn_first_offset < 0 or bool(attributes & ATTR_TRANSACTIONAL)

    def append_next(self, producer_id: int, first_sequence: int, last_offset_delta: int,
                    base_offset: int, attributes: int, max_timestamp: int, crc: int) -> None:
        """`apply` for a batch `follows` accepted and the log stored at `base_offset`,
        from its raw header fields."""
        entry = self.producers[producer_id]
        last_offset = base_offset + last_offset_delta
        if first_sequence > INT32_MAX - last_offset_delta:
            last_sequence = last_offset_delta - (INT32_MAX - first_sequence) - 1
        else:
            last_sequence = first_sequence + last_offset_delta
        entry.batches.append(_kept(KeptBatch, (first_sequence, last_sequence, base_offset,
                                                last_offset)))
        entry.last_timestamp = max_timestamp
        if attributes & ATTR_TRANSACTIONAL and entry.txn_first_offset < 0:
            entry.txn_first_offset = base_offset
            self.ongoing[producer_id] = base_offset
        self.end_offset = last_offset + 1
        self.last_batch = (base_offset, crc)

    # ---- stored batches (appends, and replay of the log) ------------------------------

    def apply(self, header: BatchHeader, base_offset: int | None = None) -> None:
        """Take a stored data batch or marker into the state (no checks: it is in the
        log). `base_offset` overrides the header's (a batch just appended, whose bytes
        were stamped after the header was read). Moves `end_offset` past it."""
        base = header.base_offset if base_offset is None else base_offset
        last_offset = base + header.last_offset_delta
        producer_id = header.producer_id
        if producer_id >= 0:
            entry = self.producers.get(producer_id)
            if entry is None:
                entry = self.producers[producer_id] = ProducerEntry(header.producer_epoch)
            else:
                entry.set_epoch(header.producer_epoch)
            entry.last_timestamp = header.max_timestamp
            if header.attributes & ATTR_CONTROL:
                self._end_txn(entry, producer_id)
            else:
                entry.batches.append(KeptBatch(header.base_sequence,
                                               last_sequence_of(header), base, last_offset))
                if header.attributes & ATTR_TRANSACTIONAL and entry.txn_first_offset < 0:
                    entry.txn_first_offset = base
                    self.ongoing[producer_id] = base
        self.end_offset = last_offset + 1
        self.last_batch = (base, header.crc)

    def _end_txn(self, entry: ProducerEntry, producer_id: int) -> None:
        entry.txn_first_offset = -1
        self.ongoing.pop(producer_id, None)

    def set_coordinator_epoch(self, producer_id: int, coordinator_epoch: int) -> None:
        entry = self.producers.get(producer_id)
        if entry is not None:
            entry.coordinator_epoch = coordinator_epoch

    def skip_to(self, offset: int) -> None:
        """Batches below `offset` without a producer: only the end moves."""
        self.end_offset = offset

    def expire(self, now_ms: int, expiration_ms: int = PRODUCER_ID_EXPIRATION_MS) -> int:
        """Forget producers idle for `expiration_ms` (by their last batch's timestamp)
        without an open transaction, as Kafka's broker does; returns how many."""
        idle = [pid for pid, entry in self.producers.items()
                if entry.txn_first_offset < 0 and 0 <= entry.last_timestamp
                < now_ms - expiration_ms]
        for pid in idle:
            del self.producers[pid]
        return len(idle)

    # ---- transactions ------------------------------------------------------------------

    def open_txn_first_offset(self, producer_id: int) -> int:
        """First offset of the producer's open transaction here, -1 when none."""
        return self.ongoing.get(producer_id, -1)

    def first_unstable_offset(self) -> int | None:
        """The first offset of the oldest open transaction (None: none open)."""
        return min(self.ongoing.values()) if self.ongoing else None

    def stable_after_abort(self, producer_id: int, marker_offset: int) -> int:
        """Kafka's lastStableOffset(completedTxn): with `producer_id`'s transaction ended
        by the marker at `marker_offset`, the first offset of the oldest other open
        transaction, else the offset after the marker."""
        others = [first for pid, first in self.ongoing.items() if pid != producer_id]
        return min(others) if others else marker_offset + 1

    # ---- snapshots ---------------------------------------------------------------------

    def encode_snapshot(self) -> bytes:
        entries = []
        for producer_id, entry in self.producers.items():
            if entry.batches:
                kept = entry.batches[-1]
                last_seq, last_offset = kept.last_sequence, kept.last_offset
                delta = kept.last_offset - kept.base_offset
            else:
                last_seq, last_offset, delta = -1, -1, 0
            entries.append(_SNAPSHOT_ENTRY.pack(
                producer_id, entry.epoch, last_seq, last_offset, delta,
                entry.last_timestamp, entry.coordinator_epoch, entry.txn_first_offset))
        body = struct.pack(">i", len(entries)) + b"".join(entries)
        return struct.pack(">hI", SNAPSHOT_VERSION, crc32c(body)) + body

    @classmethod
    def decode_snapshot(cls, data: bytes, end_offset: int, path: str = ""
                        ) -> "ProducerStateManager":
        """The state a snapshot holds; ValueError when its bytes are not one."""
        if len(data) < _SNAPSHOT_HEAD.size:
            raise ValueError(f"{path}: snapshot shorter than its header")
        version, crc, count = _SNAPSHOT_HEAD.unpack_from(data, 0)
        if version != SNAPSHOT_VERSION:
            raise ValueError(f"{path}: snapshot version {version}, expected "
                             f"{SNAPSHOT_VERSION}")
        if crc32c(data[_SNAPSHOT_CRC_FROM:]) != crc:
            raise ValueError(f"{path}: snapshot CRC mismatch")
        if count < 0 or len(data) != _SNAPSHOT_HEAD.size + count * _SNAPSHOT_ENTRY.size:
            raise ValueError(f"{path}: snapshot length does not match its {count} entries")
        state = cls(end_offset)
        for fields in _SNAPSHOT_ENTRY.iter_unpack(data[_SNAPSHOT_HEAD.size:]):
            (producer_id, epoch, last_seq, last_offset, delta, timestamp,
             coordinator_epoch, txn_first) = fields
            entry = state.producers[producer_id] = ProducerEntry(epoch)
            if last_offset >= 0:
                first_seq = last_seq - delta if last_seq >= delta else \
                    INT32_MAX - (delta - last_seq) + 1
                entry.batches.append(KeptBatch(first_seq, last_seq, last_offset - delta,
                                               last_offset))
            entry.last_timestamp = timestamp
            entry.coordinator_epoch = coordinator_epoch
            entry.txn_first_offset = txn_first
            if txn_first >= 0:
                state.ongoing[producer_id] = txn_first
        return state

    def describe(self) -> Iterator[tuple[int, int, int, int]]:
        """(producer id, epoch, last sequence or -1, open transaction's first offset or
        -1) per producer (DescribeProducers)."""
        for active in self.describe_active():
            yield active.producer_id, active.producer_epoch, active.last_sequence, \
                active.current_txn_start_offset

    def describe_active(self) -> Iterator[ActiveProducer]:
        """Every producer's `ActiveProducer` (DescribeProducers' whole entry)."""
        for producer_id, entry in self.producers.items():
            last = entry.last_sequence()
            yield ActiveProducer(producer_id, entry.epoch, -1 if last is None else last,
                                 entry.last_timestamp, entry.coordinator_epoch,
                                 entry.txn_first_offset)


# ---- snapshot files ------------------------------------------------------------------------

def snapshot_path(directory: str, offset: int) -> str:
    return os.path.join(directory, f"{offset:020d}{SNAPSHOT_SUFFIX}")


def snapshot_offsets(directory: str) -> list[int]:
    """Offsets of the snapshot files in `directory`, ascending."""
    return sorted(int(name[:20]) for name in os.listdir(directory)
                  if len(name) == 20 + len(SNAPSHOT_SUFFIX)
                  and name.endswith(SNAPSHOT_SUFFIX) and name[:20].isdigit())


def write_snapshot(directory: str, state: ProducerStateManager, *, sync: bool) -> None:
    """Write `state` as the snapshot at its end offset: a temporary name, then a rename,
    so a reader sees a whole file or none; older snapshots beyond SNAPSHOTS_KEPT go."""
    path = snapshot_path(directory, state.end_offset)
    tmp = path + ".tmp"
    data = state.encode_snapshot()
    fd = open_file(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        if sync:
            os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    offsets = snapshot_offsets(directory)
    delete_snapshots(directory, offsets[:-SNAPSHOTS_KEPT])


def read_snapshot(directory: str, offset: int, *, remove_damaged: bool = True
                  ) -> ProducerStateManager | None:
    """The state in the snapshot at `offset`; None when it is unreadable or damaged (the
    log rebuilds it), and then the file is removed when `remove_damaged`."""
    path = snapshot_path(directory, offset)
    try:
        with open(path, "rb") as f:
            data = f.read()
        return ProducerStateManager.decode_snapshot(data, offset, path)
    except FileNotFoundError:
        return None
    except ValueError as exc:
        log.warning("ignoring a damaged producer snapshot: %s", exc)
        if remove_damaged:
            delete_snapshots(directory, [offset])
        return None


def delete_snapshots(directory: str, offsets: list[int]) -> None:
    for offset in offsets:
        try:
            os.unlink(snapshot_path(directory, offset))
        except FileNotFoundError:
            pass
