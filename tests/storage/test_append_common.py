"""The append in C — under the lock (`appendpath.append_common`, used by
`PartitionLog._append_fast`) and whole, locks and doorbell included (`appendpath.Appender`,
`PartitionLog._arm`) — is the twin of the Python append for the cases it takes: the
same bytes in every file and the same tail, whatever mix of index entries, index
reservations, full indexes, rolls and timestamps the appends go through; it hands back
everything else untouched; and a failed write through it stores and publishes nothing."""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import textwrap
import threading

import pytest

import logkit
from logkit import log_append as partition_log
from logkit.records import encode_batch
from logkit.tail import TAIL_FILE, TailFile
from tests.crashpoints import driver

appendpath = pytest.importorskip("logkit._appendpath",
                              reason="the optional C extension is not built here")

ROOT_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# Tail fields that hold the wall clock of an append, which two runs cannot share.
CLOCK_FIELDS = ("boot_id", "roll_time_ms", "first_unflushed_ms")


class Counting:
    """appendpath.append_common, counting the appends it made and the ones it handed back."""

    def __init__(self) -> None:
        self.appended = self.handed_back = 0

    def __call__(self, *args):
        result = appendpath.append_common(*args)
        if result < 0:
            self.handed_back += 1
        else:
            self.appended += 1
        return result


class CountingAppenders:
    """Stands in for appendpath.Appender in logkit.log: makes real ones and counts, over
    all of them, the appends they made and the ones they handed back."""

    def __init__(self) -> None:
        self.appended = self.handed_back = 0

    def __call__(self, *args):
        return _CountedAppender(self, appendpath.Appender(*args))


class _CountedAppender:
    def __init__(self, counts: CountingAppenders, appender) -> None:
        self.counts, self.appender = counts, appender

    def append(self, batch) -> int:
        result = self.appender.append(batch)
        if result < 0:
            self.counts.handed_back += 1
        else:
            self.counts.appended += 1
        return result


def c_path(monkeypatch, path: str) -> Counting | CountingAppenders | None:
    """Set which appends logkit.log makes in C: none ("python"), the one under a lock
    the Python code took ("under the lock"), or, first, the whole one ("in one call");
    returns the counter of the C path chosen."""
    if path == "python":
        monkeypatch.setattr(partition_log, "_append_common", None)
        monkeypatch.setattr(partition_log, "_Appender", None)
        return None
    if path == "under the lock":
        monkeypatch.setattr(partition_log, "_Appender", None)
        counting = Counting()
        monkeypatch.setattr(partition_log, "_append_common", counting)
        return counting
    counting = CountingAppenders()
    monkeypatch.setattr(partition_log, "_append_common", appendpath.append_common)
    monkeypatch.setattr(partition_log, "_Appender", counting)
    return counting


C_PATHS = ("under the lock", "in one call")


@pytest.fixture
def c_appends(monkeypatch) -> None:
    """Both C appends on, as a build with the extension has them (also when the suite
    runs with LOGKIT_PURE_PYTHON=1)."""
    monkeypatch.setattr(partition_log, "_append_common", appendpath.append_common)
    monkeypatch.setattr(partition_log, "_Appender", appendpath.Appender)

# A child process's preamble for each C path: it counts its calls in `calls`.
COUNTING_PREAMBLES = {
    "under the lock": """
        import logkit
        from logkit import log_append as log
        from logkit._appendpath import append_common
        calls = []
        def counting(*args):
            calls.append(1)
            return append_common(*args)
        log._append_common = counting
        log._Appender = None
    """,
    "in one call": """
        import logkit
        from logkit import log_append as log
        from logkit._appendpath import Appender, append_common
        calls = []
        class counting:
            def __init__(self, *args):
                self.appender = Appender(*args)
            def append(self, batch):
                calls.append(1)
                return self.appender.append(batch)
        log._Appender = counting
        log._append_common = append_common
    """,
}


def run_counting(body: str, root: str, *, path: str, wrapper: tuple[str, ...] = ()
                 ) -> subprocess.CompletedProcess:
    """Run `body` (with `sys.argv[1]` = root) after the preamble of C path `path` in a
    fresh process, under `wrapper` (an strace command line) when given."""
    script = textwrap.dedent(COUNTING_PREAMBLES[path]) + textwrap.dedent(body)
    return subprocess.run([*wrapper, sys.executable, "-c", script, root], cwd=ROOT_DIR,
                          capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, PYTHONPATH=ROOT_DIR))


