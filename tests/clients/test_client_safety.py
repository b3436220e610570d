"""The clients under stress from outside their happy path: closed from another thread,
a listener that raises, a stalled appender in another process, bad timestamps, headers
and argument types, fork, a planted doorbell link. Real brokers, threads and processes;
the only time bounds are generous "did not hang" limits."""

from __future__ import annotations

import mmap
import os
import re
import signal
import subprocess
import sys
import threading
import time
import traceback
import warnings
from contextlib import contextmanager

import pytest

import logkit
from tests.helpers.clients import SEND_PATHS, use_path
from logkit import (ClosedError, ConfigError, ForkedProcessError, LogkitError,
                    LogkitTimeoutError)
from logkit.errors import ArgumentTypeError
from logkit.notify import Doorbell
from tests.helpers.procs import wait_until
from tests.helpers.waits import until, wait_for_doorbell_wait

HOLDER = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "helpers",
                      "stalled_lock_holder.py")
HANG_S = 20             # "did not hang": far above any legitimate wait in these tests




def in_thread(fn):
    """Start fn in a daemon thread; returns (thread, outcome) where outcome gets
    "result" or "error" when fn finishes."""
    outcome: dict = {}

    def run():
        try:
            outcome["result"] = fn()
        except BaseException as exc:     # handed to the test to assert on
            outcome["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, outcome


def finished(thread, what):
    thread.join(timeout=HANG_S)
    assert not thread.is_alive(), f"{what} still blocked after {HANG_S} s"


def wait_for_exit(pid, what):
    """waitpid with a bound: a hung child is killed and the test fails."""
    deadline = time.monotonic() + HANG_S
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.01)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    raise AssertionError(f"{what} did not exit within {HANG_S} s")


# ---- 1. close from another thread ------------------------------------------------------

def test_closing_a_consumer_from_another_thread_wakes_its_poll_and_leaves_no_ghost_member(
        broker):
    broker.create_topic("t", 2)
    consumer = broker.consumer("t", group_id="g", auto_offset_reset="earliest")
    consumer.poll(0)
    assert len(broker.group("g").members()) == 1
    polling, outcome = in_thread(lambda: consumer.poll(10_000))
    wait_for_doorbell_wait([polling])                  # it is blocked in the wait
    consumer.close()
    finished(polling, "poll(10000) after close()")
    assert isinstance(outcome.get("error"), ClosedError), outcome
    assert broker.group("g").members() == []           # the poll did not re-join
    with pytest.raises(ClosedError):
        consumer.poll(0)


def test_closing_a_consumer_ends_iteration_in_another_thread(broker):
    broker.create_topic("t", 1)
    consumer = broker.consumer("t", auto_offset_reset="earliest")
    iterating, outcome = in_thread(lambda: list(consumer))
    wait_for_doorbell_wait([iterating])
    consumer.close()
    finished(iterating, "iteration after close()")
    assert outcome == {"result": []}


def test_closing_the_broker_during_a_poll_raises_closed_error_in_the_poller(tmp_path):
    broker = logkit.Broker(tmp_path / "data")
    broker.create_topic("t", 1)
    consumers = [broker.consumer("t", auto_offset_reset="earliest"),
                 broker.consumer("t", group_id="g", auto_offset_reset="earliest")]
    polls = [in_thread(lambda c=c: c.poll(10_000)) for c in consumers]
    wait_for_doorbell_wait([thread for thread, _ in polls])
    broker.close()
    for thread, outcome in polls:
        finished(thread, "poll(10000) after broker.close()")
        assert isinstance(outcome.get("error"), ClosedError), outcome


