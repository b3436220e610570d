"""Consumer groups coordinated through LMDB, so members in different processes form
one group.

Owns: the group record in the `groups` sub-database and committed offsets in `offsets`.
One group record holds the generation, the chosen assignor, the members (id,
subscription, last heartbeat, last poll, timeouts), the assignment computed for the
current generation, and `owners`: which member currently holds each partition.

The protocol (docs/design.md §7): any member that sees a join, a leave or an expired member
(`session.timeout.ms` without a heartbeat, or `max.poll.interval.ms` without a poll)
bumps the generation and recomputes the assignment, in one write transaction. Members
learn the new generation on their next poll or heartbeat. A member releases a partition
(after `on_revoke`, which commits) before another may acquire it; a partition whose
owner left or was evicted is free at once. So a partition has at most one owner at a
time, and members fetch only partitions they own.

Fencing: a commit is accepted only from a live member that owns the partition it
commits, or — for consumers with manual assignment and offset resets — while the group
has no live members (a member past its session timeout or max.poll.interval.ms counts
as gone even before another member evicts it). Anything else raises
`CommitFailedError`, naming the members it found.

Limits, checked before LMDB sees a key or value: a group id is 1..`MAX_GROUP_ID_BYTES`
UTF-8 bytes (so every offset key fits LMDB's 511-byte key limit), a client id (and so a
member id) at most `MAX_CLIENT_ID_CHARS`, commit metadata at most
`offset.metadata.max.bytes` (Kafka's OFFSET_METADATA_TOO_LARGE).

Thread-safety: each method runs in one LMDB transaction (`meta.read`/`meta.write`, which
retry after a repair, so the functions they run start from what they read); any thread
may call them.
"""

from __future__ import annotations

import logging
import os
import socket
import time
import uuid
from typing import Any, Iterable, Mapping, NamedTuple, Protocol

from .assignors import ASSIGNORS, EAGER, assign
from .errors import (ClosedError, CommitFailedError, ConfigError, IllegalStateError,
                     InvalidTopicError, UnknownTopicError)
from .meta import MAX_KEY_BYTES, MetaStore, decode
from .records import Record
from .topic import MAX_PARTITIONS, TopicPartition


class BrokerView(Protocol):
    """What a group uses of the broker it belongs to (the broker sits above this module,
    so the contract is written here): its metadata store, its settings, its topics,
    its groups and the consumers `streams()` makes."""

    meta: MetaStore
    config: Mapping[str, Any]

    def topic(self, name: str) -> Any: ...
    def group(self, group_id: str) -> Any: ...
    def consumer(self, *topics: str, **options: Any) -> Any: ...


__all__ = ["GroupCoordinator", "ConsumerGroup", "MemberInfo", "OffsetAndMetadata",
           "OffsetMetadataTooLargeError", "validate_group_id", "MAX_GROUP_ID_BYTES",
           "list_groups", "live_members", "check_transactional_member"]

log = logging.getLogger(__name__)

MAX_TOPIC_NAME_BYTES = 249                 # Kafka's topic name rule (topic.py)
MAX_GROUP_ID_BYTES = 249                   # like a topic name, so an offset key fits:
assert MAX_GROUP_ID_BYTES + 1 + MAX_TOPIC_NAME_BYTES + 1 \
    + len(str(MAX_PARTITIONS - 1)) <= MAX_KEY_BYTES
MAX_CLIENT_ID_CHARS = 255                  # a member id is client id + 13 characters
READ_COMMITTED, READ_UNCOMMITTED = "read_committed", "read_uncommitted"


class OffsetMetadataTooLargeError(ConfigError):
    """Commit metadata longer than `offset.metadata.max.bytes` (Kafka's
    OFFSET_METADATA_TOO_LARGE). Nothing of that commit is stored."""


def validate_group_id(group_id: Any) -> str:
    """Return `group_id`, or raise ConfigError: a non-empty str without NUL of at most
    MAX_GROUP_ID_BYTES UTF-8 bytes."""
    if not isinstance(group_id, str) or not group_id or "\0" in group_id:
        raise ConfigError(f"invalid group id {group_id!r}")
    try:
        size = len(group_id.encode())
    except UnicodeEncodeError:
        raise ConfigError(f"group id {group_id!r} is not valid Unicode text") from None
    if size > MAX_GROUP_ID_BYTES:
        raise ConfigError(f"group id {group_id[:40]!r}... is {size} bytes; the limit is "
                          f"{MAX_GROUP_ID_BYTES}")
    return group_id


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


