"""The producer's record accumulator: batches waiting to be appended (Kafka's
`RecordAccumulator`).

Owns: the batches of one producer between `send()` and their append — at most one open
batch per partition, the queue of sealed batches per partition in seal order, each
batch's estimated size against `batch_size`, the buffer accounting (`buffer_memory`,
blocking up to `max_block_ms` for room), the linger deadlines and the ready decision
(which open batches are due, when the sender thread should look again), and the claim
that lets one thread at a time append a partition's sealed batches.

Does not: encode, append or resolve futures (the sender side, `Producer._append`), choose
partitions (`Producer._choose`), validate records (`Producer._send_general`).

Buffer accounting: each batch reserves bytes of `buffer_memory` until it is appended.
While less than half the buffer is reserved, a new batch reserves a whole `batch_size`
(Kafka's rule; more for one record bigger than that). Past half, it reserves
`batch_size / RESERVE_STEPS` and grows its reservation (doubling, up to `batch_size`)
as records fill it — so 3,000 partitions with a few records each do not hold 3,000
whole batches and exhaust 32 MiB; a batch whose reservation cannot grow is sealed and
appended as it is. A record that needs a new batch and finds no room waits up to
`max_block_ms`, then `LogkitTimeoutError`.

The send hot paths (here, `Producer.send` and logkit/_sendpath.c) compare `Batch.size`
with `batch_size` lock-free; a batch holding less than a whole batch_size carries that
difference in `size` as `bias` (`size = estimated bytes + bias`), so the same compare
sends a record that would pass the reservation to `add`, which grows it or seals.
Appends are local, so the buffer fills only when appends stall (another process holding
the partition lock, a slow disk); while a sender waits for room, every open batch is
due at once (linger is ignored), as it is when the producer closes.

Invariant: a sealed batch is in exactly one place — its partition's queue, or claimed
by the one thread appending that partition (`claim` / `release`); a batch given back by
`release(done=False)` goes to the head of its queue, so batches of one partition are
appended in the order they were sealed. `reserved` is the sum of the reservations of
the batches not yet released as done; `in_flight` counts sealed batches not yet done.

Thread-safety: `lock` guards every structure here (opening and sealing batches, the
queues, the counters); it is never held while encoding or appending. The producer's
lock-free hot path reads `TopicBatches.open` and adds rows to the open batch without it.
Two ways, chosen once by whether logkit/_sendpath.c is built (`DIRECT_ROWS`):
- compiled: rows go straight into `Batch.rows` through `Batch.offer` (and the C send
  path), whose check-that-it-is-open and append are one step under the GIL; sealing
  sets `Batch.sealed` (lock held) and the rows are final. `Batch` and `TopicBatches`
  then keep their hot fields (`rows`, `size`, `sealed`; `open`, `sticky`) in C
  (`_sendpath.BatchBase`, `_sendpath.TopicBase`).
- pure Python: rows go to `Batch.inbox` (deque.append is atomic) and the sender checks
  `sealed` afterwards (see `Producer.send` for why no row is lost or taken twice);
  sealing sets `Batch.sealed` before draining the inbox into `rows`, under the lock.

Linger 0 under load (Kafka's `ready` check, for a local log): with `linger_ms=0` a batch
is due at once only while the producer is quiet. When a look of the sender thread finds
open batches that grew since its previous look, or a sealed batch still being appended
(as Kafka's sender has a request in flight), records are still flowing: it appends only
batches at least BUSY_LINGER_S old and looks again after QUIET_CHECK_S, so a saturated
producer seals full batches itself and never writes a trickle of tiny ones; a producer
that stops gets its last batches appended within about 2 x QUIET_CHECK_S (plus the GIL
hand-off). Batches opened while the sender thread was idle (no open batch) are quiet
on its first look: a lone record leaves at once, as before. The sender thread is woken
only from idle; while busy it looks on its own clock, so it does not take the GIL from
a saturated sending thread at every new batch (that hand-off costs more than the
append it hands over; docs/performance-round-two.md has the figures). `flush()`, `future.result()` and a full buffer never wait.

A look only lists the due batches; the sender thread seals each when it comes to it
(`seal_if_open`), as Kafka's sender takes a partition's batch when it drains it. A look
at a wide topic finds thousands due, and the sender works down the list for a while:
records sent meanwhile join their partition's due batch rather than open a second, small
one, so batches at wide topics stay full (docs/performance-round-two.md).

Callers that take their own batches (`future.result()` right after `send()`) stop the
wake-ups of the idle sender thread (`callers_take`, see `_note_callers`): it looks every
CALLER_GRACE_S instead, and a batch nobody claimed for that long is due and turns the
wake-ups back on.

Sending threads append the due batches (`take_due`, called by `Producer._look` every
CALLER_LOOK_EVERY sends, at most every QUIET_CHECK_S): up to
CALLER_DUE_MAX of the oldest open batches that are due — the `opened` order is creation
order, so a look costs the due batches, not the partitions. While they look, the sender
thread stands back (`_stand_back`: a look since its previous one, or within
CALLERS_LOOKING_S), takes at most CALLER_DUE_MAX after an idle wait, and cuts a list
short at the first sending thread's look, stepping off the GIL between steps
(`yield_to_callers`); it takes over once they stop looking, or when the buffer is
exhausted or the producer closes. A record that finds no room in the buffer first has
its thread append the oldest open batches (`take_due(everything=True)`), and waits only
when none is open. Appends are the same CPU work under one GIL whichever thread does
them; the sender thread doing them beside a thread that keeps sending cost thousands of
GIL and lock hand-offs a second, which wide topics pay most.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from typing import Any, Callable

from . import _native
from .errors import ClosedError, LogkitTimeoutError
from .records import RECORDS_OFFSET, RecordMetadata

__all__ = ["Batch", "TopicBatches", "RecordAccumulator", "DIRECT_ROWS", "CALLER_DUE_MAX",
           "CALLER_LOOK_EVERY"]

SENDER_IDLE_WAIT_S = 1.0            # the sender re-checks its state at least this often
RESERVE_STEPS = 8                   # past half the buffer, batches reserve batch_size / 8
QUIET_CHECK_S = 0.001               # linger_ms=0: a busy producer's batches looked at again
BUSY_LINGER_S = 0.005               # linger_ms=0: a batch waits at most this while busy
CALLER_GRACE_S = 0.001              # callers append their own: an unclaimed batch waits this
CALLERS_QUIET_S = 0.05              # ... until no batch opened for this long
CALLER_DUE_MAX = 4                  # due batches a sending thread appends per look
CALLER_LOOK_EVERY = 256             # sends between two looks of a sending thread
CALLERS_LOOKING_S = 0.002           # the sender thread stands back this long after
                                    # a sending thread's look for due batches
SENDER_YIELD_S = 0.0001             # ... and steps off the GIL this long between
                                    # CALLER_DUE_MAX batches of a list it works down

log = logging.getLogger(__name__)

_sendpath = _native.sendpath
# Rows go straight into Batch.rows (the compiled check-and-add); else through the inbox.
DIRECT_ROWS = _sendpath is not None
_NO_INBOX: tuple = ()               # a compiled build's Batch.inbox: nothing to drain


class _PyBatchFields:
    """The fields of a Batch that the send paths read; `_sendpath.BatchBase` is the
    compiled twin (C fields, and `offer`)."""

    __slots__ = ("rows", "size", "sealed", "finished", "callbacks")


class _PyTopicFields:
    """The fields of a TopicBatches that the send paths read; `_sendpath.TopicBase` is
    the compiled twin. `sticky` (the null-key partition) is the producer's partitioner
    state (producer.py's _TopicState keeps it up)."""

    __slots__ = ("open", "sticky")


_BatchFields: Any = _PyBatchFields if _sendpath is None else _sendpath.BatchBase
_TopicFields: Any = _PyTopicFields if _sendpath is None else _sendpath.TopicBase


class Batch(_BatchFields):
    """Records bound for one partition, appended together as one Kafka record batch.

    logkit/_sendpath.c reads `rows`, `size`, `sealed`, `finished` and `callbacks` (C
    fields of its BatchBase when built): rename one here and the C file must change too
    (then rebuild it)."""

    __slots__ = ("state", "partition", "inbox", "reserved",
                 "bias", "created", "waiter", "seen",
                 "base_offset", "timestamp_ms", "error", "_index",
                 "outcomes")

    def __init__(self, state: "TopicBatches", partition: int, reserved: int,
                 bias: int = 0) -> None:
        self.state = state
        self.partition = partition
        # Pure Python: send() appends rows to `inbox` without the lock (deque.append is
        # atomic); sealing sets `sealed`, then moves the inbox into `rows` (see
        # Producer.send for why no row is lost or taken twice). Compiled: rows go
        # straight into `rows` (Batch.offer) and the inbox stays empty.
        self.inbox: Any = _NO_INBOX if DIRECT_ROWS else collections.deque()
        self.sealed = False
        self.rows: list[tuple] = []             # the rows encoded (pure: once sealed)
        # estimated encoded bytes so far plus `bias`
        self.size = RECORDS_OFFSET + bias
        self.seen = -1                      # size at the sender's last look (linger 0)
        self.reserved = reserved            # buffer_memory held until appended
        self.bias = bias                    # batch_size - reserved, while that is > 0
        self.created = time.monotonic()
        # Stored or failed for good (set once, by Producer._resolve); a thread that
        # must block for it makes `waiter` (an Event) on demand: most batches never
        # have one (an Event costs microseconds to make).
        self.finished = False
        self.waiter: threading.Event | None = None
        self.base_offset = -1
        self.timestamp_ms = -1              # what records without a timestamp got
        self.error: BaseException | None = None
        # (row, ok, err, index in rows or -1) per registered callback, until resolved
        self.callbacks: list[tuple[tuple, Callable | None, Callable | None, int]] = []
        self._index: dict[int, int] | None = None
        # Set only when the batch had to be split: id(row) -> offset or error.
        self.outcomes: dict[int, int | BaseException] | None = None

    def outcome(self, row: tuple) -> RecordMetadata | BaseException:
        """`row`'s RecordMetadata, or the error that kept it out (batch done)."""
        if self.error is not None:
            return self.error
        if self.outcomes is not None:
            offset = self.outcomes[id(row)]
            if isinstance(offset, BaseException):
                return offset
        else:
            rows = self.rows
            if rows and rows[-1] is row:    # a synchronous send's row: the last one
                offset = self.base_offset + len(rows) - 1
            else:
                index = self._index
                if index is None:
                    index = self._index = {id(r): i for i, r in enumerate(rows)}
                offset = self.base_offset + index[id(row)]
        ts = row[3]
        return RecordMetadata(self.state.name, self.partition, offset,
                              self.timestamp_ms if ts is None else ts)


class TopicBatches(_TopicFields):
    """One topic's batches: the open one per partition, the sealed queues, and whether a
    thread is appending each partition now (one appender per partition keeps the order).

    The producer subclasses it to keep its partitioner state on the same object (one
    lookup on the hot path). logkit/_sendpath.c reads `open` and `sticky` (C
    fields of its TopicBase when built)."""

    __slots__ = ("name", "topic", "count", "sealed", "busy")

    def __init__(self, topic: Any) -> None:
        self.name = topic.name
        self.topic = topic
        self.count = topic.num_partitions
        self.sticky = 0
        self.open: list[Batch | None] = [None] * self.count
        self.sealed: list[collections.deque[Batch]] = [collections.deque()
                                                       for _ in range(self.count)]
        self.busy = [False] * self.count

    def batch_sealed(self, partition: int) -> None:
        """Called (lock held) when `partition`'s open batch is sealed."""


class RecordAccumulator:
    """The batching bookkeeping of one producer (see the module docstring)."""

    def __init__(self, *, batch_size: int, buffer_memory: int, linger_ms: float,
                 max_block_ms: float) -> None:
        self.batch_size = batch_size
        self.buffer_memory = buffer_memory
        self.linger_s = linger_ms / 1000
        self.max_block_ms = max_block_ms
        self.lock = threading.Lock()
        self.changed = threading.Condition(self.lock)   # space freed, batch appended
        self.wake = threading.Condition(self.lock)      # the sender thread has work
        self.states: dict[str, TopicBatches] = {}       # topic name -> its batches
        self.open_count = 0
        # The open batches, oldest first (opened under `lock`, so in `created` order):
        # a look for due batches stops at the first one that is not.
        self.opened: dict[Batch, None] = {}
        self.next_caller_look = 0.0    # a sending thread looks for due batches then
        self.callers_looked = -1.0     # when one last did (monotonic)
        self.sender_looked = -1.0      # when the sender thread's last look was
        self.reserved = 0
        self.in_flight = 0             # sealed batches not yet appended
        self.exhausted = 0             # senders waiting for buffer space
        self.waiting = 0               # threads waiting on `changed`
        self.sender_idle = False       # the sender thread waits with no open batch
        self.busy_linger_s = self.linger_s   # the linger the last look applied
        self.after_idle = False        # the sender's next look follows an idle wait
        self.woken_for: Batch | None = None   # the batch the last wake-up was for
        self.callers_take = False      # senders append their own batches: do not wake
        self.last_opened = 0.0         # when the newest batch was opened (monotonic)
        self.wakeups = 0               # idle sender thread woken for a new batch
        self.retry: set[tuple[TopicBatches, int]] = set()   # requeued: the sender appends
        self.closed = False

    # ---- adding records (send) -------------------------------------------------------

    def add(self, state: TopicBatches, p: int, row: tuple, size: int, deadline: float,
            *, wait: bool = True) -> tuple[Batch | None, bool]:
        """Add `row` (about `size` bytes) to partition p's open batch: seal a batch it
        does not fit, open a new one, seal one it fills. Returns the batch that took
        the row (None: no room yet) and whether a batch of p was sealed — the caller
        then drains p, which frees buffer space, and calls again if the row is not in.
        With `wait`, waits for room until `deadline` (monotonic) when it sealed
        nothing; without, returns at once (the caller first appends the oldest open
        batches itself, `take_due(everything=True)`)."""
        with self.lock:
            if self.closed:
                raise ClosedError("producer is closed")
            sealed = False
            batch = state.open[p]
            if batch is not None and batch.size + size > self.batch_size \
                    and (batch.rows or batch.inbox) and not self._grow(batch, size):
                self.seal(state, p)
                sealed, batch = True, None
            if batch is None:
                whole = max(self.batch_size, size + RECORDS_OFFSET)
                reserve = whole if self.reserved + whole <= self.buffer_memory // 2 else \
                    max(self.batch_size // RESERVE_STEPS, size + RECORDS_OFFSET)
                if self.reserved + reserve > self.buffer_memory and self.reserved:
                    if not sealed and wait:   # appending ours first frees space
                        self._wait_for_space(deadline)
                    return None, sealed
                batch = state.open[p] = Batch(state, p, reserve,
                                              max(0, self.batch_size - reserve))
                self.reserved += reserve
                self.opened[batch] = None
                self.open_count += 1
                self.last_opened = batch.created
                opened = True
            else:
                opened = False
            if DIRECT_ROWS:                   # open (sealing needs this lock): in order
                batch.rows.append(row)
            else:
                batch.inbox.append(row)
            batch.size += size
            if batch.size - batch.bias >= self.batch_size:
                self.seal(state, p)           # the caller appends it: no hand-off
                sealed = True
            elif opened and self.sender_idle and not self.callers_take:
                self.wake.notify()            # else it looks again on its own
                self.wakeups += 1
                self.woken_for = batch
            return batch, sealed

    def _grow(self, batch: Batch, size: int) -> bool:
        """Grow an open batch's reservation (lock held) so a `size`-byte record fits:
        doubled, at most batch_size, if the buffer has room. False when the batch is
        full (a whole batch_size) or the buffer has no room: the caller seals it."""
        bias = batch.bias
        if not bias:
            return False
        needed = batch.size - bias + size
        if needed > self.batch_size:
            return False
        grown = min(self.batch_size, max(2 * batch.reserved, needed))
        extra = grown - batch.reserved
        if self.reserved + extra > self.buffer_memory:
            return False
        self.reserved += extra
        batch.reserved = grown
        batch.bias = self.batch_size - grown
        batch.size -= bias - batch.bias     # racing lock-free adds may undercount: harmless
        return True

    def take_back(self, batch: Batch, row: tuple) -> bool:
        """`row` was appended to `batch` while it was being sealed: True when it was
        still in the inbox and is taken back out (the caller adds it again), False when
        the seal moved it into the batch's rows (it is sent with the batch)."""
        with self.lock:                      # sealers drain holding it: the drain is over
            for i, other in enumerate(list(batch.inbox)):
                if other is row:
                    del batch.inbox[i]       # appenders only add on the right
                    return True
            return False

    def _wait_for_space(self, deadline: float) -> None:
        """Wait (lock held) until buffer space may have been freed; raise at deadline."""
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise LogkitTimeoutError(
                f"no room in buffer_memory={self.buffer_memory} within "
                f"max_block_ms={self.max_block_ms}: appends are not keeping up")
        self.exhausted += 1                      # the sender ignores linger meanwhile
        self.waiting += 1
        self.wake.notify()
        try:
            self.changed.wait(min(remaining, SENDER_IDLE_WAIT_S))
        finally:
            self.exhausted -= 1
            self.waiting -= 1

    # ---- sealing ---------------------------------------------------------------------

    def seal(self, state: TopicBatches, p: int) -> Batch:
        """Move partition p's open batch to its sealed queue (lock held)."""
        batch = state.open[p]
        assert batch is not None
        state.open[p] = None
        del self.opened[batch]
        batch.sealed = True
        inbox, rows = batch.inbox, batch.rows
        while inbox:                         # late appends land after this: rescued
            rows.append(inbox.popleft())
        state.sealed[p].append(batch)
        self.open_count -= 1
        self.in_flight += 1
        state.batch_sealed(p)
        return batch

    def seal_if_open(self, batch: Batch, *, caller: bool = False,
                     claim: bool = False) -> Batch | None:
        """Seal `batch` if it still waits open in the accumulator. `caller`: the thread
        that sent into it waits for it (`future.result()`) and appends it itself; if the
        sender thread was woken for this batch, senders are taking their own batches
        and new ones stop waking it (see `_note_callers`). `claim`: also `claim` the
        partition's next sealed batch in the same step (returned; None as claim's)."""
        state, p = batch.state, batch.partition
        with self.lock:
            if state.open[p] is batch:
                self.seal(state, p)
            if caller and self.woken_for is batch:
                self.callers_take = True
                self.woken_for = None
            if not claim or state.busy[p] or not state.sealed[p]:
                return None
            state.busy[p] = True
            return state.sealed[p].popleft()

    def seal_all(self) -> list[TopicBatches]:
        """Seal every open batch (flush); every topic's batches, to drain."""
        with self.lock:
            for state in self.states.values():
                for p, batch in enumerate(state.open):
                    if batch is not None:
                        self.seal(state, p)
            return list(self.states.values())

    # ---- appending (the drain) -------------------------------------------------------

    def claim(self, state: TopicBatches, p: int) -> Batch | None:
        """The next sealed batch of p for this thread to append, or None when p's
        queue is empty or another thread is appending p (that thread loops until the
        queue is empty, so no batch waits for a thread that left)."""
        with self.lock:
            if state.busy[p] or not state.sealed[p]:
                return None
            state.busy[p] = True
            return state.sealed[p].popleft()

    def release(self, state: TopicBatches, p: int, batch: Batch, done: bool, *,
                claim_next: bool = False) -> Batch | None:
        """End a claim: `done` (stored or failed for good) frees its buffer space; not
        done (the caller's lock wait ran out, nothing stored) puts it first in line
        again, for the sender thread. With `claim_next` (and done), p's next sealed
        batch is claimed for the caller in the same step and returned (None: none
        waits, and the claim is over)."""
        with self.lock:
            if done:
                self.reserved -= batch.reserved
                self.in_flight -= 1
            else:
                state.sealed[p].appendleft(batch)
                self.retry.add((state, p))
                self.wake.notify()
            if self.waiting:                     # notify_all costs a microsecond
                self.changed.notify_all()
            if done and claim_next and state.sealed[p]:
                return state.sealed[p].popleft()     # still busy: the caller's claim
            state.busy[p] = False
            return None

    def wait_appended(self, deadline: float | None, timeout: float | None) -> None:
        """Block until no sealed batch waits to be appended (flush)."""
        with self.lock:
            while self.in_flight:
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    raise LogkitTimeoutError(f"flush did not finish within {timeout} s")
                self.waiting += 1
                try:
                    self.changed.wait(SENDER_IDLE_WAIT_S if remaining is None
                                      else min(remaining, SENDER_IDLE_WAIT_S))
                finally:
                    self.waiting -= 1

    # ---- the ready decision (the sender thread) --------------------------------------

    def _due(self, now: float) -> list[tuple[TopicBatches, int, Batch]]:
        """The open batches that are linger_ms old (all of them when the buffer is
        exhausted or the producer is closing), as (state, partition, batch). Lock held.
        They are sealed when the sender thread comes to each (`seal_if_open`), not
        here: a look may find thousands due (one per partition of a wide topic), and
        the records that arrive while the sender works down the list join their
        partition's batch instead of opening a new one, as Kafka's sender takes a
        partition's batch when it drains it.

        linger_ms=0: while records are still flowing (an open batch grew since the
        previous look) or a sealed batch is being appended (the sending thread is busy
        appending, not done sending), only batches BUSY_LINGER_S old are due (see the
        module docstring); once no batch grew between two looks and no append is in
        progress, all are."""
        linger = self.linger_s
        after_idle, self.after_idle = self.after_idle, False
        if not linger and not (self.exhausted or self.closed):
            growing = False
            fresh = after_idle                # batches opened while it slept: quiet
            for state in self.states.values():
                for batch in state.open:
                    if batch is not None and batch.size != batch.seen:
                        growing = growing or not (fresh and batch.seen < 0)
                        batch.seen = batch.size
            if growing or self.in_flight:
                linger = BUSY_LINGER_S
        if self.callers_take:                 # give the callers their grace first
            linger = max(linger, CALLER_GRACE_S)
        everything = self.exhausted or self.closed
        due: list[tuple[TopicBatches, int, Batch]] = []
        for batch in self.opened:             # oldest first
            if batch.created + linger > now and not everything:
                break
            due.append((batch.state, batch.partition, batch))
        self.busy_linger_s = linger
        if due and self.callers_take:         # a batch nobody claimed for a grace:
            self.callers_take = False         # wake at once for the next one again
        return due

    def take_due(self, now: float, *, everything: bool = False) -> list[Batch]:
        """For a sending thread (`Producer._look`): seal and return up to
        CALLER_DUE_MAX of the oldest open batches that are due — `linger_ms` old, or
        BUSY_LINGER_S at linger_ms=0, since records are flowing; any age with
        `everything` (no room in the buffer for its record) — for it to append itself,
        so the sender thread stands back (`_stand_back`). The work is the due
        batches', not the partitions'."""
        with self.lock:
            self.next_caller_look = now + QUIET_CHECK_S
            self.callers_looked = now
            linger = -1.0 if everything else self.linger_s or BUSY_LINGER_S
            due: list[Batch] = []
            for batch in self.opened:         # oldest first
                if batch.created + linger > now or len(due) == CALLER_DUE_MAX:
                    break
                due.append(batch)
            for batch in due:
                self.seal(batch.state, batch.partition)
            return due

    def yield_to_callers(self) -> None:
        """For the sender thread working down a long list of due batches: step off
        the GIL for SENDER_YIELD_S. A thread that gives the GIL up in short system calls
        and takes it straight back can keep a waiting sending thread from ever getting
        it (CPython forces a switch only after a whole switch interval with no hand-off
        at all); a blocking wait lets the sending thread in, to send and to look —
        which ends the list (`callers_took_over`)."""
        with self.lock:
            self.wake.wait(SENDER_YIELD_S)

    def callers_took_over(self) -> bool:
        """For the sender thread working down a list of due batches (no lock): a
        sending thread has looked for due batches since the look that made the list,
        so the rest of it is left to the sending threads."""
        return (self.callers_looked > self.sender_looked
                and not (self.exhausted or self.closed))

    def _stand_back(self, now: float) -> bool:
        """Whether the sender thread's look should leave the due batches to the
        sending threads (lock held): one looked since the sender thread's previous look
        or within CALLERS_LOOKING_S (a pause of the sending thread — the garbage
        collector, a first append — does not hand its work to the sender thread), and
        the buffer is not exhausted, nor the producer closing. The first look after an
        idle wait still takes up to CALLER_DUE_MAX batches (a lone record leaves at
        once; the batches of a burst that began meanwhile are the senders').

        Why: appends are CPU work under one GIL. A sending thread that appends the
        due batches between its sends does the same work as the sender thread would,
        without the two threads taking the GIL and the accumulator's lock from each
        other (the hand-off costs more than the appends at wide topics)."""
        looked, previous, self.sender_looked = self.callers_looked, self.sender_looked, now
        return ((looked > previous or now - looked < CALLERS_LOOKING_S)
                and not (self.exhausted or self.closed))

    def _note_callers(self, now: float) -> None:
        """Whether senders still append their own batches (lock held; the sender thread
        about to idle): not once no batch was opened for CALLERS_QUIET_S.

        A sender that waits on its record (`future.result()`) seals and appends the
        batch itself; waking the idle sender thread for that batch only puts a second
        thread on the CPU beside it (across processes, beside a producer and its
        consumer, that wake is a large share of the round trip). So once a caller takes a
        batch the sender thread was woken for (`seal_if_open(caller=True)`), new
        batches stop waking it: it looks every CALLER_GRACE_S instead and appends a
        batch nobody claimed for that long (`_due`), which turns the wake-ups back on,
        as does a quiet spell."""
        if self.callers_take and now - self.last_opened > CALLERS_QUIET_S:
            self.callers_take = False

    def next_ready(self) -> list[tuple[TopicBatches, int, Batch | None]] | None:
        """For the sender thread: (state, partition, batch to seal first or None) to
        drain now (requeued ones first), after waiting — never longer than
        SENDER_IDLE_WAIT_S — until some open batch is due; None once the producer is
        closed and nothing is left to append."""
        with self.lock:
            if self.closed and not self.open_count and not self.retry:
                return None
            # requeued by a caller's timeout: sealed already
            retry: list[tuple[TopicBatches, int, Batch | None]] = [
                (state, p, None) for state, p in self.retry]
            self.retry.clear()
            now = time.monotonic()
            if not self.open_count and not retry:
                self._note_callers(now)
                self.sender_idle = True
                self.wake.wait(CALLER_GRACE_S if self.callers_take else SENDER_IDLE_WAIT_S)
                self.sender_idle = False
                self.after_idle = True
                return []
            looking = self.open_count and self._stand_back(now)
            standing_back = looking and not self.after_idle
            due = self._due(now) if self.open_count and not standing_back else []
            if looking:            # after an idle wait: a lone record leaves at once,
                due = due[:CALLER_DUE_MAX]    # a burst's batches are the senders'
            if not due and not retry:
                if standing_back:              # until the sending threads stop looking
                    wait = max(QUIET_CHECK_S, self.callers_looked + CALLERS_LOOKING_S - now)
                else:
                    oldest = next(iter(self.opened)).created
                    wait = max(0.0, oldest + self.busy_linger_s - now)
                    if not self.linger_s:      # busy at linger 0: look again soon
                        wait = min(wait, QUIET_CHECK_S)
                self.wake.wait(min(SENDER_IDLE_WAIT_S, wait))
            return [*retry, *due]

    # ---- lifecycle -------------------------------------------------------------------

    def close(self) -> bool:
        """Refuse new records; every open batch is due now. False if already closed."""
        with self.lock:
            if self.closed:
                return False
            self.closed = True
            self.wake.notify_all()
            return True

    def metrics(self) -> dict[str, int]:
        with self.lock:
            return {"open_batches": self.open_count, "in_flight_batches": self.in_flight,
                    "buffer_reserved_bytes": self.reserved,
                    "sender_wakeups": self.wakeups}
