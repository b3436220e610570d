"""The leader's side of replication: the replica assignment, the ISR, the high
watermark, and acks="all" (docs/design.md §8, docs/replication.md).

Owns, under the leader's root:

- `replicas/<follower id>.json`, the followers' progress (a source writes them:
  `DirectorySource.report_progress`, or a transport in the leader's process through
  `ReplicaState.record_progress`): per partition the follower's log end offset and its
  last caught-up time (Kafka's lastCaughtUpTimeMs: when its log end last reached the
  leader's log end);
- `replicas/replica-assignment`, the assigned replica set of each replicated topic
  (Kafka's replica assignment): the leader and the first `replication_factor - 1`
  followers that reported for it, kept across restarts; a follower beyond it copies but
  never counts for the ISR, the high watermark, acks or min.insync.replicas;
- `<partition dir>/high-watermark`, a small mmap'd file holding the partition's
  published high watermark, which every process on the directory reads.

The rules, as Kafka's: the ISR of a partition is the leader plus each assigned
follower whose last caught-up time is within `replica.lag.time.max.ms`; the high
watermark is the minimum log end offset over the ISR, published only upwards (except
down to the log end after a truncation). Any process may compute and publish it — the
inputs are all files — so the leader's processes (the producer's acks waiter, readers)
advance it whenever they read it and records wait above it. Wake-ups: a follower rings
the root's doorbell after each report, so every waiter reads the report that moved it;
a move caused by time alone (a follower aged out of the ISR) is rung by the process
that published it.

Costs: an unreplicated topic (replication factor 1) never reaches this module: its
partitions are plain `Partition`s, the high watermark the log end, as before. A
replicated partition's high watermark is one tail read and one mmap read when nothing
is pending, and a stat per follower file when records wait above it.

Invariant: the published high watermark never exceeds the log end offset of any
replica in the ISR at the time it was computed, so a consumer never sees a record that
the in-sync replicas do not all hold.

Threads: `ReplicaState` is shared by a broker's partitions and safe from any thread;
`AckWaiter` owns one daemon thread per producer.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import mmap
import os
import struct
import threading
import time
from typing import Any, Callable, Iterable, Iterator, Mapping, NamedTuple

from ..errors import StorageError
from .._files import open_file
from ..topic import Partition, TopicPartition

__all__ = ["ReplicaState", "ReplicatedPartition", "Progress",
           "REPLICAS_DIR", "ASSIGNMENT_FILE", "HW_FILE", "in_sync_replicas",
           "describe_replicas"]

log = logging.getLogger(__name__)

REPLICAS_DIR = "replicas"                 # <root>/replicas/<follower id>.json
ASSIGNMENT_FILE = "replica-assignment"    # <root>/replicas/replica-assignment (JSON)
ASSIGNMENT_LOCK = "replica-assignment.lock"
HW_FILE = "high-watermark"                # <partition dir>/high-watermark
LISTING_MAX_AGE_S = 1.0                   # replicas/ is re-listed this often (new followers)
ISR_CHECK_MAX_AGE_MS = 10                 # the pre-append ISR check takes a view this old

# high-watermark layout (little-endian, 32 bytes): written under an flock of the file,
# read without a lock through the sequence number (odd while a writer is mid-update).
HW_MAGIC = b"LKHW"
HW_VERSION = 1
_HEAD = struct.Struct("<4sI")
_SEQ = struct.Struct("<Q")
_VALUE = struct.Struct("<q")
SEQ_OFFSET = _HEAD.size
HW_OFFSET = SEQ_OFFSET + _SEQ.size
UPDATED_MS_OFFSET = HW_OFFSET + _VALUE.size
HW_FILE_BYTES = UPDATED_MS_OFFSET + _VALUE.size
assert HW_FILE_BYTES == 32


def _now_ms() -> int:
    return int(time.time() * 1000)


def _tp_key(tp: TopicPartition) -> str:
    return f"{tp.topic}-{tp.partition}"


class Progress(dict):
    """What a follower reports: {TopicPartition: log end offset}, and in
    `caught_up_ms` {TopicPartition: the last time (ms) its log end reached the
    leader's}. A dict, so sources that know only the log ends take it as before."""

    caught_up_ms: dict[TopicPartition, int]
    listener: dict[str, Any] | None         # the follower's Kafka listener, if it serves

    def __init__(self, ends: Mapping[TopicPartition, int] = (),  # type: ignore[assignment]
                 caught_up_ms: Mapping[TopicPartition, int] | None = None,
                 listener: Mapping[str, Any] | None = None) -> None:
        super().__init__(ends)
        self.caught_up_ms = dict(caught_up_ms or {})
        self.listener = dict(listener) if listener else None


def progress_body(follower_id: str, progress: Mapping[TopicPartition, int]) -> dict:
    """The JSON body of a progress file."""
    caught = getattr(progress, "caught_up_ms", {})
    body = {"follower_id": follower_id, "time_ms": _now_ms(),
            "log_end_offsets": {_tp_key(tp): end for tp, end in sorted(progress.items())},
            "caught_up_ms": {_tp_key(tp): ms for tp, ms in sorted(caught.items())}}
    listener = getattr(progress, "listener", None)
    if listener:
        body["listener"] = dict(listener)
    return body


class _Report(NamedTuple):
    """One parsed progress file."""

    time_ms: int
    ends: dict[str, int]
    caught_up_ms: dict[str, int]
    listener: dict[str, Any] | None = None    # {node_id, host, port} of its listener


def _parse_report(body: Any) -> _Report | None:
    try:
        ends = {str(k): int(v) for k, v in body["log_end_offsets"].items()}
        caught = {str(k): int(v) for k, v in (body.get("caught_up_ms") or {}).items()}
        listener = body.get("listener")
        return _Report(int(body["time_ms"]), ends, caught,
                       listener if isinstance(listener, dict) else None)
    except (TypeError, KeyError, ValueError, AttributeError):
        return None


def in_sync_replicas(assigned: Iterable[str], reports: Mapping[str, _Report], key: str,
                     leader_end: int, now_ms: int, lag_time_max_ms: int
                     ) -> dict[str, int]:
    """The assigned followers in the ISR of partition `key` ("topic-n"), with their log
    end offsets (at most the leader's): those whose last caught-up time is within
    `lag_time_max_ms` of `now_ms`. A report without caught-up times (a source that does
    not send them) counts its report time when it was at the leader's log end."""
    out = {}
    for follower in assigned:
        report = reports.get(follower)
        if report is None or key not in report.ends:
            continue
        end = report.ends[key]
        caught = report.caught_up_ms.get(key)
        if caught is None and end >= leader_end:
            caught = report.time_ms
        if caught is not None and now_ms - caught <= lag_time_max_ms:
            out[follower] = min(end, leader_end)
    return out


class HighWatermarkFile:
    """One partition's `high-watermark` file (layout above)."""

    def __init__(self, directory: str, *, writable: bool, initial: int) -> None:
        self.path = os.path.join(directory, HW_FILE)
        self.writable = writable
        flags = os.O_RDWR | os.O_CREAT if writable else os.O_RDONLY
        self.fd = open_file(self.path, flags)
        try:
            if os.fstat(self.fd).st_size < HW_FILE_BYTES:
                if not writable:
                    raise FileNotFoundError(self.path)
                with self._locked():
                    if os.fstat(self.fd).st_size < HW_FILE_BYTES:
                        body = _HEAD.pack(HW_MAGIC, HW_VERSION) + _SEQ.pack(0) + \
                            _VALUE.pack(initial) + _VALUE.pack(_now_ms())
                        os.pwrite(self.fd, body, 0)
                        os.fsync(self.fd)
            access = mmap.ACCESS_WRITE if writable else mmap.ACCESS_READ
            self.mm = mmap.mmap(self.fd, HW_FILE_BYTES, access=access)
            if self.mm[:4] != HW_MAGIC:
                raise StorageError(f"{self.path} is not a logkit high-watermark file",
                                   operation="open", path=self.path)
        except BaseException:
            os.close(self.fd)
            raise

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        fcntl.flock(self.fd, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(self.fd, fcntl.LOCK_UN)

    def read(self) -> int:
        mm = self.mm
        for _ in range(10000):
            before = _SEQ.unpack_from(mm, SEQ_OFFSET)[0]
            value = _VALUE.unpack_from(mm, HW_OFFSET)[0]
            if not before & 1 and _SEQ.unpack_from(mm, SEQ_OFFSET)[0] == before:
                return value
        raise StorageError(f"{self.path}: a writer died mid-update", operation="read",
                           path=self.path)

    def publish(self, candidate: int, log_end: int) -> tuple[int, bool]:
        """Raise the published value to `candidate` (never lower it, except down to
        `log_end` after a truncation); returns (value, whether it changed)."""
        with self._locked():
            seq = _SEQ.unpack_from(self.mm, SEQ_OFFSET)[0]
            repair = seq & 1                     # a writer died mid-update: its value
            seq += repair                        # is whole or the old one; both hold
            current = _VALUE.unpack_from(self.mm, HW_OFFSET)[0]
            value = max(min(current, log_end), min(candidate, log_end))
            if value == current and not repair:
                return current, False
            _SEQ.pack_into(self.mm, SEQ_OFFSET, seq + 1)
            _VALUE.pack_into(self.mm, HW_OFFSET, value)
            _VALUE.pack_into(self.mm, UPDATED_MS_OFFSET, _now_ms())
            _SEQ.pack_into(self.mm, SEQ_OFFSET, seq + 2)
            return value, value != current

    def close(self) -> None:
        mm, self.mm = self.mm, None
        if mm is not None:
            try:
                mm.close()
            except BufferError:
                pass
            os.close(self.fd)


class PartitionReplicas(NamedTuple):
    """What `logkit replicas` shows for one partition."""

    topic_partition: TopicPartition
    replicas: list[str]                  # "leader", then the assigned followers
    isr: list[str]
    log_end_offset: int
    high_watermark: int
    followers: dict[str, dict[str, Any]]  # id -> log_end_offset, lag, caught_up_ms, assigned


class ReplicaState:
    """The replica state of one leader root, for every replicated partition a broker
    has open. `writable=False` computes without publishing (a read-only broker, `logkit
    replicas`); `ring` is called when the high watermark moved without a report."""

    def __init__(self, root: str, *, lag_time_max_ms: int, writable: bool,
                 ring: Callable[[], None] | None = None) -> None:
        self.root = root
        self.directory = os.path.join(root, REPLICAS_DIR)
        self.lag_time_max_ms = lag_time_max_ms
        self.writable = writable
        self._ring = ring
        self._lock = threading.RLock()
        self._listed_at = -1.0
        self._version = 0                 # bumped whenever a report changes
        self._file_keys: dict[str, tuple[int, int, int]] = {}
        self._reports: dict[str, _Report] = {}
        # partition -> (reports version, log end, valid until ms, ISR, worked out at ms)
        self._isr_cache: dict[str, tuple[int, int, int, dict[str, int], int]] = {}
        self._assignment_key: tuple[int, int, int] | None = None
        self._assignment: dict[str, dict[str, Any]] = {}
        self._hw_files: dict[str, HighWatermarkFile | None] = {}
        self._warned: set[str] = set()

    # ---- inputs: progress files and the assignment --------------------------------

    def reports(self) -> dict[str, _Report]:
        """The followers' latest progress, re-read only where a file changed."""
        with self._lock:
            self._refresh_reports()
            return dict(self._reports)

    def _refresh_reports(self) -> None:
        """Re-read the progress files that changed (a report replaces its file, so a
        new inode): every known file is stat'ed on every call (a process woken by a
        follower's ring must see its report), and the directory is listed for new
        followers every LISTING_MAX_AGE_S."""
        now = time.monotonic()
        if now - self._listed_at > LISTING_MAX_AGE_S:
            try:
                names = [n[:-5] for n in os.listdir(self.directory) if n.endswith(".json")]
            except FileNotFoundError:
                names = []
            for gone in set(self._file_keys) - set(names):
                self._reports.pop(gone, None)
                self._file_keys.pop(gone, None)
                self._version += 1
            for name in names:
                self._file_keys.setdefault(name, (0, 0, 0))
            self._listed_at = now
        for name in list(self._file_keys):
            path = os.path.join(self.directory, f"{name}.json")
            try:
                fst = os.lstat(path)
            except FileNotFoundError:
                self._file_keys.pop(name, None)
                self._reports.pop(name, None)
                self._version += 1
                continue
            key = (fst.st_ino, fst.st_mtime_ns, fst.st_size)
            if key == self._file_keys[name]:
                continue
            try:
                fd = open_file(path, os.O_RDONLY)
                with open(fd, encoding="utf-8") as f:
                    report = _parse_report(json.load(f))
            except StorageError:
                self._warn(path, "ignoring replica progress file %s: a symbolic link")
                continue
            except (OSError, ValueError):
                continue                         # being replaced: read it next time
            self._file_keys[name] = key
            self._version += 1
            if report is None:
                self._warn(path, "ignoring replica progress file %s: not a progress body")
                self._reports.pop(name, None)
            else:
                self._reports[name] = report

    def _warn(self, path: str, message: str) -> None:
        if path not in self._warned:
            self._warned.add(path)
            log.warning(message, path)

    def _read_assignment(self) -> dict[str, dict[str, Any]]:
        path = os.path.join(self.directory, ASSIGNMENT_FILE)
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            self._assignment_key, self._assignment = None, {}
            return self._assignment
        key = (st.st_ino, st.st_mtime_ns, st.st_size)
        if key != self._assignment_key:
            try:
                fd = open_file(path, os.O_RDONLY)
                with open(fd, encoding="utf-8") as f:
                    body = json.load(f)
                assignment = {str(t): {"topic_id": str(v["topic_id"]),
                                       "followers": [str(x) for x in v["followers"]]}
                              for t, v in body.items()}
            except (OSError, ValueError, TypeError, KeyError, AttributeError) as exc:
                self._warn(path, f"ignoring the replica assignment %s: {exc}")
                return self._assignment
            self._assignment_key, self._assignment = key, assignment
        return self._assignment

    def assigned(self, topic: str, topic_id: str, replication_factor: int) -> list[str]:
        """The followers assigned to `topic` (at most replication_factor - 1): those
        already recorded, then the earliest reporters of its partitions, recorded for
        good (under a lock, so two processes agree)."""
        with self._lock:
            self._refresh_reports()
            entry = self._read_assignment().get(topic)
            have = entry["followers"] if entry and entry["topic_id"] == topic_id else []
            wanted = replication_factor - 1
            if len(have) >= wanted:
                return have[:wanted]
            prefix = f"{topic}-"
            candidates = sorted((r.time_ms, name) for name, r in self._reports.items()
                                if name not in have
                                and any(k.startswith(prefix) for k in r.ends))
            if not candidates:
                return have
            if not self.writable:
                return have + [name for _, name in candidates[:wanted - len(have)]]
            return self._assign(topic, topic_id, wanted, [n for _, n in candidates])

    def _assign(self, topic: str, topic_id: str, wanted: int,
                candidates: list[str]) -> list[str]:
        os.makedirs(self.directory, mode=0o700, exist_ok=True)
        lock_fd = open_file(os.path.join(self.directory, ASSIGNMENT_LOCK),
                            os.O_RDWR | os.O_CREAT)
        try:
            fcntl.flock(lock_fd, fcntl.LOCK_EX)
            self._assignment_key = None                  # re-read under the lock
            assignment = {t: dict(v) for t, v in self._read_assignment().items()}
            entry = assignment.get(topic)
            have = list(entry["followers"]) if entry and entry["topic_id"] == topic_id \
                else []
            for name in candidates:
                if len(have) >= wanted:
                    break
                if name not in have:
                    have.append(name)
            assignment[topic] = {"topic_id": topic_id, "followers": have}
            path = os.path.join(self.directory, ASSIGNMENT_FILE)
            tmp = f"{path}.{os.getpid()}.tmp"
            fd = open_file(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
            with open(fd, "w", encoding="utf-8") as f:
                json.dump(assignment, f, sort_keys=True, indent=1)
                f.write("\n")
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
            self._assignment_key = None
            log.info("%s: topic %s replicas: the leader and %s", self.root, topic, have)
            return have
        finally:
            os.close(lock_fd)                             # releases the flock

    # ---- the ISR and the high watermark -------------------------------------------

    def _hw_file(self, partition: Partition) -> HighWatermarkFile | None:
        directory = partition.directory
        hw_file = self._hw_files.get(directory, False)
        if hw_file is False:
            try:
                hw_file = HighWatermarkFile(directory, writable=self.writable,
                                            initial=partition.log_start_offset)
            except FileNotFoundError:
                hw_file = None                           # read-only and none yet
            except OSError as exc:
                if self.writable:
                    raise
                log.debug("%s: no high watermark file (%s)", directory, exc)
                hw_file = None
            self._hw_files[directory] = hw_file
        return hw_file  # type: ignore[return-value]

    def in_sync(self, partition: Partition, topic_id: str, replication_factor: int,
                log_end: int | None = None, *, max_age_ms: int = 0,
                relist: bool = False) -> dict[str, int]:
        """The assigned followers now in the ISR of `partition`, with their log ends;
        `max_age_ms` accepts a view worked out that recently (the producer's check
        before each append: Kafka's leader also judges by its last view); `relist`
        lists replicas/ now instead of within LISTING_MAX_AGE_S (before refusing a
        write, a follower that has just started must count)."""
        key = _tp_key(partition.topic_partition)
        now_ms = _now_ms()
        with self._lock:
            if relist:
                self._listed_at = -1.0
                self._isr_cache.pop(key, None)
            cached = self._isr_cache.get(key)
            if max_age_ms and cached is not None and now_ms < cached[2] \
                    and now_ms - cached[4] <= max_age_ms:
                return cached[3]
            if log_end is None:
                log_end = Partition.log_end_offset.fget(partition)  # type: ignore
            assigned = self.assigned(partition.topic, topic_id, replication_factor)
            if cached is not None and cached[:2] == (self._version, log_end) \
                    and now_ms < cached[2]:
                return cached[3]
            isr = in_sync_replicas(assigned, self._reports, key, log_end, now_ms,
                                   self.lag_time_max_ms)
            # valid until a report changes, the log end moves, or the first member's
            # caught-up time ages past replica.lag.time.max.ms
            expiry = min([now_ms + LISTING_MAX_AGE_S * 1000] + [
                self._caught_up(name, key, log_end) + self.lag_time_max_ms
                for name in isr])
            self._isr_cache[key] = (self._version, log_end, int(expiry), isr, now_ms)
            return isr

    def _caught_up(self, name: str, key: str, log_end: int) -> int:
        report = self._reports[name]
        caught = report.caught_up_ms.get(key)
        return report.time_ms if caught is None else caught

    def high_watermark(self, partition: Partition, topic_id: str,
                       replication_factor: int) -> int:
        """The partition's high watermark: the published one when it is at the log
        end, else worked out again from the ISR (and published when it moved)."""
        log_end = Partition.log_end_offset.fget(partition)  # type: ignore[attr-defined]
        with self._lock:
            hw_file = self._hw_file(partition)
            published = hw_file.read() if hw_file is not None else -1
            if published >= log_end:
                return log_end
            isr = self.in_sync(partition, topic_id, replication_factor, log_end)
            candidate = min([log_end, *isr.values()])
            if hw_file is None or not self.writable:
                return max(min(published, log_end), candidate)
            value, moved = hw_file.publish(candidate, log_end)
            shrunk = len(isr) < len(self.assigned(partition.topic, topic_id,
                                                   replication_factor))
        # A move caused by a report needs no ring: the follower rang after writing it,
        # and whoever woke reads it. One caused by time (a follower aged out of the
        # ISR, or none assigned yet) does: nobody else rang.
        if moved and shrunk and self._ring is not None:
            self._ring()
        return value

    def record_progress(self, follower_id: str, progress: Mapping[TopicPartition, int]
                        ) -> None:
        """Write `replicas/<follower_id>.json` (atomically) for a transport that
        receives progress in the leader's process; the caller then advances the high
        watermarks it serves (`high_watermark`)."""
        os.makedirs(self.directory, mode=0o700, exist_ok=True)
        path = os.path.join(self.directory, f"{follower_id}.json")
        tmp = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"
        fd = open_file(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        with open(fd, "w", encoding="utf-8") as f:
            json.dump(progress_body(follower_id, progress), f)
        os.replace(tmp, path)

    def describe(self, partition: Partition, topic_id: str,
                 replication_factor: int) -> PartitionReplicas:
        """The replica set, ISR, followers' lag and high watermark of one partition."""
        log_end = Partition.log_end_offset.fget(partition)  # type: ignore[attr-defined]
        hw = self.high_watermark(partition, topic_id, replication_factor)
        with self._lock:
            assigned = self.assigned(partition.topic, topic_id, replication_factor)
            isr = self.in_sync(partition, topic_id, replication_factor, log_end)
            key = _tp_key(partition.topic_partition)
            followers = {}
            for name, report in sorted(self._reports.items()):
                if key not in report.ends:
                    continue
                end = report.ends[key]
                followers[name] = {"log_end_offset": end, "lag": max(0, log_end - end),
                                   "caught_up_ms": report.caught_up_ms.get(key),
                                   "reported_ms": report.time_ms,
                                   "assigned": name in assigned, "in_sync": name in isr}
        return PartitionReplicas(partition.topic_partition, ["leader", *assigned],
                                 ["leader", *[n for n in assigned if n in isr]],
                                 log_end, hw, followers)

    def close(self) -> None:
        with self._lock:
            files, self._hw_files = self._hw_files, {}
        for hw_file in files.values():
            if hw_file is not None:
                hw_file.close()


class ReplicatedPartition(Partition):
    """A partition of a topic whose replication factor is above 1: reads stop at the
    high watermark that the ISR allows, not at the log end. Everything else is
    `Partition`'s (a replica fetch passes `upto=p.log_end_offset` and reads past it)."""

    replicated = True

    def __init__(self, topic: str, partition: int, opener: Callable[[int], Any],
                 log: Any, *, replicas: ReplicaState, topic_id: str,
                 replication_factor: int) -> None:
        super().__init__(topic, partition, opener, log)
        self.replicas = replicas
        self.topic_id = topic_id
        self.replication_factor = replication_factor

    @property
    def high_watermark(self) -> int:
        return self.replicas.high_watermark(self, self.topic_id, self.replication_factor)

    def in_sync_replicas(self, *, max_age_ms: int = 0, relist: bool = False) -> list[str]:
        """The ISR: "leader" and the assigned followers in sync now (or as worked out
        at most `max_age_ms` ago; `relist`: with followers that reported for the first
        time in the last second)."""
        return ["leader", *self.replicas.in_sync(self, self.topic_id,
                                                 self.replication_factor,
                                                 max_age_ms=max_age_ms, relist=relist)]

    def read(self, offset: int, max_records: int = 500, *, stop_offset: int | None = None,
             **options: Any) -> list[Any]:
        hw = self.high_watermark
        stop = hw if stop_offset is None else min(stop_offset, hw)
        return super().read(offset, max_records, stop_offset=stop, **options)

    def fetch(self, offset: int, max_records: int = 500, **options: Any
              ) -> tuple[list[Any], int]:
        hw = self.high_watermark
        return super().read(offset, max_records, stop_offset=hw, **options), hw

    def fetch_records(self, offset: int, max_records: int = 500, *,
                      stop_offset: int | None = None, **options: Any) -> Any:
        hw = self.high_watermark
        stop = hw if stop_offset is None else min(stop_offset, hw)
        got = super().fetch_records(offset, max_records, stop_offset=stop, **options)
        return got._replace(high_watermark=hw,
                            last_stable_offset=min(got.last_stable_offset, hw))

    @property
    def last_stable_offset(self) -> int:
        return min(super().last_stable_offset, self.high_watermark)

    def read_columns(self, offset: int, max_records: int = 500, *,
                     stop_offset: int | None = None) -> tuple[Any, int]:
        hw = self.high_watermark
        stop = hw if stop_offset is None else min(stop_offset, hw)
        return super().read_columns(offset, max_records, stop_offset=stop)

    def batches_since(self, offset: int, upto: int | None = None, **options: Any) -> bytes:
        return super().batches_since(offset, self.high_watermark if upto is None else upto,
                                     **options)

    def offset_for_timestamp(self, ts_ms: int) -> int | None:
        found = super().offset_for_timestamp(ts_ms)
        return found if found is not None and found < self.high_watermark else None


def describe_replicas(broker: Any) -> list[dict[str, Any]]:
    """For `logkit replicas DIR`: one row per partition of every topic — replication
    factor, replica set, ISR, log end offset, high watermark, leader epochs (the
    `leader-epoch-checkpoint`, else the epoch stamped on appends) and each follower's
    log end, lag and whether it counts. Reads only; publishes nothing."""
    from .epochs import read_checkpoint
    state = ReplicaState(broker.path, writable=False,
                         lag_time_max_ms=broker.config["replica.lag.time.max.ms"])
    rows = []
    try:
        for name in broker.topics():
            topic = broker.topic(name)
            factor = topic.replication_factor
            for p in topic.partitions:
                info = state.describe(p, topic.topic_id, factor)
                entries = read_checkpoint(p.directory)
                epochs = [[e.epoch, e.start_offset] for e in entries] if entries \
                    else [[p.leader_epoch, p.log_start_offset]]
                rows.append({"topic": name, "partition": p.partition,
                             "replication_factor": factor, "replicas": info.replicas,
                             "isr": info.isr, "log_end_offset": info.log_end_offset,
                             "high_watermark": info.high_watermark,
                             "leader_epochs": epochs, "followers": info.followers})
    finally:
        state.close()
    return rows