def _expired(info: Mapping[str, Any], now: int) -> bool:
    """A member past `session.timeout.ms` without a heartbeat or `max.poll.interval.ms`
    without a poll: gone, whether or not a live member has evicted it yet."""
    return now - info["heartbeat_ms"] > info["session_timeout_ms"] \
        or now - info["poll_ms"] > info["max_poll_interval_ms"]


def live_members(state: Mapping[str, Any], now: int | None = None) -> dict[str, Any]:
    """The members of a group state that are not past their timeouts."""
    now = _now_ms() if now is None else now
    return {m: info for m, info in state["members"].items() if not _expired(info, now)}


def describe_members(members: Mapping[str, Any], now: int | None = None) -> str:
    """'id (pid 12 on host, last heartbeat 250 ms ago), ...' for error messages."""
    now = _now_ms() if now is None else now
    shown = [f"{m} (pid {info['pid']} on {info['host']}, last heartbeat "
             f"{now - info['heartbeat_ms']} ms ago, session.timeout.ms "
             f"{info['session_timeout_ms']})" for m, info in sorted(members.items())[:3]]
    if len(members) > 3:
        shown.append(f"and {len(members) - 3} more")
    return ", ".join(shown)


def _live_wire(txn: Any, meta: Any, group_id: str) -> dict[str, Any]:
    """The live members a Kafka protocol listener keeps for this group in the `members`
    database (logkit/protocol/groups.py writes it); those past their session timeout are
    left out (a killed listener's members)."""
    raw = txn.get(group_id.encode(), db=meta.db("members"))
    if raw is None:
        return {}
    now = _now_ms()
    return {m: info for m, info in decode(raw)["members"].items()
            if now - info["heartbeat_ms"] <= info["session_timeout_ms"]}


def wire_members(meta: Any, group_id: str) -> list[MemberInfo]:
    """The group's live members connected through the Kafka protocol listener."""
    live = meta.read(lambda txn: _live_wire(txn, meta, group_id),
                     operation=f"read the wire members of group {group_id!r}")
    return [MemberInfo(m, info["client_id"], info["topics"],
                       sorted(TopicPartition(t, p) for t, p in info["assignment"]),
                       info["heartbeat_ms"], info["pid"], info["host"])
            for m, info in sorted(live.items())]


def _tp_key(topic: str, partition: int) -> str:
    return f"{topic}/{partition}"          # '/' cannot appear in a topic name


def offset_key(group_id: str, topic: str, partition: int) -> bytes:
    return f"{group_id}\0{topic}\0{partition}".encode()


def _empty_state(strategy: str) -> dict[str, Any]:
    return {"generation": 0, "protocol": strategy, "members": {}, "assignment": {},
            "owners": {}}


def _partition_counts(meta: Any, txn: Any, topics: Iterable[str]) -> dict[str, int]:
    counts = {}
    for topic in set(topics):
        raw = txn.get(topic.encode(), db=meta.db("topics"))
        if raw is not None:
            counts[topic] = decode(raw)["partitions"]
    return counts


def _reassign(meta: Any, txn: Any, group_id: str, state: dict[str, Any]) -> None:
    """A new generation of `state`: the assignment recomputed by the group's assignor
    over the partition counts in the topic records as `txn` sees them."""
    members = {m: info["topics"] for m, info in state["members"].items()}
    previous = state["assignment"]
    counts = _partition_counts(meta, txn, (t for ts in members.values() for t in ts))
    state["generation"] += 1
    state["assignment"] = {m: [list(tp) for tp in tps] for m, tps in assign(
        state["protocol"], members, counts,
        {m: [tuple(tp) for tp in tps] for m, tps in previous.items()}).items()}
    log.debug("group %s: generation %d, %d member(s), %s assignment", group_id,
              state["generation"], len(members), state["protocol"])


