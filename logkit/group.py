"""Consumer groups coordinated through LMDB, so members in different processes form
one group.

Owns: the group record in the `groups` sub-database and committed offsets in `offsets`.
One group record holds the generation, the chosen assignor, the members (id,
subscription, last heartbeat, last poll, timeouts), the assignment computed for the
current generation, and `owners`: which member currently holds each partition.

The protocol (DESIGN §7): any member that sees a join, a leave or an expired member
(`session.timeout.ms` without a heartbeat, or `max.poll.interval.ms` without a poll)
bumps the generation and recomputes the assignment, in one write transaction. Members
learn the new generation on their next poll or heartbeat. A member releases a partition
(after `on_revoke`, which commits) before another may acquire it; a partition whose
owner left or was evicted is free at once. So a partition has at most one owner at a
time, and members fetch only partitions they own.

Fencing: a commit is accepted only from a live member that owns the partition it
commits, or — for consumers with manual assignment — while the group has no members.
Anything else raises `CommitFailedError`.

Thread-safety: each method runs in one LMDB transaction; any thread may call them.
"""

from __future__ import annotations

import os
import socket
import time
import uuid
from typing import Any, Iterable, Mapping, NamedTuple

from .assignors import ASSIGNORS, EAGER, assign
from .errors import CommitFailedError, ConfigError, IllegalStateError, UnknownTopicError
from .meta import decode, encode
from .topic import TopicPartition

__all__ = ["GroupCoordinator", "ConsumerGroup", "MemberInfo", "OffsetAndMetadata"]


class OffsetAndMetadata(NamedTuple):
    offset: int
    metadata: str = ""


class MemberInfo(NamedTuple):
    member_id: str
    client_id: str
    topics: list[str]
    assignment: list[TopicPartition]
    heartbeat_ms: int
    pid: int
    host: str


def _now_ms() -> int:
    return int(time.time() * 1000)


def _tp_key(topic: str, partition: int) -> str:
    return f"{topic}/{partition}"          # '/' cannot appear in a topic name


def offset_key(group_id: str, topic: str, partition: int) -> bytes:
    return f"{group_id}\0{topic}\0{partition}".encode()


def _empty_state(strategy: str) -> dict[str, Any]:
    return {"generation": 0, "protocol": strategy, "members": {}, "assignment": {},
            "owners": {}}