def batches(count: int, seed: int, steps: tuple[int, ...]) -> list[bytearray]:
    """Batches of 1-6 records, values of 1-300 bytes, timestamps moved by one of
    `steps` per batch (growing and stepping back: the time index both grows and skips;
    all 0: it stays at one entry while the offset index fills)."""
    import random
    rng = random.Random(seed)
    out, ts = [], 1_700_000_000_000
    for i in range(count):
        ts += rng.choice(steps)
        rows = [(b"k%d" % i if rng.random() < 0.5 else None,
                 rng.randbytes(rng.randrange(1, 300)), [],
                 ts) for _ in range(rng.randrange(1, 7))]
        out.append(encode_batch(rows))
    return out


def run(root: str, config: dict, stream: list[bytearray]) -> tuple[dict, dict]:
    """Append `stream` to a fresh one-partition topic; (every file's bytes, the tail)."""
    with logkit.Broker(root) as broker:
        partition = broker.create_topic("t", 1, config=config).partition(0)
        expected = 0
        for batch in stream:
            assert partition.append_batch(bytearray(batch), verify=False) == expected
            expected += int.from_bytes(batch[23:27], "big") + 1     # lastOffsetDelta + 1
        partition.check()
        directory = partition.directory
        tail = TailFile(os.path.join(directory, TAIL_FILE), read_only=True)
        try:
            state = {k: v for k, v in tail.read()._asdict().items() if k not in CLOCK_FIELDS}
        finally:
            tail.close()
        files = {}
        for name in sorted(os.listdir(directory)):
            if name.endswith((".log", ".index", ".timeindex")):
                with open(os.path.join(directory, name), "rb") as f:
                    files[name] = f.read()
    return files, state


GROWING = (1, 5, 40, -30)
SCENARIOS = {
    # every few hundred bytes an index entry; rolls by size; small index files: the
    # time index fills up and rolls the segment first
    "rolls and full indexes": ({"segment.bytes": 6000, "index.interval.bytes": 300,
                                "segment.index.bytes": 120}, 600, GROWING),
    # one timestamp throughout: the offset index fills up and rolls the segment
    "full offset index": ({"index.interval.bytes": 100, "segment.index.bytes": 120}, 600,
                          (0,)),
    # an entry per batch into default-sized indexes: past the first 64 KiB reservation
    # of the offset index (8-byte entries) and of the time index (12-byte entries)
    "reservations": ({"index.interval.bytes": 0}, 9000, GROWING),
}


@pytest.mark.parametrize("path", C_PATHS)
@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_the_c_append_writes_the_bytes_the_python_append_writes(tmp_path, monkeypatch,
                                                                   scenario, path):
    config, count, steps = SCENARIOS[scenario]
    stream = batches(count, len(scenario), steps)
    c_path(monkeypatch, "python")
    python_files, python_tail = run(str(tmp_path / "python"), config, stream)
    counting = c_path(monkeypatch, path)
    c_files, c_tail = run(str(tmp_path / "c"), config, stream)
    assert counting.appended > count // 2, (counting.appended, counting.handed_back)
    assert counting.handed_back > 0           # the rolls and reservations went back
    assert sorted(c_files) == sorted(python_files)
    if scenario != "reservations":
        assert len(python_files) > 3 * 10          # more than ten segments, three files each
    for name in python_files:
        assert c_files[name] == python_files[name], name
    assert c_tail == python_tail


def test_another_writers_roll_hands_the_append_back_and_offsets_stay_contiguous(tmp_path):
    """Two brokers on one directory are two appenders with their own segment lists (as
    two processes are): each one's rolls change the other's list under it."""
    config = {"segment.bytes": 3000, "index.interval.bytes": 200}
    with logkit.Broker(tmp_path) as first, logkit.Broker(tmp_path) as second:
        first.create_topic("t", 1, config=config)
        parts = [first.topic("t").partition(0), second.topic("t").partition(0)]
        written = []
        for i in range(400):
            value = b"w%d-%d" % (i % 2, i) + b"." * (i % 50)
            offset = parts[i % 2].append([(None, value, [], None)])
            written.append((offset, value))
        assert [o for o, _ in written] == list(range(400))
        for p in parts:
            assert [(r.offset, r.value) for r in p.read(0, max_records=1000)] == written
            p.check()
        segments = [n for n in os.listdir(parts[0].directory) if n.endswith(".log")]
        assert len(segments) > 10


