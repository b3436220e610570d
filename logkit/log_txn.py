"""Idempotence and transactions of one partition log: its producer state, the
transaction markers, the last stable offset and read_committed reads.

Owns: keeping this process's `ProducerStateManager` (producer_state.py) caught up with
the log — loaded lazily from the newest `.snapshot` at or below the log end plus the
headers of the batches after it, then, before each use, the headers of batches any
process appended since (`_producer_state`), reloaded when the log was cut under it;
the check of a producer's batch, for the append path in log_append.py: under the
append lock (`_append_idempotent`), or, for a producer's next in-sequence batch, before
one C call that appends it only while the log still ends where the checked state does
(`_append_next_fast`, the hot path); `append_control` (a COMMIT/ABORT marker, and for
an ABORT the `.txnindex` entry, written and synced before the marker is published:
txn_index.py says why); the last stable offset; `aborted_transactions` (Kafka's
collectAbortedTransactions, over the `.txnindex` files); read_committed reads (stop at
the LSO, drop the records of aborted transactions, whose batches the index and the
batch headers name: no record is inspected to decide); snapshots at each roll and at a
clean close (producers idle for producer.id.expiration.ms forgotten first), and the
`.txnindex` files of deleted segments removed at a roll; and the rebuild after
recovery (stale snapshots and index entries past the log end dropped, the index
entries of the ABORT markers in the segments recovery scanned re-added).

Invariant: whatever process asks, the producer state it answers from reflects every
batch below the log end it read, so the LSO and the duplicate checks are the same in
every process. The state is touched only under the partition's thread lock (under the
append lock for a check and the append that follows it).

A mixin of `PartitionLog` (log.py), which owns the state it reads and writes.
"""

from __future__ import annotations

import bisect
import logging
import operator
import os
import struct
from typing import Any, Iterator

from ._clock import now_ms as _now_ms
from .errors import ConfigError, CorruptRecordError, InvalidProducerEpochError, storage_error
from .group_commit import SyncTicket
from .partition_lock import LOCK_TIMEOUT_S
from .producer_state import (
    ActiveProducer,
    KeptBatch,
    ProducerStateManager,
    delete_snapshots,
    read_snapshot,
    snapshot_offsets,
    write_snapshot,
)
from .records import (
    _HEADER,
    ATTR_CONTROL,
    ATTR_TRANSACTIONAL,
    CONTROL_ABORT,
    CRC_OFFSET,
    FIELD_BASE_OFFSET,
    FIELD_BATCH_LENGTH,
    FIELD_MAGIC,
    LOG_OVERHEAD,
    MAGIC,
    MIN_BATCH_LENGTH,
    RECORDS_OFFSET,
    TORN_BATCH,
    BatchHeader,
    Record,
    control_record_type,
    encode_control_batch,
    read_header,
)
from .tail import Tail
from .txn_index import (
    TXN_INDEX_SUFFIX,
    AbortedTxn,
    append_entry,
    truncate_entries,
    txn_index_path,
)

log = logging.getLogger("logkit.log")

READ_UNCOMMITTED = "read_uncommitted"
READ_COMMITTED = "read_committed"
ISOLATION_LEVELS = (READ_UNCOMMITTED, READ_COMMITTED)
# crc, attributes, lastOffsetDelta, (baseTimestamp skipped), maxTimestamp, producerId,
# producerEpoch, baseSequence: the header fields the hot path reads, in one unpack
_NEXT_FIELDS = struct.Struct(">Ihi8xqqhi").unpack_from
_unpack_header = _HEADER.unpack_from
_FIELD_PRODUCER_ID = BatchHeader._fields.index("producer_id")
_record_offset = operator.attrgetter("offset")
READ_COMMITTED_ROUNDS = 64      # reads a read_committed read() tries past aborted batches


def check_isolation_level(isolation_level: str) -> bool:
    """True for read_committed; ConfigError (a ValueError) for a name Kafka does not
    have."""
    if isolation_level == READ_UNCOMMITTED:
        return False
    if isolation_level == READ_COMMITTED:
        return True
    raise ConfigError(f"isolation_level must be one of {ISOLATION_LEVELS}, not "
                      f"{isolation_level!r}")


