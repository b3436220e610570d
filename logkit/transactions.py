"""The transaction coordinator: Kafka's TransactionCoordinator over the broker's LMDB.

Owns: the `txn` sub-database (transactional id -> its transaction metadata) and the
`producer_ids` sub-database (the next free producer id), and the state machine that
moves a transaction from `Ongoing` through `PrepareCommit`/`PrepareAbort` to
`CompleteCommit`/`CompleteAbort` (KIP-98, KIP-447). One coordinator object per Broker
(`broker.transaction_coordinator`): the embedded producer and the Kafka listener call
the same one, so there is one namespace of transactional ids.

A record (JSON, one per transactional id):

| field        | meaning                                                              |
|--------------|----------------------------------------------------------------------|
| producer_id  | the id the transactional id holds now                                |
| epoch        | its epoch; a call with an older one is fenced                        |
| prev_id      | the id it held before an epoch overflow (-1: none)                    |
| state        | one of STATES (Kafka's names)                                        |
| partitions   | [[topic, partition], ...] of the open transaction                    |
| offsets      | {group: [[topic, partition, offset, metadata], ...]}: pending offsets |
| groups       | groups added with add_offsets                                        |
| timeout_ms   | transaction.timeout.ms of the producer                               |
| start_ms     | when the open transaction began (-1: none open)                      |
| update_ms    | last change                                                          |

Two-phase commit. `end_txn` writes `PrepareCommit` (or `PrepareAbort`) durably with the
partitions and pending offsets, then has `write_markers` append a COMMIT (ABORT) control
batch to every partition of the transaction, then — in one LMDB write transaction —
moves the pending offsets into the groups' committed offsets (commit only) and writes
`CompleteCommit` (`CompleteAbort`). A crash between the two writes leaves `Prepare*`,
which `complete_prepared()` (run by every writable Broker at open) finishes the same way:
a marker is a no-op on a partition where the producer has no open transaction
(`Partition.append_control`), so writing them again writes each once.

Power loss: two syncs (`sync`, the broker's `_sync_partitions`), whatever the topics'
flush policy. Before `PrepareCommit`, the transaction's partitions: its records are
durable before the decision (else a cut after it could keep some partitions' records
and lose others', and the markers would commit a part). Before the `Complete*` write,
every partition that got a marker and every partition the pending offsets name. That
is what makes the crash argument hold for a power cut too: LMDB syncs each commit, so
a cut before `Complete*` is durable leaves `Prepare*` (the next open writes the
markers again: a marker is durable or rewritten), and a cut after it finds each
marker on disk. Without the sync a cut could keep `Complete*` and the
records (written back by the kernel) but not the marker: nothing would write it again,
the partition's last stable offset would stay below those records for ever, and the
producer's next marker would end both transactions as one. An embedded
`commit_transaction()` that returned is therefore durable against power loss; a
`wait=False` end is durable once its completion has run.

Answering before the markers (Kafka's order): `end_txn(..., wait=False)` — the Kafka
listener's EndTxn — returns once `PrepareX` is durable and leaves the markers, offsets
and `CompleteX` to the coordinator's completion thread (one per coordinator, started on
first use, stopped by `close()`; it completes in the order the ends were asked, each
under the stripe lock as below). Until then the id is `Prepare*`: its next
AddPartitions/AddOffsets/InitProducerId completes it itself under the lock
(`_with_prepared_done`) or waits on the lock while the thread does, so the client never
sees an error for it; `completing(producer_id)` tells the produce path that a
producer's transaction is ending though its markers are not written yet. A failed
background completion is logged and leaves `Prepare*`, which the next call for the id,
the broker's expiry thread or the next open finishes. `close()` waits up to
`close_timeout_s` for the queued completions; those it does not wait for stay
`Prepare*` (finished at the next open). `before_complete(transactional_id)`, when set,
is called by the thread under the stripe lock before each completion (a test hook:
holding it holds the markers back, as a slow disk would; raising is a failed
completion).

Locking: the steps from `Prepare*` to `Complete*` of one transactional id run under a
stripe lock — a thread lock and, with `lock_path`, a POSIX record lock on one byte of
that file — so no process completes a transaction another live process is completing
(a late marker of a finished transaction would end the producer's next one). The lock
of a killed process is released by the kernel; its `Prepare*` is then finished by the
next open or by the next call for that id. No LMDB transaction is ever open while a
stripe lock is awaited.

Fencing: `init_producer_id` with a transactional id bumps the epoch (a new producer id
when the epoch would overflow), first aborting an open transaction with the bumped
epoch, so the log refuses the old producer's later batches. A call with an older epoch
raises `ProducerFencedError`. `abort_expired` aborts an `Ongoing` transaction older than
its timeout the same way (the epoch is bumped: the slow producer is fenced).

Thread-safety: any thread, any process; every state change is one LMDB write
transaction that re-reads the record first.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import queue
import threading
import time
import zlib
from contextlib import contextmanager
from typing import Any, Callable, Iterable, Iterator, Mapping, NamedTuple

from ._fork import at_fork_in_child
from ._threads import start_thread
from .errors import (ClosedError, ConcurrentTransactionsError, ConfigError,
                     InvalidProducerIdMappingError, InvalidTransactionTimeoutError,
                     InvalidTxnStateError, LogkitError, LogkitTimeoutError,
                     ProducerFencedError, TransactionalIdNotFoundError, storage_error)
from .group import check_transactional_member, offset_key, validate_group_id
from .meta import MAX_KEY_BYTES, MetaStore, decode
from .topic import TopicPartition

__all__ = ["TransactionCoordinator", "TxnListing", "TxnDescription", "STATES",
           "MAX_TRANSACTION_TIMEOUT_MS", "EXPIRY_CHECK_INTERVAL_S"]

log = logging.getLogger(__name__)

EMPTY, ONGOING = "Empty", "Ongoing"
PREPARE_COMMIT, PREPARE_ABORT = "PrepareCommit", "PrepareAbort"
COMPLETE_COMMIT, COMPLETE_ABORT = "CompleteCommit", "CompleteAbort"
PREPARE_EPOCH_FENCE, DEAD = "PrepareEpochFence", "Dead"

# Kafka's state machine: state -> the states it may be entered from.
STATES: dict[str, frozenset[str]] = {
    EMPTY: frozenset({EMPTY, COMPLETE_COMMIT, COMPLETE_ABORT}),
    ONGOING: frozenset({EMPTY, ONGOING, COMPLETE_COMMIT, COMPLETE_ABORT}),
    PREPARE_COMMIT: frozenset({ONGOING}),
    PREPARE_ABORT: frozenset({ONGOING, PREPARE_EPOCH_FENCE}),
    COMPLETE_COMMIT: frozenset({PREPARE_COMMIT}),
    COMPLETE_ABORT: frozenset({PREPARE_ABORT}),
    PREPARE_EPOCH_FENCE: frozenset({ONGOING}),
    DEAD: frozenset({EMPTY, COMPLETE_COMMIT, COMPLETE_ABORT}),
}
PREPARED = {PREPARE_COMMIT: True, PREPARE_ABORT: False}       # state -> commit?
COMPLETED = {True: COMPLETE_COMMIT, False: COMPLETE_ABORT}
READY = frozenset({EMPTY, COMPLETE_COMMIT, COMPLETE_ABORT})    # no transaction open

MAX_EPOCH = 32767                       # an epoch is an int16
EPOCH_OVERFLOW = MAX_EPOCH - 1          # at this epoch a new producer id is taken (Kafka)
MAX_TRANSACTION_TIMEOUT_MS = 900000     # Kafka's transaction.max.timeout.ms default
EXPIRY_CHECK_INTERVAL_S = 1.0           # the broker's thread looks this often
PRODUCER_ID_BLOCK = 64                  # ids an idempotent producer's process reserves
LOCK_STRIPES = 256                      # bytes of the lock file, one per stripe
LOCK_TIMEOUT_S = 30.0                   # a stripe held longer is a stalled process
_LOCK_POLL_S = 0.001
CLOSE_TIMEOUT_S = 10.0                  # close() waits this long for queued completions
_NEXT_ID = b"next"                      # producer_ids: the next id nobody holds


class TxnListing(NamedTuple):
    """One row of `list_transactions` (Kafka's ListTransactions)."""

    transactional_id: str
    producer_id: int
    state: str


class TxnDescription(NamedTuple):
    """`describe_transactions` (Kafka's DescribeTransactions)."""

    transactional_id: str
    state: str
    producer_id: int
    producer_epoch: int
    transaction_timeout_ms: int
    transaction_start_ms: int
    partitions: list[TopicPartition]


def _now_ms() -> int:
    return int(time.time() * 1000)


def _key(transactional_id: Any) -> bytes:
    if not isinstance(transactional_id, str) or not transactional_id:
        raise ConfigError(f"a transactional id must be a non-empty str, got "
                          f"{transactional_id!r}")
    key = transactional_id.encode("utf-8", "surrogatepass")
    if len(key) > MAX_KEY_BYTES:
        raise ConfigError(f"transactional id {transactional_id[:40]!r}... is {len(key)} "
                          f"bytes; the limit is {MAX_KEY_BYTES}")
    return key


def _tps(pairs: Iterable[Any]) -> list[TopicPartition]:
    return [TopicPartition(t, int(p)) for t, p in pairs]


class _StripeLock:
    """One lock per stripe of transactional ids, across the threads of this process
    (a thread lock) and across processes (a POSIX record lock on one byte of
    `path`; a killed holder's lock goes with its process). POSIX record locks belong
    to the process, and closing any descriptor of the file drops them all, so a
    process has one `_StripeLock` per lock file, shared by every coordinator on that
    root (`_shared_lock`)."""

    def __init__(self, path: str | None) -> None:
        self._path = path
        self._fd: int | None = None
        self._threads = [threading.Lock() for _ in range(LOCK_STRIPES)]
        self._pid = os.getpid()
        self.users = 0

    def _file(self) -> int | None:
        if self._path is None:
            return None
        if self._fd is None or self._pid != os.getpid():
            try:
                self._fd = os.open(self._path, os.O_RDWR | os.O_CREAT, 0o600)
            except OSError as exc:
                raise storage_error(exc, "open the transaction lock", self._path) from exc
            self._pid = os.getpid()
        return self._fd

    @contextmanager
    def hold(self, key: bytes, timeout_s: float = LOCK_TIMEOUT_S) -> Iterator[None]:
        stripe = zlib.crc32(key) % LOCK_STRIPES
        thread_lock = self._threads[stripe]
        if not thread_lock.acquire(timeout=timeout_s):
            raise LogkitTimeoutError(f"the transaction lock of {key[:40]!r} was not free "
                                     f"within {timeout_s} s")
        try:
            fd = self._file()
            if fd is not None:
                self._lock_byte(fd, stripe, key, time.monotonic() + timeout_s)
            try:
                yield
            finally:
                if fd is not None:
                    fcntl.lockf(fd, fcntl.LOCK_UN, 1, stripe)
        finally:
            thread_lock.release()

    @staticmethod
    def _lock_byte(fd: int, stripe: int, key: bytes, deadline: float) -> None:
        while True:
            try:
                fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, stripe)
                return
            except BlockingIOError:
                pass
            except OSError as exc:
                if exc.errno not in (errno.EAGAIN, errno.EACCES):   # not "held"
                    raise storage_error(exc, "lock a transaction") from exc
            if time.monotonic() >= deadline:
                raise LogkitTimeoutError(f"another process held the transaction lock of "
                                         f"{key[:40]!r} for {LOCK_TIMEOUT_S} s")
            time.sleep(_LOCK_POLL_S)

    def close(self) -> None:
        if self._fd is not None and self._pid == os.getpid():
            os.close(self._fd)
        self._fd = None


