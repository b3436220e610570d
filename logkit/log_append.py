"""Appends to one partition log, in three tiers, and rolls.

Owns: `append_batch` / `append_batch_nowait` / `append_records` / `append_replicated`:
checking a batch (framing, CRC and records when verified; `max.message.bytes`; codecs
the topic recompresses), stamping its base offset and leader epoch under the append
lock, writing it at the committed end and publishing the new tail; the three tiers of
that path (the whole uncontended append in one C call, `_arm`; the common case under
the lock in one C call, `_append_fast`; the Python append that decides rolls, syncs and
index reservations, `_append_locked`); cutting back a failed write; and rolling a
segment by size, index room, age (`segment.ms`) or offset span (`_must_roll`, which the
C path restates: tests/storage/test_c_layouts.py compares the two). Invariant: a batch is
readable only once whole and published; a killed appender leaves at most unpublished
bytes past the committed end, which the next lock holder cuts.

A mixin of `PartitionLog` (log.py), which owns the state it reads and writes.
"""

from __future__ import annotations

import logging
import os
import struct
from typing import Any, Container, Mapping

from ._clock import now_ms as _now_ms
from ._native import appendpath
from .compression import CODEC_NAMES, TOPIC_COMPRESSION_TYPE
from .config import is_compacted
from .errors import (
    CorruptRecordError,
    InvalidRecordError,
    RecordTooLargeError,
    UnsupportedCompressionTypeError,
    storage_error,
)
from .group_commit import SyncTicket
from .notify import change_offset
from .partition_lock import LOCK_TIMEOUT_S
from .records import (
    ATTR_CONTROL,
    PRODUCER_ID_OFFSET,
    RECORDS_OFFSET,
    BatchHeader,
    decode_batch,
    encode_batch,
    iter_batches,
    read_header,
    stamp_base_offset,
    stamp_log_append_time,
    validate_batch,
)
from .segment import LogSegment, parse_segment_name, unlink_segment
from .tail import BOOT_ID, Tail

log = logging.getLogger("logkit.log")

# The common append under the lock in one C call (logkit/_appendpath.c, `_append_fast`).
_append_common = None if appendpath is None else appendpath.append_common
# ... and the whole uncontended append, locks and doorbell included (`_arm`).
_Appender = None if appendpath is None else appendpath.Appender

_producer_id_at = struct.Struct(">q").unpack_from


def _names_producer(batch: Any) -> bool:
    """Whether a batch names a producer id (an idempotent or transactional producer's:
    checked against the producer state, log_txn.py, before any append). A batch too
    short to tell goes the checked way too."""
    head = batch[0] if type(batch) is list and batch else batch
    return len(head) < RECORDS_OFFSET or _producer_id_at(head, PRODUCER_ID_OFFSET)[0] >= 0


def _roll_ms(config: Mapping[str, Any]) -> int:
    """The age at which the active segment rolls: segment.ms, or for a compacted topic
    max.compaction.lag.ms when smaller, so no record waits in the active segment (which
    the cleaner never touches) longer than its compaction lag allows (Kafka's
    LogConfig.maxSegmentMs, KIP-354)."""
    if is_compacted(config):
        return min(config["segment.ms"], config["max.compaction.lag.ms"])
    return config["segment.ms"]


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


