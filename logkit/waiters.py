"""The threads that complete a producer's stored batches once something else catches up:
a sync that covers them (`SyncWaiter`, for `flush.messages` topics) or the in-sync
replicas (`AckWaiter`, for acks="all" to a replicated topic).

Owns: the queue of batches waiting, one daemon thread per waiter, and completing each
batch exactly once (its `error` set first when it failed). Invariant: a waiter only
reads partitions through their public methods (`wait_synced`, `high_watermark`,
`in_sync_replicas`), so it sits beside the producer above the storage and replication
and knows neither. Thread-safe; `close()` is safe twice.
"""

from __future__ import annotations

import logging
import threading
from abc import ABC, abstractmethod
import time
from typing import Any, Callable, NamedTuple

from ._threads import start_thread
from .errors import ClosedError, LogkitTimeoutError, NotEnoughReplicasError

__all__ = ["SyncWaiter", "AckWaiter"]

log = logging.getLogger(__name__)

ACK_POLL_S = 0.05                         # an acks waiter looks again at least this often
ACK_MIN_GAP_S = 0.0005                    # ... and at most this often (each look takes the
                                          # GIL from the producer's threads)


class _WaiterThread(ABC):
    """One daemon thread and the condition its callers and it share; `close()` wakes the
    thread, which finishes what is queued and ends (safe twice; never joins itself).
    A subclass's `_run` is the thread's loop."""

    def __init__(self, name: str, what: str) -> None:
        self._cond = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        start_thread(self._thread, what)

    @abstractmethod
    def _run(self) -> None:
        """Wait on `_cond` for work, do it, and return once closed with nothing queued."""

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=10)


class SyncWaiter(_WaiterThread):
    """Durable batches already appended (`append_batch_nowait`) waiting for their syncs
    off the appending thread, so the appender goes on building and appending batches
    while a sync runs: the producer's pipelining (group commit then covers all of them
    with one sync). One daemon thread; each round takes every queued entry and, in
    order, waits for its ticket (`wait_synced` on the partition it came from — the
    first wait of a round syncs all that was published, the rest mostly find it done)
    and calls `done(token, error)` (error None when synced).

    At most `limit` entries wait: `add` blocks beyond that (back-pressure, as a bounded
    number of requests in flight), except on the waiter's own thread (a completion that
    appends again must not wait for itself). Thread-safe; `close()` finishes the queued
    entries first and is safe twice."""

    def __init__(self, done: Callable[[Any, BaseException | None], None], *,
                 limit: int = 64, name: str = "logkit-sync") -> None:
        self._done = done
        self._limit = limit
        self._queue: list[tuple[Any, Any, Any]] = []       # token, partition, SyncTicket
        self._busy = 0                    # entries the thread took and has not done yet
        super().__init__(name, f"the {name} thread")

    def add(self, token: Any, partition: Any, ticket: Any) -> None:
        """Queue `token` until `partition.wait_synced(ticket)` returns or raises."""
        with self._cond:
            if threading.current_thread() is not self._thread:
                while len(self._queue) + self._busy >= self._limit and not self._closed:
                    self._cond.wait()
            if self._closed:
                raise ClosedError("the sync waiter is closed")
            self._queue.append((token, partition, ticket))
            self._cond.notify_all()

    def wait_idle(self, deadline: float | None) -> None:
        """Until nothing waits (a flush), or LogkitTimeoutError at `deadline`."""
        with self._cond:
            while self._queue or self._busy:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise LogkitTimeoutError("flush: durable batches still wait for "
                                             "their sync")
                self._cond.wait(left)

    def _run(self) -> None:
        cond = self._cond
        while True:
            with cond:
                while not self._queue and not self._closed:
                    cond.wait()
                if not self._queue:
                    return
                entries, self._queue = self._queue, []
                self._busy = len(entries)
                cond.notify_all()
            for token, partition, ticket in entries:
                error: BaseException | None = None
                try:
                    partition.wait_synced(ticket)
                except BaseException as exc:        # the batch's error, whatever it is
                    error = exc
                try:
                    self._done(token, error)
                except Exception:                   # never let one stop the thread
                    log.exception("completing a synced batch failed")
                with cond:
                    self._busy -= 1
                    cond.notify_all()


