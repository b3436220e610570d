"""The metadata store and group state under bad inputs and bad disks: bounded keys and
values, map growth, a full disk, a failed meta-page write, a truncated data file,
read-only opens, fork, and the group admin API's checks. Real LMDB files, real
processes, real faults (a full tmpfs, EIO injected by strace)."""

from __future__ import annotations

import errno
import multiprocessing
import os
import re
import shutil
import subprocess
import sys
import textwrap
import threading
import traceback

import lmdb
import pytest

import logkit
from logkit import TopicPartition as TP
from logkit.assignors import ASSIGNORS, assign
from logkit.errors import (ConfigError, DiskFullError, ForkedProcessError, LogkitError,
                           MetadataStoreError, ReadOnlyError, UnknownTopicError)
from logkit.meta import MetaStore

KIB = 1024
SOURCE_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(logkit.__file__)))


def run_python(script: str, *args: str, prefix: list[str] | None = None
               ) -> subprocess.CompletedProcess:
    """Run `script` in a fresh interpreter importing the logkit under test."""
    env = {**os.environ, "PYTHONPATH": SOURCE_ROOT}
    return subprocess.run([*(prefix or []), sys.executable, "-c", textwrap.dedent(script),
                           *args], capture_output=True, text=True, env=env, timeout=120)


def small_store(root, *, map_kib: int, max_kib: int) -> MetaStore:
    """Open the process's env on `root/meta` first, with a small map: Brokers opened
    on `root` while it is open share it."""
    return MetaStore(os.path.join(root, "meta"), map_size_bytes=map_kib * KIB,
                     max_map_size_bytes=max_kib * KIB)


# ---- 1. bounded keys and values, map growth ---------------------------------------------

def test_commit_metadata_longer_than_offset_metadata_max_bytes_is_refused_naming_the_key(
        broker):
    broker.create_topic("t", 1)
    consumer = broker.consumer(group_id="g", enable_auto_commit=False)
    consumer.assign([TP("t", 0)])
    for size in (4097, 50 << 20):
        with pytest.raises(LogkitError, match="offset.metadata.max.bytes"):
            consumer.commit({TP("t", 0): (5, "m" * size)})
    assert broker.group("g").committed() == {}
    consumer.commit({TP("t", 0): (5, "m" * 4096)})
    assert broker.group("g").committed() == {TP("t", 0): 5}
    consumer.close()


def test_a_group_id_or_client_id_too_long_for_lmdb_is_a_config_error_before_lmdb(broker):
    broker.create_topic("t", 1)
    with pytest.raises(ConfigError, match="group id"):
        broker.group("g" * 600).committed()
    with pytest.raises(ConfigError, match="group id"):
        broker.consumer("t", group_id="g" * 600)
    with pytest.raises(ConfigError, match="client_id"):
        broker.consumer("t", group_id="g", client_id="c" * 600)
    assert broker.group("g" * 249).committed() == {}


def test_a_full_map_grows_and_the_commit_goes_through(tmp_path):
    root = tmp_path / "data"
    store = small_store(root, map_kib=256, max_kib=64 * 1024)
    try:
        with logkit.Broker(root, background=False) as broker:
            broker.create_topic("t", 64)
            consumer = broker.consumer(group_id="g", enable_auto_commit=False)
            consumer.assign([TP("t", p) for p in range(64)])
            consumer.commit({TP("t", p): (p, "m" * 4000) for p in range(64)})   # 256 KiB
            assert broker.group("g").committed() == {TP("t", p): p for p in range(64)}
            consumer.close()
        assert store.env.info()["map_size"] > 256 * KIB
    finally:
        store.close()


