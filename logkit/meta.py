"""The broker's metadata store: one LMDB environment under `<root>/meta/`.

Owns: opening the environment once per process (LMDB forbids two handles on one file in
a process, so handles are shared and reference-counted), the named sub-databases, the
topic records, and every transaction on them. Other modules keep their own keys in their
own sub-database: `groups` and `offsets` (group.py), `replication` (replication),
`spark` (the Spark sink), `txn` and `producer_ids` (transactions.py). They read and
write through `read()`/`write()` (a function run in one transaction, retried after a
repair) or `transaction()` (a context manager).

Invariant: every multi-key change is one LMDB write transaction, so processes sharing
the directory see all of it or none of it. Values are JSON (readable with any LMDB tool);
every key is at most `MAX_KEY_BYTES` and every value at most `MAX_VALUE_BYTES`, checked
before LMDB sees them. Every LMDB error that reaches a caller is a `MetadataStoreError`
(`_translate`, the one place that names them), with the LMDB error as `__cause__`.

Repairs, made under an exclusive hold (no transaction of this process open on the env):
- map full: the map doubles, up to `max_map_size_bytes` (a write that only deletes may
  go to twice that, so freeing space always works), and the transaction runs again;
- map resized by another process: adopt its size and run again;
- MDB_PANIC (a failed meta-page write poisons the env for the whole process): close and
  reopen the shared env, then run again once. Handles read the env from the shared
  entry, so every MetaStore in the process picks up the new one.

Fork: LMDB handles cannot be used after fork. Before a fork the store waits until no
other thread is inside a transaction (and holds new ones off); the child then closes the
inherited envs, which with no transaction open touches nothing the parent owns (LMDB
clears only reader slots of the closing pid), so the child can open its own. An env
that was mid-transaction in the forking thread is kept alive, never closed, in
`_inherited`. A MetaStore made before the fork raises `ForkedProcessError` in the child.

Thread-safety: any thread may use a MetaStore; `_state` guards the registry and the
hold counts.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import struct
import threading
from contextlib import contextmanager
from typing import Any, Callable, Iterator, TypeVar

import lmdb

from ._files import fsync_path
from ._fork import at_fork_in_child, check_owner, owner_pid
from .errors import (ClosedError, ConfigError, DiskFullError, MetadataStoreError,
                     ReadOnlyError, TopicExistsError, UnknownTopicError)

__all__ = ["MetaStore", "DATABASES", "MetadataDiskFullError", "MAX_KEY_BYTES",
           "MAX_VALUE_BYTES"]

log = logging.getLogger("logkit.meta")

DATABASES = ("topics", "groups", "offsets", "members", "replication", "spark",
             "schemas",                 # schemas: schema_registry.py
             "txn", "producer_ids")     # transactions.py: the transaction coordinator
MAP_SIZE_BYTES = 1 << 30          # address space, not disk: LMDB files grow as needed
MAX_MAP_SIZE_BYTES = 1 << 36      # 64 GiB: growth stops here; metadata is small
MAX_READERS = 1024
MAX_KEY_BYTES = 511               # LMDB's compiled-in key limit (mdb_env_get_maxkeysize)
MAX_VALUE_BYTES = 16 << 20        # one record; offsets and groups are far smaller
MAX_REPAIRS = 64                  # repairs per call: doublings plus a reopen, with room

T = TypeVar("T")


class MetadataDiskFullError(MetadataStoreError, DiskFullError):
    """ENOSPC on the metadata store: the disk is full. Free space and retry."""


# ---- LMDB errors -> named errors (the one place) -----------------------------------------

# (LMDB error, our class, errno, what it means for the operator). First match wins.
_LMDB_ERRORS: tuple[tuple[type, type, int | None, str], ...] = (
    (lmdb.DiskError, MetadataDiskFullError, errno.ENOSPC,
     "the disk is full; free space and retry"),
    (lmdb.MapFullError, MetadataStoreError, None,
     "the store reached its size limit of {limit} bytes; delete unused consumer groups "
     "or topics, then retry"),
    (lmdb.PanicError, MetadataStoreError, None,
     "LMDB hit a fatal I/O error (MDB_PANIC) and reopening the environment did not "
     "clear it; check the disk (dmesg), then close every Broker on this directory and "
     "open it again"),
    (lmdb.ReadonlyError, MetadataStoreError, errno.EACCES,
     "the files are not writable (permission denied)"),
    (lmdb.ReadersFullError, MetadataStoreError, None,
     f"more than {MAX_READERS} readers are open on it at once"),
    ((lmdb.CorruptedError, lmdb.PageNotFoundError, lmdb.InvalidError,
      lmdb.VersionMismatchError), MetadataStoreError, None,
     "the files are corrupt or not an LMDB store; restore <root>/meta from a copy"),
    (lmdb.Error, MetadataStoreError, None, "a write that failed stored nothing; retry, "
     "and if it repeats check the disk and the files under <root>/meta"),
)

# Errors a retry can cure once the env is repaired (see the module docstring).
_REPAIRABLE = (lmdb.MapFullError, lmdb.MapResizedError, lmdb.PanicError)


def _translate(exc: lmdb.Error, path: str, operation: str,
               limit: int = MAX_MAP_SIZE_BYTES) -> MetadataStoreError:
    """The named error for an LMDB error; raise it `from exc`."""
    for lmdb_class, cls, code, advice in _LMDB_ERRORS:
        if isinstance(exc, lmdb_class):
            return cls(f"{operation} failed on metadata store {path} ({exc}): "
                       + advice.format(limit=limit),
                       operation=operation, path=path, errno=code)
    raise AssertionError("lmdb.Error is the last row")      # pragma: no cover


@contextmanager
def _lmdb_errors(path: str, operation: str, limit: int = MAX_MAP_SIZE_BYTES
                 ) -> Iterator[None]:
    try:
        yield
    except lmdb.Error as exc:
        raise _translate(exc, path, operation, limit) from exc


# ---- the data file, checked before it is mapped ----------------------------------------

# LMDB 0.9 data file (format 1, 64-bit, little-endian): pages 0 and 1 are meta pages, the
# newer (higher txnid) one is current. Reading a page past the end of a truncated file
# through the map is SIGBUS, so the size is checked against the meta page first.
PAGE_HEADER_BYTES = 16
MAGIC_OFFSET = PAGE_HEADER_BYTES                  # u32 0xBEEFC0DE
VERSION_OFFSET = MAGIC_OFFSET + 4                 # u32 data format
ADDRESS_OFFSET = VERSION_OFFSET + 4               # u64 fixed map address (unused)
MAPSIZE_OFFSET = ADDRESS_OFFSET + 8               # u64 map size
PAGE_SIZE_OFFSET = MAPSIZE_OFFSET + 8             # u32: the free DB's md_pad is psize
DB_RECORD_BYTES = 48                              # MDB_db: 4+2+2 + 5*8
LAST_PAGE_OFFSET = PAGE_SIZE_OFFSET + 2 * DB_RECORD_BYTES    # u64 last used page
TXNID_OFFSET = LAST_PAGE_OFFSET + 8               # u64 transaction id
META_END = TXNID_OFFSET + 8
META_MAGIC = 0xBEEFC0DE
META_FORMAT = 1
PAGE_SIZES = frozenset(1 << n for n in range(9, 17))   # 512 B .. 64 KiB
_META = struct.Struct("<II8xQI")                  # magic, version, map size, psize
assert MAGIC_OFFSET + _META.size == PAGE_SIZE_OFFSET + 4
_TAIL = struct.Struct("<QQ")                      # last page, txnid
assert LAST_PAGE_OFFSET + _TAIL.size == META_END


def _read_meta(f: Any, position: int) -> tuple[int, int, int, int] | None:
    """(version, page size, last page, txnid) of the meta page at `position`, or None
    when it does not carry LMDB's magic."""
    f.seek(position)
    page = f.read(META_END)
    if len(page) < META_END:
        return None
    magic, version, _, psize = _META.unpack_from(page, MAGIC_OFFSET)
    last_page, txnid = _TAIL.unpack_from(page, LAST_PAGE_OFFSET)
    return (version, psize, last_page, txnid) if magic == META_MAGIC else None


