"""What many partitions may cost, as behaviour (issue 16, goal 5): page cache and disk
grown by index writes, the producer's buffer reservations, a poll's work, descriptors
held, and reopening after a torn tail. Never timed: the rates are measured by
benchmarks/scaling.py."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import textwrap

import pytest

import logkit
from benchmarks.scaling import resident_bytes
from logkit.index import RESERVE_STEP_BYTES

INDEX_CACHE_GOAL_BYTES = 64 * 1024       # per partition per segment (issue 16)
CHECKOUT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def index_files(directory: str) -> list[str]:
    return sorted(os.path.join(directory, n) for n in os.listdir(directory)
                  if n.endswith((".index", ".timeindex")))


def test_index_writes_grow_the_page_cache_by_the_pages_they_write(tmp_path):
    """An active segment's first index entries fault in the pages they write, not the
    read-ahead window of zeros around them; the files keep Kafka's preallocated size
    while active but hold real blocks only just ahead of the entries."""
    with logkit.Broker(str(tmp_path), background=False) as broker:
        topic = broker.create_topic("t", partitions=3, config={"index.interval.bytes": 1})
        for p in range(3):
            partition = topic.partition(p)
            for _ in range(200):                 # an index entry per batch
                partition.append([(None, b"v" * 100, [], None)])
        index_bytes = topic.partition(0).config["segment.index.bytes"]
        for p in range(3):
            files = index_files(os.path.join(str(tmp_path), f"t-{p}"))
            assert len(files) == 2
            assert sum(resident_bytes(f) for f in files) <= INDEX_CACHE_GOAL_BYTES
            for f in files:
                st = os.stat(f)
                assert st.st_size >= index_bytes - 12       # sized as Kafka sizes them
                assert st.st_blocks * 512 <= 2 * RESERVE_STEP_BYTES   # sparse past that
        entries = topic.partition(0).read(0, max_records=1000)
        assert len(entries) == 200
        topic.partition(0)._log.roll()             # the roll seals and trims
        sealed = index_files(os.path.join(str(tmp_path), "t-0"))
        sizes = {os.path.basename(f): os.path.getsize(f) for f in sealed}
        # trimmed on roll: an entry per batch after the first (position 0)
        assert sizes["00000000000000000000.index"] == 199 * 8
        assert sizes["00000000000000000000.timeindex"] % 12 == 0


def test_index_reservations_follow_the_entries_past_one_step(tmp_path):
    """More entries than one reservation step holds: each store lands in reserved
    blocks, lookups find every entry, and a reopen (another process's view) reads them."""
    step_entries = RESERVE_STEP_BYTES // 8
    count = step_entries + 50
    with logkit.Broker(str(tmp_path), background=False) as broker:
        partition = broker.create_topic("t", 1, config={"index.interval.bytes": 1}) \
            .partition(0)
        for _ in range(count):
            partition.append([(None, b"x", [], None)])
        path = os.path.join(str(tmp_path), "t-0", "00000000000000000000.index")
        assert os.stat(path).st_blocks * 512 >= 8 * (count - 1)       # reserved as it grew
        assert partition.read(count - 1)[0].offset == count - 1
    with logkit.Broker(str(tmp_path), background=False) as broker:
        partition = broker.topic("t").partition(0)
        assert partition.read(step_entries + 7)[0].offset == step_entries + 7
        assert partition.high_watermark == count


def test_open_batches_past_half_the_buffer_reserve_in_steps_and_grow(tmp_path):
    """A producer with more partitions than buffer_memory holds whole batches: past half
    the buffer each new batch reserves batch_size / 8 and grows as records fill it, so
    every partition keeps one open batch (no send blocks, none is sealed early) and each
    partition's records go out as one batch, not a flurry of small ones."""
    from logkit.accumulator import RESERVE_STEPS
    batch_size, buffer_memory, partitions, per_partition = 16384, 256 * 1024, 36, 20
    with logkit.Broker(str(tmp_path), background=False) as broker:
        topic = broker.create_topic("t", partitions=partitions)
        producer = broker.producer(batch_size=batch_size, buffer_memory=buffer_memory,
                                   linger_ms=5000, max_block_ms=200)
        for n in range(per_partition):
            for p in range(partitions):
                producer.send("t", b"v" * 100, partition=p)
            metrics = producer.metrics()
            assert metrics["open_batches"] == partitions, (n, metrics)
            assert metrics["buffer_reserved_bytes"] <= buffer_memory, (n, metrics)
        whole = buffer_memory // 2 // batch_size
        assert producer.metrics()["buffer_reserved_bytes"] < \
            whole * batch_size + (partitions - whole) * batch_size // RESERVE_STEPS * 4
        producer.flush()
        producer.close()
        for p in range(partitions):
            headers = topic.partition(p).batch_headers(0)
            assert [h.last_offset_delta + 1 for h in headers] == [per_partition], p


def test_a_batch_whose_reservation_cannot_grow_is_sealed_not_blocked(tmp_path):
    """When the buffer has no room to grow a stepped batch, that batch is sealed and
    appended as it is; every record is stored once, in order."""
    with logkit.Broker(str(tmp_path), background=False) as broker:
        topic = broker.create_topic("t", partitions=8)
        producer = broker.producer(batch_size=16384, buffer_memory=40 * 1024,
                                   linger_ms=5000, max_block_ms=2000)
        futures = [producer.send("t", b"%05d" % n + b"v" * 200, partition=n % 8)
                   for n in range(2000)]
        producer.flush()
        producer.close()
        assert all(f.get(timeout=10).offset >= 0 for f in futures)
        for p in range(8):
            got = topic.partition(p).read(0, max_records=1000)
            assert [int(r.value[:5]) for r in got] == list(range(p, 2000, 8))


class _Counting:
    """Counts calls through a method, passing each on unchanged (not a mock: the real
    method does the work)."""

    def __init__(self, monkeypatch, owner, name):
        self.calls = 0
        real = getattr(owner, name)

        def counted(*args, **kwargs):
            self.calls += 1
            return real(*args, **kwargs)

        monkeypatch.setattr(owner, name, counted)


def test_a_poll_reads_only_partitions_that_may_have_data(tmp_path, monkeypatch):
    """Once every partition is drained, polls read no partition and look no topic up
    until some process appends; then one poll finds the new record; the fetchable list
    is computed once per assignment, not sorted on every poll."""
    from logkit.topic import Partition
    partitions = 50
    with logkit.Broker(str(tmp_path), background=False) as broker:
        topic = broker.create_topic("t", partitions=partitions)
        for p in range(partitions):
            topic.partition(p).append([(None, b"%d" % p, [], None)])
        consumer = broker.consumer("t", group_id="g", auto_offset_reset="earliest",
                                   enable_auto_commit=False)
        seen = []
        while len(seen) < partitions:
            seen += consumer.poll(timeout_ms=1000)
        assert sorted(int(r.value) for r in seen) == list(range(partitions))
        assert consumer.poll(timeout_ms=0) == []     # finds each at its log end, once
        fetchable = consumer._subscriptions.fetchable()
        reads = _Counting(monkeypatch, Partition, "fetch_records")
        lookups = _Counting(monkeypatch, broker, "topic")
        for _ in range(5):
            assert consumer.poll(timeout_ms=0) == []
        assert reads.calls == 0 and lookups.calls == 0
        assert consumer._subscriptions.fetchable() is fetchable      # not re-sorted
        topic.partition(7).append([(None, b"new", [], None)])
        got = consumer.poll(timeout_ms=1000)
        assert [(r.partition, r.value) for r in got] == [(7, b"new")]
        assert reads.calls <= partitions and lookups.calls == 0
        consumer.pause(logkit.TopicPartition("t", 3))
        assert consumer._subscriptions.fetchable() is not fetchable
        assert logkit.TopicPartition("t", 3) not in consumer._subscriptions.fetchable()
        consumer.close()


def test_a_consumer_follows_a_topic_deleted_and_created_again(tmp_path):
    """A cached partition handle that went stale (its topic deleted and created again
    under the same name) is looked up afresh: the consumer reads the new topic."""
    with logkit.Broker(str(tmp_path), background=False) as broker:
        broker.create_topic("t", partitions=1).partition(0).append(
            [(None, b"old", [], None)])
        consumer = broker.consumer(auto_offset_reset="earliest")
        consumer.assign([logkit.TopicPartition("t", 0)])
        assert [r.value for r in consumer.poll(timeout_ms=1000)] == [b"old"]
        broker.delete_topic("t")
        broker.create_topic("t", partitions=1).partition(0).append(
            [(None, b"a", [], None), (None, b"b", [], None)])
        consumer.seek(logkit.TopicPartition("t", 0), 1)
        assert [r.value for r in consumer.poll(timeout_ms=1000)] == [b"b"]
        consumer.close()


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_a_producing_process_holds_at_most_three_descriptors_per_partition(tmp_path):
    """Tail file, its map and the active .log: index maps hold no descriptor, and a
    roll closes the segment it seals."""
    from logkit._files import DESCRIPTORS_PER_PARTITION
    partitions = 40
    before = open_fds()
    with logkit.Broker(str(tmp_path), background=False) as broker:
        broker.create_topic("t", partitions=partitions,
                            config={"segment.bytes": 4096, "index.interval.bytes": 1})
        producer = broker.producer(batch_size=1024)  # batches of a few records each
        for n in range(partitions * 100):            # several rolls per partition
            producer.send("t", b"v" * 100, key=b"%d" % n)
        producer.flush()
        held = open_fds() - before
        assert len(os.listdir(os.path.join(str(tmp_path), "t-0"))) > 6   # it rolled
        assert held <= DESCRIPTORS_PER_PARTITION * partitions + 16, held   # + broker's
        producer.close()


def test_a_consumer_keeps_at_most_two_segments_per_partition_open(tmp_path):
    """Reading a partition of many segments from the start closes what it has read
    past: at most two segments (their files and maps) stay open per partition."""
    with logkit.Broker(str(tmp_path), background=False) as broker:
        topic = broker.create_topic("t", partitions=2, config={"segment.bytes": 2048})
        for p in range(2):
            for n in range(300):
                topic.partition(p).append([(None, b"%05d" % n + b"v" * 95, [], None)])
        consumer = broker.consumer("t", group_id="g", auto_offset_reset="earliest")
        seen = 0
        while seen < 600:
            got = consumer.poll(timeout_ms=1000, max_records=7)
            seen += len(got)
            for p in range(2):
                assert len(topic.partition(p)._log._segments) <= 2
        maps = [line for line in open("/proc/self/maps")
                if str(tmp_path) in line and line.rstrip().endswith(".log")]
        assert len({line.split()[-1] for line in maps}) <= 4, maps
        consumer.close()


def test_broker_raises_the_soft_descriptor_limit_to_the_hard_one(tmp_path):
    """Started under a soft limit of 256, a process opens a broker of 120 partitions
    (about 360 descriptors) and produces to all of them: Broker() raised the limit."""
    code = textwrap.dedent("""
        import resource, sys
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))
        import logkit
        with logkit.Broker(sys.argv[1], background=False) as broker:
            assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] == hard
            broker.create_topic("t", partitions=120)
            producer = broker.producer()
            for n in range(1200):
                producer.send("t", b"v", key=b"%d" % n)
            producer.flush()
            producer.close()
            print(sum(broker.topic("t").partition(p).high_watermark for p in range(120)))
    """)
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard != resource.RLIM_INFINITY and hard < 512:
        pytest.skip(f"the hard descriptor limit ({hard}) leaves nothing to raise to")
    proc = subprocess.run([sys.executable, "-c", code, str(tmp_path / "d")],
                          capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, PYTHONPATH=CHECKOUT))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == ["1200"]