needs_strace = pytest.mark.skipif(driver.strace_usable() is not None,
                                       reason=driver.strace_usable() or "")


@needs_strace
@pytest.mark.parametrize("path", C_PATHS)
@pytest.mark.parametrize("error", ["EIO", "ENOSPC"])
def test_a_failed_write_through_the_c_append_stores_and_publishes_nothing(tmp_path, error,
                                                                         path):
    with logkit.Broker(tmp_path) as broker:
        directory = broker.create_topic("t", 1).partition(0).directory
    log_path = os.path.join(directory, f"{0:020d}.log")
    done = run_counting("""
        import sys
        with logkit.Broker(sys.argv[1]) as b:
            p = b.topic("t").partition(0)
            for i in range(3):          # the 3rd write of the file fails (see strace)
                try:
                    print("appended", p.append([(None, b"v%d" % i, [], None)]))
                except logkit.StorageError as exc:
                    print("failed", type(exc).__name__, exc.operation, p.log_end_offset)
            print("calls", len(calls))
    """, str(tmp_path), path=path, wrapper=(
        driver.STRACE, "-f", "-qq", "-o", "/dev/null", "-P", log_path,
        "-e", "trace=pwrite64", "-e", f"inject=pwrite64:error={error}:when=3"))
    assert done.returncode == 0, done.stderr
    lines = done.stdout.split("\n")
    # the first append is the general one; the next two go through the C append
    assert lines[:2] == ["appended 0", "appended 1"], done.stdout
    expected = "DiskFullError" if error == "ENOSPC" else "StorageError"
    assert lines[2] == f"failed {expected} append 2", done.stdout
    assert lines[3] == "calls 2", done.stdout
    with logkit.Broker(tmp_path) as broker:
        p = broker.topic("t").partition(0)
        assert os.path.getsize(log_path) == p._log.tail().active_size
        assert p.append([(None, b"after", [], None)]) == 2
        assert [r.value for r in p.read(0, max_records=10)] == [b"v0", b"v1", b"after"]
        p.check()


def test_what_the_c_append_hands_back_it_leaves_untouched(tmp_path, c_appends):
    """Each case the Python append must decide comes back as -1 with no byte written:
    an index entry past the reserved blocks (a full disk must fail at the reservation,
    not at a store through the map), another segment list, a torn tail, a sync due."""
    with logkit.Broker(tmp_path) as broker:
        p = broker.create_topic("t", 1, config={"index.interval.bytes": 0}).partition(0)
        p.append([(None, b"first", [], None)])            # the general append,
        p.append([(None, b"second", [], None)])   # whose first index entry reserves blocks
        log = p._log
        segment = log._fast_segment
        fd, index, index_reserved, timeindex, timeindex_reserved = segment.append_files()
        config = log.config
        tail_map = log._tail_file.mm

        def attempt(**change) -> int:
            args = dict(index_reserved=index_reserved, timeindex_reserved=timeindex_reserved,
                        version=log._segments_version, flush=config["flush.messages"])
            args.update(change)
            return appendpath.append_common(
                tail_map, encode_batch([(None, b"x", [], 4_000_000_000_000)]), fd, index,
                args["index_reserved"], timeindex, args["timeindex_reserved"],
                segment.base_offset, args["version"], partition_log.BOOT_ID,
                config["segment.bytes"], config["segment.ms"],
                config["index.interval.bytes"], args["flush"])

        def state() -> tuple:
            return (bytes(tail_map[:168]), os.path.getsize(segment.path),
                    bytes(index[:64]), bytes(timeindex[:64]))

        before = state()
        assert attempt(index_reserved=8) == -1               # room for one entry only
        assert attempt(timeindex_reserved=12) == -1
        assert attempt(version=log._segments_version + 1) == -1
        assert attempt(flush=2) == -1                        # the 2nd message syncs
        seq = int.from_bytes(tail_map[8:16], "little")
        tail_map[8:16] = (seq + 1).to_bytes(8, "little")      # a writer died mid-update
        assert attempt() == -1
        tail_map[8:16] = seq.to_bytes(8, "little")
        assert state() == before
        assert attempt() == 2                                # and, unchanged, it appends
        assert state() != before
        assert [r.value for r in p.read(0, max_records=5)] == [b"first", b"second", b"x"]
        p.check()


