"""The producer: Kafka's `KafkaProducer` semantics over the embedded log.

Owns: the record accumulator (one open batch per partition), partition choice (Kafka's
murmur2 for keyed records, sticky or round-robin for null keys), batching by
`batch_size` and `linger_ms`, the bounded buffer (`buffer_memory`, `max_block_ms`), and
the futures that resolve to `RecordMetadata`.

How batches leave: a batch that reaches `batch_size` is appended at once by the thread
that filled it; a partial batch is appended by the background sender thread when it is
`linger_ms` old (with `linger_ms=0`, as soon as the sender thread runs, so records that
arrive meanwhile join the batch — Kafka's behaviour while a request is in flight), and
by `flush()` / `close()`. Appends go through `PartitionLog.append_batch`, so a batch is
one Kafka record batch, atomically visible to every process.

`acks`: 0 resolves futures without waiting (offset -1, as Kafka's client reports);
1 waits for the append; "all" (or -1) waits for the append and, with no replication
configured, means the same as 1 — the leader is the whole ISR.

Thread-safety: every public method may be called from any thread.
Invariant: each record's future resolves exactly once, with the offset it was stored at
or the error that kept it out; a record is never appended twice.
"""

from __future__ import annotations

import random
import threading
import time
from typing import Any, Callable

from .compression import codec_id, require
from .config import snake_to_kafka
from .errors import (ClosedError, ConfigError, LogkitError, LogkitTimeoutError,
                     RecordTooLargeError)
from .records import RECORDS_OFFSET, RecordMetadata, encode_batch, record_size_estimate

__all__ = ["Producer", "FutureRecordMetadata"]

# Keyword -> (default, validator). Kafka's producer names, snake_case, Kafka's defaults.
DEFAULTS: dict[str, Any] = {
    "acks": 1, "linger_ms": 0, "batch_size": 16384, "compression_type": None,
    "buffer_memory": 33554432, "max_block_ms": 60000, "max_request_size": 1048576,
    "key_serializer": None, "value_serializer": None, "partitioner": None,
    "client_id": "logkit-producer", "retries": 0, "request_timeout_ms": 30000,
    "enable_idempotence": False,
}
_KEY_CACHE_LIMIT = 100_000


class _Batch:
    """Records bound for one partition, appended together."""

    __slots__ = ("topic", "partition", "rows", "size", "created", "done", "base_offset",
                 "error", "callbacks", "producer", "ticket")

    def __init__(self, topic: str, partition: int, producer: "Producer") -> None:
        self.producer = producer
        self.topic = topic
        self.partition = partition
        self.rows: list[tuple] = []
        self.size = RECORDS_OFFSET
        self.created = time.monotonic()
        self.done = threading.Event()
        self.base_offset = -1
        self.error: BaseException | None = None
        self.callbacks: list[tuple[int, Callable | None, Callable | None]] = []
        self.ticket = -1              # its place in the partition's append order


class FutureRecordMetadata:
    """The future of one sent record (Kafka's FutureRecordMetadata)."""

    __slots__ = ("_batch", "_index", "_acks")

    def __init__(self, batch: _Batch, index: int, acks: Any) -> None:
        self._batch = batch
        self._index = index
        self._acks = acks

    def done(self) -> bool:
        return self._acks == 0 or self._batch.done.is_set()

    def result(self, timeout: float | None = None) -> RecordMetadata:
        """Block until the record is stored; RecordMetadata or the append's error."""
        batch = self._batch
        row = batch.rows[self._index]
        if self._acks == 0:
            return RecordMetadata(batch.topic, batch.partition, -1, row[3])
        if not batch.done.is_set():
            batch.producer._append_now(batch)        # the caller runs it: no hand-off
        if not batch.done.wait(timeout):
            raise LogkitTimeoutError(f"record not stored within {timeout} s")
        if batch.error is not None:
            raise batch.error
        return RecordMetadata(batch.topic, batch.partition, batch.base_offset + self._index,
                              row[3])

    get = result

    def exception(self, timeout: float | None = None) -> BaseException | None:
        if not self._batch.done.wait(timeout):
            raise LogkitTimeoutError(f"record not stored within {timeout} s")
        return self._batch.error

    def add_callback(self, fn: Callable[[RecordMetadata], Any]) -> "FutureRecordMetadata":
        return self._add(fn, None)

    def add_errback(self, fn: Callable[[BaseException], Any]) -> "FutureRecordMetadata":
        return self._add(None, fn)

    def _add(self, ok: Callable | None, err: Callable | None) -> "FutureRecordMetadata":
        batch = self._batch
        with _callback_lock:
            if not batch.done.is_set():
                batch.callbacks.append((self._index, ok, err))
                return self
        _run_callback(batch, self._index, ok, err)
        return self


