"""asyncio clients over the embedded broker, shaped like aiokafka's (docs/design.md §17).

Owns: `AIOProducer` and `AIOConsumer`, thin asyncio fronts over the plain `Producer` and
`Consumer` (logkit/producer.py, logkit/consumer.py), and nothing of their semantics.

Invariant: the event loop never waits on a file, LMDB or a lock held across either (the
one lock it may take is the producer accumulator's, to seal a full batch; its holders
keep it for bookkeeping only, never across I/O or a wait). Each client owns one
worker thread, started by `start()` and joined by `stop()`, that makes, uses and closes
its plain client; the loop hands it work through a `queue.SimpleQueue` (a put never
blocks) and the worker answers with `loop.call_soon_threadsafe`. Every call of a plain
client happens on its worker, in the order the loop made them — but one: the loop adds
a record to the plain producer's open batch itself when that cannot wait (below).

Producer: `send()` puts the record straight into an open batch through the plain
producer's non-blocking send (`Producer._nonblocking_send`: the compiled fast path,
lock-free; a record that fills or does not fit the open batch seals it under the
accumulator's lock and opens the next, and the sealed batch's append is a job for the
worker) while the worker has nothing queued or in hand; otherwise (no room in
`buffer_memory`, a topic not used yet, headers or a timestamp, a transactional producer
or serializers, no compiled path) it appends the record to a queue
the worker drains in order into the plain producer's `send`, and every later record
follows it there until the worker has handled them all, so per partition the records
keep their send order whichever path each took. Either way it returns an
`asyncio.Future` the loop resolves when the plain future does (one callback per batch:
completions come back in bunches, one loop wake-up for many records).
`buffer_memory` bounds the bytes sent and not yet resolved; a `send()` that finds no
room waits, then raises `LogkitTimeoutError` after `max_block_ms`, as Kafka's.

Consumer: the worker fetches only when the loop asks (a waiter, or a buffer running
low), calling `poll(0)` and, when nothing came, sleeping in `Doorbell.wait` — the
cross-process doorbell, never a timer — until an append or the next job. Fetched records
land in the loop-side buffer whatever became of the call that asked for them, and a
getone()/getmany() takes records from that buffer without awaiting in between, so a
cancelled call has taken nothing: nothing is lost or delivered twice. Positions seen by
the loop (`position()`, `commit()` with no offsets) are the plain consumer's less the
buffered records: the next record the loop has not delivered. `seek()` drops the
partition's buffered records and any fetched before the seek reached the worker.

Lifecycle: `stop()` wakes every waiter with `ClosedError` (ending `async for`), then
closes the plain client on its worker and waits, without blocking the loop, for the
thread to end; afterwards no thread or task of the client is left.
"""

from __future__ import annotations

import abc
import asyncio
import collections
import logging
import queue
import threading
import time
from functools import partial
from typing import Any, AsyncIterator, Callable, Iterable, Mapping

from ._threads import start_thread
from .errors import ClosedError, ConfigError, IllegalStateError, LogkitError, LogkitTimeoutError
from .records import Record, RecordMetadata
from .topic import TopicPartition

__all__ = ["AIOProducer", "AIOConsumer"]

log = logging.getLogger(__name__)

RECORD_OVERHEAD_BYTES = 70       # a record's size estimate for the send buffer's count
UNKNOWN_VALUE_BYTES = 64         # a value that is not bytes (a serializer will make it)
JOIN_POLL_S = 0.001              # stop(): how often the loop looks at an ending thread
JOIN_LIMIT_S = 30.0              # stop(): the longest it waits for the worker to end
# One loop callback resolves at most this many sends' futures, so that a burst of
# completions never holds the loop for long (the rest follow in the next callbacks).
COMPLETIONS_PER_CALLBACK = 1000
# A worker gives up the GIL (sleep(0)) after this many sends or one fetch: a loop thread
# waiting for it gets it at once instead of after Python's switch interval (5 ms).
YIELD_EVERY = 1024
_STOP = object()


def _resolve(future: asyncio.Future, result: Any, error: BaseException | None) -> None:
    """Settle `future` on the loop thread (nothing if it was cancelled)."""
    if future.done():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)