def fill_until_full(broker, limit: int = 10_000) -> int:
    """Commit small offsets to new groups until the store is full at its limit; return
    how many groups were made."""
    for number in range(limit):
        try:
            broker.group(f"g{number:05d}").reset_offsets({TP("t", p): 1 for p in range(4)})
        except MetadataStoreError as exc:
            assert "size limit" in str(exc)
            assert isinstance(exc.__cause__, lmdb.MapFullError)
            return number
    raise AssertionError("the store never filled up")


def test_deleting_a_group_works_when_the_store_is_full_at_its_limit_and_after_reopening(
        tmp_path):
    """At map full even a delete needs free pages (copy-on-write): it may grow the map
    past the limit, so freeing space always works."""
    root = tmp_path / "data"
    with logkit.Broker(root, background=False) as broker:
        broker.create_topic("t", 4)
    store = small_store(root, map_kib=128, max_kib=128)
    try:
        with logkit.Broker(root, background=False) as broker:
            made = fill_until_full(broker)
            assert made > 10
            broker.group("g00000").delete()
            assert broker.group("g00000").committed() == {}
    finally:
        store.close()
    # The operator reopens (same limits) and recovers by deleting groups.
    store = small_store(root, map_kib=128, max_kib=128)
    try:
        with logkit.Broker(root, background=False) as broker:
            for number in range(1, made, 2):
                broker.group(f"g{number:05d}").delete()
            broker.group("new").reset_offsets({TP("t", 0): 9})
            assert broker.group("new").committed() == {TP("t", 0): 9}
    finally:
        store.close()


# ---- 2, 3. a full disk and a failed meta-page write --------------------------------------

@pytest.fixture
def small_tmpfs(tmp_path):
    """A 2 MiB tmpfs (needs root), unmounted afterwards."""
    mount_point = tmp_path / "tmpfs"
    mount_point.mkdir()
    result = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs",
                             str(mount_point)], capture_output=True, text=True)
    if result.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {result.stderr.strip()}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", str(mount_point)], check=True)


def fill_disk(directory) -> str:
    """Write a file into `directory` until the filesystem is full; return its path."""
    path = os.path.join(directory, "filler")
    with open(path, "wb", buffering=0) as f:
        for chunk in (64 * KIB, 4 * KIB, 512):
            try:
                while True:
                    f.write(b"\0" * chunk)
            except OSError as exc:
                assert exc.errno == errno.ENOSPC
    return path


def test_a_full_disk_under_the_store_raises_a_named_error_and_the_next_commit_works(
        small_tmpfs):
    root = small_tmpfs / "data"
    with logkit.Broker(root, background=False) as broker:
        broker.create_topic("t", 8, config={"segment.index.bytes": 4096})
        consumer = broker.consumer(group_id="g", enable_auto_commit=False)
        consumer.assign([TP("t", p) for p in range(8)])
        filler = fill_disk(small_tmpfs)
        offsets = {TP("t", p): (7, "m" * 4000) for p in range(8)}   # 32 KiB of new pages
        for _ in range(2):                                # the failure does not wedge it
            with pytest.raises(DiskFullError, match="disk is full") as caught:
                consumer.commit(offsets)
            assert isinstance(caught.value, MetadataStoreError)
            assert isinstance(caught.value.__cause__, lmdb.Error)
        assert broker.group("g").committed() == {}
        os.unlink(filler)
        consumer.commit(offsets)
        assert broker.group("g").committed() == {TP("t", p): 7 for p in range(8)}
        consumer.close()


PANIC_CHILD = """
    import sys, logkit
    from logkit import TopicPartition as TP
    from logkit.errors import MetadataStoreError
    with logkit.Broker(sys.argv[1], background=False) as broker:
        group = broker.group("g")
        try:
            group.reset_offsets({TP("t", 0): 2})
            print("first: stored")
        except MetadataStoreError as exc:
            print("first: MetadataStoreError", exc)
        group.reset_offsets({TP("t", 0): 3})
        print("second:", group.committed()[TP("t", 0)])
"""