_callback_lock = threading.Lock()
_time = time.time


def _coerce_bytes(data: Any) -> bytes | None:
    if data is None or type(data) is bytes:
        return data
    if isinstance(data, (bytes, bytearray, memoryview)):
        return bytes(data)
    raise TypeError(f"keys and values must be bytes (or set key_serializer / "
                    f"value_serializer), got {type(data).__name__}")


def _run_callback(batch: _Batch, index: int, ok: Callable | None, err: Callable | None) -> None:
    if batch.error is not None:
        if err is not None:
            err(batch.error)
    elif ok is not None:
        ok(RecordMetadata(batch.topic, batch.partition, batch.base_offset + index,
                          batch.rows[index][3]))


class Producer:
    """`broker.producer(acks=1, linger_ms=0, batch_size=16384, compression_type=None)`."""

    def __init__(self, broker: Any, **options: Any) -> None:
        unknown = set(options) - set(DEFAULTS)
        if unknown:
            raise ConfigError(f"unknown producer option(s) {sorted(unknown)}; known: "
                              f"{sorted(DEFAULTS)}")
        settings = {**DEFAULTS, **options}
        self._broker = broker
        self.config = settings
        acks = settings["acks"]
        if acks not in (0, 1, -1, "all", "0", "1", "-1"):
            raise ConfigError(f"acks must be 0, 1 or 'all', got {acks!r}")
        self._acks = 0 if acks in (0, "0") else 1
        for name in ("linger_ms", "batch_size", "buffer_memory", "max_block_ms",
                     "max_request_size"):
            value = settings[name]
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ConfigError(f"{name} ({snake_to_kafka(name)}) must be a non-negative "
                                  f"integer, got {value!r}")
        self._codec = codec_id(settings["compression_type"])
        require(self._codec)
        partitioner = settings["partitioner"]
        if partitioner not in (None, "sticky", "round_robin", "murmur2") \
                and not callable(partitioner):
            raise ConfigError("partitioner must be None, 'round_robin' or a callable "
                              "(key_bytes, all_partitions, available) -> partition")
        self._partitioner = partitioner
        self._linger_s = settings["linger_ms"] / 1000
        self._batch_size = max(settings["batch_size"], 1)
        self._key_serializer = settings["key_serializer"]
        self._value_serializer = settings["value_serializer"]
        self._serializing = self._key_serializer is not None or \
            self._value_serializer is not None
        self._buffer_memory = settings["buffer_memory"]
        self._max_record_bytes = settings["max_request_size"] - RECORDS_OFFSET
        self._lock = threading.Lock()
        self._space = threading.Condition(self._lock)
        self._wake = threading.Condition(self._lock)
        self._turn = threading.Condition(self._lock)
        self._tickets: dict[tuple[str, int], int] = {}     # next ticket per partition
        self._appended: dict[tuple[str, int], int] = {}    # next ticket to append
        self._open: dict[tuple[str, int], _Batch] = {}
        self._buffered = 0
        self._in_flight = 0
        self._sticky: dict[str, int] = {}
        self._round_robin: dict[str, int] = {}
        self._key_cache: dict[tuple[str, bytes], int] = {}
        self._topics: dict[str, Any] = {}
        self._closed = False
        self._sender = threading.Thread(target=self._run_sender, name="logkit-producer",
                                        daemon=True)
        self._sender.start()

    # ---- sending ---------------------------------------------------------------------

    def send(self, topic: str, value: Any = None, key: Any = None, *,
             partition: int | None = None, headers: Any = None,
             timestamp_ms: int | None = None, timestamp: int | None = None
             ) -> FutureRecordMetadata:
        """Queue a record; returns a future of its RecordMetadata. (The hot path of
        producing: kept flat on purpose; see benchmarks.)"""
        if self._closed:
            raise ClosedError("producer is closed")
        if self._serializing:
            if self._key_serializer is not None and key is not None:
                key = self._key_serializer(key)
            if self._value_serializer is not None and value is not None:
                value = self._value_serializer(value)
        if (key is not None and type(key) is not bytes) or \
                (value is not None and type(value) is not bytes):
            key, value = _coerce_bytes(key), _coerce_bytes(value)
        if timestamp_ms is None:
            timestamp_ms = int(_time() * 1000) if timestamp is None else timestamp
        size = 21 + (0 if key is None else len(key)) + (0 if value is None else len(value))
        if headers:
            headers = [(k, v) for k, v in headers]
            size = record_size_estimate(key, value, headers)
        if size > self._max_record_bytes:
            raise RecordTooLargeError(f"record of about {size} bytes exceeds "
                                      f"max_request_size={self.config['max_request_size']}")
        handle = self._topics.get(topic)
        if handle is None:
            handle = self._topic(topic)
        if partition is None:
            if key is not None and self._partitioner is None:
                partition = self._key_cache.get((topic, key))
                if partition is None:
                    partition = self._choose(handle, key)
            else:
                partition = self._choose(handle, key)
        elif isinstance(partition, bool) or not isinstance(partition, int) \
                or not 0 <= partition < handle.num_partitions:
            raise LogkitError(f"topic {topic!r} has no partition {partition!r}")
        slot = (topic, partition)
        full = None
        with self._lock:
            if self._buffered + size > self._buffer_memory:
                self._wait_for_space(size)
            batch = self._open.get(slot)
            if batch is not None and batch.size + size > self._batch_size:
                full = self._close_batch(slot)
                batch = None
            if batch is None:
                batch = self._open[slot] = _Batch(topic, partition, self)
                self._wake.notify()
            rows = batch.rows
            future = FutureRecordMetadata(batch, len(rows), self._acks)
            rows.append((key, value, headers, timestamp_ms))
            batch.size += size
            self._buffered += size
            if batch.size >= self._batch_size:
                if full is not None:               # two batches closed by one send
                    self._lock.release()
                    try:
                        self._append(full)
                    finally:
                        self._lock.acquire()
                full = self._close_batch(slot)
        if full is not None:
            self._append(full)
        return future

    def _topic(self, name: str) -> Any:
        handle = self._topics.get(name)
        if handle is None:
            handle = self._topics[name] = self._broker.get_or_create_topic(name)
        return handle

    def _choose(self, topic: Any, key: bytes | None) -> int:
        count = topic.num_partitions
        name = topic.name
        if key is not None:
            if callable(self._partitioner):
                return self._partitioner(key, list(range(count)), list(range(count)))
            cached = self._key_cache.get((name, key))
            if cached is None:
                if len(self._key_cache) >= _KEY_CACHE_LIMIT:
                    self._key_cache.clear()
                cached = self._key_cache[(name, key)] = topic.partition_for(key)
            return cached
        if self._partitioner == "round_robin":
            nxt = self._round_robin.get(name, -1) + 1
            self._round_robin[name] = nxt
            return nxt % count
        sticky = self._sticky.get(name)
        if sticky is None or sticky >= count:
            sticky = self._sticky[name] = random.randrange(count)
        return sticky

    def _close_batch(self, slot: tuple[str, int]) -> _Batch:
        """Take a batch out of the accumulator (lock held); moves the sticky choice."""
        batch = self._open.pop(slot)
        self._in_flight += 1
        batch.ticket = self._tickets.get(slot, 0)
        self._tickets[slot] = batch.ticket + 1
        topic, partition = slot
        if self._sticky.get(topic) == partition:
            count = self._topics[topic].num_partitions
            if count > 1:
                choice = random.randrange(count - 1)
                self._sticky[topic] = choice + (choice >= partition)
        return batch

    def _append_now(self, batch: _Batch) -> None:
        """Append `batch` in this thread if it is still waiting in the accumulator."""
        slot = (batch.topic, batch.partition)
        with self._lock:
            if self._open.get(slot) is not batch:
                return                      # already taken by the sender or a flush
            self._close_batch(slot)
        self._append(batch)

    def _wait_for_space(self, size: int) -> None:
        deadline = time.monotonic() + self.config["max_block_ms"] / 1000
        while self._buffered + size > self.config["buffer_memory"] and self._buffered:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise LogkitTimeoutError(
                    f"buffer_memory={self.config['buffer_memory']} full for "
                    f"max_block_ms={self.config['max_block_ms']}")
            self._wake.notify()
            self._space.wait(remaining)

    def _append(self, batch: _Batch) -> None:
        """Append one batch to its partition and resolve its futures (no lock held).
        Batches of one partition are appended in the order they were closed, whichever
        thread appends them, so records keep their send order within a partition."""
        slot = (batch.topic, batch.partition)
        with self._lock:
            while self._appended.get(slot, 0) != batch.ticket:
                self._turn.wait()
        try:
            log = self._topics[batch.topic].partition(batch.partition)._log
            encoded = encode_batch(batch.rows, codec=self._codec)
            batch.base_offset = log.append_batch(encoded)
        except BaseException as exc:   # the error belongs to the records' futures
            batch.error = exc
        with _callback_lock:
            batch.done.set()
            callbacks, batch.callbacks = batch.callbacks, []
        for index, ok, err in callbacks:
            try:
                _run_callback(batch, index, ok, err)
            except Exception:        # a user callback must not break the producer
                pass
        with self._lock:
            self._buffered -= batch.size - RECORDS_OFFSET
            self._in_flight -= 1
            self._appended[slot] = batch.ticket + 1
            self._turn.notify_all()
            self._space.notify_all()

    # ---- the sender thread -----------------------------------------------------------

    def _run_sender(self) -> None:
        while True:
            with self._lock:
                while not self._open and not self._closed:
                    self._wake.wait()
                if self._closed and not self._open:
                    return
                now = time.monotonic()
                due = [slot for slot, b in self._open.items()
                       if now - b.created >= self._linger_s or self._closed]
                if not due:
                    oldest = min(b.created for b in self._open.values())
                    self._wake.wait(max(0.0, oldest + self._linger_s - now))
                    continue
                ready = [self._close_batch(slot) for slot in due]
            for batch in ready:
                self._append(batch)

    # ---- lifecycle -------------------------------------------------------------------

    def flush(self, timeout: float | None = None) -> None:
        """Append every queued record now and wait until all are stored."""
        with self._lock:
            ready = [self._close_batch(slot) for slot in list(self._open)]
        for batch in ready:
            self._append(batch)
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            while self._in_flight:
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    raise LogkitTimeoutError("flush timed out")
                self._space.wait(remaining if remaining is not None else 0.1)

    def close(self, timeout: float | None = None) -> None:
        """Flush, then stop the sender thread. Safe to call twice."""
        if self._closed:
            return
        self.flush(timeout)
        with self._lock:
            self._closed = True
            self._wake.notify_all()
        if self._sender is not threading.current_thread():
            self._sender.join(timeout=10)

    def __enter__(self) -> "Producer":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def partitions_for(self, topic: str) -> set[int]:
        return set(range(self._topic(topic).num_partitions))
