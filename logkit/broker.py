"""The embedded broker: one root directory, its topics, its metadata and its chores.

Owns: `logkit.json` (the format version; an unknown major version is refused), the
metadata store, the cache of open topics, topic create/open/list/delete, and the
background scheduler that runs retention (`log.retention.check.interval.ms`), the
`flush.ms` policy and, when the doorbell's metadata counter moved, applies the topic
config changes other processes made (`alter_topic_config`). Several processes may open the same root at once; everything they
share lives in files (see log.py and meta.py), never in this object.

Invariant: a topic's partition directories exist, initialised and stamped with the
topic's id (Kafka's `partition.metadata`), before its metadata record commits, and a
failed create leaves neither. Deletion runs in an order that a crash at any step leaves
finishable, never undone: (0) the topic's record is flagged `deleting` in one committed
metadata transaction — from then on `topics()` leaves it out and every open of it
raises UnknownTopicError, in every process; (1) every partition is flagged deleted in
its tail state, under its append lock, so no process appends to it or reads it from
then on; (2) the directories are renamed to `.<topic id>-<n>.delete` tombstones (a name
that always fits and never parses as a partition directory); (3) the metadata record
goes; (4) the tombstones are removed. An interrupted deletion (a crash, or an I/O error
after step 0) is finished by the next `Broker()` open of the root, and by the next
`topic()`, `create_topic()` or `delete_topic()` of that name in any process; a
re-created topic never adopts an old directory, because a directory whose
`partition.metadata` names another topic id is moved away first.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import threading
import time
import uuid
from typing import TYPE_CHECKING, Any, Callable, Mapping, Protocol

from . import _fork
from ._clock import now_ms as _now_ms
from .cleaner import LogCleaner
from .config import (LONG_MAX, TOPIC, check_topic_config, is_compacted, lookup,
                     overrides_only, resolve_broker_config, resolve_topic_config)
from .consumer import Consumer
from ._threads import start_thread
from .errors import (ClosedError, ConfigError, IncompatibleFormatError, LogkitError,
                     ReadOnlyError, StorageError, TopicExistsError, UnknownTopicError, storage_error)
from .group import ConsumerGroup, list_groups, rebalance_subscribers
from .leader.lease import LeaderLog, LeaderMeta, LeaseKeeper
from .leader.replicas import ReplicaState, ReplicatedPartition, describe_replicas
from .log import PartitionLog, check_directory
from .meta import MetaStore, decode
from .notify import Doorbell
from .producer import Producer
from ._files import raise_descriptor_limit
from .topic import MAX_PARTITIONS, Partition, Topic, TopicPartition, validate_topic_name
from .transactions import EXPIRY_CHECK_INTERVAL_S, TransactionCoordinator

MAX_REPLICATION_FACTOR = 32767                # Kafka's: a replica count is an int16

if TYPE_CHECKING:                  # imported when first used
    from .schema_registry import SchemaRegistry


# ---- the servers a broker starts --------------------------------------------------------
# They live above the broker (the Kafka listener, the replication server, the shipper,
# the registry's HTTP front) and import it; the broker imports none of them. The top of
# the package (logkit/__init__.py) registers how each starts, so `broker.serve()` and
# its friends are hand-offs through this table (docs/design.md §9). What a handle offers
# is written down here, as the protocols below.

class ServerHandle(Protocol):
    """A running server: where it listens, and `close()` (safe twice); a context
    manager; closed with its broker."""

    host: str
    port: int

    def close(self) -> None: ...
    def __enter__(self) -> Any: ...
    def __exit__(self, *exc: Any) -> Any: ...


class KafkaServerHandle(ServerHandle, Protocol):
    """`broker.serve()`'s handle: also the address Kafka clients bootstrap from."""

    @property
    def bootstrap_servers(self) -> str: ...


class RegistryServerHandle(ServerHandle, Protocol):
    """`broker.serve_schema_registry()`'s handle: also its base URL."""

    url: str


class ShipperHandle(Protocol):
    """`broker.ship()`'s handle: the store's URL, `flush()` (one pass now) and `close()`
    (a last pass; safe twice); a context manager."""

    url: str

    def flush(self, *args: Any, **kwargs: Any) -> Any: ...
    def close(self) -> None: ...
    def __enter__(self) -> Any: ...
    def __exit__(self, *exc: Any) -> Any: ...


SERVERS = ("kafka", "replication", "schema-registry", "shipper", "rest")
_starters: dict[str, Callable[..., Any]] = {}


def register_server(kind: str, start: Callable[..., Any]) -> None:
    """Say how a broker starts the server `kind` (one of SERVERS): `start(broker, ...)`
    returns its handle. Called by logkit/__init__.py for every kind."""
    if kind not in SERVERS:
        raise ValueError(f"unknown server kind {kind!r}")
    _starters[kind] = start


def _starter(kind: str) -> Callable[..., Any]:
    start = _starters.get(kind)
    assert start is not None, f"logkit/__init__.py registers the {kind} server"
    return start

__all__ = ["Broker", "FORMAT_VERSION", "ServerHandle", "KafkaServerHandle",
           "RegistryServerHandle", "ShipperHandle", "register_server"]

FORMAT_VERSION = "1.0"
FORMAT_FILE = "logkit.json"
PARTITION_METADATA = "partition.metadata"     # Kafka's: version and topic id
TOMBSTONE_SUFFIX = ".delete"
TRANSACTION_LOCK = "transactions.lock"         # transactions.py's stripe locks
STALE_TMP_S = 60                              # a format temp file older is a crash's
# create_topic keeps the partitions it made open when partitions x this <= the soft
# descriptor limit (three descriptors each — the tail file, its map, the first
# segment's .log — plus room for the rest).
KEPT_DESCRIPTOR_SHARE = 4

log = logging.getLogger(__name__)


def _check_format(root: str) -> None:
    path = os.path.join(root, FORMAT_FILE)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)     # never through a link
        with open(fd, encoding="utf-8") as f:
            info = json.load(f)
        version = str(info["format_version"])
        major = int(version.split(".")[0])
    except FileNotFoundError:
        tmp = f"{path}.{os.getpid()}.tmp"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
            with open(fd, "w", encoding="utf-8") as f:
                json.dump({"format_version": FORMAT_VERSION, "created_by": "logkit"}, f)
                f.write("\n")
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)      # atomic: a concurrent opener sees all or nothing
            # the name durable before anything else lands in the root: a power cut must
            # not leave meta/ or a partition without it (then not a logkit root)
            dir_fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)
        except OSError as exc:
            _unlink_quietly(tmp)
            raise storage_error(exc, "create format file", path) from exc
        return
    except (ValueError, KeyError, TypeError) as exc:
        raise IncompatibleFormatError(f"{path} is not a logkit format file: {exc}") from None
    except OSError as exc:                # a link planted there (ELOOP), or an I/O fault
        raise storage_error(exc, "read format file", path) from exc
    if major != int(FORMAT_VERSION.split(".")[0]):
        raise IncompatibleFormatError(
            f"{path} has format version {version}; this logkit reads "
            f"{FORMAT_VERSION.split('.')[0]}.x")


