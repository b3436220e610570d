"""Replication through an object store: the leader ships its files to any fsspec URL,
followers and `logkit restore` read them back (docs/design.md §8, docs/replication.md).

Owns: the layout under the URL, the `Shipper` behind `broker.ship(url)`, the
`ObjectStoreSource` a `logkit.Follower` copies through, and `restore()` behind
`logkit restore URL DIR`.

The layout (keys relative to the URL; `<tid>` is the topic id, so a topic deleted and
re-created under the same name never shares a key with its predecessor — the naming
of Kafka's tiered storage, KIP-405):

| key | what |
|---|---|
| `<topic>-<tid>/<p>/<base:020>.log` | a rolled segment, whole, its bytes those of the leader's file; uploaded once |
| `<topic>-<tid>/<p>/<base:020>.log.<from:020>-<to:020>` | a chunk of the active segment: its whole batches from offset `from` to `to` - 1; each `ship.interval.ms` the log moved adds one with the batches appended since; the newest merge by size tiers (`_tail_merge`), so they stay few; when the segment rolls it is uploaded whole and its chunks retire |
| `<topic>-<tid>/<p>/<base:020>.log.tail.<end:020>` | the first layout's active segment, whole below `end`: still read, never written |
| `<topic>-<tid>/<p>/<base:020>.log.<sha:24>` | a rolled segment shipped again with other bytes (a compacted topic's segment after a cleaning pass), named by the first 24 hex digits of its SHA-256, so no key a manifest names ever gets other bytes; uploaded once |
| `manifest.json` | written last: topics (partitions, config overrides, ids, replication factor), committed group offsets, and per partition its log start and end, its last stable offset and aborted transactions (for read_committed readers), its leader epochs (the `leader-epoch-checkpoint` entries), the leader's clean count (cleaning swaps) and the objects in offset order with their size, SHA-256 and last batch's epoch and CRC |

A compacted topic: its objects may leave offset gaps between and inside them (records
the leader's cleaner removed). When the partition's clean count moved since the last
manifest, each rolled segment's bytes are checksummed again and a segment whose bytes
changed is shipped once more under its content key, replacing its old object in the
manifest; when the count did not move nothing is read again, so a cleaned segment is
shipped once.

Transactions: the `.txnindex` files are not shipped; instead each partition entry
records what a read_committed reader needs (Kafka's Fetch answer, fixed at the shipped
end): `last_stable_offset`, the partition's LSO when the pass ran, never past the
shipped log end, and `aborted_transactions`, `[producer id, first offset, last offset]`
of each aborted transaction whose span meets the shipped [log start, log end) (last
offset: its ABORT marker's), in first-offset order. A batch is aborted when it is transactional and its
base offset lies in a span of its producer (`AbortedBatches`). Manifests written before
these fields lack them: they read as before, and `committed_view` refuses them.

Invariant: readers trust only the manifest, and an object only after its size and
SHA-256 equal the manifest's record and every batch in it passed its CRC. The
manifest names an object only after the object's upload completed and its size was
read back, so a half-uploaded object is never taken as data; a mismatch is a
CorruptRecordError (path, expected, actual). Objects are not rewritten under a key a
live manifest names (chunks carry their offsets; the one exception, a log truncated
below what was shipped and grown back past it, is found by the last batch's epoch and
CRC, shipped again, and a reader that finds the old record stale re-reads the
manifest); objects that leave the manifest are deleted after a grace
(RETIRE_GRACE_MIN_S, or RETIRE_GRACE_INTERVALS ship intervals), so a reader holding
the previous manifest still finds them (a reader later than that re-reads the
manifest). Offset indexes are not shipped: appending the batches rebuilds them.

Threads: a `Shipper` ships from its own thread (and from `flush()`/`close()` in the
caller's), one pass at a time. An `ObjectStoreSource` is used from one follower thread
at a time, like every source. `restore()` runs in the caller's thread.
"""

from __future__ import annotations

import bisect
import hashlib
import json
import logging
import mmap
import os
import re
import shutil
import tempfile
import threading
import time
import uuid
from typing import Any, Callable, Iterable, Mapping, NamedTuple, TypeVar

from ..broker import Broker
from ..config import is_compacted, resolve_config
from .._threads import start_thread
from .._files import fsync_path
from ..errors import (ClosedError, ConfigError, CorruptRecordError, IllegalStateError, LogkitError,
                      NotLeaderError, OffsetOutOfRangeError, ResourceError, StorageError,
                      UnknownTopicError)
from ..group import committed_offsets, list_groups
from ..records import ATTR_CONTROL, ATTR_TRANSACTIONAL, BatchHeader, iter_batches, read_header
from ..topic import Partition, TopicPartition
from .directory import _Epochs, last_offset_of
from ..leader.epochs import EpochEntry
from .follower import Follower
from ..leader.lease import (LEASE_FILE, RENEWALS_PER_TTL, Lease, read_lease, release, renew,
                    replica_id, take_next)
from .source import PartitionInfo, ReplicaSource, SegmentInfo, TopicInfo

__all__ = ["ObjectStoreSource", "Shipper", "restore", "MANIFEST_KEY", "MANIFEST_FORMAT",
           "read_manifest", "may_have_gaps", "AbortedTransaction", "AbortedBatches",
           "committed_view"]

log = logging.getLogger(__name__)

MANIFEST_KEY = "manifest.json"
MANIFEST_FORMAT = "logkit-objectstore-1"
MANIFEST_MAX_BYTES = 256 << 20       # a bigger manifest is refused as corrupt
UPLOAD_CHUNK_BYTES = 4 << 20         # bytes read from a partition per upload write
DOWNLOAD_CHUNK_BYTES = 4 << 20
IN_MEMORY_OBJECT_BYTES = 16 << 20    # larger objects are spooled to a temporary file
RETIRE_GRACE_MIN_S = 5.0             # an object left out of the manifest lives this long,
RETIRE_GRACE_INTERVALS = 3           # ... or this many ship intervals if longer
MAX_BACKOFF_S = 30.0                 # the longest wait after failed passes
MANIFEST_POLL_S = 0.2                # a waiting source re-reads the manifest this often
MANIFEST_TRIES = 3                   # restore(): reads of an unreadable manifest
TAIL_MERGE_FANOUT = 8                # chunks of the active segment merged at a time
TAIL_MERGE_MAX_BYTES = 16 << 20      # ... into at most this many bytes
# a rolled segment, an active segment's chunk, or (manifests before chunks) its tail
_KEY = re.compile(r"[A-Za-z0-9._-]+/[0-9]{1,10}/[0-9]{20}\.log"
                  r"(\.[0-9]{20}-[0-9]{20}|\.tail\.[0-9]{20}|\.[0-9a-f]{24})?")
_WHOLE_KEY = re.compile(r".*/[0-9]{20}\.log(\.[0-9a-f]{24})?")    # a rolled segment's
CONTENT_KEY_DIGITS = 24              # hex digits of the SHA-256 in a content key
_DEFAULTS = resolve_config("topic", None)
_T = TypeVar("_T")


# ---- fsspec -----------------------------------------------------------------------------

def _filesystem(url: str, storage_options: Mapping[str, Any] | None) -> tuple[Any, str]:
    """(fsspec filesystem, root path) for `url`. Options not given come from fsspec's
    configuration and the environment (FSSPEC_S3_ENDPOINT_URL, AWS_* ...)."""
    if not isinstance(url, str) or not url:
        raise ConfigError(f"an object store URL is a non-empty string, got {url!r}")
    try:
        import fsspec
    except ImportError:
        raise ConfigError("object store replication needs fsspec (and s3fs for s3://): "
                          "pip install 'logkit[objectstore]'") from None
    try:
        fs, root = fsspec.core.url_to_fs(url, **dict(storage_options or {}))
    except (ImportError, ValueError) as exc:
        raise ConfigError(f"cannot open object store URL {url!r}: {exc}") from exc
    return fs, root.rstrip("/")


def _is_local(fs: Any) -> bool:
    protocol = fs.protocol if isinstance(fs.protocol, (tuple, list)) else (fs.protocol,)
    return "file" in protocol or "local" in protocol