def check_data_file(path: str) -> None:
    """Raise MetadataStoreError naming `<path>/data.mdb` when it is shorter than its own
    meta page says (mapping it would end in SIGBUS). A missing or empty file is a new
    store; a format this check does not know is left to LMDB."""
    data = os.path.join(path, "data.mdb")
    try:
        with open(data, "rb") as f:
            first = _read_meta(f, 0)
            if first is None or first[0] != META_FORMAT or first[1] not in PAGE_SIZES:
                size = os.fstat(f.fileno()).st_size
                if 0 < size < META_END:
                    raise _truncated(data, size, "shorter than one LMDB meta page")
                return                      # new, or not a format this check knows
            psize = first[1]
            second = _read_meta(f, psize)
            size = os.fstat(f.fileno()).st_size    # after the meta: data lands first
    except FileNotFoundError:
        return
    except OSError as exc:
        raise MetadataStoreError(f"cannot read {data}: {exc.strerror}", operation="open",
                                 path=data, errno=exc.errno) from exc
    metas = [m for m in (first, second) if m is not None and m[0] == META_FORMAT]
    version, psize, last_page, _ = max(metas, key=lambda m: m[3])
    needed = max(2, last_page + 1) * psize
    if size < needed:
        raise _truncated(data, size, f"its meta page records {needed} bytes of pages")