def _unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def _sweep_format_temps(root: str, names: list[str] | None = None) -> None:
    """Remove `logkit.json.<pid>.tmp` files a crashed or failed opener left; `names`
    is the root's listing when the caller has just read it."""
    now = time.time()
    if names is None:
        try:
            names = os.listdir(root)
        except OSError:
            return               # best effort: the open that follows reports the fault
    for name in names:
        if name.startswith(FORMAT_FILE + ".") and name.endswith(".tmp"):
            path = os.path.join(root, name)
            try:
                if now - os.lstat(path).st_mtime > STALE_TMP_S:
                    os.unlink(path)
            except OSError:
                pass


def _check_root(root: str, *, adopt: bool) -> list[str] | None:
    """Refuse a path that is a file, or a non-empty directory that is not a logkit root
    (unless `adopt`), before anything is written there (docs/design.md §6). Returns the root's
    listing (None when it was not read: a missing root, or `adopt`)."""
    if os.path.lexists(root) and not os.path.isdir(root):
        raise ConfigError(f"{root} is not a directory; logkit.Broker(path) takes the "
                          "broker's root directory (missing, empty or a logkit root)")
    if adopt:
        return None
    try:
        entries = os.listdir(root)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise storage_error(exc, "open root", root) from exc
    if FORMAT_FILE in entries or os.path.isfile(os.path.join(root, "meta", "data.mdb")):
        return entries          # a logkit root (one whose format file is yet to be made)
    # an opener that died (or is running) before its format file landed leaves only
    # its temp file: still a logkit root in the making
    others = sorted(e for e in entries if not (e.startswith(FORMAT_FILE + ".")
                                               and e.endswith(".tmp")))
    if others:
        shown = ", ".join(others[:3]) + (f" and {len(others) - 3} more"
                                         if len(others) > 3 else "")
        raise ConfigError(f"{root} is not empty and is not a logkit directory (no "
                          f"{FORMAT_FILE}; it holds {shown}); give a new or empty "
                          "directory, or pass adopt=True to make a logkit root of it")
    return entries


def partition_dir(root: str, topic: str, partition: int) -> str:
    return os.path.join(root, f"{topic}-{partition}")


def read_topic_id(directory: str) -> str | None:
    """The topic id in a partition directory's `partition.metadata`, None if absent."""
    path = os.path.join(directory, PARTITION_METADATA)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise storage_error(exc, "open", path) from exc
    try:
        text = os.read(fd, 4096).decode("utf-8", "replace")
    except OSError as exc:
        raise storage_error(exc, "read", path) from exc
    finally:
        os.close(fd)
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "topic_id":
            return value.strip()
    return None


def write_topic_id(directory: str, topic_id: str, *, sync: bool = False) -> None:
    """Write Kafka's `partition.metadata` (version 0, topic id). By default into a
    directory nobody can see yet (made inside the transaction that publishes it): in
    place, made durable by the caller's `sync_filesystem` before the publish.
    `sync=True` replaces the file durably (a temporary name, an fsync, a rename), for
    a published directory."""
    path = os.path.join(directory, PARTITION_METADATA)
    if not sync:
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
            try:
                os.write(fd, f"version: 0\ntopic_id: {topic_id}\n".encode())
            finally:
                os.close(fd)
        except OSError as exc:
            raise storage_error(exc, "write partition metadata", path) from exc
        return
    tmp = path + ".tmp"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with open(fd, "w", encoding="utf-8") as f:
            f.write(f"version: 0\ntopic_id: {topic_id}\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        raise storage_error(exc, "write partition metadata", path) from exc


_syncfs: Any = None


def sync_filesystem(path: str) -> None:
    """One durability barrier for everything written under `path` so far: syncfs(2)
    on its file system (every dirty page, inode and directory entry, in one journal
    commit), or sync(2) where syncfs is missing. What create_topic pays once instead
    of an fsync per partition."""
    global _syncfs
    if _syncfs is None:
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)     # the loaded libc
        _syncfs = getattr(libc, "syncfs", False)
        if _syncfs:
            _syncfs.argtypes = [ctypes.c_int]
    if not _syncfs:
        os.sync()
        return
    import ctypes
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    except OSError as exc:
        raise storage_error(exc, "sync", path) from exc
    try:
        if _syncfs(fd) != 0:
            err = ctypes.get_errno()
            raise storage_error(OSError(err, os.strerror(err)), "sync", path)
    finally:
        os.close(fd)


def remove_tree(path: str) -> None:
    """Remove a directory tree; a failure is logged, and the tombstone is swept at the
    next open of the root."""
    def report(_function: Any, failed: str, exc_info: Any) -> None:
        log.warning("could not remove %s: %s", failed, exc_info[1])
    shutil.rmtree(path, onerror=report)