def test_a_doorbell_closed_while_threads_wait_and_ring_raises_nothing(tmp_path):
    """close() races ring(), value() and wait() in other threads: no AttributeError, no
    BufferError, no crash; once closed, waits return at once and ring does nothing."""
    for _ in range(20):
        doorbell = Doorbell(str(tmp_path))
        stop = threading.Event()
        errors: list[BaseException] = []
        steps = [0, 0, 0]                  # calls made by each thread

        def loop(i, step):
            try:
                while not stop.is_set():
                    step()
                    steps[i] += 1
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=loop, args=(i, step)) for i, step in
                   enumerate((doorbell.ring, lambda: doorbell.wait(doorbell.value(), 0.001),
                              lambda: doorbell.wait(doorbell.value(), 0.001)))]
        for thread in threads:
            thread.start()
        # close while every thread is in its loop, then let each call again on the closed
        # doorbell: states waited on, not delays guessed
        until(lambda: all(steps) or errors, "every thread calling")
        doorbell.close()
        after_close = list(steps)
        until(lambda: all(n > m for n, m in zip(steps, after_close)) or errors,
              "every thread calling the closed doorbell")
        stop.set()
        for thread in threads:
            thread.join(timeout=HANG_S)
        assert errors == []
    waiting, outcome = in_thread(lambda: [doorbell.wait(doorbell.value(), 60)
                                          for _ in range(1000)])
    finished(waiting, "waits on a closed doorbell")
    assert "error" not in outcome
    doorbell.ring()
    doorbell.close()                                    # safe twice


# ---- 2. a rebalance listener that raises -----------------------------------------------

class ListenerFailed(Exception):
    pass


def test_an_on_revoke_that_raises_still_releases_the_partitions_and_poll_raises_it(broker):
    topic = broker.create_topic("t", 2)
    revoked: list = []

    def on_revoke(tps):
        revoked.append(tps)
        if len(revoked) == 1:
            raise ListenerFailed("the listener failed once")

    first = broker.consumer("t", group_id="g", auto_offset_reset="earliest",
                            enable_auto_commit=False, on_revoke=on_revoke)
    first.poll(0)                                     # owns both partitions
    second = broker.consumer("t", group_id="g", auto_offset_reset="earliest",
                             enable_auto_commit=False)
    with pytest.raises(ListenerFailed):               # learns the rebalance; raises after
        first.poll(0)                                 # releasing what it lost
    assert revoked == [[logkit.TopicPartition("t", 0), logkit.TopicPartition("t", 1)]]
    producer = broker.producer()
    for i in range(10):
        for p in range(2):
            producer.send("t", b"p%d-%d" % (p, i), partition=p)
    producer.flush()
    got_second: list = []
    wait_until(lambda: got_second.extend(second.poll(50)) or len(got_second) >= 10, HANG_S,
               "the new owner to receive its partition's records")
    got_first: list = []
    wait_until(lambda: got_first.extend(first.poll(50)) or len(got_first) >= 10, HANG_S,
               "the old owner to read its remaining partition")
    assert len(second.assignment()) == len(first.assignment()) == 1
    assert not second.assignment() & first.assignment()
    for records, consumer in ((got_second, second), (got_first, first)):
        [tp] = consumer.assignment()
        assert [r.value for r in records] == [b"p%d-%d" % (tp.partition, i)
                                             for i in range(10)]
    assert topic.partition(0).log_end_offset == 10


# ---- 3. every wait honours its timeout ---------------------------------------------------

def process_state(pid):
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]


