"""The producer: Kafka's `KafkaProducer` semantics over the embedded log.

Owns: the API, serializers and record validation, partition choice (Kafka's murmur2
for keyed records, sticky or round-robin for null keys, or a callable), the send path
(the lock-free hot path, encoding and appending sealed batches, the sender thread) and
the futures that resolve to `RecordMetadata`. The batching bookkeeping — open and sealed
batches per partition, sizes against `batch_size`, the bounded buffer (`buffer_memory`,
`max_block_ms`), `linger_ms` deadlines and which batches are due — is the record
accumulator's (logkit/accumulator.py, Kafka's `RecordAccumulator`).

How batches leave the accumulator (the "sender" side of Kafka's producer, with a local
append in place of a produce request):

| trigger                                    | who appends                       |
|--------------------------------------------|-----------------------------------|
| the next record does not fit `batch_size`  | the thread that called `send()`,  |
|                                            | or the thread already appending   |
|                                            | that partition                    |
| the batch is `linger_ms` old               | a sending thread at its next look |
|                                            | (`_look`), else the sender thread |
| `flush()` / `close()`                      | the calling thread                |
| `future.result()` on a still-open batch    | the calling thread (no hand-off)  |
| `buffer_memory` exhausted                  | the thread needing room (oldest   |
|                                            | first), the sender thread if it   |
|                                            | has to wait                       |

With `linger_ms=0` a batch is due at once while the producer is quiet: a lone record
leaves as soon as the sender thread runs. While records keep arriving (a batch grew
since the sender thread's last look, or a batch is being appended — Kafka's request in
flight) it waits until full or BUSY_LINGER_S old (logkit/accumulator.py): an idle
producer writes one-record batches; a saturated one writes full batches, never a
trickle of tiny ones.

Buffer accounting is Kafka's (see logkit/accumulator.py): a `send()` that needs a new
batch and finds no room in `buffer_memory` blocks up to `max_block_ms`, then raises
`LogkitTimeoutError`.

Timestamps: a record sent without one is stamped with the time its batch is
appended (about `linger_ms` after `send()` at most), which is what the batch header and
`RecordMetadata` report. `acks`: 0 resolves futures without waiting (offset -1, as Kafka's client
reports); 1 waits for the append; "all" (or -1) waits for the append and, with no
replication configured, means the same as 1 — the leader is the whole ISR — except that
a topic whose `min.insync.replicas` is above 1 fails the batch with
`NotEnoughReplicasError` before anything is written, as Kafka does with one replica.
On a replicated topic (replication factor above 1) "all" refuses the batch the same way
when the ISR is smaller than `min.insync.replicas`, and after the append its futures
complete only once the high watermark passes the batch, or fail with
`LogkitTimeoutError` after `request_timeout_ms` (the records stay in the log, as
Kafka's); the waiting is one thread per producer (logkit/leader/replicas.py's
`AckWaiter`, logkit/waiters.py), so many batches wait at once.

Options: the keywords, their defaults and bounds are the "producer" rows of the one
settings table (logkit/config.py, docs/configuration.md); `retries` and `client_id` are
accepted and ignored (appends are local and never retried).

Idempotence and transactions (docs/design.md §15, Kafka's KIP-98): an idempotent
producer (`enable_idempotence`, on by default exactly when acks="all") gets a producer
id and epoch from the broker's transaction coordinator (logkit/transactions.py) at its
first append and stamps each batch with them and the partition's next sequence number,
assigned by the one thread appending that partition, at the append (a batch that stored
nothing does not advance it); the log refuses gaps and answers a duplicate with its
first offset. A transactional producer (`transactional_id`) takes its id and epoch from
`init_transactions()`, sends only inside a transaction (every send takes the Python
path: it checks the state, and registers a partition new to the transaction with the
coordinator before its first record is queued), and flushes before it ends one. Client
states: UNINITIALIZED -> READY <-> IN_TRANSACTION -> (a failed send) ABORTABLE_ERROR ->
READY by abort; FENCED, from which every call raises ProducerFencedError.

Errors: an append's error goes to its records' futures; one that is not a `LogkitError`
(a bug) is also logged with its traceback; a send callback's exception is logged and
the producer carries on.

The compiled twin: `logkit/_sendpath.c` (optional, like `_speedups`) does send()'s
common case — bytes in, default partitioner, known topic, room in the open batch — and
hands every other call to the Python `send` unchanged; LOGKIT_PURE_PYTHON=1 disables it
(`logkit._native` makes that choice). When built, the fields it reads are C fields of
the accumulator's Batch and TopicBatches (logkit/accumulator.py, `DIRECT_ROWS`).

Timeouts — every wait is bounded, including the wait for a partition's append lock held
by another process (which may be stalled: stopped, swapped out, on a hung disk):

| who appends                         | waits for the append lock at most                 |
|-------------------------------------|---------------------------------------------------|
| `send()` sealing a full batch       | `max_block_ms`                                    |
| `future.result(timeout)`, `flush(timeout)` | `timeout` (None: `delivery_timeout_ms`)    |
| the sender thread                   | what is left of the batch's `delivery_timeout_ms` |

A caller's own timeout running out does not fail the batch: it goes back to the head of
its partition's queue and the sender thread appends it (`result()` raises
`LogkitTimeoutError`, the record may still be stored later, as with Kafka's
`future.get(timeout)`). A batch not appended within `delivery_timeout_ms` (120 s, Kafka's
default) of its creation fails with `LogkitTimeoutError`, which only its own records'
futures get. Nothing is appended twice: a lock timeout stores nothing.

Partition counts: a topic grown by `Broker.create_partitions` in this process is
learned at once; one grown by another process from the producer's next batch (the
doorbell page's metadata counter, read once per batch) or at the latest after
`METADATA_MAX_AGE_S` (a periodic re-read: a bump can be missed). Records already
partitioned keep their partition; later keyed records map by murmur2 mod the new count,
as Kafka's producer does after its metadata refresh.

Validation happens in `send()`, so a bad record is refused alone, before it joins a
batch whose other records it would take down at append: timestamps are ints in
[0, 2**63 - 1] or None, header keys `str` (encodable as UTF-8; bytes keys are refused
as kafka-python refuses them), header values bytes-like or None (`ConfigError`).

Fork: in a process forked from the one that made the producer, every method raises
`ForkedProcessError` before touching a lock or a file (an at-fork hook routes the
compiled send path to the checking Python path, so the hot path pays nothing); the
sender thread does not exist there and copied locks may be held. `close()` in the child
returns at once: the parent's batches are the parent's to append.

Thread-safety: every public method may be called from any thread. One lock (the
accumulator's) guards the batching structure (opening and sealing batches, buffer
accounting); it is never held while encoding or appending. The hot path of `send()`
takes no lock: compiled, it checks that the batch is open and adds the row in one step
under the GIL; pure Python, it appends to the open batch's deque (an atomic operation)
and re-checks that the batch was not sealed meanwhile (see `Producer.send`).
Invariant: each record's future resolves exactly once, with the offset it was stored at
or the error that kept it out; a record is never appended twice; batches of one
partition are appended in the order they were sealed, so records keep their send order
within a partition.
"""

from __future__ import annotations

import collections
import logging
import random
import threading
import time
import warnings
import weakref
from contextlib import contextmanager
from functools import partial
from typing import Any, Callable, Iterator, Mapping

from . import _fork, _native
from .accumulator import (CALLER_DUE_MAX, CALLER_LOOK_EVERY, DIRECT_ROWS, Batch,
                          RecordAccumulator, TopicBatches)
from .compression import codec_id, require
from .config import PRODUCER, is_compacted, resolve
from ._threads import start_thread
from .errors import (ArgumentTypeError, ClosedError, CommitFailedError, ConfigError,
                     IllegalStateError, InvalidProducerEpochError, InvalidRecordError,
                     InvalidTxnStateError, LogkitError, LogkitTimeoutError,
                     NotEnoughReplicasError, OutOfOrderSequenceError, ProducerFencedError,
                     RecordTooLargeError, TransactionAbortedError, UnknownTopicError,
                     storage_error)
from .waiters import AckWaiter, SyncWaiter
from .murmur2 import partition_for_key
from .records import (RECORD_OVERHEAD_BYTES, RECORDS_OFFSET, RecordMetadata, encode_batch,
                      encode_batch_parts, record_size_estimate)
from .topic import TopicPartition

__all__ = ["Producer", "FutureRecordMetadata"]

# The compiled twin of send()'s fast path (logkit/_sendpath.c), chosen once by _native.
_sendpath = _native.sendpath
_CSender = None if _sendpath is None else _sendpath.Sender
_run_callbacks = None if _sendpath is None else _sendpath.run_callbacks