def tear_tail(directory: str) -> None:
    """Leave the tail as a writer killed mid-update does: an odd sequence number."""
    with open(os.path.join(directory, "logkit.tail"), "r+b") as f:
        f.seek(8)
        sequence = int.from_bytes(f.read(8), "little")
        f.seek(8)
        f.write((sequence | 1).to_bytes(8, "little"))


def test_a_torn_tail_is_recovered_from_the_recovery_point_not_from_offset_0(tmp_path):
    """Reopening after a writer died mid-update (the tail torn, a torn batch past the
    committed end) scans only the segment above the recovery point, cuts the torn
    batch as before, and keeps every record."""
    root = str(tmp_path)
    with logkit.Broker(root, background=False) as broker:
        partition = broker.create_topic("t", 1, config={"segment.bytes": 8192}) \
            .partition(0)
        for n in range(400):
            partition.append([(None, b"%05d" % n + b"v" * 95, [], None)])
        directory = partition.directory
        active = partition.segment_base_offsets()[-1]
    segments = len([n for n in os.listdir(directory) if n.endswith(".log")])
    assert segments > 5
    with open(os.path.join(directory, "%020d.log" % active), "ab") as f:
        f.write(b"\x00" * 7 + b"\xc8" + b"\x00\x00\x01\x00torn")     # a partial batch
    tear_tail(directory)
    with logkit.Broker(root, background=False) as broker:
        partition = broker.topic("t").partition(0)
        assert partition.high_watermark == 400
        report = partition.last_recovery
        assert report is not None and report.segments_checked == 1, report
        assert report.bytes_truncated == 16                  # the torn batch, cut
        got = partition.read(0, max_records=1000)
        while len(got) < 400:
            got += partition.read(got[-1].offset + 1, max_records=1000)
        assert [int(r.value[:5]) for r in got] == list(range(400))
        partition.append([(None, b"after", [], None)])
        assert partition.read(400)[0].value == b"after"


