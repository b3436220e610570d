"""Topics and partitions as users see them.

Owns: topic name validation (Kafka's rule), the `Topic` handle (its partitions, its
resolved config, Kafka's keyed partitioner) and the public `Partition` handle over one
`PartitionLog`. Invariant: a name that passes `validate_topic_name` cannot reach outside
the broker root: it has no path separator and is neither '.' nor '..'.

`Partition` is the one seam between the storage and everything above it (docs/design.md §6,
§13): clients, the broker's chores, the CLI, Spark, and later replication and the
protocol listener call its public methods and never touch the `PartitionLog` behind it;
only this module does (`Partition._log`).
"""

from __future__ import annotations

import logging
import re
import threading
import weakref
from typing import Any, Callable, Iterable, Mapping, NamedTuple, Sequence

from .cleaner import CleanReport
from .columns import Columns
from .compression import codec_id, require
from .errors import InvalidTopicError, UnknownTopicError
from .log import (BATCHES_SINCE_MAX_BYTES, LOCK_TIMEOUT_S, MAX_FETCH_BYTES, PartitionLog,
                  RecoveryReport)
from .log_read import Fetched
from .murmur2 import partition_for_key
from .producer_state import ActiveProducer
from .records import BatchHeader, Record

__all__ = ["Topic", "Partition", "TopicPartition", "validate_topic_name",
           "MAX_PARTITIONS"]

log = logging.getLogger(__name__)

_LEGAL = re.compile(r"[a-zA-Z0-9._-]{1,249}")
MAX_PARTITIONS = 10000
_NO_STOP = (1 << 63) - 1            # read_columns without stop_offset: the high watermark


class TopicPartition(NamedTuple):
    topic: str
    partition: int


def validate_topic_name(name: Any) -> str:
    if not isinstance(name, str) or not _LEGAL.fullmatch(name) or name in (".", ".."):
        raise InvalidTopicError(
            f"invalid topic name {name!r}: use 1-249 characters from [a-zA-Z0-9._-], "
            "not '.' or '..'")
    return name