@pytest.mark.parametrize("path", C_PATHS)
def test_a_short_write_through_the_c_append_is_a_full_disk_and_is_cut_back(tmp_path, path):
    """A real short write: RLIMIT_FSIZE lets the pwrite write only part of the batch."""
    done = run_counting("""
        import os, resource, signal, sys
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)     # EFBIG / a short write instead
        with logkit.Broker(sys.argv[1]) as b:
            p = b.create_topic("t", 1).partition(0)
            p.append([(None, b"a", [], None)])
            p.append([(None, b"b", [], None)])
            size = p._log.tail().active_size
            resource.setrlimit(resource.RLIMIT_FSIZE, (size + 100, resource.RLIM_INFINITY))
            try:
                p.append([(None, b"x" * 1000, [], None)])
            except logkit.DiskFullError as exc:
                print("full", exc.__cause__)
            resource.setrlimit(resource.RLIMIT_FSIZE,
                               (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
            log_path = os.path.join(p.directory, f"{0:020d}.log")
            print("cut", os.path.getsize(log_path) == size, p.log_end_offset)
            print("calls", len(calls))
    """, str(tmp_path), path=path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[:3] == [
        "full [Errno 28] short write (100 of 1070 bytes)", "cut True 2", "calls 2"], \
        done.stdout
    with logkit.Broker(tmp_path) as broker:
        p = broker.topic("t").partition(0)
        assert p.append([(None, b"after", [], None)]) == 2
        assert [r.value for r in p.read(0, max_records=10)] == [b"a", b"b", b"after"]
        p.check()


def test_the_whole_c_append_hands_back_what_stands_in_its_way(tmp_path, c_appends):
    """The one-call append (appendpath.Appender) takes no lock that is not free at once
    and no batch the Python append would refuse, rewrite or name as corrupt: each such
    call comes back as -1 with nothing written, nothing published and no lock held."""
    with logkit.Broker(tmp_path) as broker:
        p = broker.create_topic("t", 1, config={"index.interval.bytes": 0,
                                                "max.message.bytes": 2000}).partition(0)
        p.append([(None, b"first", [], None)])            # the general append arms it
        log = p._log
        appender = log._appender
        assert appender is not None
        segment = log._fast_segment
        tail_map = log._tail_file.mm

        def batch(value: bytes = b"x") -> bytearray:
            return encode_batch([(None, value, [], 4_000_000_000_000)])

        def state() -> tuple:
            return (bytes(tail_map[:168]), os.path.getsize(segment.path),
                    broker.doorbell.value())

        def nothing_held() -> bool:
            """Every lock free, as another thread and another process see them (the
            thread lock is reentrant: this thread would get it even if it leaked)."""
            free = []

            def look() -> None:
                free.append(log._append_lock.acquire(False))
                if free[-1]:
                    log._append_lock.release()
                free.append(log._thread_lock.acquire(False))
                if free[-1]:
                    log._thread_lock.release()
            other = threading.Thread(target=look)
            other.start()
            other.join(30)
            fd = os.open(os.path.join(p.directory, TAIL_FILE), os.O_RDWR)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                free.append(True)
            except BlockingIOError:
                free.append(False)
            finally:
                os.close(fd)
            return free == [True, True, True]

        before = state()
        assert nothing_held()
        with log._append_lock:                           # another thread appending
            assert appender.append(batch()) == -1
        taken, done = threading.Event(), threading.Event()

        def reader() -> None:                            # a reader of this process
            with log._thread_lock:
                taken.set()
                done.wait(30)
        thread = threading.Thread(target=reader)
        thread.start()
        assert taken.wait(30)
        assert appender.append(batch()) == -1
        done.set()
        thread.join(30)
        fd = os.open(os.path.join(p.directory, TAIL_FILE), os.O_RDWR)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)               # another process's append
            assert appender.append(batch()) == -1
        finally:
            os.close(fd)
        wrong_length = batch()
        wrong_length[8:12] = (len(wrong_length)).to_bytes(4, "big")
        assert appender.append(wrong_length) == -1           # corrupt: Python names it
        assert appender.append(batch(b"v" * 3000)) == -1     # over max.message.bytes
        assert appender.append([bytes(batch())]) == -1       # pieces need a bytearray head
        assert appender.append(b"not a batch") == -1
        assert state() == before and nothing_held()
        assert appender.handed_back == 7 and appender.appended == 0
        with pytest.raises(logkit.CorruptRecordError):
            p.append_batch(wrong_length, verify=False)
        with pytest.raises(logkit.RecordTooLargeError):
            p.append_batch(batch(b"v" * 3000), verify=False)
        assert state() == before
        assert appender.append(batch()) == 1                 # unchanged: it appends,
        after = state()
        assert after[1] > before[1] and after[2] > before[2]     # and rings the doorbell
        assert nothing_held()
        assert [r.value for r in p.read(0, max_records=5)] == [b"first", b"x"]
        p.check()