# Keyword -> default, from the one settings table (logkit/config.py, scope "producer").
DEFAULTS: dict[str, Any] = resolve(PRODUCER, None)
IN_SYNC_REPLICAS = 1                # no replication yet: the leader is the whole ISR
ISR_CHECK_MAX_AGE_MS = 10           # acks="all": the ISR view checked before an append
KEY_CACHE_LIMIT = 100_000           # key -> partition entries per topic, then cleared
MAX_TIMESTAMP_MS = 2**63 - 1        # the batch header's int64
SECONDS_LOOKALIKE_MS = 10**11       # below it a timestamp looks like seconds (docs/design.md §6)
METADATA_MAX_AGE_S = 30.0           # partition counts re-read at least this often

log = logging.getLogger(__name__)


class _TopicState(TopicBatches):
    """The producer's view of one topic: its batches (the accumulator's part) and its
    partitioner state, on one object so that send() does one lookup.

    `sticky` (the null-key partition) is a field of the base class, which
    logkit/_sendpath.c reads (a C field when built); `cache` (key -> partition: murmur2
    is pure) serves this module's keyed sends (the compiled path hashes every key).

    `compacted`: the topic's cleanup.policy includes compact (read when the producer
    first sent to it, and again at each metadata re-read: `set_compacted`), so send()
    refuses a null key. Such a topic's `open` is a
    `_CheckedOpen`, which the compiled path (exact lists only) hands back to send()."""

    __slots__ = ("producer", "round_robin", "cache", "compacted")

    def __init__(self, producer: "Producer", topic: Any) -> None:
        super().__init__(topic)
        self.producer = producer
        self.cache: dict[bytes, int] = {}
        self.sticky = random.randrange(self.count)
        self.round_robin = -1
        self.compacted = is_compacted(topic.config)
        if self.compacted:
            self.open = _CheckedOpen(self.open)

    def set_compacted(self, compacted: bool) -> None:
        """The topic's cleanup.policy changed (accumulator lock held): `open` becomes
        a `_CheckedOpen` (send() checks every key) or an exact list again (the compiled
        path may take sends). The same batch objects move over; every writer of
        `open[p]` holds the lock, and the lock-free path only adds rows to a batch it
        read, so no batch is lost by the swap."""
        self.compacted = compacted
        if compacted and type(self.open) is list:
            self.open = _CheckedOpen(self.open)
        elif not compacted and type(self.open) is _CheckedOpen:
            self.open = list(self.open)

    def keyed(self, key: bytes) -> int:
        if len(self.cache) >= KEY_CACHE_LIMIT:
            self.cache.clear()
        # this state's count, not the Topic's: the Topic may have grown first
        partition = self.cache[key] = partition_for_key(key, self.count)
        return partition

    def grow(self, count: int) -> None:
        """The topic has `count` partitions now (more than before; accumulator lock
        held): room for the new ones first, then the count, then the key cache goes
        (keys map by the new count). The hot path may still place a record by an old
        cache entry meanwhile: a partition that exists, since counts only grow."""
        added = count - self.count
        if added <= 0:
            return
        self.open.extend([None] * added)
        self.sealed.extend(collections.deque() for _ in range(added))
        self.busy.extend([False] * added)
        self.count = count
        self.cache.clear()

    def batch_sealed(self, partition: int) -> None:
        """A sticky partitioner moves on to another partition once its batch is sealed
        (Kafka's behaviour). Accumulator lock held."""
        if self.sticky == partition and self.count > 1:
            choice = random.randrange(self.count - 1)
            self.sticky = choice + (choice >= partition)


class _CheckedOpen(list):
    """The open batches of a compacted topic: a list the compiled send path does not
    take (it reads exact lists only), so each send goes through send()'s key check."""

    __slots__ = ()


class _PyFutureBase:
    """The fields of a future and its callback registration; `_sendpath.FutureBase` is
    the compiled twin, which the C send path allocates without running a Python
    __init__ and whose add_callback/add_errback register in C (the Python `_add` of
    FutureRecordMetadata takes every case they do not)."""

    __slots__ = ("_batch", "_row", "_acks", "_index")

    def __init__(self, batch: Batch, row: tuple, acks: int) -> None:
        self._batch = batch
        self._row = row
        self._acks = acks
        self._index = -1                  # the row's place in batch.rows: not known

    def add_callback(self, fn: Callable[[RecordMetadata], Any]) -> Any:
        """Call fn(metadata) once the record is stored (at once if it already is)."""
        return self._add(fn, None)       # type: ignore[attr-defined]

    def add_errback(self, fn: Callable[[BaseException], Any]) -> Any:
        """Call fn(error) if the record could not be stored."""
        return self._add(None, fn)       # type: ignore[attr-defined]


_FutureBase: Any = _PyFutureBase if _sendpath is None else _sendpath.FutureBase


class FutureRecordMetadata(_FutureBase):
    """The future of one sent record (Kafka's FutureRecordMetadata).

    Cheap on purpose: it holds its batch and its row; the offset is worked out only
    when someone asks for it."""

    __slots__ = ()

    def done(self) -> bool:
        return self._acks == 0 or self._batch.finished

    def result(self, timeout: float | None = None) -> RecordMetadata:
        """Block until the record is stored; its RecordMetadata, or the append's error."""
        batch = self._batch
        if self._acks == 0:
            ts = self._row[3]
            return RecordMetadata(batch.state.name, batch.partition, -1,
                                  batch.timestamp_ms if ts is None else ts)
        if not batch.finished:
            self._wait(timeout)
        outcome = batch.outcome(self._row)
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    get = result

    def exception(self, timeout: float | None = None) -> BaseException | None:
        batch = self._batch
        if not batch.finished:
            self._wait(timeout)
        outcome = batch.outcome(self._row)
        return outcome if isinstance(outcome, BaseException) else None

    def _wait(self, timeout: float | None) -> None:
        """Append the batch on this thread if it is still queued (no hand-off), waiting
        for the append lock no longer than `timeout`; then wait for it to be done."""
        batch = self._batch
        producer = batch.state.producer
        if producer._pid != _fork._pid:
            _fork.check_owner(producer._pid, "this producer")
        deadline = None if timeout is None else time.monotonic() + timeout
        producer._append_if_open(batch, deadline)
        if batch.finished:
            return
        with _callback_lock:                  # _resolve sets `finished` holding it
            event = batch.waiter
            if event is None and not batch.finished:
                event = batch.waiter = threading.Event()
        if event is not None and not event.wait(
                None if deadline is None else max(0.0, deadline - time.monotonic())):
            raise LogkitTimeoutError(f"record not stored within {timeout} s")

    # add_callback(fn) / add_errback(fn) come from the base (compiled or _PyFutureBase)

    def _add(self, ok: Callable | None, err: Callable | None) -> "FutureRecordMetadata":
        batch = self._batch
        if not batch.finished:
            producer = batch.state.producer
            if producer._pid != _fork._pid:
                _fork.check_owner(producer._pid, "this producer")
        with _callback_lock:
            if not batch.finished:
                batch.callbacks.append((self._row, ok, err, self._index))
                return self
        _run_callback(batch, self._row, ok, err)
        return self


class _StaleTopic(Exception):
    """An append found its topic handle closed or deleted before storing anything."""


_callback_lock = threading.Lock()      # callbacks registered vs. run: exactly once
_in_callback = threading.local()      # flush() from a callback would wait for itself
_producers: "weakref.WeakSet[Producer]" = weakref.WeakSet()   # for the fork hook


def _after_fork_in_child() -> None:
    """Route every inherited producer's send() to the Python path, which raises
    ForkedProcessError (the compiled fast path has no pid check: it costs nothing
    this way), and replace the callback lock, which a parent thread may have held."""
    global _callback_lock
    _callback_lock = threading.Lock()
    try:                               # must not raise: later hooks (meta's) must run
        if _sendpath is not None:
            _sendpath.forked()         # add_callback in C: the checking Python path
        for producer in list(_producers):
            producer._slow = True
            if _CSender is not None and isinstance(producer.__dict__.get("send"), _CSender):
                producer.send.slow = 1
    except Exception:                  # broad on purpose: an at-fork hook must not raise,
        # and a copy left on the compiled path is still unusable (ForkedProcessError
        # from every other method); say so for whoever debugs the child
        log.debug("routing a forked producer to the checking path failed", exc_info=True)


_fork.at_fork_in_child(_after_fork_in_child)


def _log_unexpected(exc: BaseException, batch: Batch) -> None:
    """An append failed with an error that is not logkit's (a bug): it goes to the
    records' futures, which must resolve, and to the log with its traceback."""
    log.error("appending %d record(s) to %s-%d failed unexpectedly", len(batch.rows),
              batch.state.name, batch.partition, exc_info=exc)


def _callback_raised(batch: Batch, exc: BaseException) -> None:
    log.error("a send callback for %s-%d raised", batch.state.name, batch.partition,
              exc_info=exc)