def _truncated(data: str, size: int, why: str) -> MetadataStoreError:
    return MetadataStoreError(
        f"{data} is truncated: {size} bytes, {why}; restore <root>/meta from a copy "
        "(mapping it would crash the process with SIGBUS)", operation="open", path=data)


# ---- one shared env per directory per process -------------------------------------------

_state = threading.Condition()              # guards everything below and the holds
_registry: dict[str, "_SharedEnv"] = {}      # realpath -> the process's env on it
_inherited: list[tuple[str, Any]] = []      # (realpath, env) from before a fork: kept
_forking: int | None = None                  # thread id of a thread about to fork


class _SharedEnv:
    """The process's one LMDB env on a directory, its sub-database handles and the
    transactions open on it (per thread). Repairs swap `env` under an exclusive hold."""

    def __init__(self, path: str, *, read_only: bool, map_size_bytes: int,
                 max_map_size_bytes: int) -> None:
        self.path = path
        self.key = os.path.realpath(path)
        self.read_only = read_only
        self.max_map_size_bytes = max_map_size_bytes
        self.refs = 0
        self.holders: dict[int, int] = {}         # thread id -> open transactions
        self.exclusive: int | None = None         # thread id making a repair
        self.waiting = 0                          # threads waiting to make one
        self.env: Any = None
        self.dbs: dict[str, Any] = {}
        self._open(map_size_bytes)

    # -- open / close --

    def _open(self, map_size_bytes: int) -> None:
        if any(key == self.key for key, _ in _inherited):
            raise MetadataStoreError(
                f"metadata store {self.path} was inside a transaction in the thread that "
                "forked this process, so its inherited LMDB handle cannot be closed safely "
                "and the store cannot be opened again here; fork outside metadata "
                "transactions", operation="open", path=self.path)
        check_data_file(self.path)
        with _lmdb_errors(self.path, "open", self.max_map_size_bytes):
            try:
                self.env = _open_lmdb(self.path, read_only=self.read_only,
                                      map_size_bytes=map_size_bytes)
            except OSError as exc:             # making the directory
                cls = MetadataDiskFullError if exc.errno in (errno.ENOSPC, errno.EDQUOT) \
                    else MetadataStoreError
                raise cls(f"cannot open metadata store {self.path}: {exc.strerror}",
                          operation="open", path=self.path, errno=exc.errno) from exc
            try:
                self.dbs = _open_databases(self.env, self.path, self.read_only)
            except BaseException:
                self.env.close()
                raise

    def close(self) -> None:
        self.env.close()

    # -- holds: many transactions, or one repair --

    def enter(self) -> Any:
        """Start a hold and return the env; no repair swaps it until `leave()`."""
        me = threading.get_ident()
        with _state:
            if not (self.exclusive is None and _forking is None):
                _state.wait_for(lambda: self.exclusive in (None, me)
                                and _forking in (None, me))
            self.holders[me] = self.holders.get(me, 0) + 1
            return self.env

    def leave(self) -> None:
        me = threading.get_ident()
        with _state:
            count = self.holders.pop(me) - 1
            if count:
                self.holders[me] = count
            elif self.waiting or _forking is not None:
                _state.notify_all()         # a repair or a fork waits for holds to end

    @contextmanager
    def hold(self) -> Iterator[Any]:
        env = self.enter()
        try:
            yield env
        finally:
            self.leave()

    def _busy_elsewhere(self, me: int) -> bool:
        return any(count for thread, count in self.holders.items() if thread != me)

    @contextmanager
    def exclusive_hold(self) -> Iterator[None]:
        """No other thread of this process has a transaction open on the env."""
        me = threading.get_ident()
        with _state:
            self.waiting += 1
            try:
                _state.wait_for(lambda: self.exclusive is None
                                and not self._busy_elsewhere(me))
            finally:
                self.waiting -= 1
            self.exclusive = me
            try:
                yield
            finally:
                self.exclusive = None
                _state.notify_all()

    # -- repairs: each returns False when retrying cannot help --

    def repair(self, exc: lmdb.Error, failed_env: Any, *, frees: bool) -> bool:
        with self.exclusive_hold():
            if self.env is not failed_env:
                return True                 # another thread repaired it already
            if isinstance(exc, lmdb.MapFullError):
                return self._grow(frees)
            if isinstance(exc, lmdb.MapResizedError):
                self.env.set_mapsize(0)     # adopt the size another process chose
                return True
            self._reopen(exc)
            return True

    def _grow(self, frees: bool) -> bool:
        limit = self.max_map_size_bytes * (2 if frees else 1)
        size = self._map_size()
        if size >= limit:
            return False
        new_size = min(size * 2, limit)
        log.info("metadata store %s is full at %d bytes; growing the map to %d",
                 self.path, size, new_size)
        self.env.set_mapsize(new_size)
        return True

    def _map_size(self) -> int:
        try:
            return self.env.info()["map_size"]
        except lmdb.Error:                  # a panicked env may refuse even this
            return MAP_SIZE_BYTES

    def _reopen(self, exc: lmdb.Error) -> None:
        size = self._map_size()
        log.warning("metadata store %s: %s; closing and reopening the environment",
                    self.path, exc)
        self.env.close()
        self._open(size)

    def make_writable(self) -> None:
        """A read-write MetaStore joined a read-only env: reopen it read-write."""
        with self.exclusive_hold():
            size = self._map_size()
            self.env.close()
            self.read_only = False
            try:
                self._open(size)
            except BaseException:
                self.read_only = True
                self._open(size)
                raise

    # -- fork --

    def detach_in_child(self) -> None:
        """After fork: close the inherited env unless a transaction was open on it (the
        forking thread's own), in which case keep it alive forever."""
        if self.holders:
            _inherited.append((self.key, self.env))
        else:
            self.env.close()