class GroupCoordinator:
    """The group-side operations of one member (used by Consumer)."""

    def __init__(self, broker: Any, group_id: str, *, strategy: str,
                 session_timeout_ms: int, max_poll_interval_ms: int, client_id: str) -> None:
        if strategy not in ASSIGNORS:
            raise ConfigError(f"unknown partition_assignment_strategy {strategy!r}; use one "
                              f"of {sorted(ASSIGNORS)}")
        self.broker = broker
        self.meta = broker.meta
        self.group_id = group_id
        self.strategy = strategy
        self.session_timeout_ms = session_timeout_ms
        self.max_poll_interval_ms = max_poll_interval_ms
        self.client_id = client_id
        self.member_id: str | None = None
        self._key = group_id.encode()
        self._gen_key = b"gen\0" + self._key

    # ---- state -----------------------------------------------------------------------

    def _load(self, txn: Any) -> dict[str, Any]:
        raw = txn.get(self._key, db=self.meta.db("groups"))
        return decode(raw) if raw is not None else _empty_state(self.strategy)

    def _store(self, txn: Any, state: dict[str, Any]) -> None:
        txn.put(self._key, encode(state), db=self.meta.db("groups"))
        txn.put(self._gen_key, str(state["generation"]).encode(), db=self.meta.db("groups"))

    def generation(self) -> int:
        """The current generation; a cheap read (one small key)."""
        with self.meta.begin() as txn:
            raw = txn.get(self._gen_key, db=self.meta.db("groups"))
        return int(raw) if raw is not None else 0

    def state(self) -> dict[str, Any]:
        with self.meta.begin() as txn:
            return self._load(txn)

    def _partition_counts(self, txn: Any, topics: Iterable[str]) -> dict[str, int]:
        counts = {}
        for topic in set(topics):
            raw = txn.get(topic.encode(), db=self.meta.db("topics"))
            if raw is not None:
                counts[topic] = decode(raw)["partitions"]
        return counts

    def _rebalance(self, txn: Any, state: dict[str, Any]) -> None:
        members = {m: info["topics"] for m, info in state["members"].items()}
        if not members:
            state["protocol"] = self.strategy
        previous = state["assignment"]
        counts = self._partition_counts(txn, (t for ts in members.values() for t in ts))
        state["generation"] += 1
        state["assignment"] = {m: [list(tp) for tp in tps] for m, tps in assign(
            state["protocol"], members, counts,
            {m: [tuple(tp) for tp in tps] for m, tps in previous.items()}).items()}

    def _evict_expired(self, state: dict[str, Any], now: int) -> bool:
        doomed = [m for m, info in state["members"].items()
                  if now - info["heartbeat_ms"] > info["session_timeout_ms"]
                  or now - info["poll_ms"] > info["max_poll_interval_ms"]]
        for member in doomed:
            self._drop(state, member)
        return bool(doomed)

    @staticmethod
    def _drop(state: dict[str, Any], member: str) -> None:
        state["members"].pop(member, None)
        state["assignment"].pop(member, None)
        state["owners"] = {tp: m for tp, m in state["owners"].items() if m != member}

    # ---- membership ------------------------------------------------------------------

    def join(self, topics: list[str]) -> None:
        """Become a member subscribed to `topics` (a new member id) and rebalance."""
        now = _now_ms()
        self.member_id = f"{self.client_id}-{uuid.uuid4().hex[:12]}"
        with self.meta.begin(write=True) as txn:
            state = self._load(txn)
            self._evict_expired(state, now)
            state["members"][self.member_id] = {
                "client_id": self.client_id, "topics": sorted(topics), "heartbeat_ms": now,
                "poll_ms": now, "session_timeout_ms": self.session_timeout_ms,
                "max_poll_interval_ms": self.max_poll_interval_ms, "pid": os.getpid(),
                "host": socket.gethostname()}
            self._rebalance(txn, state)
            self._store(txn, state)

    def update_subscription(self, topics: list[str]) -> None:
        with self.meta.begin(write=True) as txn:
            state = self._load(txn)
            info = state["members"].get(self.member_id)
            if info is None:
                return
            info["topics"] = sorted(topics)
            self._rebalance(txn, state)
            self._store(txn, state)

    def leave(self) -> None:
        if self.member_id is None:
            return
        with self.meta.begin(write=True) as txn:
            state = self._load(txn)
            if self.member_id in state["members"]:
                self._drop(state, self.member_id)
                self._evict_expired(state, _now_ms())
                self._rebalance(txn, state)
                self._store(txn, state)
        self.member_id = None

    def heartbeat(self, last_poll_ms: int) -> bool:
        """Refresh this member; evict expired members. False if this member is gone."""
        now = _now_ms()
        with self.meta.begin(write=True) as txn:
            state = self._load(txn)
            info = state["members"].get(self.member_id)
            if info is None:
                return False
            info["heartbeat_ms"] = now
            info["poll_ms"] = max(info["poll_ms"], last_poll_ms)
            if self._evict_expired(state, now):
                if self.member_id not in state["members"]:
                    self._rebalance(txn, state)
                    self._store(txn, state)
                    return False
                self._rebalance(txn, state)
            self._store(txn, state)
            return True

    def assignment(self, state: Mapping[str, Any]) -> set[TopicPartition]:
        return {TopicPartition(t, p) for t, p in state["assignment"].get(self.member_id, [])}

    def is_eager(self, state: Mapping[str, Any]) -> bool:
        return EAGER[state["protocol"]]

    # ---- ownership -------------------------------------------------------------------

    def acquire(self, wanted: Iterable[TopicPartition]) -> set[TopicPartition]:
        """Take ownership of the wanted partitions that are free; returns those taken."""
        wanted = list(wanted)
        if not wanted:
            return set()
        taken = set()
        with self.meta.begin(write=True) as txn:
            state = self._load(txn)
            if self.member_id not in state["members"]:
                return set()
            mine = self.assignment(state)
            owners = state["owners"]
            for tp in wanted:
                key = _tp_key(*tp)
                owner = owners.get(key)
                if tp in mine and (owner is None or owner == self.member_id
                                   or owner not in state["members"]):
                    owners[key] = self.member_id
                    taken.add(tp)
            if taken:
                self._store(txn, state)
        return taken

    def release(self, partitions: Iterable[TopicPartition]) -> None:
        partitions = list(partitions)
        if not partitions:
            return
        with self.meta.begin(write=True) as txn:
            state = self._load(txn)
            owners = state["owners"]
            for tp in partitions:
                if owners.get(_tp_key(*tp)) == self.member_id:
                    del owners[_tp_key(*tp)]
            self._store(txn, state)

    # ---- offsets ---------------------------------------------------------------------

    def commit(self, offsets: Mapping[TopicPartition, OffsetAndMetadata],
               *, member_id: str | None) -> None:
        """Store offsets atomically, fenced as described in the module docstring."""
        now = _now_ms()
        with self.meta.begin(write=True) as txn:
            state = self._load(txn)
            if member_id is None:
                if state["members"]:
                    raise CommitFailedError(
                        f"group {self.group_id!r} has active members; a consumer with "
                        "manual assignment may commit only to an empty group")
            else:
                if member_id not in state["members"]:
                    raise CommitFailedError(
                        f"member {member_id} is no longer in group {self.group_id!r} "
                        f"(generation {state['generation']}): it was evicted or left; "
                        "its partitions may already belong to another member")
                owners = state["owners"]
                for tp in offsets:
                    if owners.get(_tp_key(*tp)) != member_id:
                        raise CommitFailedError(
                            f"{tp.topic}-{tp.partition} is not assigned to member "
                            f"{member_id} in generation {state['generation']}")
            db = self.meta.db("offsets")
            for tp, om in offsets.items():
                txn.put(offset_key(self.group_id, tp.topic, tp.partition),
                        encode({"offset": om.offset, "metadata": om.metadata,
                                "commit_ms": now}), db=db)


