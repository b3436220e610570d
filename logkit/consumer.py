"""The consumer: Kafka's `KafkaConsumer` semantics over the embedded log.

Owns: the API and fetching — `poll()` (which blocks on the broker's doorbell until data
arrives from any process, or the timeout passes) reading the fetchable partitions in
turn, resolving and resetting positions (`auto_offset_reset`), deserializers, and the
records fetched but not yet handed out by iteration. What it reads — subscription or
manual assignment, owned partitions, positions, paused partitions — is its
`SubscriptionState` (logkit/subscription.py, Kafka's `SubscriptionState`); with a
`group_id`, membership — joining, the heartbeat thread, rebalances learned on poll,
`on_revoke` / `on_assign`, commits and auto-commit — is its `ConsumerCoordinator`
(logkit/coordinator.py, Kafka's `ConsumerCoordinator`) over group.py's group record.

Invariant: `position(tp)` is the offset of the next record `poll()` returns for `tp`
— a record the deserializers cannot decode included: poll() raises `SerializationError`
for it, the position staying on it until `seek()` (docs/design.md §11); records come back in
offset order per partition; a group member fetches only partitions it owns in the group
record, so no two members of a group read one partition at once.

Thread-safety: like Kafka's consumer, one thread uses a consumer (the heartbeat thread
is internal). Use one consumer per thread. The one exception is `close()`, which any
thread may call: it marks the consumer closed, waits for the polling thread's current
step (never for its wait), then leaves the group; a `poll()` blocked meanwhile raises
`ClosedError` within one doorbell wait (≤ 5 ms) and never re-joins the group.

Rebalance listeners: an exception from `on_revoke` / `on_assign` does not stop the
rebalance and is raised from that `poll()` afterwards (see logkit/coordinator.py).

Fork: a consumer made in one process raises `ForkedProcessError` from every call in a
forked child (checked before any lock or file is touched); `close()` there returns
without leaving the group or touching any file — the parent's membership is not the
child's to end.

Options: the keywords, defaults and bounds are the "consumer" rows of the one settings
table (logkit/config.py, docs/configuration.md). `isolation_level` takes Kafka's two
values: read_committed reads up to the last stable offset and leaves out the records of
aborted transactions (docs/design.md §15); positions move past control batches and
aborted records, which no level returns.

Errors that are not raised: auto-commits and heartbeats are best effort (see
logkit/coordinator.py for what is logged at which level).
"""

from __future__ import annotations

import logging
import math
import operator
import re
import threading
import time
from typing import Any, Callable, Iterable, Iterator, Mapping, NamedTuple

from . import _fork
from .config import CONSUMER, resolve
from .coordinator import ConsumerCoordinator
from .errors import (ArgumentTypeError, ClosedError, ConfigError, IllegalStateError,
                     LogkitError, NoOffsetForPartitionError, OffsetOutOfRangeError,
                     SerializationError, UnknownTopicError, storage_error)
from .group import OffsetAndMetadata, committed_offsets
from .notify import change_slot, changed_slots
from .records import Record
from .subscription import SubscriptionState, as_topic_partition, check_offset
from .topic import TopicPartition, validate_topic_name

__all__ = ["Consumer", "OffsetAndTimestamp", "ConsumerGroupMetadata"]

# Keyword -> default, from the one settings table (logkit/config.py, scope "consumer").
DEFAULTS: dict[str, Any] = resolve(CONSUMER, None)

log = logging.getLogger(__name__)

_VALUE = operator.attrgetter("value")
FULL_RECHECK_S = 1.0     # drained partitions are all read again at least this often
FEW_DRAINED = 2          # up to this many drained marks are dropped at any ring