class Partition:
    """One partition of a topic: offsets, reads, time lookups, raw batch appends and
    the chores the broker runs on it. The only way above the storage into a partition.

    Offsets are logical record numbers; reads return only records below
    `high_watermark`. Any thread may call any method; several processes may have the
    same partition open (appends are serialised by the partition's file lock).

    Its log is opened on first use (a topic of thousands of partitions costs no
    descriptor for the ones a process never touches); `_opener` makes it."""

    #: True for a partition of a topic with followers (replication factor above 1):
    #: such a handle also has `in_sync_replicas()` and `replication_factor`, reads stop
    #: at the high watermark the ISR allows, and acks="all" waits for the ISR. The
    #: clients ask this, never `hasattr` (docs/design.md §5).
    replicated: bool = False

    def __init__(self, topic: str, partition: int,
                 opener: Callable[[int], PartitionLog],
                 log: PartitionLog | None = None) -> None:
        self.topic = topic
        self.partition = partition
        self._opener = opener
        if log is not None:
            self._log = log

    def __getattr__(self, name: str) -> Any:
        # Called only while `_log` is not yet set: open the log once, then the
        # attribute is an ordinary one and costs nothing more.
        if name != "_log":
            raise AttributeError(name)
        partition_log = self._opener(self.partition)
        self._log = partition_log
        return partition_log

    @property
    def opened(self) -> bool:
        """Whether this process has opened the partition's files yet."""
        return "_log" in self.__dict__

    def __repr__(self) -> str:
        return f"Partition({self.topic!r}, {self.partition})"

    # ---- offsets and facts ----------------------------------------------------------

    @property
    def topic_partition(self) -> TopicPartition:
        return TopicPartition(self.topic, self.partition)

    @property
    def log_start_offset(self) -> int:
        """The first offset still stored (retention moves it up)."""
        return self._log.log_start_offset

    @property
    def log_end_offset(self) -> int:
        """The offset the next appended record gets."""
        return self._log.log_end_offset

    @property
    def high_watermark(self) -> int:
        """Reads return only records below this offset."""
        return self._log.high_watermark

    @property
    def directory(self) -> str:
        """The partition's directory, `<root>/<topic>-<partition>`."""
        return self._log.directory

    @property
    def config(self) -> Mapping[str, Any]:
        """The topic's resolved config (Kafka names, defaults filled in); read only."""
        return self._log.config

    @property
    def last_recovery(self) -> RecoveryReport | None:
        """What recovery checked and cut when this process opened the partition; None
        when the partition was closed cleanly and no recovery ran."""
        return self._log.last_recovery

    def size_bytes(self) -> int:
        """Bytes of the partition's segment files."""
        return self._log.size_bytes()

    # ---- reads ----------------------------------------------------------------------

    def read(self, offset: int, max_records: int = 500, *,
             max_bytes: int = MAX_FETCH_BYTES,
             stop_offset: int | None = None,
             isolation_level: str = "read_uncommitted") -> list[Record]:
        """Records from `offset` (inclusive) below the high watermark and below
        `stop_offset` when given.

        At most `max_records`; about `max_bytes` of stored batches, but always the
        records of at least one batch when any are available. Returns [] at the end.
        `isolation_level="read_committed"` stops at the last stable offset and leaves
        out aborted transactions' records; control batches are never returned.
        Raises OffsetOutOfRangeError outside [log_start_offset, high_watermark],
        ValueError for an unknown isolation level and CorruptRecordError (path,
        position) on a batch whose bytes do not check out."""
        return self._log.read(offset, max_records=max_records, max_bytes=max_bytes,
                              stop_offset=stop_offset, isolation_level=isolation_level)

    def fetch_records(self, offset: int, max_records: int = 500, *,
                      max_bytes: int = MAX_FETCH_BYTES, stop_offset: int | None = None,
                      isolation_level: str = "read_uncommitted") -> Fetched:
        """`read()` plus where the next read starts: `Fetched(records, next_offset,
        high_watermark, last_stable_offset)`. `next_offset` moves past offsets that hold
        no record for the caller (a compacted log's removed records, transaction
        markers, aborted records), so a reader that takes it as its position never
        stalls below the high watermark."""
        return self._log.fetch_records(offset, max_records=max_records, max_bytes=max_bytes,
                                       stop_offset=stop_offset,
                                       isolation_level=isolation_level)

    # ---- compaction ------------------------------------------------------------------

    def compact(self, now_ms: int | None = None, *, block: bool = True
                ) -> CleanReport | None:
        """One cleaning pass of this partition now (Kafka's compaction: the latest
        record of every key survives, offsets never change; ignores
        min.cleanable.dirty.ratio, honours the lag settings; docs/storage.md). Returns
        a `CleanReport` (records_before, records_after, bytes_before, bytes_after, ...);
        None only with block=False while another thread or process cleans it.
        ConfigError unless the topic's cleanup.policy includes compact."""
        return self._log.compact(now_ms, block=block)

    def roll(self) -> None:
        """Close the active segment (a new one starts at the next append); a no-op when
        it is empty. The active segment is never compacted."""
        self._log.roll()

    @property
    def first_dirty_offset(self) -> int:
        """The cleaner checkpoint: offsets below it were compacted (0: never)."""
        return self._log.first_dirty_offset

    def cleanable_bytes(self, now_ms: int) -> tuple[int, int, int]:
        """(dirty bytes, cleanable bytes, oldest dirty segment's newest timestamp):
        what makes the background cleaner take this partition."""
        return self._log.cleanable_bytes(now_ms)

    @property
    def clean_count(self) -> int:
        """Cleaning passes (or installs of a leader's cleaned segment) that swapped
        segments in: a follower copies its leader's cleaning when this moves."""
        return self._log.clean_count

    def install_segment(self, base: int, end: int, data: bytes) -> bool:
        """Replace the sealed segments holding offsets [base, end) with a leader's
        cleaned segment, `data` its whole batches (a follower's copy of the leader's
        cleaning; the swap a pass uses, kill-safe). False when the segments do not
        line up; CorruptRecordError when `data` does not make that segment."""
        return self._log.install_segment(base, end, data)

    def fetch(self, offset: int, max_records: int = 500, *,
              max_bytes: int = MAX_FETCH_BYTES,
              isolation_level: str = "read_uncommitted") -> tuple[list[Record], int]:
        """`read(offset, max_records, max_bytes=max_bytes)` and the high watermark that
        read stopped at, from one look at the partition's end (as a Kafka fetch
        response carries the partition's high watermark): `(records, high_watermark)`.
        A reader whose next offset equals it has read everything there was; raises
        like read(). With read_committed: the records and the last stable offset."""
        return self._log.fetch(offset, max_records=max_records, max_bytes=max_bytes,
                               isolation_level=isolation_level)

    # ---- idempotence and transactions (docs/design.md §15; logkit/log_txn.py) -------

    @property
    def last_stable_offset(self) -> int:
        """The first offset of the oldest open transaction, else the high watermark."""
        return self._log.last_stable_offset

    def open_transactions(self) -> dict[int, int]:
        """Producer id -> first offset of its open transaction on this partition."""
        return self._log.open_transactions()

    def aborted_transactions(self, start_offset: int, end_offset: int
                             ) -> list[tuple[int, int]]:
        """(producer id, first offset) of the aborted transactions overlapping
        [start_offset, end_offset), from the `.txnindex` files (a Fetch response's)."""
        return self._log.aborted_transactions(start_offset, end_offset)

    def producer_states(self) -> list[tuple[int, int, int, int]]:
        """(producer id, epoch, last sequence, open transaction's first offset or -1)
        per producer this partition knows (DescribeProducers)."""
        return self._log.producer_states()

    def active_producers(self) -> list[ActiveProducer]:
        """Every producer this partition knows, as Kafka's DescribeProducers reports
        it: `ActiveProducer(producer_id, producer_epoch, last_sequence, last_timestamp,
        coordinator_epoch, current_txn_start_offset)`, -1 where there is none, by
        producer id."""
        return self._log.active_producers()

    def append_control(self, producer_id: int, producer_epoch: int, *, commit: bool,
                       coordinator_epoch: int = 0) -> int:
        """End the producer's open transaction here with a COMMIT or ABORT marker; the
        marker's offset, or -1 when it has none open here. Raises
        InvalidProducerEpochError for an epoch below the producer's latest, ReadOnlyError,
        StorageError, LogkitTimeoutError like an append."""
        return self._log.append_control(producer_id, producer_epoch, commit=commit,
                                        coordinator_epoch=coordinator_epoch)

    def read_columns(self, offset: int, max_records: int = 500, *,
                     stop_offset: int | None = None) -> tuple[Columns, int]:
        """Records from `offset` (below the high watermark and `stop_offset`) decoded
        into column buffers instead of Record tuples, for readers that build columnar
        data (Spark's Arrow batches): returns `(columns, next_offset)`.

        `columns` is a `logkit.Columns` holding about `max_records` records (at least
        one batch's when any are available; control batches add none); `next_offset`
        is where the next call goes on, and equals the stop (or the high watermark) when
        the range is done. Raises like read()."""
        columns = Columns()
        next_offset = self._log.read_columns(
            offset, columns, max_records=max_records,
            stop_offset=_NO_STOP if stop_offset is None else stop_offset)
        return columns, next_offset

    def offset_for_timestamp(self, ts_ms: int) -> int | None:
        """The earliest offset whose timestamp is >= ts_ms; None if there is none."""
        return self._log.offset_for_timestamp(ts_ms)

    def batches_since(self, offset: int, upto: int | None = None, *,
                      max_bytes: int = BATCHES_SINCE_MAX_BYTES) -> bytes:
        """The stored bytes of whole batches, byte-identical to the segment files,
        from the batch holding `offset` up to the high watermark, or up to `upto` (at
        most the log end; a replica fetch passes `upto=p.log_end_offset`).

        Stops before the first batch whose base offset reaches the limit and after
        about `max_bytes` (always at least one whole batch); `b""` at the limit. Raises
        OffsetOutOfRangeError below the log start or above the log end."""
        return self._log.batches_since(offset, upto, max_bytes=max_bytes)

    def batch_file_ranges(self, offset: int, upto: int | None = None, *,
                          max_bytes: int = BATCHES_SINCE_MAX_BYTES
                          ) -> list[tuple[str, int, int]]:
        """Where `batches_since(offset, upto, max_bytes=)` would read its bytes:
        `(segment file path, position, length)` per segment, in order, each a run of
        whole batches below the segment's committed size, so a replication server can
        send them with `os.sendfile`. A caller that opens a path later checks the file
        still holds its range: retention renames a segment `.deleted` before removing
        it, and a truncation replaces it by a shorter copy (bytes are never changed in
        place). `[]` at the limit; OffsetOutOfRangeError as batches_since."""
        return self._log.batch_file_ranges(offset, upto, max_bytes=max_bytes)

    def batch_headers(self, start_offset: int) -> list[BatchHeader]:
        """The headers of the stored batches whose last offset is >= start_offset, in
        offset order, CRCs not checked: for finding a producer's batches (its id,
        epoch and base sequence) after a crash, without decoding records."""
        return self._log.batch_headers(start_offset)

    # ---- writes ---------------------------------------------------------------------

    def append(self, records: Iterable[Sequence[Any]], *,
               compression_type: str | None = None) -> int:
        """Append (key, value, headers, timestamp_ms) tuples as one batch, atomically;
        returns the first offset. For bulk loaders; applications use the producer."""
        rows = [tuple(r) for r in records]
        if not rows:
            raise ValueError("append needs at least one record")
        codec = codec_id(compression_type)
        require(codec)
        return self._log.append_records(rows, codec=codec)

    def append_batch(self, batch: bytes | bytearray, *, verify: bool = True,
                     lock_timeout_s: float | None = None) -> int:
        """Append one encoded Kafka record batch (magic 2) atomically; returns its base
        offset.

        The length field must match the bytes, and the batch must pass the checks
        Kafka's broker makes of a client's (CRC-32C; recordsCount and lastOffsetDelta
        agreeing with the records; each record framed right; a codec Kafka defines,
        whose section inflates; timestamps that can be), else CorruptRecordError — its
        subclass InvalidRecordError for contents that lie, UnsupportedCompressionTypeError
        for codecs 5-7 — and nothing is written; `verify=False` skips those checks but
        the codec's, for bytes this process's own encoder has just made (the producer
        does). Only baseOffset and partitionLeaderEpoch are stamped (a bytearray is
        stamped in place); the rest is stored as given, unless the topic's `compression.type`
        or `message.timestamp.type=LogAppendTime` asks for a rewrite, as Kafka's leader
        does. Raises RecordTooLargeError above `max.message.bytes`, LogkitTimeoutError
        when the append lock is not free within `lock_timeout_s` (None: the log's
        default bound), StorageError when a write fails (nothing stored). `batch` may
        also be a list of buffers that together hold one batch, as for
        `append_batch_nowait`.

        A batch with a producer id is checked against the partition's producer state
        (docs/design.md §15): a duplicate of one of that producer's last five batches
        is not stored again and its original base offset is returned; a sequence gap
        raises OutOfOrderSequenceError, an epoch below the producer's latest
        InvalidProducerEpochError, a plain batch inside its open transaction
        InvalidTxnStateError — nothing stored."""
        if not isinstance(batch, (bytearray, list)):
            batch = bytearray(batch)
        if lock_timeout_s is None:
            return self._log.append_batch(batch, verify=verify)
        return self._log.append_batch(batch, verify=verify, lock_timeout_s=lock_timeout_s)

    def append_batch_nowait(self, batch: bytearray, *, verify: bool = True,
                            lock_timeout_s: float | None = None) -> tuple[int, Any]:
        """`append_batch` that does not wait for the sync `flush.messages` asks for:
        (base offset, None), or (base offset, ticket) when the batch is readable and
        acknowledged only once `wait_synced(ticket)` returns (group commit: the producer
        appends on while a sync runs; docs/storage.md). `batch` may be a list of
        buffers that together hold one batch, the whole header in the first, a bytearray
        (`records.encode_batch_parts`): a large value is then written where it is, with
        one pwritev (joined first when it is verified or the topic rewrites batches)."""
        if not isinstance(batch, (bytearray, list)):
            batch = bytearray(batch)
        return self._log.append_batch_nowait(batch, verify=verify, lock_timeout_s=(
            LOCK_TIMEOUT_S if lock_timeout_s is None else lock_timeout_s))

    def wait_synced(self, ticket: Any) -> None:
        """Until the sync covering an `append_batch_nowait` batch is done; StorageError
        when it failed (then the batch is not stored)."""
        self._log.wait_synced(ticket)

    # ---- chores ---------------------------------------------------------------------

    def enforce_retention(self, now_ms: int | None = None) -> int:
        """Delete whole segments past `retention.ms` / `retention.bytes` (as of now_ms,
        default now); returns how many. The log start offset moves up first."""
        return self._log.enforce_retention(now_ms)

    def maybe_flush(self, now_ms: int | None = None) -> bool:
        """The `flush.ms` policy: fsync when the oldest unflushed append is at least
        flush.ms old; returns whether it did."""
        return self._log.maybe_flush(now_ms)

    def flush(self) -> None:
        """fsync the partition's files now."""
        self._log.flush()

    def recover(self) -> RecoveryReport:
        """Re-check every batch by CRC from the start, rebuild the indexes and cut the
        log at the first bad byte; returns what was checked and cut."""
        return self._log.recover()

    def check(self) -> None:
        """Full consistency check of the stored data (every batch, offsets, indexes);
        raises on the first fault."""
        self._log.check()

    # ---- replication: what a follower and a promotion need (logkit/replication) ------

    @property
    def leader_epoch(self) -> int:
        """The partitionLeaderEpoch stamped on the batches this partition appends (0
        until a promotion raises it; a follower's follows the batches it copies)."""
        return self._log.leader_epoch

    def set_leader_epoch(self, epoch: int) -> None:
        """Stamp later appends with `epoch` (a promotion: `Follower.promote()`); it may
        only grow (IllegalStateError)."""
        self._log.set_leader_epoch(epoch)

    def segment_base_offsets(self) -> list[int]:
        """The base offsets of the live segments, oldest first (the names of the
        `.log` files from the log start on)."""
        return self._log.segment_bases()

    def append_replicated(self, data: bytes | bytearray | memoryview, *,
                          segment_base_offsets: Iterable[int] = ()) -> int:
        """Append whole batches exactly as the leader stored them (a follower's append;
        `data` as `batches_since` returned it): base offsets and partitionLeaderEpoch
        are kept and nothing is rewritten, and a new segment starts before each batch
        whose base offset is one of the leader's `segment_base_offsets`, so the segment
        files come out byte-identical to the leader's. Every batch is checked before
        any is written: whole, CRC-32C valid, the first starting at `log_end_offset`
        and the rest contiguous; otherwise CorruptRecordError and nothing is written.
        Returns the new log end offset."""
        return self._log.append_replicated(data, segment_bases=frozenset(segment_base_offsets))

    def cut_unpublished(self) -> int:
        """Cut what a writer killed between its write and its publish left past the
        log's committed end — bytes in the active segment file, a killed roll's new
        segment files — (never acknowledged, never readable), so the files hold exactly
        the log; returns how many log bytes went. An append (a roll) does it too, the
        first in each process; a follower does it when it starts copying, so its files
        are a byte prefix of its leader's at once."""
        return self._log.cut_unpublished()

    def truncate_to(self, offset: int) -> int:
        """Remove the records from `offset` on (Kafka's truncateTo: a follower's tail
        that diverged from its leader's). A batch is removed whole, so the log ends at
        `offset` when a batch starts there, else at the base of the batch holding it.
        Returns the new log end; a no-op at or past the end; OffsetOutOfRangeError
        below the log start. Readers in other processes keep the files they have open
        (nothing is cut in place)."""
        return self._log.truncate_to(offset)

    def truncate_fully_and_start_at(self, offset: int) -> None:
        """Drop every record and start an empty log at `offset` (Kafka's
        truncateFullyAndStartAt: a follower whose log ends below its leader's log
        start)."""
        self._log.truncate_fully_and_start_at(offset)

    def increase_log_start_offset(self, offset: int) -> int:
        """Move the log start up to `offset` (at most the log end) and retire the
        segments wholly below it, as retention does (a follower applying its leader's
        log start); returns how many segments went. Lower offsets change nothing."""
        return self._log.increase_log_start_offset(offset)