def _run_callback(batch: Batch, row: tuple, ok: Callable | None,
                  err: Callable | None) -> None:
    outcome = batch.outcome(row)
    if isinstance(outcome, BaseException):
        if err is not None:
            err(outcome)
    elif ok is not None:
        ok(outcome)


def _as_bytes(data: Any) -> bytes | None:
    if data is None or type(data) is bytes:
        return data
    if isinstance(data, (bytearray, memoryview)):
        return bytes(data)
    if isinstance(data, bytes):                      # a bytes subclass
        return bytes(data)
    raise ArgumentTypeError(f"keys and values must be bytes (or set key_serializer / "
                            f"value_serializer), got {type(data).__name__}")


def _check_timestamp(timestamp_ms: Any) -> None:
    """An int of milliseconds in the batch header's range, or a named error; one that
    looks like seconds (docs/design.md §6: below 10^11 ms, before 1973) warns."""
    if isinstance(timestamp_ms, bool) or not isinstance(timestamp_ms, int):
        raise ArgumentTypeError(f"timestamp must be None or an int of milliseconds, got "
                                f"{timestamp_ms!r} ({type(timestamp_ms).__name__})")
    if not 0 <= timestamp_ms <= MAX_TIMESTAMP_MS:
        raise ConfigError(f"timestamp must be None or an int of milliseconds in "
                          f"[0, 2**63 - 1], got {timestamp_ms!r}")
    if timestamp_ms < SECONDS_LOOKALIKE_MS:
        # stacklevel: _check_timestamp, _send_checked, _send_general, Producer.send,
        # the caller
        warnings.warn(f"timestamp {timestamp_ms} looks like seconds, not milliseconds "
                      f"since the epoch (it is before 1973 in ms): Kafka timestamps are "
                      f"milliseconds, e.g. int(time.time() * 1000)", UserWarning,
                      stacklevel=5)


def _check_headers(headers: Any) -> list[tuple[str, bytes | None]]:
    """Headers as (str key, bytes-or-None value) pairs, from a list of pairs
    (kafka-python's form) or a dict (confluent-kafka also takes one), or a named error
    for the bad one (keys str, values bytes-like or None: Kafka allows null values)."""
    if isinstance(headers, Mapping):
        pairs = list(headers.items())
    elif isinstance(headers, (str, bytes, bytearray, memoryview)):
        raise ArgumentTypeError(f"headers must be a dict {{str: bytes}} or a list of "
                                f"(str, bytes) pairs, got {headers!r}")
    else:
        try:
            pairs = list(headers)
        except TypeError:
            raise ArgumentTypeError(f"headers must be a dict {{str: bytes}} or a list of "
                                    f"(str, bytes) pairs, got {headers!r}") from None
    out = []
    for pair in pairs:
        if not isinstance(pair, (tuple, list)) or len(pair) != 2:
            raise ConfigError(f"each header must be a (str, bytes) pair, got {pair!r}")
        hkey, hvalue = pair
        if not isinstance(hkey, str):
            raise ArgumentTypeError(f"header key {hkey!r} must be a str (decode bytes "
                                    "keys yourself)")
        try:
            hkey.encode("utf-8")
        except UnicodeEncodeError:
            raise ConfigError(f"header key {hkey!r} is not encodable as UTF-8") from None
        if hvalue is not None and type(hvalue) is not bytes:
            if not isinstance(hvalue, (bytes, bytearray, memoryview)):
                raise ArgumentTypeError(f"header value {hvalue!r} of header {hkey!r} "
                                        "must be bytes or None")
            hvalue = bytes(hvalue)
        out.append((hkey, hvalue))
    return out


# The transactional producer's client-side states (Kafka's TransactionManager, fewer).
_UNINITIALIZED = "UNINITIALIZED"        # init_transactions() not called yet
_READY = "READY"                        # no transaction open
_IN_TRANSACTION = "IN_TRANSACTION"
_COMMITTING = "COMMITTING_TRANSACTION"  # commit_transaction() is flushing and ending it
_ABORTING = "ABORTING_TRANSACTION"
_APPENDING = ("IN_TRANSACTION", "COMMITTING_TRANSACTION", "ABORTING_TRANSACTION",
              "ABORTABLE_ERROR")        # states in which queued batches still append
_ABORTABLE = "ABORTABLE_ERROR"          # a send of the transaction failed: abort it
_FENCED = "FENCED"                      # another producer took the transactional id
_SEQUENCE_MASK = 0x7FFFFFFF             # sequence numbers wrap at 2**31 (Kafka's)
TXN_WHOLE_TOPIC_PARTITIONS = 16         # a topic this small joins a transaction whole


def _settle_idempotence(settings: dict[str, Any], acks_given: bool) -> None:
    """Kafka's rules between acks, enable_idempotence and transactional_id (docs/design.md
    §15): idempotence defaults to True exactly when acks is "all"; True with acks 0/1 is
    a ConfigError; a transactional id implies idempotence and acks "all" (acks given as
    0/1, or idempotence False, is a ConfigError)."""
    acks, idempotent = settings["acks"], settings["enable_idempotence"]
    transactional = settings["transactional_id"] is not None
    if transactional:
        if settings["transactional_id"] == "":
            raise ConfigError("transactional_id must be a non-empty str or None")
        if idempotent is False:
            raise ConfigError("a transactional producer needs enable_idempotence (Kafka's "
                              "rule): drop enable_idempotence=False or transactional_id")
        if acks_given and acks not in (-1, "all"):
            raise ConfigError(f"a transactional producer needs acks='all' (Kafka's rule), "
                              f"got acks={acks!r}")
        settings["acks"], settings["enable_idempotence"] = "all", True
        return
    if idempotent is None:
        settings["enable_idempotence"] = acks in (-1, "all")
    elif idempotent and acks not in (-1, "all"):
        raise ConfigError(f"enable_idempotence=True needs acks='all' (Kafka's rule), got "
                          f"acks={acks!r}")