def _check_poll_arguments(timeout_ms: Any, max_records: Any) -> float:
    """poll()'s timeout in ms (a negative one counts as 0), or a named error: an
    ArgumentTypeError (a ConfigError and a TypeError) for a wrong type, a ConfigError
    for a value out of range."""
    if type(timeout_ms) is int and type(max_records) is int and max_records > 0:
        return timeout_ms if timeout_ms > 0 else 0        # the usual call, checked fast
    if isinstance(timeout_ms, bool) or not isinstance(timeout_ms, (int, float)):
        raise ArgumentTypeError(f"timeout_ms must be an int (or float) of milliseconds, "
                                f"got {timeout_ms!r} ({type(timeout_ms).__name__})")
    if not math.isfinite(timeout_ms):
        raise ConfigError(f"timeout_ms must be a finite number of milliseconds, got "
                          f"{timeout_ms!r}")
    if isinstance(max_records, bool) or not isinstance(max_records, int):
        raise ArgumentTypeError(f"max_records must be a positive int, got {max_records!r} "
                                f"({type(max_records).__name__})")
    if max_records <= 0:
        raise ConfigError(f"max_records must be a positive integer, got {max_records!r}")
    return max(timeout_ms, 0)


def _undecodable(exc: Exception, which: str, tp: TopicPartition, offset: int
                 ) -> LogkitError:
    """The error poll() raises for the record at `offset` whose key or value (`which`)
    the deserializer could not decode."""
    if isinstance(exc, SerializationError):
        error = exc.at(tp.topic, tp.partition, offset)
    elif isinstance(exc, LogkitError):
        return exc                    # not about the bytes: the store, a closed broker...
    else:
        error = SerializationError(
            f"the {which} deserializer raised {type(exc).__name__}: {exc}; the position "
            f"stays on this record until seek() moves past it",
            topic=tp.topic, partition=tp.partition, offset=offset)
    error.__cause__ = exc
    return error


class OffsetAndTimestamp(NamedTuple):
    offset: int
    timestamp: int


class ConsumerGroupMetadata(NamedTuple):
    """`consumer.group_metadata()`, for `producer.send_offsets_to_transaction` (Kafka's
    ConsumerGroupMetadata, KIP-447): the coordinator refuses offsets sent for a
    generation or member id the group has moved past."""

    group_id: str
    generation_id: int = -1
    member_id: str = ""
    group_instance_id: str | None = None