def _io(what: str, path: str, fn: Callable[[], _T]) -> _T:
    """`fn()`, with a third-party library's non-OSError failure (botocore, aiohttp)
    turned into a StorageError naming the operation; OSErrors pass as they are."""
    try:
        return fn()
    except (LogkitError, OSError):
        raise
    except Exception as exc:
        raise StorageError(f"object store: {what} {path} failed: {type(exc).__name__}: "
                           f"{exc}", operation=what, path=path) from exc


def _read_manifest(fs: Any, root: str) -> dict[str, Any] | None:
    """The parsed manifest under `root`, None when there is none. A manifest that does
    not parse or lacks its fields raises CorruptRecordError."""
    path = f"{root}/{MANIFEST_KEY}"
    try:
        raw = _io("read", path, lambda: fs.cat_file(path))
    except FileNotFoundError:
        return None
    if len(raw) > MANIFEST_MAX_BYTES:
        raise CorruptRecordError("manifest too large", path=path, position=0,
                                 expected=MANIFEST_MAX_BYTES, actual=len(raw))
    try:
        body = json.loads(raw)
        if body["format"] != MANIFEST_FORMAT:
            raise CorruptRecordError(f"unknown manifest format {body['format']!r}",
                                     path=path, position=0, expected=MANIFEST_FORMAT)
        _validate(body)
    except (ValueError, KeyError, TypeError, IndexError) as exc:
        raise CorruptRecordError(f"malformed manifest: {type(exc).__name__}: {exc}",
                                 path=path, position=0) from None
    return body


def _validate(body: dict[str, Any]) -> None:
    """Raise (ValueError, KeyError, TypeError) unless the manifest has the shape the
    readers rely on: ints where offsets are, keys inside the layout."""
    int(body["generation"])
    for name, topic in body["topics"].items():
        str(name), str(topic["topic_id"]), int(topic["partitions"]), dict(topic["config"])
        if int(topic.get("replication_factor", 1)) < 1:
            raise ValueError(f"topic {name}: replication factor below 1")
    for group, rows in body["groups"].items():
        for topic, partition, offset in rows:
            str(topic), int(partition), int(offset)
    for entry in body["partitions"]:
        str(entry["topic"]), int(entry["partition"])
        gaps = _has_gaps(body, entry)
        if not 0 <= int(entry["log_start_offset"]) <= int(entry["log_end_offset"]):
            raise ValueError(f"log start above log end in {entry['topic']}")
        for epoch, start in entry["epochs"]:
            int(epoch), int(start)
        for base in entry["segment_base_offsets"]:
            int(base)
        end = None
        for obj in entry["objects"]:
            if not _KEY.fullmatch(obj["key"]):
                raise ValueError(f"object key {obj['key']!r} outside the layout")
            first, last, size = int(obj["first_offset"]), int(obj["end_offset"]), \
                int(obj["size"])
            if not (first < last and size > 0 and len(obj["sha256"]) == 64):
                raise ValueError(f"object {obj['key']!r}: bad offsets, size or checksum")
            if end is not None and (first < end or (first > end and not gaps)):
                raise ValueError(f"object {obj['key']!r} does not follow the one before")
            end = last
            _Object(**obj)
        _validate_transactions(entry)
        objects = entry["objects"]
        if (end if objects else int(entry["log_start_offset"])) != \
                int(entry["log_end_offset"]) or \
                (objects and not gaps and
                 int(objects[0]["first_offset"]) > int(entry["log_start_offset"])):
            raise ValueError(f"{entry['topic']}-{entry['partition']}: the objects do not "
                             "cover the log start to the log end")


def _validate_transactions(entry: Mapping[str, Any]) -> None:
    """The read_committed fields of a partition entry, when it has them: the LSO within
    [log start, log end], spans with first <= last in first-offset order."""
    if "last_stable_offset" not in entry:
        return                                    # a manifest from before them
    lso = int(entry["last_stable_offset"])
    if not int(entry["log_start_offset"]) <= lso <= int(entry["log_end_offset"]):
        raise ValueError(f"{entry['topic']}-{entry['partition']}: last stable offset "
                         f"{lso} outside the log start to the log end")
    firsts = []
    for producer_id, first, last in entry["aborted_transactions"]:
        int(producer_id)
        if not 0 <= int(first) <= int(last):
            raise ValueError(f"{entry['topic']}-{entry['partition']}: aborted "
                             f"transaction {first}..{last} of producer {producer_id}")
        firsts.append(int(first))
    if firsts != sorted(firsts):
        raise ValueError(f"{entry['topic']}-{entry['partition']}: aborted transactions "
                         "out of offset order")


def read_manifest(url: str, *, storage_options: Mapping[str, Any] | None = None
                  ) -> dict[str, Any] | None:
    """The latest manifest under `url` as readers trust it (parsed and checked: keys
    inside the layout, objects covering each partition's log start to its log end),
    None when nothing was shipped there yet; CorruptRecordError when it is malformed.
    The read API of readers outside this module (the Spark source, DESIGN §18)."""
    fs, root = _filesystem(url, storage_options)
    return _read_manifest(fs, root)


def may_have_gaps(manifest: Mapping[str, Any], entry: Mapping[str, Any]) -> bool:
    """Whether a manifest partition entry's objects may leave offset gaps (compacted
    or cleaned): a reader walking its batches then allows increasing base offsets."""
    return _has_gaps(manifest, entry)


def _has_gaps(body: Mapping[str, Any], entry: Mapping[str, Any]) -> bool:
    """Whether a manifest's partition may have offset gaps: its topic is compacted, or
    its leader cleaned it (a clean count above 0)."""
    topic = body["topics"].get(entry["topic"], {})
    return int(entry.get("clean_count", 0)) > 0 or \
        "compact" in str(topic.get("config", {}).get("cleanup.policy", ""))


class AbortedTransaction(NamedTuple):
    """One aborted transaction of a partition as the manifest records it (the fields of
    Kafka's `.txnindex` entry a reader needs)."""

    producer_id: int
    first_offset: int       # its producer's first batch in the transaction
    last_offset: int        # its ABORT marker


def committed_view(manifest_url: str, entry: Mapping[str, Any]
                   ) -> tuple[int, list[AbortedTransaction]]:
    """(last stable offset, aborted transactions) a manifest partition entry records for
    read_committed readers. A manifest written before they were shipped has neither:
    ConfigError naming it (it stays readable read_uncommitted)."""
    if "last_stable_offset" not in entry:
        raise ConfigError(
            f"the manifest at {manifest_url.rstrip('/')}/{MANIFEST_KEY} records no last "
            f"stable offset or aborted transactions for {entry['topic']}-"
            f"{entry['partition']} (shipped by a logkit before they were): it can be read "
            "read_uncommitted only, until a newer shipper writes it again")
    return int(entry["last_stable_offset"]), [
        AbortedTransaction(int(pid), int(first), int(last))
        for pid, first, last in entry["aborted_transactions"]]


class AbortedBatches:
    """Which batches a read_committed reader leaves out, from a partition's aborted
    transactions: control batches, and a transactional batch whose base offset lies in
    an aborted span [first offset, last offset] of its producer (a producer has one
    transaction open at a time, so its batches between the two are that transaction's;
    Kafka's consumer reaches the same answer by walking to the ABORT marker)."""

    def __init__(self, aborted: Iterable[tuple[int, int, int]]) -> None:
        spans: dict[int, list[tuple[int, int]]] = {}
        for producer_id, first, last in aborted:
            spans.setdefault(int(producer_id), []).append((int(first), int(last)))
        self._firsts = {pid: [f for f, _ in sorted(s)] for pid, s in spans.items()}
        self._lasts = {pid: [last for _, last in sorted(s)] for pid, s in spans.items()}

    def __bool__(self) -> bool:
        return bool(self._firsts)

    def skips(self, header: BatchHeader) -> bool:
        """Whether read_committed leaves this batch out."""
        if header.attributes & ATTR_CONTROL:
            return True
        if not header.attributes & ATTR_TRANSACTIONAL:
            return False
        firsts = self._firsts.get(header.producer_id)
        if firsts is None:
            return False
        i = bisect.bisect_right(firsts, header.base_offset) - 1
        return i >= 0 and header.base_offset <= self._lasts[header.producer_id][i]