def test_a_reader_repairs_a_tail_torn_by_a_dead_writer_without_spinning(tmp_path,
                                                                         monkeypatch):
    """A torn tail with nobody holding the partition lock is a dead writer's: a reader
    stops waiting after its short spin (no sleeps) and repairs it. While a live writer
    holds the lock, the reader keeps waiting as before."""
    import fcntl

    from logkit import tail as tail_module
    root = str(tmp_path)
    with logkit.Broker(root, background=False) as broker:
        partition = broker.create_topic("t", 1).partition(0)
        partition.append([(None, b"x", [], None)])
        assert partition.high_watermark == 1
        sleeps = _Counting(monkeypatch, tail_module.time, "sleep")
        tear_tail(partition.directory)
        assert partition.high_watermark == 1             # repaired under the lock
        assert sleeps.calls == 0
        assert partition.last_recovery is not None
        tail_file = partition._log._tail_file
        monkeypatch.setattr(tail_module, "SEQLOCK_SPINS", 300)
        tear_tail(partition.directory)
        holder = os.open(tail_file.path, os.O_RDONLY)
        try:
            fcntl.flock(holder, fcntl.LOCK_EX)           # a live writer, mid-update
            assert tail_file.read() is None
            assert sleeps.calls > 0                      # it waited for the writer
        finally:
            os.close(holder)
        assert partition.high_watermark == 1


