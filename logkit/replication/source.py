"""The pluggable side of replication: what a follower asks of its leader.

Owns: `ReplicaSource`, the small abstract class every transport implements (the
directory source here; TCP and object-store sources later), and the plain records its
methods return (`TopicInfo`, `PartitionInfo`). A source answers for one leader:

| method | answers |
|---|---|
| `topics()` | every topic: partitions, config overrides, topic id |
| `partition(topic, n)` | log start and end, leader epochs, segment base offsets, the count of cleaning swaps |
| `segments(topic, n)` | each sealed segment's base, end, size and SHA-256 (a compacted log's; optional) |
| `fetch(topic, n, offset, max_bytes=)` | stored bytes of whole batches from `offset` on |
| `committed_offsets()` | every consumer group's committed offsets |
| `report_progress(follower_id, ends)` | the follower's log end offsets, for the ISR |
| `wait(timeout_s)` | returns when the leader may have new data, or after the timeout |
| `lease()`, `take_lease(...)`, `keeps_lease` | the leader's lease, a promotion's conditional write of it, and whether there is one to see (optional: the default keeps no lease) |

Invariant for implementers: `fetch` returns bytes exactly as the leader stores them
(batches whole, never a partial one), so a follower's files can be byte-identical to
the leader's; a source never changes the leader's data. Errors: a topic or partition
the leader does not have raises UnknownTopicError; an offset outside the leader's log
raises OffsetOutOfRangeError; a leader that cannot be read just now (it is down, or
mid-recovery) raises a LogkitError or OSError, which the follower retries after
`replica.fetch.backoff.ms`. Sources are used from one follower thread at a time.
"""

from __future__ import annotations

import abc
import logging
import time
from typing import Any, Mapping, NamedTuple

from ..topic import TopicPartition
from ..leader.epochs import EpochEntry
from ..leader.lease import Lease

__all__ = ["ReplicaSource", "TopicInfo", "PartitionInfo", "SegmentInfo"]

log = logging.getLogger(__name__)


class TopicInfo(NamedTuple):
    """One topic on the leader. `config` holds the settings that differ from Kafka's
    topic defaults (Kafka names), the way `create_topic(config=)` takes them."""

    name: str
    partitions: int
    config: dict[str, Any]
    topic_id: str
    replication_factor: int = 1          # the leader and replication_factor - 1 followers
    wire_topic_id: str | None = None     # the id Kafka clients know it by, when not topic_id


class PartitionInfo(NamedTuple):
    """One partition on the leader, as of the call: offsets, the leader epochs (its
    `leader-epoch-checkpoint`, oldest first) and the base offsets of its live segments
    (where a follower starts a new segment to keep the files identical)."""

    log_start_offset: int
    log_end_offset: int
    epochs: tuple[EpochEntry, ...]
    segment_base_offsets: tuple[int, ...]
    clean_count: int = 0       # the leader's cleaning swaps so far (tail.clean_count)


class SegmentInfo(NamedTuple):
    """One sealed segment of the leader, as `segments()` lists it: the segment holding
    offsets [base, end), whose batches from the one holding `first_offset` (the base,
    or the log start inside the first segment) are `size` bytes with this SHA-256 (hex).
    A follower fetches those batches from `first_offset` to `end` to copy it whole."""

    base: int
    end: int
    first_offset: int
    size: int
    sha256: str


class ReplicaSource(abc.ABC):
    """Where a `logkit.Follower` copies from (see the module docstring for the
    contract). A context manager; `close()` is safe twice."""

    @abc.abstractmethod
    def topics(self) -> dict[str, TopicInfo]:
        """Every topic the leader has, by name."""

    @abc.abstractmethod
    def partition(self, topic: str, partition: int) -> PartitionInfo:
        """The leader's state of one partition."""

    @abc.abstractmethod
    def fetch(self, topic: str, partition: int, offset: int, *, max_bytes: int) -> bytes:
        """Whole batches as stored, from the batch holding `offset` up to the leader's
        log end, about `max_bytes` (at least one batch); b"" at the log end."""

    def segments(self, topic: str, partition: int) -> tuple[SegmentInfo, ...] | None:
        """The leader's sealed segments, oldest first, for a follower copying a
        compacted log's cleaning segment by segment (it asks when `clean_count`
        moves). None (the default) when this source cannot list them: a follower then
        copies batches only, and a cleaning the leader did after it copied a range
        stays out of its copy."""
        return None

    @abc.abstractmethod
    def committed_offsets(self) -> dict[str, dict[TopicPartition, int]]:
        """{group id: {TopicPartition: committed offset}} for every group."""

    def report_progress(self, follower_id: str,
                        log_end_offsets: Mapping[TopicPartition, int]) -> None:
        """Tell the leader how far this follower has copied (its ISR is built from
        these). A source that cannot tell the leader anything does nothing."""

    @property
    def keeps_lease(self) -> bool:
        """Whether the leader this source reads holds a lease that `lease()` shows once
        a follower has reported through it (then a running, auto-promoting follower's
        `catch_up()` returns only once it can see that lease). The default: False."""
        return False

    def lease(self) -> Lease | None:
        """The lease of the leader this source reads (logkit/leader/lease.py), for
        automatic promotion: None when the source keeps no lease, when the leader never
        took one, or when it names another replica (leadership moved elsewhere)."""
        return None

    def take_lease(self, holder: str, *, ttl_ms: int, min_epoch: int) -> Lease | None:
        """A promotion's conditional write at the source: `holder` leads from the next
        epoch (at least `min_epoch`). NotLeaderError while another holder's lease is
        valid; another LogkitError or OSError when the source cannot be reached. The
        default returns None: this source keeps no lease, so a promotion through it
        cannot fence the old leader."""
        return None

    def wait(self, timeout_s: float) -> None:
        """Return when the leader may have appended, or after `timeout_s`. The default
        sleeps; a source that can be woken does better."""
        if timeout_s > 0:
            time.sleep(timeout_s)

    def leader_listener(self) -> dict[str, Any] | None:
        """The leader's Kafka listener, `{node_id, host, port}`, when it runs one and
        this source can tell (a serving follower names it in Metadata); default None."""
        return None

    def describe(self) -> str:
        """A short name of the leader for messages and `follower.json`."""
        return type(self).__name__

    def close(self) -> None:
        """Release what the source holds; safe twice."""

    def __enter__(self) -> "ReplicaSource":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<{self.describe()}>"
