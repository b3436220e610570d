"""What one consumer reads: its subscription or manual assignment, the partitions it
owns, their positions, the paused ones, the reset strategy (Kafka's `SubscriptionState`).

Owns: the subscribed topic names and pattern (or the manual assignment — one or the
other), this generation's share of the group's partitions (`assigned`), the part of it
this member holds in the group record and may fetch (`owned`; without a group it is all
of `assigned`), the fetch position of each assigned partition (None until resolved),
the paused partitions, and `auto_offset_reset`.

Does not: touch the broker or the group record. Positions are resolved, reset and
advanced by the consumer's fetching side (`Consumer._resolve`, `Consumer._fetch`);
`owned` changes as the coordinator (logkit/coordinator.py) acquires and releases
partitions in the group record.

Invariant: owned ⊆ assigned; paused ⊆ assigned; positions has a key for each assigned
partition and for no other; a partition's position is the offset of the next record
`poll()` returns for it. `version` grows with every change of assigned, owned or paused,
so a poll reuses the sorted fetchable list (and the consumer its partition handles)
until one of them changes.

Thread-safety: none of its own — it belongs to the thread that uses the consumer (the
consumer's lock orders a `close()` from another thread against it).
"""

from __future__ import annotations

import logging
import re
from typing import Any

from .errors import ArgumentTypeError, IllegalStateError, OffsetOutOfRangeError
from .topic import TopicPartition

__all__ = ["SubscriptionState", "as_topic_partition", "check_offset"]

log = logging.getLogger(__name__)


def as_topic_partition(tp: Any) -> TopicPartition:
    """A TopicPartition from itself or a (topic, partition) pair; ArgumentTypeError
    (a TypeError) otherwise."""
    if isinstance(tp, TopicPartition):
        return tp
    if isinstance(tp, tuple) and len(tp) == 2:
        return TopicPartition(tp[0], tp[1])
    raise ArgumentTypeError(f"expected a TopicPartition(topic, partition), got {tp!r}")


def check_offset(offset: Any) -> int:
    """`offset` if it is a non-negative int; ArgumentTypeError for another type,
    OffsetOutOfRangeError for a negative one."""
    if isinstance(offset, bool) or not isinstance(offset, int):
        raise ArgumentTypeError(f"offset must be a non-negative int, got {offset!r} "
                                f"({type(offset).__name__})")
    if offset < 0:
        raise OffsetOutOfRangeError(f"offset must be a non-negative integer, got {offset!r}")
    return offset


class SubscriptionState:
    """The consumer's subscription, assignment, positions and paused partitions."""

    def __init__(self, auto_offset_reset: str) -> None:
        self.reset_policy = auto_offset_reset       # "earliest", "latest" or "none"
        self.topics: list[str] = []                 # subscribed names, sorted
        self.pattern: re.Pattern | None = None
        self.manual = False                         # assign() was used
        self.assigned: set[TopicPartition] = set()  # this generation's share
        self.owned: set[TopicPartition] = set()     # fetchable now (held in the group)
        self.paused: set[TopicPartition] = set()
        self.positions: dict[TopicPartition, int | None] = {}
        self.version = 0                            # grows with assigned/owned/paused
        self._fetchable: tuple[int, list[TopicPartition]] = (-1, [])

    # ---- subscription ----------------------------------------------------------------

    def subscribe(self, names: list[str], pattern: re.Pattern | None) -> None:
        """Subscribe to `names` (already checked, pattern matches included)."""
        if self.manual:
            raise IllegalStateError("subscribe() after assign(): use one or the other")
        self.pattern = pattern
        self.topics = sorted(set(names))

    def unsubscribe(self) -> None:
        self.topics = []
        self.set_assignment(set(), owned=True)

    def assign(self, tps: set[TopicPartition]) -> None:
        """A manual assignment: every partition owned at once, no group membership."""
        if self.topics:
            raise IllegalStateError("assign() after subscribe(): use one or the other")
        self.manual = True
        self.set_assignment(tps, owned=True)

    def has_source(self) -> bool:
        """Whether poll() has something to read from (a subscription or assignment)."""
        return bool(self.topics) or self.manual or self.pattern is not None

    # ---- assignment ------------------------------------------------------------------

    def set_assignment(self, tps: set[TopicPartition], *, owned: bool) -> None:
        """This generation's share is `tps`: positions kept for those still assigned,
        unresolved for new ones; `owned` makes them all fetchable at once (no group),
        else only those already held stay owned (the rest wait to be acquired)."""
        for tp in set(self.positions) - tps:
            del self.positions[tp]
        for tp in tps:
            self.positions.setdefault(tp, None)
        self.assigned = set(tps)
        self.owned = set(tps) if owned else self.owned & tps
        self.paused &= tps
        self.version += 1

    def revoke(self, tps: set[TopicPartition]) -> None:
        """Released in the group record: no longer fetched, positions forgotten."""
        self.owned -= tps
        for tp in tps:
            self.positions.pop(tp, None)
        self.version += 1

    def acquired(self, tps: set[TopicPartition]) -> None:
        """Now held in the group record: fetchable from their (kept or unresolved)
        positions."""
        for tp in tps:
            self.positions[tp] = self.positions.get(tp)
        self.owned |= tps
        self.version += 1

    def lose_all(self) -> set[TopicPartition]:
        """Evicted from the group: nothing is owned any more; what was."""
        lost, self.owned = self.owned, set()
        self.version += 1
        return lost

    def require_assigned(self, tp: Any) -> TopicPartition:
        tp = as_topic_partition(tp)
        if tp not in self.assigned:
            raise IllegalStateError(f"{tp.topic}-{tp.partition} is not assigned to this "
                                    "consumer")
        return tp

    def fetchable(self) -> list[TopicPartition]:
        """Owned and not paused, sorted; computed once per `version` (do not change the
        list returned)."""
        version, cached = self._fetchable
        if version != self.version:
            cached = [tp for tp in sorted(self.owned) if tp not in self.paused]
            self._fetchable = (self.version, cached)
        return cached

    # ---- positions -------------------------------------------------------------------

    def seek(self, tp: TopicPartition, offset: Any) -> None:
        self.positions[self.require_assigned(tp)] = check_offset(offset)

    def committable(self) -> dict[TopicPartition, int]:
        """The owned partitions' resolved positions (what a commit stores by default)."""
        positions = self.positions
        return {tp: positions[tp] for tp in self.owned   # type: ignore[misc]
                if positions.get(tp) is not None}

    # ---- pause -----------------------------------------------------------------------

    def pause(self, tp: Any) -> TopicPartition:
        tp = self.require_assigned(tp)
        self.paused.add(tp)
        self.version += 1
        return tp

    def resume(self, tp: Any) -> None:
        self.paused.discard(as_topic_partition(tp))
        self.version += 1