def _open_lmdb(path: str, *, read_only: bool, map_size_bytes: int) -> Any:
    options = dict(map_size=map_size_bytes, max_dbs=len(DATABASES) + 2,
                   max_readers=MAX_READERS, subdir=True)
    if not read_only:
        if not os.path.exists(os.path.join(path, "data.mdb")):
            _create_store(path, options)
        return lmdb.open(path, lock=True, **options)
    if not os.path.exists(os.path.join(path, "data.mdb")):
        raise MetadataStoreError(f"no metadata store at {path} to open read-only",
                                 operation="open", path=path, errno=errno.ENOENT)
    # Without a writable lock file (read-only filesystem, immutable file) LMDB cannot
    # take its reader lock; read lock-free, which is safe only with no live writer.
    lock_file = os.path.join(path, "lock.mdb")
    lock = os.access(lock_file, os.W_OK) if os.path.exists(lock_file) \
        else os.access(path, os.W_OK)
    if not lock:
        log.warning("metadata store %s: lock file not writable; reading without locks "
                    "(a process writing to it at the same time may be misread)", path)
    return lmdb.open(path, readonly=True, lock=lock, create=False, **options)


NEW_STORE_PREFIX = ".new-"                   # `<path>.new-<pid>-<random>`: a store being made


def _create_store(path: str, options: dict[str, Any]) -> None:
    """Make a new store so that it appears whole or not at all, whatever a power cut
    keeps: LMDB writes a new `data.mdb` page by page, and a cut before its first commit
    reached the disk left a one-page file that no open could read (docs/powercut.md).
    So the store is made beside `path` — created, every sub-database committed, synced —
    then renamed to `path`, and the parent directory synced. A directory left by a
    creator that died is removed at the next creation. Of two processes creating the
    store at once, the first rename wins and the other removes its own."""
    parent, base = os.path.split(os.path.abspath(path))
    _sweep_new_stores(parent, base)
    tmp = os.path.join(parent, f"{base}{NEW_STORE_PREFIX}{os.getpid()}-{os.urandom(4).hex()}")
    os.makedirs(tmp, mode=0o700)
    try:
        env = lmdb.open(tmp, lock=True, **options)
        try:
            _open_databases(env, tmp, False)      # the first commit, synced by LMDB
            env.sync(True)
        finally:
            env.close()
        for name in ("data.mdb", "lock.mdb"):
            fsync_path(os.path.join(tmp, name))
        fsync_path(tmp)
        try:
            os.rename(tmp, path)                  # onto nothing, or an empty directory
        except OSError as exc:
            if exc.errno not in (errno.EEXIST, errno.ENOTEMPTY):
                raise
            _remove_tree(tmp)                     # another process's store won
            return
        fsync_path(parent)
    except BaseException:
        _remove_tree(tmp)
        raise


