"""Kafka's classic group protocol for wire members: JoinGroup, SyncGroup, Heartbeat,
LeaveGroup, and the fencing of OffsetCommit by generation.

Owns: the state of every group that has wire members, in this listener's memory, and a
snapshot of it in the broker's `members` LMDB database (generation, state, each member's
client id, host, subscribed topics, assignment, last heartbeat, timeouts), written on
every transition, so `broker.group(id)` and `logkit groups describe` in any process see
wire members. Committed offsets are not here: they are the broker's one set of LMDB
offsets (group.py), shared with embedded consumers.

The state machine (Kafka's GroupCoordinator):

| state               | JoinGroup                       | SyncGroup                      | Heartbeat            |
|---------------------|---------------------------------|--------------------------------|----------------------|
| Empty               | -> PreparingRebalance           | UNKNOWN_MEMBER_ID              | UNKNOWN_MEMBER_ID    |
| PreparingRebalance  | wait for every member, or the   | REBALANCE_IN_PROGRESS          | REBALANCE_IN_PROGRESS|
|                     | rebalance timeout (the missing  |                                |                      |
|                     | are removed) -> Completing...   |                                |                      |
| CompletingRebalance | same protocols: this generation | leader: assignments -> Stable; | NONE                 |
|                     | back; else -> PreparingRebalance| others wait for the leader     |                      |
| Stable              | a follower with the same        | the member's assignment        | NONE                 |
|                     | protocols: this generation back;|                                |                      |
|                     | else -> PreparingRebalance      |                                |                      |

Static members (KIP-345: JoinGroup v5+ with `group.instance.id`): the group maps each
instance id to its current member id, which begins with the instance id. A JoinGroup
with no member id and a known instance id takes over the old member id: in a Stable or
CompletingRebalance group, with the same protocols, it gets the current generation and
the old member's assignment back without a rebalance (a returning leader is told
skip_assignment); otherwise it joins the rebalance in the old member's place. Any call
naming that instance id with the old member id gets FENCED_INSTANCE_ID. A static member
sends no LeaveGroup when it closes: it stays a member until its session timeout.

A member silent for its session timeout is removed when any member of its group next
calls (a heartbeat every few seconds is enough), or while another waits in JoinGroup or
SyncGroup (so a member dead mid-rebalance holds it up for its session timeout, not the
rebalance timeout), which starts a rebalance. The first
rebalance of an empty group completes after `initial_rebalance_delay_ms` (default 0:
one consumer gets its assignment at its first JoinGroup, no waiting).

Mixing: a group with live embedded members (logkit.Consumer) refuses wire joins with
INCONSISTENT_GROUP_PROTOCOL, and the embedded side refuses to join a group with live wire
members (group.py); a group whose members have all left may be joined from either side.

Thread-safety: one lock and condition for all groups; JoinGroup and a follower's SyncGroup
block on the condition (each connection has its own thread), never past the group's
rebalance timeout or the listener's closing.
"""

from __future__ import annotations

import logging
import os
import struct
import threading
import time
import uuid
from typing import Any, Callable

from . import errors as E

__all__ = ["GroupManager", "decode_subscription", "decode_assignment",
           "encode_assignment"]

log = logging.getLogger(__name__)

EMPTY, PREPARING, COMPLETING, STABLE = ("Empty", "PreparingRebalance",
                                        "CompletingRebalance", "Stable")
MIN_SESSION_TIMEOUT_MS = 1000
MAX_SESSION_TIMEOUT_MS = 1800000           # Kafka's group.max.session.timeout.ms
MAX_WAIT_SLICE_S = 0.1                     # waits re-check deadlines and closing this often
SNAPSHOT_EVERY_MS = 1000                   # heartbeats refresh the LMDB snapshot this often