def test_a_failed_meta_page_write_does_not_wedge_the_process(tmp_path):
    """EIO on LMDB's meta-page write (MDB_PANIC for the whole env): that commit fails
    with a named error; the next one reopens the env and succeeds."""
    if shutil.which("strace") is None:
        pytest.skip("strace is not installed")
    seed = tmp_path / "seed"
    with logkit.Broker(seed, background=False) as broker:
        broker.create_topic("t", 1)
        broker.group("g").reset_offsets({TP("t", 0): 1})
    dry, real = tmp_path / "dry", tmp_path / "real"
    shutil.copytree(seed, dry)
    shutil.copytree(seed, real)
    # A dry run on an identical copy finds which pwrite64 is the first meta-page write
    # (120 bytes to a meta page); the real run fails exactly that one with EIO.
    traced = run_python(PANIC_CHILD, str(dry), prefix=["strace", "-qq", "-e",
                                                       "trace=pwrite64"])
    if traced.returncode != 0 and "PTRACE" in traced.stderr.upper():
        pytest.skip(f"strace cannot trace here: {traced.stderr[-200:]}")
    calls = [line for line in traced.stderr.splitlines() if line.startswith("pwrite64(")]
    ordinal = next(n for n, line in enumerate(calls, 1) if re.search(r", 120, \d+\) = 120$",
                                                                    line))
    result = run_python(PANIC_CHILD, str(real), prefix=[
        "strace", "-qq", "-o", "/dev/null", "-e", "trace=pwrite64",
        "-e", f"inject=pwrite64:error=EIO:when={ordinal}"])
    assert result.returncode == 0, result.stderr
    assert "first: MetadataStoreError" in result.stdout
    assert "Input/output error" in result.stdout
    assert "second: 3" in result.stdout
    assert "reopening the environment" in result.stderr
    with logkit.Broker(real, background=False) as broker:
        assert broker.group("g").committed() == {TP("t", 0): 3}


# ---- 4. a truncated data file -------------------------------------------------------------

def test_a_truncated_data_file_is_refused_by_name_instead_of_crashing_the_process(
        tmp_path):
    seed = tmp_path / "seed"
    with logkit.Broker(seed, background=False) as broker:
        for number in range(20):
            broker.create_topic(f"t{number}", 1)
    page = os.sysconf("SC_PAGE_SIZE")
    for pages in (3, 1):
        root = tmp_path / f"cut-{pages}"
        shutil.copytree(seed, root)
        data = root / "meta" / "data.mdb"
        assert data.stat().st_size > 3 * page
        os.truncate(data, pages * page)
        result = run_python("""
            import sys, logkit
            from logkit.errors import MetadataStoreError
            try:
                logkit.Broker(sys.argv[1], background=False).close()
            except MetadataStoreError as exc:
                print("refused:", exc)
        """, str(root))
        assert result.returncode == 0, f"exit {result.returncode}: {result.stderr}"
        assert "refused:" in result.stdout and str(data) in result.stdout
        assert "truncated" in result.stdout


# ---- 5. read-only opens --------------------------------------------------------------------

def make_root(root) -> None:
    with logkit.Broker(root, background=False) as broker:
        broker.create_topic("t", 1)
        broker.group("g").reset_offsets({TP("t", 0): 4})


def test_a_read_only_store_reads_and_refuses_every_write(tmp_path):
    root = tmp_path / "data"
    make_root(root)
    store = MetaStore(os.path.join(root, "meta"), read_only=True)
    try:
        assert store.topic_names() == ["t"]
        with pytest.raises(ReadOnlyError):
            store.create_topic("u", {"name": "u"})
        with pytest.raises(ReadOnlyError):
            store.delete_topic("t")
        with pytest.raises(ReadOnlyError):
            store.write(lambda txn: None)
        with pytest.raises(ReadOnlyError):
            with store.transaction(write=True):
                pass
        # A read-write Broker in the same process shares (and reopens) the env; the
        # read-only handle still refuses writes and sees the new data.
        with logkit.Broker(root, background=False) as broker:
            broker.create_topic("u", 1)
            assert store.topic_names() == ["t", "u"]
            with pytest.raises(ReadOnlyError):
                store.delete_topic("u")
    finally:
        store.close()