@contextmanager
def stalled_appender(directory):
    """Another process holding the partition's append lock, stopped (SIGSTOP)."""
    holder = subprocess.Popen([sys.executable, HOLDER, directory], stdout=subprocess.PIPE,
                              text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        wait_until(lambda: process_state(holder.pid) == "T", HANG_S, "the holder to stop")
        yield holder
    finally:
        holder.send_signal(signal.SIGCONT)
        try:
            holder.wait(timeout=HANG_S)
        except subprocess.TimeoutExpired:
            holder.kill()
            holder.wait()
        holder.stdout.close()


def test_a_stopped_appender_in_another_process_bounds_result_and_flush_and_not_poll(broker):
    topic = broker.create_topic("t", 1)
    producer = broker.producer(linger_ms=60_000)    # batches stay open: result() appends
    for i in range(3):
        producer.send("t", b"before-%d" % i)
    producer.flush()
    consumer = broker.consumer("t", auto_offset_reset="earliest")
    with stalled_appender(topic.partition(0).directory):
        future = producer.send("t", b"during")
        waiting, outcome = in_thread(lambda: future.result(timeout=2))
        finished(waiting, "result(timeout=2)")
        assert isinstance(outcome.get("error"), LogkitTimeoutError), outcome
        assert not future.done()        # the caller's timeout, not the record's: still queued
        flushing, outcome = in_thread(lambda: producer.flush(timeout=1))
        finished(flushing, "flush(timeout=1)")
        assert isinstance(outcome.get("error"), LogkitTimeoutError), outcome
        polling, outcome = in_thread(lambda: [consumer.poll(500) for _ in range(3)])
        finished(polling, "poll(500) beside a stopped writer")
        assert [[r.value for r in batch] for batch in outcome["result"]] == \
            [[b"before-0", b"before-1", b"before-2"], [], []]
    metadata = future.result(timeout=HANG_S)        # the lock is free: the record is stored
    assert topic.partition(0).read(metadata.offset, max_records=1)[0].value == b"during"
    assert [r.value for r in consumer.poll(5000)] == [b"during"]


def test_a_batch_not_appended_within_delivery_timeout_fails_alone(broker):
    """The sender thread waits for a stopped process's lock at most delivery_timeout_ms;
    the future and errback get the LogkitTimeoutError itself; the other partition's
    batch is stored meanwhile."""
    topic = broker.create_topic("t", 2)
    producer = broker.producer(delivery_timeout_ms=1000)
    errors: list = []
    stored: list = []
    with stalled_appender(topic.partition(0).directory):
        stuck = producer.send("t", b"stuck", partition=0).add_errback(errors.append)
        fine = producer.send("t", b"fine", partition=1).add_callback(stored.append)
        assert fine.result(timeout=HANG_S).offset == 0
        waiting, outcome = in_thread(lambda: stuck.exception(timeout=HANG_S))
        finished(waiting, "a batch past delivery_timeout_ms")
        assert isinstance(outcome["result"], LogkitTimeoutError)
        assert errors == [outcome["result"]]
    assert [m.partition for m in stored] == [1]
    with pytest.raises(LogkitTimeoutError):
        stuck.result()
    assert topic.partition(0).log_end_offset == 0
    assert producer.send("t", b"after", partition=0).result(timeout=HANG_S).offset == 0


def test_delivery_timeout_ms_is_validated(broker):
    with pytest.raises(ConfigError, match="delivery_timeout_ms"):
        broker.producer(delivery_timeout_ms=-1)


# ---- 4, 5. timestamps and headers are checked at send() --------------------------------

@pytest.mark.parametrize("path", SEND_PATHS)
def test_a_timestamp_outside_int64_is_refused_at_send_and_its_batch_mates_are_stored(
        broker, path):
    topic = broker.create_topic("t", 1)
    producer = use_path(broker.producer(linger_ms=60_000), path)
    first = producer.send("t", b"innocent-1")
    for bad in (2**63, 2**64, -1, -5, 1.5, True, "1"):
        with pytest.raises(ConfigError, match=re.escape(repr(bad))):
            producer.send("t", b"bad", timestamp_ms=bad)
        with pytest.raises(ConfigError, match=re.escape(repr(bad))):
            producer.send("t", b"bad", key=b"k", timestamp=bad)
    edge = producer.send("t", b"edge", timestamp_ms=2**63 - 1)
    with pytest.warns(UserWarning, match="looks like seconds"):
        zero = producer.send("t", b"zero", timestamp_ms=0)
    last = producer.send("t", b"innocent-2")
    producer.flush()
    records = topic.partition(0).read(0)
    assert [r.value for r in records] == [b"innocent-1", b"edge", b"zero", b"innocent-2"]
    assert [records[1].timestamp, records[2].timestamp] == [2**63 - 1, 0]
    assert [f.result().offset for f in (first, edge, zero, last)] == [0, 1, 2, 3]
    assert edge.result().timestamp == 2**63 - 1


@pytest.mark.parametrize("path", SEND_PATHS)
def test_header_keys_must_be_str_and_values_bytes_or_none(broker, path):
    topic = broker.create_topic("t", 1)
    producer = use_path(broker.producer(linger_ms=60_000), path)
    producer.send("t", b"innocent")
    for headers, message in (([(b"k", b"v")], r"header key b'k'"),
                             ([("k", "text")], r"header value 'text'"),
                             ([("k", 1)], r"header value 1"),
                             ([("\ud800", b"v")], r"header key"),
                             ([("k",)], r"header"),
                             (["kv"], r"header")):
        with pytest.raises(ConfigError, match=message):
            producer.send("t", b"bad", headers=headers)
    producer.send("t", b"good", headers=[("k", None), ("k2", bytearray(b"x")), ("k3", b"")])
    producer.flush()
    records = topic.partition(0).read(0)
    assert [r.value for r in records] == [b"innocent", b"good"]
    assert list(records[1].headers) == [("k", None), ("k2", b"x"), ("k3", b"")]


@pytest.mark.parametrize("path", SEND_PATHS)
def test_headers_given_as_a_dict_are_stored_as_pairs_and_other_shapes_are_named(
        broker, path):
    """`headers={"h": b"v"}` (confluent-kafka's form) is taken like the list of pairs
    kafka-python takes; a str, bytes or number is refused with an ArgumentTypeError
    (a ConfigError and a TypeError) saying which forms are expected."""
    topic = broker.create_topic("t", 1)
    producer = use_path(broker.producer(), path)
    producer.send("t", b"dict", headers={"h": b"v", "n": None}).result(timeout=10)
    producer.send("t", b"pairs", headers=[("h", b"v"), ("n", None)]).result(timeout=10)
    producer.send("t", b"none", headers={}).result(timeout=10)
    records = topic.partition(0).read(0)
    assert [list(r.headers) for r in records] == [[("h", b"v"), ("n", None)]] * 2 + [[]]
    for bad in ("h=v", b"hv", 5):
        with pytest.raises(ArgumentTypeError, match="a dict .* or a list of"):
            producer.send("t", b"bad", headers=bad)
    with pytest.raises(TypeError, match="must be bytes or None"):
        producer.send("t", b"bad", headers={"h": "text"})
    assert topic.partition(0).log_end_offset == 3
    producer.close()


@pytest.mark.parametrize("path", SEND_PATHS)
def test_a_timestamp_that_looks_like_seconds_warns_at_the_callers_line(broker, path):
    """docs/design.md §6: send() with a timestamp below 10^11 ms (before 1973) warns with a
    UserWarning pointing at the caller's send() and stores the record as given; a
    timestamp in milliseconds does not warn."""
    topic = broker.create_topic("t", 1)
    producer = use_path(broker.producer(), path)
    seconds = int(time.time())
    with pytest.warns(UserWarning, match="looks like seconds") as warned:
        producer.send("t", b"s", timestamp_ms=seconds).result(timeout=10)
    assert warned[0].filename == __file__
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        producer.send("t", b"ms", timestamp_ms=seconds * 1000).result(timeout=10)
        producer.send("t", b"now").result(timeout=10)
    assert [r.timestamp for r in topic.partition(0).read(0)][:2] == [seconds, seconds * 1000]
    producer.close()


@pytest.mark.parametrize("path", SEND_PATHS)
def test_arguments_of_the_wrong_type_to_send_are_named(broker, path):
    """Each wrong type given to send() is an ArgumentTypeError (a LogkitError, a
    ConfigError and a TypeError) naming the argument and what it takes; nothing is
    stored."""
    topic = broker.create_topic("t", 2)
    producer = use_path(broker.producer(), path)
    for kwargs, message in ((dict(topic=5), "topic must be a str"),
                            (dict(value="text"), "must be bytes"),
                            (dict(key=7), "must be bytes"),
                            (dict(partition="0"), "partition must be None or an int"),
                            (dict(timestamp_ms="1700000000000"), "timestamp must be"),
                            (dict(timestamp_ms=1.7e12), "timestamp must be")):
        call = {"topic": "t", "value": b"v", **kwargs}
        with pytest.raises(ArgumentTypeError, match=message) as raised:
            producer.send(call.pop("topic"), **call)
        assert isinstance(raised.value, (LogkitError, ConfigError, TypeError))
        assert isinstance(raised.value, TypeError) and isinstance(raised.value, ConfigError)
    with pytest.raises(logkit.UnknownTopicError):
        producer.send("t", b"v", partition=2)                 # an int out of range
    producer.flush()
    assert [p.log_end_offset for p in topic.partitions] == [0, 0]
    producer.close()


def test_arguments_of_the_wrong_type_to_poll_seek_and_commit_are_named(broker):
    """poll(timeout_ms="100") and the like raise an ArgumentTypeError (a ConfigError
    and a TypeError) naming the argument and the type expected, not a TypeError from
    inside; values out of range stay ConfigError / OffsetOutOfRangeError."""
    broker.create_topic("t", 1)
    tp = logkit.TopicPartition("t", 0)
    consumer = broker.consumer(group_id="g", auto_offset_reset="earliest")
    consumer.assign([tp])
    for kwargs, message in ((dict(timeout_ms="100"), "timeout_ms must be an int"),
                            (dict(timeout_ms=None), "timeout_ms must be an int"),
                            (dict(timeout_ms=True), "timeout_ms must be an int"),
                            (dict(max_records="5"), "max_records must be a positive int")):
        with pytest.raises(ArgumentTypeError, match=message) as raised:
            consumer.poll(**kwargs)
        assert isinstance(raised.value, TypeError) and isinstance(raised.value, ConfigError)
    for kwargs, message in ((dict(timeout_ms=float("nan")), "finite"),
                            (dict(max_records=0), "positive integer")):
        with pytest.raises(ConfigError, match=message) as raised:
            consumer.poll(**kwargs)
        assert not isinstance(raised.value, TypeError)
    assert consumer.poll(timeout_ms=10.5) == [] and consumer.poll(timeout_ms=-5) == []
    with pytest.raises(ArgumentTypeError, match="offset must be a non-negative int"):
        consumer.seek(tp, "5")
    with pytest.raises(logkit.OffsetOutOfRangeError):
        consumer.seek(tp, -1)
    with pytest.raises(ArgumentTypeError, match="expected a TopicPartition"):
        consumer.seek("t", 0)
    with pytest.raises(ArgumentTypeError, match="expected a TopicPartition"):
        consumer.position(0)
    with pytest.raises(ArgumentTypeError, match=r"commit\(\) takes a dict"):
        consumer.commit([(tp, 1)])
    with pytest.raises(ArgumentTypeError, match="offset must be a non-negative int"):
        consumer.commit({tp: "1"})
    assert consumer.committed(tp) is None                  # nothing was committed
    consumer.commit({tp: 0})
    assert consumer.committed(tp) == 0
    consumer.close()


# ---- 6. fork ---------------------------------------------------------------------------

def child_attempts(producer, consumer, pending, report_fd) -> int:
    """In a forked child: every use of the parent's clients raises ForkedProcessError;
    close() returns without touching anything. A bit per failed expectation."""
    code = 0
    attempts = (lambda: producer.send("t", b"child"),
                lambda: producer.send("t", b"child", key=b"k-0"),
                lambda: producer.send("t", b"child", headers=[("h", b"v")]),
                producer.flush,
                lambda: pending.result(timeout=1),
                lambda: consumer.poll(0),
                consumer.commit)
    for bit, attempt in enumerate(attempts):
        try:
            attempt()
            code |= 1 << bit
            os.write(report_fd, b"attempt %d did not raise\n" % bit)
        except ForkedProcessError:
            pass
        except BaseException:
            code |= 1 << bit
            os.write(report_fd, traceback.format_exc().encode()[-400:])
    producer.close()
    consumer.close()
    return code


def test_clients_used_in_a_forked_child_raise_and_leave_the_parent_intact(broker):
    topic = broker.create_topic("t", 2)
    producer = broker.producer()
    lingering = broker.producer(linger_ms=60_000)
    consumer = broker.consumer("t", group_id="g", auto_offset_reset="earliest")
    consumer.poll(0)
    sent: list = []
    stop = threading.Event()

    def produce():
        i = 0
        while not stop.is_set():
            sent.append((b"v-%d" % i, producer.send("t", b"v-%d" % i, key=b"k-%d" % (i % 7))))
            i += 1
            if i % 50 == 0:
                sent[-1][1].result(timeout=HANG_S)

    producing = threading.Thread(target=produce)
    producing.start()
    try:
        for _ in range(10):
            pending = lingering.send("t", b"pending")
            read_fd, write_fd = os.pipe()
            pid = os.fork()
            if pid == 0:
                code = 127
                try:
                    os.close(read_fd)
                    code = child_attempts(producer, consumer, pending, write_fd)
                finally:
                    os._exit(code)
            os.close(write_fd)
            code = wait_for_exit(pid, "the forked child")
            with os.fdopen(read_fd, "rb") as report:
                message = report.read().decode(errors="replace")
            assert code == 0, message
            before = len(sent)                     # the next fork lands mid-stream
            until(lambda: len(sent) > before, "the producer thread sending")
    finally:
        stop.set()
        producing.join(timeout=HANG_S)
    producer.flush()
    lingering.flush()
    assert len(sent) > 10
    for value, future in sent:
        metadata = future.result(timeout=HANG_S)
        [record] = topic.partition(metadata.partition).read(metadata.offset, max_records=1)
        assert record.value == value
    for p in range(2):
        topic.partition(p).check()
    assert len(broker.group("g").members()) == 1      # the children did not leave for it
    consumer.commit()


def test_a_doorbell_closed_in_a_forked_child_keeps_working_in_the_parent(broker):
    broker.create_topic("t", 1)
    consumer = broker.consumer("t", auto_offset_reset="earliest")
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            broker.doorbell.close()
            broker.close()
            code = 0
        finally:
            os._exit(code)
    assert wait_for_exit(pid, "the forked child") == 0
    before = broker.doorbell.value()
    polling, outcome = in_thread(lambda: consumer.poll(HANG_S * 1000))
    wait_for_doorbell_wait([polling])                  # asleep on the parent's page
    broker.producer().send("t", b"wake").result(timeout=HANG_S)
    finished(polling, "a poll after the child closed its doorbell")
    assert [r.value for r in outcome["result"]] == [b"wake"]
    assert broker.doorbell.value() != before


# ---- 7. the doorbell file ----------------------------------------------------------------

def test_the_doorbell_file_is_allocated_not_sparse(tmp_path):
    Doorbell(str(tmp_path)).close()
    st = os.stat(tmp_path / "doorbell")
    assert st.st_size == mmap.PAGESIZE
    assert st.st_blocks * 512 >= mmap.PAGESIZE


def test_a_symlink_planted_at_the_doorbell_path_is_refused_and_not_followed(tmp_path):
    target = tmp_path / "elsewhere"
    target.write_bytes(b"precious")
    os.symlink(target, tmp_path / "doorbell")
    with pytest.raises(LogkitError, match=re.escape(str(tmp_path / "doorbell"))):
        Doorbell(str(tmp_path))
    assert target.read_bytes() == b"precious"