class _Member:
    def __init__(self, member_id: str, client_id: str, host: str) -> None:
        self.member_id = member_id
        self.client_id = client_id
        self.host = host
        self.session_timeout_ms = 0
        self.rebalance_timeout_ms = 0
        self.protocols: list[tuple[str, bytes]] = []
        self.assignment = b""
        self.last_seen = time.monotonic()
        self.join_result: dict[str, Any] | None = None
        self.instance_id: str | None = None          # group.instance.id: a static member

    def metadata(self, protocol: str) -> bytes:
        return next((meta for name, meta in self.protocols if name == protocol), b"")


class _Group:
    def __init__(self, group_id: str) -> None:
        self.group_id = group_id
        self.state = EMPTY
        self.generation = 0
        self.protocol_type = ""
        self.protocol_name: str | None = None
        self.leader: str | None = None
        self.members: dict[str, _Member] = {}
        self.static: dict[str, str] = {}             # group.instance.id -> member id
        self.joined: set[str] = set()
        self.delay_until = 0.0
        self.deadline = 0.0
        self.snapshot_at = 0.0


class GroupManager:
    """Every wire group of one listener. `persist(group_id, snapshot)` writes a snapshot
    (None: the group has no wire members); `embedded_live(group_id)` says whether the
    group has live embedded members."""

    def __init__(self, *, persist: Callable[[str, dict[str, Any] | None], None],
                 embedded_live: Callable[[str], bool], initial_rebalance_delay_ms: int = 0,
                 closing: threading.Event | None = None) -> None:
        self._persist = persist
        self._embedded_live = embedded_live
        self.initial_rebalance_delay_s = initial_rebalance_delay_ms / 1000
        self._closing = closing or threading.Event()
        self._cond = threading.Condition()
        self._groups: dict[str, _Group] = {}

    # ---- reading -------------------------------------------------------------------

    def groups(self) -> list[tuple[str, str, str]]:
        """(group id, protocol type, state) of each group with wire state."""
        with self._cond:
            return [(g.group_id, g.protocol_type or "consumer", g.state)
                    for g in self._groups.values()]

    def describe(self, group_id: str) -> dict[str, Any] | None:
        with self._cond:
            group = self._groups.get(group_id)
            if group is None:
                return None
            self._expire(group)
            return {"group_state": group.state, "protocol_type": group.protocol_type,
                    "protocol_data": group.protocol_name or "",
                    "members": [{"member_id": m.member_id,
                                 "group_instance_id": m.instance_id,
                                 "client_id": m.client_id, "client_host": m.host,
                                 "member_metadata": m.metadata(group.protocol_name or ""),
                                 "member_assignment": m.assignment}
                                for m in group.members.values()]}

    def has_live_members(self, group_id: str) -> bool:
        with self._cond:
            group = self._groups.get(group_id)
            if group is None:
                return False
            self._expire(group)
            return bool(group.members)

    # ---- JoinGroup -----------------------------------------------------------------

    def join(self, group_id: str, member_id: str, client_id: str, host: str,
             session_timeout_ms: int, rebalance_timeout_ms: int, protocol_type: str,
             protocols: list[tuple[str, bytes]],
             instance_id: str | None = None) -> dict[str, Any]:
        if not MIN_SESSION_TIMEOUT_MS <= session_timeout_ms <= MAX_SESSION_TIMEOUT_MS:
            return _join_error(E.INVALID_SESSION_TIMEOUT, member_id)
        if not protocols:
            return _join_error(E.INCONSISTENT_GROUP_PROTOCOL, member_id)
        if rebalance_timeout_ms <= 0:
            rebalance_timeout_ms = session_timeout_ms
        with self._cond:
            group = self._groups.get(group_id)
            if group is None or not group.members:
                if self._embedded_live(group_id):
                    log.info("group %s: refusing a wire member: embedded consumers are "
                             "live members of it", group_id)
                    return _join_error(E.INCONSISTENT_GROUP_PROTOCOL, member_id)
            if group is None:
                group = self._groups[group_id] = _Group(group_id)
            self._expire(group)
            others = self._common_protocols(group, exclude=member_id)
            if others is not None and (protocol_type != group.protocol_type
                                       or not {n for n, _ in protocols} & others):
                return _join_error(E.INCONSISTENT_GROUP_PROTOCOL, member_id)
            known = group.static.get(instance_id) if instance_id is not None else None
            if member_id == "" and known is not None:
                member = self._replace_static(group, known, client_id, host)
                member_id = member.member_id
                if group.state in (STABLE, COMPLETING) and member.protocols == list(protocols):
                    member.session_timeout_ms = session_timeout_ms
                    member.rebalance_timeout_ms = rebalance_timeout_ms
                    return self._join_result(group, member, skip_assignment=True)
            elif known is not None and member_id != known:
                return _join_error(E.FENCED_INSTANCE_ID, member_id)
            elif member_id == "":
                member_id = f"{instance_id or client_id}-{uuid.uuid4()}"
                group.members[member_id] = _Member(member_id, client_id, host)
                if instance_id is not None:
                    group.members[member_id].instance_id = instance_id
                    group.static[instance_id] = member_id
            elif member_id not in group.members:
                return _join_error(E.UNKNOWN_MEMBER_ID, member_id)
            member = group.members[member_id]
            if self._unchanged(group, member, protocols):
                # Kafka's rule: a known member rejoining with the same protocols gets
                # the current generation back, without a rebalance (unless it leads a
                # Stable group, whose leader may want to assign again)
                member.last_seen = time.monotonic()
                return self._join_result(group, member)
            member.session_timeout_ms = session_timeout_ms
            member.rebalance_timeout_ms = rebalance_timeout_ms
            member.protocols = list(protocols)
            member.last_seen = time.monotonic()
            member.join_result = None
            group.protocol_type = protocol_type
            if group.state != PREPARING:
                self._prepare(group)
            group.joined.add(member_id)
            self._maybe_complete(group)
            while True:
                if member.join_result is not None:
                    result, member.join_result = member.join_result, None
                    return result
                if group.members.get(member_id) is not member or self._closing.is_set():
                    return _join_error(self._gone_code(group, member), member_id)
                self._cond.wait(self._slice(group))
                # waiting in this call, the member is alive; one dead before it rejoined
                # is dropped at its session timeout (Kafka's), not the rebalance timeout
                member.last_seen = time.monotonic()
                self._expire(group)
                self._maybe_complete(group)

    def _replace_static(self, group: _Group, old_id: str, client_id: str,
                        host: str) -> _Member:
        """A static member back under its instance id: a new member id takes the old
        one's place (its position, protocols, timeouts, assignment, leadership); the
        old id is fenced from then on."""
        old = group.members[old_id]
        assert old.instance_id is not None
        member = _Member(f"{old.instance_id}-{uuid.uuid4()}", client_id, host)
        member.instance_id = old.instance_id
        member.session_timeout_ms = old.session_timeout_ms
        member.rebalance_timeout_ms = old.rebalance_timeout_ms
        member.protocols = old.protocols
        member.assignment = old.assignment
        new_id = member.member_id
        group.members = {(new_id if m == old_id else m): (member if m == old_id else info)
                         for m, info in group.members.items()}
        group.static[old.instance_id] = new_id
        if old_id in group.joined:
            group.joined.discard(old_id)
            group.joined.add(new_id)
        if group.leader == old_id:
            group.leader = new_id
        log.info("group %s: static member %s is back as %s (was %s)", group.group_id,
                 old.instance_id, new_id, old_id)
        self._save(group)
        self._cond.notify_all()                 # the old id's waiters are fenced
        return member

    @staticmethod
    def _gone_code(group: _Group, member: _Member) -> int:
        """The answer to a member no longer in its group: FENCED_INSTANCE_ID when its
        instance id now belongs to a newer member, else UNKNOWN_MEMBER_ID."""
        if member.instance_id is not None and group.static.get(member.instance_id) \
                not in (None, member.member_id):
            return E.FENCED_INSTANCE_ID
        return E.UNKNOWN_MEMBER_ID

    @staticmethod
    def _remove(group: _Group, member_id: str) -> None:
        member = group.members.pop(member_id)
        group.joined.discard(member_id)
        if member.instance_id is not None and group.static.get(member.instance_id) == member_id:
            del group.static[member.instance_id]

    def _prepare(self, group: _Group) -> None:
        now = time.monotonic()
        if group.state == EMPTY:
            group.delay_until = now + self.initial_rebalance_delay_s
        else:
            group.delay_until = now
        group.deadline = now + max((m.rebalance_timeout_ms for m in group.members.values()),
                                   default=0) / 1000
        group.state = PREPARING
        group.joined = set()
        log.debug("group %s: preparing rebalance (generation %d, %d member(s))",
                  group.group_id, group.generation, len(group.members))
        self._cond.notify_all()

    def _slice(self, group: _Group) -> float:
        now = time.monotonic()
        target = max(group.delay_until, min(group.deadline, now + MAX_WAIT_SLICE_S))
        return max(0.001, min(MAX_WAIT_SLICE_S, target - now))

    def _common_protocols(self, group: _Group, exclude: str = "") -> set[str] | None:
        """The protocols every other member supports; None when there is no other."""
        common: set[str] | None = None
        for member in group.members.values():
            if member.member_id == exclude:
                continue
            names = {n for n, _ in member.protocols}
            common = names if common is None else common & names
        return common

    def _maybe_complete(self, group: _Group) -> None:
        if group.state != PREPARING:
            return
        now = time.monotonic()
        if now < group.delay_until:
            return
        everyone = set(group.members) <= group.joined
        if not everyone and now < group.deadline:
            return
        for member_id in [m for m in group.members if m not in group.joined]:
            log.info("group %s: member %s did not rejoin within the rebalance timeout; "
                     "removed", group.group_id, member_id)
            self._remove(group, member_id)
        group.generation += 1
        group.joined = set()
        if not group.members:
            group.state, group.leader, group.protocol_name = EMPTY, None, None
            self._save(group)
            self._cond.notify_all()
            return
        group.protocol_name = self._choose_protocol(group)
        if group.leader not in group.members:
            group.leader = next(iter(group.members))
        group.state = COMPLETING
        for member in group.members.values():
            member.assignment = b""
            member.join_result = self._join_result(group, member)
        log.debug("group %s: generation %d, %d member(s), protocol %s, leader %s",
                  group.group_id, group.generation, len(group.members),
                  group.protocol_name, group.leader)
        self._save(group)
        self._cond.notify_all()

    @staticmethod
    def _unchanged(group: _Group, member: _Member, protocols: list[tuple[str, bytes]]) -> bool:
        if member.protocols != list(protocols):
            return False
        if group.state == COMPLETING:
            return True
        return group.state == STABLE and member.member_id != group.leader

    @staticmethod
    def _join_result(group: _Group, member: _Member, *,
                     skip_assignment: bool = False) -> dict[str, Any]:
        """The JoinGroup answer of the current generation for `member` (the leader gets
        every member's metadata; with skip_assignment, a static leader back in a group
        that needs no new assignment: KIP-814)."""
        leads = member.member_id == group.leader
        return {"error_code": E.NONE, "generation_id": group.generation,
                "protocol_type": group.protocol_type, "protocol_name": group.protocol_name,
                "leader": group.leader, "member_id": member.member_id,
                "skip_assignment": skip_assignment and leads,
                "members": [{"member_id": m.member_id, "group_instance_id": m.instance_id,
                             "metadata": m.metadata(group.protocol_name or "")}
                            for m in group.members.values()] if leads else []}

    @staticmethod
    def _choose_protocol(group: _Group) -> str:
        """Kafka's vote: each member votes for its most preferred protocol that every
        member supports; the most votes win, ties to the leader-side order."""
        common: set[str] | None = None
        for member in group.members.values():
            names = {n for n, _ in member.protocols}
            common = names if common is None else common & names
        assert common, "join refused members without a common protocol"
        votes: dict[str, int] = {}
        for member in group.members.values():
            choice = next(n for n, _ in member.protocols if n in common)
            votes[choice] = votes.get(choice, 0) + 1
        return max(votes, key=lambda name: votes[name])

    # ---- SyncGroup, Heartbeat, LeaveGroup --------------------------------------------

    def sync(self, group_id: str, generation: int, member_id: str,
             assignments: list[dict[str, Any]],
             instance_id: str | None = None) -> dict[str, Any]:
        with self._cond:
            group = self._groups.get(group_id)
            error = self._check_member(group, generation, member_id, instance_id)
            if error:
                return {"error_code": error, "assignment": b""}
            assert group is not None
            member = group.members[member_id]
            member.last_seen = time.monotonic()
            if group.state == COMPLETING and member_id == group.leader:
                given = {a["member_id"]: a["assignment"] for a in assignments}
                for other in group.members.values():
                    other.assignment = given.get(other.member_id, b"")
                group.state = STABLE
                self._save(group)
                self._cond.notify_all()
            deadline = time.monotonic() + member.rebalance_timeout_ms / 1000
            while group.state == COMPLETING and group.generation == generation \
                    and group.members.get(member_id) is member \
                    and time.monotonic() < deadline and not self._closing.is_set():
                self._cond.wait(MAX_WAIT_SLICE_S)
                # waiting in this call, the member is alive; a leader dead before its
                # SyncGroup is dropped at its session timeout, which starts a rebalance
                member.last_seen = time.monotonic()
                self._expire(group)
            if group.state == STABLE and group.generation == generation \
                    and group.members.get(member_id) is member:
                return {"error_code": E.NONE, "protocol_type": group.protocol_type,
                        "protocol_name": group.protocol_name,
                        "assignment": member.assignment}
            if group.members.get(member_id) is not member \
                    and self._gone_code(group, member) == E.FENCED_INSTANCE_ID:
                # replaced by its instance id's new member while it waited (Kafka's)
                return {"error_code": E.FENCED_INSTANCE_ID, "assignment": b""}
            return {"error_code": E.REBALANCE_IN_PROGRESS, "assignment": b""}

    def heartbeat(self, group_id: str, generation: int, member_id: str,
                  instance_id: str | None = None) -> int:
        with self._cond:
            group = self._groups.get(group_id)
            if group is not None and member_id in group.members:
                # alive, whatever the answer: during a rebalance a member that keeps
                # heartbeating is given the rebalance timeout to rejoin (Kafka's rule),
                # not cut off at its session timeout
                group.members[member_id].last_seen = time.monotonic()
            error = self._check_member(group, generation, member_id, instance_id)
            if error:
                return error
            assert group is not None
            # the snapshot's heartbeat time must stay within every member's session
            # timeout, or other processes would take live members for gone ones
            every_s = min(SNAPSHOT_EVERY_MS, min(m.session_timeout_ms for m in
                                                 group.members.values()) // 3) / 1000
            if time.monotonic() - group.snapshot_at > every_s:
                self._save(group)
            return E.NONE

    def _check_member(self, group: _Group | None, generation: int, member_id: str,
                      instance_id: str | None = None) -> int:
        if group is None:
            return E.UNKNOWN_MEMBER_ID
        self._expire(group)
        if _fenced(group, member_id, instance_id):
            return E.FENCED_INSTANCE_ID
        if member_id not in group.members:
            return E.UNKNOWN_MEMBER_ID
        if group.state == PREPARING:
            return E.REBALANCE_IN_PROGRESS
        if generation != group.generation:
            return E.ILLEGAL_GENERATION
        return E.NONE

    def leave(self, group_id: str, members: list[tuple[str, str | None]]) -> list[int]:
        """Remove each (member id, instance id): a static member by its instance id
        alone when the member id is empty (Kafka's removeMembersFromConsumerGroup)."""
        with self._cond:
            group = self._groups.get(group_id)
            codes = []
            for member_id, instance_id in members:
                if group is not None and member_id == "" and instance_id is not None:
                    member_id = group.static.get(instance_id, "")
                if group is not None and _fenced(group, member_id, instance_id):
                    codes.append(E.FENCED_INSTANCE_ID)
                    continue
                if group is None or member_id not in group.members:
                    codes.append(E.UNKNOWN_MEMBER_ID)
                    continue
                self._remove(group, member_id)
                codes.append(E.NONE)
                log.debug("group %s: member %s left", group_id, member_id)
            if group is not None and E.NONE in codes:
                self._after_removal(group)
            return codes

    def _after_removal(self, group: _Group) -> None:
        if group.state == PREPARING:
            self._maybe_complete(group)
        elif group.members:
            self._prepare(group)
        else:
            group.state, group.leader, group.protocol_name = EMPTY, None, None
            group.generation += 1
        self._save(group)
        self._cond.notify_all()

    def _expire(self, group: _Group) -> None:
        now = time.monotonic()
        gone = [m for m in group.members.values() if m.member_id not in group.joined
                and now - m.last_seen > m.session_timeout_ms / 1000]
        for member in gone:
            log.warning("group %s: member %s sent nothing for its session timeout (%d ms); "
                        "removed", group.group_id, member.member_id,
                        member.session_timeout_ms)
            self._remove(group, member.member_id)
        if gone:
            self._after_removal(group)

    # ---- offsets -------------------------------------------------------------------

    def check_commit(self, group_id: str, generation: int, member_id: str,
                     instance_id: str | None = None) -> int:
        """The error for an OffsetCommit from (generation, member), NONE to accept."""
        with self._cond:
            group = self._groups.get(group_id)
            if group is not None:
                self._expire(group)
                if _fenced(group, member_id, instance_id):
                    return E.FENCED_INSTANCE_ID
            if generation < 0 and not member_id:
                if group is not None and group.members:
                    return E.ILLEGAL_GENERATION    # outsiders commit to empty groups only
                return E.NONE
            if group is None or member_id not in group.members:
                return E.UNKNOWN_MEMBER_ID
            if generation != group.generation:
                return E.ILLEGAL_GENERATION
            if group.state == COMPLETING:
                return E.REBALANCE_IN_PROGRESS
            group.members[member_id].last_seen = time.monotonic()
            return E.NONE

    def check_txn_commit(self, group_id: str, generation: int, member_id: str,
                         instance_id: str | None = None) -> int:
        """The error for a TxnOffsetCommit from (generation, member), NONE to accept:
        Kafka's group coordinator rule (KIP-447), laxer than OffsetCommit's: a member id
        given must be a member, a generation given (>= 0) must be the group's, a static
        member's old incarnation is fenced; a producer that names neither (an older
        client) is not checked. A group with no wire state here is left to the
        transaction coordinator, which checks embedded members."""
        with self._cond:
            group = self._groups.get(group_id)
            if group is None:
                return E.NONE
            self._expire(group)
            if generation < 0 and not group.members:
                return E.NONE                  # the group only stores offsets
            if _fenced(group, member_id, instance_id):
                return E.FENCED_INSTANCE_ID
            if member_id and member_id not in group.members:
                return E.UNKNOWN_MEMBER_ID
            if generation >= 0 and generation != group.generation:
                return E.ILLEGAL_GENERATION
            return E.NONE

    # ---- DeleteGroups ----------------------------------------------------------------

    def delete(self, group_id: str, remove: Callable[[], int]) -> int:
        """Delete a group that has no live wire member: `remove()` deletes it from the
        broker (its answer, an error code, is returned), called under this manager's
        lock so no member can join meanwhile; then its wire state is forgotten.
        NON_EMPTY_GROUP while wire members are live."""
        with self._cond:
            group = self._groups.get(group_id)
            if group is not None:
                self._expire(group)
                if group.members:
                    return E.NON_EMPTY_GROUP
            code = remove()
            if code == E.NONE or (code == E.GROUP_ID_NOT_FOUND and group is not None):
                # a group with wire state only (joined, never committed) is deleted too
                self._groups.pop(group_id, None)
                code = E.NONE
            return code

    # ---- lifecycle -------------------------------------------------------------------

    def close(self) -> None:
        """Drop every wire member (the listener is going away) and wake every waiter."""
        with self._cond:
            for group in self._groups.values():
                if group.members:
                    group.members.clear()
                    group.static.clear()
                    group.state = EMPTY
                    self._save(group)
            self._cond.notify_all()

    def _save(self, group: _Group) -> None:
        group.snapshot_at = time.monotonic()
        if not group.members:
            snapshot = None
        else:
            now_ms = int(time.time() * 1000)
            age_ms = {m: int((time.monotonic() - info.last_seen) * 1000)
                      for m, info in group.members.items()}
            snapshot = {
                "generation": group.generation, "state": group.state,
                "protocol_type": group.protocol_type, "protocol": group.protocol_name,
                "members": {m.member_id: {
                    "client_id": m.client_id, "host": m.host, "pid": os.getpid(),
                    "topics": decode_subscription(m.metadata(group.protocol_name or "")),
                    "assignment": [list(tp) for tp in decode_assignment(m.assignment)],
                    "heartbeat_ms": now_ms - age_ms[m.member_id], "poll_ms": now_ms,
                    "session_timeout_ms": m.session_timeout_ms,
                    "max_poll_interval_ms": max(m.rebalance_timeout_ms,
                                                m.session_timeout_ms)}
                    for m in group.members.values()}}
        try:
            self._persist(group.group_id, snapshot)
        except Exception as exc:                 # the wire group works on without it
            log.warning("group %s: could not store the wire members' snapshot: %s",
                        group.group_id, exc)


def _fenced(group: _Group, member_id: str, instance_id: str | None) -> bool:
    """A call naming a static member's instance id with a member id that is not its
    current one (an old incarnation, replaced by a JoinGroup under the same id)."""
    if instance_id is None:
        return False
    current = group.static.get(instance_id)
    return current is not None and current != member_id


def _join_error(code: int, member_id: str) -> dict[str, Any]:
    return {"error_code": code, "generation_id": -1, "protocol_name": "", "leader": "",
            "member_id": member_id, "members": []}


# ---- Kafka's consumer protocol (ConsumerProtocolSubscription / Assignment) -----------

_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")


def _strings(data: bytes, pos: int) -> tuple[list[str], int]:
    count = _I32.unpack_from(data, pos)[0]
    pos += 4
    out = []
    for _ in range(max(0, min(count, len(data)))):
        size = _I16.unpack_from(data, pos)[0]
        pos += 2
        out.append(data[pos:pos + size].decode("utf-8", "replace"))
        pos += size
    return out, pos


def decode_subscription(data: bytes) -> list[str]:
    """The topics of a consumer-protocol subscription; [] when it does not parse."""
    try:
        return sorted(_strings(data, 2)[0]) if data else []
    except (struct.error, ValueError):
        return []


def decode_assignment(data: bytes) -> list[tuple[str, int]]:
    """(topic, partition) pairs of a consumer-protocol assignment; [] when it does not
    parse."""
    out = []
    try:
        if not data:
            return []
        pos = 2
        count = _I32.unpack_from(data, pos)[0]
        pos += 4
        for _ in range(max(0, min(count, len(data)))):
            size = _I16.unpack_from(data, pos)[0]
            pos += 2
            topic = data[pos:pos + size].decode("utf-8", "replace")
            pos += size
            partitions = _I32.unpack_from(data, pos)[0]
            pos += 4
            for _ in range(max(0, min(partitions, len(data)))):
                out.append((topic, _I32.unpack_from(data, pos)[0]))
                pos += 4
    except (struct.error, ValueError):
        return out
    return sorted(out)


def encode_assignment(partitions: list[tuple[str, int]]) -> bytes:
    """A version-0 consumer-protocol assignment (for describing embedded members)."""
    by_topic: dict[str, list[int]] = {}
    for topic, partition in partitions:
        by_topic.setdefault(topic, []).append(partition)
    out = bytearray(_I16.pack(0) + _I32.pack(len(by_topic)))
    for topic, numbers in sorted(by_topic.items()):
        name = topic.encode()
        out += _I16.pack(len(name)) + name + _I32.pack(len(numbers))
        for number in sorted(numbers):
            out += _I32.pack(number)
    out += _I32.pack(-1)                         # no user data
    return bytes(out)