def _sweep_new_stores(parent: str, base: str) -> None:
    """Remove stores whose creator is gone (`<base>.new-<pid>-...` of a dead pid)."""
    prefix = base + NEW_STORE_PREFIX
    try:
        names = [n for n in os.listdir(parent) if n.startswith(prefix)]
    except FileNotFoundError:
        return
    for name in names:
        try:
            pid = int(name[len(prefix):].split("-", 1)[0])
        except ValueError:
            continue
        if pid != os.getpid() and not _alive(pid):
            log.warning("metadata store %s: removing %s, a new store whose creator "
                        "stopped before it was complete", os.path.join(parent, base), name)
            _remove_tree(os.path.join(parent, name))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _remove_tree(path: str) -> None:
    import shutil
    shutil.rmtree(path, ignore_errors=True)


def _open_databases(env: Any, path: str, read_only: bool) -> dict[str, Any]:
    if not read_only:
        with env.begin(write=True) as txn:     # one commit (one fsync) for all of them
            return {name: env.open_db(name.encode(), txn=txn) for name in DATABASES}
    # A store written by an older logkit may lack a sub-database added since; a reader
    # cannot create it, so it is missing until someone uses it (`MetaStore.db` says so).
    dbs = {}
    for name in DATABASES:
        try:
            dbs[name] = env.open_db(name.encode(), create=False)
        except lmdb.NotFoundError:
            pass
    return dbs