def test_a_read_only_store_opens_a_copy_whose_files_are_immutable(tmp_path):
    root = tmp_path / "data"
    make_root(root)
    meta = tmp_path / "copy"
    shutil.copytree(root / "meta", meta)
    paths = [str(meta / "data.mdb"), str(meta / "lock.mdb"), str(meta)]
    made = subprocess.run(["chattr", "+i", *paths], capture_output=True, text=True)
    if made.returncode != 0:
        pytest.skip(f"chattr +i is not available here: {made.stderr.strip()}")
    try:
        store = MetaStore(str(meta), read_only=True)
        try:
            assert store.topic_names() == ["t"]
            assert [key for key, _ in store.items("offsets")] == [b"g\0t\x000"]
            with pytest.raises(ReadOnlyError):
                store.delete_topic("t")
        finally:
            store.close()
    finally:
        subprocess.run(["chattr", "-i", *paths], check=True)


# ---- 6. fork ------------------------------------------------------------------------------

def child_main(root, broker) -> int:
    """In a forked child: the parent's store refuses, a new Broker works."""
    try:
        broker.meta.topic_names()
        return 2
    except ForkedProcessError:
        pass
    with logkit.Broker(root, background=False) as child:
        child.create_topic("from-child", 1)
        child.group("c").reset_offsets({TP("t", 1): 7})
    return 0


def test_a_forked_child_opens_its_own_broker_and_the_parent_keeps_working(tmp_path):
    root = tmp_path / "data"
    with logkit.Broker(root) as broker:
        broker.create_topic("t", 2)
        broker.group("g").reset_offsets({TP("t", 0): 3})
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                code = child_main(root, broker)
            except BaseException:
                traceback.print_exc()
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert "from-child" in broker.topics()
        assert broker.group("c").committed() == {TP("t", 1): 7}
        broker.group("g").reset_offsets({TP("t", 0): 4})
        assert broker.group("g").committed() == {TP("t", 0): 4}


def test_a_fork_waits_for_a_transaction_open_in_another_thread_so_the_child_can_open(
        tmp_path):
    import logkit.meta as meta_module
    root = tmp_path / "data"
    with logkit.Broker(root, background=False) as broker:
        broker.create_topic("t", 2)
        inside, go, forked = threading.Event(), threading.Event(), threading.Event()

        def hold_a_transaction() -> None:
            with broker.meta.transaction() as txn:
                inside.set()
                go.wait()
                txn.get(b"t", db=broker.meta.db("topics"))

        def release_once_the_fork_waits() -> None:
            while meta_module._forking is None and not forked.is_set():
                threading.Event().wait(0.001)      # until the forking thread waits
            go.set()

        holder = threading.Thread(target=hold_a_transaction)
        holder.start()
        inside.wait()
        releaser = threading.Thread(target=release_once_the_fork_waits)
        releaser.start()
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                with logkit.Broker(root, background=False) as child:
                    child.group("c").reset_offsets({TP("t", 0): 5})
                code = 0
            except BaseException:
                traceback.print_exc()
            finally:
                os._exit(code)
        forked.set()
        holder.join()
        releaser.join()
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert broker.group("c").committed() == {TP("t", 0): 5}


def commit_in_worker(task: tuple[str, int]) -> int:
    root, partition = task
    with logkit.Broker(root, background=False) as broker:
        broker.group(f"pool-{partition}").reset_offsets({TP("t", partition): 10 + partition})
    return os.getpid()