def test_create_topic_makes_each_new_partition_file_once_and_fsyncs_no_tail(tmp_path):
    """A new partition is made, not recovered: each of its segment files is opened
    once, its empty first segment is not scanned, and its tail is not fsynced (one
    lost to an OS crash is rebuilt by recovery). Counted with strace."""
    from tests.crashpoints import driver
    reason = driver.strace_usable()
    if reason:
        pytest.skip(reason)
    root = tmp_path / "d"
    trace = tmp_path / "calls.trace"
    code = textwrap.dedent("""
        import sys, logkit
        with logkit.Broker(sys.argv[1], background=False) as broker:
            topic = broker.create_topic("t", partitions=4)
            print(topic.partition(3).high_watermark)
    """)
    proc = subprocess.run([driver.STRACE, "-f", "-qq", "-o", str(trace), "-e",
                           "trace=openat,msync,fsync", sys.executable, "-c", code,
                           str(root)], capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, PYTHONPATH=CHECKOUT))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == ["0"]
    calls = trace.read_text().splitlines()
    for suffix in (".log", ".index", ".timeindex"):
        name = f"t-2/00000000000000000000{suffix}"
        assert sum(1 for c in calls if "openat(" in c and name in c) == 1, suffix
    assert not any("msync(" in c for c in calls)         # no tail flushed per partition