def rebalance_subscribers(meta: Any, txn: Any, topic: str) -> list[str]:
    """Inside the write transaction that grows `topic` (Broker.create_partitions):
    every group with a member subscribed to it moves to a new generation whose
    assignment covers the new partitions, as Kafka's group leader rebalances when
    metadata shows more partitions. Members learn it on their next poll, as any
    rebalance; a new partition has no owner and no commit, so its first owner starts
    per its auto_offset_reset. Returns the group ids rebalanced.

    Groups of wire members (the Kafka protocol listener) are the clients' own to
    rebalance: their leader sees the count in a Metadata answer and re-joins."""
    rebalanced = []
    for key, raw in list(txn.cursor(db=meta.db("groups"))):
        if b"\0" in key:                    # b"gen\0<id>": the generation copy
            continue
        state = decode(raw)
        if any(topic in info["topics"] for info in state["members"].values()):
            group_id = key.decode()
            _reassign(meta, txn, group_id, state)
            meta.put(txn, "groups", key, state)
            meta.put(txn, "groups", b"gen\0" + key, state["generation"])
            rebalanced.append(group_id)
    return rebalanced


class GroupCoordinator:
    """The group-side operations of one member (used by Consumer)."""

    def __init__(self, broker: BrokerView, group_id: str, *, strategy: str,
                 session_timeout_ms: int, max_poll_interval_ms: int, client_id: str) -> None:
        if strategy not in ASSIGNORS:
            raise ConfigError(f"unknown partition_assignment_strategy {strategy!r}; use one "
                              f"of {sorted(ASSIGNORS)}")
        validate_group_id(group_id)
        if not isinstance(client_id, str) or len(client_id) > MAX_CLIENT_ID_CHARS:
            raise ConfigError(f"client_id must be a string of at most "
                              f"{MAX_CLIENT_ID_CHARS} characters, got {client_id!r:.60}")
        self.broker = broker
        self.meta = broker.meta
        self.group_id = group_id
        self.strategy = strategy
        self.session_timeout_ms = session_timeout_ms
        self.max_poll_interval_ms = max_poll_interval_ms
        self.client_id = client_id
        self.member_id: str | None = None
        # the member's consumer reads read_committed: lag() then stops at the LSO
        self.isolation_level = READ_UNCOMMITTED
        self._key = group_id.encode()
        self._gen_key = b"gen\0" + self._key
        self._rebalances = 0              # grows in every write that rebalances

    # ---- state -----------------------------------------------------------------------

    def _load(self, txn: Any) -> dict[str, Any]:
        raw = txn.get(self._key, db=self.meta.db("groups"))
        return decode(raw) if raw is not None else _empty_state(self.strategy)

    def _store(self, txn: Any, state: dict[str, Any]) -> None:
        self.meta.put(txn, "groups", self._key, state)
        self.meta.put(txn, "groups", self._gen_key, state["generation"])

    def _read(self, body: Any, what: str) -> Any:
        return self.meta.read(body, operation=f"{what} of group {self.group_id!r}")

    def _write(self, body: Any, what: str) -> Any:
        """`body` in a write transaction; a rebalance in it is announced on the
        doorbell once committed (members poll the generation only when it moves)."""
        before = self._rebalances
        result = self.meta.write(body, operation=f"{what} in group {self.group_id!r}")
        if self._rebalances != before:
            doorbell = getattr(self.broker, "doorbell", None)
            if doorbell is not None:
                doorbell.groups_changed()
        return result

    def generation(self) -> int:
        """The current generation; a cheap read (one small key)."""
        raw = self._read(lambda txn: txn.get(self._gen_key, db=self.meta.db("groups")),
                         "read the generation")
        return int(raw) if raw is not None else 0

    def state(self) -> dict[str, Any]:
        return self._read(self._load, "read the state")

    def _rebalance(self, txn: Any, state: dict[str, Any]) -> None:
        self._rebalances += 1             # announced by _write after the commit
        if not state["members"]:
            state["protocol"] = self.strategy
        _reassign(self.meta, txn, self.group_id, state)

    def _evict_expired(self, state: dict[str, Any], now: int) -> bool:
        doomed = [m for m, info in state["members"].items() if _expired(info, now)]
        for member in doomed:
            info = state["members"][member]
            log.warning("group %s: evicting member %s (last heartbeat %d ms ago, "
                        "session.timeout.ms %d; last poll %d ms ago, "
                        "max.poll.interval.ms %d)", self.group_id, member,
                        now - info["heartbeat_ms"], info["session_timeout_ms"],
                        now - info["poll_ms"], info["max_poll_interval_ms"])
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
        member_id = self.member_id = f"{self.client_id}-{uuid.uuid4().hex[:12]}"

        def join(txn: Any) -> None:
            wire = _live_wire(txn, self.meta, self.group_id)
            if wire:
                raise IllegalStateError(
                    f"group {self.group_id!r} has {len(wire)} live member(s) connected "
                    "through the Kafka protocol listener; an embedded consumer cannot "
                    "join it until they leave (use another group id)")
            state = self._load(txn)
            self._evict_expired(state, now)
            state["members"][member_id] = {
                "client_id": self.client_id, "topics": sorted(topics), "heartbeat_ms": now,
                "poll_ms": now, "session_timeout_ms": self.session_timeout_ms,
                "max_poll_interval_ms": self.max_poll_interval_ms, "pid": os.getpid(),
                "host": socket.gethostname()}
            if self.isolation_level != READ_UNCOMMITTED:
                state["members"][member_id]["isolation_level"] = self.isolation_level
            self._rebalance(txn, state)
            self._store(txn, state)

        self._write(join, f"join {member_id}")

    def update_subscription(self, topics: list[str]) -> None:
        def update(txn: Any) -> None:
            state = self._load(txn)
            info = state["members"].get(self.member_id)
            if info is None:
                return
            info["topics"] = sorted(topics)
            self._rebalance(txn, state)
            self._store(txn, state)

        self._write(update, f"update the subscription of {self.member_id}")

    def leave(self) -> None:
        if self.member_id is None:
            return

        def leave(txn: Any) -> None:
            state = self._load(txn)
            if self.member_id in state["members"]:
                self._drop(state, self.member_id)
                self._evict_expired(state, _now_ms())
                self._rebalance(txn, state)
                self._store(txn, state)

        self._write(leave, f"leave as {self.member_id}")
        self.member_id = None

    def heartbeat(self, last_poll_ms: int) -> bool:
        """Refresh this member; evict expired members. False if this member is gone."""
        now = _now_ms()

        def heartbeat(txn: Any) -> bool:
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

        return self._write(heartbeat, f"heartbeat of {self.member_id}")

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

        def acquire(txn: Any) -> set[TopicPartition]:
            state = self._load(txn)
            if self.member_id not in state["members"]:
                return set()
            mine = self.assignment(state)
            owners = state["owners"]
            taken = set()
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

        return self._write(acquire, f"acquire partitions for {self.member_id}")

    def release(self, partitions: Iterable[TopicPartition]) -> None:
        partitions = list(partitions)
        if not partitions:
            return

        def release(txn: Any) -> None:
            state = self._load(txn)
            owners = state["owners"]
            for tp in partitions:
                if owners.get(_tp_key(*tp)) == self.member_id:
                    del owners[_tp_key(*tp)]
            self._store(txn, state)

        self._write(release, f"release partitions of {self.member_id}")

    # ---- offsets ---------------------------------------------------------------------

    def commit(self, offsets: Mapping[TopicPartition, OffsetAndMetadata],
               *, member_id: str | None) -> None:
        """Store offsets atomically, fenced as described in the module docstring."""
        now = _now_ms()
        self._check_metadata(offsets)
        self._sync_logs_below(offsets)

        def commit(txn: Any) -> None:
            self._fence(self._load(txn), offsets, member_id)
            for tp, om in offsets.items():
                self.meta.put(txn, "offsets", offset_key(self.group_id, tp.topic,
                                                          tp.partition),
                              {"offset": om.offset, "metadata": om.metadata,
                               "commit_ms": now})

        self._write(commit, "commit offsets")

    def _sync_logs_below(self, offsets: Mapping[TopicPartition, OffsetAndMetadata]) -> None:
        """Flush each partition a commit names (a no-op when its log is all synced). The
        commit is durable when it returns (LMDB syncs it); after a power cut it must not
        point past the log's durable end, where the next appends would reuse offsets the
        group has already passed (docs/powercut.md)."""
        for tp, om in offsets.items():
            if om.offset <= 0:
                continue
            try:
                partition = self.broker.topic(tp.topic).partition(tp.partition)
            except UnknownTopicError:
                continue                 # nothing stored to sync; the commit decides
            except ClosedError:
                # the broker is closing (a consumer's last auto-commit as it closes its
                # clients): its clean close syncs every open partition right after
                continue
            partition.flush()

    def _check_metadata(self, offsets: Mapping[TopicPartition, OffsetAndMetadata]) -> None:
        # Kafka bounds the metadata string's length; logkit bounds its UTF-8 bytes, the
        # size it stores.
        limit = self.broker.config["offset.metadata.max.bytes"]
        for tp, om in offsets.items():
            if not isinstance(om.metadata, str):
                raise ConfigError(f"commit metadata for {tp.topic}-{tp.partition} must be "
                                  f"a string, got {type(om.metadata).__name__}")
            size = len(om.metadata.encode("utf-8", "surrogatepass"))
            if size > limit:
                raise OffsetMetadataTooLargeError(
                    f"commit metadata for {tp.topic}-{tp.partition} is {size} bytes; "
                    f"offset.metadata.max.bytes is {limit} (OFFSET_METADATA_TOO_LARGE)")

    def _fence(self, state: Mapping[str, Any],
               offsets: Mapping[TopicPartition, OffsetAndMetadata],
               member_id: str | None) -> None:
        if member_id is None:
            # members past their timeouts (a SIGKILLed process) do not count: they are
            # gone, even before a live member evicts them
            live = live_members(state)
            if live:
                raise CommitFailedError(
                    f"group {self.group_id!r} has active members ({len(live)} live: "
                    f"{describe_members(live)}); a commit from outside the group (a "
                    "consumer without a subscription, or an offset reset) needs a group "
                    "with no live members")
            return
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


