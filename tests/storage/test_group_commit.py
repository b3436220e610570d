"""Group commit: appends that flush.messages makes durable share fdatasyncs, are never
readable before theirs, and all fail when the sync covering them fails (logkit/log.py,
docs/storage.md "Group commit").

The interleavings are made deterministic by holding a real fdatasync until the test
lets it go (a gate around `os.fdatasync`, which the partition log calls outside its
locks); the I/O errors are real ones, injected by strace into fdatasync of the segment
file (as tests/storage/test_io_errors.py does), or raised by the gate. Nothing is timed.
"""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import textwrap
import threading

import pytest

import logkit
from logkit.log import PartitionLog
from tests.crashpoints import driver
from tests.helpers.tailpoke import simulate_reboot

ROOT_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DURABLE = {"flush.messages": 1}


class SyncGate:
    """Wraps os.fdatasync: the first call of each thread named in `held` (of any thread,
    for "*") waits until `release()`
    (then run the real sync, or fail with `error`); every call is counted per thread."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.real = os.fdatasync
        self.held: set[str] = set()
        self.entered = threading.Event()
        self.opened = threading.Event()
        self.error: int | None = None
        self.calls: dict[str, int] = {}
        monkeypatch.setattr(os, "fdatasync", self)

    def __call__(self, fd: int) -> None:
        name = threading.current_thread().name
        self.calls[name] = self.calls.get(name, 0) + 1
        if name in self.held or "*" in self.held:
            self.held.discard(name)
            self.held.discard("*")
            self.entered.set()
            self.opened.wait()
            if self.error is not None:
                raise OSError(self.error, os.strerror(self.error))
        self.real(fd)

    def release(self, error: int | None = None) -> None:
        self.error = error
        self.opened.set()


@pytest.fixture
def gate(monkeypatch):
    """A SyncGate, opened at teardown whatever the test did (no writer stays parked)."""
    held = SyncGate(monkeypatch)
    yield held
    held.opened.set()


def one(value: bytes) -> list[tuple]:
    return [(b"k", value, [], None)]


def start(name: str, fn, *args) -> tuple[threading.Thread, dict]:
    """Run fn(*args) in a thread called `name`; the dict gets its result or error."""
    out: dict = {}

    def run() -> None:
        try:
            out["result"] = fn(*args)
        except BaseException as exc:        # the test inspects it
            out["error"] = exc

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    return thread, out


def wait_for_end(partition_log: PartitionLog, end: int) -> None:
    """Until `end` is published as the log end (appends parked in their sync wait)."""
    while partition_log.tail().log_end_offset < end:
        threading.Event().wait(0.001)


def parked(partition: logkit.Partition, gate: SyncGate, n: int) -> list:
    """Hold the first writer in its fdatasync, then start n-1 more writers behind it;
    returns [(thread, out)] once all n batches are published."""
    end = partition.log_end_offset + n
    gate.held.add("w0")
    writers = [start("w0", partition.append, one(b"v0"))]
    gate.entered.wait()
    for i in range(1, n):
        writers.append(start(f"w{i}", partition.append, one(b"v%d" % i)))
    wait_for_end(partition._log, end)
    return writers


def test_appends_during_a_sync_share_the_next_one(broker, gate):
    """Three durable appends, two of them made while the first one's sync runs: two
    fdatasyncs in all, every append returns its own offset, and the recovery point and
    high watermark end at the log end."""
    partition = broker.create_topic("t", 1, config=DURABLE).partition(0)
    writers = parked(partition, gate, 3)
    gate.release()
    for thread, _ in writers:
        thread.join()
    assert sorted(out["result"] for _, out in writers) == [0, 1, 2]
    assert sum(gate.calls.values()) == 2
    assert partition._log.sync_count == 2
    tail = partition._log.tail()
    assert (tail.recovery_point, tail.high_watermark, tail.log_end_offset) == (3, 3, 3)
    partition.check()


def test_a_batch_is_not_readable_before_its_sync(broker, gate):
    """While the sync of a durable append runs, its batch is published (the next
    append goes after it) but below no reader's high watermark."""
    partition = broker.create_topic("t", 1, config=DURABLE).partition(0)
    partition.append(one(b"synced"))
    writers = parked(partition, gate, 1)
    assert partition.log_end_offset == 2
    assert partition.high_watermark == 1
    assert [r.value for r in partition.read(0)] == [b"synced"]
    consumer = broker.consumer(group_id=None)
    consumer.assign([logkit.TopicPartition("t", 0)])
    consumer.seek(logkit.TopicPartition("t", 0), 0)
    assert [r.value for r in consumer.poll(timeout_ms=0)] == [b"synced"]
    gate.release()
    writers[0][0].join()
    assert writers[0][1] == {"result": 1}
    assert [r.value for r in partition.read(0)] == [b"synced", b"v0"]
    consumer.close()