def test_multiprocessing_fork_pool_workers_open_the_directory_the_parent_has_open(tmp_path):
    root = tmp_path / "data"
    with logkit.Broker(root) as broker:
        broker.create_topic("t", 4)
        with multiprocessing.get_context("fork").Pool(2) as pool:
            pids = pool.map(commit_in_worker, [(str(root), p) for p in range(4)])
        assert os.getpid() not in pids
        for p in range(4):
            assert broker.group(f"pool-{p}").committed() == {TP("t", p): 10 + p}
        broker.group("after").reset_offsets({TP("t", 0): 1})
        assert broker.group("after").committed() == {TP("t", 0): 1}


# ---- 7. groups -----------------------------------------------------------------------------

def test_reset_offsets_refuses_negative_offsets_and_missing_partitions_committing_nothing(
        broker):
    broker.create_topic("t", 2)
    group = broker.group("g")
    with pytest.raises(ConfigError, match="t-1"):
        group.reset_offsets({TP("t", 0): 5, TP("t", 1): -1})
    with pytest.raises(UnknownTopicError, match="t-2"):
        group.reset_offsets({TP("t", 0): 5, TP("t", 2): 1})
    with pytest.raises(UnknownTopicError, match="nope-0"):
        group.reset_offsets({TP("t", 0): 5, TP("nope", 0): 1})
    assert group.committed() == {}
    group.reset_offsets({TP("t", 0): 5, TP("t", 1): 0})
    assert group.committed() == {TP("t", 0): 5, TP("t", 1): 0}


def test_assignors_give_empty_assignments_for_no_members_or_no_partitions():
    for strategy in ASSIGNORS:
        assert assign(strategy, {}, {"t": 3}) == {}
        assert assign(strategy, {}, {}, {"gone": [("t", 0)]}) == {}
        assert assign(strategy, {"a": ["t"], "b": ["t"]}, {}) == {"a": [], "b": []}
        assert assign(strategy, {"a": ["t"]}, {}, {"a": [("t", 0)]}) == {"a": []}
        assert assign(strategy, {"a": []}, {"t": 2}) == {"a": []}


# ---- growth under concurrency and across processes ----------------------------------------