def test_create_topic_makes_its_partitions_durable_with_one_barrier(tmp_path):
    """create_topic syncs once for all its partitions (one syncfs before the metadata
    commit), not an fsync per partition; every directory carries its topic id, written
    in place (no temporary file left behind). Counted with strace."""
    from tests.crashpoints import driver
    reason = driver.strace_usable()
    if reason:
        pytest.skip(reason)
    root = tmp_path / "d"
    trace = tmp_path / "calls.trace"
    code = textwrap.dedent("""
        import sys, logkit
        with logkit.Broker(sys.argv[1], background=False) as broker:
            print(broker.create_topic("t", partitions=6).topic_id)
    """)
    proc = subprocess.run([driver.STRACE, "-f", "-qq", "-y", "-o", str(trace), "-e",
                           "trace=fsync,fdatasync,syncfs", sys.executable, "-c", code,
                           str(root)], capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, PYTHONPATH=CHECKOUT))
    assert proc.returncode == 0, proc.stderr[-3000:]
    topic_id = proc.stdout.strip()
    calls = trace.read_text().splitlines()
    assert sum(1 for c in calls if "syncfs(" in c) == 1, calls
    assert not [c for c in calls if "sync(" in c and "/t-" in c], calls
    for p in range(6):
        directory = root / f"t-{p}"
        assert logkit.broker.read_topic_id(str(directory)) == topic_id
        assert not [n for n in os.listdir(directory) if n.endswith(".tmp")]


KILL_BEFORE_PUBLISH = """
import os, signal, sys
import logkit, logkit.broker
def die(path):
    os.kill(os.getpid(), signal.SIGKILL)
logkit.broker.sync_filesystem = die
broker = logkit.Broker(sys.argv[1], background=False)
broker.create_topic("t", partitions=5)
print("created", flush=True)
"""


def test_a_kill_before_the_publish_leaves_no_topic_and_a_retry_makes_it_whole(tmp_path):
    """Killed after every partition directory was made but before the barrier and the
    metadata commit: no topic is visible, and creating it again moves the orphans
    away and stamps every directory with the new topic id."""
    proc = subprocess.run([sys.executable, "-c", KILL_BEFORE_PUBLISH, str(tmp_path)],
                          capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, PYTHONPATH=CHECKOUT))
    assert proc.returncode == -9 and "created" not in proc.stdout, proc.stderr[-2000:]
    assert os.path.isdir(tmp_path / "t-4")              # the orphans are there
    with logkit.Broker(str(tmp_path), background=False) as broker:
        assert "t" not in broker.topics()
        with pytest.raises(logkit.UnknownTopicError):
            broker.topic("t")
        topic = broker.create_topic("t", partitions=5)
        for p in range(5):
            assert logkit.broker.read_topic_id(str(tmp_path / f"t-{p}")) == topic.topic_id
            topic.partition(p).append([(None, b"v", [], None)])
            assert topic.partition(p).high_watermark == 1


def open_descriptors() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts /proc/self/fd")
def test_create_topic_hands_its_opened_partitions_to_the_topic(tmp_path, monkeypatch):
    """The partition logs create_topic initialised stay open as the topic's handles,
    with the first segment each made (its .log open, its indexes mapped): a first
    append opens nothing — not the partition again (its tail file), not the segment —
    and nothing is left open when the topic is closed."""
    from logkit import segment as segment_module
    with logkit.Broker(str(tmp_path), background=False) as broker:
        before = open_descriptors()
        topic = broker.create_topic("t", partitions=20)
        assert all(p.opened for p in topic.partitions)
        # each tail file's descriptor and its map's (mmap.mmap keeps a dup), and each
        # first segment's .log
        assert open_descriptors() - before == 3 * 20
        opened = []
        monkeypatch.setattr(segment_module.LogSegment, "__init__",
                            lambda *a, **k: opened.append(a) or pytest.fail("reopened"))
        for p in topic.partitions:
            p.append([(None, b"v", [], None)])
        monkeypatch.undo()
        assert opened == [] and open_descriptors() - before == 3 * 20
        assert [p.log_end_offset for p in topic.partitions] == [1] * 20
        for p in topic.partitions:
            p.check()
        broker.delete_topic("t")
        assert open_descriptors() == before