def _producer_batches(buf: Any, pos: int, size: int, end_offset: int, path: str
                      ) -> Iterator[tuple[int, BatchHeader]]:
    """(position, header) of the batches in buf[pos:size] below `end_offset` that name a
    producer: the replay's walk, which skips the others without building their headers
    (`records.iter_batches`' framing checks, not its offset chain: the state needs none).
    A torn or impossible header raises CorruptRecordError as there."""
    while pos < size:
        fields = _unpack_header(buf, pos) if size - pos >= RECORDS_OFFSET else None
        length = -1 if fields is None else fields[FIELD_BATCH_LENGTH]
        if fields is None or fields[FIELD_MAGIC] != MAGIC or length < MIN_BATCH_LENGTH \
                or pos + LOG_OVERHEAD + length > size:
            header = read_header(buf, pos, size, path)      # raises the precise error
            if header is None:
                raise CorruptRecordError(TORN_BATCH, path=path, position=pos,
                                         expected=size)
            fields = tuple(header)
        if fields[FIELD_BASE_OFFSET] >= end_offset:
            return
        if fields[_FIELD_PRODUCER_ID] >= 0:
            yield pos, BatchHeader._make(fields)
        pos += LOG_OVERHEAD + fields[FIELD_BATCH_LENGTH]


