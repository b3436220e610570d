"""Storage safety regressions (issues #8 and #15): each test reproduces one finding of
the reliability probe with real files and real processes, and proves the fix."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import threading
import uuid

import pytest

import logkit
from logkit import (CorruptRecordError, DiskFullError, ForkedProcessError, LogkitTimeoutError,
                    StorageError, UnknownTopicError)
from logkit.records import encode_batch, stamp_base_offset
from tests.helpers.procs import ROOT_DIR
from tests.helpers.tailpoke import poke

SMALL = {"segment.bytes": 1024, "index.interval.bytes": 128}


def run_python(code: str, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code), *args],
                          cwd=ROOT_DIR, capture_output=True, text=True, timeout=timeout)


def values(records) -> list[tuple[int, bytes]]:
    return [(r.offset, r.value) for r in records]


def fill(partition, count, prefix=b"v"):
    return [partition.append([(None, prefix + b"%d" % i, [], None)]) for i in range(count)]


@contextlib.contextmanager
def small_tmpfs(size="4m"):
    """A real, small filesystem that fills up; skip where mounting is not allowed."""
    if os.geteuid() != 0:
        pytest.skip("needs root to mount a small tmpfs for a real full disk")
    path = f"/tmp/logkit-full-{uuid.uuid4().hex[:8]}"
    os.makedirs(path)
    if subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", path],
                      capture_output=True).returncode:
        os.rmdir(path)
        pytest.skip("mounting a tmpfs is not permitted here")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", path], capture_output=True)
        os.rmdir(path)


def fill_disk(path: str) -> str:
    """Write a file until the filesystem is full; returns its path (unlink to free)."""
    filler = os.path.join(path, "filler")
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT)
    try:
        for chunk in (65536, 512, 1):
            with contextlib.suppress(OSError):
                while os.write(fd, b"\0" * chunk):
                    pass
    finally:
        os.close(fd)
    return filler


# ---- F1 / #15.1: bytes past the committed size are never sealed ----------------------

def test_a_roll_never_seals_a_batch_that_a_killed_writer_left_unpublished(tmp_path):
    with logkit.Broker(tmp_path) as broker:
        p = broker.create_topic("t", 1).partition(0)
        fill(p, 5)
        # What a writer SIGKILLed after its pwrite and before its publish leaves: a whole,
        # CRC-valid batch stamped with the next offset, past the committed end.
        ghost = encode_batch([(None, b"never-acknowledged", [], None)])
        stamp_base_offset(ghost, 5, 0)
        tail = p._log.tail()
        log_path = os.path.join(p.directory, f"{tail.active_base_offset:020d}.log")
        with open(log_path, "r+b") as f:
            f.seek(tail.active_size)
            f.write(ghost)
    # Another process appends with a roll first, as the probe did.
    result = run_python("""
        import sys, logkit
        with logkit.Broker(sys.argv[1]) as b:
            p = b.topic("t").partition(0)
            p._log.roll()
            print(p.append([(None, b"acknowledged-5", [], None)]))
    """, str(tmp_path))
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "5"
    for _ in range(2):                     # before and after a reopen
        with logkit.Broker(tmp_path) as broker:
            p = broker.topic("t").partition(0)
            got = values(p.read(0, 100))
            assert got[5] == (5, b"acknowledged-5")
            assert b"never-acknowledged" not in [v for _, v in got]
            p.check()


def test_a_write_that_fails_on_a_full_disk_stores_nothing_and_later_rolls_stay_readable():
    with small_tmpfs("3m") as root:
        with logkit.Broker(root) as broker:
            p = broker.create_topic("t", 1, config={"segment.index.bytes": 4096}).partition(0)
            fill(p, 10)
            filler = fill_disk(root)
            with pytest.raises(DiskFullError) as failed:
                p.append([(None, os.urandom(200_000), [], None)])
            assert isinstance(failed.value.__cause__, OSError)
            assert p.log_end_offset == 10
            os.unlink(filler)
            p._log.roll()
            fill(p, 3, b"after")
            assert [v for _, v in values(p.read(0, 100))][10:] == [b"after0", b"after1",
                                                                  b"after2"]
            p.check()
        with logkit.Broker(root) as broker:
            p = broker.topic("t").partition(0)
            assert len(p.read(0, 100)) == 13
            p.check()


# ---- F6: a full disk is an error, never SIGBUS ------------------------------------

def test_creating_a_topic_on_a_full_disk_raises_instead_of_killing_the_process():
    with small_tmpfs("2m") as root:
        with logkit.Broker(root):
            pass
        fill_disk(root)
        result = run_python("""
            import sys, logkit
            b = logkit.Broker(sys.argv[1])
            try:
                b.create_topic("big", 2, config={"segment.index.bytes": 1048576})
            except logkit.StorageError as exc:
                print("raised", type(exc).__name__)
            print("topics", b.topics())
        """, root)
        assert result.returncode == 0, (result.returncode, result.stderr)   # -7: SIGBUS
        assert "raised" in result.stdout
        assert "topics []" in result.stdout              # all or nothing
        assert not [n for n in os.listdir(root) if n.startswith("big-")]


# ---- #15.3 / F5: retention order, and gaps are never skipped -----------------------

def make_segments(broker, name="t", count=40):
    p = broker.create_topic(name, 1, config=SMALL).partition(0)
    fill(p, count)
    bases = sorted(int(n[:20]) for n in os.listdir(p.directory) if n.endswith(".log"))
    assert len(bases) >= 3
    return p, bases


def test_retention_interrupted_after_publishing_its_new_start_is_finished_at_open(tmp_path):
    with logkit.Broker(tmp_path) as broker:
        p, bases = make_segments(broker)
        directory = p.directory
    # The state a crash leaves between retention's publish and its renames.
    poke(directory, log_start_offset=bases[2])
    with open(os.path.join(directory, f"{99999:020d}.index"), "wb") as f:
        f.write(b"\0" * 8)                        # an orphan index whose log is gone
    with logkit.Broker(tmp_path) as broker:
        p = broker.topic("t").partition(0)
        assert p.log_start_offset == bases[2]
        assert p.read(bases[2], 1)[0].offset == bases[2]
        p.check()
        names = os.listdir(directory)
        assert f"{bases[0]:020d}.log" not in names
        assert f"{99999:020d}.index" not in names


@pytest.mark.parametrize("missing", ["first", "middle"])
def test_a_missing_segment_raises_on_read_instead_of_jumping_the_gap(tmp_path, missing):
    with logkit.Broker(tmp_path) as broker:
        p, bases = make_segments(broker)
        directory = p.directory
    gone = bases[0] if missing == "first" else bases[1]
    for suffix in (".log", ".index", ".timeindex"):
        os.unlink(os.path.join(directory, f"{gone:020d}{suffix}"))
    with logkit.Broker(tmp_path) as broker:
        p = broker.topic("t").partition(0)
        with pytest.raises(CorruptRecordError):
            p.read(p.log_start_offset, 1000)
        with pytest.raises(CorruptRecordError) as info:       # never an assert
            p.check()
        assert info.value.path and info.value.position >= 0
        consumer = broker.consumer("t", auto_offset_reset="earliest")
        with pytest.raises(CorruptRecordError):
            for _ in range(5):
                consumer.poll(timeout_ms=50, max_records=1000)
        consumer.close()


def test_a_segment_truncated_at_a_batch_boundary_raises_on_read(tmp_path):
    with logkit.Broker(tmp_path) as broker:
        p, bases = make_segments(broker)
        directory = p.directory
    path = os.path.join(directory, f"{bases[0]:020d}.log")
    from tests.helpers.tailpoke import batch_positions
    os.truncate(path, batch_positions(path)[-1])     # lose its last batch, cleanly
    with logkit.Broker(tmp_path) as broker:
        p = broker.topic("t").partition(0)
        with pytest.raises(CorruptRecordError):
            p.read(0, 1000)


# ---- F3 / F4 / #15.2: deletion --------------------------------------------------------

def test_a_topic_deleted_by_another_process_refuses_this_processes_appends(tmp_path):
    with logkit.Broker(tmp_path) as broker:
        p = broker.create_topic("t", 1, config=SMALL).partition(0)
        fill(p, 3)
        result = run_python("""
            import sys, logkit
            with logkit.Broker(sys.argv[1]) as b:
                b.delete_topic("t")
                b.create_topic("t", 1)
        """, str(tmp_path))
        assert result.returncode == 0, result.stderr
        with pytest.raises(UnknownTopicError):
            p.append([(None, b"after-delete", [], None)])
        with pytest.raises(UnknownTopicError):
            p.read(0, 10)
        producer = broker.producer()          # goes to the new incarnation
        assert producer.send("t", b"x", partition=0).result(timeout=5).offset == 0
        producer.close()
    with logkit.Broker(tmp_path) as broker:
        fresh = broker.topic("t").partition(0)
        assert [r.value for r in fresh.read(0, 100)] == [b"x"]
        fresh.check()


@pytest.mark.parametrize("stop_after", ["flag", "rename"])
def test_a_delete_interrupted_midway_is_finished_and_never_undone(tmp_path, stop_after):
    with logkit.Broker(tmp_path) as broker:
        topic = broker.create_topic("t", 2)
        for partition in topic.partitions:
            fill(partition, 4)
        record = broker.meta.get_topic("t")
        for partition in topic.partitions:     # step (1) of delete_topic
            partition._log.mark_deleted()
        if stop_after == "rename":             # step (2); the process dies before (3)
            broker._topics.pop("t").close()
            for n in range(2):
                os.rename(os.path.join(tmp_path, f"t-{n}"),
                          os.path.join(tmp_path, f".{record['topic_id']}-{n}.delete"))
    with logkit.Broker(tmp_path) as broker:
        with pytest.raises(UnknownTopicError):
            broker.topic("t")
        assert "t" not in broker.topics()
        fresh = broker.create_topic("t", 2)
        assert [p.log_end_offset for p in fresh.partitions] == [0, 0]
    assert not [n for n in os.listdir(tmp_path) if n.endswith(".delete")]


def test_a_topic_with_the_longest_legal_name_deletes_cleanly(tmp_path):
    name = "n" * 249
    with logkit.Broker(tmp_path) as broker:
        fill(broker.create_topic(name, 1).partition(0), 3)
        broker.delete_topic(name)
        assert broker.create_topic(name, 1).partition(0).log_end_offset == 0
    assert sorted(os.listdir(tmp_path)) == sorted(
        ["logkit.json", "meta", "doorbell", f"{name}-0"])


def test_an_orphan_directory_is_not_adopted_by_a_new_topic(tmp_path):
    with logkit.Broker(tmp_path) as broker:
        fill(broker.create_topic("t", 1).partition(0), 3)
        directory = broker.topic("t").partition(0).directory
        broker.meta.delete_topic("t")           # the record gone, the files left behind
        broker._topics.pop("t").close()
        assert os.path.isdir(directory)
        assert broker.create_topic("t", 1).partition(0).log_end_offset == 0


# ---- F8: descriptors ------------------------------------------------------------------

def test_a_long_log_and_a_wide_topic_work_under_a_low_descriptor_limit(tmp_path):
    result = run_python("""
        import resource, sys, logkit
        resource.setrlimit(resource.RLIMIT_NOFILE, (128, 128))
        with logkit.Broker(sys.argv[1]) as b:
            p = b.create_topic("long", 1, config={"segment.bytes": 1024}).partition(0)
            for i in range(300):                  # one segment per record
                p.append([(None, b"x" * 900, [], None)])
            assert len(p.read(0, 1000)) == 300
            b.enforce_retention()
            wide = b.create_topic("wide", 300)
            wide.partition(299).append([(None, b"y", [], None)])
            print("ok")
    """, str(tmp_path))
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


# ---- F11: waits honour their timeouts; readers never wait on writers ------------------

def test_a_stalled_lock_holder_times_out_appends_and_does_not_block_reads(tmp_path):
    with logkit.Broker(tmp_path) as broker:
        p = broker.create_topic("t", 1).partition(0)
        fill(p, 3)
        holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent("""
            import fcntl, os, sys, time
            fd = os.open(sys.argv[1], os.O_RDWR)
            fcntl.flock(fd, fcntl.LOCK_EX)
            print("locked", flush=True)
            time.sleep(60)
        """), os.path.join(p.directory, "logkit.tail")], stdout=subprocess.PIPE, text=True)
        try:
            assert holder.stdout.readline().strip() == "locked"
            os.kill(holder.pid, signal.SIGSTOP)
            events = []

            def append_blocked():
                try:
                    p._log.append_records([(None, b"late", [], None)])
                except Exception as exc:       # the default bound is long: not reached
                    events.append(("appender", type(exc).__name__))

            blocked = threading.Thread(target=append_blocked, daemon=True)
            blocked.start()
            assert values(p.read(0, 10)) == [(0, b"v0"), (1, b"v1"), (2, b"v2")]
            events.append(("reader", "done"))
            with pytest.raises(LogkitTimeoutError):
                p._log.append_batch(encode_batch([(None, b"t", [], None)]),
                                    lock_timeout_s=0.3)
            assert events[0] == ("reader", "done")
        finally:
            os.kill(holder.pid, signal.SIGKILL)
            holder.wait()
        blocked.join(timeout=30)
        assert not blocked.is_alive()
        assert [r.value for r in p.read(0, 10)][3:] == [b"late"]


# ---- F2: fork -------------------------------------------------------------------------

def test_a_partition_inherited_across_fork_refuses_use_in_the_child(tmp_path):
    with logkit.Broker(tmp_path) as broker:
        p = broker.create_topic("t", 1).partition(0)
        fill(p, 2)
        read_fd, write_fd = os.pipe()
        pid = os.fork()
        if pid == 0:                                  # the child
            code = 0
            for attempt in (lambda: p.read(0, 10),
                            lambda: p.append([(None, b"child", [], None)]),
                            lambda: broker.topic("t")):
                try:
                    attempt()
                    code |= 1
                except ForkedProcessError:
                    pass
                except BaseException:
                    code |= 2
            try:
                with logkit.Broker(tmp_path) as own:      # a fresh Broker works
                    own.topic("t").partition(0).append([(None, b"child-own", [], None)])
            except BaseException as exc:
                os.write(write_fd, repr(exc).encode()[:200])
                code |= 4
            os._exit(code)
        os.close(write_fd)
        _, status = os.waitpid(pid, 0)
        message = os.read(read_fd, 200)
        os.close(read_fd)
        assert os.waitstatus_to_exitcode(status) == 0, message
        fill(p, 1, b"parent")
        assert [r.value for r in p.read(0, 10)] == [b"v0", b"v1", b"child-own", b"parent0"]
        p.check()


# ---- F14: links -----------------------------------------------------------------------

def test_a_symlink_planted_for_a_partition_file_is_refused(tmp_path):
    root = tmp_path / "root"
    outside = tmp_path / "outside"
    outside.write_bytes(b"precious")
    with logkit.Broker(root) as broker:
        fill(broker.create_topic("t", 1).partition(0), 2)
    tail = root / "t-0" / "logkit.tail"
    tail.unlink()
    tail.symlink_to(outside)
    with logkit.Broker(root) as broker:
        with pytest.raises(StorageError):
            broker.topic("t")
    assert outside.read_bytes() == b"precious"


def test_a_symlinked_partition_directory_is_refused(tmp_path):
    root = tmp_path / "root"
    elsewhere = tmp_path / "elsewhere"
    with logkit.Broker(root) as broker:
        fill(broker.create_topic("t", 1).partition(0), 2)
    os.rename(root / "t-0", elsewhere)
    (root / "t-0").symlink_to(elsewhere)
    with logkit.Broker(root) as broker:
        with pytest.raises(StorageError):
            broker.topic("t").partition(0).read(0, 1)
    assert sorted(os.listdir(elsewhere)) == sorted(
        ["00000000000000000000.log", "00000000000000000000.index",
         "00000000000000000000.timeindex", "logkit.tail", "partition.metadata"])


def test_data_files_are_readable_by_their_owner_only(tmp_path):
    with logkit.Broker(tmp_path) as broker:
        fill(broker.create_topic("t", 1).partition(0), 1)
    directory = tmp_path / "t-0"
    for name in os.listdir(directory):
        assert os.stat(directory / name).st_mode & 0o077 == 0, name


# ---- #15.7: close ---------------------------------------------------------------------

def test_close_releases_every_partition_when_one_fails_and_a_second_close_is_quiet(tmp_path):
    broker = logkit.Broker(tmp_path)
    topic = broker.create_topic("t", 3)
    for partition in topic.partitions:
        fill(partition, 1)
    # Make partition 0's close fail the way an fsync error would: its lock is gone.
    first = topic.partition(0)._log
    fcntl_fd = first._tail_file.fd
    os.close(fcntl_fd)
    with pytest.raises(logkit.LogkitError):
        broker.close()
    assert all(p._log._closed for p in topic.partitions)
    broker.close()                                     # safe twice


# ---- F13: a read-only open for inspection ---------------------------------------------

def test_a_read_only_broker_reads_everything_and_writes_nothing(tmp_path):
    with logkit.Broker(tmp_path) as broker:
        fill(broker.create_topic("t", 2).partition(1), 3)
    before = {name: os.stat(tmp_path / "t-1" / name).st_mtime_ns
              for name in os.listdir(tmp_path / "t-1")}
    with logkit.Broker(tmp_path, read_only=True) as broker:
        assert broker.topics() == ["t"]
        p = broker.topic("t").partition(1)
        assert [r.value for r in p.read(0, 10)] == [b"v0", b"v1", b"v2"]
        for write in (lambda: broker.create_topic("u", 1), lambda: broker.delete_topic("t"),
                      lambda: p.append([(None, b"x", [], None)]), broker.producer):
            with pytest.raises(logkit.ReadOnlyError):
                write()
    after = {name: os.stat(tmp_path / "t-1" / name).st_mtime_ns
             for name in os.listdir(tmp_path / "t-1")}
    assert after == before
    with pytest.raises(logkit.ConfigError):
        logkit.Broker(tmp_path / "nothing-here", read_only=True)
    assert not (tmp_path / "nothing-here").exists()


def test_a_symlinked_format_file_is_refused(tmp_path):
    root, outside = tmp_path / "root", tmp_path / "outside.json"
    with logkit.Broker(root):
        pass
    outside.write_text((root / "logkit.json").read_text())
    (root / "logkit.json").unlink()
    (root / "logkit.json").symlink_to(outside)
    with pytest.raises(StorageError):
        logkit.Broker(root)


# ---- a truncation killed mid-way, with another appender open -------------------------

def test_a_truncation_killed_after_its_copy_does_not_lose_another_processes_appends(tmp_path):
    """A truncation swaps the active segment's `.log` for a copy of its prefix, then
    recovery publishes the new segment list. Killed in between, it must not leave an
    appender in another process writing, through its cached descriptor, to the retired
    file: that append would be acknowledged and then lost at the next open."""
    with logkit.Broker(tmp_path) as broker:
        p = broker.create_topic("t", 1).partition(0)
        fill(p, 10)                         # this process now appends through its cache
        result = run_python("""
            import os, sys, logkit
            from logkit import log_trim
            copy = log_trim._copy_prefix
            def copy_then_die(path, size):
                copy(path, size)
                os._exit(9)                 # SIGKILL's effect: no cleanup, lock released
            log_trim._copy_prefix = copy_then_die
            with logkit.Broker(sys.argv[1]) as b:
                b.topic("t").partition(0).truncate_to(6)
        """, str(tmp_path))
        assert result.returncode == 9, result.stderr
        offset = p.append([(None, b"acknowledged", [], None)])
        got = values(p.read(0, 100))
        assert got[-1] == (offset, b"acknowledged")
    with logkit.Broker(tmp_path) as broker:
        p = broker.topic("t").partition(0)
        got = values(p.read(0, 100))
        assert (offset, b"acknowledged") in got, got
        assert [o for o, _ in got] == list(range(len(got)))
        p.check()