class _Waiting(NamedTuple):
    batch: Any
    partition: Any                        # a replicated Partition
    target: int                           # the offset after the batch's last record
    deadline: float                       # monotonic
    min_insync: int


class AckWaiter(_WaiterThread):
    """acks="all": batches already stored, waiting for the high watermark to pass
    them. One daemon thread per producer; many batches wait at once (pipelined).

    `resolve(batch)` completes a batch (its `error` set first on failure): when the
    high watermark reaches `target` (NotEnoughReplicasError if the ISR is by then
    smaller than min.insync.replicas, as Kafka's NOT_ENOUGH_REPLICAS_AFTER_APPEND), or
    LogkitTimeoutError at the deadline; the records stay in the log either way."""

    def __init__(self, doorbell: Any, resolve: Callable[[Any], None]) -> None:
        self._doorbell = doorbell
        self._resolve = resolve
        self._waiting: list[_Waiting] = []
        super().__init__("logkit-acks", "the acks=all waiter thread")

    def add(self, batch: Any, partition: Any, target: int,
            timeout_s: float, min_insync: int) -> None:
        with self._cond:
            self._waiting.append(_Waiting(batch, partition, target,
                                          time.monotonic() + timeout_s, min_insync))
            self._cond.notify_all()

    def wait_idle(self, deadline: float | None) -> None:
        """Until no batch waits (flush), or LogkitTimeoutError at `deadline`."""
        with self._cond:
            while self._waiting:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise LogkitTimeoutError("flush: acks='all' batches still wait for "
                                             "the in-sync replicas")
                self._cond.wait(ACK_POLL_S if left is None else min(left, ACK_POLL_S))

    def _run(self) -> None:
        doorbell = self._doorbell
        while True:
            with self._cond:
                while not self._waiting and not self._closed:
                    self._cond.wait()
                if not self._waiting:
                    return
                waiting = list(self._waiting)
            seen = doorbell.value() if doorbell is not None else 0
            looked = time.monotonic()
            finished = self._check(waiting)
            for w in finished:                       # resolved before flush() returns
                self._finish(w)
            with self._cond:
                if finished:
                    done = {id(w) for w in finished}
                    self._waiting = [w for w in self._waiting if id(w) not in done]
                    self._cond.notify_all()
                if not self._waiting:
                    continue
                next_deadline = min(w.deadline for w in self._waiting)
            pause = max(0.0, min(ACK_POLL_S, next_deadline - time.monotonic()))
            if doorbell is not None:
                doorbell.wait(seen, pause)
            else:
                time.sleep(min(pause, 0.001))
            # every append rings too: look at most every ACK_MIN_GAP_S
            gap = ACK_MIN_GAP_S - (time.monotonic() - looked)
            if gap > 0:
                time.sleep(gap)

    def _check(self, waiting: list[_Waiting]) -> list[_Waiting]:
        now = time.monotonic()
        marks: dict[int, int] = {}               # per partition, once per round
        isr_sizes: dict[int, int] = {}
        finished = []
        for w in waiting:
            key = id(w.partition)
            try:
                if key not in marks:
                    marks[key] = w.partition.high_watermark
            except Exception as exc:              # the partition failed: the batch too
                w.batch.error = exc
                finished.append(w)
                continue
            if marks[key] >= w.target:
                if key not in isr_sizes:
                    isr_sizes[key] = len(w.partition.in_sync_replicas())
                isr = isr_sizes[key]
                if isr < w.min_insync:
                    w.batch.error = NotEnoughReplicasError(
                        f"acks='all' to {w.partition.topic}-{w.partition.partition}: the "
                        f"records are stored, but the ISR shrank to {isr} replica(s), "
                        f"below min.insync.replicas={w.min_insync}")
                finished.append(w)
            elif now >= w.deadline:
                w.batch.error = LogkitTimeoutError(
                    f"acks='all' to {w.partition.topic}-{w.partition.partition}: the "
                    f"in-sync replicas did not reach offset {w.target} within "
                    f"request_timeout_ms (high watermark {marks[key]}); the records are "
                    "stored on the leader")
                finished.append(w)
        return finished

    def _finish(self, w: _Waiting) -> None:
        try:
            self._resolve(w.batch)
        except Exception:                          # never stop the waiter thread
            log.exception("resolving an acks='all' batch of %s-%d failed",
                          w.partition.topic, w.partition.partition)