def test_a_map_that_fills_while_threads_commit_grows_and_every_commit_lands(tmp_path):
    root = tmp_path / "data"
    store = small_store(root, map_kib=64, max_kib=64 * 1024)
    errors = []

    def commit(number: int) -> None:
        try:
            for round_ in range(10):
                group = broker.group(f"g{number}-{round_}")
                group.reset_offsets({TP("t", p): round_ for p in range(4)})
        except BaseException as exc:           # reported below
            errors.append(exc)

    try:
        with logkit.Broker(root, background=False) as broker:
            broker.create_topic("t", 4)
            threads = [threading.Thread(target=commit, args=(n,)) for n in range(4)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            assert errors == []
            for n in range(4):
                assert broker.group(f"g{n}-9").committed() == {TP("t", p): 9
                                                              for p in range(4)}
        assert store.env.info()["map_size"] > 64 * KIB
    finally:
        store.close()


GROW_CHILD = """
    import sys
    from logkit.meta import MetaStore
    store = MetaStore(sys.argv[1], map_size_bytes=64 << 10, max_map_size_bytes=64 << 20)
    for n in range(200):
        store.write(lambda txn: store.put(txn, "spark", b"k%d" % n, "v" * 4000))
    print(store.env.info()["map_size"])
    store.close()
"""


def test_a_map_grown_by_another_process_is_adopted_by_this_one(tmp_path):
    meta = str(tmp_path / "meta")
    store = MetaStore(meta, map_size_bytes=64 * KIB, max_map_size_bytes=64 * KIB)
    try:
        assert store.items("spark") == []
        result = run_python(GROW_CHILD, meta)
        assert result.returncode == 0, result.stderr
        assert int(result.stdout) > 64 * KIB
        assert len(store.items("spark")) == 200
        store.write(lambda txn: store.put(txn, "spark", b"parent", "p"))
        assert store.items("spark", b"parent") == [(b"parent", "p")]
    finally:
        store.close()


def test_an_unknown_assignor_is_a_config_error_naming_it():
    with pytest.raises(ConfigError, match="nope"):
        assign("nope", {"a": ["t"]}, {"t": 1})


def test_a_read_only_open_of_a_store_missing_a_newer_sub_database_reads_what_is_there(
        tmp_path):
    """A directory written before a sub-database was added (here: 'schemas' is dropped
    from the store) still opens read-only — `logkit describe` must work on it; only the
    missing sub-database's use is refused, by name."""
    root = tmp_path / "data"
    make_root(root)
    # In another process: this one's metadata registry may still hold the env.
    subprocess.run([sys.executable, "-c", textwrap.dedent("""
        import lmdb, sys
        env = lmdb.open(sys.argv[1], max_dbs=16, subdir=True)
        schemas = env.open_db(b"schemas")
        with env.begin(write=True) as txn:
            txn.drop(schemas, delete=True)
        env.close()
        """), os.path.join(root, "meta")], check=True, timeout=60)
    with logkit.Broker(root, read_only=True) as broker:
        assert broker.topics() == ["t"]
        with pytest.raises(logkit.MetadataStoreError, match="schemas"):
            broker.meta.db("schemas")


def test_a_new_store_appears_whole_or_not_at_all(tmp_path, monkeypatch):
    """A new root's LMDB store is made beside `meta/`, committed and synced, then renamed
    into place: no moment exists at which `meta/data.mdb` holds less than LMDB's two meta
    pages (a power cut during the first open once left a one-page file that no open could
    read: docs/powercut.md)."""
    import lmdb

    from logkit import meta as meta_module
    opened, renamed = [], []
    real_open, real_rename = lmdb.open, os.rename

    def recording_open(path, *args, **kwargs):
        opened.append((os.path.basename(path), kwargs.get("readonly", False)))
        return real_open(path, *args, **kwargs)

    def checking_rename(src, dst):
        if os.path.basename(dst) == "meta":
            renamed.append(os.path.getsize(os.path.join(src, "data.mdb")))
        return real_rename(src, dst)

    monkeypatch.setattr(meta_module.lmdb, "open", recording_open)
    monkeypatch.setattr(meta_module.os, "rename", checking_rename)
    with logkit.Broker(tmp_path / "root") as broker:
        broker.create_topic("t", 1)
    writable = [name for name, read_only in opened if not read_only]
    assert writable[0].startswith("meta" + meta_module.NEW_STORE_PREFIX), opened
    assert len(renamed) == 1 and renamed[0] >= 2 * 4096
    assert sorted(os.listdir(tmp_path / "root" / "meta")) == ["data.mdb", "lock.mdb"]


def test_a_store_left_half_made_by_a_dead_creator_is_swept(tmp_path, caplog):
    """A creator that died before its rename leaves `meta.new-<pid>-…`: the next open
    removes it (its pid is gone) and makes the store afresh; nothing in it was ever
    acknowledged, since nothing could use it before the rename."""
    from logkit import meta as meta_module
    root = tmp_path / "root"
    with logkit.Broker(root) as broker:
        broker.create_topic("t", 1).partition(0).append([(None, b"v", None, None)])
    import shutil
    shutil.rmtree(root / "meta")
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True).stdout.strip()
    stale = root / f"meta{meta_module.NEW_STORE_PREFIX}{dead}-0000"
    stale.mkdir()
    (stale / "data.mdb").write_bytes(b"\0" * 4096)          # the one-page file of a cut
    with caplog.at_level("WARNING", logger="logkit.meta"):
        with logkit.Broker(root) as broker:
            assert broker.topics() == []      # the topic records were in the lost store
    assert not stale.exists()
    assert any("creator stopped" in r.getMessage() for r in caplog.records)