def test_under_a_low_descriptor_limit_create_topic_opens_partitions_on_use(tmp_path):
    result = subprocess.run([sys.executable, "-c", textwrap.dedent("""
        import resource, sys, logkit
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))
        with logkit.Broker(sys.argv[1], background=False) as b:
            few, many = b.create_topic("few", 8), b.create_topic("many", 200)
            print(sum(p.opened for p in few.partitions),
                  sum(p.opened for p in many.partitions))
    """), str(tmp_path)], cwd=CHECKOUT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    # 8 x 4 fits the limit of 256 and stays open; 200 x 4 does not: partition 0 only
    # (the broker opens it to look for an interrupted deletion), the rest on use.
    assert result.stdout.split() == ["8", "1"]


def test_keyed_sends_land_where_murmur2_says_without_a_key_cache(tmp_path):
    """Unique keys (no cache can help) take the compiled send path when it is built:
    its murmur2 places each record where Kafka's partitioner does, and the Python
    path's key cache holds only the keys of the sends that opened a batch (those take
    the Python path)."""
    from logkit import _native
    from logkit.murmur2 import partition_for_key
    with logkit.Broker(str(tmp_path), background=False) as broker:
        broker.create_topic("t", partitions=7)
        with broker.producer() as producer:
            keys = [b"key-%d" % i for i in range(2000)] + [b"", b"a" * 1001]
            futures = [producer.send("t", b"v", key=k) for k in keys]
            placed = [f.result().partition for f in futures]
            cache = producer._states["t"].cache
            if _native.sendpath is not None:
                assert len(cache) <= 50
        assert placed == [partition_for_key(k, 7) for k in keys]
        assert len(set(placed)) == 7


def test_a_new_assignment_reads_the_committed_offsets_once(tmp_path, monkeypatch):
    """Kafka resolves every assigned partition's position before it fetches: one read
    of the group's committed offsets, not one per poll while small polls work through
    a wide assignment; committed positions and the reset policy both still apply."""
    from logkit import consumer as consumer_module
    partitions = 40
    with logkit.Broker(str(tmp_path), background=False) as broker:
        topic = broker.create_topic("t", partitions=partitions)
        for p in range(partitions):
            topic.partition(p).append([(None, b"%d-%d" % (p, i), [], None)
                                       for i in range(3)])
        first = broker.consumer("t", group_id="g", enable_auto_commit=False)
        first.poll(timeout_ms=0)                 # joins; then commit partition 5 at 2
        first.commit({logkit.TopicPartition("t", 5): logkit.OffsetAndMetadata(2, "")})
        first.close()
        reads = _Counting(monkeypatch, consumer_module, "committed_offsets")
        consumer = broker.consumer("t", group_id="g", auto_offset_reset="earliest",
                                   enable_auto_commit=False)
        seen = []
        for _ in range(200):
            seen += consumer.poll(timeout_ms=100, max_records=2)
            if len(seen) == 3 * partitions - 2:
                break
        assert reads.calls == 1
        assert [r.value for r in seen if r.partition == 5] == [b"5-2"]
        assert len(seen) == 3 * partitions - 2
        consumer.close()


def _drained_consumer(broker, partitions):
    topic = broker.create_topic("t", partitions=partitions)
    for p in range(partitions):
        topic.partition(p).append([(None, b"%d" % p, [], None)])
    consumer = broker.consumer("t", group_id="g", auto_offset_reset="earliest",
                               enable_auto_commit=False)
    seen = 0
    for _ in range(50):                               # bounded: 50 polls of <= 1 s
        seen += len(consumer.poll(timeout_ms=1000, max_records=10_000))
        if seen >= partitions:
            break
    assert seen == partitions
    assert consumer.poll(timeout_ms=0) == []       # every partition found at its end
    return topic, consumer


def test_a_poll_after_one_append_reads_only_the_partitions_of_its_change_slot(
        tmp_path, monkeypatch):
    """The doorbell names the partition an append went to (its change slot): a poll
    after it reads that slot's partitions, not every drained one (3,000 partitions:
    11.8 ms per poll before, a read per partition)."""
    from logkit import consumer as consumer_module
    from logkit.notify import change_slot
    from logkit.topic import Partition
    partitions = 200
    with logkit.Broker(str(tmp_path), background=False) as broker:
        topic, consumer = _drained_consumer(broker, partitions)
        for target in (17, 123):
            # the periodic full recheck must not fall inside a slow run's poll
            monkeypatch.setattr(consumer_module, "FULL_RECHECK_S", 3600.0)
            reads = _Counting(monkeypatch, Partition, "fetch_records")
            topic.partition(target).append([(None, b"new", [], None)])
            got = consumer.poll(timeout_ms=1000)
            assert [(r.partition, r.value) for r in got] == [(target, b"new")]
            sharing = [p for p in range(partitions)
                       if change_slot("t", p) == change_slot("t", target)]
            assert reads.calls == len(sharing) < 5
            monkeypatch.undo()
        consumer.close()


def test_drained_partitions_are_all_read_again_after_the_full_recheck_interval(
        tmp_path, monkeypatch):
    """A bound on any change that reached a partition without its slot moving."""
    from logkit import consumer as consumer_module
    from logkit.topic import Partition
    partitions = 30
    with logkit.Broker(str(tmp_path), background=False) as broker:
        topic, consumer = _drained_consumer(broker, partitions)
        monkeypatch.setattr(consumer_module, "FULL_RECHECK_S", 0.0)
        reads = _Counting(monkeypatch, Partition, "fetch_records")
        topic.partition(4).append([(None, b"new", [], None)])
        assert [r.value for r in consumer.poll(timeout_ms=1000)] == [b"new"]
        assert reads.calls == partitions
        consumer.close()


def test_a_ring_that_names_no_partition_reads_every_drained_partition(tmp_path,
                                                                      monkeypatch):
    from logkit.topic import Partition
    partitions = 30
    with logkit.Broker(str(tmp_path), background=False) as broker:
        _, consumer = _drained_consumer(broker, partitions)
        reads = _Counting(monkeypatch, Partition, "fetch_records")
        broker.doorbell.ring()                     # a follower's progress, a rebalance
        assert consumer.poll(timeout_ms=0) == []
        assert reads.calls == partitions
        consumer.close()


def test_changed_slots_names_the_moved_counters_or_everything():
    from logkit.notify import CHANGE_SLOTS, changed_slots
    words = [0] * CHANGE_SLOTS

    def snapshot():
        return b"".join(w.to_bytes(4, "little") for w in words)

    before = snapshot()
    assert changed_slots(before, snapshot()) == []
    words[3] += 1
    words[CHANGE_SLOTS - 1] = 0xFFFFFFFF
    assert changed_slots(before, snapshot()) == [3, CHANGE_SLOTS - 1]
    words[0] += 1
    assert changed_slots(before, snapshot()) is None
    # among a poller's few slots: only those are looked at
    words[0] -= 1
    assert changed_slots(before, snapshot(), among=[2, 3, 4]) == [3]
    assert changed_slots(before, snapshot(), among=[5]) == []


class _CountingGets(dict):
    """A positions dict that counts lookups (what a poll's walk costs per partition)."""
    gets = 0

    def get(self, *args):
        _CountingGets.gets += 1
        return super().get(*args)


def test_a_poll_visits_only_partitions_that_may_have_data(tmp_path, monkeypatch):
    """Once a walk has seen every partition, the drained ones are not visited again:
    a poll after one append looks at a handful of partitions out of 400, and a seek
    of a drained partition puts it back in the walk."""
    from logkit import consumer as consumer_module
    monkeypatch.setattr(consumer_module, "FULL_RECHECK_S", 3600.0)
    partitions = 400
    with logkit.Broker(str(tmp_path), background=False) as broker:
        topic, consumer = _drained_consumer(broker, partitions)
        subscriptions = consumer._subscriptions
        subscriptions.positions = _CountingGets(subscriptions.positions)
        topic.partition(250).append([(None, b"new", [], None)])
        _CountingGets.gets = 0
        assert [r.value for r in consumer.poll(timeout_ms=1000)] == [b"new"]
        assert _CountingGets.gets <= 10
        _CountingGets.gets = 0
        assert consumer.poll(timeout_ms=0) == []
        assert _CountingGets.gets <= 10
        consumer.seek(logkit.TopicPartition("t", 33), 0)
        assert [(r.partition, r.value) for r in consumer.poll(timeout_ms=1000)] == \
            [(33, b"33")]
        consumer.close()