@pytest.mark.parametrize("error", [errno.EIO, errno.ENOSPC])
def test_a_failed_sync_fails_every_batch_it_would_have_covered(broker, gate, error):
    """fdatasync fails while two more appends wait behind it: all three raise a named
    StorageError, all three batches are cut (nothing unsynced stays in the log), and
    the partition goes on: the next append takes their offset."""
    partition = broker.create_topic("t", 1, config=DURABLE).partition(0)
    partition.append(one(b"before"))
    writers = parked(partition, gate, 3)
    gate.release(error)
    for thread, _ in writers:
        thread.join()
    errors = [out.get("error") for _, out in writers]
    assert all(isinstance(e, logkit.StorageError) for e in errors), writers
    assert all(e.operation == "fsync" for e in errors)
    covered = errors[0]
    assert isinstance(covered.__cause__, OSError) and covered.__cause__.errno == error
    assert partition.log_end_offset == partition.high_watermark == 1
    partition.check()
    assert [r.value for r in partition.read(0)] == [b"before"]
    assert partition.append(one(b"after")) == 1
    assert [r.value for r in partition.read(0)] == [b"before", b"after"]


def test_a_producer_future_fails_with_the_sync(broker, gate):
    """acks=1 to a flush.messages=1 topic: the future completes only after the sync,
    and with its error when the sync fails."""
    broker.create_topic("t", 1, config=DURABLE)
    with broker.producer(linger_ms=0) as producer:
        gate.held.add("*")          # the sender thread's or this one's, whichever syncs
        threading.Thread(target=lambda: (gate.entered.wait(),
                                         gate.release(errno.EIO))).start()
        future = producer.send("t", b"v")
        with pytest.raises(logkit.StorageError):
            future.result(timeout=60)
        assert producer.send("t", b"w").result(timeout=60).offset == 0
    assert [r.value for r in broker.topic("t").partition(0).read(0)] == [b"w"]


def test_the_producer_appends_on_while_a_sync_runs(broker, gate):
    """One thread sends 50 records in small batches while the first sync is held: every
    batch is appended meanwhile (the producer does not wait for the sync to append the
    next one), no future completes before its sync, and one more sync covers all the
    rest."""
    partition = broker.create_topic("t", 1, config=DURABLE).partition(0)
    gate.held.add("logkit-sync")           # the producer's SyncWaiter thread
    with broker.producer(batch_size=300, linger_ms=0) as producer:
        try:
            futures = [producer.send("t", b"v%02d" % i, key=b"k") for i in range(50)]
            gate.entered.wait()
            flusher = start("flusher", producer.flush)
            wait_for_end(partition._log, 50)
            assert partition.high_watermark < 50
            assert not any(f.done() for f in futures[partition.high_watermark:])
        finally:
            gate.release()                 # else closing the producer waits forever
        flusher[0].join()
        assert flusher[1] == {"result": None}
        assert [f.result(timeout=60).offset for f in futures] == list(range(50))
    assert sum(gate.calls.values()) == 2
    batches = partition.batch_headers(0)
    assert len(batches) > 2
    assert partition.high_watermark == 50


def test_a_batch_the_shared_recovery_point_covers_costs_no_sync(broker, gate):
    """Two openers of one partition (as two processes are): while one's flusher is held
    in its sync, the other syncs both openers' batches and publishes the recovery
    point; the first opener's waiting appender then returns without a sync of its own."""
    partition = broker.create_topic("t", 1, config=DURABLE).partition(0)
    first = partition._log
    second = PartitionLog(first.directory, "t", 0, first.config)
    try:
        gate.held.add("w0")
        leader = start("w0", first.append_records, one(b"a"))
        gate.entered.wait()
        follower = start("w1", first.append_records, one(b"b"))
        wait_for_end(first, 2)
        assert second.append_records(one(b"c")) == 2     # syncs all three
        assert second.tail().recovery_point == 3
        gate.release()
        for thread, out in (leader, follower):
            thread.join()
            assert "error" not in out
        assert gate.calls == {"w0": 1, threading.current_thread().name: 1}
        assert first.sync_count == 1
    finally:
        second.close()