class _LogAppends:
    """The appends and rolls of `PartitionLog` (see the module docstring)."""

    def append_records(self, records: list[tuple], *, codec: int = 0, **batch_fields: Any) -> int:
        """Encode records as one batch and append it; returns its base offset. A record
        without a key is refused on a compacted topic (InvalidRecordError)."""
        if is_compacted(self.config) and any(record[0] is None for record in records):
            raise self._keyless_refused()
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
            # a producer's next batch too, once checked (log_txn.py); -1: it changed
            # nothing, and the append below decides.
            try:
                base_offset = appender.append(batch) if not _names_producer(batch) \
                    else self._append_next_fast(appender, batch)
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
            if is_compacted(config) and not header.attributes & ATTR_CONTROL:
                self._refuse_keyless(batch, header)
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
                if header.producer_id >= 0:      # duplicates, sequences, epochs: log_txn.py
                    base_offset, twin = self._append_idempotent(batch, header, size, count)
                    if twin is not None:
                        return base_offset, self._duplicate_ticket(twin, header)
                elif self._fast_segment is not None and type(batch) is bytearray:
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
        """The common append in one C call (`appendpath.append_common`, the twin of
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
                _roll_ms(config), config["index.interval.bytes"],
                config["flush.messages"])
        except OSError:
            tail = self._tail_file.read_locked()       # unchanged: nothing was published
            if tail is not None:
                self._cut_back(segment, tail.active_size)
            raise

    def _arm(self, segment: LogSegment | None) -> None:
        """Set the segment the next append may take in one C call (None: none). The
        C appender (appendpath.Appender) takes the locks without waiting, appends as
        `_append_fast` does, releases and rings, or changes nothing and hands the
        append back. It is made here, after a general append, with the handles and
        index reservations of that moment, and dropped with the segment. A topic that
        rewrites batches (LogAppendTime) gets none, nor one whose every append syncs
        (flush.messages=1: each would be handed back). A config change drops it
        (`PartitionLog.apply_config`), and the next general append makes it again."""
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
            config["segment.bytes"], _roll_ms(config), config["index.interval.bytes"],
            config["flush.messages"], config["max.message.bytes"],
            -1 if codec == "producer" else CODEC_NAMES[codec], doorbell,
            change_offset(self._change_slot), self._cut_back_fast, self._funlock)
        if self.config is not config:       # replaced meanwhile (`apply_config`)
            self._appender = None

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
            tail.leader_epoch, tail.deleted, tail.cleaned_offset, tail.clean_count)
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

    def cut_unpublished(self) -> int:
        """Cut, under the append lock, what a dead writer left past the committed end:
        bytes past the active segment's committed size (its write landed, its publish
        did not) and the files of a segment a killed roll made but never named. Never
        acknowledged, never readable; with the lock held no append or roll is in
        flight, so they are garbage. The next append or roll would overwrite or remove
        them, but until then the directory would hold more than the log (a replica's
        files not a prefix of its leader's; Kafka's tools, which read files whole,
        would see batches the log never had). Returns how many log bytes went."""
        with self._locked_tail("cut unpublished bytes") as tail:
            segment = self._segment(tail.active_base_offset)
            cut = max(0, segment.file_size() - tail.active_size)
            self._cut_unpublished(segment, tail)
            for name in os.listdir(self.directory):    # a dead roller's, never named
                base = parse_segment_name(name)
                if base is not None and base > tail.active_base_offset:
                    log.warning("%s: removing segment %d: a roll killed before it "
                                "published the segment made its files", self.name, base)
                    cut += unlink_segment(self.directory, base)
            return cut

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
                or now - tail.roll_time_ms > _roll_ms(config)
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
        self._after_roll(tail)      # the producer snapshot, old .txnindex files (log_txn.py)
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

    def _refuse_keyless(self, batch: Any, header: BatchHeader) -> None:
        """The verified append's check of a batch for a compacted topic: any record
        without a key refuses it whole (`_keyless_refused`)."""
        if any(record.key is None for record in decode_batch(
                batch, 0, header, self.topic, self.partition, verify=False)):
            raise self._keyless_refused()

    def _keyless_refused(self) -> InvalidRecordError:
        """The refusal of a record without a key on this compacted topic: a compacted
        topic keeps the latest record of each key, so a record without one has no place
        in it (Kafka's LogValidator refuses it the same way)."""
        return InvalidRecordError(
            f"topic {self.topic!r} is compacted (cleanup.policy="
            f"{self.config['cleanup.policy']}): every record needs a key",
            path=self.directory, position=0)

    def append_replicated(self, data: Any, *, segment_bases: Container[int] = (),
                          lock_timeout_s: float | None = LOCK_TIMEOUT_S) -> int:
        """Append whole batches as a leader stored them (a follower's append): base
        offsets and partitionLeaderEpoch kept, nothing rewritten, and a new segment
        started before each batch whose base offset is in `segment_bases` (where the
        leader started one), so the segment files come out byte-identical to the
        leader's. Every batch is checked before any is written — whole, CRC-valid, the
        first starting at the log end, the rest contiguous (in a compacted log: at or
        past it, the offsets between removed by the leader's cleaner, each batch
        keeping its base offset, and a segment started at a leader's segment base the
        log end reaches even when that segment's first batch is gone) — else
        CorruptRecordError and nothing is written. The tail's leader epoch follows the
        batches. Returns the new log end offset."""
        size = len(data)
        with self._locked_tail("replicate", lock_timeout_s) as tail:
            batches = list(iter_batches(data, 0, size, f"batches shipped to {self.name}",
                                        first_offset=tail.log_end_offset, verify=True,
                                        gaps=self._gaps))
            # the leader's transaction markers: an ABORT's .txnindex entry goes first, as
            # the leader wrote it (log_txn.py)
            markers = any(h.attributes & ATTR_CONTROL and h.producer_id >= 0
                          for _, h in batches)
            try:
                for pos, header in batches:
                    if tail.active_size and (header.base_offset in segment_bases
                                             or tail.log_end_offset in segment_bases):
                        tail = self._roll(tail)     # a replica rolls where its leader did
                    if markers and header.attributes & ATTR_CONTROL:
                        self._index_replicated_marker(tail, data, pos, header)
                    # the batch's own base offset: past the log end after a gap
                    self._append_locked(bytearray(data[pos:pos + header.size]), header,
                                        header.size, header.last_offset_delta + 1,
                                        tail._replace(leader_epoch=header.leader_epoch,
                                                      log_end_offset=header.base_offset),
                                        shipped_roll=False)
                    tail = self._tail_under_lock()
            except OSError as exc:
                raise storage_error(exc, "replicate", self.directory) from exc
        if batches and self._doorbell is not None:
            self._doorbell.ring(self._change_slot)
        return tail.log_end_offset

    def _recompress(self, batch: bytearray, header: BatchHeader) -> bytearray:
        """Re-encode with the topic's compression.type (Kafka's broker-side override)."""
        records = decode_batch(batch, 0, header, self.topic, self.partition, verify=False)
        from .compression import codec_id
        codec = codec_id(self.config["compression.type"])
        return encode_batch([(r.key, r.value, r.headers, r.timestamp) for r in records],
                            codec=codec, producer_id=header.producer_id,
                            producer_epoch=header.producer_epoch,
                            base_sequence=header.base_sequence)