class _Worker(abc.ABC):
    """One thread running jobs for one client, in order. `submit()` is called on the
    loop; `call()` is its awaitable form. Subclasses run `run()` on the thread."""

    def __init__(self, name: str) -> None:
        self.jobs: queue.SimpleQueue = queue.SimpleQueue()
        self.loop: asyncio.AbstractEventLoop | None = None
        self.thread: threading.Thread | None = None
        self.done: asyncio.Future | None = None
        self.name = name
        self.seq = 0                    # jobs submitted (loop side)

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.done = loop.create_future()
        self.thread = threading.Thread(target=self._main, name=self.name, daemon=True)
        start_thread(self.thread, f"the {self.name} thread")

    def _main(self) -> None:
        try:
            self.run()
        except BaseException as exc:     # a bug: say so, and let stop() end
            log.exception("%s ended with an error", self.name)
            error: BaseException | None = exc
        else:
            error = None
        loop, done = self.loop, self.done
        assert loop is not None and done is not None
        while True:                      # jobs left (a worker that died): answer them
            try:
                job = self.jobs.get_nowait()
            except queue.Empty:
                break
            if isinstance(job, tuple) and job[2] is not None:
                self.reply(job[2], None, error or ClosedError(f"{self.name} ended"))
        try:
            loop.call_soon_threadsafe(_resolve, done, None, error)
        except RuntimeError:             # the loop is closed: nobody waits
            pass

    @abc.abstractmethod
    def run(self) -> None:
        """The worker thread's loop: take jobs until the end marker (each subclass)."""

    def reply(self, future: asyncio.Future, result: Any, error: BaseException | None
              ) -> None:
        """From the worker: settle a loop future."""
        assert self.loop is not None
        try:
            self.loop.call_soon_threadsafe(_resolve, future, result, error)
        except RuntimeError:             # loop closed
            pass

    def submit(self, fn: Callable[..., Any], *args: Any) -> asyncio.Future:
        assert self.loop is not None
        future = self.loop.create_future()
        self.seq += 1
        self.jobs.put((fn, args, future))
        return future

    def stop_blocking(self, close: Callable[[], Any], timeout_s: float = JOIN_LIMIT_S
                      ) -> None:
        """With no loop running (a fixture's teardown after asyncio.run): run `close`
        on the worker, end it and join it, blocking."""
        thread = self.thread
        if thread is None or not thread.is_alive():
            return
        self.jobs.put((close, (), None))
        self.jobs.put(_STOP)
        thread.join(timeout_s)
        self.thread = None

    async def join(self) -> None:
        """Wait (without blocking the loop) for the thread to end."""
        if self.thread is None or self.done is None:
            return
        self.jobs.put(_STOP)
        try:
            await asyncio.shield(self.done)
        except BaseException:           # its error was logged; the thread has ended
            pass
        deadline = time.monotonic() + JOIN_LIMIT_S
        while self.thread.is_alive() and time.monotonic() < deadline:
            await asyncio.sleep(JOIN_POLL_S)    # the thread's last instructions
        self.thread = None


def _run_job(worker: _Worker, job: Any) -> None:
    fn, args, future = job
    try:
        result = fn(*args)
    except BaseException as exc:         # the loop's caller gets it
        if future is None:
            log.warning("%s: %s raised %s", worker.name, fn, exc)
        else:
            worker.reply(future, None, exc)
    else:
        if future is not None:
            worker.reply(future, result, None)


# ---- producer ----------------------------------------------------------------------


def _join(groups: dict[Any, list], future: asyncio.Future, pending: Any, size: int,
          marks_ok: bool) -> bool:
    """Add a sent record to its batch's group: [bytes, a plain future of the batch,
    then (asyncio future, mark) per record], where the mark is the record's place in
    the batch's rows (an int: no object kept per record, so the garbage collector
    has less to walk) or, when that is not known, the plain future. True when the
    group is new."""
    index = pending._index
    mark = index if index >= 0 and marks_ok else pending
    group = groups.get(pending._batch)
    if group is None:
        groups[pending._batch] = [size, pending, future, mark]
        return True
    group[0] += size
    group.append(future)
    group.append(mark)
    return False