def committed_offsets(meta: Any, group_id: str) -> dict[TopicPartition, OffsetAndMetadata]:
    validate_group_id(group_id)
    out = {}
    for key, value in meta.items("offsets", group_id.encode() + b"\0"):
        _, topic, partition = key.decode().split("\0")
        out[TopicPartition(topic, int(partition))] = OffsetAndMetadata(value["offset"],
                                                                       value["metadata"])
    return out


def check_transactional_member(meta: Any, txn: Any, group_id: str, generation_id: int,
                               member_id: str, group_instance_id: str | None = None
                               ) -> None:
    """KIP-447's check of offsets sent in a transaction (inside the caller's LMDB
    transaction): a member id or generation given must be the group's current ones, in
    the embedded group record or the listener's (`members`), else CommitFailedError
    (Kafka's UNKNOWN_MEMBER_ID / ILLEGAL_GENERATION). Neither given: no check."""
    if not member_id and generation_id < 0:
        return
    records = []
    for db in ("groups", "members"):
        raw = txn.get(group_id.encode(), db=meta.db(db))
        if raw is not None:
            records.append(decode(raw))
    for record in records:
        if member_id and member_id in record.get("members", {}):
            if generation_id >= 0 and generation_id != record.get("generation"):
                raise CommitFailedError(
                    f"member {member_id} of group {group_id!r} sent offsets in a "
                    f"transaction for generation {generation_id}; the group is in "
                    f"generation {record.get('generation')} (ILLEGAL_GENERATION)")
            return
    if member_id:
        raise CommitFailedError(f"member {member_id} is not in group {group_id!r} "
                                "(UNKNOWN_MEMBER_ID): it was evicted or left")
    if records and all(generation_id != r.get("generation") for r in records):
        raise CommitFailedError(f"offsets sent in a transaction for generation "
                                f"{generation_id} of group {group_id!r}, which is in "
                                "another generation (ILLEGAL_GENERATION)")