class _Object(NamedTuple):
    """One shipped object as the manifest records it."""

    key: str
    segment: int            # base offset of the leader's segment it belongs to
    first_offset: int       # base offset of its first batch
    end_offset: int         # one past its last batch's last offset
    size: int
    sha256: str
    last_batch: str = ""    # "<partitionLeaderEpoch>:<crc>" of its last batch ("": unknown)

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> "_Object":
        return cls(**record)

    def record(self) -> dict[str, Any]:
        return self._asdict()


# ---- the leader's lease in the store -----------------------------------------------------

class _StoreLease:
    """The leader's lease kept in the store beside the manifest, under `leader.lease`
    (lease.py's record: holder, epoch, ttl_ms, renewed_ms), changed only by the
    store's conditional write, with lease.py's rules (`take_next` for a promotion,
    `renew` for the leader, `release` at a clean close):

    | store | conditional write |
    |---|---|
    | local (`file://`) | lease.py's own, in the directory the URL names: an flock on `leader.lease.lock`, read - check - write - fsync - rename |
    | S3 (s3fs) | PutObject with `If-None-Match: *` when there is no lease, else `If-Match:` the ETag read; the ETag is read (HEAD) before the body (GET), so a change in between fails the write. 412 (or 409, a concurrent conditional write) is a lost race: NotLeaderError |
    | any other | none: `supported` is False; a promotion through it is not fenced, and a shipper holds no lease |

    Expiry is judged by wall-clock time, as lease.py's."""

    def __init__(self, fs: Any, root: str, url: str) -> None:
        self._fs, self._root, self._url = fs, root, url
        protocols = fs.protocol if isinstance(fs.protocol, (tuple, list)) else (fs.protocol,)
        self._local = _is_local(fs)
        self._s3 = not self._local and bool({"s3", "s3a"} & set(protocols))
        self.supported = self._local or self._s3
        self._path = f"{root}/{LEASE_FILE}"

    def read(self) -> Lease | None:
        if self._local:
            return read_lease(self._root) if os.path.isdir(self._root) else None
        if not self._s3:
            return None
        return self._read_s3()[0]

    def take_next(self, holder: str, *, ttl_ms: int, min_epoch: int) -> Lease:
        if self._local:
            os.makedirs(self._root, exist_ok=True)
            return take_next(self._root, holder, ttl_ms=ttl_ms, min_epoch=min_epoch)
        current, etag = self._read_s3()
        now = int(time.time() * 1000)
        if current is not None and current.holder != holder and current.valid(now):
            raise NotLeaderError(
                f"{self._url} is led by replica {current.holder} in epoch "
                f"{current.epoch}, whose lease is valid for {current.expires_ms - now} ms "
                "more; a promotion waits until it expires (stop that leader, or let its "
                "lease lapse)")
        epoch = max(min_epoch, current.epoch + 1 if current is not None else 1)
        return self._put_s3(Lease(holder, epoch, ttl_ms, now), etag)

    def renew(self, holder: str, epoch: int, *, ttl_ms: int) -> Lease:
        if self._local:
            os.makedirs(self._root, exist_ok=True)
            return renew(self._root, holder, epoch, ttl_ms=ttl_ms)
        current, etag = self._read_s3()
        if current is not None and current.epoch >= epoch \
                and (current.holder, current.epoch) != (holder, epoch):
            raise NotLeaderError(
                f"the lease at {self._url} names replica {current.holder} in epoch "
                f"{current.epoch} (a newer leader, or another one shipping there): this "
                "broker is no longer the leader; it may be read, and rejoins as a "
                "logkit.Follower of the new leader")
        return self._put_s3(Lease(holder, epoch, ttl_ms, int(time.time() * 1000)), etag)

    def release(self, holder: str, epoch: int) -> bool:
        if self._local:
            return release(self._root, holder, epoch)
        current, etag = self._read_s3()
        if current is None or (current.holder, current.epoch) != (holder, epoch):
            return False
        self._put_s3(current._replace(renewed_ms=int(time.time() * 1000) - current.ttl_ms),
                     etag)
        return True

    def _read_s3(self) -> tuple[Lease | None, str | None]:
        """(the lease, its ETag), (None, None) when there is none."""
        fs, path = self._fs, self._path
        fs.invalidate_cache(path)
        try:
            etag = _io("stat", path, lambda: fs.info(path))["ETag"]
            raw = _io("read", path, lambda: fs.cat_file(path))
        except FileNotFoundError:
            return None, None
        try:
            body = json.loads(raw)
            lease = Lease(str(body["holder"]), int(body["epoch"]), int(body["ttl_ms"]),
                          int(body["renewed_ms"]))
        except (ValueError, KeyError, TypeError) as exc:
            raise StorageError(f"{self._url}/{LEASE_FILE} is not a lease record ({exc}); "
                               "remove it only if no replica leads", operation="read lease",
                               path=path) from None
        return lease, etag

    def _put_s3(self, lease: Lease, etag: str | None) -> Lease:
        fs, path = self._fs, self._path
        raw = json.dumps({"version": 1, **lease._asdict()}).encode()
        try:
            if etag is None:
                fs.pipe_file(path, raw, mode="create")        # If-None-Match: *
            else:
                fs.pipe_file(path, raw, IfMatch=etag)
        except Exception as exc:
            if _lost_race(exc):
                raise NotLeaderError(f"{self._url}: the lease changed while it was being "
                                     "written (another replica's promotion or renewal "
                                     "came first)") from None
            raise StorageError(f"object store: write {path} failed: {type(exc).__name__}: "
                               f"{exc}", operation="write lease", path=path) from exc
        finally:
            fs.invalidate_cache(path)
        return lease


def _lost_race(exc: BaseException) -> bool:
    """Whether a conditional PUT failed on its condition (S3: 412 PreconditionFailed,
    409 ConditionalRequestConflict; s3fs raises FileExistsError for If-None-Match and
    keeps botocore's error as the cause otherwise)."""
    if isinstance(exc, FileExistsError):
        return True
    seen: BaseException | None = exc
    for _ in range(5):
        if seen is None:
            return False
        response = getattr(seen, "response", None)
        if isinstance(response, dict):
            code = response.get("Error", {}).get("Code")
            status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            return code in ("PreconditionFailed", "ConditionalRequestConflict") or \
                status in (409, 412)
        seen = seen.__cause__ or seen.__context__
    return False


def _replica_of(broker: Broker) -> tuple[str, int]:
    """(replica id, lease epoch) a broker ships under: its root's replica id, and the
    epoch of its root's lease when that names it (a promoted follower), else 0."""
    holder = replica_id(broker.path, create=not broker.read_only) or \
        f"reader-{uuid.uuid4().hex[:12]}"
    own = read_lease(broker.path)
    return holder, own.epoch if own is not None and own.holder == holder else 0


# ---- the leader side --------------------------------------------------------------------