class Broker:
    """`with logkit.Broker("data/") as broker:` — create or open a root directory."""

    def __init__(self, path: str | os.PathLike[str], *,
                 config: Mapping[str, Any] | None = None,
                 background: bool = True, read_only: bool = False,
                 adopt: bool = False) -> None:
        """`read_only=True` opens an existing root for inspection (`logkit describe`,
        `logkit dump`): nothing is created, recovered or written; writes raise
        ReadOnlyError; no background chores run.

        `path` must be a missing or empty directory, or a logkit root (it has
        `logkit.json`); any other directory raises ConfigError naming it, and nothing
        is written there. `adopt=True` makes a logkit root of a non-empty directory
        anyway (its other files are left alone)."""
        self.path = os.fspath(path)
        self.config = resolve_broker_config(config)
        self._pid = _fork.owner_pid()
        self.read_only = read_only
        # ~3 descriptors per partition (tail.py); the soft limit, to budget them
        self._descriptor_limit = raise_descriptor_limit()
        listing = _check_root(self.path, adopt=adopt or read_only)
        if read_only:
            self._open_read_only()
            return
        try:
            os.makedirs(self.path, mode=0o700, exist_ok=True)
            if os.stat(self.path).st_uid != os.geteuid():
                log.warning("%s is owned by another user (uid %d); its files may be "
                            "changed under this process", self.path,
                            os.stat(self.path).st_uid)
            _sweep_format_temps(self.path, listing)
            check_directory(os.path.join(self.path, "meta"))
        except OSError as exc:
            raise storage_error(exc, "open root", self.path) from exc
        _check_format(self.path)
        self._lease: LeaseKeeper | None = LeaseKeeper(self.path, self.config)
        self.meta = LeaderMeta(os.path.join(self.path, "meta"), lease=self._lease)
        try:
            self.doorbell = Doorbell(self.path)
        except BaseException:
            self.meta.close()
            raise
        # the counter before any topic is opened: a change after it is one an open
        # topic may have missed (`_run_scheduler` compares)
        self._metadata_seen = self.doorbell.metadata_version()
        self._topics: dict[str, Topic] = {}
        self._topics_closed = False               # close() has closed them: keep none
        self._replica_state: Any = None           # leader/replicas.py, on first use
        self._lock = threading.RLock()
        self._closed = False
        self._clients: list[Any] = []
        self._stop = threading.Event()
        self._scheduler: threading.Thread | None = None
        self._txn_thread: threading.Thread | None = None
        self._cleaner: LogCleaner | None = None     # cleaner.py: compacted topics
        self.transaction_coordinator = self._transaction_coordinator()
        try:
            self._finish_interrupted_deletes()
            self._complete_prepared_transactions()
        except BaseException:
            self.meta.close()
            self.doorbell.close()
            raise
        # Every writable broker aborts expired transactions, background chores or not
        # (docs/design.md §15): an open transaction nobody ends holds every
        # read_committed reader of its partitions at its first offset.
        txn_thread = threading.Thread(target=self._run_transaction_expiry,
                                      name="logkit-transactions", daemon=True)
        try:
            start_thread(txn_thread, "the broker's transaction expiry thread")
            self._txn_thread = txn_thread
        except BaseException:
            self.meta.close()
            self.doorbell.close()
            raise
        if background:
            scheduler = threading.Thread(target=self._run_scheduler,
                                         name="logkit-scheduler", daemon=True)
            try:
                start_thread(scheduler, "the broker's retention scheduler")
                self._scheduler = scheduler
                if self.config["log.cleaner.enable"]:
                    cleaner = LogCleaner(self._compacted_partitions,
                                         self.config["log.cleaner.backoff.ms"],
                                         clock=_now_ms)
                    cleaner.start()
                    self._cleaner = cleaner
                self._lease.start()
            except BaseException:
                try:
                    self.close()           # stops what started, closes the stores
                except Exception as exc:   # the first error is the one to report
                    log.warning("closing %s after a failed open: %s", self.path, exc)
                raise

    def _open_read_only(self) -> None:
        if not os.path.isfile(os.path.join(self.path, FORMAT_FILE)):
            raise ConfigError(f"{self.path} is not a logkit directory (no {FORMAT_FILE}); "
                              "a read-only open creates nothing")
        _check_format(self.path)
        self.meta = MetaStore(os.path.join(self.path, "meta"), read_only=True)
        self._lease = None
        self.doorbell = None
        self._topics: dict[str, Topic] = {}
        self._topics_closed = False               # close() has closed them: keep none
        self._replica_state: Any = None           # leader/replicas.py, on first use
        self._lock = threading.RLock()
        self._closed = False
        self._clients: list[Any] = []
        self._stop = threading.Event()
        self._scheduler = None
        self._txn_thread = None
        self.transaction_coordinator = self._transaction_coordinator()

    def _check_writable(self, what: str) -> None:
        self._check_open()
        if self.read_only:
            raise ReadOnlyError(f"{what}: broker {self.path!r} is open read-only")
        if self._lease is not None:
            self._lease.check()                 # NotLeaderError: another replica leads

    def __repr__(self) -> str:
        return f"Broker({self.path!r})"

    def __enter__(self) -> "Broker":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    @property
    def fenced(self) -> bool:
        """True once another replica leads this root (its writes raise NotLeaderError)."""
        return self._lease is not None and self._lease.fenced

    @property
    def closed(self) -> bool:
        """True once close() was called."""
        return self._closed

    def _check_open(self) -> None:
        _fork.check_owner(self._pid, f"Broker({self.path!r})")
        if self._closed:
            raise ClosedError(f"broker {self.path!r} is closed")

    # ---- topics ----------------------------------------------------------------------

    def create_topic(self, name: str, partitions: int | None = None, *,
                     replication_factor: int | None = None,
                     config: Mapping[str, Any] | None = None,
                     exist_ok: bool = False) -> Topic:
        """Create a topic with `partitions` (default num.partitions), a replication
        factor (default default.replication.factor: the leader and the first
        replication_factor - 1 followers to report, docs/replication.md) and config
        overrides.

        `exist_ok=True` returns the topic when it already exists with the partition
        count, replication factor and config overrides asked for (a script may run
        twice); a topic of that name with other settings still raises
        TopicExistsError, saying which differ."""
        self._check_writable("create_topic")
        validate_topic_name(name)
        asked = partitions
        if partitions is None:
            partitions = self.config["num.partitions"]
        if isinstance(partitions, bool) or not isinstance(partitions, int) \
                or not 1 <= partitions <= MAX_PARTITIONS:
            raise ConfigError(f"partitions must be an integer in 1..{MAX_PARTITIONS}, "
                              f"got {partitions!r}")
        asked_rf = replication_factor
        if replication_factor is None:
            replication_factor = self.config["default.replication.factor"]
        if isinstance(replication_factor, bool) or not isinstance(replication_factor, int) \
                or not 1 <= replication_factor <= MAX_REPLICATION_FACTOR:
            raise ConfigError(f"replication_factor must be an integer in "
                              f"1..{MAX_REPLICATION_FACTOR}, got {replication_factor!r}")
        overrides = overrides_only(config)
        check_topic_config(overrides, self.config)              # validates the whole set
        self._live_record(name)                 # finishes a deletion under way
        if exist_ok:
            existing = self._existing_topic(name, asked, overrides, asked_rf)
            if existing is not None:
                return existing
        record = {"name": name, "partitions": partitions, "config": overrides,
                  "topic_id": uuid.uuid4().hex, "created_ms": int(time.time() * 1000)}
        if replication_factor != 1:          # absent: 1 (records made before the key)
            record["replication_factor"] = replication_factor

        config_resolved = resolve_topic_config(overrides, self.config)

        # The partition logs initialised inside the transaction stay open and become
        # the topic's handles, with the first segment each made, so a first append
        # opens and maps nothing — when descriptors are plentiful (a kept log holds
        # three; a process under a low limit opens partitions as it uses them).
        opened: dict[int, PartitionLog] = {}
        limit = self._descriptor_limit
        keep = opened if limit < 0 or partitions * KEPT_DESCRIPTOR_SHARE <= limit \
            else None

        def make_partitions() -> None:
            """Runs inside the metadata write transaction: a failure here rolls the
            whole create back, directories included."""
            self._make_partitions(name, range(partitions), record["topic_id"],
                                  config_resolved, "create topic", keep=keep)

        try:
            with self._lock:
                try:
                    self.meta.create_topic(name, record, before_commit=make_partitions)
                except TopicExistsError:
                    if not exist_ok:
                        raise TopicExistsError(
                            f"topic {name!r} already exists in {self.path} (create_topic"
                            "(..., exist_ok=True) returns an existing topic instead)"
                        ) from None
                    existing = self._existing_topic(name, asked, overrides,  # a racing
                                                    asked_rf)
                    if existing is None:                                     # creator won
                        raise
                    return existing
                log.debug("created topic %s: %d partition(s), topic id %s, overrides %s",
                          name, partitions, record["topic_id"], overrides)
                self._check_open()
                return self._topic(name, opened=opened)
        finally:
            for partition_log in opened.values():      # those no topic took over
                partition_log.close()

    def _existing_topic(self, name: str, partitions: int | None,
                        overrides: Mapping[str, Any],
                        replication_factor: int | None = None) -> Topic | None:
        """create_topic(exist_ok=True): the topic `name` if it exists with `partitions`
        (when given) and exactly these config overrides; None if it does not exist."""
        record = self._live_record(name)
        if record is None:
            return None
        differences = []
        if partitions is not None and partitions != record["partitions"]:
            differences.append(f"{record['partitions']} partition(s), not {partitions}")
        have_rf = record.get("replication_factor", 1)
        if replication_factor is not None and replication_factor != have_rf:
            differences.append(f"replication factor {have_rf}, not {replication_factor}")
        if dict(overrides) != dict(record["config"]):
            differences.append(f"config overrides {record['config']}, not {dict(overrides)}")
        if differences:
            raise TopicExistsError(f"topic {name!r} already exists with "
                                   f"{' and '.join(differences)} (exist_ok=True accepts "
                                   "only a topic with the settings asked for)")
        try:
            return self.topic(name)
        except UnknownTopicError:          # deleted meanwhile, or an interrupted delete
            return None

    def _make_partitions(self, name: str, numbers: range, topic_id: str,
                         config: dict[str, Any], operation: str,
                         keep: dict[int, PartitionLog] | None = None) -> None:
        """Make, stamp and initialise partition directories `numbers` of a topic, from
        inside the metadata transaction that will publish them: any failure removes
        the ones made and raises, and the transaction stores nothing. A directory
        already there is an orphan (no record counts it) and is moved away first.
        With `keep`, each partition's log stays open there (number -> log, opened as
        `_open_partition` would); the caller closes what it does not take over.

        Durability is one barrier for all of them (`sync_filesystem`, after the last
        directory is made, before the transaction commits), not an fsync each: a crash
        before the commit leaves orphan directories that no record counts, after it
        every directory, file and topic id the record names is on disk."""
        made: list[str] = []
        try:
            for number in numbers:
                directory = partition_dir(self.path, name, number)
                if os.path.lexists(directory):
                    self._move_away(directory, "an orphan (no topic record owns it)")
                os.makedirs(directory, mode=0o700)
                made.append(directory)
                write_topic_id(directory, topic_id)
                # Initialise it now (tail, first segment), so a full disk or a
                # descriptor limit fails here rather than at the first use.
                if keep is None:
                    PartitionLog(directory, name, number, config).close()
                else:
                    keep[number] = self._new_partition_log(directory, name, number,
                                                           config)
            sync_filesystem(self.path)
        except BaseException as exc:
            if keep:
                for partition_log in keep.values():
                    partition_log.close()
                keep.clear()
            for directory in made:
                remove_tree(directory)
            if isinstance(exc, OSError) and not isinstance(exc, LogkitError):
                raise storage_error(exc, operation, self.path) from exc
            raise

    def create_partitions(self, name: str, total: int) -> Topic:
        """Grow topic `name` to `total` partitions (Kafka's AdminClient
        `create_partitions` / `kafka-topics --alter --partitions`); returns the topic.

        `total` must be above the current count (ConfigError naming both: Kafka's
        INVALID_PARTITIONS; partitions are never removed) and at most MAX_PARTITIONS.
        Existing partitions and their records stay as they are; keyed records sent from
        now on map by murmur2 mod the new count, so a key may land in another partition
        than before, as in Kafka.

        Crash-safe like create_topic: the new directories are made, stamped and
        initialised inside the metadata transaction whose commit publishes the larger
        count, so a kill at any point leaves the old count (and, at worst, unused
        directories that the next growth moves away) or the new count with every
        directory in place. The same commit moves each consumer group subscribed to the
        topic to a new generation that assigns the new partitions. Other processes
        learn the count without reopening: producers from their next batch (a
        metadata counter in the doorbell page, plus a periodic re-read), consumers and
        the listener at their next lookup of the topic."""
        self._check_writable("create_partitions")
        validate_topic_name(name)
        if isinstance(total, bool) or not isinstance(total, int) \
                or not 1 <= total <= MAX_PARTITIONS:
            raise ConfigError(f"partitions must be an integer in 1..{MAX_PARTITIONS}, "
                              f"got {total!r}")
        with self._lock:
            topic = self.topic(name)           # UnknownTopicError; finishes a deletion
            if total <= topic.num_partitions:
                raise ConfigError(
                    f"topic {name!r} has {topic.num_partitions} partition(s); the new "
                    f"total must be larger, got {total} (Kafka's INVALID_PARTITIONS: "
                    "partitions are added, never removed)")
            groups: list[str] = []

            def make_partitions(old: int) -> None:
                self._make_partitions(name, range(old, total), topic.topic_id,
                                      topic.config, "add partitions")

            def rebalance(txn: Any) -> None:
                groups[:] = rebalance_subscribers(self.meta, txn, name)

            old = self.meta.grow_topic(name, topic.topic_id, total,
                                       before_commit=make_partitions,
                                       in_transaction=rebalance)
            topic.grow_to(total)
        self.doorbell.metadata_changed()
        for client in list(self._clients):
            if isinstance(client, Producer):
                client._learn_partitions(name)
        log.info("topic %s: %d partition(s), was %d%s", name, total, old,
                 f"; groups rebalanced: {', '.join(groups)}" if groups else "")
        return topic

    def _move_away(self, directory: str, why: str) -> None:
        """Rename a partition directory that is not the live topic's to a tombstone and
        remove it (its records must never be adopted by a topic of the same name)."""
        topic_id = read_topic_id(directory) or uuid.uuid4().hex
        tombstone = os.path.join(self.path, f".{topic_id}-{uuid.uuid4().hex[:8]}"
                                 f"{TOMBSTONE_SUFFIX}")
        log.warning("moving %s away: %s", directory, why)
        os.rename(directory, tombstone)
        remove_tree(tombstone)

    def topic(self, name: str) -> Topic:
        """Open an existing topic (UnknownTopicError if there is none)."""
        self._check_open()
        return self._topic(name)

    def _topic(self, name: str, opened: dict[int, PartitionLog] | None = None) -> Topic:
        """topic() without the open check, for a shipper's last pass inside close().
        `opened`: partition logs create_topic has just made; a new Topic takes them over
        (removed from the dict), else they stay there for the caller to close.

        Lock order: the broker's lock is never held while a partition is opened, since
        an open that must recover waits for the partition's append lock (up to its
        timeout, behind a stalled appender in any process); other topics, `topics()`
        and close() go on meanwhile. Two threads opening one topic both open it; the
        first to come back keeps its handle, the other closes its own."""
        validate_topic_name(name)
        with self._lock:
            record = self._cached_or_record(name)
            if isinstance(record, Topic):
                return record
        config = resolve_topic_config(record["config"], self.config)
        handed = dict(opened) if opened else {}
        first = handed.get(0) or self._open_partition(record, 0, config)
        with self._lock:
            cached = self._topics.get(name)
            if self._topics_closed or (cached is not None
                                       and cached.topic_id == record["topic_id"]):
                if 0 not in handed:
                    first.close()                 # closed meanwhile, or another thread won
                if cached is None:
                    raise ClosedError(f"{self!r} is closed")
                return cached
            if first.deleted and not self.read_only:  # a deletion that predates the
                first.close()                         # record's flag: finish it
                log.warning("finishing the interrupted deletion of topic %s (topic id %s) "
                            "in %s", name, record["topic_id"], self.path)
                self.meta.mark_topic_deleting(name, record["topic_id"])
                self._finish_delete(name, record)
                raise UnknownTopicError(f"topic {name!r} does not exist in {self.path}")
            replication_factor = record.get("replication_factor", 1)
            handed[0] = first
            # a partition opened later opens with the topic's config of that moment
            # (`topic` is bound below, before any later open: `apply_config` may have
            # replaced the config meanwhile)
            topic = Topic(name, record["partitions"],
                          lambda n: self._open_partition(record, n, topic.config),
                          config, record["topic_id"], opened=handed,
                          replication_factor=replication_factor,
                          overrides=record.get("config", {}),
                          **self._replicated(record["topic_id"], replication_factor))
            if cached is not None:                    # deleted and re-created elsewhere
                self._topics.pop(name).close()
            self._topics[name] = topic
            if opened:
                opened.clear()                 # the topic owns them now
            return topic

    def _cached_or_record(self, name: str) -> Topic | dict[str, Any]:
        """Under the lock: the open Topic `name` when it is the live incarnation, else
        the live record (a cached handle of an older incarnation is closed);
        UnknownTopicError when there is none."""
        record = self._live_record(name)
        cached = self._topics.get(name)
        if record is None:
            if cached is not None:
                self._topics.pop(name).close()
            raise UnknownTopicError(f"topic {name!r} does not exist in {self.path}")
        if cached is not None and cached.topic_id == record["topic_id"]:
            cached.grow_to(record["partitions"])      # create_partitions, anywhere
            overrides = record.get("config", {})
            if overrides != cached.overrides:         # alter_topic_config, anywhere
                cached.apply_config(resolve_topic_config(overrides, self.config), overrides)
                log.info("topic %s: applied its new config overrides %s", name, overrides)
            return cached
        if cached is not None:                        # deleted and re-created elsewhere
            self._topics.pop(name).close()
        return record

    def _replicated(self, topic_id: str, replication_factor: int) -> dict[str, Any]:
        """Topic() options for a replicated topic: its partitions read below the ISR's
        high watermark (logkit/leader/replicas.py); {} for a factor of 1."""
        if replication_factor == 1:
            return {}
        if self._replica_state is None:
            self._replica_state = ReplicaState(
                self.path, lag_time_max_ms=self.config["replica.lag.time.max.ms"],
                writable=not self.read_only,
                ring=None if self.doorbell is None else self.doorbell.ring)
        state = self._replica_state

        def make(topic: str, number: int, opener: Any, log: Any) -> Any:
            return ReplicatedPartition(topic, number, opener, log, replicas=state,
                                       topic_id=topic_id,
                                       replication_factor=replication_factor)
        return {"partition_class": make}

    @property
    def replica_state(self) -> Any:
        """The leader's replica state (logkit/leader/replicas.py), None until a
        replicated topic is opened."""
        return self._replica_state

    def describe_replicas(self) -> list[dict[str, Any]]:
        """Per partition of every topic: replication factor, replica set, ISR, log end,
        high watermark, leader epochs and each follower's log end and lag (`logkit
        replicas`; logkit/leader/replicas.py). Reads only."""
        self._check_open()
        return describe_replicas(self)

    def _open_partition(self, record: dict[str, Any], number: int,
                        config: dict[str, Any]) -> PartitionLog:
        name, topic_id = record["name"], record["topic_id"]
        directory = partition_dir(self.path, name, number)
        try:
            on_disk = read_topic_id(directory)
        except NotADirectoryError:
            on_disk = None
        if on_disk is not None and on_disk != topic_id:
            raise StorageError(f"{directory} belongs to another incarnation of topic "
                               f"{name!r} (topic id {on_disk}, expected {topic_id})",
                               operation="open partition", path=directory)
        present = on_disk is not None or os.path.isdir(directory)   # (it was read)
        if self.read_only and not present:
            raise StorageError(f"{directory} is missing", operation="open partition",
                               path=directory)
        if not present and self._tombstones(topic_id):
            # renamed away by an interrupted delete: report it as deleted
            raise UnknownTopicError(f"topic {name!r} is being deleted")
        partition_log = self._new_partition_log(directory, name, number, config)
        if on_disk is None and not self.read_only:
            try:
                write_topic_id(directory, topic_id, sync=True)  # made before ids
            except OSError as exc:
                partition_log.close()
                raise storage_error(exc, "open partition", directory) from exc
        return partition_log

    def _new_partition_log(self, directory: str, name: str, number: int,
                           config: dict[str, Any]) -> PartitionLog:
        """Open partition `number`'s log as this broker serves it: read-only without
        the lease, else a LeaderLog whose appends ask the lease first."""
        if self._lease is None:
            return PartitionLog(directory, name, number, config, doorbell=self.doorbell,
                                read_only=True)
        partition_log = LeaderLog(directory, name, number, config, doorbell=self.doorbell,
                                  lease=self._lease)
        partition_log.dedupe_buffer_bytes = self.config["log.cleaner.dedupe.buffer.size"]
        partition_log.dedupe_load_factor = self.config["log.cleaner.io.buffer.load.factor"]
        return partition_log

    def get_or_create_topic(self, name: str) -> Topic:
        """The topic, auto-created with num.partitions when auto.create.topics.enable."""
        try:
            return self.topic(name)
        except UnknownTopicError:
            if not self.config["auto.create.topics.enable"]:
                raise
        try:
            topic = self.create_topic(name)
        except TopicExistsError:                       # another process won the race
            return self.topic(name)
        # Kafka's default, but a misspelt name would otherwise poll [] for ever unnoticed.
        log.warning("auto-created topic %r with %d partition(s) in %s, because a client "
                    "named it and auto.create.topics.enable is true", name,
                    topic.num_partitions, self.path)
        return topic

    def topics(self) -> list[str]:
        self._check_open()
        return sorted(self.meta.topic_names())

    def alter_topic_config(self, name: str, config: Mapping[str, Any]) -> dict[str, Any]:
        """Change topic `name`'s config overrides (Kafka's incremental alter-configs):
        each key of `config` is set, or with the value None goes back to its default.
        Checked as create_topic checks (ConfigError, nothing stored). Returns the
        topic's overrides after the change.

        The change takes effect at once in this broker's open partitions (appends,
        rolls, retention, flushes and the cleaner read the new values from their next
        call; `PartitionLog.apply_config`), as Kafka applies a topic config change to
        its live logs. Another process's broker that has the topic open applies it at
        its next `topic()` of that name — its background thread looks every
        log.flush.scheduler.interval.ms after the doorbell's metadata counter moved,
        its producers at their next batch, its retention check and cleaner each round
        — and a new Broker reads it when it opens the topic."""
        self._check_writable("alter_topic_config")
        validate_topic_name(name)
        if not isinstance(config, Mapping):
            raise ConfigError(f"alter_topic_config takes a dict of changes, got "
                              f"{type(config).__name__}")
        setting = overrides_only({k: v for k, v in config.items() if v is not None})
        removing = [lookup(TOPIC, k).key for k, v in config.items() if v is None]
        key = name.encode()

        def alter(txn: Any) -> dict[str, Any]:
            raw = txn.get(key, db=self.meta.db("topics"))
            if raw is None:
                raise UnknownTopicError(f"topic {name!r} does not exist in {self.path}")
            record = decode(raw)
            overrides = {k: v for k, v in record["config"].items() if k not in removing}
            overrides.update(setting)
            check_topic_config(overrides, self.config)       # the whole set still holds
            record["config"] = overrides
            self.meta.put(txn, "topics", key, record)
            return record

        record = self.meta.write(alter, operation=f"alter the config of topic {name!r}")
        overrides = record["config"]
        log.info("topic %s: config overrides now %s", name, overrides)
        with self._lock:
            cached = self._topics.get(name)
            if cached is not None and cached.topic_id == record["topic_id"]:
                cached.apply_config(resolve_topic_config(overrides, self.config), overrides)
        if self.doorbell is not None:          # other processes' brokers apply it too
            self.doorbell.metadata_changed()
        return dict(overrides)

    def groups(self) -> list[str]:
        """The consumer group ids this broker knows, sorted: every group with members,
        a generation or committed offsets (like `topics()`; `group(id)` admits any id)."""
        self._check_open()
        return list_groups(self.meta)

    def delete_topic(self, name: str) -> None:
        """Delete a topic: flag its record deleting, flag its partitions deleted,
        rename them to tombstones, remove its record, remove the tombstones (see the
        module docstring). A deletion under way (interrupted, or running in another
        process) is finished, and the call returns."""
        self._check_writable("delete_topic")
        validate_topic_name(name)
        with self._lock:
            record = self.meta.get_topic(name)
            if record is None:
                raise UnknownTopicError(f"topic {name!r} does not exist in {self.path}")
            if not record.get("deleting") and \
                    not self.meta.mark_topic_deleting(name, record["topic_id"]):
                raise UnknownTopicError(f"topic {name!r} does not exist in {self.path}")
            self._finish_delete(name, record)
        if self.doorbell is not None:          # producers re-read their topics
            self.doorbell.metadata_changed()
        log.debug("deleted topic %s (topic id %s)", name, record["topic_id"])

    def _live_record(self, name: str) -> dict[str, Any] | None:
        """Topic `name`'s record, or None when there is none or its deletion has begun
        (a writable broker finishes that deletion first)."""
        record = self.meta.get_topic(name)
        if record is None or not record.get("deleting"):
            return record
        if not self.read_only:
            with self._lock:
                log.warning("finishing the interrupted deletion of topic %s (topic id "
                            "%s) in %s", name, record["topic_id"], self.path)
                self._finish_delete(name, record)
        return None

    def _finish_delete(self, name: str, record: dict[str, Any]) -> None:
        """Steps (1)-(4) of a deletion whose record is flagged `deleting` (or whose
        partitions are, by a deletion that predates the flag); safe to run again after
        a crash or an error at any step, and beside another process running it."""
        cached = self._topics.pop(name, None)
        if cached is not None and cached.topic_id != record["topic_id"]:
            cached.close()
            cached = None
        topic_id = record["topic_id"]
        try:
            try:
                self._flag_partitions_deleted(name, record, cached)
            finally:
                if cached is not None:
                    cached.close()
            for number in range(record["partitions"]):
                directory = partition_dir(self.path, name, number)
                if os.path.isdir(directory) and read_topic_id(directory) in (topic_id, None):
                    try:
                        os.rename(directory, os.path.join(
                            self.path, f".{topic_id}-{number}{TOMBSTONE_SUFFIX}"))
                    except FileNotFoundError:
                        pass                   # another process renamed it meanwhile
        except OSError as exc:
            raise storage_error(exc, "delete topic", self.path) from exc
        try:
            self.meta.delete_topic(name, topic_id)
        except UnknownTopicError:
            pass                               # another process got there first
        for tombstone in self._tombstones(topic_id):
            remove_tree(tombstone)

    def _flag_partitions_deleted(self, name: str, record: dict[str, Any],
                                 cached: Topic | None) -> None:
        """Step (1): flag every partition of the incarnation `record` deleted, through
        the open topic when this broker has one; a partition that cannot be opened
        (missing, unreadable) is deleted without its flag."""
        opened = {p.partition: p for p in (cached.partitions if cached else ())
                  if p.opened}
        topic_id = record["topic_id"]
        config = resolve_topic_config(record["config"], self.config)
        for number in range(record["partitions"]):
            if number in opened:
                opened[number]._log.mark_deleted()
                continue
            directory = partition_dir(self.path, name, number)
            try:
                if not os.path.isdir(directory) or \
                        read_topic_id(directory) not in (topic_id, None):
                    continue
                partition_log = self._new_partition_log(directory, name, number, config)
            except (StorageError, UnknownTopicError, OSError) as exc:
                log.warning("deleting %s without flagging it: %s", directory, exc)
                continue
            try:
                partition_log.mark_deleted()
            finally:
                partition_log.close()

    def _tombstones(self, topic_id: str | None = None) -> list[str]:
        prefix = f".{topic_id}-" if topic_id else "."
        try:
            entries = os.listdir(self.path)
        except OSError as exc:
            raise storage_error(exc, "list", self.path) from exc
        return [os.path.join(self.path, entry) for entry in entries
                if entry.startswith(prefix) and entry.endswith(TOMBSTONE_SUFFIX)]

    def _finish_interrupted_deletes(self) -> None:
        """At open: a record flagged `deleting`, or a tombstone whose topic record still
        exists, is a deletion that died on its way; finish it, then sweep."""
        tombstones = self._tombstones()
        ids = {os.path.basename(t)[1:].split("-")[0] for t in tombstones}
        for name, record in self.meta.topic_records():
            if record.get("deleting") or record["topic_id"] in ids:
                log.warning("finishing the interrupted deletion of topic %s (topic id %s) "
                            "in %s", name, record["topic_id"], self.path)
                self._finish_delete(name, record)
        for tombstone in self._tombstones():
            remove_tree(tombstone)

    # ---- chores ----------------------------------------------------------------------

    def _open_topics(self) -> list[Topic]:
        names = self.topics()
        with self._lock:                  # let go of topics deleted by another process
            for gone in set(self._topics) - set(names):
                record = self.meta.get_topic(gone)
                if record is None or record.get("deleting"):
                    self._topics.pop(gone).close()
        topics = []
        for name in names:
            try:
                topics.append(self.topic(name))
            except UnknownTopicError:
                pass                                   # deleted meanwhile
        return topics

    def enforce_retention(self, now_ms: int | None = None) -> int:
        """Apply retention.ms / retention.bytes to every topic; returns segments deleted."""
        self._check_writable("enforce_retention")
        return sum(p.enforce_retention(now_ms)
                   for topic in self._open_topics() for p in topic.partitions)

    def _compacted_partitions(self) -> list[Partition]:
        """The background cleaner's round: every partition of every compacted topic
        (opened, so a topic no process has touched since the start gets cleaned too);
        none while this broker's lease is fenced."""
        if self._closed or (self._lease is not None and self._lease.fenced):
            return []
        out = []
        for name in self.meta.topic_names():
            record = self.meta.get_topic(name)
            if record is None or not is_compacted(
                    resolve_topic_config(record.get("config", {}), self.config)):
                continue
            try:
                out.extend(self.topic(name).partitions)
            except (UnknownTopicError, ClosedError):
                continue
        return out

    def flush(self) -> None:
        """fsync every partition of every open topic."""
        self._check_open()
        with self._lock:
            topics = list(self._topics.values())
        for topic in topics:
            for partition in topic.partitions:
                partition.flush()

    def _refresh_open_topics(self) -> None:
        """Re-read the record of every topic this broker has open, applying what another
        process changed (`_cached_or_record`: a config change, more partitions, a
        deletion). One metadata read per open topic."""
        with self._lock:
            for name in list(self._topics):
                try:
                    self._cached_or_record(name)
                except UnknownTopicError:
                    pass                       # deleted: its handle was let go

    def _run_scheduler(self) -> None:
        retention_s = self.config["log.retention.check.interval.ms"] / 1000
        flush_s = self.config["log.flush.scheduler.interval.ms"] / 1000
        next_retention = time.monotonic() + retention_s
        while not self._stop.wait(min(flush_s, retention_s)):
            try:
                metadata_now = self.doorbell.metadata_version()
                if metadata_now != self._metadata_seen:  # a config change, anywhere?
                    self._metadata_seen = metadata_now
                    self._refresh_open_topics()
                with self._lock:
                    topics = list(self._topics.values())
                for topic in topics:
                    if topic.config["flush.ms"] < LONG_MAX:
                        for partition in topic.partitions:
                            partition.maybe_flush()
                if time.monotonic() >= next_retention:
                    next_retention = time.monotonic() + retention_s
                    if not (self._lease is not None and self._lease.fenced):
                        self.enforce_retention()
            except ClosedError:
                return
            except (LogkitError, OSError) as exc:  # an operating error: the next run retries
                log.warning("background retention/flush of %s failed: %s", self.path, exc,
                            exc_info=exc)
            except Exception:                      # a bug: say so, and let the thread end
                log.exception("background chores of %s stopped", self.path)
                raise

    # ---- transactions (transactions.py, docs/design.md §15) ---------------------------

    def _transaction_coordinator(self) -> TransactionCoordinator:
        """The one coordinator of this broker, which the embedded producers and the
        Kafka listener share: one namespace of transactional ids."""
        return TransactionCoordinator(
            self.meta, self._write_markers,
            lock_path=None if self.read_only else os.path.join(self.path,
                                                               TRANSACTION_LOCK),
            sync=self._sync_partitions,
            offset_metadata_max_bytes=self.config["offset.metadata.max.bytes"])

    def _write_markers(self, partitions: list[TopicPartition], producer_id: int,
                       epoch: int, commit: bool) -> None:
        """The coordinator's second phase: a COMMIT or ABORT control batch on each
        partition of the transaction (a no-op where the producer has none open). A
        deleted topic has nothing to end."""
        for tp in partitions:        # _topic: also while close() aborts a producer's
            try:
                partition = self._topic(tp.topic).partition(tp.partition)
            except UnknownTopicError:
                continue
            partition.append_control(producer_id, epoch, commit=commit)

    def _sync_partitions(self, partitions: list[TopicPartition]) -> None:
        """fsync partitions for the transaction coordinator: a commit's partitions
        before PrepareCommit, and every partition that got a marker or that the offsets
        name before Complete* (transactions.py, "Power loss"): after a power cut no
        marker is missing under a Complete*, no commit is visible in part, and the
        offsets never point past durable records (the rule group commits follow)."""
        for tp in partitions:
            try:
                self._topic(tp.topic).partition(tp.partition).flush()
            except UnknownTopicError:
                continue

    def _complete_prepared_transactions(self) -> None:
        """At open: finish the transactions a crash left between their two phases."""
        try:
            done = self.transaction_coordinator.complete_prepared()
        except (LogkitError, OSError) as exc:   # the expiry thread and the next call retry
            log.warning("completing prepared transactions of %s failed: %s", self.path,
                        exc)
            return
        if done:
            log.info("%s: completed %d transaction(s) a crash left prepared", self.path,
                     done)

    def _run_transaction_expiry(self) -> None:
        """Abort transactions past their transaction.timeout.ms (and finish prepared
        ones), every EXPIRY_CHECK_INTERVAL_S, as Kafka's coordinator does."""
        coordinator = self.transaction_coordinator
        while not self._stop.wait(EXPIRY_CHECK_INTERVAL_S):
            if self._lease is not None and self._lease.fenced:
                continue
            try:
                coordinator.complete_prepared()
                coordinator.abort_expired()
            except ClosedError:
                return
            except (LogkitError, OSError) as exc:  # an operating error: the next run retries
                log.warning("aborting expired transactions of %s failed: %s", self.path,
                            exc)
            except Exception:                      # a bug: say so, and let the thread end
                log.exception("the transaction expiry thread of %s stopped", self.path)
                raise

    # ---- clients ---------------------------------------------------------------------

    def producer(self, **options: Any) -> Producer:
        """A Producer writing to this broker's topics (see docs/clients.md); closed with
        the broker."""
        self._check_writable("producer")
        producer = Producer(self, **options)
        self._clients.append(producer)
        return producer

    def consumer(self, *topics: str, **options: Any) -> Consumer:
        """A Consumer of `topics` (or of none, for assign()); closed with the broker."""
        self._check_open()
        consumer = Consumer(self, *topics, **options)
        self._clients.append(consumer)
        return consumer

    def group(self, group_id: str) -> ConsumerGroup:
        """Inspect and administer consumer group `group_id`."""
        self._check_open()
        return ConsumerGroup(self, group_id)

    # ---- lifecycle -------------------------------------------------------------------

    def close(self) -> None:
        """Close clients, stop chores, flush and mark logs clean. Safe to call twice.
        Every partition is closed even if one fails; the first failure is raised after.
        In a process forked from the one that opened it, it touches nothing."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        if self._pid != _fork.owner_pid():
            return
        errors: list[BaseException] = []
        # Shippers close last, with topics and metadata still open: their last pass
        # ships what the other clients' closes flush and commit.
        for client in sorted(reversed(self._clients),
                             key=lambda c: bool(getattr(c, "close_last", False))):
            try:
                client.close()
            except (LogkitError, OSError) as exc:    # closing goes on to release the files
                log.warning("closing %r failed: %s", client, exc)
            except Exception as exc:                 # a bug: raised once the files are free
                log.exception("closing %r failed", client)
                errors.append(exc)
        self._clients.clear()
        self._stop.set()
        cleaner = getattr(self, "_cleaner", None)    # none in a read-only broker
        if cleaner is not None:
            cleaner.stop()
        if self._scheduler is not None and self._scheduler is not threading.current_thread():
            self._scheduler.join(timeout=10)
        if self._txn_thread is not None and self._txn_thread is not threading.current_thread():
            self._txn_thread.join(timeout=10)
        self.transaction_coordinator.close()
        if self._lease is not None:
            self._lease.close()                 # releases a lease it renewed
        with self._lock:
            self._topics_closed = True
            for topic in self._topics.values():
                try:
                    topic.close()
                except (OSError, LogkitError) as exc:
                    errors.append(exc)
            self._topics.clear()
        closers = [self.meta.close, getattr(self.doorbell, "close", lambda: None)]
        if self._replica_state is not None:
            closers.insert(0, self._replica_state.close)
        for closer in closers:
            try:
                closer()
            except (OSError, LogkitError) as exc:
                errors.append(exc)
        if errors:
            first = errors[0]
            for later in errors[1:]:                 # only the first can be raised
                log.warning("closing %s: a further failure: %s", self.path, later)
            if isinstance(first, OSError):
                raise storage_error(first, "close", self.path) from first
            raise first

    # ---- schemas (schema_registry.py, registry_http.py) ------------------------------

    def schema_registry(self) -> SchemaRegistry:
        """The embedded schema registry, kept in this broker's metadata store
        (docs/schemas.md); one object per broker."""
        from .schema_registry import SchemaRegistry
        self._check_open()
        return SchemaRegistry.for_broker(self)

    def serve_schema_registry(self, host: str = "127.0.0.1", port: int = 0,
                              **options: Any) -> RegistryServerHandle:
        """Serve the registry over the REST subset confluent-kafka's SchemaRegistryClient
        uses, on host:port (0: a free port). The handle has `.url`, `.host`, `.port`,
        `close()`; it is closed with the broker. Options: `max_connections`,
        `idle_timeout_ms`, `request_timeout_ms` (docs/security.md)."""
        self._check_open()
        server = _starter("schema-registry")(self.schema_registry(), host=host, port=port,
                                             **options)
        self._clients.append(server)
        return server

    # ---- the Kafka protocol listener (logkit/protocol) ---------------------------------

    def serve(self, host: str = "127.0.0.1", port: int = 0,
              **options: Any) -> KafkaServerHandle:
        """Serve this broker to Kafka clients (kafka-python, aiokafka, confluent-kafka)
        over Kafka's wire protocol on host:port (0: a free port), from background
        threads of this process (docs/kafka-protocol.md). The handle has `.host`,
        `.port`, `.bootstrap_servers`, `close()` (safe twice); a context manager; it is
        closed with the broker. Options: `advertised_host`, `max_request_bytes`
        (socket.request.max.bytes), `idle_timeout_ms`, `request_timeout_ms`,
        `max_connections`, `initial_rebalance_delay_ms` (default 0), `ssl_context`,
        `sasl_plain_users` ({user: password})."""
        if self.fenced:                # another replica leads: its listener sends clients
            self._check_open()         # there (NOT_LEADER_OR_FOLLOWER, NOT_COORDINATOR)
        else:
            self._check_writable("serve")
        server = _starter("kafka")(self, host=host, port=port, **options)
        self._clients.append(server)
        return server

    # ---- the REST proxy (logkit/rest.py) ---------------------------------------------

    def serve_rest(self, host: str = "127.0.0.1", port: int = 0, *,
                   users: Mapping[str, str] | None = None, ssl_context: Any = None,
                   max_body_bytes: int = 16 << 20, **options: Any) -> RegistryServerHandle:
        """Serve this broker over HTTP in Confluent REST Proxy's v3 and v2 shapes on
        host:port (0: a free port), from a background thread of this process
        (docs/web.md). `users` ({name: password}) requires Basic auth; `ssl_context`
        (a server context of the `ssl` module) adds TLS; `max_body_bytes` bounds a body
        (per record when streamed). The handle has `.url`, `.host`, `.port`, `close()`
        (safe twice); a context manager; it is closed with the broker. Options:
        `max_connections`, `idle_timeout_ms`, `request_timeout_ms`,
        `consumer_instance_timeout_ms`."""
        self._check_writable("serve_rest")
        server = _starter("rest")(self, host=host, port=port,
                                  users=dict(users) if users is not None else None,
                                  ssl_context=ssl_context, max_body_bytes=max_body_bytes,
                                  **options)
        self._clients.append(server)
        return server

    # ---- replication over TCP (logkit/replication/tcp_server.py) -----------------------

    def serve_replication(self, host: str = "127.0.0.1", port: int = 0, *,
                          secret: str | bytes, ssl_context: Any = None,
                          **options: Any) -> ServerHandle:
        """Serve this broker's partitions to `logkit.TcpSource` followers on host:port
        (0: a free port), from background threads of this process (docs/replication.md,
        "Replication over TCP"). Followers authenticate with the shared `secret`
        (challenge-response; it never crosses the wire); `ssl_context` (a server
        context of the `ssl` module) adds TLS. The handle has `.host`, `.port`,
        `close()` (safe twice); a context manager; it is closed with the broker.
        Options: `idle_timeout_ms`, `request_timeout_ms`, `max_connections`."""
        self._check_writable("serve_replication")
        server = _starter("replication")(self, host, port, secret=secret,
                                         ssl_context=ssl_context, **options)
        self._clients.append(server)
        return server

    # ---- object store replication (logkit/replication/objectstore.py) ----------------

    def ship(self, url: str, *, storage_options: Mapping[str, Any] | None = None
             ) -> ShipperHandle:
        """Ship this broker to an object store (any fsspec URL, e.g. `s3://bucket/p`,
        `file:///backup`) from a background thread: rolled segments once as whole
        objects, the active segment's new batches every `ship.interval.ms`, then a
        manifest (docs/replication.md). The handle has `.url`, `flush()`, `close()`
        (ships a last time; safe twice); a context manager; closed with the broker.
        `storage_options` go to fsspec (else its configuration and environment)."""
        self._check_open()
        shipper = _starter("shipper")(self, url, storage_options=storage_options)
        self._clients.append(shipper)
        return shipper