def list_groups(meta: Any) -> list[str]:
    """Every group id with a group record (members, a generation) or committed offsets,
    sorted. Keys only: no value is decoded."""
    def scan(txn: Any) -> set[str]:
        ids = set()
        for key in txn.cursor(db=meta.db("groups")).iternext(keys=True, values=False):
            if b"\0" not in key:                       # b"gen\0<id>" keys hold the generation
                ids.add(key.decode())
        # groups with members on the Kafka protocol listener (logkit/protocol/groups.py)
        ids.update(key.decode() for key in txn.cursor(db=meta.db("members")).iternext(
            keys=True, values=False))
        cursor = txn.cursor(db=meta.db("offsets"))
        if cursor.first():                             # one seek per group, not per offset
            while True:
                group = cursor.key().split(b"\0", 1)[0]
                ids.add(group.decode())
                if not cursor.set_range(group + b"\1"):
                    break
        return ids

    return sorted(meta.read(scan, operation="list groups"))


def committed_offset(meta: Any, group_id: str, tp: TopicPartition) -> int | None:
    key = offset_key(validate_group_id(group_id), tp.topic, tp.partition)
    raw = meta.read(lambda txn: txn.get(key, db=meta.db("offsets")),
                    operation=f"read the committed offset of group {group_id!r}")
    return None if raw is None else decode(raw)["offset"]


