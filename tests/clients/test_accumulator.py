"""The record accumulator's decisions and the two ways rows reach a batch: linger_ms=0
holds back batches that are still growing (no trickle of tiny batches while the
producer is saturated) and takes quiet ones at once; compiled and Python send paths
mixed on one partition keep send order; the pure-Python inbox protocol still holds
(run in a LOGKIT_PURE_PYTHON=1 child)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

import logkit
from logkit import ForkedProcessError
from logkit import accumulator as accumulator_module
from logkit.accumulator import RecordAccumulator, TopicBatches
from tests.helpers.clients import SEND_PATHS, use_path
from tests.helpers.procs import wait_until

CHECKOUT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ROW = (None, b"v" * 100, None, None)
ROW_BYTES = 121


def linger0(**overrides) -> RecordAccumulator:
    options = dict(batch_size=16384, buffer_memory=1 << 20, linger_ms=0,
                   max_block_ms=1000)
    return RecordAccumulator(**(options | overrides))


def add(accumulator, state, p=0):
    batch, sealed = accumulator.add(state, p, ROW, ROW_BYTES, deadline=1e18)
    assert batch is not None and not sealed
    return batch


def test_linger0_holds_back_a_growing_batch_and_takes_a_quiet_one(broker):
    """A look that finds the open batch grown since the previous look leaves it open
    (records are still flowing); the next look, with no growth in between, seals it."""
    topic = broker.create_topic("t", 2)
    accumulator = linger0()
    state = accumulator.states["t"] = TopicBatches(topic)
    batch = add(accumulator, state)
    now = batch.created
    assert accumulator._due(now) == [] and state.open[0] is batch      # grew: held
    add(accumulator, state)
    assert accumulator._due(now) == [] and not batch.sealed            # grew again
    assert accumulator._due(now) == [(state, 0, batch)]                # quiet: due
    accumulator.seal_if_open(batch)                  # what the sender does on its way
    assert batch.sealed and len(batch.rows) == 2


def test_linger0_takes_a_batch_opened_while_the_sender_was_idle_at_once(broker):
    """A batch opened while the sender thread slept with nothing open (a lone record
    after a pause) is due on its first look, as linger_ms=0 promises; one it has seen
    before and that grew since is held back."""
    topic = broker.create_topic("t", 2)
    accumulator = linger0()
    state = accumulator.states["t"] = TopicBatches(topic)
    batch = add(accumulator, state, 0)
    accumulator.after_idle = True                    # what next_ready sets after idling
    assert accumulator._due(batch.created) == [(state, 0, batch)]
    accumulator.seal_if_open(batch)
    other = add(accumulator, state, 1)
    assert accumulator._due(other.created) == []     # not after idle: held for a look


def test_linger0_holds_back_a_quiet_batch_while_an_append_is_in_progress(broker):
    """A sealed batch not yet appended (the sending thread appending it) means records
    are still coming: a quiet open batch waits for the next look after the append."""
    topic = broker.create_topic("t", 2)
    accumulator = linger0()
    state = accumulator.states["t"] = TopicBatches(topic)
    add(accumulator, state, 0)
    accumulator.seal(state, 0)                       # in flight: sealed, not appended
    batch = add(accumulator, state, 1)
    now = batch.created
    assert accumulator._due(now) == [] and accumulator._due(now) == []
    claimed = accumulator.claim(state, 0)
    accumulator.release(state, 0, claimed, True)     # appended
    assert accumulator._due(now) == [(state, 1, batch)]


def test_linger0_takes_a_growing_batch_once_it_is_busy_linger_old(broker):
    """Records flowing do not hold a batch forever: BUSY_LINGER_S after its creation it
    is due even while still growing."""
    topic = broker.create_topic("t", 1)
    accumulator = linger0()
    state = accumulator.states["t"] = TopicBatches(topic)
    batch = add(accumulator, state)
    late = batch.created + accumulator_module.BUSY_LINGER_S
    assert accumulator._due(late) == [(state, 0, batch)]


def test_linger0_takes_every_batch_at_once_when_the_buffer_is_exhausted(broker):
    """A sender waiting for buffer space makes every open batch due, growing or not."""
    topic = broker.create_topic("t", 2)
    accumulator = linger0()
    state = accumulator.states["t"] = TopicBatches(topic)
    add(accumulator, state, 0)
    add(accumulator, state, 1)
    accumulator.exhausted = 1
    assert sorted(p for _, p, _batch in accumulator._due(0.0)) == [0, 1]


def test_a_positive_linger_is_unchanged_by_the_busy_rule(broker):
    """linger_ms > 0: a batch is due linger_ms after its creation, grown or not."""
    topic = broker.create_topic("t", 1)
    accumulator = linger0(linger_ms=50)
    state = accumulator.states["t"] = TopicBatches(topic)
    batch = add(accumulator, state)
    assert accumulator._due(batch.created + 0.049) == []
    assert accumulator._due(batch.created + 0.051) == [(state, 0, batch)]


def test_records_sent_after_a_look_join_the_due_batch_until_the_sender_takes_it(broker):
    """A look only lists the due batches; each is sealed when the sender thread comes
    to it. A record sent in between joins its partition's due batch instead of opening
    a new one (a look at a wide topic finds thousands due: before, each was sealed at
    the look and every record sent while the sender worked down the list opened a
    second, small batch). Nothing is sealed by the look itself."""
    topic = broker.create_topic("t", 2)
    accumulator = linger0(linger_ms=50)
    state = accumulator.states["t"] = TopicBatches(topic)
    first = add(accumulator, state, 0)
    other = add(accumulator, state, 1)
    due = accumulator._due(first.created + 0.051)
    assert sorted(p for _, p, _batch in due) == [0, 1]
    assert not first.sealed and not other.sealed and accumulator.in_flight == 0
    assert add(accumulator, state, 0) is first          # joins the due batch
    for _, _p, batch in due:
        accumulator.seal_if_open(batch)
    assert first.sealed and len(first.rows) == 2 and len(other.rows) == 1
    assert accumulator.in_flight == 2 and state.open == [None, None]


def test_a_caller_taking_the_batch_its_wake_up_was_for_stops_the_wake_ups(broker):
    """The idle sender thread is woken for a new batch; the sending thread then takes
    that batch itself (`result()`): new batches stop waking it. It looks every
    CALLER_GRACE_S instead, and a batch nobody claimed for that long is due (and turns
    the wake-ups back on), as does CALLERS_QUIET_S without a new batch. A caller taking
    a batch nobody was woken for changes nothing."""
    topic = broker.create_topic("t", 1)
    accumulator = linger0()
    state = accumulator.states["t"] = TopicBatches(topic)
    quiet = add(accumulator, state)                       # the sender busy: no wake
    accumulator.seal_if_open(quiet, caller=True)
    assert accumulator.wakeups == 0 and not accumulator.callers_take
    accumulator.release(state, 0, accumulator.claim(state, 0), True)
    accumulator.sender_idle = True
    batch = add(accumulator, state)
    assert accumulator.wakeups == 1                       # woken for it
    accumulator.seal_if_open(batch)                       # the sender thread's own take
    assert not accumulator.callers_take
    accumulator.seal_if_open(batch, caller=True)          # result(): the caller's
    assert accumulator.callers_take
    accumulator.release(state, 0, accumulator.claim(state, 0), True)     # appended
    lone = add(accumulator, state)
    assert accumulator.wakeups == 1                       # not woken for this one
    accumulator.after_idle = True
    assert accumulator._due(lone.created) == []           # the caller's grace first
    later = lone.created + accumulator_module.CALLER_GRACE_S
    assert accumulator._due(later) == [(state, 0, lone)]
    assert not accumulator.callers_take                   # unclaimed: wake-ups again
    accumulator.callers_take = True
    accumulator._note_callers(lone.created + accumulator_module.CALLERS_QUIET_S / 2)
    assert accumulator.callers_take                       # batches still opening
    accumulator._note_callers(lone.created + 2 * accumulator_module.CALLERS_QUIET_S)
    assert not accumulator.callers_take                   # quiet: wake-ups again


def test_synchronous_sends_do_not_wake_the_sender_thread_per_record(broker):
    """send(...).result() in a loop (Kafka's EndToEndLatency pattern): the caller
    appends each record itself, so after the first the idle sender thread is not woken
    for each new batch (each wake put a second thread on the CPU for nothing). A record
    sent without waiting afterwards is still appended by the sender thread, and the
    wake-ups resume once one such record has waited out the grace."""
    topic = broker.create_topic("t", 1)
    producer = broker.producer(linger_ms=0)
    for i in range(200):
        producer.send("t", b"%03d" % i).result(timeout=10)
    assert producer.metrics()["sender_wakeups"] <= 20, producer.metrics()
    partition = topic.partition(0)
    lone = producer.send("t", b"lone")                    # nobody waits on it
    wait_until(lambda: partition.high_watermark == 201, 10, "the sender thread")
    assert lone.result(timeout=1).offset == 200
    wait_until(lambda: producer.metrics()["open_batches"] == 0, 10, "the sender")
    before = producer.metrics()["sender_wakeups"]
    wait_until(lambda: producer._accumulator.sender_idle, 10, "the sender to idle")
    producer.send("t", b"next")
    wait_until(lambda: partition.high_watermark == 202, 10, "the sender thread")
    assert producer.metrics()["sender_wakeups"] == before + 1
    producer.close()


@pytest.mark.parametrize("path", SEND_PATHS)
def test_fast_and_general_sends_mixed_on_one_partition_keep_send_order(broker, path):
    """Sends the fast path takes (bytes, no headers) and sends it hands to the general
    path (headers, explicit partition, first sight of a key) alternate on one partition
    within open batches: the log holds them in send order."""
    topic = broker.create_topic("t", 1)
    producer = use_path(broker.producer(linger_ms=60_000, batch_size=4000), path)
    futures = []
    for i in range(600):
        value = b"%04d" % i
        if i % 7 == 0:
            futures.append(producer.send("t", value, headers=[("h", b"x")]))
        elif i % 5 == 0:
            futures.append(producer.send("t", value, key=b"k%d" % i))
        elif i % 3 == 0:
            futures.append(producer.send("t", value, partition=0))
        else:
            futures.append(producer.send("t", value))
    producer.flush()
    assert [f.result(timeout=5).offset for f in futures] == list(range(600))
    assert [r.value for r in topic.partition(0).read(0, max_records=1000)] == \
        [b"%04d" % i for i in range(600)]
    producer.close()


@pytest.mark.parametrize("path", SEND_PATHS)
def test_sends_to_an_explicit_partition_stay_on_the_fast_path(broker, path):
    """send(partition=p) with bytes goes where it is told, keyed or not, without the
    general path (only the topic's first send takes it); a partition the producer does
    not know of, a bool or a str still gets the general path's named errors."""
    broker.create_topic("t", 3)
    producer = use_path(broker.producer(linger_ms=60_000), path)
    general = []
    real = producer._send_general

    def counted(*args):
        general.append(args[3])
        return real(*args)
    producer._send_general = counted
    futures = [producer.send("t", b"v%d" % i, key=None if i % 2 else b"k%d" % i,
                             partition=i % 3) for i in range(60)]
    producer.flush()
    assert [(f.result(timeout=5).partition, f.result().offset) for f in futures] == \
        [(i % 3, i // 3) for i in range(60)]
    assert len(general) <= 1                      # the topic's first send only
    for bad, error in ((3, logkit.UnknownTopicError), (-1, logkit.UnknownTopicError),
                       (True, logkit.ArgumentTypeError), ("0", logkit.ArgumentTypeError)):
        with pytest.raises(error):
            producer.send("t", b"v", partition=bad)
    assert general[-4:] == [3, -1, True, "0"]
    producer.close()


def test_release_can_claim_the_next_sealed_batch_in_the_same_step(broker):
    """release(claim_next=True) hands the caller p's next sealed batch with the claim
    kept (no other thread can take it meanwhile), and ends the claim when none waits."""
    accumulator = linger0()
    state = TopicBatches(broker.create_topic("t", 1))
    first = add(accumulator, state)
    accumulator.seal(state, 0)
    second = add(accumulator, state)
    accumulator.seal(state, 0)
    assert accumulator.claim(state, 0) is first
    assert accumulator.release(state, 0, first, True, claim_next=True) is second
    assert state.busy[0] and accumulator.claim(state, 0) is None
    assert accumulator.release(state, 0, second, True, claim_next=True) is None
    assert not state.busy[0] and accumulator.in_flight == 0 and accumulator.reserved == 0


def test_seal_if_open_can_claim_the_batch_for_its_caller(broker):
    """A waiting caller's seal claims the partition's first sealed batch in the same
    step; nothing is claimed while another thread appends the partition."""
    accumulator = linger0()
    state = TopicBatches(broker.create_topic("t", 1))
    batch = add(accumulator, state)
    assert accumulator.seal_if_open(batch, caller=True, claim=True) is batch
    assert state.busy[0] and not state.sealed[0] and state.open[0] is None
    later = add(accumulator, state)
    assert accumulator.seal_if_open(later, caller=True, claim=True) is None  # p is busy
    assert list(state.sealed[0]) == [later]
    assert accumulator.release(state, 0, batch, True, claim_next=True) is later


def test_a_saturated_linger0_producer_writes_full_batches(broker):
    """linger_ms=0 and one thread sending as fast as it can: batches leave full (sealed
    by the sending thread), not as the trickle a sender thread taking every open batch
    at once would write. Only the last batch per partition (the flush) may be short."""
    topic = broker.create_topic("t", 1)
    producer = broker.producer(linger_ms=0, batch_size=2000)
    for _ in range(1500):
        producer.send("t", b"v" * 100)
    producer.flush()
    partition = topic.partition(0)
    data = partition.batches_since(0, upto=partition.log_end_offset)
    counts = []
    pos = 0
    while pos < len(data):
        length = int.from_bytes(data[pos + 8:pos + 12], "big")
        counts.append(int.from_bytes(data[pos + 57:pos + 61], "big"))
        pos += 12 + length
    assert sum(counts) == 1500
    assert sum(1 for n in counts[:-1] if n < 10) <= len(counts) // 10, counts
    producer.close()


@pytest.mark.skipif(accumulator_module._sendpath is None,
                    reason="this run is already the pure-Python one")
def test_the_pure_python_send_path_passes_the_producer_tests_that_race_it():
    """The inbox protocol (pure Python) is what a build without _sendpath runs: the
    producer tests that race sealers against lock-free sends pass in a
    LOGKIT_PURE_PYTHON=1 child."""
    env = dict(os.environ, LOGKIT_PURE_PYTHON="1")
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
         "tests/clients/test_producer.py", "tests/clients/test_accumulator.py", "-k",
         "sent_again or concurrent_sends or keyed_records or mixed_on_one_partition "
         "or linger0 or callback"], cwd=CHECKOUT, env=env, capture_output=True, text=True,
        timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert " passed" in proc.stdout and "skipped" not in proc.stdout.split("\n")[-2]


@pytest.mark.parametrize("path", SEND_PATHS)
def test_every_callback_runs_once_with_its_records_metadata(broker, path):
    """Callbacks registered on futures of both send paths, with and without explicit
    timestamps, over several batches: each runs exactly once, with the same
    RecordMetadata result() gives; errbacks of stored records never run."""
    broker.create_topic("t", 3)
    producer = use_path(broker.producer(linger_ms=60_000, batch_size=1500), path)
    seen: dict[int, list] = {}
    errors: list = []
    futures = []
    for i in range(400):
        if i % 9 == 0:
            future = producer.send("t", b"%d" % i, key=b"k%d" % (i % 11),
                                   timestamp_ms=1_700_000_000_000 + i)
        else:
            future = producer.send("t", b"%d" % i, key=b"k%d" % (i % 11))
        future.add_callback(lambda md, i=i: seen.setdefault(i, []).append(md))
        future.add_errback(errors.append)
        futures.append(future)
    producer.flush()
    assert not errors
    for i, future in enumerate(futures):
        md = future.result(timeout=5)
        assert seen[i] == [md]
        if i % 9 == 0:
            assert md.timestamp == 1_700_000_000_000 + i
    late: list = []
    futures[0].add_callback(late.append)              # already stored: runs at once
    assert late == [futures[0].result()]
    producer.close()


def test_callbacks_of_a_split_batch_get_each_records_own_outcome(broker):
    """A batch over the topic's max.message.bytes is appended in parts (the Python
    loop resolves it): the record too big alone fails its errback, the others run
    their callbacks with their own offsets."""
    broker.create_topic("t", 1, config={"max.message.bytes": 400})
    producer = broker.producer(linger_ms=60_000)
    stored: list = []
    failed: list = []
    for value in (b"a" * 50, b"b" * 50, b"c" * 600, b"d" * 50):
        future = producer.send("t", value)
        future.add_callback(lambda md, v=value: stored.append((v[:1], md.offset)))
        future.add_errback(lambda exc, v=value: failed.append(v[:1]))
    producer.flush()
    assert failed == [b"c"]
    assert sorted(stored) == [(b"a", 0), (b"b", 1), (b"d", 2)]
    producer.close()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_add_callback_in_a_forked_child_raises(broker):
    """A future of the parent's, still pending, refuses a callback in a forked child
    (ForkedProcessError, through the compiled registration's fork flag too)."""
    broker.create_topic("t", 1)
    producer = broker.producer(linger_ms=60_000)
    pending = producer.send("t", b"pending")
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            pending.add_callback(print)
        except ForkedProcessError:
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    got: list = []
    pending.add_callback(got.append)                   # the parent is untouched
    producer.flush()
    assert got == [pending.result(timeout=5)]
    producer.close()


# ---- the sending threads take the due batches; the sender thread stands back ----------

def _aged(accumulator, state, partitions, start=100.0, step=0.001):
    """One open batch per partition, created `step` apart from `start` (opening order
    is creation order, as under the lock)."""
    batches = []
    for i, p in enumerate(partitions):
        batch = add(accumulator, state, p)
        batch.created = start + i * step
        batches.append(batch)
    return batches


def test_a_sending_thread_takes_the_oldest_due_batches_itself(broker):
    """`take_due` (a sending thread that opened a batch): the oldest open batches that
    are BUSY_LINGER_S old at linger_ms=0 — records are flowing — sealed for it to
    append, at most CALLER_DUE_MAX per look, stopping at the first that is not due;
    the look is remembered (the sender thread stands back) and the next one is
    QUIET_CHECK_S away."""
    busy = accumulator_module.BUSY_LINGER_S
    topic = broker.create_topic("t", 8)
    accumulator = linger0()
    state = accumulator.states["t"] = TopicBatches(topic)
    batches = _aged(accumulator, state, range(7))
    now = 100.0025 + busy                               # the first three are due
    taken = accumulator.take_due(now)
    assert taken == batches[:3]
    assert all(b.sealed for b in taken) and not any(b.sealed for b in batches[3:])
    assert [state.open[p] for p in range(3)] == [None] * 3
    assert [list(state.sealed[p]) for p in range(3)] == [[b] for b in taken]
    assert accumulator.in_flight == 3 and accumulator.open_count == 4
    assert accumulator.callers_looked == now
    assert accumulator.next_caller_look == now + accumulator_module.QUIET_CHECK_S
    later = accumulator.take_due(now + 1.0)             # all due: CALLER_DUE_MAX
    assert later == batches[3:3 + accumulator_module.CALLER_DUE_MAX]
    assert accumulator.take_due(now + 1.0) == batches[3 + len(later):]
    assert list(accumulator.opened) == []


def test_take_due_waits_linger_ms_when_it_is_set(broker):
    topic = broker.create_topic("t", 2)
    accumulator = linger0(linger_ms=50)
    state = accumulator.states["t"] = TopicBatches(topic)
    first, second = _aged(accumulator, state, range(2), step=0.01)
    assert accumulator.take_due(100.0 + 0.049) == []
    assert accumulator.take_due(100.0 + 0.051) == [first]
    assert not second.sealed


def test_the_sender_thread_stands_back_while_sending_threads_look(broker):
    """After a sending thread's look, the sender thread's look appends nothing (it
    waits) — unless it follows an idle wait (a lone record leaves at once), the buffer
    is exhausted or the producer closes — and once CALLERS_LOOKING_S passes without a
    look it takes the due batches again. A list it is working down is cut short the
    same way (`callers_took_over`)."""
    import time
    topic = broker.create_topic("t", 8)
    accumulator = linger0()
    state = accumulator.states["t"] = TopicBatches(topic)
    batches = _aged(accumulator, state, range(6), start=time.monotonic() - 10)
    taken = accumulator.take_due(time.monotonic())
    assert len(taken) == accumulator_module.CALLER_DUE_MAX    # two due ones are left
    assert accumulator.callers_took_over()
    assert accumulator.next_ready() == []                     # stood back
    assert not any(b.sealed for b in batches[len(taken):])
    accumulator.after_idle = True                             # after an idle wait
    assert [b for _, _, b in accumulator.next_ready()] == batches[len(taken):]
    for batch in batches:
        accumulator.seal_if_open(batch)           # what the sender does on its way
    more = _aged(accumulator, state, range(6), start=time.monotonic() - 5)
    accumulator.callers_looked = time.monotonic()
    accumulator.after_idle = True               # a burst began while it slept: a few
    assert [b for _, _, b in accumulator.next_ready()] == \
        more[:accumulator_module.CALLER_DUE_MAX]
    for batch in more:
        accumulator.seal_if_open(batch)
    _aged(accumulator, state, range(2), start=time.monotonic() - 5)
    accumulator.callers_looked = time.monotonic()
    accumulator.exhausted = 1                                 # a sender waits for room
    assert not accumulator.callers_took_over()
    assert len(accumulator.next_ready()) == 2
    accumulator.exhausted = 0
    accumulator.callers_looked = time.monotonic() - accumulator_module.CALLERS_LOOKING_S
    assert not accumulator.callers_took_over()                # nobody looked lately
    assert len(accumulator.next_ready()) == 2


def _appends_by_thread(producer):
    """Count each thread's batch appends (wraps this producer's `_append`)."""
    import collections
    import threading
    counts = collections.Counter()
    append = producer._append

    def counted(batch, deadline=None):
        counts[threading.current_thread() is threading.main_thread()] += 1
        return append(batch, deadline)
    producer._append = counted
    return counts


def test_a_saturated_sender_over_many_partitions_appends_the_due_batches_itself(broker):
    """linger_ms=0, one thread sending unique keys over 300 partitions as fast as it
    can: a partition's batch is BUSY_LINGER_S old long before it fills, so the batches
    fall due — and the sending thread appends them between its sends, not the sender
    thread (the two taking the GIL and the accumulator's lock from each other halved
    the rate at 1,000 partitions). Every record is stored once, in send order."""
    partitions = 300
    topic = broker.create_topic("t", partitions)
    producer = broker.producer(linger_ms=0)
    counts = _appends_by_thread(producer)
    futures = [producer.send("t", b"v" * 100, key=b"k%07d" % i) for i in range(60_000)]
    producer.flush()
    caller, sender = counts[True], counts[False]
    assert caller + sender >= partitions
    assert sender <= (caller + sender) // 10, (caller, sender)
    offsets: dict[int, int] = {}
    for future in futures:
        metadata = future.result(timeout=10)
        assert metadata.offset == offsets.get(metadata.partition, 0)
        offsets[metadata.partition] = metadata.offset + 1
    assert sum(topic.partition(p).log_end_offset for p in range(partitions)) == 60_000
    producer.close()


def test_batches_left_when_the_sending_thread_stops_are_appended_without_a_flush(broker):
    """The sender thread stands back only while sending threads look: a burst over
    many partitions that ends without flush() is appended all the same."""
    topic = broker.create_topic("t", 100)
    producer = broker.producer(linger_ms=0)
    futures = [producer.send("t", b"v", key=b"k%05d" % i) for i in range(5_000)]
    stored = lambda: sum(topic.partition(p).log_end_offset for p in range(100))  # noqa
    wait_until(lambda: stored() == 5_000, 30, "the sender thread's appends")
    assert all(future.done() for future in futures)
    producer.close()


def test_no_room_in_the_buffer_the_sending_thread_appends_the_oldest_batches(broker):
    """A record that needs a new batch and finds no room in buffer_memory: `add`
    without `wait` returns at once, and the sending thread takes the oldest open
    batches whatever their age (`take_due(everything=True)`) to append them itself —
    what the sender thread would do — instead of waiting for it."""
    topic = broker.create_topic("t", 40)
    accumulator = linger0(buffer_memory=4 * 16384)
    state = accumulator.states["t"] = TopicBatches(topic)
    batches = []
    for p in range(40):                                           # fill the buffer
        batch, sealed = accumulator.add(state, p, ROW, ROW_BYTES, deadline=0.0,
                                        wait=False)
        if batch is None:
            break
        batches.append(batch)
    assert batch is None and not sealed and accumulator.exhausted == 0
    assert 1 < len(batches) < 40
    for i, batch in enumerate(batches):
        batch.created = 100.0 + i * 0.001                         # all fresh
    taken = accumulator.take_due(100.0, everything=True)          # any age
    assert taken == batches[:accumulator_module.CALLER_DUE_MAX]
    assert all(b.sealed for b in taken) and not batches[-1].sealed