class Shipper:
    """Ships one broker to one object store URL (made by `broker.ship(url)`).

    Each pass, per partition: rolled segments not yet in the bucket are uploaded whole,
    the active segment's batches as a new tail object when the log end moved; then the
    manifest, last. A pass runs every `ship.interval.ms`; failed passes are retried
    with doubling waits up to MAX_BACKOFF_S, each new kind of failure logged at
    WARNING. `flush()` ships now and raises what fails; `close()` ships a last time,
    stops, and is safe twice. A context manager. One shipper per URL: two writing the
    same manifest would retire each other's objects."""

    close_last = True      # the broker's close() closes it after its other clients
    incremental = True     # False: the active segment whole each pass (for benchmarks)

    def __init__(self, broker: Broker, url: str, *,
                 storage_options: Mapping[str, Any] | None = None) -> None:
        self.url = url
        self.interval_ms = int(broker.config["ship.interval.ms"])
        self._broker = broker
        self._fs, self._root = _filesystem(url, storage_options)
        self._local = _is_local(self._fs)
        self._pass_lock = threading.Lock()
        self._stop = threading.Event()
        self._closed = False
        self._manifest: dict[str, Any] | None = None     # the last one written or found
        self._epochs: dict[TopicPartition, _Epochs] = {}
        self._referenced: set[str] = set()               # keys the manifest names
        self._retired: dict[str, float] = {}             # key -> when it left the manifest
        self._swept = False
        self._warned: set[str] = set()
        self.generation = 0
        self.last_shipped_ms: int | None = None          # wall time of the last manifest
        self.uploaded_bytes = 0                          # object bytes uploaded, in all
        self.uploaded_objects = 0
        self._ttl_ms = int(broker.config["broker.session.timeout.ms"])
        self._lease = _StoreLease(self._fs, self._root, url)
        self._holder, self._lease_epoch = _replica_of(broker)
        self._renewed_at: float | None = None            # monotonic: the last renewal began
        self._fence: str | None = None
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name=f"logkit-ship {url}")
        try:
            start_thread(self._thread, f"the shipping thread to {url}")
        except ResourceError:
            self._closed = True               # nothing started: nothing to stop or ship
            raise

    def __repr__(self) -> str:
        return f"Shipper({self._broker.path!r} -> {self.url!r})"

    def __enter__(self) -> "Shipper":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    @property
    def closed(self) -> bool:
        return self._closed

    def flush(self) -> None:
        """Ship everything the broker holds now; raises what fails (StorageError,
        OSError; NotLeaderError once another replica holds the lease in the store)."""
        if self._closed:
            raise IllegalStateError(f"{self!r} is closed")
        if self._broker.closed:
            raise ClosedError(f"{self!r}: the broker is closed")
        if self._fence is not None:
            raise NotLeaderError(self._fence)
        self._ship_once()

    def close(self) -> None:
        """Stop the thread and ship a last time (a failure is logged at WARNING, not
        raised: the broker's close goes on). Safe twice.

        The broker's close() closes its shippers after its other clients and before
        its topics and metadata (`close_last`), so the last shipment holds the batches
        producers flushed and the offsets consumers committed as they closed, and the
        topics and groups as they are then."""
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join()
        if self._fence is not None:
            return                                # another replica leads: ship nothing
        try:
            self._ship_once()
        except NotLeaderError:
            return
        except Exception as exc:
            log.warning("%r: the last shipment before close failed: %s: %s", self,
                        type(exc).__name__, exc)
        if self._renewed_at is not None:          # a controlled shutdown: end the lease
            try:
                self._lease.release(self._holder, self._lease_epoch)
            except (LogkitError, OSError) as exc:
                log.warning("%r: could not release the lease in the store: %s", self, exc)

    # ---- the loop --------------------------------------------------------------------

    def _run(self) -> None:
        interval_s = self.interval_ms / 1000
        renew_s = self._ttl_ms / 1000 / RENEWALS_PER_TTL
        delay_s, failures = 0.0, 0
        next_pass = time.monotonic()
        while not self._stop.wait(max(0.0, min(next_pass - time.monotonic(), renew_s))):
            if time.monotonic() < next_pass:     # between passes: keep the lease
                try:
                    with self._pass_lock:
                        self._hold_lease()
                except NotLeaderError:
                    return
                except Exception as exc:
                    self._warn_once("renewing the lease failed", exc)
                continue
            try:
                self._ship_once()
            except NotLeaderError:
                return                                # fenced: logged, the broker refuses
            except Exception as exc:
                # Shipping must outlive a flaky store: retry with backoff.
                failures += 1
                delay_s = min(max(interval_s, 0.05) * 2 ** failures, MAX_BACKOFF_S)
                self._warn_once(f"shipping failed, retrying in {delay_s:.1f} s", exc)
                next_pass = time.monotonic() + delay_s
                continue
            if failures:
                log.warning("%r: shipping works again after %d failed pass(es)", self,
                            failures)
            delay_s, failures = interval_s, 0
            next_pass = time.monotonic() + interval_s

    def _warn_once(self, what: str, exc: BaseException) -> None:
        """Log a failure at WARNING the first time its kind is seen (with the traceback
        when it is not an I/O or logkit error: that is a bug to report)."""
        kind = f"{type(exc).__name__}: {exc}"
        if kind not in self._warned and len(self._warned) < 100:
            self._warned.add(kind)
            log.warning("%r: %s: %s", self, what, kind,
                        exc_info=not isinstance(exc, (LogkitError, OSError)))

    # ---- the lease in the store ----------------------------------------------------

    @property
    def fenced(self) -> bool:
        """Whether another replica holds the lease in the store (shipping stopped)."""
        return self._fence is not None

    def _hold_lease(self) -> None:
        """Renew the lease in the store when its last renewal began TTL/3 ago or more
        (or never). NotLeaderError, after fencing, when it names another replica in
        this epoch or any replica in a newer one; I/O errors are raised as they are."""
        if self._fence is not None:
            raise NotLeaderError(self._fence)
        if not self._lease.supported:
            return
        began = time.monotonic()
        if self._renewed_at is not None and \
                began - self._renewed_at < self._ttl_ms / 1000 / RENEWALS_PER_TTL:
            return
        try:
            self._lease.renew(self._holder, self._lease_epoch, ttl_ms=self._ttl_ms)
        except NotLeaderError as exc:
            self._fence_now(str(exc))
            raise
        self._renewed_at = began

    def _check_lease(self) -> None:
        """Before each write to the store: the lease was renewed less than a TTL ago
        (by this process's clock, never later than a follower can see it expire)."""
        if self._fence is not None:
            raise NotLeaderError(self._fence)
        if self._lease.supported and (self._renewed_at is None or time.monotonic()
                                      - self._renewed_at >= self._ttl_ms / 1000):
            raise StorageError(f"{self.url}: the lease was not renewed for "
                               f"broker.session.timeout.ms={self._ttl_ms}; nothing is "
                               "written until a renewal succeeds", operation="lease",
                               path=self.url)

    def _fence_now(self, message: str) -> None:
        """Another replica leads: stop shipping for good, and make the broker refuse
        writes (lease.py's fencing, as when its own lease names another replica)."""
        self._fence = message
        self._stop.set()
        log.warning("%r: stops shipping: %s", self, message)
        keeper = getattr(self._broker, "_lease", None)
        if keeper is not None:
            keeper.fence(message)

    def _ship_once(self) -> None:
        with self._pass_lock:
            self._hold_lease()
            if self._manifest is None:
                self._manifest = _read_manifest(self._fs, self._root)
                if self._manifest is not None:
                    self.generation = int(self._manifest["generation"])
                    self._referenced = _keys(self._manifest)
            body = self._snapshot()
            if self._manifest is not None and _same(body, self._manifest):
                self._retire_due()
                return
            self.generation += 1
            body["generation"] = self.generation
            body["written_ms"] = int(time.time() * 1000)
            self._write_manifest(body)
            self._manifest = body
            now = time.monotonic()
            keys = _keys(body)
            for key in self._referenced - keys:
                self._retired.setdefault(key, now)
            self._referenced = keys
            self.last_shipped_ms = body["written_ms"]
            if not self._swept:
                self._sweep()
            self._retire_due()

    # ---- one snapshot ----------------------------------------------------------------

    def _snapshot(self) -> dict[str, Any]:
        """Upload what is missing and return the manifest body that names it."""
        broker = self._broker
        previous = {(e["topic"], e["partition"], e["topic_id"]): e
                    for e in (self._manifest or {}).get("partitions", ())}
        # The last pass runs inside the broker's close(), after its other clients
        # closed (their last batches flushed, their offsets committed) and before its
        # topics and metadata close: it reads them past the broker's open check.
        closing = broker.closed
        names = sorted(broker.meta.topic_names()) if closing else broker.topics()
        topics: dict[str, Any] = {}
        partitions = []
        for name in names:
            try:
                topic = broker._topic(name) if closing else broker.topic(name)
            except UnknownTopicError:                  # deleted meanwhile
                continue
            overrides = {k: v for k, v in topic.config.items() if _DEFAULTS.get(k) != v}
            topics[name] = {"topic_id": topic.topic_id, "partitions": topic.num_partitions,
                            "config": overrides,
                            "replication_factor": topic.replication_factor}
            for p in topic.partitions:
                before = previous.get((name, p.partition, topic.topic_id))
                partitions.append(self._ship_partition(name, topic.topic_id, p, before))
        groups = {}
        for group in list_groups(broker.meta):
            committed = committed_offsets(broker.meta, group)
            groups[group] = sorted([tp.topic, tp.partition, om.offset]
                                   for tp, om in committed.items())
        return {"format": MANIFEST_FORMAT, "generation": 0, "written_ms": 0,
                "ship_interval_ms": self.interval_ms, "topics": topics, "groups": groups,
                "partitions": partitions}

    def _ship_partition(self, topic: str, topic_id: str, p: Partition,
                        before: dict[str, Any] | None) -> dict[str, Any]:
        """The manifest entry of one partition, uploading its new objects. A segment
        retired by retention while it was read leaves the previous entry in place
        (its objects are still in the bucket); the next pass ships the new state."""
        for _ in range(3):           # a roll between the reads: read again
            count = p.clean_count    # before the segments: a swap after is shipped next
            bases = p.segment_base_offsets()
            start, end = p.log_start_offset, p.log_end_offset
            if p.segment_base_offsets() == bases:
                break
        gaps = is_compacted(p.config) or count > 0
        recheck = count != int((before or {}).get("clean_count", 0))
        prefix = f"{topic}-{topic_id}/{p.partition}"
        tp = p.topic_partition
        cache = self._epochs.setdefault(tp, _Epochs())
        epochs = cache.get(p, start, end)
        objects: list[_Object] = []
        try:
            known = [o for o in map(_Object.from_record, (before or {}).get("objects", ()))
                     if o.end_offset <= end]
            kept = _still_in_log(p, start, known, gaps=gaps)
            if kept < len(known):            # truncated: the epochs may have changed too
                known = known[:kept]
                before = None                # ... and the aborted transactions' markers
                cache = self._epochs[tp] = _Epochs()
                epochs = cache.get(p, start, end)
            for i, base in enumerate(bases):
                rolled = i + 1 < len(bases)
                upto = bases[i + 1] if rolled else end
                low = max(base, start)
                if low >= upto:
                    continue                          # an empty segment
                if not rolled:
                    chunks = [o for o in known if o.segment == base and
                              o.key != f"{prefix}/{base:020d}.log"]
                    objects.extend(self._ship_tail(p, prefix, base, low, upto, chunks))
                    continue
                key = f"{prefix}/{base:020d}.log"
                old = next((o for o in known if o.segment == base
                            and _WHOLE_KEY.fullmatch(o.key)), None)
                if old is not None and old.end_offset == upto and (
                        old.first_offset <= low or gaps) and not (
                        recheck and _digest(p, low, upto) != (old.size, old.sha256)):
                    objects.append(old)          # (a cleaning gap may start a segment)
                else:
                    objects.append(self._upload_segment(p, key, base, low, upto))
            shipped_end = objects[-1].end_offset if objects else start
            lso, aborted = _transactions(p, min(start, shipped_end), shipped_end, before)
        except OffsetOutOfRangeError as exc:
            log.debug("%s-%d: changed while shipping (%s); shipped next pass", topic,
                      p.partition, exc)
            if before is not None:
                return before
            objects, shipped_end, aborted = [], start, []
            lso = start
        return {"topic": topic, "partition": p.partition, "topic_id": topic_id,
                "clean_count": count,
                "log_start_offset": min(start, shipped_end),
                "log_end_offset": shipped_end,
                "last_stable_offset": lso,
                "aborted_transactions": aborted,
                "epochs": [[e.epoch, e.start_offset] for e in epochs
                           if e.start_offset <= shipped_end],
                # (a compacted log's: also an empty active segment's, so a follower
                # rolls there and can copy the cleaning of the one below)
                "segment_base_offsets": sorted({o.segment for o in objects} | (
                    {bases[-1]} if gaps and bases[-1] == shipped_end else set())),
                "objects": [o.record() for o in objects]}

    def _ship_tail(self, p: Partition, prefix: str, base: int, low: int, end: int,
                   shipped: list[_Object]) -> list[_Object]:
        """The chunk objects covering the active segment from the batch holding `low`
        to `end`: the chain of `shipped` chunks that still fits, then one new chunk of
        the batches appended since, then at most one merge of the newest chunks
        (`_tail_merge`), read again from the log, so the chunks of a segment stay few
        and the manifest small."""
        chain: list[_Object] = []
        at = low
        for chunk in sorted(shipped, key=lambda o: o.first_offset):
            if chunk.end_offset <= at:
                continue                              # below the log start now
            if chunk.first_offset > at or (chain and chunk.first_offset != at):
                break                                 # a gap: ship from `at` again
            chain.append(chunk)
            at = chunk.end_offset
        if at < end and not self.incremental:        # the tail whole again
            chain, at = [], low
        if at < end:
            chain.append(self._upload(p, _chunk_key(prefix, base, at, end), base, at, end))
        merge = _tail_merge(chain)
        if merge > 1:
            first, last = max(chain[-merge].first_offset, low), chain[-1].end_offset
            chain[-merge:] = [self._upload(p, _chunk_key(prefix, base, first, last), base,
                                           first, last)]
        return chain

    def _upload_segment(self, p: Partition, key: str, segment: int, low: int,
                        upto: int) -> _Object:
        """Upload a rolled segment under `key`, or, when a manifest names that key or
        named it within the grace (its bytes changed: a cleaning pass), under its
        content key; OffsetOutOfRangeError when the bytes changed again meanwhile."""
        if key not in self._referenced and key not in self._retired:
            return self._upload(p, key, segment, low, upto)
        size, sha = _digest(p, low, upto)
        obj = self._upload(p, f"{key}.{sha[:CONTENT_KEY_DIGITS]}", segment, low, upto)
        if (obj.size, obj.sha256) != (size, sha):
            raise OffsetOutOfRangeError(f"{key}: the segment changed while shipping")
        return obj

    def _upload(self, p: Partition, key: str, segment: int, low: int, upto: int) -> _Object:
        """Upload the batches of `p` from the one holding `low` to `upto` under `key`,
        read back its size, and return its record (the manifest is written later)."""
        self._check_lease()
        path = f"{self._root}/{key}"
        digest, size, first, pos, last_batch = hashlib.sha256(), 0, None, low, ""
        if self._local:
            self._fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)

        def write() -> None:
            nonlocal size, first, pos, last_batch
            with self._fs.open(path, "wb") as f:
                while pos < upto:
                    data = p.batches_since(pos, upto=upto, max_bytes=UPLOAD_CHUNK_BYTES)
                    if not data:
                        break
                    last = None       # (gaps: a compacted log's, checked when stored)
                    for _, header in iter_batches(data, 0, len(data), key, gaps=True):
                        if first is None:
                            first = header.base_offset
                        last = header
                    assert last is not None
                    pos = last.last_offset + 1
                    last_batch = _fingerprint(last)
                    f.write(data)
                    digest.update(data)
                    size += len(data)
        _io("upload", path, write)
        if pos != upto or first is None:
            raise OffsetOutOfRangeError(f"{key}: the log ended at {pos} while shipping "
                                        f"up to {upto}")
        stored = _io("stat", path, lambda: self._fs.size(path))
        if stored != size:
            raise StorageError(f"object store: {path} holds {stored} bytes after an upload "
                               f"of {size}", operation="upload", path=path)
        self._retired.pop(key, None)
        self.uploaded_bytes += size
        self.uploaded_objects += 1
        log.debug("shipped %s: offsets %d-%d, %d bytes", key, first, upto - 1, size)
        return _Object(key, segment, first, upto, size, digest.hexdigest(), last_batch)

    # ---- the manifest and retired objects -------------------------------------------

    def _write_manifest(self, body: dict[str, Any]) -> None:
        self._check_lease()
        path = f"{self._root}/{MANIFEST_KEY}"
        raw = json.dumps(body, separators=(",", ":"), sort_keys=True).encode()
        if self._local:
            # A local file is written in place; a rename makes the new one whole.
            tmp = f"{path}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp"
            self._fs.makedirs(self._root, exist_ok=True)
            self._fs.pipe_file(tmp, raw)
            os.replace(tmp, path)
        else:                                   # an object store PUT is atomic
            _io("write", path, lambda: self._fs.pipe_file(path, raw))

    def _sweep(self) -> None:
        """Once, after the first manifest: objects of the layout that it does not name
        (left by a shipper that stopped between an upload and its manifest, or retired
        by one that stopped within the grace) are retired too."""
        self._swept = True
        try:
            found = _io("list", self._root, lambda: self._fs.find(self._root))
        except FileNotFoundError:
            return
        now = time.monotonic()
        for path in found:
            key = path[len(self._root) + 1:] if path.startswith(self._root + "/") else ""
            if _KEY.fullmatch(key) and key not in self._referenced:
                self._retired.setdefault(key, now)

    def _retire_due(self) -> None:
        grace_s = max(RETIRE_GRACE_MIN_S, RETIRE_GRACE_INTERVALS * self.interval_ms / 1000)
        now = time.monotonic()
        for key, since in list(self._retired.items()):
            if now - since < grace_s or key in self._referenced:
                continue
            path = f"{self._root}/{key}"
            try:
                _io("delete", path, lambda: self._fs.rm_file(path))
            except FileNotFoundError:
                pass
            del self._retired[key]