def committed_offsets(meta: Any, group_id: str) -> dict[TopicPartition, OffsetAndMetadata]:
    out = {}
    for key, value in meta.items("offsets", group_id.encode() + b"\0"):
        _, topic, partition = key.decode().split("\0")
        out[TopicPartition(topic, int(partition))] = OffsetAndMetadata(value["offset"],
                                                                       value["metadata"])
    return out


def committed_offset(meta: Any, group_id: str, tp: TopicPartition) -> int | None:
    with meta.begin() as txn:
        raw = txn.get(offset_key(group_id, tp.topic, tp.partition), db=meta.db("offsets"))
    return None if raw is None else decode(raw)["offset"]


class ConsumerGroup:
    """`broker.group("billing")`: inspect and administer a consumer group."""

    def __init__(self, broker: Any, group_id: str) -> None:
        if not isinstance(group_id, str) or not group_id or "\0" in group_id:
            raise ConfigError(f"invalid group id {group_id!r}")
        self._broker = broker
        self.group_id = group_id
        self._coordinator = GroupCoordinator(broker, group_id, strategy="range",
                                             session_timeout_ms=0, max_poll_interval_ms=0,
                                             client_id="admin")

    def __repr__(self) -> str:
        return f"ConsumerGroup({self.group_id!r})"

    @property
    def generation(self) -> int:
        return self._coordinator.generation()

    def members(self) -> list[MemberInfo]:
        state = self._coordinator.state()
        return [MemberInfo(m, info["client_id"], info["topics"],
                           sorted(TopicPartition(t, p)
                                  for t, p in state["assignment"].get(m, [])),
                           info["heartbeat_ms"], info["pid"], info["host"])
                for m, info in sorted(state["members"].items())]

    def committed(self) -> dict[TopicPartition, int]:
        return {tp: om.offset for tp, om in
                committed_offsets(self._broker.meta, self.group_id).items()}

    def lag(self) -> dict[TopicPartition, int]:
        """Records between each committed offset and its partition's high watermark."""
        out = {}
        for tp, offset in self.committed().items():
            try:
                hw = self._broker.topic(tp.topic).partition(tp.partition).high_watermark
            except UnknownTopicError:
                continue
            out[tp] = max(0, hw - offset)
        return out

    def _require_empty(self, action: str) -> None:
        live = [m for m, info in self._coordinator.state()["members"].items()
                if _now_ms() - info["heartbeat_ms"] <= info["session_timeout_ms"]]
        if live:
            raise IllegalStateError(f"cannot {action} group {self.group_id!r} while it has "
                                    f"{len(live)} active member(s); stop them first")

    def reset_offsets(self, to: Any, *, topics: Iterable[str] | None = None) -> dict:
        """Set committed offsets to "earliest", "latest", or {TopicPartition: offset}.
        Like Kafka's kafka-consumer-groups --reset-offsets: only with no active members.
        Without `topics`, resets every topic the group has committed offsets for."""
        self._require_empty("reset offsets of")
        if isinstance(to, Mapping):
            target = {TopicPartition(*tp): int(o) for tp, o in to.items()}
        elif to in ("earliest", "latest"):
            names = set(topics) if topics is not None else \
                {tp.topic for tp in self.committed()}
            target = {}
            for name in names:
                topic = self._broker.topic(name)
                for p in topic.partitions:
                    target[p.topic_partition] = (p.log_start_offset if to == "earliest"
                                                 else p.high_watermark)
        else:
            raise ConfigError(f"reset_offsets takes 'earliest', 'latest' or a dict, got {to!r}")
        self._coordinator.commit({tp: OffsetAndMetadata(o) for tp, o in target.items()},
                                 member_id=None)
        return target

    def delete(self) -> None:
        """Remove the group and its committed offsets (no active members allowed)."""
        self._require_empty("delete")
        meta = self._broker.meta
        keys = [k for k, _ in meta.items("offsets", self.group_id.encode() + b"\0")]
        with meta.begin(write=True) as txn:
            for key in keys:
                txn.delete(key, db=meta.db("offsets"))
            txn.delete(self.group_id.encode(), db=meta.db("groups"))
            txn.delete(b"gen\0" + self.group_id.encode(), db=meta.db("groups"))

    def streams(self, topic_counts: Mapping[str, int], **options: Any) -> dict[str, list]:
        """{"topic": n} -> {"topic": [n consumers]}: each an iterator over a disjoint
        share of the topic's partitions (the classic high-level consumer API)."""
        out: dict[str, list] = {}
        for topic, count in topic_counts.items():
            if isinstance(count, bool) or not isinstance(count, int) or count < 1:
                raise ConfigError(f"stream count for {topic!r} must be a positive integer")
            out[topic] = [self._broker.consumer(topic, group_id=self.group_id, **options)
                          for _ in range(count)]
        return out
