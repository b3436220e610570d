"""Partition assignors, as Kafka's consumer ships them: range, roundrobin, sticky,
cooperative-sticky.

Owns: the pure function from (members with subscriptions, partitions per topic,
previous assignment) to a new assignment. Invariant: every partition of a subscribed
topic goes to exactly one member subscribed to that topic; the result depends only on
the inputs (members sorted by id), so any member computes the same answer.
"""

from __future__ import annotations

from typing import Mapping, Sequence

from .errors import ConfigError

__all__ = ["assign", "ASSIGNORS", "EAGER"]

TP = tuple[str, int]
Assignment = dict[str, list[TP]]


def _range(members: Mapping[str, Sequence[str]], partitions: Mapping[str, int],
           previous: Mapping[str, Sequence[TP]]) -> Assignment:
    out: Assignment = {m: [] for m in members}
    for topic in sorted(partitions):
        subscribed = sorted(m for m, topics in members.items() if topic in topics)
        if not subscribed:
            continue
        count = partitions[topic]
        share, extra = divmod(count, len(subscribed))
        start = 0
        for i, member in enumerate(subscribed):
            n = share + (1 if i < extra else 0)
            out[member].extend((topic, p) for p in range(start, start + n))
            start += n
    return out


def _roundrobin(members: Mapping[str, Sequence[str]], partitions: Mapping[str, int],
                previous: Mapping[str, Sequence[TP]]) -> Assignment:
    out: Assignment = {m: [] for m in members}
    ordered = sorted(members)
    if not ordered:
        return out
    turn = 0
    for topic in sorted(partitions):
        for p in range(partitions[topic]):
            for _ in range(len(ordered)):          # next member subscribed to the topic
                member = ordered[turn % len(ordered)]
                turn += 1
                if topic in members[member]:
                    out[member].append((topic, p))
                    break
    return out


def _sticky(members: Mapping[str, Sequence[str]], partitions: Mapping[str, int],
            previous: Mapping[str, Sequence[TP]]) -> Assignment:
    """Keep what each surviving member had; move only what balance requires."""
    valid = {(t, p) for t, n in partitions.items() for p in range(n)}
    out: Assignment = {m: [] for m in members}
    taken: set[TP] = set()
    for member in sorted(members):
        for tp in previous.get(member, ()):
            tp = (tp[0], tp[1])
            if tp in valid and tp not in taken and tp[0] in members[member]:
                out[member].append(tp)
                taken.add(tp)
    total = len(valid)
    if not members:
        return out
    # Members may subscribe to different topics; balance greedily by count.
    ceiling = -(-total // len(members))
    spare: list[TP] = sorted(valid - taken)
    for member in sorted(members, key=lambda m: -len(out[m])):
        while len(out[member]) > ceiling:
            spare.append(out[member].pop())
    spare.sort()
    for tp in spare:
        candidates = [m for m in members if tp[0] in members[m]]
        if not candidates:
            continue
        target = min(sorted(candidates), key=lambda m: len(out[m]))
        out[target].append(tp)
    # Even out: move from the fullest to the emptiest while they differ by 2 or more.
    for _ in range(total):
        fullest = max(sorted(out), key=lambda m: len(out[m]))
        emptiest = min(sorted(out), key=lambda m: len(out[m]))
        if len(out[fullest]) - len(out[emptiest]) < 2:
            break
        movable = [tp for tp in out[fullest] if tp[0] in members[emptiest]]
        if not movable:
            break
        tp = movable[-1]
        out[fullest].remove(tp)
        out[emptiest].append(tp)
    for member in out:
        out[member].sort()
    return out


ASSIGNORS = {"range": _range, "roundrobin": _roundrobin, "sticky": _sticky,
             "cooperative-sticky": _sticky}
# Eager assignors revoke everything at each rebalance; cooperative ones only what moves.
EAGER = {"range": True, "roundrobin": True, "sticky": True, "cooperative-sticky": False}


def assign(strategy: str, members: Mapping[str, Sequence[str]],
           partitions: Mapping[str, int],
           previous: Mapping[str, Sequence[TP]] | None = None) -> Assignment:
    """{member: [(topic, partition)]} for every member. At the edges this does what
    Kafka's AbstractPartitionAssignor does, never an error: no members -> {} (nothing
    to assign to); no partitions (or none a member subscribes to) -> that member gets
    [] and stays in the group, idle, as a Kafka consumer does."""
    if strategy not in ASSIGNORS:
        raise ConfigError(f"unknown partition assignment strategy {strategy!r}; use one "
                          f"of {sorted(ASSIGNORS)}")
    if not members:
        return {}
    if not any(partitions.values()):
        return {member: [] for member in members}
    return ASSIGNORS[strategy](members, partitions, previous or {})