def _transactions(p: Partition, start: int, end: int, before: Mapping[str, Any] | None
                  ) -> tuple[int, list[list[int]]]:
    """(last stable offset, aborted transactions) of `p` for a manifest whose objects
    hold [start, end): the LSO clipped to that range, and `[producer id, first offset,
    last offset]` of each aborted transaction meeting it, in first-offset order.

    The LSO is read first: a transaction open then starts at or above it (readers stop
    there), and one finished by then has its marker in the log, so the aborted list,
    read after, names it. `before` (the previous manifest's entry, None after a
    truncation) saves work: its list holds every aborted transaction that ended below
    its log end, so only [that end, end) is asked of the `.txnindex` files (one ending
    later has its marker at or past it); each ABORT marker's offset (Partition lists
    (producer id, first offset)) comes from it or is found once by walking the batches
    (`_abort_markers`)."""
    lso = min(max(p.last_stable_offset, start), end)
    carried = (before or {}).get("aborted_transactions")
    since = start
    if carried is not None and int(before["log_start_offset"]) <= start and \
            start <= int(before["log_end_offset"]) <= end:
        since = int(before["log_end_offset"])
    else:
        carried = []
    markers = {(int(pid), int(first)): int(last) for pid, first, last in carried}
    listed = sorted({(first, pid) for pid, first in p.aborted_transactions(since, end)} |
                    {(int(first), int(pid)) for pid, first, last in carried
                     if int(last) >= start and int(first) < end})
    if not listed:
        return lso, []
    missing = [(first, pid) for first, pid in listed if (pid, first) not in markers]
    if missing:
        markers.update(_abort_markers(p, missing))
    return lso, [[pid, first, markers[(pid, first)]] for first, pid in listed
                 if markers[(pid, first)] >= start]