class Consumer:
    """`broker.consumer("orders", group_id="billing", auto_offset_reset="earliest")`."""

    def __init__(self, broker: Any, *topics: str, **options: Any) -> None:
        self.config = settings = resolve(CONSUMER, options)   # ConfigError naming a key
        strategy = settings["partition_assignment_strategy"]
        if isinstance(strategy, (list, tuple)):
            strategy = strategy[0]
        self._broker = broker
        self._group_id: str | None = settings["group_id"]
        self._isolation_level: str = settings["isolation_level"]
        self._key_deserializer: Callable | None = settings["key_deserializer"]
        self._value_deserializer: Callable | None = settings["value_deserializer"]
        self._subscriptions = SubscriptionState(settings["auto_offset_reset"])
        # Where the next fetch starts in the fetchable list: after the partition the
        # last one read from, so partitions are read in turn.
        self._next = 0
        # Partition handles for the fetchable partitions, valid for one version of the
        # subscription state (a rebalance, assign, pause or resume starts afresh): a
        # poll costs no topic lookup (LMDB + JSON) per partition.
        self._handles: dict[TopicPartition, Any] = {}
        self._topic_handles: dict[str, Any] = {}      # same lifetime as _handles
        self._handles_version = -1
        # Partitions found at their log end (tp -> position then) since the doorbell
        # last showed this value: no process appended since, so they are skipped
        # without reading their tails. When the doorbell moves, the marks of the
        # partitions whose change slots moved go (see `_forget_changed`).
        self._drained: dict[TopicPartition, int] = {}
        self._drained_bell: int | None = None
        # Per subscription version (`_walk_version`): the fetchable partitions not
        # drained, known after a walk of all of them and kept up as marks come and go
        # (None: unknown, walk them all); each one's place in the fetchable list; the
        # fetchable partitions by change slot (None: not made yet).
        self._pending: set[TopicPartition] | None = None
        self._index: dict[TopicPartition, int] = {}
        self._slots: dict[int, list[TopicPartition]] | None = None
        self._walk_version = -1
        self._changes: bytes | None = None     # the change slots at the last look
        self._cleared_at = 0.0                 # monotonic time of the last full clear
        self._buffer: list[Record] = []       # fetched, not yet handed out by __next__
        # How long a poll() that found nothing spins on the doorbell before it sleeps
        # (once per call: poll_spin_us, the only setting here that is not Kafka's).
        self._spin_s: float = settings["poll_spin_us"] / 1e6
        self._decoding = self._key_deserializer is not None or \
            self._value_deserializer is not None
        # A partition whose position is a record that did not deserialize: fetched
        # first until it decodes or is seeked past (see _fetch).
        self._stuck: TopicPartition | None = None
        self._closed = False
        # Held by poll() for each step (sync, fetch) but not while it waits, and by
        # close(): a close from another thread never interleaves with a step.
        self._lock = threading.RLock()
        self._pid = _fork.owner_pid()
        self._coordinator: ConsumerCoordinator | None = None
        if self._group_id is not None:
            if not isinstance(self._group_id, str) or not self._group_id \
                    or "\0" in self._group_id:
                raise ConfigError(f"invalid group_id {self._group_id!r}")
            self._coordinator = ConsumerCoordinator(
                broker, self._group_id, self._subscriptions, strategy=strategy,
                session_timeout_ms=settings["session_timeout_ms"],
                max_poll_interval_ms=settings["max_poll_interval_ms"],
                heartbeat_interval_ms=settings["heartbeat_interval_ms"],
                client_id=settings["client_id"],
                enable_auto_commit=settings["enable_auto_commit"],
                auto_commit_interval_ms=settings["auto_commit_interval_ms"],
                on_assign=settings["on_assign"], on_revoke=settings["on_revoke"])
            # lag() of the group counts to the LSO while a member reads committed
            self._coordinator.group.isolation_level = self._isolation_level
        if topics:
            self.subscribe(list(topics))

    def __repr__(self) -> str:
        return (f"Consumer(group_id={self._group_id!r}, "
                f"assignment={sorted(self._subscriptions.assigned)})")

    @property
    def _owned(self) -> set[TopicPartition]:
        """The partitions fetchable now (read by tests/helpers/group_worker.py)."""
        return self._subscriptions.owned

    def _check(self) -> None:
        if self._pid != _fork._pid:
            _fork.check_owner(self._pid, "this consumer")
        if self._closed:
            raise ClosedError("consumer is closed")

    # ---- subscription and assignment -------------------------------------------------

    def subscribe(self, topics: Iterable[str] = (), *, pattern: str | None = None,
                  on_assign: Callable | None = None, on_revoke: Callable | None = None) -> None:
        """Subscribe to topics (or a regex pattern); with a group_id, join the group."""
        self._check()
        subscriptions = self._subscriptions
        if subscriptions.manual:
            raise IllegalStateError("subscribe() after assign(): use one or the other")
        if isinstance(topics, str):
            topics = [topics]
        names = [validate_topic_name(t) for t in topics]
        coordinator = self._coordinator
        if coordinator is not None:
            if on_assign is not None:
                coordinator.on_assign = on_assign
            if on_revoke is not None:
                coordinator.on_revoke = on_revoke
        compiled = re.compile(pattern) if pattern else None
        if compiled is not None:
            names = sorted(set(names) | {t for t in self._broker.topics()
                                         if compiled.fullmatch(t)})
        for name in names:
            self._broker.get_or_create_topic(name)        # UnknownTopicError if disabled
        was_subscribed = bool(subscriptions.topics)
        subscriptions.subscribe(names, compiled)
        if coordinator is None:
            self._set_assignment({p.topic_partition for name in subscriptions.topics
                                  for p in self._broker.topic(name).partitions})
        else:
            coordinator.subscribe(was_subscribed)

    def subscription(self) -> set[str]:
        return set(self._subscriptions.topics)

    def unsubscribe(self) -> None:
        self._check()
        if self._coordinator is not None:
            self._coordinator.leave(autocommit=True)
        self._subscriptions.unsubscribe()
        self._drop_unowned()

    def assign(self, partitions: Iterable[TopicPartition]) -> None:
        """Manual assignment: no group membership (commits need an empty group)."""
        self._check()
        if self._subscriptions.topics:
            raise IllegalStateError("assign() after subscribe(): use one or the other")
        tps = {as_topic_partition(tp) for tp in partitions}
        topics = {name: self._broker.topic(name) for name in {tp.topic for tp in tps}}
        for tp in tps:
            topics[tp.topic].partition(tp.partition)                # validates
        self._subscriptions.assign(tps)
        self._drop_unowned()

    def _set_assignment(self, tps: set[TopicPartition]) -> None:
        """Without a group: every partition of the subscription, owned at once."""
        self._subscriptions.set_assignment(tps, owned=True)
        self._drop_unowned()

    def _drop_unowned(self) -> None:
        """Forget fetched records of partitions no longer owned."""
        if self._buffer:
            owned = self._subscriptions.owned
            self._buffer = [r for r in self._buffer
                            if TopicPartition(r.topic, r.partition) in owned]

    def assignment(self) -> set[TopicPartition]:
        return set(self._subscriptions.assigned)

    # ---- group protocol --------------------------------------------------------------

    def _sync_group(self) -> None:
        """Learn a new generation (see ConsumerCoordinator.sync); fetched records of
        partitions it took away are dropped."""
        if self._coordinator is not None:
            self._coordinator.sync()
            self._drop_unowned()

    # ---- positions -------------------------------------------------------------------

    def _partition(self, tp: TopicPartition) -> Any:
        return self._broker.topic(tp.topic).partition(tp.partition)

    def _end(self, partition: Any) -> int:
        """Where this consumer's reading ends for now: the high watermark, or for
        read_committed the last stable offset (Kafka's end offsets by isolation level)."""
        if self._isolation_level == "read_committed":
            return partition.last_stable_offset
        return partition.high_watermark

    def _reset(self, tp: TopicPartition) -> int:
        policy = self._subscriptions.reset_policy
        partition = self._handle(tp)
        if policy == "earliest":
            return partition.log_start_offset
        if policy == "latest":
            return self._end(partition)
        raise NoOffsetForPartitionError(
            f"no valid offset for {tp.topic}-{tp.partition} and auto_offset_reset='none'")

    def _resolve(self, tp: TopicPartition,
                 committed: Mapping[TopicPartition, Any] | None = None) -> int:
        """`tp`'s position, resolved on first use from the group's committed offset
        (looked up alone, or in `committed`: all of the group's, read at once) or
        `auto_offset_reset`."""
        positions = self._subscriptions.positions
        position = positions.get(tp)
        if position is None:
            if self._coordinator is not None:
                if committed is None:
                    position = self._coordinator.committed(tp)
                else:
                    found = committed.get(tp)
                    position = None if found is None else found.offset
                if position is not None:
                    partition = self._handle(tp)
                    if not partition.log_start_offset <= position <= partition.high_watermark:
                        position = None
            if position is None:
                position = self._reset(tp)
            positions[tp] = position
        return position

    def _resolve_all(self, tps: list[TopicPartition]) -> None:
        """Resolve every partition of `tps` that has no position yet, as Kafka's
        consumer does before a fetch: one transaction reads all of the group's committed
        offsets (not one per partition, nor one per poll while a 3,000-partition
        assignment is worked through)."""
        positions = self._subscriptions.positions
        committed = None
        if self._coordinator is not None:
            committed = committed_offsets(self._broker.meta, self._group_id)
        for tp in tps:
            if positions.get(tp) is None:
                self._resolve(tp, committed)

    def position(self, tp: TopicPartition) -> int:
        self._check()
        return self._resolve(self._subscriptions.require_assigned(tp))

    def seek(self, tp: TopicPartition, offset: int) -> None:
        self._check()
        tp = self._subscriptions.require_assigned(tp)
        self._subscriptions.seek(tp, offset)
        self._forget_drained(tp)
        self._drop_buffered(tp)

    def _forget_drained(self, tp: TopicPartition) -> None:
        """`tp`'s position moved outside a fetch: it is read at the next poll."""
        self._drained.pop(tp, None)
        if self._pending is not None:
            self._pending.add(tp)

    def seek_to_beginning(self, *tps: TopicPartition) -> None:
        """Every given (default: assigned) partition to its log start offset."""
        for tp in (tps or tuple(self._subscriptions.assigned)):
            tp = self._subscriptions.require_assigned(tp)
            self.seek(tp, self._partition(tp).log_start_offset)

    def seek_to_end(self, *tps: TopicPartition) -> None:
        """Every given (default: assigned) partition to its high watermark (its last
        stable offset for read_committed)."""
        for tp in (tps or tuple(self._subscriptions.assigned)):
            tp = self._subscriptions.require_assigned(tp)
            self.seek(tp, self._end(self._partition(tp)))

    def _drop_buffered(self, tp: TopicPartition) -> None:
        if self._buffer:
            self._buffer = [r for r in self._buffer
                            if (r.topic, r.partition) != (tp.topic, tp.partition)]

    def pause(self, *tps: TopicPartition) -> None:
        self._check()
        for tp in tps:
            self._drop_buffered(self._subscriptions.pause(tp))

    def resume(self, *tps: TopicPartition) -> None:
        self._check()
        for tp in tps:
            self._subscriptions.resume(tp)

    def paused(self) -> set[TopicPartition]:
        return set(self._subscriptions.paused)

    def beginning_offsets(self, tps: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        tps = [as_topic_partition(tp) for tp in tps]
        return {tp: self._partition(tp).log_start_offset for tp in tps}

    def end_offsets(self, tps: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        tps = [as_topic_partition(tp) for tp in tps]
        return {tp: self._end(self._partition(tp)) for tp in tps}

    def offsets_for_times(self, timestamps: Mapping[TopicPartition, int]
                          ) -> dict[TopicPartition, OffsetAndTimestamp | None]:
        """Earliest offset at or after each timestamp (None if there is none)."""
        self._check()
        out: dict[TopicPartition, OffsetAndTimestamp | None] = {}
        for tp, ts in timestamps.items():
            tp = as_topic_partition(tp)
            partition = self._partition(tp)
            offset = partition.offset_for_timestamp(ts)
            # the offset may be one compaction removed: the record read is the next
            # survivor, whose offset is answered (none: nothing at or after ts is left)
            found = [] if offset is None else partition.read(offset, max_records=1)
            out[tp] = OffsetAndTimestamp(found[0].offset, found[0].timestamp) \
                if found else None
        return out

    # ---- commits ---------------------------------------------------------------------

    def group_metadata(self) -> ConsumerGroupMetadata:
        """The group, generation and member id this consumer has now (Kafka's
        `groupMetadata()`), to pass to `producer.send_offsets_to_transaction`."""
        self._check()
        coordinator = self._coordinator
        if coordinator is None or self._group_id is None:
            raise IllegalStateError("group_metadata() needs a group_id")
        member = coordinator.member_id
        return ConsumerGroupMetadata(self._group_id,
                                     coordinator.generation if member else -1,
                                     member or "")

    def committed(self, tp: TopicPartition) -> int | None:
        self._check()
        if self._coordinator is None:
            return None
        return self._coordinator.committed(as_topic_partition(tp))

    def commit(self, offsets: Mapping[TopicPartition, Any] | None = None) -> None:
        """Commit offsets (next offsets to read) — current positions by default."""
        self._check()
        if self._coordinator is None:
            raise IllegalStateError("commit() needs a group_id")
        if offsets is None:
            offsets = self._subscriptions.committable()
        elif not isinstance(offsets, Mapping):
            raise ArgumentTypeError(f"commit() takes a dict {{TopicPartition: offset}} (or "
                                    f"nothing: the current positions), got {offsets!r}")
        clean: dict[TopicPartition, OffsetAndMetadata] = {}
        for tp, value in offsets.items():
            tp = as_topic_partition(tp)
            if isinstance(value, tuple):
                value = OffsetAndMetadata(check_offset(value[0]),
                                          value[1] if len(value) > 1 else "")
            else:
                value = OffsetAndMetadata(check_offset(value))
            clean[tp] = value
        self._coordinator.commit(clean)

    # ---- fetching --------------------------------------------------------------------

    def poll(self, timeout_ms: int = 0, max_records: int | None = None) -> list[Record]:
        """Records from the assigned partitions; blocks up to timeout_ms for data
        (appended by any process). timeout_ms=0 returns at once."""
        self._check()
        if not self._subscriptions.has_source():
            raise IllegalStateError("poll() needs subscribe() or assign() first")
        if max_records is None:
            max_records = self.config["max_poll_records"]
        deadline = time.monotonic() + _check_poll_arguments(timeout_ms, max_records) / 1000
        doorbell = self._broker.doorbell
        coordinator = self._coordinator
        spin_s = self._spin_s
        while True:
            with self._lock:
                # close() (from another thread, or the broker's) ends the poll here:
                # before the step that would otherwise re-join the group.
                if self._closed or self._broker.closed:
                    raise ClosedError("consumer closed during poll()" if self._closed
                                      else "broker closed during poll()")
                seen = None if doorbell is None else doorbell.value()
                if coordinator is not None:
                    coordinator.last_poll_ms = int(time.time() * 1000)
                    self._sync_group()
                    coordinator.raise_listener_error()   # after the rebalance is complete
                records = self._fetch(max_records, seen)
                if records:
                    if coordinator is not None:
                        coordinator.maybe_auto_commit()
                    return records
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    if coordinator is not None:
                        coordinator.maybe_auto_commit()
                    return []
            if doorbell is None or seen is None:   # a read-only broker: nobody rings
                time.sleep(min(remaining, 0.005))
            else:
                doorbell.wait(seen, remaining, spin_s)
                spin_s = 0.0                   # one spin per call: then sleep at once

    def _fetch(self, max_records: int, bell: int | None = None) -> list[Record]:
        """Up to max_records from the fetchable partitions, each in turn from its
        position, which moves past what is returned. A record a deserializer cannot
        decode stops the fetch there (docs/design.md §11): the records before it are returned
        and the position stays on it; a fetch that would start with it raises (see
        `_decoded`), and that partition is read first until it decodes or is seeked
        past, so every poll raises until then.

        `bell` is the doorbell's value read before this fetch (None: no doorbell).
        The work per poll is the partitions read, not the partitions assigned: the
        fetchable list and partition handles are cached per subscription version, and
        partitions found drained are skipped until the doorbell moves."""
        if self._buffer:
            out, self._buffer = self._buffer[:max_records], self._buffer[max_records:]
            return out
        fetchable = self._subscriptions.fetchable()
        if not fetchable:
            return []
        count = len(fetchable)
        start = self._next % count
        version = self._subscriptions.version
        if self._walk_version != version:
            self._index = {tp: i for i, tp in enumerate(fetchable)}
            self._pending = self._slots = None
            self._walk_version = version
        if bell is None or bell != self._drained_bell:
            self._forget_changed(bell, fetchable)
        index, pending = self._index, self._pending
        stuck, self._stuck = self._stuck, None       # set again if it still fails
        # The partitions from `start` round. When most are drained and the others are
        # known (`_pending`), only those are visited, so a poll's cost does not grow
        # with the partitions drained; else every one, read in place (no copy of a
        # 3,000-long list per poll), unless a stuck partition goes first.
        order, shift, walk = fetchable, start, count
        if stuck is not None:
            order, shift = fetchable[start:] + fetchable[:start], 0
            if stuck in order:                       # its error comes before anything
                order.remove(stuck)
                order.insert(0, stuck)
        elif pending is not None and len(pending) * 4 < count:
            order = sorted(pending, key=lambda tp: (index[tp] - start) % count)
            shift = 0
            walk = len(order)
        whole = walk == count                        # a walk of every partition
        drained = self._drained
        self._next = start + 1
        decoding = self._decoding
        out: list[Record] = []
        budget = self.config["fetch_max_bytes"]
        per_partition = self.config["max_partition_fetch_bytes"]
        positions = self._subscriptions.positions
        for i in range(walk):
            tp = order[(shift + i) % walk]
            position = positions.get(tp)
            if position is None:
                # the first unresolved partition of a new assignment: resolve them all
                # now, from one read of the group's committed offsets
                self._resolve_all(fetchable)
                position = positions[tp]
            elif drained.get(tp) == position:
                continue                       # at its log end, and nobody appended since
            want = max_records - len(out)
            try:
                records, after, end = self._read(tp, position, want,
                                                 min(per_partition, budget))
            except OffsetOutOfRangeError:
                positions[tp] = self._reset(tp)           # retention passed us (Kafka)
                continue
            if not records:
                positions[tp] = position = after          # past batches with no record
                drained[tp] = position
                if pending is not None:
                    pending.discard(tp)
                continue
            self._next = index[tp] + 1
            full = len(out) + len(records) >= max_records
            if not full:
                # the stored values' bytes against fetch_max_bytes, counted only when
                # another partition may be read (C-level iteration, no Python per record)
                budget -= sum(map(len, filter(None, map(_VALUE, records))))
            if decoding:
                records, error = self._decoded(tp, records)
                if error is not None:
                    if records:
                        positions[tp] = records[-1].offset + 1
                        out.extend(records)
                    self._stuck = tp                  # position: the bad record
                    if not out:
                        raise error
                    return out
            position = positions[tp] = after
            out.extend(records)
            if len(records) < want and end <= position:
                # read to its end (the high watermark that read stopped at): skip it
                # until the doorbell moves, as if the next read had found nothing
                drained[tp] = position
                if pending is not None:
                    pending.discard(tp)
            if full or budget <= 0:
                whole = False
                break
        if whole and pending is None:
            # every partition looked at: the ones not drained are now known
            self._pending = {tp for tp in fetchable if drained.get(tp) != positions.get(tp)}
        return out

    def _forget_changed(self, bell: int | None, fetchable: list[TopicPartition]) -> None:
        """The doorbell moved (or there is none): forget the drained marks of the
        partitions that may have new records — those whose change slots moved since the
        previous snapshot, taken like this one before the partitions were read
        (logkit/notify.py) — or all of them: without a doorbell, after a ring that named
        no partition, and at least every FULL_RECHECK_S (a bound on any change that
        reached a partition without its slot). A replicated partition's readable end
        moves with the ISR, which rings no slot: its mark goes at every move."""
        drained = self._drained
        self._drained_bell = bell
        doorbell = self._broker.doorbell
        changes = None if bell is None or doorbell is None else doorbell.changes()
        before, self._changes = self._changes, changes
        now = time.monotonic()
        if len(drained) <= FEW_DRAINED:      # reading them costs less than the look
            self._clear_drained(now)
            return
        if changes is None or before is None or now - self._cleared_at > FULL_RECHECK_S:
            self._clear_drained(now)
            return
        by_slot = self._slots
        if by_slot is None:
            try:
                by_slot = self._slots = self._slot_map(fetchable)
            except LogkitError:              # a topic gone: the reads will say so
                self._clear_drained(now)
                return
        slots = changed_slots(before, changes, by_slot)
        if slots is None:
            self._clear_drained(now)
            return
        pending = self._pending
        for slot in [0, *slots]:             # 0: the replicated partitions, always
            for tp in by_slot.get(slot, ()):
                if drained.pop(tp, None) is not None and pending is not None:
                    pending.add(tp)

    def _clear_drained(self, now: float) -> None:
        self._drained.clear()
        self._pending = None
        self._cleared_at = now

    def _slot_map(self, fetchable: list[TopicPartition]) -> dict[int, list[TopicPartition]]:
        """change slot -> the fetchable partitions in it; a replicated partition under
        0, which no append names (its readable end moves with the ISR)."""
        by_slot: dict[int, list[TopicPartition]] = {}
        replicated: dict[str, bool] = {}
        for tp in fetchable:
            topic = tp.topic
            if topic not in replicated:
                replicated[topic] = self._handle(tp).replicated
            slot = 0 if replicated[topic] else change_slot(topic, tp.partition)
            by_slot.setdefault(slot, []).append(tp)
        return by_slot

    def _handle(self, tp: TopicPartition) -> Any:
        """The partition handle of a fetchable partition (cached per subscription
        version; see `_fetch`)."""
        version = self._subscriptions.version
        if self._handles_version != version:
            self._handles.clear()
            self._topic_handles.clear()
            self._handles_version = version
        partition = self._handles.get(tp)
        if partition is None:
            # one topic lookup (a metadata read) per topic, not one per partition: a
            # 3,000-partition assignment paid 3,000 of them on its first polls
            topic = self._topic_handles.get(tp.topic)
            if topic is None:
                topic = self._topic_handles[tp.topic] = self._broker.topic(tp.topic)
            partition = self._handles[tp] = topic.partition(tp.partition)
        return partition

    def _read(self, tp: TopicPartition, position: int, max_records: int,
              max_bytes: int) -> tuple[list[Record], int, int]:
        """`Partition.fetch_records` through the cached handle: the records, where the
        next read starts (past every batch walked, so offsets removed by compaction
        are stepped over) and the high watermark they were read below. A read that
        walked only batches with no record left is repeated from where it stopped, so
        a poll never returns empty below the high watermark. A handle that went stale
        (its topic deleted, perhaps re-created, or closed) is looked up again once."""
        partition = self._handle(tp)
        try:
            level = self._isolation_level
            try:
                fetched = partition.fetch_records(position, max_records,
                                                  max_bytes=max_bytes,
                                                  isolation_level=level)
            except (UnknownTopicError, ClosedError):
                self._handles.pop(tp, None)
                self._topic_handles.pop(tp.topic, None)
                partition = self._handle(tp)        # raises if it is really gone
                fetched = partition.fetch_records(position, max_records,
                                                  max_bytes=max_bytes,
                                                  isolation_level=level)
            # read_committed reads below the last stable offset: markers and aborted
            # records are stepped over like removed ones, and the read ends there
            end = fetched.last_stable_offset if level == "read_committed" \
                else fetched.high_watermark
            # each repeat starts further on: the loop ends at the end
            while not fetched.records and position < fetched.next_offset < end:
                position = fetched.next_offset
                fetched = partition.fetch_records(position, max_records,
                                                  max_bytes=max_bytes,
                                                  isolation_level=level)
                end = fetched.last_stable_offset if level == "read_committed" \
                    else fetched.high_watermark
            return fetched.records, fetched.next_offset, end
        except OSError as exc:                        # the log names its own; a stray
            if isinstance(exc, LogkitError):          # (LogkitTimeoutError is an OSError)
                raise
            raise storage_error(exc, "fetch", partition.directory) from exc

    def _decoded(self, tp: TopicPartition, records: list[Record]
                 ) -> tuple[list[Record], LogkitError | None]:
        """`records` through the deserializers, up to the first that does not decode,
        and the error for that one: a `SerializationError` naming topic, partition and
        offset (the deserializer's own error as its cause), or the `LogkitError` a
        deserializer raised about something else (its registry's store, a closed
        broker), as it is. None when every record decodes."""
        key_deserializer = self._key_deserializer
        value_deserializer = self._value_deserializer
        out = []
        for record in records:
            key, value = record.key, record.value
            which = "key"
            try:
                if key_deserializer is not None and key is not None:
                    key = key_deserializer(key)
                which = "value"
                if value_deserializer is not None and value is not None:
                    value = value_deserializer(value)
            except Exception as exc:       # a user's deserializer: any failure is this
                return out, _undecodable(exc, which, tp, record.offset)
            out.append(record._replace(key=key, value=value))
        return out, None

    def __iter__(self) -> Iterator[Record]:
        return self

    def __next__(self) -> Record:
        """Blocking iteration; ends after consumer_timeout_ms without a record."""
        if self._buffer:
            return self._buffer.pop(0)
        limit = self.config["consumer_timeout_ms"]
        deadline = time.monotonic() + limit / 1000 if limit != float("inf") else None
        while True:
            wait = 100 if deadline is None else max(0, int((deadline - time.monotonic())
                                                           * 1000))
            try:
                records = self.poll(timeout_ms=wait)
            except ClosedError:
                if self._closed:                 # close() from another thread ends it
                    raise StopIteration from None
                raise
            if records:
                self._buffer = records[1:] + self._buffer
                return records[0]
            if deadline is not None and time.monotonic() >= deadline:
                raise StopIteration

    # ---- lifecycle -------------------------------------------------------------------

    def close(self, autocommit: bool = True) -> None:
        """Commit (if auto-commit), leave the group, stop the heartbeat. Safe twice, and
        from any thread: a poll() blocked in another thread raises ClosedError. In a
        forked child it only marks this copy closed: no commit, no leave, no file."""
        if self._closed:
            return
        self._closed = True                # a poll in another thread stops at its next step
        if self._pid != _fork._pid:
            return
        coordinator = self._coordinator
        if coordinator is None:
            return
        coordinator.closed = True          # the heartbeat and a listener's re-join see it
        coordinator.stop_heartbeat()
        try:
            with self._lock:               # wait out that step: it may be mid-rebalance
                coordinator.leave(autocommit=autocommit)
        except ClosedError:
            pass
        finally:
            coordinator.join_heartbeat()

    def __enter__(self) -> "Consumer":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
