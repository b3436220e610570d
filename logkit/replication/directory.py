"""`DirectorySource`: a leader read straight from its directory (the same machine, a
second disk, a shared filesystem).

Owns: a read-only `Broker` over the leader's root (`Broker(path, read_only=True)`, opened
on first use), the leader epochs of its partitions (the `leader-epoch-checkpoint` file,
or, for a leader that never had one, the epochs its batch headers carry), the follower
progress files under `<leader>/replicas/`, and waiting on the leader's doorbell.

What a read-only broker allows while the leader's process writes: topic and group
metadata read from LMDB under its reader lock; partition reads through the tail's
seqlock, never past the committed size, so a half-written batch is never seen; rolls
and retention show up through the segment-list version (a segment renamed away under a
read makes the read start over). What it cannot do is repair: a tail left torn by a
leader killed mid-update, or a partition that needs recovery, raises until the leader
is opened read-write again; the follower retries after `replica.fetch.backoff.ms`.

Also the leader's lease (`leader.lease` in its root, lease.py): read for automatic
promotion, and taken by a promotion's conditional write; and `segments()`, a compacted
log's sealed segments with the SHA-256 of their files (`SegmentDigests`, kept per file
identity: the TCP server and a follower's own copy use it too).

Invariant: nothing here writes to the leader's data; the only files written under the
leader's root are `replicas/<follower id>.json` (atomically: temporary name, rename),
only when `report_progress=True`, and the lease (and its lock file) by `take_lease()`.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import time
from typing import Any, Callable, Mapping, TypeVar

from ..broker import Broker
from ..config import resolve_config
from ..errors import (ConfigError, NotLeaderError, OffsetOutOfRangeError, StorageError,
                      UnknownTopicError)
from ..notify import DOORBELL_FILE, Doorbell
from .._files import open_file
from ..records import iter_batches
from ..segment import segment_file_name
from ..topic import Partition, Topic, TopicPartition
from ..leader.epochs import CHECKPOINT_FILE, EpochEntry, epochs_from_headers, read_checkpoint
from ..leader.lease import Lease, read_lease, replica_id, take_next, wire_topic_ids
from ..leader.replicas import progress_body
from .source import PartitionInfo, ReplicaSource, SegmentInfo, TopicInfo

__all__ = ["DirectorySource", "REPLICAS_DIR"]

log = logging.getLogger(__name__)

REPLICAS_DIR = "replicas"            # <leader root>/replicas/<follower id>.json
DIGEST_CHUNK_BYTES = 1 << 20      # bytes read at a time to checksum a segment file
_FOLLOWER_ID = re.compile(r"[a-zA-Z0-9._-]{1,64}")
_DEFAULTS = resolve_config("topic", None)
_T = TypeVar("_T")


def _unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


class _Epochs:
    """The leader epochs of one leader partition, re-read only when they can have
    changed: the checkpoint file when it exists (re-parsed when its identity or size
    changes), else the epochs of the batch headers, scanned only past the last scan."""

    def __init__(self) -> None:
        self.file_key: tuple[int, int, int] | None = None
        self.entries: tuple[EpochEntry, ...] = ()
        self.scanned_to = -1               # batch headers scanned below this offset

    def get(self, partition: Partition, log_start: int, log_end: int
            ) -> tuple[EpochEntry, ...]:
        path = os.path.join(partition.directory, CHECKPOINT_FILE)
        try:
            st = os.stat(path)
        except FileNotFoundError:
            return self._from_headers(partition, log_start, log_end)
        key = (st.st_ino, st.st_mtime_ns, st.st_size)
        if key != self.file_key:
            self.entries = tuple(read_checkpoint(partition.directory) or ())
            self.file_key = key
            self.scanned_to = -1
        return self.entries

    def _from_headers(self, partition: Partition, log_start: int, log_end: int
                      ) -> tuple[EpochEntry, ...]:
        if self.file_key is not None or not log_start <= self.scanned_to <= log_end:
            self.file_key, self.entries, self.scanned_to = None, (), log_start
        if self.scanned_to < log_end:
            headers = partition.batch_headers(self.scanned_to)
            found = epochs_from_headers(headers)
            entries = list(self.entries)
            for entry in found:
                if not entries or entry.epoch > entries[-1].epoch:
                    entries.append(entry)
            self.entries = tuple(entries)
            if headers:
                self.scanned_to = max(self.scanned_to, headers[-1].last_offset + 1)
        return self.entries


def last_offset_of(data: bytes) -> int:
    """The last offset of the last whole batch in `data` (batches as stored)."""
    last = -1
    for _, header in iter_batches(data, 0, len(data), gaps=True):
        last = header.last_offset
    return last


class SegmentDigests:
    """The SHA-256 of one partition's sealed segments, kept by file identity (a
    leader's, for `segments()`; a follower's own, to compare with them)."""

    TRIES = 3

    def __init__(self) -> None:
        self.known: dict[int, tuple[tuple[int, int, int], int, str]] = {}

    def listing(self, p: Partition) -> tuple[SegmentInfo, ...]:
        for _ in range(self.TRIES):
            count, start = p.clean_count, p.log_start_offset
            bases = p.segment_base_offsets()
            try:
                found = tuple(self.segment(p, base, end, start)
                              for base, end in zip(bases, bases[1:]))
            except (FileNotFoundError, OffsetOutOfRangeError):
                continue                      # retired or swapped meanwhile
            if p.clean_count == count and p.segment_base_offsets() == bases:
                for base in set(self.known) - set(bases):
                    self.known.pop(base, None)     # (TCP connections share it)
                return found
        raise StorageError(f"{p.directory}: the segments kept changing while they were "
                           "listed; asking again later", operation="list segments",
                           path=p.directory)

    def segment(self, p: Partition, base: int, end: int, start: int) -> SegmentInfo:
        if start > base:                  # the log start inside: from its batch on
            digest, size, at = hashlib.sha256(), 0, start
            while at < end:
                data = p.batches_since(at, upto=end, max_bytes=DIGEST_CHUNK_BYTES)
                if not data:
                    break
                digest.update(data)
                size += len(data)
                at = last_offset_of(data) + 1
            return SegmentInfo(base, end, start, size, digest.hexdigest())
        path = os.path.join(p.directory, segment_file_name(base, ".log"))
        with open(path, "rb") as f:
            st = os.fstat(f.fileno())
            key = (st.st_ino, st.st_size, st.st_mtime_ns)
            known = self.known.get(base)
            if known is None or known[0] != key:
                digest = hashlib.sha256()
                while chunk := f.read(DIGEST_CHUNK_BYTES):
                    digest.update(chunk)
                known = self.known[base] = (key, st.st_size, digest.hexdigest())
        return SegmentInfo(base, end, base, known[1], known[2])


class DirectorySource(ReplicaSource):
    """`logkit.DirectorySource(path)`: copy from the leader whose root is `path`.

    `report_progress=False` never writes under the leader's root (a read-only mount);
    the leader then cannot count this follower in its ISR."""

    def __init__(self, path: str | os.PathLike[str], *, report_progress: bool = True) -> None:
        self.path = os.fspath(path)
        self.reports = report_progress
        self._broker: Broker | None = None
        self._topics: dict[str, Topic] = {}
        self._epochs: dict[TopicPartition, _Epochs] = {}
        self._digests: dict[TopicPartition, SegmentDigests] = {}
        self._doorbell: Doorbell | None = None
        self._doorbell_tried = False
        self._seen: int | None = None        # the doorbell at the cycle's first look
        self._report_warned = False

    def describe(self) -> str:
        return f"DirectorySource({self.path!r})"

    def _open(self) -> Broker:
        broker = self._broker
        if broker is None or broker.closed:
            broker = self._broker = Broker(self.path, read_only=True)
        return broker

    # ---- ReplicaSource ------------------------------------------------------------------

    def topics(self) -> dict[str, TopicInfo]:
        broker = self._open()
        wire_ids = wire_topic_ids(self.path)       # the leader is a promoted follower
        out = {}
        for name in broker.topics():
            try:
                topic = broker.topic(name)
            except UnknownTopicError:                 # deleted meanwhile
                continue
            # Any other error raises: a topic left out would read as deleted, and the
            # follower would delete its copy.
            self._topics[name] = topic
            overrides = {k: v for k, v in topic.config.items() if _DEFAULTS.get(k) != v}
            out[name] = TopicInfo(name, topic.num_partitions, overrides, topic.topic_id,
                                  topic.replication_factor,
                                  wire_ids.get(topic.topic_id))
        return out

    def _call(self, topic: str, partition: int, fn: Callable[[Partition], _T]) -> _T:
        """`fn(partition)` on the leader's partition. Topic handles are kept between
        calls (the metadata read is most of a small fetch's cost); one that raises
        UnknownTopicError (deleted, re-created, or grown since) is looked up again
        once."""
        for again in (False, True):
            topic_handle = self._topics.get(topic)
            if topic_handle is None or again:
                topic_handle = self._topics[topic] = self._open().topic(topic)
            try:
                return fn(topic_handle.partition(partition))
            except UnknownTopicError:
                self._topics.pop(topic, None)
                if again:
                    raise
        raise AssertionError("unreachable")

    def partition(self, topic: str, partition: int) -> PartitionInfo:
        if self._seen is None:             # the doorbell before the first look of a
            doorbell = self._open_doorbell()    # cycle: wait() then misses no append
            self._seen = None if doorbell is None else doorbell.value()

        def state(p: Partition) -> PartitionInfo:
            count = p.clean_count           # before the segments: a swap after is news
            start, end = p.log_start_offset, p.log_end_offset
            bases = tuple(p.segment_base_offsets())
            cache = self._epochs.setdefault(TopicPartition(topic, partition), _Epochs())
            return PartitionInfo(start, end, cache.get(p, start, end), bases, count)
        return self._call(topic, partition, state)

    def segments(self, topic: str, partition: int) -> tuple[SegmentInfo, ...]:
        """Each sealed segment of the leader's partition with the SHA-256 of its file
        (kept per file identity: a sealed file is replaced, never changed in place);
        for the first segment when the log start lies inside it, of its batches from
        the one holding the log start. A listing that a swap or a roll overtook is
        made again; StorageError when that keeps happening."""
        digests = self._digests.setdefault(TopicPartition(topic, partition), SegmentDigests())
        return self._call(topic, partition, digests.listing)

    def fetch(self, topic: str, partition: int, offset: int, *, max_bytes: int) -> bytes:
        return self._call(topic, partition, lambda p: p.batches_since(
            offset, upto=p.log_end_offset, max_bytes=max_bytes))

    def committed_offsets(self) -> dict[str, dict[TopicPartition, int]]:
        broker = self._open()
        return {group: broker.group(group).committed() for group in broker.groups()}

    def report_progress(self, follower_id: str,
                        log_end_offsets: Mapping[TopicPartition, int]) -> None:
        """Write `<leader>/replicas/<follower_id>.json`: the follower's log end offset
        per partition, its last caught-up times (`log_end_offsets.caught_up_ms`, see
        `leader.Progress`) and the time, then ring the leader's doorbell so its
        processes work out the ISR and high watermark again (leader.py). A leader root
        that cannot be written is reported once at WARNING and then left alone."""
        if not self.reports:
            return
        if not _FOLLOWER_ID.fullmatch(follower_id):
            raise ConfigError(f"follower id {follower_id!r} must be 1-64 characters "
                              "from [a-zA-Z0-9._-]")
        directory = os.path.join(self.path, REPLICAS_DIR)
        path = os.path.join(directory, f"{follower_id}.json")
        body = progress_body(follower_id, log_end_offsets)
        tmp = f"{path}.{os.getpid()}.tmp"
        try:
            os.makedirs(directory, mode=0o700, exist_ok=True)
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW
                         | os.O_CLOEXEC, 0o600)
            with open(fd, "w", encoding="utf-8") as f:
                json.dump(body, f)
            os.replace(tmp, path)
        except OSError as exc:
            _unlink_quietly(tmp)
            if not self._report_warned:
                self._report_warned = True
                log.warning("%s: cannot report progress to the leader (%s); it will not "
                            "count this follower as in sync", self.describe(), exc)
            return
        doorbell = self._open_doorbell()
        if doorbell is not None:
            doorbell.ring()
            if self._seen is not None:           # our own ring is no news to wait()
                self._seen = (self._seen + 1) & 0xFFFFFFFF

    def leader_listener(self) -> dict[str, Any] | None:
        """What `<leader>/listener.json` names (the leader's Kafka listener writes it
        while it runs: logkit/protocol/cluster.py)."""
        from ..protocol.cluster import read_listener_body
        return read_listener_body(self.path)

    @property
    def keeps_lease(self) -> bool:
        """A leader takes its lease once a follower reports (lease.py): only a source
        that reports can count on seeing one."""
        return self.reports

    def lease(self) -> Lease | None:
        """The lease in the leader's root when it names that root's own replica (a lease
        naming another replica means leadership moved there: nothing to take over)."""
        current = read_lease(self.path)
        if current is None or current.holder != replica_id(self.path, create=False):
            return None
        return current

    def take_lease(self, holder: str, *, ttl_ms: int, min_epoch: int) -> Lease:
        """Take the lease in the leader's root (lease.take_next, under its lock).
        NotLeaderError while another holder's lease is valid, or when it names a
        replica other than this leader and `holder` (leadership moved: follow the new
        leader instead); StorageError when the root is not a reachable logkit root."""
        if not os.path.isfile(os.path.join(self.path, "logkit.json")):
            raise StorageError(f"{self.path} is not reachable as a logkit root (no "
                               "logkit.json)", operation="take lease", path=self.path)
        current = read_lease(self.path)
        if current is not None and current.holder not in (
                holder, replica_id(self.path, create=False)):
            raise NotLeaderError(
                f"{self.path} is no longer the leader: its lease names replica "
                f"{current.holder} (epoch {current.epoch}); follow that replica, and "
                "promote against it")
        return take_next(self.path, holder, ttl_ms=ttl_ms, min_epoch=min_epoch)

    def wait(self, timeout_s: float) -> None:
        """Sleep on the leader's doorbell (rung after every append) until it rings or
        `timeout_s` passes; plain sleeps where the doorbell cannot be opened. A ring
        since the first `partition()` of this cycle returns at once (an append made
        while the follower looked, which it may not have seen)."""
        doorbell = self._open_doorbell()
        if doorbell is None:
            super().wait(min(timeout_s, 0.05))
            return
        deadline = time.monotonic() + timeout_s
        seen, self._seen = self._seen, None
        if seen is None:
            seen = doorbell.value()
        while doorbell.value() == seen:
            left = deadline - time.monotonic()
            if left <= 0:
                return
            doorbell.wait(seen, left)

    def _open_doorbell(self) -> Doorbell | None:
        if self._doorbell is None and not self._doorbell_tried:
            self._doorbell_tried = True
            if os.access(os.path.join(self.path, DOORBELL_FILE), os.W_OK):
                try:
                    self._doorbell = Doorbell(self.path)
                except (StorageError, OSError) as exc:
                    log.debug("%s: no doorbell (%s); polling", self.describe(), exc)
        return self._doorbell

    def close(self) -> None:
        broker, self._broker = self._broker, None
        doorbell, self._doorbell = self._doorbell, None
        self._doorbell_tried = False
        self._seen = None
        self._epochs.clear()
        self._digests.clear()
        self._topics.clear()
        if doorbell is not None:
            doorbell.close()
        if broker is not None:
            broker.close()

    # the leader's own view, for tests and `logkit replicas`

    def progress(self) -> dict[str, dict[str, Any]]:
        """The progress files followers wrote under this leader: {follower id: body}."""
        directory = os.path.join(self.path, REPLICAS_DIR)
        out = {}
        try:
            names = os.listdir(directory)
        except FileNotFoundError:
            return {}
        for name in names:
            if name.endswith(".json"):
                try:
                    fd = open_file(os.path.join(directory, name), os.O_RDONLY)
                    with open(fd, encoding="utf-8") as f:
                        out[name[:-5]] = json.load(f)
                except (OSError, ValueError):
                    continue                       # being replaced: read it next time
                except StorageError:
                    log.warning("ignoring replica progress file %s: a symbolic link", name)
        return out