class Producer:
    """`broker.producer(acks=1, linger_ms=0, batch_size=16384, compression_type=None)`."""

    def __init__(self, broker: Any, **options: Any) -> None:
        settings = resolve(PRODUCER, options)        # ConfigError naming a bad key
        _settle_idempotence(settings, "acks" in options)
        acks, partitioner = settings["acks"], settings["partitioner"]
        self.config = settings
        self._codec = codec_id(settings["compression_type"])
        require(self._codec)
        self._broker = broker
        self._acks = 0 if acks == 0 else 1
        self._acks_all = acks in (-1, "all")           # checks min.insync.replicas
        self._request_timeout_s = settings["request_timeout_ms"] / 1000
        self._ack_waiter: Any = None    # acks="all" to a replicated topic, on first use
        self._durable_waiter: Any = None    # flush.messages topics, on first use
        self._buffer_memory = settings["buffer_memory"]
        # read by send()'s hot path (and handed to _sendpath.c's Sender)
        self._batch_size = max(1, min(settings["batch_size"], self._buffer_memory))
        self._max_record_bytes = settings["max_request_size"] - RECORDS_OFFSET
        self._max_block_s = settings["max_block_ms"] / 1000
        self._look_countdown = CALLER_LOOK_EVERY     # sends until the next `_look`
        self._delivery_timeout_s = settings["delivery_timeout_ms"] / 1000
        self._pid = _fork.owner_pid()
        self._key_serializer = settings["key_serializer"]
        self._value_serializer = settings["value_serializer"]
        self._round_robin = partitioner == "round_robin"
        self._custom = partitioner if callable(partitioner) else None
        # send()'s fast path handles bytes in, default partitioner; anything else,
        # and a closed producer, takes the general path.
        self._slow = self._key_serializer is not None or \
            self._value_serializer is not None or partitioner not in (None, "sticky",
                                                                      "murmur2")
        # Idempotence and transactions (docs/design.md §15): the producer id and epoch
        # (-1: not known yet; an idempotent producer gets them at its first append), the
        # next sequence number per partition (advanced only by the thread appending that
        # partition), and the transaction's client-side state.
        self._idempotent: bool = settings["enable_idempotence"]
        self._transactional_id: str | None = settings["transactional_id"]
        self._producer_id = self._producer_epoch = -1
        self._sequences: dict[tuple[str, int], int] = {}
        self._id_lock = threading.Lock()
        self._txn_lock = threading.RLock()
        self._txn_state = _UNINITIALIZED
        self._txn_partitions: set[tuple[str, int]] = set()
        self._txn_written: set[tuple[str, int]] = set()     # partitions with a batch
        self._txn_begun_at_coordinator = False   # partitions or offsets added
        self._txn_error: BaseException | None = None
        self._send_lock = threading.Lock()    # a transactional send vs. its end beginning
        self._register_lock = threading.Lock()     # registering partitions (no _txn_lock:
        # the sender thread registers too, while a commit holding _txn_lock flushes)
        # The topics the compiled send path may take while a transaction is open: those
        # registered whole (empty outside a transaction, so every send there takes the
        # Python path, which refuses it).
        self._txn_states: dict[str, _TopicState] = {}
        fast = not self._slow
        if self._transactional_id is not None:
            self._slow = True               # the Python send checks the transaction
        self._accumulator = RecordAccumulator(
            batch_size=self._batch_size, buffer_memory=self._buffer_memory,
            linger_ms=settings["linger_ms"], max_block_ms=settings["max_block_ms"])
        # The accumulator's topic -> _TopicState dict, read by send()'s hot path (and
        # handed to _sendpath.c's Sender, which looks topics up in it).
        self._states: dict[str, _TopicState] = self._accumulator.states  # type: ignore
        # Partition counts: the broker's metadata counter as last seen, and when the
        # topic records were last read (see the module docstring).
        self._doorbell = getattr(broker, "doorbell", None)
        self._metadata_seen = self._metadata_version()
        self._metadata_read = time.monotonic()
        self._sender = threading.Thread(target=self._run_sender, name="logkit-producer",
                                        daemon=True)
        start_thread(self._sender, "the producer's sender thread")
        if _CSender is not None and fast:
            # The instance attribute shadows the method: the C twin does the fast path
            # and hands every other call to the Python method, arguments unchanged.
            self.send = _CSender(Producer.send.__get__(self),
                                 self._states if self._transactional_id is None
                                 else self._txn_states,
                                 FutureRecordMetadata, self._acks, self._batch_size,
                                 self._look, CALLER_LOOK_EVERY)
        _producers.add(self)

    def __repr__(self) -> str:
        return f"Producer(acks={self.config['acks']!r}, linger_ms={self.config['linger_ms']})"

    # ---- sending ---------------------------------------------------------------------

    def send(self, topic: str, value: Any = None, key: Any = None, *,
             partition: int | None = None, headers: Any = None,
             timestamp_ms: int | None = None, timestamp: int | None = None
             ) -> FutureRecordMetadata:
        """Queue a record; returns a future of its RecordMetadata.

        The hot path of producing, flat on purpose (benchmarks/ and logkit.bench):
        bytes key and value, no headers or explicit timestamp; an explicit partition
        when it is one this producer knows of."""
        state = self._states.get(topic)
        if state is None or self._slow or type(value) is not bytes or \
                not (headers is timestamp_ms is timestamp is None):
            return self._send_general(topic, value, key, partition, headers,
                                      timestamp if timestamp_ms is None else timestamp_ms)
        if key is None and state.compacted:
            return self._send_general(topic, value, key, partition, None, None)  # raises
        if partition is not None:
            # an explicit partition this producer knows of (a synchronous send per
            # record names one, as Kafka's latency tool does); anything else is checked
            # and named by the general path
            if type(partition) is not int or not 0 <= partition < state.count or \
                    not (key is None or type(key) is bytes):
                return self._send_general(topic, value, key, partition, None, None)
            size = len(value) + RECORD_OVERHEAD_BYTES
            if key is not None:
                size += len(key)
            p = partition
        elif key is None:
            size = len(value) + RECORD_OVERHEAD_BYTES
            p = state.sticky
        elif type(key) is bytes:
            size = len(key) + len(value) + RECORD_OVERHEAD_BYTES
            p = state.cache.get(key)
            if p is None:
                p = state.keyed(key)
        else:
            return self._send_general(topic, value, key, None, None, None)
        # Lock-free. Compiled (DIRECT_ROWS): Batch.offer checks that the batch is open
        # and adds the row in one step. Pure Python: a sealer sets batch.sealed, then
        # (holding the lock) drains the inbox; a row appended before `sealed` was set
        # is drained, a row appended after is seen by the check below and rescued.
        # Sizes may undercount under races between sending threads; that only moves
        # when a batch is sealed.
        self._look_countdown -= 1
        if self._look_countdown <= 0:
            self._look()
        row = (key, value, None, None)
        batch = state.open[p]
        if batch is None or batch.size + size > self._batch_size:
            return self._enqueue(state, p, row, size)
        if DIRECT_ROWS:
            if batch.offer(row, size):
                return FutureRecordMetadata(batch, row, self._acks)
            return self._enqueue(state, p, row, size)
        batch.inbox.append(row)
        if batch.sealed:
            return self._rescue(state, p, batch, row, size)
        batch.size += size
        return FutureRecordMetadata(batch, row, self._acks)

    def _nonblocking_send(self) -> Callable[..., Any] | None:
        """A send for a thread that must never wait on I/O (logkit.aio's event loop),
        for bytes records with the default partitioner. Same arguments as
        `send(topic, value, key, partition=...)`; it returns one of:

        - a future: the record is in an open batch (the compiled fast path: no lock);
        - (future, drain): the record sealed a full batch and went into a new one
          (the accumulator's lock, held by nobody across I/O or a wait); the caller
          has `drain()` run on another thread soon — it appends the sealed batches;
        - (None, drain) or None: nothing of the record is queued (no room in
          `buffer_memory`, a topic not used yet, a record the general path checks):
          the caller hands the record to `send()` on a thread that may wait, after
          running `drain` there if one came.

        It never looks for due batches, never appends and never waits for room.
        None instead of a callable when there is no compiled path, or the producer is
        transactional or uses serializers or another partitioner. The caller stops
        using it before `close()`, and does not use it in a forked child (the at-fork
        hook does not route it to the checking path)."""
        if _CSender is None or self._slow or self._transactional_id is not None:
            return None
        states, accumulator = self._states, self._accumulator
        batch_size, acks = self._batch_size, self._acks

        def seal_and_add(topic: Any, value: Any = None, key: Any = None,
                         partition: Any = None) -> Any:
            state = states.get(topic)
            if state is None or type(value) is not bytes or \
                    not (key is None or type(key) is bytes) or \
                    (key is None and state.compacted):
                return None
            size = len(value) + RECORD_OVERHEAD_BYTES + (0 if key is None else len(key))
            if size > self._max_record_bytes or size + RECORDS_OFFSET > batch_size:
                return None
            if partition is not None:
                if type(partition) is not int or not 0 <= partition < state.count:
                    return None
                p = partition
            elif key is None:
                p = state.sticky
            else:
                p = state.cache.get(key)
                if p is None:
                    p = state.keyed(key)
            row = (key, value, None, None)
            try:
                batch, sealed = accumulator.add(state, p, row, size, 0.0, wait=False)
            except ClosedError:
                return None
            drain = None if not sealed else (
                lambda: self._drain(state, p, time.monotonic() + self._max_block_s))
            if batch is None:
                return None if drain is None else (None, drain)
            return FutureRecordMetadata(batch, row, acks), drain

        return _CSender(seal_and_add, states, FutureRecordMetadata, acks, batch_size)

    def _rescue(self, state: _TopicState, p: int, batch: Batch, row: tuple,
                size: int) -> FutureRecordMetadata:
        """`row` went into the inbox of a batch that was being sealed (pure Python):
        keep it there if the drain took it, else take it back out and send it again."""
        if not self._accumulator.take_back(batch, row):
            return FutureRecordMetadata(batch, row, self._acks)
        return self._enqueue(state, p, row, size)

    def _send_general(self, topic: str, value: Any, key: Any, partition: int | None,
                      headers: Any, timestamp_ms: int | None) -> FutureRecordMetadata:
        """Everything send() accepts: serializers, headers, explicit partitions and
        timestamps, tombstones, first use of a topic. A transactional producer's send
        checks the state and queues its record under `_send_lock`, which a commit or
        abort takes to leave the transaction: no record joins it once its end began."""
        if self._transactional_id is None:
            return self._send_checked(topic, value, key, partition, headers, timestamp_ms)
        with self._send_lock:
            self._check_state("send", (_IN_TRANSACTION,))
            return self._send_checked(topic, value, key, partition, headers, timestamp_ms)

    def _send_checked(self, topic: str, value: Any, key: Any, partition: int | None,
                      headers: Any, timestamp_ms: int | None) -> FutureRecordMetadata:
        if self._pid != _fork._pid:
            _fork.check_owner(self._pid, "this producer")
        if self._accumulator.closed:
            raise ClosedError("producer is closed")
        if not isinstance(topic, str):
            raise ArgumentTypeError(f"topic must be a str, got {topic!r}")
        if timestamp_ms is not None:
            _check_timestamp(timestamp_ms)
        if headers is not None:
            headers = _check_headers(headers) or None
        if self._key_serializer is not None and key is not None:
            key = self._key_serializer(key)
        if self._value_serializer is not None and value is not None:
            value = self._value_serializer(value)
        key, value = _as_bytes(key), _as_bytes(value)
        size = record_size_estimate(key, value, headers)
        state = self._state(topic)
        if key is None and state.compacted:
            raise InvalidRecordError(
                f"topic {topic!r} is compacted (cleanup.policy="
                f"{state.topic.config['cleanup.policy']}): every record needs a key")
        if partition is None:
            partition = self._choose(state, key)
        elif isinstance(partition, bool) or not isinstance(partition, int):
            raise ArgumentTypeError(f"partition must be None or an int, got {partition!r}")
        elif not 0 <= partition < state.count:
            self._learn_partitions(topic)          # grown since this producer looked?
            if not 0 <= partition < state.count:
                raise UnknownTopicError(f"topic {topic!r} has no partition {partition!r} "
                                        f"(it has {state.count})")
        if self._transactional_id is not None and \
                (topic, partition) not in self._txn_partitions:
            self._add_partition(topic, partition, state.count, (_IN_TRANSACTION,))
        self._look_countdown -= 1              # send()'s own count skipped this one
        if self._look_countdown <= 0:
            self._look()
        return self._enqueue(state, partition, (key, value, headers, timestamp_ms), size)

    def _state(self, name: str) -> _TopicState:
        state = self._states.get(name)
        if state is None:
            topic = self._broker.get_or_create_topic(name)   # UnknownTopicError if off
            with self._accumulator.lock:
                state = self._states.get(name)
                if state is None:
                    state = self._states[name] = _TopicState(self, topic)
        return state

    def _metadata_version(self) -> int:
        doorbell = self._doorbell
        return 0 if doorbell is None else doorbell.metadata_version()

    def _check_metadata(self) -> None:
        """Once per batch: when the broker's metadata counter moved, or the counts are
        METADATA_MAX_AGE_S old, re-read the partition counts of this producer's topics."""
        seen = self._metadata_version()
        now = time.monotonic()
        if seen == self._metadata_seen and now - self._metadata_read < METADATA_MAX_AGE_S:
            return
        self._metadata_seen, self._metadata_read = seen, now
        for name in list(self._states):
            try:
                self._learn_partitions(name)
            except LogkitError as exc:     # deleted, closed: the append itself says so
                log.debug("re-reading the partition count of %s: %s", name, exc)

    def _learn_partitions(self, name: str) -> None:
        """Read topic `name`'s partition count (a metadata read) and grow its state if
        it has grown (`Broker.create_partitions` calls it for its own producers)."""
        state = self._states.get(name)
        if state is None:
            return
        topic = self._broker.topic(name)
        count = topic.num_partitions
        if topic.topic_id != state.topic.topic_id:
            # deleted and created again (in any process): later appends go to the new
            # topic, as a Kafka producer's do after its metadata refresh. Counts only
            # grow here: with fewer partitions than before, records for the missing
            # ones fail with UnknownTopicError.
            state.topic = topic
            log.info("producer: topic %s was created again (topic id %s)", name,
                     topic.topic_id)
        if count > state.count:
            with self._accumulator.lock:
                state.grow(count)
            log.debug("producer: topic %s has %d partition(s) now", name, count)
        compacted = is_compacted(topic.config)
        if compacted != state.compacted:      # cleanup.policy altered on the live topic
            with self._accumulator.lock:
                state.set_compacted(compacted)
            log.info("producer: topic %s is %s now: records without a key are %s", name,
                     "compacted" if compacted else "no longer compacted",
                     "refused" if compacted else "accepted")

    def _choose(self, state: _TopicState, key: bytes | None) -> int:
        if self._custom is not None:
            everything = list(range(state.count))
            partition = self._custom(key, everything, everything)
            if isinstance(partition, bool) or not isinstance(partition, int) \
                    or not 0 <= partition < state.count:
                raise ConfigError(f"the partitioner returned {partition!r} for a topic "
                                  f"with {state.count} partitions")
            return partition
        if key is not None:
            partition = state.cache.get(key)
            return state.keyed(key) if partition is None else partition
        if self._round_robin:
            state.round_robin = (state.round_robin + 1) % state.count
            return state.round_robin
        return state.sticky

    def _enqueue(self, state: _TopicState, p: int, row: tuple, size: int
                 ) -> FutureRecordMetadata:
        """Add `row` to partition p's open batch: seal a batch it does not fit, open a
        new one (waiting for buffer space), seal one it fills."""
        if size > self._max_record_bytes:
            raise RecordTooLargeError(
                f"record of about {size} bytes exceeds max_request_size="
                f"{self.config['max_request_size']}; a record this large needs both that "
                f"producer setting and the topic's max.message.bytes raised")
        if size + RECORDS_OFFSET > self._buffer_memory:
            raise RecordTooLargeError(
                f"record of about {size} bytes exceeds buffer_memory="
                f"{self._buffer_memory}")
        accumulator = self._accumulator
        deadline = time.monotonic() + self._max_block_s     # send() blocks no longer
        wait = False                    # for room: not before appending the oldest
        while True:
            batch, sealed = accumulator.add(state, p, row, size, deadline, wait=wait)
            if sealed:                  # send() waits for a lock at most max_block_ms
                self._drain(state, p, time.monotonic() + self._max_block_s)
            if batch is not None:
                break
            if not sealed:              # no room: append the oldest batches, as the
                now = time.monotonic()  # sender thread would, or wait if none is open
                oldest = accumulator.take_due(now, everything=True)
                for due in oldest:
                    self._drain(due.state, due.partition, now + self._max_block_s)
                wait = not oldest
        return FutureRecordMetadata(batch, row, self._acks)

    def _look(self) -> None:
        """A sending thread's look for due batches, every CALLER_LOOK_EVERY sends
        (logkit/_sendpath.c counts its own): at most every QUIET_CHECK_S, it appends
        the oldest due batches itself (`RecordAccumulator.take_due`), and the sender
        thread stands back while it does. The appends are the same CPU work under the
        same GIL either way; done here they cost no hand-off between threads, which
        wide topics pay most (docs/performance-round-two.md)."""
        self._look_countdown = CALLER_LOOK_EVERY
        accumulator = self._accumulator
        now = time.monotonic()
        if now >= accumulator.next_caller_look:
            for due in accumulator.take_due(now):
                self._drain(due.state, due.partition, now + self._max_block_s)

    def _append_if_open(self, batch: Batch, deadline: float | None = None) -> None:
        """Seal `batch` if it still waits in the accumulator, and append what is due,
        waiting for the append lock until `deadline` at most (see `_drain`)."""
        claimed = self._accumulator.seal_if_open(batch, caller=True, claim=True)
        if claimed is not None:
            self._drain(batch.state, batch.partition, deadline, claimed)

    def _drain(self, state: _TopicState, p: int, deadline: float | None = None,
               claimed: Batch | None = None) -> None:
        """Append partition p's sealed batches in order, in this thread — unless another
        thread is appending p already; that thread appends them (it loops until the
        queue is empty), so no thread waits for another's append and none hands off.

        `deadline` (monotonic) is this caller's bound on waiting for the append lock;
        each batch is also bounded by its delivery timeout. When the caller's bound runs
        out first, the batch goes back to the head of the queue for the sender thread
        and the drain stops. `claimed`: p's first batch, claimed by the caller already."""
        accumulator = self._accumulator
        batch = accumulator.claim(state, p) if claimed is None else claimed
        while batch is not None:
            try:
                done = self._append(batch, deadline)
            except BaseException:
                accumulator.release(state, p, batch, True)    # never append twice
                raise
            if not done:
                accumulator.release(state, p, batch, False)
                return
            batch = accumulator.release(state, p, batch, True, claim_next=True)

    def _append(self, batch: Batch, deadline: float | None = None) -> bool:
        """Append one sealed batch and resolve its futures (lock not held; the caller
        holds the partition's busy flag). False, with nothing stored and nothing
        resolved, when the append lock was not free by `deadline` and the batch's own
        delivery timeout has not passed: the batch is to be appended later."""
        self._check_metadata()
        try:
            return self._append_once(batch, deadline)
        except _StaleTopic:
            pass
        # The topic handle was closed or flagged deleted before anything was stored
        # (the check comes before the write): re-read the topic once. If it exists
        # again under a new id, the second attempt appends there; if it is gone, its
        # records fail with that error (UnknownTopicError, as Kafka's producer reports
        # a deleted topic); else the second attempt meets the first one's error.
        try:
            self._learn_partitions(batch.state.name)
        except LogkitError as exc:
            batch.error = exc
            self._resolve(batch)
            return True
        return self._append_once(batch, deadline, retry=False)

    def _append_once(self, batch: Batch, deadline: float | None = None, *,
                     retry: bool = True) -> bool:
        """One attempt of `_append`. With `retry`, an error of a stale topic handle
        (ClosedError, UnknownTopicError) raises _StaleTopic with nothing stored or
        resolved, for `_append` to refresh the handle and try again once."""
        until = batch.created + self._delivery_timeout_s
        callers = deadline is not None and deadline < until
        if callers:
            until = deadline
        ticket = None                            # flush.messages: the sync to wait for
        try:
            if batch.rows:                       # every row may have been rescued
                partition = batch.state.topic.partition(batch.partition)
                if self._acks_all:
                    self._check_in_sync_replicas(batch, partition)
                if self._transactional_id is not None and \
                        (batch.state.name, batch.partition) not in self._txn_partitions:
                    # a partition the send path did not register (the topic grew
                    # under the compiled path): the coordinator learns of it first
                    self._add_partition(batch.state.name, batch.partition, 0, _APPENDING)
                now_ms = int(time.time() * 1000)
                batch.timestamp_ms = now_ms
                encoded = None
                idempotent = self._idempotent
                if len(batch.rows) == 1 and not self._codec and not idempotent:
                    encoded = encode_batch_parts(batch.rows[0], now_ms=now_ms)  # pieces
                if encoded is None:
                    encoded = encode_batch(batch.rows, codec=self._codec, now_ms=now_ms,
                                           **self._identity(batch.state.name,
                                                            batch.partition))
                if len(batch.rows) > 1 and \
                        len(encoded) > partition.config["max.message.bytes"]:
                    batch.outcomes = {}
                    self._append_split(partition, batch.rows, now_ms, batch.outcomes,
                                       [until, callers, batch])
                else:
                    batch.base_offset, ticket = partition.append_batch_nowait(
                        encoded, verify=False,
                        lock_timeout_s=max(0.0, until - time.monotonic()))
                    if idempotent:
                        self._advance(batch.state.name, batch.partition, len(batch.rows))
                        if self._transactional_id is not None:
                            self._verify_first_write(batch.state.name, batch.partition,
                                                     partition)
        except LogkitTimeoutError as exc:     # the lock was not free: nothing stored
            if callers and not batch.outcomes:
                batch.outcomes = None
                return False
            batch.error = self._expired(batch, exc)
        except OSError as exc:                # a stray one: named, its cause kept
            batch.error = storage_error(exc, "append",
                                        f"{batch.state.name}-{batch.partition}")
            batch.error.__cause__ = exc
        except (ClosedError, UnknownTopicError) as exc:
            if retry and not batch.outcomes and not self._accumulator.closed:
                raise _StaleTopic() from exc
            batch.error = exc
        except LogkitError as exc:            # the error belongs to the records' futures
            batch.error = exc
        except Exception as exc:              # a bug: logged; the futures still resolve
            _log_unexpected(exc, batch)
            batch.error = exc
        except BaseException as exc:          # KeyboardInterrupt...: resolve, propagate
            batch.error = exc
            self._resolve(batch)
            raise
        if ticket is not None:                # flush.messages: complete after the sync
            if not (self._acks_all and partition.replicated):
                try:
                    waiter = self._sync_waiter()
                except LogkitError as exc:    # no thread for it: wait for the sync here
                    log.warning("producer: %s; waiting for the sync in this thread", exc)
                else:
                    waiter.add(batch, partition, ticket)          # appends go on
                    return True
            try:
                partition.wait_synced(ticket)
            except LogkitError as exc:
                batch.error = exc
        if self._acks_all and batch.error is None and batch.rows \
                and partition.replicated:
            self._wait_for_replicas(batch, partition)      # resolved by the waiter
            return True
        self._resolve(batch)
        return True

    def _sync_waiter(self) -> Any:
        """The thread that completes durable batches after their sync (logkit/log.py
        SyncWaiter), so this one appends on meanwhile; made on first use."""
        waiter = self._durable_waiter
        if waiter is None:
            with self._accumulator.lock:
                waiter = self._durable_waiter
                if waiter is None:
                    waiter = self._durable_waiter = SyncWaiter(self._synced)
        return waiter

    def _synced(self, batch: Batch, error: BaseException | None) -> None:
        if error is not None:
            batch.error = error
        self._resolve(batch)

    def _wait_for_replicas(self, batch: Batch, partition: Any) -> None:
        """acks="all" to a replicated partition: the stored batch completes once the
        high watermark passes its last record (logkit/leader/replicas.py)."""
        if batch.outcomes is None:
            target = batch.base_offset + len(batch.rows)
        else:
            stored = [o for o in batch.outcomes.values() if not isinstance(o, BaseException)]
            if not stored:
                self._resolve(batch)
                return
            target = max(stored) + 1
        waiter = self._ack_waiter
        if waiter is None:
            try:
                with self._accumulator.lock:
                    waiter = self._ack_waiter
                    if waiter is None:
                        waiter = self._ack_waiter = AckWaiter(
                            getattr(self._broker, "doorbell", None), self._resolve)
            except LogkitError as exc:       # no thread to wait with: the batch is
                batch.error = exc            # stored, its replication not confirmed
                self._resolve(batch)
                return
        waiter.add(batch, partition, target, self._request_timeout_s,
                   partition.config["min.insync.replicas"])

    def _check_in_sync_replicas(self, batch: Batch, partition: Any) -> None:
        """acks='all': refuse the batch before appending when the topic asks for more
        in-sync replicas than exist (Kafka's NOT_ENOUGH_REPLICAS; nothing is written)."""
        wanted = partition.config["min.insync.replicas"]
        if partition.replicated:
            isr = partition.in_sync_replicas(max_age_ms=ISR_CHECK_MAX_AGE_MS)
            if wanted > len(isr):                  # look again, fresh, before refusing
                isr = partition.in_sync_replicas(relist=True)
            if wanted > len(isr):
                raise NotEnoughReplicasError(
                    f"acks='all' to {batch.state.name}-{batch.partition} needs "
                    f"min.insync.replicas={wanted} in-sync replicas; the ISR is {isr} "
                    f"(replication factor {partition.replication_factor}); nothing was "
                    "written")
            return
        if wanted > IN_SYNC_REPLICAS:
            raise NotEnoughReplicasError(
                f"acks='all' to {batch.state.name}-{batch.partition} needs "
                f"min.insync.replicas={wanted} in-sync replicas; there is "
                f"{IN_SYNC_REPLICAS} (no replication): lower the topic's "
                "min.insync.replicas or send with acks=1")

    def _expired(self, batch: Batch, exc: LogkitTimeoutError) -> LogkitTimeoutError:
        error = LogkitTimeoutError(
            f"{len(batch.rows)} record(s) for {batch.state.name}-{batch.partition} not "
            f"stored within delivery_timeout_ms={self.config['delivery_timeout_ms']} of "
            f"the batch's creation: {exc}")
        error.__cause__ = exc
        return error

    def _resolve(self, batch: Batch) -> None:
        """Mark the batch done and run its callbacks (in this thread)."""
        if self._transactional_id is not None and (
                batch.error is not None or batch.outcomes is not None):
            self._transaction_failed(batch)
        elif isinstance(batch.error, OutOfOrderSequenceError) and self._idempotent:
            self._reset_producer_id()
        with _callback_lock:
            batch.finished = True             # before the swap: adds check it first
            event = batch.waiter
            callbacks, batch.callbacks = batch.callbacks, []
        if event is not None:
            event.set()
        if not callbacks:
            return
        _in_callback.active = True
        try:
            if _run_callbacks is not None and batch.error is None \
                    and batch.outcomes is None:      # stored whole: the compiled loop
                _run_callbacks(callbacks, RecordMetadata, batch.state.name,
                               batch.partition, batch.base_offset, batch.timestamp_ms,
                               batch.outcome, partial(_callback_raised, batch))
                return
            for row, ok, err, _ in callbacks:
                try:
                    _run_callback(batch, row, ok, err)
                except Exception as exc:  # a user callback must not break the producer
                    _callback_raised(batch, exc)
        finally:
            _in_callback.active = False

    def _append_split(self, partition: Any, rows: list[tuple], now_ms: int,
                      outcomes: dict[int, int | BaseException], bound: list) -> None:
        """A batch over the topic's max.message.bytes goes in halves, recursively (as
        Kafka's producer splits on MESSAGE_TOO_LARGE); each row's offset or error is
        recorded, so only a record too big on its own fails.

        `bound` is [lock deadline, whether it is the caller's, the batch]: a caller's
        lock timeout before anything is stored propagates (the batch is requeued);
        once a part is stored the rest is bounded by the delivery timeout only."""
        until, callers, batch = bound
        try:
            identity = self._identity(batch.state.name, batch.partition)
        except LogkitError as exc:     # no producer id: these rows fail with the reason
            for row in rows:
                outcomes[id(row)] = exc
            return
        encoded = encode_batch(rows, codec=self._codec, now_ms=now_ms, **identity)
        if len(rows) > 1 and len(encoded) > partition.config["max.message.bytes"]:
            half = len(rows) // 2
            self._append_split(partition, rows[:half], now_ms, outcomes, bound)
            self._append_split(partition, rows[half:], now_ms, outcomes, bound)
            return
        try:
            base = partition.append_batch(encoded, verify=False,
                                    lock_timeout_s=max(0.0, until - time.monotonic()))
        except LogkitTimeoutError as exc:
            if callers and not outcomes:
                raise                          # nothing stored yet: requeue the batch
            for row in rows:
                outcomes[id(row)] = self._expired(batch, exc)
            return
        except OSError as exc:
            error = storage_error(exc, "append", f"{batch.state.name}-{batch.partition}")
            error.__cause__ = exc
            for row in rows:
                outcomes[id(row)] = error
            return
        except LogkitError as exc:     # the error belongs to these rows' futures
            for row in rows:
                outcomes[id(row)] = exc
            return
        except Exception as exc:       # a bug: logged; these rows' futures still resolve
            _log_unexpected(exc, batch)
            for row in rows:
                outcomes[id(row)] = exc
            return
        if self._idempotent:
            self._advance(batch.state.name, batch.partition, len(rows))
            if self._transactional_id is not None:
                try:
                    self._verify_first_write(batch.state.name, batch.partition, partition)
                except LogkitError as exc:
                    for row in rows:
                        outcomes[id(row)] = exc
                    return
        if callers:                            # a part is stored: finish what we began
            bound[0], bound[1] = batch.created + self._delivery_timeout_s, False
        for i, row in enumerate(rows):
            outcomes[id(row)] = base + i

    # ---- the sender thread -----------------------------------------------------------

    def _run_sender(self) -> None:
        """Append what the accumulator says is due (linger_ms old, requeued, or every
        batch when the buffer is exhausted or the producer closes) until closed."""
        accumulator = self._accumulator
        while True:
            ready = accumulator.next_ready()
            if ready is None:
                return
            for i, (state, p, due) in enumerate(ready):
                if due is not None:
                    if i and not i % CALLER_DUE_MAX:
                        accumulator.yield_to_callers()
                    if accumulator.callers_took_over():
                        break                 # the sending threads take them now
                try:
                    if due is not None:       # sealed now, with what came meanwhile
                        accumulator.seal_if_open(due)
                    self._drain(state, p)
                except Exception:     # never let one partition stop the sender thread
                    log.exception("appending to %s-%d failed", state.name, p)

    # ---- lifecycle -------------------------------------------------------------------

    def flush(self, timeout: float | None = None) -> None:
        """Append every queued record now and wait until all are stored."""
        if self._pid != _fork._pid:
            _fork.check_owner(self._pid, "this producer")
        if getattr(_in_callback, "active", False):
            raise IllegalStateError("flush() from a send callback would wait for the "
                                    "batch that is running the callback")
        deadline = None if timeout is None else time.monotonic() + timeout
        for state in self._accumulator.seal_all():
            for p in range(state.count):
                self._drain(state, p, deadline)
        self._accumulator.wait_appended(deadline, timeout)
        if self._durable_waiter is not None:       # flush.messages: the syncs too
            self._durable_waiter.wait_idle(deadline)
        if self._ack_waiter is not None:           # acks="all": the replicas too
            self._ack_waiter.wait_idle(deadline)

    def close(self, timeout: float | None = None) -> None:
        """Flush, refuse further sends, stop the sender thread. Safe to call twice. In a
        process forked from the producer's it returns at once and touches nothing. An
        open transaction is aborted first (as Kafka's producer does at a clean close)."""
        if self._pid != _fork._pid:
            return
        if self._txn_state in (_IN_TRANSACTION, _ABORTABLE, _ABORTING) and \
                not self._accumulator.closed:
            try:
                self.abort_transaction(timeout)
            except LogkitError as exc:     # closing goes on: the coordinator's timeout
                log.warning("closing a producer of transactional id %r: aborting its "
                            "open transaction failed: %s", self._transactional_id, exc)
        if not self._accumulator.close():
            return
        self._slow = True               # send() checks for a close on the general path
        if _CSender is not None and isinstance(self.send, _CSender):
            self.send.slow = 1
        try:
            self.flush(timeout)
        finally:
            if self._durable_waiter is not None:
                self._durable_waiter.close()
            if self._ack_waiter is not None:
                self._ack_waiter.close()
        if self._sender is not threading.current_thread():
            self._sender.join(timeout=10)

    def __enter__(self) -> "Producer":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def partitions_for(self, topic: str) -> set[int]:
        """The partition numbers of `topic` (auto-created if the broker allows), as
        the topic record has them now."""
        state = self._state(topic)
        self._learn_partitions(topic)
        return set(range(state.count))

    # ---- idempotence ---------------------------------------------------------------------

    def _identity(self, topic: str, partition: int) -> dict[str, Any]:
        """The producer fields of the next batch for a partition (none for a producer
        that is not idempotent). Called by the one thread appending that partition."""
        if not self._idempotent:
            return {}
        if self._producer_id < 0:
            self._init_idempotent()
        return {"producer_id": self._producer_id, "producer_epoch": self._producer_epoch,
                "base_sequence": self._sequences.get((topic, partition), 0),
                "transactional": self._transactional_id is not None}

    def _init_idempotent(self) -> None:
        """A producer id for an idempotent producer, at its first append (Kafka asks
        the coordinator for one before its first send)."""
        if self._transactional_id is not None:
            raise InvalidTxnStateError("call init_transactions() before sending")
        with self._id_lock:
            if self._producer_id < 0:
                pid, epoch = self._broker.transaction_coordinator.init_producer_id(None)
                self._producer_epoch = epoch
                self._producer_id = pid

    def _reset_producer_id(self) -> None:
        """The log refused a batch's sequence (the producer's numbering and the log's
        disagree): the records of that batch fail with the error, and the producer
        takes a new id at its next append, its sequences starting again at 0 (Kafka's
        idempotent producer resets its id the same way)."""
        with self._id_lock:
            if self._producer_id >= 0:
                log.warning("producer %d: the log refused a batch as out of sequence; "
                            "taking a new producer id", self._producer_id)
                self._producer_id = self._producer_epoch = -1
                self._sequences.clear()

    def _advance(self, topic: str, partition: int, count: int) -> None:
        key = (topic, partition)
        self._sequences[key] = (self._sequences.get(key, 0) + count) & _SEQUENCE_MASK

    @property
    def producer_id(self) -> int:
        """This producer's id (-1 before its first append or init_transactions())."""
        return self._producer_id

    @property
    def producer_epoch(self) -> int:
        return self._producer_epoch

    # ---- transactions ------------------------------------------------------------------

    def _check_state(self, call: str, allowed: tuple[str, ...]) -> None:
        """Raise for a transactional call the state does not allow: ProducerFencedError
        once fenced, InvalidTxnStateError otherwise (the failed send's error as cause
        in the abortable state)."""
        if self._pid != _fork._pid:
            _fork.check_owner(self._pid, "this producer")
        if self._transactional_id is None:
            raise InvalidTxnStateError(f"{call}() needs a transactional producer "
                                       "(broker.producer(transactional_id=...))")
        state = self._txn_state
        if state in allowed:
            return
        if state == _ABORTABLE and call == "commit_transaction":
            raise TransactionAbortedError(
                f"the transaction of {self._transactional_id!r} cannot commit: a send "
                f"failed ({self._txn_error}); call abort_transaction()") \
                from self._txn_error
        if state == _FENCED:
            raise ProducerFencedError(
                f"producer of transactional id {self._transactional_id!r} was fenced "
                "(another producer called init_transactions() with this id, or its "
                "transaction timed out); close it") from self._txn_error
        hint = {_UNINITIALIZED: "call init_transactions() first",
                _READY: "no transaction is open: call begin_transaction() first",
                _IN_TRANSACTION: "a transaction is already open",
                _COMMITTING: "the transaction is being committed",
                _ABORTING: "the transaction is being aborted",
                _ABORTABLE: "a send of this transaction failed: abort_transaction()"}
        raise InvalidTxnStateError(f"cannot {call}() in state {state}: "
                                   f"{hint[state]}") from self._txn_error

    def _coordinator_call(self, call: Callable[..., Any], *args: Any,
                          **options: Any) -> Any:
        """A coordinator call with this producer's id and epoch; a fence marks the
        producer fenced."""
        try:
            return call(self._transactional_id, self._producer_id, self._producer_epoch,
                        *args, **options)
        except ProducerFencedError as exc:
            self._txn_states.clear()
            self._txn_state, self._txn_error = _FENCED, exc
            raise

    def _add_partition(self, topic: str, partition: int, count: int,
                       states: tuple[str, ...]) -> None:
        """Register a partition with the open transaction before its first record is
        queued (Kafka's AddPartitionsToTxn), so no batch reaches the log unannounced.
        A topic of at most TXN_WHOLE_TOPIC_PARTITIONS partitions is registered whole at
        its first send (one durable coordinator write instead of one per partition;
        a partition with no record of the transaction gets no marker)."""
        with self._register_lock:
            if (topic, partition) in self._txn_partitions:
                return
            self._check_state("send", states)
            whole = 0 < count <= TXN_WHOLE_TOPIC_PARTITIONS      # 0: this one only
            numbers = range(count) if whole else (partition,)
            wanted = [(topic, n) for n in numbers if (topic, n) not in self._txn_partitions]
            try:
                self._coordinator_call(self._broker.transaction_coordinator.add_partitions,
                                       [TopicPartition(t, n) for t, n in wanted])
            except ProducerFencedError:
                raise
            except LogkitError as exc:
                # The send raises, and the transaction it belonged to can only be
                # aborted now (Kafka's abortable error): a commit must not make the
                # transaction's other records visible.
                self._txn_states.clear()
                self._txn_state, self._txn_error = _ABORTABLE, exc
                raise
            self._txn_partitions.update(wanted)
            self._txn_begun_at_coordinator = True
            state = self._states.get(topic)
            if whole and state is not None and state.count == count:
                self._txn_states[topic] = state      # the compiled path may take it now

    def _verify_first_write(self, topic: str, number: int, partition: Any) -> None:
        """After the transaction's first batch on a partition is stored: is the
        transaction still this producer's? A fence (another producer's
        init_transactions(), the timeout) that came between registering the partition
        and this append wrote its ABORT marker before our batch, which then opened a
        transaction nobody would end, holding the partition's LSO. Then this producer
        ends it itself with an ABORT marker and raises ProducerFencedError for the
        batch. (Kafka closes the same gap by verifying at the partition, KIP-890.)"""
        key = (topic, number)
        if key in self._txn_written:
            return
        self._txn_written.add(key)
        tp = TopicPartition(topic, number)
        if not self._broker.transaction_coordinator.add_partitions(
                self._transactional_id, self._producer_id, self._producer_epoch, [tp],
                verify_only=True):
            return
        try:
            partition.append_control(self._producer_id, self._producer_epoch,
                                     commit=False)
        except LogkitError as exc:       # the fence's marker came after all: it is ended
            log.debug("aborting %s-%d after a fence: %s", topic, number, exc)
        raise ProducerFencedError(
            f"transactional id {self._transactional_id!r} was fenced while this batch was "
            f"appended to {topic}-{number}; it was aborted")

    def _transaction_failed(self, batch: Batch) -> None:
        """A batch of the transaction failed (sender side): the transaction can only be
        aborted now; a refused epoch means the producer was fenced."""
        if batch.error is not None:
            errors = [batch.error]
        else:
            errors = [o for o in batch.outcomes.values() if isinstance(o, BaseException)]
        if not errors:
            return
        self._txn_states.clear()                 # the next send takes the checking path
        error = errors[0]
        if isinstance(error, (InvalidProducerEpochError, ProducerFencedError)):
            if not isinstance(error, ProducerFencedError):
                fenced = ProducerFencedError(
                    f"the log refused a batch of transactional id "
                    f"{self._transactional_id!r}: {error}")
                fenced.__cause__ = error
                if batch.error is not None:
                    batch.error = fenced
                else:
                    for row, outcome in list(batch.outcomes.items()):
                        if outcome is error:
                            batch.outcomes[row] = fenced
                error = fenced
            self._txn_state = _FENCED
        elif self._txn_state in (_IN_TRANSACTION, _COMMITTING):
            self._txn_state = _ABORTABLE
        self._txn_error = error

    def init_transactions(self, timeout: float | None = None) -> None:
        """Take the transactional id: fence every older producer of it (its epoch is
        bumped) and abort its open transaction. Once, before the first transaction."""
        self._check_state("init_transactions", (_UNINITIALIZED, _READY))
        with self._txn_lock:
            pid, epoch = self._broker.transaction_coordinator.init_producer_id(
                self._transactional_id, self.config["transaction_timeout_ms"])
            with self._id_lock:
                self._producer_id, self._producer_epoch = pid, epoch
                self._sequences.clear()          # a new epoch starts at sequence 0
            self._txn_state, self._txn_error = _READY, None

    def begin_transaction(self) -> None:
        """Open a transaction (local: the coordinator learns of it at the first send or
        send_offsets_to_transaction)."""
        with self._txn_lock:
            self._check_state("begin_transaction", (_READY,))
            self._txn_states.clear()
            self._txn_partitions = set()
            self._txn_written = set()
            self._txn_begun_at_coordinator = False
            self._txn_state, self._txn_error = _IN_TRANSACTION, None

    def send_offsets_to_transaction(self, offsets: Mapping[Any, Any],
                                    group_metadata: Any) -> None:
        """Commit the consumer's `offsets` ({TopicPartition: next offset, or (offset,
        metadata)}) with the transaction: visible to committed()/lag() at the commit,
        dropped by an abort. `group_metadata` is `consumer.group_metadata()` (its
        generation and member id are checked, KIP-447) or a group id."""
        with self._txn_lock:
            self._check_state("send_offsets_to_transaction", (_IN_TRANSACTION,))
            if isinstance(group_metadata, str):
                group_id, generation, member, instance = group_metadata, -1, "", None
            else:
                group_id = group_metadata.group_id
                generation = getattr(group_metadata, "generation_id", -1)
                member = getattr(group_metadata, "member_id", "") or ""
                instance = getattr(group_metadata, "group_instance_id", None)
            if not isinstance(offsets, Mapping):
                raise ArgumentTypeError(f"offsets must be a dict {{TopicPartition: "
                                        f"offset}}, got {offsets!r}")
            clean = {}
            for tp, value in offsets.items():
                tp = TopicPartition(*tp)
                if isinstance(value, tuple):          # (offset, metadata), OffsetAndMetadata
                    clean[tp] = (value[0], value[1] if len(value) > 1 else "")
                else:
                    clean[tp] = (value, "")
            coordinator = self._broker.transaction_coordinator
            if not self._txn_begun_at_coordinator:   # else the offsets add the group
                self._coordinator_call(coordinator.add_offsets, group_id)
                self._txn_begun_at_coordinator = True
            try:
                self._coordinator_call(coordinator.txn_offset_commit, group_id, clean,
                                       generation_id=generation, member_id=member,
                                       group_instance_id=instance)
            except (ConfigError, CommitFailedError) as exc:   # the transaction must abort
                self._txn_state, self._txn_error = _ABORTABLE, exc
                raise

    def commit_transaction(self, timeout: float | None = None) -> None:
        """Store every record sent in the transaction, then commit it (records and
        offsets become visible together). A failed send of the transaction raises here
        (the transaction must then be aborted); a fenced producer raises
        ProducerFencedError."""
        with self._txn_lock:
            self._check_state("commit_transaction", (_IN_TRANSACTION, _COMMITTING))
            self._leave_transaction(_COMMITTING)
            try:
                self.flush(timeout)
            except LogkitTimeoutError:          # not all stored yet: commit again later
                self._txn_state = _IN_TRANSACTION if self._txn_state == _COMMITTING \
                    else self._txn_state
                raise
            self._check_state("commit_transaction", (_COMMITTING,))
            if self._txn_begun_at_coordinator:
                self._coordinator_call(self._broker.transaction_coordinator.end_txn, True)
            self._txn_state = _READY

    def abort_transaction(self, timeout: float | None = None) -> None:
        """Abort the open transaction: its records stay in the log, hidden from
        read_committed readers by an ABORT marker; its offsets are dropped."""
        with self._txn_lock:
            self._check_state("abort_transaction", (_IN_TRANSACTION, _ABORTABLE, _ABORTING))
            self._leave_transaction(_ABORTING)
            try:
                self.flush(timeout)
            except LogkitTimeoutError:
                raise
            except LogkitError as exc:     # a failed batch is aborted with the rest
                log.debug("abort_transaction: flushing raised %s", exc)
            if self._txn_state == _FENCED:
                self._check_state("abort_transaction", ())
            if self._txn_begun_at_coordinator:
                self._coordinator_call(self._broker.transaction_coordinator.end_txn, False)
            self._txn_state, self._txn_error = _READY, None

    def _leave_transaction(self, state: str) -> None:
        """From now on sends are refused (InvalidTxnStateError), on either path: the
        compiled one finds no topic, the Python one the state."""
        with self._send_lock:
            self._txn_states.clear()
            if self._txn_state not in (_FENCED, _ABORTABLE) or state == _ABORTING:
                if self._txn_state != _FENCED:
                    self._txn_state = state

    @contextmanager
    def transaction(self) -> Iterator["Producer"]:
        """`with producer.transaction():` begins a transaction, commits it when the
        block ends, aborts it when the block raises (the exception then propagates)."""
        self.begin_transaction()
        try:
            yield self
        except BaseException as exc:
            try:
                self.abort_transaction()
            except LogkitError as abort_error:    # the block's error is the one to raise
                log.warning("aborting the transaction after %r failed: %s", exc,
                            abort_error)
            raise
        self.commit_transaction()

    def metrics(self) -> dict[str, int]:
        """A few accumulator gauges (Kafka's producer exposes many more)."""
        if self._pid != _fork._pid:
            _fork.check_owner(self._pid, "this producer")
        return self._accumulator.metrics()