class _LogTransactions:
    """Producer state and transactions of `PartitionLog` (see the module docstring)."""

    # ---- the producer state, caught up -----------------------------------------------

    def _producer_state(self, tail: Tail, *, repair: bool = False) -> ProducerStateManager:
        """This process's producer state, caught up to `tail`'s log end. The caller holds
        the thread lock, with the segment list refreshed to `tail`. `repair` (under
        the append lock only): re-add a missing `.txnindex` entry for an ABORT marker
        met on the way."""
        state = self._producers
        if state is None or state.end_offset > tail.log_end_offset or (
                self._producers_version != tail.segments_version
                and not self._last_batch_still_there(state, tail)):
            state = self._load_producer_state(tail, repair=repair)
        elif state.end_offset < tail.log_end_offset:
            self._replay(state, tail, repair=repair)
        self._producers_version = tail.segments_version
        return state

    def _last_batch_still_there(self, state: ProducerStateManager, tail: Tail) -> bool:
        """Whether the last batch the state took in is still in the log as it was (a
        truncation or a replaced segment changes the list version; a roll or retention
        leaves it)."""
        base, crc = state.last_batch
        if base < tail.log_start_offset:
            return True                      # gone by retention, or nothing taken in
        i = self._first_segment(base, tail.log_end_offset)
        segment, size = self._sized(self._bases[i], tail)
        pos = segment.find(base, size)
        header = read_header(segment.view(size), pos, size, segment.path)
        return header is not None and header.base_offset == base and header.crc == crc

    def _load_producer_state(self, tail: Tail, *, repair: bool,
                             replay_from: int | None = None) -> ProducerStateManager:
        """The newest readable snapshot at or below the log end (and `replay_from`),
        plus the batches after."""
        state = None
        limit = tail.log_end_offset if replay_from is None else min(replay_from,
                                                                    tail.log_end_offset)
        for offset in reversed(snapshot_offsets(self.directory)):
            if offset <= limit:
                state = read_snapshot(self.directory, offset,
                                      remove_damaged=not self.read_only)
                if state is not None:
                    break
        if state is None:
            state = ProducerStateManager(tail.log_start_offset)
        self._replay(state, tail, repair=repair)
        self._producers = state
        return state

    def _replay(self, state: ProducerStateManager, tail: Tail, *, repair: bool) -> None:
        """Take in the headers of the batches from the state's end to the log end."""
        end = tail.log_end_offset
        offset = max(state.end_offset, tail.log_start_offset)
        bases = self._bases
        i = self._first_segment(offset, end) if offset < end else len(bases)
        while i < len(bases) and offset < end:
            segment, size = self._sized(bases[i], tail)
            for pos, header in _producer_batches(segment.view(size),
                                                 segment.find(offset, size), size, end,
                                                 segment.path):
                if repair and header.attributes & ATTR_CONTROL:
                    self._repair_txn_index(state, segment.view(size), pos, header,
                                           segment.base_offset, segment.path)
                state.apply(header)
            i += 1
            if i < len(bases):
                offset = max(offset, bases[i])
        state.skip_to(end)

    def _repair_txn_index(self, state: ProducerStateManager, buf: Any, pos: int,
                          header: BatchHeader, segment_base: int, path: str, *,
                          missing: bool = True) -> None:
        """Before `state` takes in the marker `header` (at `pos` of `buf`; its segment
        starts at `segment_base`): if it is an ABORT ending an open transaction and
        that segment's `.txnindex` lacks its entry, add it (logged when `missing`:
        an entry that should have been there)."""
        producer_id = header.producer_id
        first = state.open_txn_first_offset(producer_id)
        if first < 0 or control_record_type(buf, pos, header, path) != CONTROL_ABORT:
            return
        marker = header.base_offset
        entries = self._txn_indexes.entries(segment_base)
        if any(e.last_offset == marker and e.producer_id == producer_id for e in entries):
            return
        entry = AbortedTxn(producer_id, first, marker,
                           state.stable_after_abort(producer_id, marker))
        if missing:
            log.warning("%s: re-adding the aborted-transaction index entry of the ABORT "
                        "marker at offset %d (producer %d)", self.name, marker,
                        producer_id)
        append_entry(txn_index_path(self.directory, segment_base), entry, sync=True)

    def _index_replicated_marker(self, tail: Tail, data: Any, pos: int,
                                 header: BatchHeader) -> None:
        """A follower about to append its leader's marker `header` (at `pos` of
        `data`) to the active segment of `tail`: an ABORT's `.txnindex` entry first, as
        `append_control` writes it (under the lock)."""
        self._refresh(tail)
        state = self._producer_state(tail, repair=True)
        if header.base_offset >= state.end_offset:
            self._repair_txn_index(state, data, pos, header, tail.active_base_offset,
                                   self.name, missing=False)

    # ---- appends (under the append lock) ---------------------------------------------

    def _append_next_fast(self, appender: Any, batch: Any) -> int:
        """A producer's next batch in one C call (the hot path of an idempotent
        producer): when this process's state says the batch simply follows the
        producer's last one, the C appender appends it only if the log still ends where
        that state does — so nothing was appended since the check, as if it had been
        made under the lock — and the state takes it in. -1, nothing changed, for every
        other case (the locked path decides)."""
        state = self._producers
        head = batch[0] if type(batch) is list and batch else batch
        if state is None or len(head) < RECORDS_OFFSET:
            return -1
        crc, attributes, delta, max_ts, producer_id, epoch, first = _NEXT_FIELDS(
            head, CRC_OFFSET)
        if attributes & ATTR_CONTROL:
            return -1
        with self._thread_lock:
            end = state.end_offset
            if not state.follows(producer_id, epoch, first, attributes):
                return -1
        base = appender.append(batch, end)
        if base >= 0:
            with self._thread_lock:     # unless a reader's catch-up took it in already
                if state is self._producers and state.end_offset == base:
                    state.append_next(producer_id, first, delta, base, attributes, max_ts,
                                      crc)
        return base

    def _append_idempotent(self, batch: Any, header: BatchHeader, size: int,
                           count: int) -> tuple[int, KeptBatch | None]:
        """The append of a producer's batch, under the append lock: (its base offset,
        None), or (the original's base offset, the kept twin) for a duplicate, which
        is not written again (Kafka answers a retry so). Raises what
        `ProducerStateManager.check` raises, with nothing written."""
        tail = self._tail_under_lock()
        self._refresh(tail)
        state = self._producer_state(tail, repair=True)
        twin = state.check(header)
        if twin is not None:
            log.debug("%s: duplicate batch of producer %d (sequences %d..%d) answered "
                      "with its stored offset %d", self.name, header.producer_id,
                      twin.first_sequence, twin.last_sequence, twin.base_offset)
            return twin.base_offset, twin
        base = -1
        if self._fast_segment is not None and type(batch) is bytearray:
            base = self._append_fast(batch)            # -1: it changed nothing
        if base < 0:
            base = self._append_locked(batch, header, size, count, tail)
        state.apply(header, base)
        return base, None

    def _duplicate_ticket(self, twin: KeptBatch, header: BatchHeader) -> Any:
        """For a duplicate whose original still waits for its sync: a ticket to wait on
        (its records are acknowledged once durable, as the original's are), else None."""
        tail = self._tail_file.read_locked()
        if tail is None or twin.last_offset < tail.high_watermark:
            return None
        return SyncTicket(twin.last_offset + 1, tail.segments_version, twin.base_offset,
                          header.crc)

    def append_control(self, producer_id: int, producer_epoch: int, *, commit: bool,
                       coordinator_epoch: int = 0,
                       lock_timeout_s: float | None = LOCK_TIMEOUT_S) -> int:
        """End `producer_id`'s open transaction on this partition with a COMMIT or ABORT
        marker (a control batch; Kafka's WriteTxnMarkers): returns the marker's offset,
        or -1 when the producer has no open transaction here (so a retried end writes
        no second marker). An ABORT also adds the transaction to the active segment's
        `.txnindex`. Raises InvalidProducerEpochError for an epoch below the producer's
        latest. The marker is durable once returned when the flush policy says so."""
        batch = encode_control_batch(producer_id, producer_epoch, commit=commit,
                                     coordinator_epoch=coordinator_epoch,
                                     now_ms=_now_ms())
        header = read_header(batch, 0, len(batch))
        assert header is not None
        with self._locked_tail("append a transaction marker", lock_timeout_s) as tail:
            try:
                marker, deferred = self._append_control_locked(
                    tail, producer_id, producer_epoch, commit, coordinator_epoch, batch,
                    header)
            except OSError as exc:
                raise storage_error(exc, "append a transaction marker",
                                    self.directory) from exc
        if deferred is not None:
            self.wait_synced(deferred)
        elif marker >= 0 and self._doorbell is not None:
            self._doorbell.ring(self._change_slot)
        return marker

    def _append_control_locked(self, tail: Tail, producer_id: int, producer_epoch: int,
                               commit: bool, coordinator_epoch: int, batch: bytearray,
                               header: BatchHeader) -> tuple[int, Any]:
        state = self._producer_state(tail, repair=True)
        entry = state.producers.get(producer_id)
        first = state.open_txn_first_offset(producer_id)
        if entry is None or first < 0:
            return -1, None
        if producer_epoch < entry.epoch:
            raise InvalidProducerEpochError(
                f"transaction marker of producer {producer_id} with epoch "
                f"{producer_epoch}, older than the partition's latest {entry.epoch}")
        size = header.size
        if self._must_roll(tail, size, 1, _now_ms()):   # the marker's segment, known
            tail = self._roll(tail)                      # before its index entry
        marker = tail.log_end_offset
        if not commit:
            # the entry first, synced: a marker is never published without it (a stale
            # entry, its marker never published, is told apart by the reader)
            self._drop_stale_txn_entries(tail)
            append_entry(txn_index_path(self.directory, tail.active_base_offset),
                         AbortedTxn(producer_id, first, marker,
                                    state.stable_after_abort(producer_id, marker)),
                         sync=True)
        base = self._append_locked(batch, header, size, 1, tail)
        assert base == marker
        state.apply(header, base)
        state.set_coordinator_epoch(producer_id, coordinator_epoch)
        deferred, self._deferred = self._deferred, None
        if deferred is not None:
            return marker, SyncTicket(deferred[0], deferred[1], marker, header.crc)
        return marker, None

    def _drop_stale_txn_entries(self, tail: Tail) -> None:
        """Cut the active `.txnindex` entries whose marker was never published (a writer
        killed between the entry and the marker): those at or past the log end."""
        base = tail.active_base_offset
        entries = self._txn_indexes.entries(base)
        keep = len(entries)
        while keep and entries[keep - 1].last_offset >= tail.log_end_offset:
            keep -= 1
        if keep < len(entries):
            log.warning("%s: dropping %d aborted-transaction index entries whose marker "
                        "was never written", self.name, len(entries) - keep)
            truncate_entries(txn_index_path(self.directory, base), keep)

    def _after_roll(self, tail: Tail) -> None:
        """At a roll (under the lock): Kafka's producer snapshot at the new segment's
        base, and the `.txnindex` files of segments retention has removed go."""
        self._snapshot_producer_state(tail, sync=True)
        if self._txn_index_bases():
            first = self._bases[0] if self._bases else tail.log_start_offset
            try:
                for base in self._txn_index_bases():
                    if base < first:
                        os.unlink(txn_index_path(self.directory, base))
            except OSError as exc:        # derived data, below the log start: harmless
                log.warning("%s: could not remove an old .txnindex: %s", self.name, exc)

    def _txn_index_bases(self) -> list[int]:
        return [int(name[:20]) for name in os.listdir(self.directory)
                if name.endswith(TXN_INDEX_SUFFIX) and name[:20].isdigit()]

    def _snapshot_producer_state(self, tail: Tail, *, sync: bool) -> None:
        """Write this process's producer state as a snapshot at the log end (at a roll
        and a clean close, under the lock), when this process has it loaded and it
        names a producer, or an older snapshot would otherwise stand for it: a topic no
        idempotent producer ever wrote keeps Kafka's three files per segment."""
        state = self._producers
        if state is None:
            return
        try:
            state.expire(_now_ms())
            if state.producers or snapshot_offsets(self.directory):
                write_snapshot(self.directory, self._producer_state(tail, repair=True),
                               sync=sync)
        except OSError as exc:           # derived data: the log rebuilds it
            log.warning("%s: could not write a producer snapshot: %s", self.name, exc)

    def _after_recovery(self, tail: Tail) -> None:
        """After recovery cut or re-checked the log (under the lock): drop snapshots and
        `.txnindex` entries past the log end, and rebuild the producer state from a
        snapshot at or below the segment recovery scanned first (as Kafka's recovery
        rebuilds the `.txnindex` of the segments it scans), re-adding the index entries
        missing for the ABORT markers it replays — when a snapshot or a `.txnindex`
        says producers wrote here (a producer's writes leave a snapshot at the next roll
        or clean close, an abort its index entry before its marker)."""
        end = tail.log_end_offset
        snapshots = snapshot_offsets(self.directory)
        delete_snapshots(self.directory, [o for o in snapshots if o > end])
        indexed = self._txn_index_bases()
        self._txn_indexes.forget()
        for base in indexed:
            entries = self._txn_indexes.entries(base)
            keep = sum(1 for e in entries if e.last_offset < end)
            if keep < len(entries):
                truncate_entries(txn_index_path(self.directory, base), keep)
        self._txn_indexes.forget()
        self._txn_markers_seen.clear()
        self._producers = None
        if not snapshots and not indexed:
            return      # no producer ever wrote here (or none left a trace): load lazily
        bases = self._bases
        scanned = bases[max(0, bisect.bisect_right(bases, tail.recovery_point) - 1)] \
            if bases else 0
        self._load_producer_state(tail, repair=True, replay_from=scanned)

    # ---- the last stable offset and aborted transactions ----------------------------

    @property
    def last_stable_offset(self) -> int:
        """The first offset of the oldest open transaction, else the high watermark
        (Kafka's LSO): read_committed reads stop here."""
        return self._with_tail(self._last_stable)

    def _last_stable(self, tail: Tail) -> int:
        self._refresh(tail)
        first = self._producer_state(tail).first_unstable_offset()
        hw = tail.high_watermark
        return hw if first is None or first > hw else first

    def open_transactions(self) -> dict[int, int]:
        """Producer id -> first offset of its open transaction on this partition."""
        return self._with_tail(self._open_transactions)

    def _open_transactions(self, tail: Tail) -> dict[int, int]:
        self._refresh(tail)
        return dict(self._producer_state(tail).ongoing)

    def producer_states(self) -> list[tuple[int, int, int, int]]:
        """(producer id, epoch, last sequence, open transaction's first offset or -1)
        of every producer this partition knows (Kafka's DescribeProducers)."""
        return self._with_tail(self._producer_states)

    def _producer_states(self, tail: Tail) -> list[tuple[int, int, int, int]]:
        self._refresh(tail)
        return list(self._producer_state(tail).describe())

    def active_producers(self) -> list[ActiveProducer]:
        """Every producer this partition knows, with all of DescribeProducers' fields
        (last timestamp and coordinator epoch too), by producer id."""
        return self._with_tail(self._active_producers)

    def _active_producers(self, tail: Tail) -> list[ActiveProducer]:
        self._refresh(tail)
        return sorted(self._producer_state(tail).describe_active())

    def aborted_transactions(self, start_offset: int, end_offset: int
                             ) -> list[tuple[int, int]]:
        """(producer id, first offset) of the aborted transactions overlapping
        [start_offset, end_offset) (Kafka's collectAbortedTransactions, for a Fetch
        response), oldest marker first."""
        return self._with_tail(self._aborted, start_offset, end_offset)

    def _aborted(self, tail: Tail, start_offset: int, end_offset: int
                 ) -> list[tuple[int, int]]:
        return [(e.producer_id, e.first_offset)
                for e in self._aborted_entries(tail, start_offset, end_offset)]

    def _aborted_entries(self, tail: Tail, start_offset: int, end_offset: int
                         ) -> list[AbortedTxn]:
        self._refresh(tail)
        start_offset = max(start_offset, tail.log_start_offset)
        if start_offset >= end_offset:
            return []
        found = self._txn_indexes.collect(self._bases, start_offset, end_offset)
        return [e for e in found if self._marker_published(tail, e)]

    def _marker_published(self, tail: Tail, entry: AbortedTxn) -> bool:
        """Whether the entry's ABORT marker is in the log (its writer may have died
        between the two): the batch at lastOffset is a control batch of that producer.
        Remembered per entry once below the log end."""
        key = (entry.producer_id, entry.last_offset)
        known = self._txn_markers_seen.get(key)
        if known is not None:
            return known
        if entry.last_offset >= tail.log_end_offset:
            return False                        # not yet (or never): ask again later
        found = False
        if entry.last_offset >= tail.log_start_offset:
            i = self._first_segment(entry.last_offset, tail.log_end_offset)
            segment, size = self._sized(self._bases[i], tail)
            pos = segment.find(entry.last_offset, size)
            header = read_header(segment.view(size), pos, size, segment.path)
            found = (header is not None and header.base_offset == entry.last_offset
                     and header.attributes & ATTR_CONTROL != 0
                     and header.producer_id == entry.producer_id)
        self._txn_markers_seen[key] = found
        return found

    # ---- read_committed --------------------------------------------------------------

    def _committed_end(self, tail: Tail, stop_offset: int | None) -> int:
        lso = self._last_stable(tail)
        return lso if stop_offset is None else min(stop_offset, lso)

    def _read_committed(self, tail: Tail, offset: int, max_records: int, max_bytes: int,
                        stop_offset: int | None) -> tuple[list[Record], int]:
        """read() with isolation read_committed: records below the LSO (and
        `stop_offset`), without those of aborted transactions; also the offset to read
        next. Reads on past batches that were all aborted, a bounded number of times."""
        end = self._committed_end(tail, stop_offset)
        self._check_in_range(offset, tail, tail.high_watermark)
        out: list[Record] = []
        for _ in range(READ_COMMITTED_ROUNDS):
            if offset >= end:
                break
            records = self._read(tail, offset, max_records, max_bytes, end)
            if not records:
                offset = end        # nothing but markers (or compacted gaps) below end
                break
            next_offset = records[-1].offset + 1
            aborted = self._aborted_entries(tail, offset, next_offset)
            if aborted:
                records = self._drop_aborted(tail, records, aborted, offset, next_offset)
            out = records
            offset = next_offset
            if out:
                break
        return out, offset

    def _drop_aborted(self, tail: Tail, records: list[Record], aborted: list[AbortedTxn],
                      start: int, end: int) -> list[Record]:
        """`records` (offsets in [start, end), in order) without those of aborted
        transactions, decided per batch as Kafka's fetcher decides: a transactional
        batch is aborted when its base offset lies in one of its producer's aborted
        transactions [first offset, marker]. Only the batches inside those
        transactions' offset ranges are walked, with a cursor per producer; then the
        records are cut around the aborted runs by bisection: linear in the batches
        walked, no record looked at one by one."""
        by_producer: dict[int, list[AbortedTxn]] = {}
        for entry in aborted:
            by_producer.setdefault(entry.producer_id, []).append(entry)
        # A producer's transactions follow one another: its entries, in marker order,
        # are disjoint and in offset order, and its batches come in offset order.
        cursors = dict.fromkeys(by_producer, 0)
        runs: list[list[int]] = []       # [first, last] offsets, adjacent batches merged
        for header in self._batches_within(tail, _spans(aborted, start, end), end):
            producer_id = header.producer_id
            entries = by_producer.get(producer_id)
            if entries is None or not header.attributes & ATTR_TRANSACTIONAL:
                continue
            base = header.base_offset
            k = cursors[producer_id]
            while k < len(entries) and entries[k].last_offset < base:
                k += 1
            cursors[producer_id] = k
            if k < len(entries) and entries[k].first_offset <= base:
                if runs and runs[-1][1] + 1 == base:
                    runs[-1][1] = header.last_offset
                else:
                    runs.append([base, header.last_offset])
        if not runs:
            return records
        kept: list[Record] = []
        n = 0
        for first, last in runs:
            cut = bisect.bisect_left(records, first, n, key=_record_offset)
            kept += records[n:cut]
            n = bisect.bisect_right(records, last, cut, key=_record_offset)
        kept += records[n:]
        return kept

    def _batches_within(self, tail: Tail, spans: list[tuple[int, int]], end: int
                        ) -> Iterator[BatchHeader]:
        """Headers of the producers' batches holding an offset of `spans` (disjoint
        [lo, hi] offset ranges below `end`, in order), each once, in offset order: from
        the batch holding `lo` (which may begin before it) to the last one beginning at
        or before `hi`."""
        bases = self._bases
        walked = -1                      # the offset after the last batch yielded
        for lo, hi in spans:
            lo = max(lo, walked)
            if lo > hi:
                continue
            i = self._first_segment(lo, end)
            position = -1                # the first segment from `lo`, the next whole
            while i < len(bases) and bases[i] <= hi:
                segment, size = self._sized(bases[i], tail)
                if position < 0:
                    position = segment.find(lo, size)
                for _, header in _producer_batches(segment.view(size), position, size,
                                                   hi + 1, segment.path):
                    walked = header.last_offset + 1
                    yield header
                position = 0
                i += 1


def _spans(aborted: list[AbortedTxn], start: int, end: int) -> list[tuple[int, int]]:
    """The offsets of [start, end) inside aborted transactions, [first offset, marker]
    clipped to the range, as disjoint [lo, hi] ranges in order (the transactions of
    different producers overlap)."""
    spans: list[tuple[int, int]] = []
    for lo, hi in sorted((max(e.first_offset, start), min(e.last_offset, end - 1))
                         for e in aborted):
        if lo > hi:
            continue
        if spans and lo <= spans[-1][1] + 1:
            if hi > spans[-1][1]:
                spans[-1] = (spans[-1][0], hi)
        else:
            spans.append((lo, hi))
    return spans