def _acquire(path: str, *, read_only: bool, map_size_bytes: int,
             max_map_size_bytes: int) -> _SharedEnv:
    key = os.path.realpath(path)
    with _state:
        _state.wait_for(lambda: _forking in (None, threading.get_ident()))
        shared = _registry.get(key)
        if shared is None:
            shared = _SharedEnv(path, read_only=read_only, map_size_bytes=map_size_bytes,
                                max_map_size_bytes=max_map_size_bytes)
            _registry[key] = shared
        elif shared.read_only and not read_only:
            shared.make_writable()
        shared.refs += 1
        return shared


def _release(shared: _SharedEnv) -> None:
    with _state:
        shared.refs -= 1
        if shared.refs == 0:
            if _registry.get(shared.key) is shared:
                del _registry[shared.key]
            with shared.exclusive_hold():
                shared.close()


def _before_fork() -> None:
    """Hold new transactions off and wait for open ones in other threads to end, so the
    child inherits envs with no transaction open. `_state` stays held across the fork."""
    global _forking
    _state.acquire()
    me = threading.get_ident()
    _forking = me
    _state.wait_for(lambda: not any(s._busy_elsewhere(me) for s in _registry.values()))


def _after_fork_in_parent() -> None:
    global _forking
    _forking = None
    _state.notify_all()
    _state.release()


def _after_fork_in_child() -> None:
    global _state, _forking
    _state = threading.Condition()        # the parent's may be held by a lost thread
    _forking = None
    shared_envs = list(_registry.values())
    _registry.clear()
    for shared in shared_envs:
        shared.detach_in_child()


os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_in_parent)
at_fork_in_child(_after_fork_in_child)


# ---- values ------------------------------------------------------------------------------

def encode(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":"), sort_keys=True).encode()


def decode(raw: bytes) -> Any:
    return json.loads(raw)


def check_key(key: bytes) -> bytes:
    """Raise ConfigError for a key LMDB would refuse (BadValsizeError), before LMDB."""
    if not 0 < len(key) <= MAX_KEY_BYTES:
        raise ConfigError(f"metadata key {key[:64]!r}... is {len(key)} bytes; keys must be "
                          f"1..{MAX_KEY_BYTES} bytes (shorten the group id or name)")
    return key


# ---- the handle --------------------------------------------------------------------------