class _ProducerWorker(_Worker):
    def __init__(self, owner: "AIOProducer") -> None:
        super().__init__("logkit-aio-producer")
        self.owner = owner
        self.sends: collections.deque = collections.deque()    # loop -> worker, in order
        self.kicked = False           # a wake-up is in the queue (loop side sets it)
        self.done_rows: collections.deque = collections.deque()   # worker -> loop
        self.drain_scheduled = False
        self.sent = 0                 # items of `sends` handled (worker side only)

    def kick(self) -> None:
        if not self.kicked:
            self.kicked = True
            self.jobs.put(None)

    def run(self) -> None:
        owner = self.owner
        jobs = self.jobs
        sends = self.sends
        while True:
            job = jobs.get()
            self.kicked = False
            self._drain_sends(owner.producer, sends)
            if job is None:
                continue
            if job is _STOP:
                break
            _run_job(self, job)
        self._drain_sends(owner.producer, sends)

    def _drain_sends(self, producer: Any, sends: collections.deque) -> None:
        """Hand every queued send to the plain producer, in order. Completions are
        watched per batch, not per record: a batch resolves all its records at once, so
        one callback on the batch's last record of this drain reports them all."""
        if not sends:
            return
        popleft = sends.popleft
        send = None if producer is None else producer.send
        groups: dict[Any, list] = {}
        countdown = YIELD_EVERY
        while sends:
            item = popleft()
            if callable(item):            # a call ordered among the sends
                self._watch(groups)
                groups = {}
                try:
                    item()
                finally:
                    self.sent += 1
                continue
            future, topic, value, key, partition, timestamp_ms, headers, size = item
            try:
                if partition is None and headers is None and timestamp_ms is None:
                    pending = send(topic, value, key)     # the plain hot path's call
                else:
                    pending = send(topic, value, key, partition=partition,
                                   headers=headers, timestamp_ms=timestamp_ms)
            except BaseException as exc:
                self.sent += 1
                self._finish(future, size, None, exc)
                continue
            self.sent += 1
            countdown -= 1
            if not countdown:              # let the loop thread take the GIL now and
                countdown = YIELD_EVERY    # then: it waits no switch interval for it
                time.sleep(0)
            _join(groups, future, pending, size, self.owner._marks_ok)
        self._watch(groups)

    def _watch(self, groups: dict[Any, list]) -> None:
        for group in groups.values():
            first = group[1]
            report = partial(self._report, group)
            first.add_callback(report)
            first.add_errback(report)

    def _report(self, group: list, _outcome: Any) -> None:
        """Any thread (the one that appended the batch): queue its records' outcomes,
        one row for the group. A batch stored whole (the common case) is reported
        from its fields and each record's place in it; anything else (an error, a
        split batch, a future made in Python) asks the batch or the future."""
        batch = group[1]._batch
        futures, marks = group[2::2], group[3::2]
        results: list = []
        errors: list | None = None
        if batch.error is None and batch.outcomes is None:
            name, partition, base = batch.state.name, batch.partition, batch.base_offset
            stamp, count = batch.timestamp_ms, len(batch.rows)
            append = results.append
            for mark in marks:
                if type(mark) is int:
                    if mark >= count:
                        break
                    append(RecordMetadata(name, partition, base + mark, stamp))
                    continue
                outcome = mark.exception()    # done: no wait (a row made in Python)
                if outcome is not None:
                    break
                append(mark.result())
        if len(results) < len(marks):            # the slow way, record by record
            results, errors = [], []
            for mark in marks:
                try:
                    if type(mark) is int:
                        outcome = batch.outcome(batch.rows[mark])
                        if isinstance(outcome, BaseException):
                            raise outcome
                    else:
                        outcome = mark.result()
                except BaseException as exc:
                    results.append(None)
                    errors.append(exc)
                else:
                    results.append(outcome)
                    errors.append(None)
        self.done_rows.append((group[0], futures, results, errors))
        self._schedule()

    def _finish(self, future: asyncio.Future, size: int, metadata: Any,
                error: BaseException | None) -> None:
        """Any thread (the worker, the plain producer's sender): queue a completion;
        one loop wake-up takes every completion queued before it runs."""
        self.done_rows.append((size, [future], [metadata], [error]))
        self._schedule()

    def _schedule(self) -> None:
        if not self.drain_scheduled:
            self.drain_scheduled = True
            assert self.loop is not None
            try:
                self.loop.call_soon_threadsafe(self.owner._completions)
            except RuntimeError:         # loop closed
                pass


class _AIOClient(abc.ABC):
    """What the two asyncio clients share: start() on the running loop (the worker
    thread started, the plain client made by `_open()`, stop() on any failure),
    `async with`, the started/stopped check, and a stop from outside any loop. A
    subclass names its plain client (`_plain`) and makes it in `_open`."""

    _name = "AIO client"
    _worker: _Worker
    _started: bool
    _closed: bool
    _loop: Any

    @property
    @abc.abstractmethod
    def _plain(self) -> Any:
        """The plain client (None until `_open` made it)."""

    @abc.abstractmethod
    async def _open(self) -> None:
        """Make the plain client on the worker and read what the client needs of it."""

    @abc.abstractmethod
    async def stop(self) -> None:
        """Close the plain client and end the worker; safe twice."""

    async def start(self) -> None:
        if self._started:
            return
        if self._closed:
            raise ClosedError(f"{self._name} is stopped")
        self._loop = asyncio.get_running_loop()
        self._worker.start(self._loop)
        self._started = True
        try:
            await self._open()
        except BaseException:
            await self.stop()
            raise

    async def __aenter__(self) -> Any:
        await self.start()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.stop()

    def _check(self) -> None:
        if self._closed:
            raise ClosedError(f"{self._name} is stopped")
        if not self._started or self._plain is None:
            raise IllegalStateError(f"{self._name} is not started: await start() first")

    def _stop_blocking(self) -> None:
        """Stop from outside any event loop (a fixture whose test forgot stop())."""
        self._closed = True
        if self._plain is not None:
            self._worker.stop_blocking(self._plain.close)


