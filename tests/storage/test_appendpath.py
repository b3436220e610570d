"""logkit._appendpath (the append path's flock and pwrite with the GIL kept) behaves as
fcntl.flock and os.pwrite do, and the log uses it when it is built; without it (pure
Python) appends still lock and write."""

from __future__ import annotations

import errno
import fcntl
import os
import subprocess
import sys
import textwrap

import pytest

appendpath = pytest.importorskip("logkit._appendpath",
                              reason="the optional C extension is not built here")


def test_pwrite_writes_where_os_pwrite_does(tmp_path):
    path = tmp_path / "f"
    fd = os.open(path, os.O_RDWR | os.O_CREAT)
    try:
        assert appendpath.pwrite(fd, b"hello", 0) == 5
        assert appendpath.pwrite(fd, bytearray(b"XY"), 1) == 2
        assert appendpath.pwrite(fd, memoryview(b"--tail--")[2:6], 10) == 4
        big = os.urandom(appendpath.HELD_WRITE_MAX + 1)          # released-GIL branch
        assert appendpath.pwrite(fd, big, 20) == len(big)
    finally:
        os.close(fd)
    data = path.read_bytes()
    assert data[:14] == b"hXYlo\0\0\0\0\0tail" and data[20:] == big


def test_pwrite_errors_are_oserrors_with_errno(tmp_path):
    fd = os.open(tmp_path / "f", os.O_RDONLY | os.O_CREAT)
    try:
        with pytest.raises(OSError) as caught:
            appendpath.pwrite(fd, b"x", 0)
        assert caught.value.errno == errno.EBADF
        with pytest.raises(OSError) as caught:
            appendpath.pwrite(fd, b"x", -1)
        assert caught.value.errno == errno.EINVAL
    finally:
        os.close(fd)
    with pytest.raises(TypeError):
        appendpath.pwrite(0, "text", 0)


def test_flock_is_fcntl_flock_without_waiting(tmp_path):
    path = tmp_path / "lock"
    mine = os.open(path, os.O_RDWR | os.O_CREAT)
    other = os.open(path, os.O_RDWR)             # another open file: another owner
    try:
        appendpath.flock(mine, fcntl.LOCK_EX | fcntl.LOCK_NB)
        with pytest.raises(BlockingIOError):
            appendpath.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
        with pytest.raises(BlockingIOError):
            fcntl.flock(other, fcntl.LOCK_SH | fcntl.LOCK_NB)
        appendpath.flock(mine, fcntl.LOCK_UN)
        appendpath.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)   # free now
        appendpath.flock(other, fcntl.LOCK_UN)
        with pytest.raises(ValueError, match="non-blocking"):
            appendpath.flock(mine, fcntl.LOCK_EX)               # a wait would hold the GIL
        with pytest.raises(OSError) as caught:
            appendpath.flock(-1, fcntl.LOCK_UN)
        assert caught.value.errno == errno.EBADF
    finally:
        os.close(mine)
        os.close(other)


def test_the_log_takes_its_lock_and_writes_through_it():
    from logkit import partition_lock, segment
    assert partition_lock._flock_now is appendpath.flock
    assert segment._pwrite is appendpath.pwrite


def test_pure_python_appends_without_it(tmp_path):
    script = textwrap.dedent(f"""
        import fcntl, os
        from logkit import Broker, log_append, partition_lock, segment
        assert partition_lock._flock_now is fcntl.flock and segment._pwrite is os.pwrite
        assert log_append._append_common is None
        with Broker({str(tmp_path / "data")!r}) as broker:
            topic = broker.create_topic("t", 1)
            with broker.producer() as producer:
                for i in range(50):
                    producer.send("t", b"v%d" % i)
            got = [r.value for r in topic.partition(0).read(0, max_records=100)]
            assert got == [b"v%d" % i for i in range(50)], got
        print("ok")
    """)
    env = dict(os.environ, LOGKIT_PURE_PYTHON="1")
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


def test_a_contended_append_retries_without_waiting_in_the_lock_call(tmp_path, monkeypatch):
    """Every try for a partition lock held elsewhere is a non-blocking one through the
    GIL-keeping call, and the append gives up at its bound (the first try used to be
    repeated at once through fcntl.flock, outside it)."""
    from logkit import Broker, LogkitTimeoutError, partition_lock
    tries = []

    def counting(fd, operation):
        tries.append(operation)
        return appendpath.flock(fd, operation)

    with Broker(tmp_path / "data", background=False) as broker:
        partition = broker.create_topic("t", 1).partition(0)
        holder = os.open(os.path.join(partition.directory, "logkit.tail"), os.O_RDWR)
        try:
            fcntl.flock(holder, fcntl.LOCK_EX)          # another open file holds it
            monkeypatch.setattr(partition_lock, "_flock_now", counting)
            with pytest.raises(LogkitTimeoutError):
                partition.append_batch_nowait(one_record_batch(), lock_timeout_s=0.05)
        finally:
            os.close(holder)
        locks = [op for op in tries if op != fcntl.LOCK_UN]
        assert len(locks) >= 2 and set(locks) == {fcntl.LOCK_EX | fcntl.LOCK_NB}
        monkeypatch.undo()
        assert partition.append_batch_nowait(one_record_batch())[0] == 0   # free again


def one_record_batch():
    from logkit.records import encode_batch
    return encode_batch([(None, b"v", None, None)])