class ConsumerGroup:
    """`broker.group("billing")`: inspect and administer a consumer group."""

    def __init__(self, broker: BrokerView, group_id: str) -> None:
        validate_group_id(group_id)
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

    @property
    def state(self) -> str:
        """Kafka's group states, as kafka-consumer-groups shows them: "Stable" (live
        members), "Empty" (none live, but a generation or committed offsets), "Dead"
        (the broker knows nothing of this id: never used, deleted, or misspelt)."""
        if live_members(self._coordinator.state()) \
                or wire_members(self._broker.meta, self.group_id):
            return "Stable"
        return "Empty" if self.group_id in list_groups(self._broker.meta) else "Dead"

    def members(self) -> list[MemberInfo]:
        """Embedded members, then those connected through the Kafka listener."""
        return self._embedded_members() + wire_members(self._broker.meta, self.group_id)

    def _embedded_members(self) -> list[MemberInfo]:
        """The live members; one past its session timeout or max.poll.interval.ms (a
        killed process) is left out even before a live member evicts it."""
        state = self._coordinator.state()
        return [MemberInfo(m, info["client_id"], info["topics"],
                           sorted(TopicPartition(t, p)
                                  for t, p in state["assignment"].get(m, [])),
                           info["heartbeat_ms"], info["pid"], info["host"])
                for m, info in sorted(live_members(state).items())]

    def committed(self) -> dict[TopicPartition, int]:
        return {tp: om.offset for tp, om in
                committed_offsets(self._broker.meta, self.group_id).items()}

    def lag(self, *, isolation_level: str | None = None) -> dict[TopicPartition, int]:
        """Records each partition has beyond the group's committed offset: every
        partition of the topics the group's live members subscribe to or it has
        committed on. A partition with no commit counts from its log start offset (a
        group that never committed is behind by everything still in the log, not
        caught up); `committed()` leaves such partitions out. Topics deleted since a
        commit are skipped.

        `isolation_level="read_committed"` counts up to each partition's last stable
        offset (what such a consumer can read), "read_uncommitted" up to the high
        watermark; None: read_committed when a live member reads read_committed."""
        live = live_members(self._coordinator.state())
        if isolation_level is None:
            isolation_level = READ_COMMITTED if any(
                info.get("isolation_level") == READ_COMMITTED for info in live.values()) \
                else READ_UNCOMMITTED
        elif isolation_level not in (READ_COMMITTED, READ_UNCOMMITTED):
            raise ConfigError(f"isolation_level must be {READ_UNCOMMITTED!r} or "
                              f"{READ_COMMITTED!r}, got {isolation_level!r}")
        stable = isolation_level == READ_COMMITTED
        committed = self.committed()
        subscribed = {t for info in live.values() for t in info["topics"]}
        out = {}
        for name in sorted(subscribed | {tp.topic for tp in committed}):
            try:
                partitions = self._broker.topic(name).partitions
            except (UnknownTopicError, InvalidTopicError):
                continue
            for p in partitions:
                tp = p.topic_partition
                hw = p.last_stable_offset if stable else p.high_watermark
                offset = committed.get(tp)
                out[tp] = max(0, hw - (p.log_start_offset if offset is None else offset))
        return out

    def _require_empty(self, action: str) -> None:
        wire = wire_members(self._broker.meta, self.group_id)
        if wire:
            raise IllegalStateError(
                f"cannot {action} group {self.group_id!r}: it has {len(wire)} live "
                f"member(s) on the Kafka protocol listener "
                f"({', '.join(m.member_id for m in wire[:3])}); stop them first")
        self._require_no_embedded_member(action)

    def _require_no_embedded_member(self, action: str) -> None:
        state = self._coordinator.state()
        live = live_members(state)
        if live:
            gone = len(state["members"]) - len(live)
            raise IllegalStateError(
                f"cannot {action} group {self.group_id!r}: it has {len(live)} live "
                f"member(s): {describe_members(live)}"
                + (f" ({gone} more past their session timeout are ignored)" if gone else "")
                + "; stop them first (Kafka's tools also need an inactive group)")

    def reset_offsets(self, to: Any, *, topics: Iterable[str] | None = None) -> dict:
        """Set committed offsets to "earliest", "latest", or {TopicPartition: offset}.
        Like Kafka's kafka-consumer-groups --reset-offsets: only with no active members.
        Without `topics`, resets every topic the group has committed offsets for.
        Everything is checked before anything is committed: a negative offset raises
        ConfigError, a topic or partition that does not exist UnknownTopicError."""
        self._require_empty("reset offsets of")
        if isinstance(to, Mapping):
            target = self._explicit_offsets(to)
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

    def _explicit_offsets(self, to: Mapping[Any, Any]) -> dict[TopicPartition, int]:
        target = {}
        for tp, offset in to.items():
            tp = TopicPartition(*tp)
            if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
                raise ConfigError(f"reset_offsets: offset for {tp.topic}-{tp.partition} "
                                  f"must be an integer >= 0, got {offset!r}")
            target[tp] = offset
        missing = []
        for name in sorted({tp.topic for tp in target}):
            count = self._partition_count(name)
            missing += [f"{tp.topic}-{tp.partition}" for tp in sorted(target)
                        if tp.topic == name and not 0 <= tp.partition < count]
        if missing:
            raise UnknownTopicError(f"reset_offsets: no such partition(s): "
                                    f"{', '.join(missing)}; nothing was committed")
        return target

    def _partition_count(self, name: str) -> int:
        """Partitions of topic `name`; 0 when it does not exist."""
        try:
            return len(self._broker.topic(name).partitions)
        except (UnknownTopicError, InvalidTopicError):
            return 0

    def delete(self) -> None:
        """Remove the group and its committed offsets (no active members allowed). Works
        on a full store: a change that frees space may grow the map past its limit."""
        self._require_empty("delete")
        meta = self._broker.meta
        prefix = self.group_id.encode() + b"\0"

        def delete(txn: Any) -> None:
            cursor = txn.cursor(db=meta.db("offsets"))
            if cursor.set_range(prefix):
                while cursor.key().startswith(prefix):
                    if not cursor.delete():         # moves to the next key itself
                        break
            txn.delete(self.group_id.encode(), db=meta.db("groups"))
            txn.delete(b"gen\0" + self.group_id.encode(), db=meta.db("groups"))

        meta.write(delete, operation=f"delete group {self.group_id!r}", frees=True)

    def streams(self, topic_counts: Mapping[str, int],
                **options: Any) -> dict[str, list[Iterable[Record]]]:
        """{"topic": n} -> {"topic": [n consumers]}: each an iterator over a disjoint
        share of the topic's partitions (the classic high-level consumer API)."""
        out: dict[str, list[Iterable[Record]]] = {}
        for topic, count in topic_counts.items():
            if isinstance(count, bool) or not isinstance(count, int) or count < 1:
                raise ConfigError(f"stream count for {topic!r} must be a positive integer")
            out[topic] = [self._broker.consumer(topic, group_id=self.group_id, **options)
                          for _ in range(count)]
        return out