_shared_locks: dict[str, _StripeLock] = {}
_shared_guard = threading.Lock()


def _forget_locks_in_child() -> None:
    """After fork: the parent's locks are not the child's (its record locks are not
    inherited, its thread locks may be held by a thread the child does not have)."""
    global _shared_guard
    _shared_guard = threading.Lock()
    _shared_locks.clear()


at_fork_in_child(_forget_locks_in_child)


def _shared_lock(path: str | None) -> _StripeLock:
    """The process's stripe lock on `path` (a private one without a path)."""
    if path is None:
        return _StripeLock(None)
    key = os.path.realpath(path)
    with _shared_guard:
        lock = _shared_locks.get(key)
        if lock is None:
            lock = _shared_locks[key] = _StripeLock(path)
        lock.users += 1
        return lock


def _release_lock(lock: _StripeLock) -> None:
    with _shared_guard:
        lock.users -= 1
        if lock.users <= 0 and lock._path is not None:
            _shared_locks.pop(os.path.realpath(lock._path), None)
            lock.close()


class TransactionCoordinator:
    """Transaction state in LMDB, and the calls of Kafka's transaction APIs (see the
    module docstring). `write_markers(partitions, producer_id, epoch, commit)` appends
    one control batch to each partition (the broker's); `sync(partitions)` makes the
    partitions a commit's offsets name durable before the offsets are (optional).
    `before_complete(transactional_id)` is the completion thread's test hook (module
    docstring)."""

    def __init__(self, meta: MetaStore, write_markers: Callable[..., Any], *,
                 lock_path: str | None = None,
                 sync: Callable[[list[TopicPartition]], None] | None = None,
                 max_timeout_ms: int = MAX_TRANSACTION_TIMEOUT_MS,
                 offset_metadata_max_bytes: int = 4096,
                 before_complete: Callable[[str], None] | None = None) -> None:
        self.meta = meta
        self._write_markers = write_markers
        self._sync = sync
        self._lock = _shared_lock(lock_path)
        self._closed = False
        self.max_timeout_ms = max_timeout_ms
        self.offset_metadata_max_bytes = offset_metadata_max_bytes
        self._ids_lock = threading.Lock()
        self._ids: list[int] = []                   # reserved, not yet handed out
        self.before_complete = before_complete
        self.close_timeout_s = CLOSE_TIMEOUT_S
        self._worker_lock = threading.Lock()        # guards the fields below
        self._worker: threading.Thread | None = None
        self._worker_pid = -1
        self._queue: queue.SimpleQueue[tuple[bytes, int] | None] = queue.SimpleQueue()
        self._completing: dict[int, int] = {}       # producer id -> completions queued
        self._abandoned = False                     # close() stopped waiting for them
        self._worker_done = False                   # the thread took the last item

    def close(self) -> None:
        """Finish the queued completions (waiting up to `close_timeout_s`; the rest stay
        `Prepare*` for the next open) and let go of the lock file (safe twice)."""
        with self._worker_lock:
            if self._closed:
                return
            self._closed = True
            worker = self._worker if self._worker_pid == os.getpid() else None
            if worker is not None:
                self._queue.put(None)
        if worker is not None and worker is not threading.current_thread():
            worker.join(self.close_timeout_s)
            with self._worker_lock:
                if not self._worker_done:
                    # the thread lets go of the lock file when it ends: it may be
                    # holding a stripe of it now
                    self._abandoned = True
                    log.warning("%d transaction completion(s) still queued at close: "
                                "they stay Prepare* until the next open",
                                sum(self._completing.values()))
                    return
        _release_lock(self._lock)

    # ---- the completion thread ---------------------------------------------------------

    def completing(self, producer_id: int) -> bool:
        """Whether an end of `producer_id`'s transaction was answered and its
        completion is still queued in this process (its markers may be missing)."""
        return producer_id in self._completing

    def _complete_later(self, key: bytes, producer_id: int) -> None:
        with self._worker_lock:
            if self._closed:
                raise ClosedError("the transaction coordinator is closed")
            if self._worker_pid != os.getpid():     # first use, or a forked child
                self._queue = queue.SimpleQueue()
                self._completing = {}
                self._abandoned = self._worker_done = False
                worker = threading.Thread(target=self._run_completions,
                                          name="logkit-txn-complete", daemon=True)
                start_thread(worker, "the transaction coordinator's completion thread")
                self._worker, self._worker_pid = worker, os.getpid()
            self._completing[producer_id] = self._completing.get(producer_id, 0) + 1
            self._queue.put((key, producer_id))

    def _run_completions(self) -> None:
        """The completion thread: each queued `Prepare*` in turn, under its stripe lock.
        A failure is logged; the record stays `Prepare*` for the next call or open."""
        work = self._queue
        while (item := work.get()) is not None:
            key, producer_id = item
            try:
                with self._lock.hold(key):
                    if self.before_complete is not None and not self._abandoned:
                        self.before_complete(key.decode("utf-8", "surrogatepass"))
                    with self._worker_lock:
                        abandoned = self._abandoned   # close() gave up: touch nothing
                    if not abandoned:
                        self._complete_if_prepared(key)
            except (LogkitError, OSError) as exc:
                log.warning("completing transaction %r in the background failed; it "
                            "stays prepared until the next call for it or the next "
                            "open: %s", key[:40], exc)
            except Exception:                       # a bug: say so, keep completing
                log.exception("completing transaction %r in the background failed",
                              key[:40])
            finally:
                with self._worker_lock:
                    left = self._completing.get(producer_id, 0) - 1
                    if left > 0:
                        self._completing[producer_id] = left
                    else:
                        self._completing.pop(producer_id, None)
        with self._worker_lock:
            self._worker_done = True
            if self._abandoned:
                _release_lock(self._lock)

    # ---- records -----------------------------------------------------------------------

    def _load(self, txn: Any, key: bytes) -> dict[str, Any] | None:
        raw = txn.get(key, db=self.meta.db("txn"))
        return None if raw is None else decode(raw)

    def _store(self, txn: Any, key: bytes, record: dict[str, Any], state: str) -> None:
        assert record["state"] in STATES[state] or record["state"] == state, \
            f"{record['state']} -> {state} is not a transition of Kafka's state machine"
        record["state"] = state
        record["update_ms"] = _now_ms()
        self.meta.put(txn, "txn", key, record)

    def _read(self, key: bytes) -> dict[str, Any] | None:
        return self.meta.read(lambda txn: self._load(txn, key),
                              operation=f"read transaction {key[:40]!r}")

    def _write(self, key: bytes, body: Callable[[Any], Any], what: str) -> Any:
        return self.meta.write(body, operation=f"{what} of transaction {key[:40]!r}")

    @staticmethod
    def _check_producer(record: dict[str, Any], tid: str, producer_id: int,
                        epoch: int) -> None:
        if producer_id != record["producer_id"]:
            if producer_id == record.get("prev_id", -1):
                raise ProducerFencedError(
                    f"producer {producer_id} of transactional id {tid!r} was fenced: the "
                    f"id is held by producer {record['producer_id']} now")
            raise InvalidProducerIdMappingError(
                f"transactional id {tid!r} is held by producer {record['producer_id']}, "
                f"not {producer_id}")
        if epoch != record["epoch"]:
            raise ProducerFencedError(
                f"producer {producer_id} epoch {epoch} of transactional id {tid!r} was "
                f"fenced by epoch {record['epoch']} (another producer called "
                "init_transactions() with this id, or the transaction timed out)")

    def _existing(self, txn: Any, key: bytes, tid: str) -> dict[str, Any]:
        record = self._load(txn, key)
        if record is None or record["state"] == DEAD:
            raise TransactionalIdNotFoundError(f"no transaction state for transactional "
                                               f"id {tid!r}: call init_producer_id first")
        return record

    # ---- producer ids ------------------------------------------------------------------

    def _take_ids(self, txn: Any, count: int) -> int:
        db = self.meta.db("producer_ids")
        raw = txn.get(_NEXT_ID, db=db)
        first = 0 if raw is None else int(decode(raw))
        self.meta.put(txn, "producer_ids", _NEXT_ID, first + count)
        return first

    def _fresh_producer_id(self) -> int:
        """A producer id no one has held, from a block this process reserved."""
        with self._ids_lock:
            if not self._ids:
                first = self.meta.write(lambda txn: self._take_ids(txn, PRODUCER_ID_BLOCK),
                                        operation="reserve producer ids")
                self._ids = list(range(first + PRODUCER_ID_BLOCK - 1, first - 1, -1))
            return self._ids.pop()

    # ---- the API -----------------------------------------------------------------------

    def init_producer_id(self, transactional_id: str | None,
                         transaction_timeout_ms: int = 60000, producer_id: int = -1,
                         producer_epoch: int = -1) -> tuple[int, int]:
        """(producer id, epoch) for a producer. Without a transactional id: a fresh id,
        epoch 0 (an idempotent producer). With one: the id's epoch bumped (a new id when
        it would overflow), after aborting its open transaction, so every older
        producer of that id is fenced. `producer_id`/`producer_epoch` (KIP-360: a
        client re-initialising) must be the current ones, else ProducerFencedError."""
        if transactional_id is None:
            return self._fresh_producer_id(), 0
        key = _key(transactional_id)
        timeout = transaction_timeout_ms
        if isinstance(timeout, bool) or not isinstance(timeout, int) \
                or not 0 < timeout <= self.max_timeout_ms:
            raise InvalidTransactionTimeoutError(
                f"transaction_timeout_ms must be in 1..{self.max_timeout_ms} "
                f"(transaction.max.timeout.ms), got {timeout!r}")
        for _ in range(3):                  # fence-abort, then bump: at most twice round
            with self._lock.hold(key):
                self._complete_if_prepared(key)
                outcome = self._write(key, lambda txn: self._init(
                    txn, key, transactional_id, timeout, producer_id, producer_epoch),
                    "init producer id")
                if outcome is None:                       # an open transaction aborted
                    self._complete_if_prepared(key)
                    continue
                return outcome
        raise AssertionError("the fence abort completes within the lock")  # pragma: no cover

    def _init(self, txn: Any, key: bytes, tid: str, timeout_ms: int, producer_id: int,
              producer_epoch: int) -> tuple[int, int] | None:
        record = self._load(txn, key)
        if record is None or record["state"] == DEAD:
            pid = self._take_ids(txn, 1)
            record = {"producer_id": pid, "epoch": -1, "prev_id": -1, "state": EMPTY,
                      "partitions": [], "offsets": {}, "groups": [], "start_ms": -1,
                      "timeout_ms": timeout_ms}
        elif producer_id >= 0:
            self._check_producer(record, tid, producer_id, producer_epoch)
        if record["state"] == ONGOING:
            self._fence(txn, key, record, reason=f"init_producer_id of {tid!r}")
            return None                 # the caller completes the abort, then asks again
        if record["state"] not in READY:     # Prepare*: completed by the caller first
            raise ConcurrentTransactionsError(f"transaction {tid!r} is {record['state']}")
        if record["epoch"] + 1 >= EPOCH_OVERFLOW:
            record["prev_id"] = record["producer_id"]
            record["producer_id"] = self._take_ids(txn, 1)
            record["epoch"] = 0
        else:
            record["epoch"] += 1
        record.update(partitions=[], offsets={}, groups=[], start_ms=-1,
                      timeout_ms=timeout_ms)
        self._store(txn, key, record, EMPTY)
        return record["producer_id"], record["epoch"]

    def _fence(self, txn: Any, key: bytes, record: dict[str, Any], reason: str) -> None:
        """Abort `record`'s open transaction with the epoch bumped (Kafka's
        PrepareEpochFence, then PrepareAbort): the markers carry the new epoch, so the
        log refuses the old producer's later batches."""
        self._store(txn, key, record, PREPARE_EPOCH_FENCE)
        record["epoch"] += 1
        self._store(txn, key, record, PREPARE_ABORT)
        log.info("transaction %r of producer %d aborted (%s); epoch now %d",
                 key.decode(errors="replace"), record["producer_id"], reason,
                 record["epoch"])

    def add_partitions(self, transactional_id: str, producer_id: int, epoch: int,
                       partitions: Iterable[TopicPartition], *,
                       verify_only: bool = False) -> set[TopicPartition]:
        """Add `partitions` to the open transaction (beginning one when none is open).
        `verify_only` (KIP-890's verification) changes nothing and returns the
        partitions that are NOT in an open transaction of this producer; otherwise
        returns an empty set."""
        key = _key(transactional_id)
        wanted = [TopicPartition(tp[0], int(tp[1])) for tp in partitions]
        if verify_only:
            record = self._read(key)
            if record is None or record["producer_id"] != producer_id \
                    or record["epoch"] != epoch or record["state"] != ONGOING:
                return set(wanted)
            return set(wanted) - set(_tps(record["partitions"]))

        def add(txn: Any) -> None:
            record = self._open(txn, key, transactional_id, producer_id, epoch)
            have = {tuple(p) for p in record["partitions"]}
            record["partitions"] += [list(tp) for tp in wanted if tuple(tp) not in have]
            self._store(txn, key, record, ONGOING)

        self._with_prepared_done(key, lambda: self._write(key, add, "add partitions"))
        return set()

    def _open(self, txn: Any, key: bytes, tid: str, producer_id: int,
              epoch: int) -> dict[str, Any]:
        """The record, checked, with a transaction open (begun now if none was)."""
        record = self._existing(txn, key, tid)
        self._check_producer(record, tid, producer_id, epoch)
        state = record["state"]
        if state in READY:
            record.update(partitions=[], offsets={}, groups=[], start_ms=_now_ms())
        elif state != ONGOING:
            raise ConcurrentTransactionsError(
                f"transaction {tid!r} is {state}: its previous transaction is being "
                "completed")
        return record

    def _with_prepared_done(self, key: bytes, call: Callable[[], Any]) -> Any:
        """`call()`, and once more after completing a `Prepare*` left by a crash."""
        try:
            return call()
        except ConcurrentTransactionsError:
            with self._lock.hold(key):
                self._complete_if_prepared(key)
            return call()

    def add_offsets(self, transactional_id: str, producer_id: int, epoch: int,
                    group_id: str) -> None:
        """Make the group's offsets part of the transaction (Kafka's AddOffsetsToTxn)."""
        key = _key(transactional_id)
        validate_group_id(group_id)

        def add(txn: Any) -> None:
            record = self._open(txn, key, transactional_id, producer_id, epoch)
            if group_id not in record["groups"]:
                record["groups"].append(group_id)
            self._store(txn, key, record, ONGOING)

        self._with_prepared_done(key, lambda: self._write(key, add, "add offsets"))

    def txn_offset_commit(self, transactional_id: str, producer_id: int, epoch: int,
                          group_id: str,
                          offsets: Mapping[TopicPartition, tuple[int, str | None]], *,
                          generation_id: int = -1, member_id: str = "",
                          group_instance_id: str | None = None) -> None:
        """Pending offsets of the group, committed with the transaction (Kafka's
        TxnOffsetCommit). With a member id or generation (KIP-447) they must be the
        group's current ones, else CommitFailedError. The transaction must be open
        (InvalidTxnStateError)."""
        key = _key(transactional_id)
        validate_group_id(group_id)
        entries = []
        for tp, value in offsets.items():
            offset, metadata = (value, "") if isinstance(value, int) else value
            metadata = metadata or ""
            if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
                raise ConfigError(f"offset for {tp[0]}-{tp[1]} must be an int >= 0, got "
                                  f"{offset!r}")
            if len(metadata.encode("utf-8", "surrogatepass")) > \
                    self.offset_metadata_max_bytes:
                raise ConfigError(f"commit metadata for {tp[0]}-{tp[1]} exceeds "
                                  f"offset.metadata.max.bytes="
                                  f"{self.offset_metadata_max_bytes}")
            entries.append([tp[0], int(tp[1]), offset, metadata])

        def commit(txn: Any) -> None:
            record = self._existing(txn, key, transactional_id)
            self._check_producer(record, transactional_id, producer_id, epoch)
            if record["state"] != ONGOING:
                raise InvalidTxnStateError(
                    f"transaction {transactional_id!r} is {record['state']}: offsets are "
                    "sent inside a transaction (add_offsets first)")
            check_transactional_member(self.meta, txn, group_id, generation_id,
                                       member_id, group_instance_id)
            if group_id not in record["groups"]:
                record["groups"].append(group_id)
            pending = {(t, p): [t, p, o, m]
                       for t, p, o, m in record["offsets"].get(group_id, [])}
            for t, p, o, m in entries:
                pending[(t, p)] = [t, p, o, m]
            record["offsets"][group_id] = list(pending.values())
            self._store(txn, key, record, ONGOING)

        self._write(key, commit, "commit offsets")

    def end_txn(self, transactional_id: str, producer_id: int, epoch: int,
                commit: bool, *, wait: bool = True) -> None:
        """Commit or abort the open transaction: PrepareX (durable), the markers, the
        pending offsets (commit), CompleteX. With `wait=False` it returns once PrepareX
        is durable and the completion thread does the rest (Kafka's EndTxn; module
        docstring). A retry of a finished end (the same outcome) returns; the other
        outcome, or no open transaction, raises InvalidTxnStateError."""
        key = _key(transactional_id)
        want = PREPARE_COMMIT if commit else PREPARE_ABORT

        def prepare(txn: Any) -> bool:
            record = self._existing(txn, key, transactional_id)
            self._check_producer(record, transactional_id, producer_id, epoch)
            state = record["state"]
            if state == ONGOING:
                self._store(txn, key, record, want)
                return True
            if state in (want, COMPLETED[commit]):
                return state == want           # a retry: complete it, or done already
            raise InvalidTxnStateError(
                f"cannot {'commit' if commit else 'abort'} transaction "
                f"{transactional_id!r}: it is {state}"
                + (" (no transaction was begun)" if state in READY else ""))

        with self._lock.hold(key):
            if commit and self._sync is not None:
                # the records durable before the decision: a power cut after a durable
                # PrepareCommit must not leave some partitions' records and lose others'
                current = self._read(key)
                if current is not None and current["state"] == ONGOING:
                    self._sync(sorted(_tps(current["partitions"])))
            prepared = self._write(key, prepare, "end")
            if prepared and wait:
                self._complete_if_prepared(key)
        if prepared and not wait:
            self._complete_later(key, producer_id)

    # ---- completion --------------------------------------------------------------------

    def _complete_if_prepared(self, key: bytes) -> str | None:
        """Finish a `Prepare*` transaction (stripe lock held): markers, then offsets and
        `Complete*` in one write. Returns the state reached, or None if there was
        nothing to finish."""
        record = self._read(key)
        if record is None or record["state"] not in PREPARED:
            return None
        commit = PREPARED[record["state"]]
        pid, epoch = record["producer_id"], record["epoch"]
        partitions = _tps(record["partitions"])
        if partitions:
            self._write_markers(partitions, pid, epoch, commit)
        offsets = record["offsets"] if commit else {}
        if self._sync is not None:
            # Complete* (synced by LMDB) only once every marker is durable, so a power
            # cut never keeps Complete* without its markers (module docstring); and, as
            # a group commit does, the offsets never point past the durable end of the
            # logs they name (after a power cut, new appends would reuse offsets the
            # group has passed)
            synced = set(partitions) | {TopicPartition(t, p) for entries in offsets.values()
                                        for t, p, _, _ in entries}
            if synced:
                self._sync(sorted(synced))

        def complete(txn: Any) -> str | None:
            now = self._load(txn, key)
            if now is None or now["state"] != record["state"] \
                    or now["producer_id"] != pid or now["epoch"] != epoch:
                return None                         # finished meanwhile
            if commit:
                stamp = _now_ms()
                for group, entries in now["offsets"].items():
                    for t, p, o, m in entries:
                        self.meta.put(txn, "offsets", offset_key(group, t, p),
                                      {"offset": o, "metadata": m, "commit_ms": stamp})
            now.update(partitions=[], offsets={}, groups=[], start_ms=-1)
            state = COMPLETED[commit]
            self._store(txn, key, now, state)
            return state

        return self._write(key, complete, "complete")

    def complete_prepared(self, lock_timeout_s: float = 1.0) -> int:
        """Finish every `Prepare*` transaction (a crash between the two phases); the
        broker runs it at open and from its expiry thread. One whose lock another
        process holds past `lock_timeout_s` is being finished there: skipped. Returns
        how many this call finished."""
        done = 0
        for key, record in self.meta.items("txn"):
            if record["state"] in PREPARED:
                try:
                    with self._lock.hold(key, lock_timeout_s):
                        done += self._complete_if_prepared(key) is not None
                except LogkitTimeoutError:
                    continue
        return done

    def abort_expired(self, now_ms: int | None = None) -> list[str]:
        """Abort every `Ongoing` transaction older than its timeout, bumping its epoch
        (the producer is fenced), as Kafka's coordinator does. Returns their ids."""
        now_ms = _now_ms() if now_ms is None else now_ms
        aborted = []
        for key, record in self.meta.items("txn"):
            if record["state"] != ONGOING or \
                    record["start_ms"] + record["timeout_ms"] > now_ms:
                continue

            def expire(txn: Any, key: bytes = key) -> bool:
                current = self._load(txn, key)
                if current is None or current["state"] != ONGOING or \
                        current["start_ms"] + current["timeout_ms"] > now_ms:
                    return False
                self._fence(txn, key, current, reason=f"transaction.timeout.ms="
                            f"{current['timeout_ms']} passed")
                return True

            with self._lock.hold(key):
                if self._write(key, expire, "expire"):
                    self._complete_if_prepared(key)
                    aborted.append(key.decode())
        return aborted

    # ---- inspection --------------------------------------------------------------------

    def list_transactions(self, states: Iterable[str] = (),
                          producer_ids: Iterable[int] = ()) -> list[TxnListing]:
        """Every transactional id, filtered by state names and producer ids (empty: all)."""
        states, pids = set(states), set(producer_ids)
        return [TxnListing(key.decode(), r["producer_id"], r["state"])
                for key, r in self.meta.items("txn")
                if (not states or r["state"] in states)
                and (not pids or r["producer_id"] in pids)]

    def describe_transactions(self, ids: Iterable[str]) -> list[TxnDescription]:
        """The state of each id; TransactionalIdNotFoundError for one with none."""
        out = []
        for tid in ids:
            record = self._read(_key(tid))
            if record is None:
                raise TransactionalIdNotFoundError(f"no transaction state for "
                                                   f"transactional id {tid!r}")
            out.append(TxnDescription(tid, record["state"], record["producer_id"],
                                      record["epoch"], record["timeout_ms"],
                                      record["start_ms"], _tps(record["partitions"])))
        return out

    def pending_offset_partitions(self, group_id: str) -> set[TopicPartition]:
        """Partitions of `group_id` with offsets in an unfinished transaction (what an
        OffsetFetch with require_stable answers UNSTABLE_OFFSET_COMMIT for)."""
        out: set[TopicPartition] = set()
        for _, record in self.meta.items("txn"):
            if record["state"] in (ONGOING, PREPARE_COMMIT):
                out.update(TopicPartition(t, p)
                           for t, p, _, _ in record["offsets"].get(group_id, []))
        return out

    def state(self, transactional_id: str) -> str | None:
        """The state name of one id (None: never initialised)."""
        record = self._read(_key(transactional_id))
        return None if record is None else record["state"]