def _abort_markers(p: Partition, pending: list[tuple[int, int]]
                   ) -> dict[tuple[int, int], int]:
    """{(producer id, first offset): its ABORT marker's offset} for aborted transactions
    given as (first offset, producer id) in offset order: each producer's first control
    batch at or past the first offset, found by one walk of the batches over the
    transactions' spans (stretches between them are skipped). OffsetOutOfRangeError
    when the log no longer holds a marker it listed (retention or a truncation raced
    the pass: shipped next pass)."""
    found: dict[tuple[int, int], int] = {}
    waiting: dict[int, list[int]] = {}       # producer id -> first offsets, marker unseen
    listed, at, end = 0, pending[0][0], p.log_end_offset
    while listed < len(pending) or waiting:
        if not waiting:
            at = max(at, pending[listed][0])  # past a stretch no transaction spans
        data = p.batches_since(at, upto=end, max_bytes=UPLOAD_CHUNK_BYTES)
        if not data:
            raise OffsetOutOfRangeError(f"{p}: no ABORT marker after offset {at} for "
                                        f"producers {sorted(waiting)}")
        for _, header in iter_batches(data, 0, len(data), p.directory, gaps=True):
            while listed < len(pending) and pending[listed][0] <= header.last_offset:
                first, pid = pending[listed]
                waiting.setdefault(pid, []).append(first)
                listed += 1
            if header.attributes & ATTR_CONTROL and header.producer_id in waiting:
                for first in waiting.pop(header.producer_id):
                    found[(header.producer_id, first)] = header.base_offset
            at = header.last_offset + 1
            if not waiting:
                break                         # jump to the next transaction's first
    return found


def _digest(p: Partition, low: int, upto: int) -> tuple[int, str]:
    """(size, SHA-256) of the batches of `p` from the one holding `low` to `upto`: what
    an upload of them would hold."""
    digest, size, at = hashlib.sha256(), 0, low
    while at < upto:
        data = p.batches_since(at, upto=upto, max_bytes=UPLOAD_CHUNK_BYTES)
        if not data:
            break
        digest.update(data)
        size += len(data)
        at = last_offset_of(data) + 1
    return size, digest.hexdigest()


def _fingerprint(header: BatchHeader) -> str:
    """What tells a batch from another stored at the same offsets after a truncation:
    its leader epoch and CRC (which covers the rest but the offset and length)."""
    return f"{header.leader_epoch}:{header.crc}"


def _still_in_log(p: Partition, start: int, objects: list[_Object], *,
                  gaps: bool = False) -> int:
    """How many of `objects` (in offset order, all below the log end) still hold what
    the log holds. A truncation rewrites everything from some offset on, so the
    objects that match are a prefix: the last is checked, then a binary search finds
    the first whose last batch differs (a batch below the log start counts as a
    match: retention only removes). With `gaps` (a compacted log) a cleaning pass may
    have rewritten that batch (its CRC) or removed it: the leader epoch alone tells a
    truncation then, and a changed segment is found by its checksum instead."""
    def matches(obj: _Object) -> bool:
        if not obj.last_batch or obj.end_offset - 1 < start:
            return True
        data = p.batches_since(obj.end_offset - 1, max_bytes=1, upto=p.log_end_offset
                               if gaps else obj.end_offset)   # gaps: the next one too
        header = read_header(data, 0, len(data))
        if header is None:
            return False
        if gaps and header.base_offset > obj.end_offset - 1:
            return True                       # cleaned away: nothing to compare
        if gaps:
            return header.last_offset == obj.end_offset - 1 and \
                str(header.leader_epoch) == obj.last_batch.split(":")[0]
        return header.last_offset == obj.end_offset - 1 and \
            _fingerprint(header) == obj.last_batch
    if not objects or matches(objects[-1]):
        return len(objects)
    low, high = 0, len(objects) - 1        # objects[high] differs
    while low < high:
        mid = (low + high) // 2
        if matches(objects[mid]):
            low = mid + 1
        else:
            high = mid
    log.warning("%s: the shipped objects from %s on differ from the log (truncated "
                "since they were shipped); shipping those offsets again", p,
                objects[low].key)
    return low


def _tail_merge(chain: list[_Object]) -> int:
    """How many of the newest chunks to merge into one (0: none). Size-tiered, as an
    LSM tree compacts: the TAIL_MERGE_FANOUT newest chunks merge when the oldest of
    them is no larger than the others together (so chunks of one tier merge, and a
    bigger one from the tier above waits) and the result is at most
    TAIL_MERGE_MAX_BYTES. A merge can complete a run of the next tier, so the rule is
    applied again on the sizes, and only the final merge is uploaded.

    With equal appends per pass this is close to a counter in base FANOUT: each byte is
    uploaded about 1 + log_FANOUT(TAIL_MERGE_MAX_BYTES / bytes per pass) times, one
    pass uploads at most TAIL_MERGE_MAX_BYTES besides its new batches, and the chunks
    of a segment stay about FANOUT per tier (chunks that reach the top tier merge no
    more: one per 2-16 MiB of segment past that)."""
    fanout = TAIL_MERGE_FANOUT
    sizes = [c.size for c in chain]
    counts = [1] * len(chain)             # chunks of `chain` in each simulated one
    while len(sizes) >= fanout:
        total = sum(sizes[-fanout:])
        if total > TAIL_MERGE_MAX_BYTES or sizes[-fanout] > total - sizes[-fanout]:
            break
        sizes[-fanout:] = [total]
        counts[-fanout:] = [sum(counts[-fanout:])]
    return counts[-1] if counts and counts[-1] > 1 else 0