_needs_strace = pytest.mark.skipif(driver.strace_usable() is not None,
                                   reason=f"needs strace: {driver.strace_usable()}")


@_needs_strace
def test_a_real_fdatasync_error_is_a_named_error_and_stores_nothing(tmp_path):
    """A real EIO from fdatasync of the segment (strace injection on that path only):
    the append raises StorageError naming the operation, nothing of it is stored, and
    what was acknowledged before stays."""
    root = str(tmp_path / "data")
    with logkit.Broker(root, background=False) as broker:
        p = broker.create_topic("t", 1, config=DURABLE).partition(0)
        p.append(one(b"kept"))
        segment = os.path.join(p.directory, "00000000000000000000.log")
    code = textwrap.dedent("""
        import sys, logkit
        broker = logkit.Broker(sys.argv[1], background=False)
        p = broker.topic("t").partition(0)
        try:
            p.append([(b"k", b"lost", [], None)])
            print("stored")
        except logkit.StorageError as exc:
            print("named", exc.operation)
        print("end", p.log_end_offset, p.high_watermark)
        broker.close()
    """)
    argv = [driver.STRACE, "-f", "-qq", "-o", "/dev/null", "-P", segment, "-e",
            "trace=fdatasync", "-e", "inject=fdatasync:error=EIO", sys.executable, "-c",
            code, root]
    result = subprocess.run(argv, cwd=ROOT_DIR, capture_output=True, text=True,
                            timeout=120, env=dict(os.environ, PYTHONPATH=ROOT_DIR))
    assert result.stdout.split("\n")[:2] == ["named fsync", "end 1 1"], result
    with logkit.Broker(root, background=False) as broker:
        p = broker.topic("t").partition(0)
        p.check()
        assert [r.value for r in p.read(0)] == [b"kept"]


CHILD = """
import os, sys, threading, logkit
broker = logkit.Broker(sys.argv[1], background=False)
p = broker.topic("t").partition(0)
p.append([(b"k", b"acked", [], None)])
print("acked", flush=True)
real = os.fdatasync
def hang(fd):
    print("published", flush=True)
    threading.Event().wait()
os.fdatasync = hang
p.append([(b"k", b"unacked", [], None)])
"""


@pytest.mark.parametrize("reboot", [False, True])
def test_a_kill_between_publish_and_sync_loses_nothing_acknowledged(tmp_path, reboot):
    """A writer SIGKILLed after publishing a durable batch and before its sync: the
    acknowledged batch is there after reopening (and after a simulated OS crash); the
    unacknowledged one is never read below the high watermark before a sync covers it."""
    root = str(tmp_path / "data")
    with logkit.Broker(root, background=False) as broker:
        broker.create_topic("t", 1, config=DURABLE)
    child = subprocess.Popen([sys.executable, "-c", CHILD, root], cwd=ROOT_DIR,
                             stdout=subprocess.PIPE, text=True,
                             env=dict(os.environ, PYTHONPATH=ROOT_DIR))
    assert child.stdout.readline() == "acked\n"
    assert child.stdout.readline() == "published\n"
    child.send_signal(signal.SIGKILL)
    child.wait()
    directory = os.path.join(root, "t-0")
    if reboot:
        simulate_reboot(directory)
    with logkit.Broker(root, background=False) as broker:
        p = broker.topic("t").partition(0)
        values = [r.value for r in p.read(0)]
        assert values[0] == b"acked"
        if not reboot:
            assert values == [b"acked"] and p.log_end_offset == 2
        p.append(one(b"later"))                # syncs whatever is below its end
        p.check()
        values = [r.value for r in p.read(0)]
        assert values[0] == b"acked" and values[-1] == b"later"
        assert p.high_watermark == p.log_end_offset == len(values)