class AIOProducer(_AIOClient):
    """`AIOProducer(broker, **producer_config)`: `await start()`, `await send(...)` ->
    asyncio.Future of RecordMetadata, `await stop()` (or `async with`). The options are
    the plain producer's (`broker.producer(...)`)."""

    def __init__(self, broker: Any, **producer_config: Any) -> None:
        self._broker = broker
        self._config = dict(producer_config)
        self.producer: Any = None            # the plain Producer, made on the worker
        self._worker = _ProducerWorker(self)
        self._started = False
        self._closed = False
        self._buffer_bytes = 0               # sent, not resolved
        self._buffer_memory = 33554432
        self._max_block_s = 60.0
        self._room: list[asyncio.Future] = []     # sends waiting for buffer room
        self._loop: Any = None
        self._kick_pending = False           # a call_soon(_kick) is scheduled
        # The direct path (see send()): the plain producer's non-blocking send, the
        # items ever handed to the worker (loop side; the worker counts those it
        # handled in `sent`), and the direct sends' futures by batch, watched at the
        # end of the loop's current callback (`_watch_pending`).
        self._direct: Any = None
        self._marks_ok = True                # acks != 0: a record's place names its offset
        self._handed = 0
        self._groups: dict[Any, list] = {}
        self._watch_pending = False

    def __repr__(self) -> str:
        return f"AIOProducer({self._config!r})"

    _name = "AIOProducer"

    @property
    def _plain(self) -> Any:
        return self.producer

    async def _open(self) -> None:
        self.producer = await self._worker.submit(
            lambda: self._broker.producer(**self._config))
        settings = self.producer.config
        self._direct = self.producer._nonblocking_send()
        self._marks_ok = settings["acks"] != 0
        self._buffer_memory = settings["buffer_memory"]
        self._max_block_s = settings["max_block_ms"] / 1000
        if settings.get("transactional_id") is not None:
            await self._call(self.producer.init_transactions)

    async def send(self, topic: str, value: Any = None, key: Any = None,
                   partition: int | None = None, timestamp_ms: int | None = None,
                   headers: Any = None) -> asyncio.Future:
        """Queue a record; returns an asyncio.Future of its RecordMetadata (or its
        error). Waits while `buffer_memory` is full, at most `max_block_ms`.

        Two paths, one order: while the worker has nothing queued or in hand, the
        record goes straight into an open batch with room (the plain producer's
        non-blocking send, on the loop: no lock, file or wait); anything else — a
        batch to seal, a topic not used yet, headers — and every record after it until
        the worker has handled them all, goes to the worker. So the records of one
        AIOProducer keep their send order per partition whichever path each took."""
        if self._closed or self.producer is None:
            self._check()                          # raises
        if type(value) is bytes:
            size = RECORD_OVERHEAD_BYTES + len(value)
        else:
            size = RECORD_OVERHEAD_BYTES + (0 if value is None else UNKNOWN_VALUE_BYTES)
        if type(key) is bytes:
            size += len(key)
        if self._buffer_bytes + size > self._buffer_memory and self._buffer_bytes:
            await self._wait_for_room(size)
        worker = self._worker
        direct = self._direct
        if direct is not None and self._handed == worker.sent and headers is None and \
                timestamp_ms is None and not self._closed:
            pending = direct(topic, value, key) if partition is None else \
                direct(topic, value, key, partition=partition)
            if type(pending) is tuple:         # it sealed a batch: the worker appends it
                pending, drain = pending
                if drain is not None:
                    if pending is None:        # before the record: it frees room
                        self._handed += 1
                        worker.sends.append(drain)
                    else:                      # a job: the direct path stays open
                        worker.jobs.put((drain, (), None))
            if pending is not None:
                future = self._loop.create_future()
                self._buffer_bytes += size
                if _join(self._groups, future, pending, size, self._marks_ok) and \
                        not self._watch_pending:
                    self._watch_pending = True
                    self._loop.call_soon(self._watch_direct)
                return future
        future = self._loop.create_future()
        self._buffer_bytes += size
        self._handed += 1
        worker.sends.append((future, topic, value, key, partition, timestamp_ms,
                             headers, size))
        if not self._kick_pending:
            # wake the worker once the calling task yields: it then takes every send
            # made until then in one go, instead of contending for the GIL per send
            self._kick_pending = True
            worker.loop.call_soon(self._kick)         # type: ignore[union-attr]
        return future

    def _kick(self) -> None:
        self._kick_pending = False
        self._worker.kick()

    def _watch_direct(self) -> None:
        """On the loop: have the worker watch the batches the direct sends went into
        since the last call (one callback per batch reports all its records). The
        worker registers them: a batch already appended runs its report at once, and
        that work (a RecordMetadata per record) stays off the loop."""
        self._watch_pending = False
        groups, self._groups = self._groups, {}
        self._worker.jobs.put((self._worker._watch, (groups,), None))

    async def send_and_wait(self, topic: str, value: Any = None, key: Any = None,
                            partition: int | None = None, timestamp_ms: int | None = None,
                            headers: Any = None) -> Any:
        future = await self.send(topic, value, key, partition, timestamp_ms, headers)
        return await future

    async def _wait_for_room(self, size: int) -> None:
        deadline = time.monotonic() + self._max_block_s
        loop = asyncio.get_running_loop()
        while self._buffer_bytes + size > self._buffer_memory and self._buffer_bytes:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise LogkitTimeoutError(
                    f"no room in buffer_memory={self._buffer_memory} within "
                    f"max_block_ms={int(self._max_block_s * 1000)}")
            waiter = loop.create_future()
            self._room.append(waiter)
            try:
                await asyncio.wait_for(waiter, remaining)
            except asyncio.TimeoutError:
                continue
            finally:
                if waiter in self._room:
                    self._room.remove(waiter)
            self._check()

    def _completions(self) -> None:
        """On the loop: resolve every future whose record is done (a row per batch)."""
        worker = self._worker
        rows = worker.done_rows
        popleft = rows.popleft
        freed = 0
        resolved = 0
        while True:
            if not rows:
                worker.drain_scheduled = False     # then look again: a row queued
                if not rows:                       # before this saw the flag set
                    break
                worker.drain_scheduled = True
            if resolved >= COMPLETIONS_PER_CALLBACK:    # the rest after other callbacks
                worker.loop.call_soon(self._completions)   # type: ignore[union-attr]
                break
            size, futures, results, errors = popleft()
            freed += size
            resolved += len(futures)
            if errors is None:
                for future, metadata in zip(futures, results):
                    if not future.done():
                        future.set_result(metadata)
                continue
            for future, metadata, error in zip(futures, results, errors):
                if future.done():
                    continue
                if error is not None:
                    future.set_exception(error)
                else:
                    future.set_result(metadata)
        self._buffer_bytes -= freed
        if self._room:
            for waiter in self._room:
                if not waiter.done():
                    waiter.set_result(None)

    async def _call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run `fn(*args)` on the worker after every record sent before it."""
        worker = self._worker
        future = worker.loop.create_future()        # type: ignore[union-attr]

        def job() -> None:
            try:
                result = fn(*args)
            except BaseException as exc:
                worker.reply(future, None, exc)
            else:
                worker.reply(future, result, None)
        self._handed += 1
        worker.sends.append(job)
        worker.kick()
        return await future

    async def flush(self, timeout: float | None = None) -> None:
        """Wait until every record sent so far is stored (or failed)."""
        self._check()
        await self._call(self.producer.flush, timeout)

    async def partitions_for(self, topic: str) -> set[int]:
        self._check()
        return await self._call(self.producer.partitions_for, topic)

    # ---- transactions (docs/design.md §15) -----------------------------------------

    async def begin_transaction(self) -> None:
        self._check()
        await self._call(self.producer.begin_transaction)

    async def commit_transaction(self) -> None:
        self._check()
        await self._call(self.producer.commit_transaction)

    async def abort_transaction(self) -> None:
        self._check()
        await self._call(self.producer.abort_transaction)

    async def send_offsets_to_transaction(self, offsets: Mapping[Any, Any],
                                          group_id: Any) -> None:
        self._check()
        await self._call(self.producer.send_offsets_to_transaction, offsets, group_id)

    def transaction(self) -> "_Transaction":
        """`async with producer.transaction():` begins a transaction, commits it when
        the block ends, aborts it when the block raises (the error propagates)."""
        return _Transaction(self)

    async def stop(self) -> None:
        """Store what was sent (flush), close the plain producer, end the worker.
        Safe twice. Sends waiting for room raise ClosedError."""
        if self._closed:
            return
        self._closed = True
        for waiter in self._room:
            if not waiter.done():
                waiter.set_exception(ClosedError("AIOProducer stopped"))
        if not self._started:
            return
        producer = self.producer
        if producer is not None:
            # queued with the end of the worker at once: a stop() cancelled while it
            # waits still closes the producer and ends the thread
            if self._watch_pending:     # before the close: its flush reports them
                self._watch_direct()
            closing = self._worker.loop.create_future()     # type: ignore[union-attr]
            self._handed += 1
            self._worker.sends.append(partial(_run_job, self._worker,
                                              (producer.close, (), closing)))
            self._worker.jobs.put(None)
            self._worker.jobs.put(_STOP)
            try:
                await closing
            except LogkitError as exc:
                log.warning("AIOProducer.stop: closing the producer raised %s", exc)
        await self._worker.join()
        while self._worker.done_rows:
            self._completions()
        sends = self._worker.sends
        while sends:                   # left by a worker that died: never handed over
            item = sends.popleft()
            if not callable(item) and not item[0].done():
                item[0].set_exception(ClosedError("AIOProducer stopped before the "
                                                  "record was sent"))


class _Transaction:
    def __init__(self, producer: AIOProducer) -> None:
        self._producer = producer

    async def __aenter__(self) -> AIOProducer:
        await self._producer.begin_transaction()
        return self._producer

    async def __aexit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is None:
            await self._producer.commit_transaction()
            return
        try:
            await self._producer.abort_transaction()
        except LogkitError as abort_error:      # the block's error is the one to raise
            log.warning("aborting the transaction after %r failed: %s", exc, abort_error)


# ---- consumer ----------------------------------------------------------------------


class _ConsumerWorker(_Worker):
    """Runs jobs and, while the loop asks for records, fetches them."""

    def __init__(self, owner: "AIOConsumer") -> None:
        super().__init__("logkit-aio-consumer")
        self.owner = owner
        self.fetching = False          # worker side: a fetch was asked for
        self.jobs_done = 0             # worker side: jobs run (the loop's `seq` order)

    def run(self) -> None:
        owner = self.owner
        jobs = self.jobs
        while True:
            try:
                job = jobs.get() if not self.fetching else jobs.get_nowait()
            except queue.Empty:
                job = None
                self._fetch_once(owner)
                continue
            if job is _STOP:
                break
            self.jobs_done += 1
            if job == "fetch":
                self.fetching = True
                continue
            _run_job(self, job)

    def _fetch_once(self, owner: "AIOConsumer") -> None:
        consumer = owner.consumer
        doorbell = owner._broker.doorbell
        seen = None if doorbell is None else doorbell.value()
        try:
            records = consumer.poll(0, owner._max_records)
        except BaseException as exc:
            self.fetching = False
            self._send(owner._fetched, None, None, self.jobs_done, exc)
            return
        if records:
            grouped: dict[TopicPartition, list[Record]] = {}
            for record in records:
                tp = TopicPartition(record.topic, record.partition)
                batch = grouped.get(tp)
                if batch is None:
                    grouped[tp] = [record]
                else:
                    batch.append(record)
            self.fetching = False
            self._send(owner._fetched, grouped, set(consumer.assignment()),
                       self.jobs_done, None)
            time.sleep(0)                 # the GIL to the loop (see YIELD_EVERY)
            return
        if doorbell is None or seen is None:
            time.sleep(0.005)             # a read-only broker: nobody rings
        else:
            doorbell.wait(seen, 0.005, owner._spin_s)

    def _send(self, fn: Callable[..., Any], *args: Any) -> None:
        assert self.loop is not None
        try:
            self.loop.call_soon_threadsafe(fn, *args)
        except RuntimeError:              # the loop is closed
            pass


class AIOConsumer(_AIOClient):
    """`AIOConsumer(broker, *topics, **consumer_config)`: `await start()`, then
    `await getone()`, `await getmany(timeout_ms=...)`, `async for record in consumer`;
    `await stop()` (or `async with`). The options are the plain consumer's
    (`broker.consumer(...)`)."""

    def __init__(self, broker: Any, *topics: str, **consumer_config: Any) -> None:
        self._broker = broker
        self._topics = topics
        self._config = dict(consumer_config)
        self.consumer: Any = None           # the plain Consumer, made on the worker
        self._worker = _ConsumerWorker(self)
        self._started = False
        self._closed = False
        self._max_records = 500
        self._spin_s = 0.0
        # fetched, not yet delivered, per partition in offset order
        self._buffer: dict[TopicPartition, collections.deque] = {}
        self._buffered = 0
        self._paused: set[TopicPartition] = set()
        self._assignment: set[TopicPartition] = set()
        # a partition seeked (or assigned anew) -> the job number of that call: records
        # fetched before the worker ran it are stale
        self._moved_at: dict[TopicPartition, int] = {}
        self._asked = False                 # a fetch is asked for and not answered
        self._waiters: list[asyncio.Future] = []
        self._error: BaseException | None = None
        self._subscribed: set[str] = set(topics)

    def __repr__(self) -> str:
        return f"AIOConsumer(topics={self._topics!r}, {self._config!r})"

    _name = "AIOConsumer"

    @property
    def _plain(self) -> Any:
        return self.consumer

    async def _open(self) -> None:
        self.consumer = await self._worker.submit(
            lambda: self._broker.consumer(*self._topics, **self._config))
        self._max_records = self.consumer.config["max_poll_records"]
        self._spin_s = self.consumer.config["poll_spin_us"] / 1e6

    async def _call(self, fn: Callable[..., Any], *args: Any) -> Any:
        self._check()
        return await self._worker.submit(fn, *args)

    def _post(self, fn: Callable[..., Any], *args: Any) -> int:
        """A plain call's job, not awaited (its error is logged); its job number."""
        future = self._worker.submit(fn, *args)
        future.add_done_callback(_log_failure)
        return self._worker.seq

    # ---- subscription ------------------------------------------------------------

    def subscribe(self, topics: Iterable[str] = (), pattern: str | None = None,
                  listener: Any = None) -> None:
        """Subscribe (a plain call, as aiokafka's). `listener`: an object with
        `on_partitions_revoked(tps)` and `on_partitions_assigned(tps)` (plain or async
        methods, aiokafka's ConsumerRebalanceListener); they run on the loop while the
        worker waits for them, so a rebalance completes after them."""
        self._check()
        topics = [topics] if isinstance(topics, str) else list(topics)
        self._subscribed = set(topics)
        hooks: dict[str, Any] = {}
        if listener is not None:
            hooks = {"on_revoke": self._on_loop(listener.on_partitions_revoked),
                     "on_assign": self._on_loop(listener.on_partitions_assigned)}
        self._post(lambda: self.consumer.subscribe(topics, pattern=pattern, **hooks))

    def _on_loop(self, method: Callable[..., Any]) -> Callable[[Any], None]:
        """`method` (plain or async) as a plain callable for the worker: run on the loop,
        the worker waiting for it (not at all once the loop has closed)."""
        loop = self._worker.loop
        assert loop is not None

        async def call(tps: Any) -> None:
            result = method(set(tps))
            if asyncio.iscoroutine(result):
                await result

        def hook(tps: Any) -> None:
            try:
                asyncio.run_coroutine_threadsafe(call(tps), loop).result(JOIN_LIMIT_S)
            except RuntimeError:           # the loop closed: nobody to tell
                pass
        return hook

    def unsubscribe(self) -> None:
        self._check()
        self._subscribed = set()
        self._drop(set(self._buffer))
        self._assignment = set()
        self._post(self.consumer.unsubscribe)

    def assign(self, partitions: Iterable[TopicPartition]) -> None:
        self._check()
        tps = {TopicPartition(*tp) for tp in partitions}
        self._drop(set(self._buffer) - tps)
        self._assignment = set(tps)
        seq = self._post(self.consumer.assign, list(tps))
        for tp in tps:
            self._moved_at[tp] = seq

    def assignment(self) -> set[TopicPartition]:
        """The partitions assigned, as the worker last reported them."""
        return set(self._assignment)

    def subscription(self) -> set[str]:
        return set(self._subscribed)

    # ---- positions ---------------------------------------------------------------

    def seek(self, tp: TopicPartition, offset: int) -> None:
        """Plain call: the next record delivered for `tp` is at `offset`."""
        self._check()
        tp = TopicPartition(*tp)
        self._drop({tp})
        self._moved_at[tp] = self._post(self.consumer.seek, tp, offset)

    async def seek_to_beginning(self, *tps: TopicPartition) -> None:
        for tp in (tps or tuple(self._assignment)):
            offsets = await self.beginning_offsets([tp])
            self.seek(tp, offsets[TopicPartition(*tp)])

    async def seek_to_end(self, *tps: TopicPartition) -> None:
        for tp in (tps or tuple(self._assignment)):
            offsets = await self.end_offsets([tp])
            self.seek(tp, offsets[TopicPartition(*tp)])

    async def position(self, tp: TopicPartition) -> int:
        """The offset of the next record getone()/getmany() delivers for `tp`."""
        tp = TopicPartition(*tp)
        offset = await self._call(self.consumer.position, tp)
        return self._less_buffered(tp, offset)

    def _less_buffered(self, tp: TopicPartition, offset: int) -> int:
        buffered = self._buffer.get(tp)
        return min(offset, buffered[0].offset) if buffered else offset

    async def committed(self, tp: TopicPartition) -> int | None:
        return await self._call(self.consumer.committed, TopicPartition(*tp))

    async def commit(self, offsets: Mapping[TopicPartition, Any] | None = None) -> None:
        """Commit `offsets` ({tp: next offset to consume}); by default the positions of
        what was delivered so far."""
        if offsets is None:
            def positions() -> dict[TopicPartition, int]:
                consumer = self.consumer
                return {tp: consumer.position(tp) for tp in consumer.assignment()}
            found = await self._call(positions)
            offsets = {tp: self._less_buffered(tp, offset) for tp, offset in found.items()}
        await self._call(self.consumer.commit, dict(offsets))

    async def end_offsets(self, tps: Iterable[TopicPartition]
                          ) -> dict[TopicPartition, int]:
        return await self._call(self.consumer.end_offsets, list(tps))

    async def beginning_offsets(self, tps: Iterable[TopicPartition]
                                ) -> dict[TopicPartition, int]:
        return await self._call(self.consumer.beginning_offsets, list(tps))

    async def offsets_for_times(self, timestamps: Mapping[TopicPartition, int]) -> Any:
        return await self._call(self.consumer.offsets_for_times, dict(timestamps))

    def pause(self, *tps: TopicPartition) -> None:
        self._check()
        tps = tuple(TopicPartition(*tp) for tp in tps)
        self._paused.update(tps)
        self._post(self.consumer.pause, *tps)

    def resume(self, *tps: TopicPartition) -> None:
        self._check()
        tps = tuple(TopicPartition(*tp) for tp in tps)
        self._paused.difference_update(tps)
        self._post(self.consumer.resume, *tps)
        if any(self._buffer.get(tp) for tp in tps):
            self._wake()

    def paused(self) -> set[TopicPartition]:
        return set(self._paused)

    def group_metadata(self) -> Any:
        self._check()
        return self.consumer.group_metadata()

    # ---- the buffer (loop side) ------------------------------------------------

    def _drop(self, tps: set[TopicPartition]) -> None:
        for tp in tps:
            dropped = self._buffer.pop(tp, None)
            if dropped:
                self._buffered -= len(dropped)

    def _fetched(self, grouped: dict[TopicPartition, list[Record]] | None,
                 assignment: set[TopicPartition] | None, jobs_done: int,
                 error: BaseException | None) -> None:
        """On the loop: a fetch's answer. Kept whatever became of the call that asked."""
        self._asked = False
        if error is not None:
            self._error = error
        if assignment is not None:
            self._assignment = assignment
            self._drop(set(self._buffer) - assignment)
        if grouped:
            buffer = self._buffer
            moved = self._moved_at
            for tp, records in grouped.items():
                if moved.get(tp, 0) > jobs_done or tp not in assignment:   # stale
                    continue
                queue_ = buffer.get(tp)
                if queue_ is None:
                    buffer[tp] = collections.deque(records)
                else:
                    queue_.extend(records)
                self._buffered += len(records)
        self._wake()

    def _wake(self) -> None:
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    def _ask(self) -> None:
        if not self._asked and not self._closed:
            self._asked = True
            self._worker.seq += 1
            self._worker.jobs.put("fetch")

    def _take(self, partitions: tuple[TopicPartition, ...], max_records: int
              ) -> dict[TopicPartition, list[Record]]:
        """Up to max_records buffered records of deliverable partitions; no await."""
        out: dict[TopicPartition, list[Record]] = {}
        left = max_records
        buffer = self._buffer
        for tp in (partitions or list(buffer)):
            if left <= 0:
                break
            records = buffer.get(tp)
            if not records or tp in self._paused:
                continue
            if len(records) <= left:
                taken = list(records)
                del buffer[tp]
            else:
                taken = [records.popleft() for _ in range(left)]
            out[tp] = taken
            left -= len(taken)
            self._buffered -= len(taken)
        if self._buffered < self._max_records:
            self._ask()                   # keep the next records coming
        return out

    def _raise_error(self) -> None:
        if self._error is not None:
            error, self._error = self._error, None
            raise error

    async def _wait(self, deadline: float | None) -> bool:
        """Wait until records arrive or `deadline` (loop time) passes; False at the
        deadline. ClosedError once stopped."""
        self._check()
        self._ask()
        loop = self._worker.loop
        assert loop is not None
        waiter = loop.create_future()
        self._waiters.append(waiter)
        try:
            if deadline is None:
                await waiter
            else:
                timeout = deadline - loop.time()
                if timeout <= 0:
                    return False
                try:
                    await asyncio.wait_for(waiter, timeout)
                except asyncio.TimeoutError:
                    return False
        finally:
            if waiter in self._waiters:
                self._waiters.remove(waiter)
        return True

    async def getone(self, *partitions: TopicPartition) -> Record:
        """The next record (waits for one). Cancelling it takes nothing."""
        partitions = tuple(TopicPartition(*tp) for tp in partitions)
        while True:
            self._check()
            self._raise_error()
            taken = self._take(partitions, 1)
            if taken:
                return next(iter(taken.values()))[0]
            await self._wait(None)

    async def getmany(self, *partitions: TopicPartition, timeout_ms: int = 0,
                      max_records: int | None = None
                      ) -> dict[TopicPartition, list[Record]]:
        """Records by partition, up to `max_records` (default max_poll_records), waiting
        up to `timeout_ms` when none is buffered ({} then). Cancelling it takes nothing."""
        partitions = tuple(TopicPartition(*tp) for tp in partitions)
        limit = self._max_records if max_records is None else max_records
        if isinstance(limit, bool) or not isinstance(limit, int) or limit <= 0:
            raise ConfigError(f"max_records must be a positive integer, got {limit!r}")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(timeout_ms, 0) / 1000
        while True:
            self._check()
            self._raise_error()
            taken = self._take(partitions, limit)
            if taken or timeout_ms <= 0:
                return taken
            if not await self._wait(deadline):
                self._raise_error()
                return self._take(partitions, limit)

    def __aiter__(self) -> AsyncIterator[Record]:
        return self

    async def __anext__(self) -> Record:
        try:
            return await self.getone()
        except ClosedError:
            if self._closed:
                raise StopAsyncIteration from None
            raise

    async def stop(self) -> None:
        """Wake every waiter with ClosedError, close the plain consumer (leaving its
        group) on the worker, and end the worker. Safe twice."""
        if self._closed:
            return
        self._closed = True
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_exception(ClosedError("AIOConsumer stopped"))
        if not self._started:
            return
        consumer = self.consumer
        if consumer is not None:
            # queued with the end of the worker at once: a stop() cancelled while it
            # waits still closes the consumer and ends the thread
            closing = self._worker.submit(consumer.close)
            self._worker.jobs.put(_STOP)
            try:
                await closing
            except LogkitError as exc:
                log.warning("AIOConsumer.stop: closing the consumer raised %s", exc)
        await self._worker.join()
        self._buffer.clear()
        self._buffered = 0


def _log_failure(future: asyncio.Future) -> None:
    if not future.cancelled() and future.exception() is not None:
        log.warning("AIOConsumer: a call failed on the worker: %s", future.exception())