def _chunk_key(prefix: str, base: int, first: int, end: int) -> str:
    """The key of the active segment's chunk holding offsets `first` to `end` - 1."""
    return f"{prefix}/{base:020d}.log.{first:020d}-{end:020d}"


def _keys(manifest: Mapping[str, Any]) -> set[str]:
    return {o["key"] for e in manifest["partitions"] for o in e["objects"]}


def _same(body: Mapping[str, Any], manifest: Mapping[str, Any]) -> bool:
    """Whether two manifest bodies name the same state (ignoring generation and time)."""
    skip = ("generation", "written_ms")
    return ({k: v for k, v in body.items() if k not in skip}
            == {k: v for k, v in manifest.items() if k not in skip})


# ---- the follower side ------------------------------------------------------------------

class _Loaded:
    """One downloaded object, verified, with its batches' positions."""

    def __init__(self, obj: _Object, buffer: Any, closer: Callable[[], None], *,
                 gaps: bool = False) -> None:
        self.obj = obj
        self.buffer = buffer
        self.close = closer
        self.last_offsets: list[int] = []
        self.spans: list[tuple[int, int]] = []           # (position, size) per batch
        for pos, header in iter_batches(buffer, 0, obj.size, obj.key,
                                        first_offset=obj.first_offset, verify=True,
                                        gaps=gaps):
            self.last_offsets.append(header.last_offset)
            self.spans.append((pos, header.size))
        if not self.last_offsets or self.last_offsets[-1] + 1 != obj.end_offset:
            raise CorruptRecordError("object ends elsewhere than its manifest records",
                                     path=obj.key, position=obj.size,
                                     expected=obj.end_offset,
                                     actual=(self.last_offsets or [obj.first_offset - 1])
                                     [-1] + 1)

    def batches(self, offset: int, max_bytes: int) -> bytes:
        i = bisect.bisect_left(self.last_offsets, offset)
        if i == len(self.spans):
            return b""
        begin = self.spans[i][0]
        j = i + 1
        while j < len(self.spans) and self.spans[j][0] + self.spans[j][1] - begin <= max_bytes:
            j += 1
        stop = self.spans[j - 1][0] + self.spans[j - 1][1]
        return bytes(self.buffer[begin:stop])


class ObjectStoreSource(ReplicaSource):
    """`logkit.ObjectStoreSource(url, *, storage_options=None)`: copy from what a
    leader's `broker.ship(url)` uploads (any fsspec URL).

    Reads the manifest (again after `wait()` and at every `topics()`), then objects
    whole: an object is used only after its size and SHA-256 equal the manifest's
    record and each batch passed its CRC (else CorruptRecordError naming the object).
    `report_progress` does nothing: a leader does not read its bucket, so it cannot
    count such a follower in its ISR. The newest object read per partition is kept
    (in memory up to 16 MiB, else in a temporary file)."""

    def __init__(self, url: str, *, storage_options: Mapping[str, Any] | None = None
                 ) -> None:
        self.url = url
        self._options = dict(storage_options or {})
        self._fs: Any = None
        self._root = ""
        self._manifest: dict[str, Any] | None = None
        self._partitions: dict[TopicPartition, dict[str, Any]] = {}
        self._read_at = 0.0
        self._stale = True
        self._loaded: dict[TopicPartition, _Loaded] = {}

    def describe(self) -> str:
        return f"ObjectStoreSource({self.url!r})"

    def _filesystem(self) -> tuple[Any, str]:
        if self._fs is None:
            self._fs, self._root = _filesystem(self.url, self._options)
        return self._fs, self._root

    def manifest(self, *, fresh: bool = False) -> dict[str, Any]:
        """The manifest in use (read again when `fresh`, or when a wait made it stale).
        StorageError when the URL holds none yet."""
        if fresh or self._stale or self._manifest is None:
            fs, root = self._filesystem()
            body = _read_manifest(fs, root)
            if body is None:
                raise StorageError(f"{self.url}: no {MANIFEST_KEY} (nothing shipped there "
                                   "yet?)", operation="read", path=self.url)
            self._manifest = body
            self._partitions = {TopicPartition(e["topic"], int(e["partition"])): e
                                for e in body["partitions"]}
            self._read_at = time.monotonic()
            self._stale = False
        return self._manifest

    def _entry_fresh(self, tp: TopicPartition) -> dict[str, Any]:
        self.manifest(fresh=True)
        return self._entry(tp.topic, tp.partition)

    def _entry(self, topic: str, partition: int) -> dict[str, Any]:
        self.manifest()
        entry = self._partitions.get(TopicPartition(topic, partition))
        if entry is None:
            raise UnknownTopicError(f"{self.url} holds no partition {topic}-{partition}")
        return entry

    # ---- ReplicaSource ----------------------------------------------------------------

    def topics(self) -> dict[str, TopicInfo]:
        body = self.manifest(fresh=True)
        return {name: TopicInfo(name, int(t["partitions"]), dict(t["config"]),
                                str(t["topic_id"]), int(t.get("replication_factor", 1)))
                for name, t in body["topics"].items()}

    def partition(self, topic: str, partition: int) -> PartitionInfo:
        entry = self._entry(topic, partition)
        return PartitionInfo(int(entry["log_start_offset"]), int(entry["log_end_offset"]),
                             tuple(EpochEntry(int(e), int(s)) for e, s in entry["epochs"]),
                             tuple(int(b) for b in entry["segment_base_offsets"]),
                             int(entry.get("clean_count", 0)))

    def segments(self, topic: str, partition: int) -> tuple[SegmentInfo, ...]:
        """The rolled segments the manifest names whole, with the size and SHA-256 it
        records (a segment whose object begins below the log start is left out: it
        cannot be fetched whole)."""
        entry = self._entry(topic, partition)
        start = int(entry["log_start_offset"])
        return tuple(SegmentInfo(o.segment, o.end_offset, o.first_offset, o.size, o.sha256)
                     for o in map(_Object.from_record, entry["objects"])
                     if _WHOLE_KEY.fullmatch(o.key) and o.first_offset >= start)

    def fetch(self, topic: str, partition: int, offset: int, *, max_bytes: int) -> bytes:
        tp = TopicPartition(topic, partition)
        for again in (False, True):
            entry = self._entry(topic, partition)
            start, end = int(entry["log_start_offset"]), int(entry["log_end_offset"])
            if offset == end:
                return b""
            if not start <= offset < end:
                raise OffsetOutOfRangeError(f"{topic}-{partition}: offset {offset} is "
                                            f"outside {start}-{end} at {self.url}")
            obj = _object_holding(entry, offset)
            loaded = self._loaded.get(tp)
            if loaded is None or loaded.obj != obj:
                try:
                    loaded = self._load(tp, obj, gaps=_has_gaps(self.manifest(), entry))
                except FileNotFoundError:
                    if again:        # the fresh manifest names it too: it is gone
                        raise CorruptRecordError(
                            "an object the manifest names is missing",
                            path=f"{self.url}/{obj.key}", position=0,
                            expected=obj.size, actual=None) from None
                    self.manifest(fresh=True)       # retired since: a newer manifest
                    continue
                except CorruptRecordError:
                    # Shipped again under its key (the leader's log was truncated
                    # since): a newer manifest records it anew. Otherwise damage.
                    if again or _object_holding(self._entry_fresh(tp), offset) == obj:
                        raise
                    continue
            return loaded.batches(offset, max_bytes)
        raise AssertionError("unreachable")

    @property
    def keeps_lease(self) -> bool:
        """Whether the store takes conditional writes (`_StoreLease.supported`): then a
        shipper holds the lease before its first upload."""
        fs, root = self._filesystem()
        return _StoreLease(fs, root, self.url).supported

    def lease(self) -> Lease | None:
        """The lease in the store (None when there is none, or the store offers no
        conditional write: see `_StoreLease`)."""
        fs, root = self._filesystem()
        return _StoreLease(fs, root, self.url).read()

    def take_lease(self, holder: str, *, ttl_ms: int, min_epoch: int) -> Lease | None:
        """A promotion's conditional write of the lease in the store (lease.py's
        `take_next` rules): NotLeaderError while another holder's lease is valid or
        when another write came first. None where the store offers no conditional
        write: the promotion is then not fenced."""
        fs, root = self._filesystem()
        store = _StoreLease(fs, root, self.url)
        if not store.supported:
            return None
        return store.take_next(holder, ttl_ms=ttl_ms, min_epoch=min_epoch)

    def committed_offsets(self) -> dict[str, dict[TopicPartition, int]]:
        body = self.manifest()
        return {group: {TopicPartition(t, int(p)): int(o) for t, p, o in rows}
                for group, rows in body["groups"].items()}

    def wait(self, timeout_s: float) -> None:
        """Sleep, then let the next call read the manifest again (at most every
        MANIFEST_POLL_S)."""
        super().wait(timeout_s)
        if time.monotonic() - self._read_at >= MANIFEST_POLL_S:
            self._stale = True

    def close(self) -> None:
        loaded, self._loaded = self._loaded, {}
        for item in loaded.values():
            item.close()
        self._manifest = None
        self._partitions = {}
        self._stale = True

    # ---- objects ----------------------------------------------------------------------

    def _load(self, tp: TopicPartition, obj: _Object, *, gaps: bool) -> _Loaded:
        """Download `obj`, check its size and SHA-256 against the manifest, index its
        batches (CRC-checked; with `gaps`, a compacted log's, increasing offsets);
        replaces the partition's kept object."""
        fs, root = self._filesystem()
        path = f"{root}/{obj.key}"
        where = f"{self.url}/{obj.key}" if not self.url.endswith("/") else \
            f"{self.url}{obj.key}"
        spool = obj.size > IN_MEMORY_OBJECT_BYTES
        sink: Any = tempfile.TemporaryFile(prefix="logkit-object-") if spool else \
            bytearray()
        try:
            digest, size = hashlib.sha256(), 0

            def read() -> None:
                nonlocal size
                # Listings are cached by some filesystems (s3fs keeps ETags, and would
                # refuse an object changed since): ask the store afresh.
                fs.invalidate_cache(path)
                with fs.open(path, "rb") as f:
                    while True:
                        chunk = f.read(DOWNLOAD_CHUNK_BYTES)
                        if not chunk:
                            return
                        size += len(chunk)
                        if size > obj.size:     # never read past what was recorded
                            return
                        digest.update(chunk)
                        if spool:
                            sink.write(chunk)
                        else:
                            sink.extend(chunk)
            _io("read", path, read)
            if size != obj.size:
                raise CorruptRecordError("object size differs from the manifest's record",
                                         path=where, position=min(size, obj.size),
                                         expected=obj.size,
                                         actual=size if size <= obj.size else "more")
            if digest.hexdigest() != obj.sha256:
                raise CorruptRecordError("object SHA-256 differs from the manifest's "
                                         "record", path=where, position=0,
                                         expected=obj.sha256, actual=digest.hexdigest())
            if spool:
                sink.flush()
                buffer: Any = mmap.mmap(sink.fileno(), obj.size, access=mmap.ACCESS_READ)
                file = sink

                def closer() -> None:
                    buffer.close()
                    file.close()
            else:
                buffer, closer = bytes(sink), (lambda: None)
            try:
                loaded = _Loaded(obj, buffer, closer, gaps=gaps)
            except BaseException:
                closer()
                raise
        except BaseException:
            if spool and not sink.closed:
                sink.close()
            raise
        old = self._loaded.pop(tp, None)
        if old is not None:
            old.close()
        self._loaded[tp] = loaded
        return loaded

    def restore(self, directory: str | os.PathLike[str], *, timeout: float = 600.0
                ) -> dict[str, Any]:
        """Rebuild a broker root at `directory` from this URL (see `restore()`, which
        `logkit restore URL DIR` calls through here); returns its summary."""
        return restore(self.url, directory, storage_options=self._options,
                       timeout=timeout)

    def verify(self) -> int:
        """Download and check every object the manifest names (size, SHA-256, CRCs);
        returns how many bytes were checked. Raises CorruptRecordError on the first
        object that fails, naming it."""
        body = self.manifest(fresh=True)
        checked = 0
        for entry in body["partitions"]:
            tp = TopicPartition(entry["topic"], int(entry["partition"]))
            for record in entry["objects"]:
                obj = _Object(**record)
                try:
                    self._load(tp, obj, gaps=_has_gaps(body, entry))
                except FileNotFoundError:
                    raise CorruptRecordError(
                        "an object the manifest names is missing",
                        path=f"{self.url}/{obj.key}", position=0, expected=obj.size,
                        actual=None) from None
                checked += obj.size
        return checked