class Topic:
    """A topic: its partitions and resolved config."""

    def __init__(self, name: str, partitions: int, opener: Callable[[int], PartitionLog],
                 config: Mapping[str, Any], topic_id: str, *,
                 opened: Mapping[int, PartitionLog] | None = None,
                 replication_factor: int = 1,
                 partition_class: Callable[..., Partition] = Partition,
                 overrides: Mapping[str, Any] | None = None) -> None:
        """`opener(n)` opens partition n's log on first use; `opened` holds logs the
        caller has already opened (the broker opens partition 0 to look for an
        interrupted deletion). The partitions of a replicated topic are made by
        `partition_class` (logkit/leader/replicas.py: reads stop at the high
        watermark the ISR allows). `overrides`: the stored overrides `config` was
        resolved from, which the broker compares with the stored record to see a config
        change (`apply_config`)."""
        self.name = name
        self.config = dict(config)
        self.overrides = dict(overrides or {})
        self.topic_id = topic_id
        self.replication_factor = replication_factor
        self._opener = opener
        self._partition_class = partition_class
        opened = opened or {}
        # every log this topic's partitions opened, for `apply_config` (weak: a log a
        # losing thread opened twice is the caller's to drop)
        self._logs_lock = threading.Lock()
        self._logs: weakref.WeakSet[PartitionLog] = weakref.WeakSet(opened.values())
        self._partitions = [partition_class(name, n, self._open, opened.get(n))
                            for n in range(partitions)]

    def __repr__(self) -> str:
        return f"Topic({self.name!r}, partitions={self.num_partitions})"

    @property
    def num_partitions(self) -> int:
        return len(self._partitions)

    @property
    def partitions(self) -> list[Partition]:
        return list(self._partitions)

    def partition(self, number: int) -> Partition:
        if isinstance(number, bool) or not isinstance(number, int) \
                or not 0 <= number < len(self._partitions):
            raise UnknownTopicError(f"topic {self.name!r} has no partition {number!r} "
                                    f"(it has {len(self._partitions)})")
        return self._partitions[number]

    def partition_for(self, key: bytes) -> int:
        """Kafka's default keyed partitioner: murmur2(key) mod partitions (the count
        now: after `Broker.create_partitions` a key may map elsewhere, as in Kafka)."""
        return partition_for_key(key, len(self._partitions))

    def grow_to(self, partitions: int) -> None:
        """Learn a larger partition count (the broker calls it when the topic record it
        reads has grown, `Broker.create_partitions` in any process): handles for the new
        partitions are added, opened on first use. A count that is not larger changes
        nothing (counts never shrink). The list is replaced whole, so a reader in
        another thread sees the old count or the new one, never a mix; callers
        serialise growers (the broker calls it holding its lock)."""
        have = self._partitions
        if partitions > len(have):
            make = self._partition_class
            self._partitions = have + [make(self.name, n, self._open, None)
                                       for n in range(len(have), partitions)]

    def _open(self, number: int) -> PartitionLog:
        """Open partition `number`'s log (`opener`), with the config of this moment: a
        log is listed before its config is compared, and `apply_config` replaces the
        config before it walks the list, so a change made while the log opened is
        applied by one or the other."""
        partition_log = self._opener(number)
        with self._logs_lock:
            self._logs.add(partition_log)
        config = self.config
        if partition_log.config != config:
            partition_log.apply_config(config)
        return partition_log

    def apply_config(self, config: Mapping[str, Any], overrides: Mapping[str, Any]) -> None:
        """Take a new resolved config (`Broker.alter_topic_config`, in any process):
        every opened partition's log applies it at once (`PartitionLog.apply_config`),
        and a partition opened later, or opening now, opens with it (`_open`). Each
        dict is replaced whole; callers serialise appliers (the broker calls it holding
        its lock)."""
        self.config = dict(config)
        self.overrides = dict(overrides)
        with self._logs_lock:
            logs = list(self._logs)
        for partition_log in logs:
            partition_log.apply_config(self.config)

    def mark_deleted(self) -> None:
        """Flag every partition deleted, the first step of `Broker.delete_topic` (which
        is what applications call): from then on every process's appends and reads of
        them raise."""
        for partition in self._partitions:
            partition._log.mark_deleted()

    def close(self) -> None:
        """Close every partition, even when one fails; the first error is raised, the
        others logged."""
        first: BaseException | None = None
        for partition in self._partitions:
            if not partition.opened:
                continue
            try:
                partition._log.close()
            except Exception as exc:      # go on: the other partitions' files too
                if first is None:
                    first = exc
                else:
                    log.warning("closing %s-%d: %s", self.name, partition.partition, exc)
        if first is not None:
            raise first
