"""The consumer: Kafka's `KafkaConsumer` semantics over the embedded log.

Owns: subscriptions and manual assignments, fetch positions, `poll()` (which blocks on
the broker's doorbell until data arrives from any process, or the timeout passes),
offset reset (`auto_offset_reset`), commits and auto-commit, pause/resume, and — with a
`group_id` and a subscription — this member's part of the group protocol (group.py):
a heartbeat thread, rebalances learned on poll, `on_revoke` / `on_assign` callbacks.

Invariant: `position(tp)` is the offset of the next record `poll()` returns for `tp`;
records come back in offset order per partition; a group member fetches only partitions
it owns in the group record, so no two members of a group read one partition at once.

Thread-safety: like Kafka's consumer, one thread uses a consumer (the heartbeat thread
is internal). Use one consumer per thread. The one exception is `close()`, which any
thread may call: it marks the consumer closed, waits for the polling thread's current
step (never for its wait), then leaves the group; a `poll()` blocked meanwhile raises
`ClosedError` within one doorbell wait (≤ 5 ms) and never re-joins the group.

Rebalance listeners: an exception from `on_revoke` / `on_assign` does not stop the
rebalance — revoked partitions are still committed (auto-commit), released and no longer
fetched, new ones still acquired — and is raised from that `poll()` afterwards (Kafka
raises the listener's exception from poll the same way).

Fork: a consumer made in one process raises `ForkedProcessError` from every call in a
forked child (checked before any lock or file is touched); `close()` there returns
without leaving the group or touching any file — the parent's membership is not the
child's to end.

Options: the keywords, defaults and bounds are the "consumer" rows of the one settings
table (logkit/config.py, docs/configuration.md). `isolation_level` takes Kafka's two
values only and, with no transactions yet, both read the same records.

Errors that are not raised: auto-commits are best effort, as Kafka's are — a refused one
(fenced, busy group) is logged at INFO/DEBUG, a failed one at WARNING; a heartbeat that
fails with a `LogkitError` is logged and retried next interval (the next poll sees an
eviction); any other error in the heartbeat thread is logged and ends the thread.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from typing import Any, Callable, Iterable, Iterator, Mapping, NamedTuple

from . import _fork
from .config import CONSUMER, resolve
from .errors import (ClosedError, CommitFailedError, ConfigError, IllegalStateError,
                     LogkitError, NoOffsetForPartitionError, OffsetOutOfRangeError,
                     storage_error)
from .group import GroupCoordinator, OffsetAndMetadata, committed_offset
from .records import Record
from .topic import TopicPartition, validate_topic_name

__all__ = ["Consumer", "OffsetAndTimestamp"]

# Keyword -> default, from the one settings table (logkit/config.py, scope "consumer").
DEFAULTS: dict[str, Any] = resolve(CONSUMER, None)

log = logging.getLogger(__name__)


class OffsetAndTimestamp(NamedTuple):
    offset: int
    timestamp: int


def _as_tp(tp: Any) -> TopicPartition:
    if isinstance(tp, TopicPartition):
        return tp
    if isinstance(tp, tuple) and len(tp) == 2:
        return TopicPartition(tp[0], tp[1])
    raise TypeError(f"expected a TopicPartition, got {tp!r}")


def _check_offset(offset: Any) -> int:
    if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
        raise OffsetOutOfRangeError(f"offset must be a non-negative integer, got {offset!r}")
    return offset


class Consumer:
    """`broker.consumer("orders", group_id="billing", auto_offset_reset="earliest")`."""

    def __init__(self, broker: Any, *topics: str, **options: Any) -> None:
        self.config = settings = resolve(CONSUMER, options)   # ConfigError naming a key
        strategy = settings["partition_assignment_strategy"]
        if isinstance(strategy, (list, tuple)):
            strategy = strategy[0]
        self._broker = broker
        self._group_id: str | None = settings["group_id"]
        self._key_deserializer: Callable | None = settings["key_deserializer"]
        self._value_deserializer: Callable | None = settings["value_deserializer"]
        self._on_assign: Callable | None = settings["on_assign"]
        self._on_revoke: Callable | None = settings["on_revoke"]
        self._positions: dict[TopicPartition, int | None] = {}
        self._owned: set[TopicPartition] = set()          # fetchable now
        self._assigned: set[TopicPartition] = set()       # this generation's share
        self._paused: set[TopicPartition] = set()
        self._subscription: list[str] = []
        self._pattern: re.Pattern | None = None
        self._manual = False
        self._generation = -1
        self._rotation = 0
        self._buffer: list[Record] = []
        self._last_poll_ms = int(time.time() * 1000)
        self._last_commit = time.monotonic()
        self._closed = False
        self._fenced = False
        # Held by poll() for each step (sync, fetch) but not while it waits, and by
        # close(): a close from another thread never interleaves with a step.
        self._lock = threading.RLock()
        self._pid = _fork.owner_pid()
        self._listener_errors: list[BaseException] = []
        self._coordinator: GroupCoordinator | None = None
        if self._group_id is not None:
            if not isinstance(self._group_id, str) or not self._group_id \
                    or "\0" in self._group_id:
                raise ConfigError(f"invalid group_id {self._group_id!r}")
            self._coordinator = GroupCoordinator(
                broker, self._group_id, strategy=strategy,
                session_timeout_ms=settings["session_timeout_ms"],
                max_poll_interval_ms=settings["max_poll_interval_ms"],
                client_id=settings["client_id"])
        self._heartbeat_stop = threading.Event()
        self._heartbeat: threading.Thread | None = None
        if topics:
            self.subscribe(list(topics))

    def __repr__(self) -> str:
        return f"Consumer(group_id={self._group_id!r}, assignment={sorted(self._assigned)})"

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
        if self._manual:
            raise IllegalStateError("subscribe() after assign(): use one or the other")
        if isinstance(topics, str):
            topics = [topics]
        names = [validate_topic_name(t) for t in topics]
        if on_assign is not None:
            self._on_assign = on_assign
        if on_revoke is not None:
            self._on_revoke = on_revoke
        self._pattern = re.compile(pattern) if pattern else None
        if self._pattern is not None:
            names = sorted(set(names) | {t for t in self._broker.topics()
                                         if self._pattern.fullmatch(t)})
        for name in names:
            self._broker.get_or_create_topic(name)        # UnknownTopicError if disabled
        was_subscribed = bool(self._subscription)
        self._subscription = sorted(set(names))
        if self._coordinator is None:
            self._set_assignment({p.topic_partition for name in self._subscription
                                  for p in self._broker.topic(name).partitions}, owned=True)
        elif was_subscribed and self._coordinator.member_id is not None:
            self._coordinator.update_subscription(self._subscription)
        else:
            self._coordinator.join(self._subscription)
            self._start_heartbeat()

    def subscription(self) -> set[str]:
        return set(self._subscription)

    def unsubscribe(self) -> None:
        self._check()
        self._leave_group()
        self._subscription = []
        self._set_assignment(set(), owned=True)

    def assign(self, partitions: Iterable[TopicPartition]) -> None:
        """Manual assignment: no group membership (commits need an empty group)."""
        self._check()
        if self._subscription:
            raise IllegalStateError("assign() after subscribe(): use one or the other")
        tps = {_as_tp(tp) for tp in partitions}
        for tp in tps:
            self._broker.topic(tp.topic).partition(tp.partition)    # validates
        self._manual = True
        self._set_assignment(tps, owned=True)

    def _set_assignment(self, tps: set[TopicPartition], *, owned: bool) -> None:
        for tp in set(self._positions) - tps:
            del self._positions[tp]
        for tp in tps:
            self._positions.setdefault(tp, None)
        self._assigned = set(tps)
        self._owned = set(tps) if owned else self._owned & tps
        self._paused &= tps
        self._buffer = [r for r in self._buffer
                        if TopicPartition(r.topic, r.partition) in self._owned]

    def assignment(self) -> set[TopicPartition]:
        return set(self._assigned)

    # ---- group protocol --------------------------------------------------------------

    def _start_heartbeat(self) -> None:
        if self._heartbeat is None:
            self._heartbeat = threading.Thread(target=self._run_heartbeat,
                                               name="logkit-heartbeat", daemon=True)
            self._heartbeat.start()

    def _run_heartbeat(self) -> None:
        interval = self.config["heartbeat_interval_ms"] / 1000
        while not self._heartbeat_stop.wait(interval):
            coordinator = self._coordinator
            if coordinator is None or coordinator.member_id is None:
                continue
            try:
                if not coordinator.heartbeat(self._last_poll_ms):
                    self._fenced = True
            except Exception as exc:
                if self._heartbeat_stop.is_set() or self._closed or self._broker.closed:
                    return               # closing under us: nothing to report
                if not isinstance(exc, LogkitError):   # a bug: said, and the thread ends
                    log.exception("the heartbeat thread of group %r stops", self._group_id)
                    raise
                # a store error: retried next interval; eviction shows on the next poll
                log.warning("heartbeat of %s in group %r failed (retried in %d ms): %s",
                            coordinator.member_id, self._group_id,
                            self.config["heartbeat_interval_ms"], exc)

    def _sync_group(self) -> None:
        """Learn a new generation: revoke, release, acquire, call back."""
        coordinator = self._coordinator
        if coordinator is None or not self._subscription:
            return
        if self._fenced or coordinator.member_id is None:
            # Evicted (session or poll timeout): our partitions may belong to others now.
            lost = set(self._owned)
            self._owned.clear()
            if lost and self._on_revoke is not None:
                self._call_listener(self._on_revoke, lost)
            self._fenced = False
            if self._closed:                   # closed from a listener: no re-join
                raise ClosedError("consumer is closed")
            coordinator.join(self._subscription)
        generation = coordinator.generation()
        if generation != self._generation:
            state = coordinator.state()
            if coordinator.member_id not in state["members"]:
                self._fenced = True            # evicted: rejoin on this same sync
                return self._sync_group()
            self._generation = state["generation"]
            new = coordinator.assignment(state)
            revoked = set(self._owned) if coordinator.is_eager(state) else self._owned - new
            revoked |= self._assigned - new - self._owned
            if revoked:
                if self._on_revoke is not None:
                    self._call_listener(self._on_revoke, revoked)
                if self.config["enable_auto_commit"]:
                    self._commit_quietly(revoked & self._owned)
                coordinator.release(revoked & self._owned)
                self._owned -= revoked
                for tp in revoked:
                    self._positions.pop(tp, None)
            added = new - self._assigned if not coordinator.is_eager(state) else new
            self._set_assignment(new, owned=False)
            if added and self._on_assign is not None:
                self._call_listener(self._on_assign, added)
        pending = self._assigned - self._owned
        if pending:
            taken = coordinator.acquire(pending)
            for tp in taken:
                self._positions[tp] = self._positions.get(tp)
            self._owned |= taken

    def _call_listener(self, listener: Callable, tps: set[TopicPartition]) -> None:
        """Run a rebalance listener; its exception is kept for poll() to raise once the
        rebalance is complete (released, acquired), not raised in the middle of it."""
        try:
            listener(sorted(tps))
        except Exception as exc:
            self._listener_errors.append(exc)

    def _raise_listener_error(self) -> None:
        errors, self._listener_errors = self._listener_errors, []
        if errors:
            raise errors[0]

    def _commit_quietly(self, tps: set[TopicPartition]) -> None:
        offsets = {tp: OffsetAndMetadata(self._positions[tp]) for tp in tps
                   if self._positions.get(tp) is not None}
        if offsets and self._coordinator is not None:
            try:
                self._coordinator.commit(offsets, member_id=self._coordinator.member_id)
            except CommitFailedError as exc:   # fenced meanwhile: the next owner resumes
                log.info("auto-commit in group %r refused: %s", self._group_id, exc)
            except LogkitError as exc:         # best effort, as Kafka's auto-commit is
                log.warning("auto-commit in group %r failed: %s", self._group_id, exc)

    def _leave_group(self) -> None:
        if self._coordinator is not None and self._coordinator.member_id is not None:
            if self.config["enable_auto_commit"]:
                self._commit_quietly(set(self._owned))
            self._coordinator.leave()

    # ---- positions -------------------------------------------------------------------

    def _partition(self, tp: TopicPartition) -> Any:
        return self._broker.topic(tp.topic).partition(tp.partition)

    def _reset(self, tp: TopicPartition) -> int:
        policy = self.config["auto_offset_reset"]
        partition = self._partition(tp)
        if policy == "earliest":
            return partition.log_start_offset
        if policy == "latest":
            return partition.high_watermark
        raise NoOffsetForPartitionError(
            f"no valid offset for {tp.topic}-{tp.partition} and auto_offset_reset='none'")

    def _resolve(self, tp: TopicPartition) -> int:
        position = self._positions.get(tp)
        if position is None:
            if self._group_id is not None:
                position = committed_offset(self._broker.meta, self._group_id, tp)
                if position is not None:
                    partition = self._partition(tp)
                    if not partition.log_start_offset <= position <= partition.high_watermark:
                        position = None
            if position is None:
                position = self._reset(tp)
            self._positions[tp] = position
        return position

    def _require_assigned(self, tp: TopicPartition) -> TopicPartition:
        tp = _as_tp(tp)
        if tp not in self._assigned:
            raise IllegalStateError(f"{tp.topic}-{tp.partition} is not assigned to this "
                                    "consumer")
        return tp

    def position(self, tp: TopicPartition) -> int:
        self._check()
        return self._resolve(self._require_assigned(tp))

    def seek(self, tp: TopicPartition, offset: int) -> None:
        self._check()
        tp = self._require_assigned(tp)
        self._positions[tp] = _check_offset(offset)
        self._drop_buffered(tp)

    def seek_to_beginning(self, *tps: TopicPartition) -> None:
        """Every given (default: assigned) partition to its log start offset."""
        for tp in (tps or tuple(self._assigned)):
            tp = self._require_assigned(tp)
            self.seek(tp, self._partition(tp).log_start_offset)

    def seek_to_end(self, *tps: TopicPartition) -> None:
        """Every given (default: assigned) partition to its high watermark."""
        for tp in (tps or tuple(self._assigned)):
            tp = self._require_assigned(tp)
            self.seek(tp, self._partition(tp).high_watermark)

    def _drop_buffered(self, tp: TopicPartition) -> None:
        if self._buffer:
            self._buffer = [r for r in self._buffer
                            if (r.topic, r.partition) != (tp.topic, tp.partition)]

    def pause(self, *tps: TopicPartition) -> None:
        self._check()
        for tp in tps:
            tp = self._require_assigned(tp)
            self._paused.add(tp)
            self._drop_buffered(tp)

    def resume(self, *tps: TopicPartition) -> None:
        self._check()
        for tp in tps:
            self._paused.discard(_as_tp(tp))

    def paused(self) -> set[TopicPartition]:
        return set(self._paused)

    def beginning_offsets(self, tps: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        return {_as_tp(tp): self._partition(_as_tp(tp)).log_start_offset for tp in tps}

    def end_offsets(self, tps: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        return {_as_tp(tp): self._partition(_as_tp(tp)).high_watermark for tp in tps}

    def offsets_for_times(self, timestamps: Mapping[TopicPartition, int]
                          ) -> dict[TopicPartition, OffsetAndTimestamp | None]:
        """Earliest offset at or after each timestamp (None if there is none)."""
        self._check()
        out: dict[TopicPartition, OffsetAndTimestamp | None] = {}
        for tp, ts in timestamps.items():
            tp = _as_tp(tp)
            partition = self._partition(tp)
            offset = partition.offset_for_timestamp(ts)
            if offset is None:
                out[tp] = None
            else:
                record = partition.read(offset, max_records=1)[0]
                out[tp] = OffsetAndTimestamp(offset, record.timestamp)
        return out

    # ---- commits ---------------------------------------------------------------------

    def committed(self, tp: TopicPartition) -> int | None:
        self._check()
        if self._group_id is None:
            return None
        return committed_offset(self._broker.meta, self._group_id, _as_tp(tp))

    def commit(self, offsets: Mapping[TopicPartition, Any] | None = None) -> None:
        """Commit offsets (next offsets to read) — current positions by default."""
        self._check()
        if self._coordinator is None:
            raise IllegalStateError("commit() needs a group_id")
        if offsets is None:
            offsets = {tp: self._positions[tp] for tp in self._owned
                       if self._positions.get(tp) is not None}
        clean: dict[TopicPartition, OffsetAndMetadata] = {}
        for tp, value in offsets.items():
            tp = _as_tp(tp)
            if isinstance(value, tuple):
                value = OffsetAndMetadata(_check_offset(value[0]),
                                          value[1] if len(value) > 1 else "")
            else:
                value = OffsetAndMetadata(_check_offset(value))
            clean[tp] = value
        # No rejoin here: a zombie's commit must fail (CommitFailedError), not succeed
        # under a fresh membership. The next poll() rejoins.
        member = None if self._manual else self._coordinator.member_id
        if not self._manual and member is None:
            raise CommitFailedError("this consumer is not a member of its group")
        self._coordinator.commit(clean, member_id=member)
        self._last_commit = time.monotonic()

    def _maybe_auto_commit(self) -> None:
        if self.config["enable_auto_commit"] and self._coordinator is not None and \
                time.monotonic() - self._last_commit >= \
                self.config["auto_commit_interval_ms"] / 1000:
            self._last_commit = time.monotonic()
            if self._manual:
                try:
                    self.commit()
                except CommitFailedError as exc:   # a busy group: try next interval
                    log.debug("auto-commit in group %r refused: %s", self._group_id, exc)
                except LogkitError as exc:         # best effort, as Kafka's auto-commit is
                    log.warning("auto-commit in group %r failed: %s", self._group_id, exc)
            else:
                self._commit_quietly(set(self._owned))

    # ---- fetching --------------------------------------------------------------------

    def poll(self, timeout_ms: int = 0, max_records: int | None = None) -> list[Record]:
        """Records from the assigned partitions; blocks up to timeout_ms for data
        (appended by any process). timeout_ms=0 returns at once."""
        self._check()
        if not self._subscription and not self._manual and self._pattern is None:
            raise IllegalStateError("poll() needs subscribe() or assign() first")
        if max_records is None:
            max_records = self.config["max_poll_records"]
        if isinstance(max_records, bool) or not isinstance(max_records, int) \
                or max_records <= 0:
            raise ConfigError(f"max_records must be a positive integer, got {max_records!r}")
        deadline = time.monotonic() + max(timeout_ms, 0) / 1000
        doorbell = self._broker.doorbell
        while True:
            with self._lock:
                # close() (from another thread, or the broker's) ends the poll here:
                # before the step that would otherwise re-join the group.
                if self._closed or self._broker.closed:
                    raise ClosedError("consumer closed during poll()" if self._closed
                                      else "broker closed during poll()")
                self._last_poll_ms = int(time.time() * 1000)
                seen = 0 if doorbell is None else doorbell.value()
                self._sync_group()
                self._raise_listener_error()      # after the rebalance is complete
                records = self._fetch(max_records)
                if records:
                    self._maybe_auto_commit()
                    return records
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    self._maybe_auto_commit()
                    return []
            if doorbell is None:                   # a read-only broker: nobody rings
                time.sleep(min(remaining, 0.005))
            else:
                doorbell.wait(seen, remaining)

    def _fetch(self, max_records: int) -> list[Record]:
        if self._buffer:
            out, self._buffer = self._buffer[:max_records], self._buffer[max_records:]
            return out
        fetchable = [tp for tp in sorted(self._owned) if tp not in self._paused]
        if not fetchable:
            return []
        self._rotation = (self._rotation + 1) % len(fetchable)
        order = fetchable[self._rotation:] + fetchable[:self._rotation]
        out: list[Record] = []
        budget = self.config["fetch_max_bytes"]
        per_partition = self.config["max_partition_fetch_bytes"]
        for tp in order:
            position = self._resolve(tp)
            partition = self._partition(tp)
            try:
                records = partition.read(position, max_records=max_records - len(out),
                                         max_bytes=min(per_partition, budget))
            except OffsetOutOfRangeError:
                self._positions[tp] = self._reset(tp)     # retention passed us (Kafka)
                continue
            except OSError as exc:                        # the log names its own; a stray
                if isinstance(exc, LogkitError):          # (LogkitTimeoutError is an OSError)
                    raise
                raise storage_error(exc, "fetch", partition.directory) from exc
            if records:
                self._positions[tp] = records[-1].offset + 1
                out.extend(records)
                budget -= sum(len(r.value or b"") for r in records)
                if len(out) >= max_records or budget <= 0:
                    break
        if self._key_deserializer is not None or self._value_deserializer is not None:
            out = [self._deserialize(r) for r in out]
        return out

    def _deserialize(self, record: Record) -> Record:
        key, value = record.key, record.value
        if self._key_deserializer is not None and key is not None:
            key = self._key_deserializer(key)
        if self._value_deserializer is not None and value is not None:
            value = self._value_deserializer(value)
        return record._replace(key=key, value=value)

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
        self._heartbeat_stop.set()
        try:
            with self._lock:               # wait out that step: it may be mid-rebalance
                if autocommit:
                    self._leave_group()
                elif self._coordinator is not None:
                    self._coordinator.leave()
        except ClosedError:
            pass
        finally:
            if self._heartbeat is not None and self._heartbeat is not threading.current_thread():
                self._heartbeat.join(timeout=10)

    def __enter__(self) -> "Consumer":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