def _object_holding(entry: Mapping[str, Any], offset: int) -> _Object:
    """The object whose batches hold `offset` (objects are contiguous from the batch
    holding the log start to the log end, so one does, for offsets in that range)."""
    objects = entry["objects"]
    i = bisect.bisect_right([int(o["end_offset"]) for o in objects], offset)
    return _Object(**objects[i])


# ---- restore ----------------------------------------------------------------------------

def restore(url: str, directory: str | os.PathLike[str], *,
            storage_options: Mapping[str, Any] | None = None,
            timeout: float = 600.0) -> dict[str, Any]:
    """Rebuild a broker root at `directory` from what `broker.ship(url)` uploaded:
    topics with their configs, every partition's batches, leader epochs and log start,
    and the groups' committed offsets; then promote it (the next leader epoch), so
    `Broker(directory)` opens it as a leader.

    Every object is checked first (size, SHA-256, CRCs): a mismatch raises
    CorruptRecordError naming the object, and nothing is written at `directory`. The
    copy is built in a temporary sibling and renamed into place only after
    `Broker.check()` passed. `directory` must be missing or empty (ConfigError).
    Returns a summary: generation, topics, partitions, records (offsets), bytes."""
    target = os.path.abspath(os.fspath(directory))
    if os.path.lexists(target) and (not os.path.isdir(target) or os.listdir(target)):
        raise ConfigError(f"restore: {target} exists and is not an empty directory")
    source = _CopySource(url, storage_options=storage_options)
    try:
        body = _manifest_with_retries(source)
        checked = source.verify()
        parent, name = os.path.split(target)
        os.makedirs(parent, exist_ok=True)
        building = os.path.join(parent, f".{name}.restore-{uuid.uuid4().hex[:12]}")
        try:
            follower = Follower(building, source, config={"replica.fetch.backoff.ms": 50})
            follower.catch_up(timeout=timeout)
            follower.promote()
            with Broker(building, background=False) as broker:
                for topic in broker.topics():
                    for p in broker.topic(topic).partitions:
                        p.check()
            if os.path.isdir(target):
                os.rmdir(target)                      # empty, checked above
            os.rename(building, target)
            fsync_path(parent)
        except BaseException:
            shutil.rmtree(building, ignore_errors=True)
            raise
    finally:
        source.close()
    ends = sum(int(e["log_end_offset"]) - int(e["log_start_offset"])
               for e in body["partitions"])
    log.info("restored %s into %s: generation %s, %d partitions", url, target,
             body["generation"], len(body["partitions"]))
    return {"generation": int(body["generation"]), "topics": len(body["topics"]),
            "partitions": len(body["partitions"]), "offsets": ends, "bytes": checked,
            "groups": len(body["groups"])}


class _CopySource(ObjectStoreSource):
    """restore()'s source: a copy is not a failover, so its promotion takes no lease
    in the store (a running leader goes on shipping there)."""

    def lease(self) -> Lease | None:
        return None

    def take_lease(self, holder: str, *, ttl_ms: int, min_epoch: int) -> Lease | None:
        return None


def _manifest_with_retries(source: ObjectStoreSource) -> dict[str, Any]:
    """The manifest, read up to MANIFEST_TRIES times (a local one can be caught mid-
    rename); the last failure is raised."""
    for attempt in range(MANIFEST_TRIES):
        try:
            return source.manifest(fresh=True)
        except (CorruptRecordError, StorageError):
            if attempt + 1 == MANIFEST_TRIES:
                raise
            time.sleep(0.2)
    raise AssertionError("unreachable")