class MetaStore:
    """A handle on `<root>/meta`. `close()` is safe twice. With `read_only=True` the env
    is opened read-only and every write raises `ReadOnlyError`."""

    def __init__(self, path: str, *, read_only: bool = False,
                 map_size_bytes: int = MAP_SIZE_BYTES,
                 max_map_size_bytes: int = MAX_MAP_SIZE_BYTES) -> None:
        self.path = path
        self.read_only = read_only
        self._pid = owner_pid()
        self._shared = _acquire(path, read_only=read_only, map_size_bytes=map_size_bytes,
                                max_map_size_bytes=max(map_size_bytes, max_map_size_bytes))
        self._closed = False

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._pid == owner_pid():      # in a forked child the env is the parent's
            _release(self._shared)

    @property
    def env(self) -> Any:
        """The current LMDB env (replaced when a repair reopens it)."""
        return self._shared.env

    @property
    def closed(self) -> bool:
        return self._closed

    def _check(self, write: bool) -> None:
        if self._closed:
            raise ClosedError("metadata store is closed")
        check_owner(self._pid, f"metadata store {self.path}")
        if write and self.read_only:
            raise ReadOnlyError(f"metadata store {self.path} is open read-only")

    def db(self, name: str) -> Any:
        try:
            return self._shared.dbs[name]
        except KeyError:
            if name not in DATABASES:
                raise
            raise MetadataStoreError(
                f"metadata store {self.path} has no {name!r} sub-database (written by an "
                "older logkit); open it read-write once to add it",
                operation="open", path=self.path) from None

    # ---- transactions ----------------------------------------------------------------

    def read(self, body: Callable[[Any], T], *, operation: str = "read") -> T:
        """`body(txn)` in a read transaction; returns its result."""
        return self._run(body, write=False, operation=operation, frees=False)

    def write(self, body: Callable[[Any], T], *, operation: str = "write",
              frees: bool = False) -> T:
        """`body(txn)` in one write transaction, committed when it returns. At map full
        the map grows and `body` runs again, so it must not depend on a previous run.
        `frees=True` (a change that mostly deletes) may grow past the size limit."""
        return self._run(body, write=True, operation=operation, frees=frees)

    def _run(self, body: Callable[[Any], T], *, write: bool, operation: str,
             frees: bool) -> T:
        self._check(write)
        shared = self._shared
        reopened = False
        with _lmdb_errors(self.path, operation, shared.max_map_size_bytes):
            for repairs in range(MAX_REPAIRS + 1):
                env = shared.enter()
                try:
                    with env.begin(write=write) as txn:
                        return body(txn)
                except _REPAIRABLE as exc:
                    failure = exc
                finally:
                    shared.leave()
                panic = isinstance(failure, lmdb.PanicError)
                if (panic and reopened) or repairs == MAX_REPAIRS \
                        or not shared.repair(failure, env, frees=frees):
                    raise failure
                reopened = reopened or panic
        raise AssertionError("the loop returns or raises")      # pragma: no cover

    @contextmanager
    def transaction(self, *, write: bool = False,
                    operation: str = "transaction") -> Iterator[Any]:
        """`with store.transaction(write=True) as txn:` one LMDB transaction, committed
        at the end of the block. LMDB errors become MetadataStoreError; a repairable one
        is repaired first, so calling again works (the block is not re-run)."""
        self._check(write)
        shared = self._shared
        with _lmdb_errors(self.path, operation, shared.max_map_size_bytes):
            env = None
            try:
                with shared.hold() as env, env.begin(write=write) as txn:
                    yield txn
            except _REPAIRABLE as exc:
                if env is not None:
                    shared.repair(exc, env, frees=True)
                raise

    def begin(self, *, write: bool = False) -> Any:
        """The older name of `transaction()`, kept for callers written against it."""
        return self.transaction(write=write)

    def put(self, txn: Any, db: str, key: bytes, value: Any) -> None:
        """Store `value` as JSON under `key`, both checked against their limits first."""
        raw = encode(value)
        if len(raw) > MAX_VALUE_BYTES:
            raise MetadataStoreError(
                f"a {len(raw)}-byte value for {key[:64]!r} in {db!r} exceeds the "
                f"{MAX_VALUE_BYTES}-byte limit of metadata store {self.path}",
                operation="put", path=self.path)
        txn.put(check_key(key), raw, db=self.db(db))

    # ---- topics ----------------------------------------------------------------------

    def create_topic(self, name: str, record: dict[str, Any],
                     before_commit: Any = None) -> None:
        """Store a topic record; raises TopicExistsError. `before_commit` runs inside the
        write transaction (it creates the partition directories; it may run twice)."""
        key = check_key(name.encode())

        def create(txn: Any) -> None:
            if txn.get(key, db=self.db("topics")) is not None:
                raise TopicExistsError(f"topic {name!r} already exists")
            if before_commit is not None:
                before_commit()
            self.put(txn, "topics", key, record)

        self.write(create, operation=f"create topic {name!r}")

    def grow_topic(self, name: str, topic_id: str, partitions: int, *,
                   before_commit: Callable[[int], None] | None = None,
                   in_transaction: Callable[[Any], None] | None = None) -> int:
        """Raise topic `name`'s partition count to `partitions` in one write
        transaction; returns the count it had. `before_commit(old_count)` runs inside
        the transaction before the record changes (it makes the new partition
        directories; it may run twice), `in_transaction(txn)` after the record is put
        (the groups that subscribe to the topic rebalance in the same commit).

        UnknownTopicError when no topic `name` with `topic_id` exists (deleted, or
        deleted and re-created, meanwhile); ConfigError when `partitions` is not above
        the stored count (a racing grower got there first): nothing is written."""
        key = check_key(name.encode())

        def grow(txn: Any) -> int:
            raw = txn.get(key, db=self.db("topics"))
            record = None if raw is None else decode(raw)
            if record is None or record["topic_id"] != topic_id or record.get("deleting"):
                raise UnknownTopicError(f"topic {name!r} does not exist (deleted while "
                                        "its partitions were being added)")
            old = record["partitions"]
            if partitions <= old:
                raise ConfigError(f"topic {name!r} has {old} partition(s); the new total "
                                  f"must be larger, got {partitions} (Kafka's "
                                  "INVALID_PARTITIONS: partitions are added, never removed)")
            if before_commit is not None:
                before_commit(old)
            record["partitions"] = partitions
            self.put(txn, "topics", key, record)
            if in_transaction is not None:
                in_transaction(txn)
            return old

        return self.write(grow, operation=f"add partitions to topic {name!r}")

    def mark_topic_deleting(self, name: str, topic_id: str) -> bool:
        """Deletion's first step: flag topic `name`'s record (if it is still the
        incarnation `topic_id`) `deleting`, in one committed transaction. From then on
        `topic_names()` leaves it out and the broker treats it as gone, finishing the
        deletion wherever it next meets it. Returns False when no such record exists."""
        key = check_key(name.encode())

        def mark(txn: Any) -> bool:
            raw = txn.get(key, db=self.db("topics"))
            record = None if raw is None else decode(raw)
            if record is None or record["topic_id"] != topic_id:
                return False
            if not record.get("deleting"):
                record["deleting"] = True
                self.put(txn, "topics", key, record)
            return True

        return self.write(mark, operation=f"mark topic {name!r} deleting")

    def get_topic(self, name: str) -> dict[str, Any] | None:
        """Topic `name`'s record, or None; a record whose deletion has begun has
        `"deleting": true` (callers treat it as gone, see `mark_topic_deleting`)."""
        key = check_key(name.encode())
        raw = self.read(lambda txn: txn.get(key, db=self.db("topics")),
                        operation=f"read topic {name!r}")
        return None if raw is None else decode(raw)

    def delete_topic(self, name: str, topic_id: str | None = None) -> dict[str, Any]:
        """Remove topic `name`'s record (only the incarnation `topic_id`, when given)
        and its committed offsets; UnknownTopicError when there is none."""
        key = check_key(name.encode())

        def delete(txn: Any) -> bytes:
            raw = txn.get(key, db=self.db("topics"))
            if raw is None or (topic_id is not None
                               and decode(raw)["topic_id"] != topic_id):
                raise UnknownTopicError(f"topic {name!r} does not exist")
            txn.delete(key, db=self.db("topics"))
            # Committed offsets of the deleted topic go with it, in the same transaction,
            # as Kafka's group coordinator drops them: a re-created topic starts clean.
            part = b"\0" + key + b"\0"
            doomed = [k for k, _ in txn.cursor(db=self.db("offsets")) if part in k]
            for k in doomed:
                txn.delete(k, db=self.db("offsets"))
            return raw

        return decode(self.write(delete, operation=f"delete topic {name!r}", frees=True))

    def topic_names(self) -> list[str]:
        """The live topics: every record but those whose deletion has begun."""
        return [name for name, record in self.topic_records()
                if not record.get("deleting")]

    def topic_records(self) -> list[tuple[str, dict[str, Any]]]:
        """(name, record) of every topic record, deletions under way included, read in
        one transaction."""
        return [(key.decode(), record) for key, record in self.items("topics")]

    def items(self, db: str, prefix: bytes = b"") -> list[tuple[bytes, Any]]:
        """(key, decoded value) pairs of a sub-database whose keys start with prefix,
        read in one transaction (none is held open while the caller iterates)."""
        if prefix:
            check_key(prefix)

        def scan(txn: Any) -> list[tuple[bytes, bytes]]:
            cursor = txn.cursor(db=self.db(db))
            out: list[tuple[bytes, bytes]] = []
            if cursor.set_range(prefix):
                for key, raw in cursor:
                    if not key.startswith(prefix):
                        break
                    out.append((key, raw))
            return out

        return [(key, decode(raw)) for key, raw in self.read(scan, operation=f"scan {db}")]