def test_the_whole_c_append_takes_only_batches_the_topic_keeps_as_they_are(tmp_path, c_appends):
    """A topic that recompresses (compression.type other than the batch's) or stamps
    LogAppendTime rewrites a batch: the one-call append hands those back; a topic whose
    every append syncs (flush.messages=1) gets no one-call append."""
    with logkit.Broker(tmp_path) as broker:
        gz = broker.create_topic("gz", 1, config={"compression.type": "gzip"}).partition(0)
        gz.append([(None, b"first", [], None)])
        plain = encode_batch([(None, b"plain", [], None)])
        assert gz._log._appender.append(plain) == -1
        assert gz.append_batch(plain, verify=False) == 1    # the Python append recompresses
        assert gz._log._appender.append(encode_batch([(None, b"z", [], None)],
                                                     codec=1)) == 2
        assert [r.value for r in gz.read(0, max_records=5)] == [b"first", b"plain", b"z"]
        stamped = broker.create_topic("lat", 1, config={
            "message.timestamp.type": "LogAppendTime"}).partition(0)
        stamped.append([(None, b"a", [], 1)])
        stamped.append([(None, b"b", [], 1)])
        assert stamped._log._appender is None
        assert all(r.timestamp > 1 for r in stamped.read(0, max_records=5))
        durable = broker.create_topic("sync", 1, config={"flush.messages": 1}).partition(0)
        durable.append([(None, b"a", [], None)])           # every append syncs: the
        assert durable._log._appender is None              # one-call append never could
        syncs = durable._log.sync_count
        durable.append([(None, b"b", [], None)])
        assert durable._log.sync_count == syncs + 1


def test_a_forked_child_cannot_append_through_its_parents_c_appender(tmp_path, c_appends):
    with logkit.Broker(tmp_path) as broker:
        p = broker.create_topic("t", 1).partition(0)
        p.append([(None, b"first", [], None)])
        appender = p._log._appender
        assert appender is not None
        pid = os.fork()
        if pid == 0:                                       # the child: handed back
            code = 0 if appender.append(encode_batch([(None, b"c", [], None)])) == -1 else 1
            os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert p.log_end_offset == 1
        assert appender.append(encode_batch([(None, b"parent", [], None)])) == 1


def test_the_collector_sees_the_c_appenders_references(tmp_path, c_appends):
    """The appender holds the log's bound methods (a reference cycle): the collector
    must see through it, or a log dropped unclosed would never be freed."""
    import gc
    with logkit.Broker(tmp_path) as broker:
        p = broker.create_topic("t", 1).partition(0)
        p.append([(None, b"first", [], None)])
        log = p._log
        appender = log._appender
        assert gc.is_tracked(appender)
        referents = gc.get_referents(appender)
        assert any(getattr(r, "__self__", None) is log for r in referents)
        assert log._append_lock in referents and log._thread_lock in referents
