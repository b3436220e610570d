"""How cost grows, the curves beside benchmarks/scaling.py (issue 16, goal 5): each one
through logkit's public API (and its log-level append where the curve is about the log)
beside its floor in the same run.

  create     create_topic and reopening every partition, per partition count; floors:
             mkdir + creating the same files, and listing each partition directory +
             opening and closing each of its files
  seek       read latency (one record) at random offsets as one partition grows to each
             size in --seek-gb; floor: os.pread of the same length at a random position
             of the same segment files
  rss        RSS (and its anonymous / file-backed parts) while a group consumer polls
             the whole partition the seek curve built; reference: os.read of the same
             segment files in 1 MiB chunks
  values     producer.send + flush and consumer.poll of values of each size in
             --value-sizes; floor: os.write / os.read of the same values to one file
  rebalance  time from a new member's join until every one of N member processes
             (--members) polls its share of the new assignment; floor: a byte broadcast
             through a pipe to the same number of processes and their replies
  writers    appends to one partition from N processes (--writers), Partition.append_batch
             of producer-sized batches; floor: os.write with O_APPEND of the same
             batches to one file; peer: SQLite WAL, a transaction per batch

Each curve's figures come from one run on a shared machine: read the ratios within a
row, not absolute rates. Run from the checkout's root (its own command line):
    .venv/bin/python -m benchmarks.curves [--curves create,seek,rss,values,rebalance,
        writers] [--json benchmarks/curves.json] [--plots docs]
`--quick` is the small size tests/tools/test_bench.py runs (a few seconds). Speed is never
asserted. Invariant: every curve works in its own scratch directory, removed when it
ends, and stops every process it started.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable

from benchmarks.scaling import create_floor

TOPIC = "curve"
CURVES = ("create", "seek", "rss", "values", "rebalance", "writers")
CHILD_TIMEOUT_S = 600
STABLE_TIMEOUT_S = 300
REBALANCE_PARTITIONS = 60
BATCH_BYTES = 16384                  # the producer's default batch_size
SEEK_SAMPLES = 2000
RSS_STEPS = 10                       # RSS samples along the consumption
READ_CHUNK = 1 << 20

FULL = {"create_points": (10, 100, 1000, 3000), "seek_gb": (1.0, 5.0),
        "value_sizes": (1024, 10240, 102400, 1048576), "value_total_mb": 256,
        "members": (2, 10, 50), "writers": (1, 2, 4, 8), "writer_batches": 4000,
        "seek_samples": SEEK_SAMPLES, "rounds": 3, "member_poll_ms": 50}
QUICK = {"create_points": (2, 8), "seek_gb": (0.002, 0.004),
         "value_sizes": (1024, 102400), "value_total_mb": 2,
         "members": (2,), "writers": (1,), "writer_batches": 50, "seek_samples": 50,
         "rounds": 1, "member_poll_ms": 50}


def now() -> float:
    return time.perf_counter()


def status_kib(*fields: str) -> dict[str, float]:
    """Fields of /proc/self/status in MiB (VmRSS, RssAnon, RssFile)."""
    out = {f: 0.0 for f in fields}
    with open("/proc/self/status") as f:
        for line in f:
            key = line.split(":")[0]
            if key in out:
                out[key] = int(line.split()[1]) / 1024
    return out


def pcts(samples: list[float]) -> tuple[float, float]:
    ordered = sorted(samples)
    return ordered[len(ordered) // 2], ordered[min(len(ordered) - 1,
                                                   int(0.99 * len(ordered)))]


def batches_of(value_bytes: int, count: int, key: bool = False) -> list[bytearray]:
    """`count` producer-sized batches of records with `value_bytes` values."""
    from logkit.records import encode_batch
    value = os.urandom(value_bytes)
    per = max(1, (BATCH_BYTES - 61) // (value_bytes + 20))
    stamp = int(time.time() * 1000)
    return [encode_batch([(b"k%09d" % i if key else None, value, None, stamp)
                          for i in range(per)], now_ms=stamp) for _ in range(count)]


def topic_files(data: str) -> list[str]:
    return sorted(os.path.relpath(os.path.join(d, n), data)
                  for d, _, names in os.walk(data) for n in names
                  if os.path.basename(d).startswith(TOPIC + "-"))


# ---- create_topic and reopen -----------------------------------------------------------

def reopen_floor(data: str, partitions: int) -> float:
    """List each partition directory and open + close each of its files."""
    started = now()
    for p in range(partitions):
        d = os.path.join(data, f"{TOPIC}-{p}")
        for name in os.listdir(d):
            os.close(os.open(os.path.join(d, name), os.O_RDONLY))
    return now() - started


def curve_create(sizes: dict, root: str) -> list[dict[str, Any]]:
    """Per partition count, rounds of (create_topic, its floor, reopen, its floor), the
    order alternating so the writeback one leaves behind hits both sides; medians. The
    durability barrier's share of create_topic is timed apart (`barrier_s`)."""
    import logkit.broker
    from logkit import Broker
    real_barrier = getattr(logkit.broker, "sync_filesystem", None)
    barrier: list[float] = []
    if real_barrier is not None:
        def timed_barrier(path: str) -> None:
            started = now()
            real_barrier(path)
            barrier.append(now() - started)
        logkit.broker.sync_filesystem = timed_barrier
    rows = []
    try:
        for n in sizes["create_points"]:
            runs: dict[str, list[float]] = {k: [] for k in ("create_s", "create_floor_s",
                                                            "reopen_s", "reopen_floor_s")}
            barrier.clear()
            files: list[str] = []                 # the topic's files, from round 0
            for r in range(sizes["rounds"] if n <= 1000 else 1):
                data = os.path.join(root, f"logkit-{n}-{r}")
                floor_dir = os.path.join(root, f"floor-{n}-{r}")

                def logkit_side() -> None:
                    broker = Broker(data, background=False)
                    started = now()
                    broker.create_topic(TOPIC, partitions=n)
                    runs["create_s"].append(now() - started)
                    broker.close()
                    if not files:
                        files[:] = topic_files(data)
                    started = now()
                    broker = Broker(data, background=False)
                    topic = broker.topic(TOPIC)
                    for p in range(n):
                        topic.partition(p).high_watermark
                    runs["reopen_s"].append(now() - started)
                    broker.close()

                def floor_side() -> None:
                    runs["create_floor_s"].append(create_floor(floor_dir, files))
                    runs["reopen_floor_s"].append(reopen_floor(floor_dir, n))

                if r % 2 == 0:
                    logkit_side()
                    floor_side()
                else:
                    floor_side()
                    logkit_side()
                shutil.rmtree(data, ignore_errors=True)
                shutil.rmtree(floor_dir, ignore_errors=True)
            row: dict[str, Any] = {"partitions": n, "rounds": len(runs["create_s"])}
            for key, values in runs.items():
                row[key] = statistics.median(values)
            row["barrier_s"] = statistics.median(barrier) if barrier else 0.0
            row["create_ms_per_partition"] = row["create_s"] * 1000 / n
            row["create_floor_ms_per_partition"] = row["create_floor_s"] * 1000 / n
            row["reopen_ms_per_partition"] = row["reopen_s"] * 1000 / n
            row["reopen_floor_ms_per_partition"] = row["reopen_floor_s"] * 1000 / n
            row["create_vs_floor"] = row["create_s"] / row["create_floor_s"]
            row["reopen_vs_floor"] = row["reopen_s"] / row["reopen_floor_s"]
            rows.append(row)
            sys.stderr.write(f"curves: create {n}: {row['create_ms_per_partition']:.2f} "
                             f"ms/partition ({row['create_vs_floor']:.2f}x floor; barrier "
                             f"{row['barrier_s'] * 1000:.0f} ms); reopen "
                             f"{row['reopen_vs_floor']:.2f}x floor\n")
    finally:
        if real_barrier is not None:
            logkit.broker.sync_filesystem = real_barrier
    return rows


# ---- a growing partition: random-offset reads, then RSS while consuming it -------------

def segment_files(directory: str) -> list[tuple[str, int]]:
    return [(os.path.join(directory, n), os.path.getsize(os.path.join(directory, n)))
            for n in sorted(os.listdir(directory)) if n.endswith(".log")]


def seek_floor(files: list[tuple[str, int]], samples: int, length: int,
               rng: random.Random) -> list[float]:
    """os.pread of `length` bytes at random positions of the files (weighted by size)."""
    fds = [(os.open(path, os.O_RDONLY), size) for path, size in files if size > length]
    total = sum(size for _, size in fds)
    out = []
    try:
        for _ in range(samples):
            at = rng.randrange(total)
            for fd, size in fds:
                if at < size:
                    break
                at -= size
            started = now()
            os.pread(fd, length, max(0, min(at, size - length)))
            out.append(now() - started)
    finally:
        for fd, _ in fds:
            os.close(fd)
    return out


def curve_seek_rss(sizes: dict, root: str) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Grow one partition to each size of seek_gb, timing random-offset reads at each;
    then the RSS of a group consumer reading it all, beside os.read of the same files."""
    from logkit import Broker
    rng = random.Random(7)
    data = os.path.join(root, "logkit")
    broker = Broker(data, background=False)
    partition = broker.create_topic(TOPIC, partitions=1).partition(0)
    directory = os.path.join(data, f"{TOPIC}-0")
    batches = batches_of(1024, 64)
    written = 0
    seek_rows = []
    for gb in sizes["seek_gb"]:
        target = int(gb * 1e9)
        i = 0
        while written < target:
            batch = batches[i % len(batches)]
            partition.append_batch(bytearray(batch), verify=False)
            written += len(batch)
            i += 1
        end = partition.high_watermark
        lat = []
        for _ in range(sizes["seek_samples"]):
            offset = rng.randrange(end)
            started = now()
            got = partition.read(offset, max_records=1)
            lat.append(now() - started)
            if not got or got[0].offset > offset:
                raise RuntimeError(f"read({offset}) returned {got[:1]}")
        floor = seek_floor(segment_files(directory), sizes["seek_samples"], 1100, rng)
        (p50, p99), (f50, f99) = pcts(lat), pcts(floor)
        seek_rows.append({"gb": written / 1e9, "records": end,
                          "segments": len(segment_files(directory)),
                          "read_us_p50": p50 * 1e6, "read_us_p99": p99 * 1e6,
                          "floor_us_p50": f50 * 1e6, "floor_us_p99": f99 * 1e6})
        sys.stderr.write(f"curves: seek at {written / 1e9:.2f} GB: p50 {p50 * 1e6:.0f} us "
                         f"(floor {f50 * 1e6:.0f} us)\n")
    end = partition.high_watermark
    broker.close()

    # the reference first: os.read of the same files, RSS sampled as it goes
    files = segment_files(directory)
    total = sum(size for _, size in files)
    step = max(1, total // RSS_STEPS)
    ref_samples = []
    done, mark = 0, step
    buf = bytearray(READ_CHUNK)
    started = now()
    for path, _ in files:
        fd = os.open(path, os.O_RDONLY)
        try:
            while True:
                n = os.readv(fd, [buf])
                if not n:
                    break
                done += n
                if done >= mark:
                    mark += step
                    ref_samples.append({"gb": done / 1e9,
                                        **status_kib("VmRSS", "RssAnon", "RssFile")})
        finally:
            os.close(fd)
    ref_s = now() - started

    broker = Broker(data, background=False)
    consumer = broker.consumer(TOPIC, group_id="curves", auto_offset_reset="earliest",
                               enable_auto_commit=False)
    samples, seen, idle = [], 0, 0
    mark = end // RSS_STEPS or 1
    started = now()
    while seen < end and idle < 50:
        got = consumer.poll(timeout_ms=100, max_records=500)
        idle = 0 if got else idle + 1
        seen += len(got)
        if seen >= mark:
            mark += end // RSS_STEPS or 1
            samples.append({"gb": total * seen / end / 1e9,
                            **status_kib("VmRSS", "RssAnon", "RssFile")})
    consume_s = now() - started
    if seen != end:
        raise RuntimeError(f"consumer.poll returned {seen} of {end} records")
    consumer.close()
    broker.close()
    shutil.rmtree(data, ignore_errors=True)
    last = samples[-1]
    rss = {"gb": total / 1e9, "records": end, "consumer": samples, "os_read": ref_samples,
           "consumer_rss_mib": last["VmRSS"], "consumer_anon_mib": last["RssAnon"],
           "consumer_file_mib": last["RssFile"],
           "consumer_rss_max_mib": max(s["VmRSS"] for s in samples),
           "os_read_rss_mib": ref_samples[-1]["VmRSS"] if ref_samples else None,
           "consume_mb_per_s": total / consume_s / 1e6,
           "os_read_mb_per_s": total / ref_s / 1e6}
    sys.stderr.write(f"curves: rss after consuming {total / 1e9:.2f} GB: "
                     f"{rss['consumer_rss_mib']:.0f} MiB (anon {rss['consumer_anon_mib']:.0f},"
                     f" file {rss['consumer_file_mib']:.0f})\n")
    return seek_rows, rss


# ---- value sizes -----------------------------------------------------------------------

def curve_values(sizes: dict, root: str) -> list[dict[str, Any]]:
    from logkit import Broker
    rows = []
    total = sizes["value_total_mb"] << 20
    for size in sizes["value_sizes"]:
        count = max(4, total // size)
        value = os.urandom(size)
        limit = max(size * 2, 1 << 20) + 4096
        best: dict[str, float] = {}
        for round_ in range(sizes["rounds"]):
            data = os.path.join(root, f"logkit-{size}-{round_}")
            broker = Broker(data, background=False)
            broker.create_topic(TOPIC, partitions=1, config={"max.message.bytes": limit})
            producer = broker.producer(max_request_size=limit)
            started = now()
            for _ in range(count):
                producer.send(TOPIC, value)
            producer.flush()
            times = {"produce": now() - started}
            producer.close()
            consumer = broker.consumer(TOPIC, group_id="values",
                                       auto_offset_reset="earliest",
                                       enable_auto_commit=False,
                                       max_partition_fetch_bytes=limit,
                                       fetch_max_bytes=max(limit, 50 << 20))
            seen = idle = 0
            started = now()
            while seen < count and idle < 50:
                got = consumer.poll(timeout_ms=100, max_records=500)
                idle = 0 if got else idle + 1
                for r in got:
                    r.value
                seen += len(got)
            times["consume"] = now() - started
            if seen != count:
                raise RuntimeError(f"consumer.poll returned {seen} of {count} values")
            consumer.close()
            broker.close()
            shutil.rmtree(data, ignore_errors=True)
            path = os.path.join(root, f"floor-{size}")
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            started = now()
            for _ in range(count):
                os.write(fd, value)
            times["write"] = now() - started
            os.close(fd)
            fd = os.open(path, os.O_RDONLY)
            started = now()
            while os.read(fd, size):
                pass
            times["read"] = now() - started
            os.close(fd)
            os.unlink(path)
            for key, t in times.items():
                best[key] = min(best.get(key, t), t)
        mb = count * size / 1e6
        row = {"value_bytes": size, "values": count, "mb": mb}
        for key, t in best.items():
            row[f"{key}_mb_per_s"] = mb / t
        row["produce_vs_write"] = best["write"] / best["produce"]
        row["consume_vs_read"] = best["read"] / best["consume"]
        rows.append(row)
        sys.stderr.write(f"curves: values of {size} B: produce {row['produce_vs_write']:.2f}x "
                         f"os.write, consume {row['consume_vs_read']:.2f}x os.read\n")
    return rows


# ---- processes: rebalance and writers ---------------------------------------------------

MEMBER = """
import json, os, sys, time
import logkit
root = sys.argv[1]
broker = logkit.Broker(root, background=False)
print(json.dumps({"join": time.monotonic()}), flush=True)
consumer = broker.consumer(group_id="rebalance", enable_auto_commit=False)
last = None
def report(mine):
    global last
    if mine != last:
        last = mine
        print(json.dumps({"at": time.monotonic(), "partitions": mine}), flush=True)
# A rebalance runs inside poll() (as in Kafka, poll does not return for it): the
# listeners report the new assignment when it is taken, not when the poll ends.
consumer.subscribe([sys.argv[2]],
                   on_revoke=lambda tps: report(sorted(
                       tp.partition for tp in set(consumer.assignment()) - set(tps))),
                   on_assign=lambda tps: report(sorted(
                       tp.partition for tp in consumer.assignment())))
stop = os.path.join(root, "stop")
while not os.path.exists(stop):
    consumer.poll(timeout_ms=int(sys.argv[3]))
    report(sorted(tp.partition for tp in consumer.assignment()))
consumer.close()
broker.close()
"""

ECHO = """
import sys, time, os
sys.stdout.write("ready\\n"); sys.stdout.flush()
os.read(0, 1)
sys.stdout.write(repr(time.monotonic()) + "\\n"); sys.stdout.flush()
"""


def child_env() -> dict[str, str]:
    checkout = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return dict(os.environ, PYTHONPATH=checkout)


class Member:
    """A member process of the rebalance curve; its reports read by a thread."""

    def __init__(self, root: str, poll_ms: int) -> None:
        import threading
        self.proc = subprocess.Popen([sys.executable, "-c", MEMBER, root, TOPIC,
                                      str(poll_ms)],
                                     stdout=subprocess.PIPE, stdin=subprocess.DEVNULL,
                                     text=True, env=child_env())
        self.join_at: float | None = None
        self.reports: list[tuple[float, list[int]]] = []
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            msg = json.loads(line)
            if "join" in msg:
                self.join_at = msg["join"]
            else:
                self.reports.append((msg["at"], msg["partitions"]))

    def current(self) -> tuple[float, list[int]] | None:
        return self.reports[-1] if self.reports else None


def wait_stable(members: list[Member]) -> float:
    """Until every member's last report is non-empty and together they cover every
    partition once; the monotonic time of the last report that made it so."""
    deadline = time.monotonic() + STABLE_TIMEOUT_S
    while time.monotonic() < deadline:
        now_ = [m.current() for m in members]
        if all(c and c[1] for c in now_):
            owned = sorted(p for c in now_ for p in c[1])
            if owned == list(range(REBALANCE_PARTITIONS)):
                return max(c[0] for c in now_)
        for m in members:
            if m.proc.poll() is not None:
                raise RuntimeError(f"a member exited with {m.proc.returncode}")
        time.sleep(0.01)
    raise RuntimeError(f"{len(members)} members did not settle in {STABLE_TIMEOUT_S} s")


def broadcast_floor(n: int) -> float:
    """A byte written to each of `n` waiting processes' pipes, until the last reads it."""
    procs = [subprocess.Popen([sys.executable, "-c", ECHO], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True) for _ in range(n)]
    try:
        for p in procs:
            p.stdout.readline()
        started = time.monotonic()
        for p in procs:
            p.stdin.write("x")
            p.stdin.flush()
        return max(float(p.stdout.readline()) for p in procs) - started
    finally:
        for p in procs:
            p.wait(timeout=CHILD_TIMEOUT_S)


def curve_rebalance(sizes: dict, root: str) -> list[dict[str, Any]]:
    from logkit import Broker
    rows = []
    for n in sizes["members"]:
        data = os.path.join(root, f"group-{n}")
        with Broker(data, background=False) as broker:
            broker.create_topic(TOPIC, partitions=REBALANCE_PARTITIONS)
        members: list[Member] = []
        try:
            members = [Member(data, sizes["member_poll_ms"]) for _ in range(n - 1)]
            if members:
                wait_stable(members)
            last = Member(data, sizes["member_poll_ms"])
            members.append(last)
            settled = wait_stable(members)
            while last.join_at is None:
                time.sleep(0.01)
            took = settled - last.join_at
        finally:
            open(os.path.join(data, "stop"), "w").close()
            for m in members:
                try:
                    m.proc.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    m.proc.kill()
                    m.proc.wait()
        floor = broadcast_floor(n)
        rows.append({"members": n, "rebalance_ms": took * 1000, "floor_ms": floor * 1000,
                     "vs_floor": took / floor})
        shutil.rmtree(data, ignore_errors=True)
        sys.stderr.write(f"curves: rebalance with {n} members: {took * 1000:.0f} ms "
                         f"(broadcast floor {floor * 1000:.1f} ms)\n")
    return rows


WRITER = """
import json, os, sqlite3, sys, time
kind, target, batches = sys.argv[1], sys.argv[2], int(sys.argv[3])
sys.path.insert(0, os.environ["PYTHONPATH"])
from benchmarks.curves import _records_in, batches_of
work = batches_of(100, min(batches, 64), key=True)
if kind == "logkit":
    import logkit
    broker = logkit.Broker(target, background=False)
    partition = broker.topic("curve").partition(0)
    def one(b):
        partition.append_batch(bytearray(b), verify=False)
elif kind == "os.write":
    fd = os.open(target, os.O_WRONLY | os.O_APPEND)
    def one(b):
        os.write(fd, b)
else:
    db = sqlite3.connect(target, isolation_level=None, timeout=60)
    db.execute("PRAGMA synchronous=NORMAL")
    rows = [(None, b"k%09d", b"v" * 100)] * _records_in(work[0])
    def one(b):
        db.execute("BEGIN IMMEDIATE")
        db.executemany("INSERT INTO log VALUES (?, ?, ?)", rows)
        db.execute("COMMIT")
print("ready", flush=True)
sys.stdin.readline()
started = time.monotonic()
for i in range(batches):
    one(work[i % len(work)])
print(json.dumps([started, time.monotonic()]), flush=True)
"""


def run_writers(kind: str, target: str, n: int, batches: int) -> float:
    """Seconds from the first writer's start to the last one's end."""
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, kind, target, str(batches)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                              env=child_env()) for _ in range(n)]
    try:
        for p in procs:
            if p.stdout.readline().strip() != "ready":
                raise RuntimeError(f"a {kind} writer failed to start")
        for p in procs:
            p.stdin.write("go\n")
            p.stdin.flush()
        spans = [json.loads(p.stdout.readline()) for p in procs]
    finally:
        for p in procs:
            p.wait(timeout=CHILD_TIMEOUT_S)
    return max(s[1] for s in spans) - min(s[0] for s in spans)


def curve_writers(sizes: dict, root: str) -> list[dict[str, Any]]:
    from logkit import Broker
    per_batch = _records_in(batches_of(100, 1, key=True)[0])
    rows = []
    for n in sizes["writers"]:
        batches = sizes["writer_batches"]
        records = n * batches * per_batch
        data = os.path.join(root, f"logkit-{n}")
        with Broker(data, background=False) as broker:
            broker.create_topic(TOPIC, partitions=1)
        floor = os.path.join(root, f"floor-{n}.log")
        open(floor, "wb").close()
        db_path = os.path.join(root, f"peer-{n}.db")
        db = sqlite3.connect(db_path, isolation_level=None)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("CREATE TABLE log (offset INTEGER PRIMARY KEY, key BLOB, value BLOB)")
        db.close()
        times = {"logkit": run_writers("logkit", data, n, batches),
                 "os.write": run_writers("os.write", floor, n, batches),
                 "sqlite": run_writers("sqlite", db_path, n, batches)}
        with Broker(data, background=False) as broker:
            stored = broker.topic(TOPIC).partition(0).high_watermark
        if stored != records:
            raise RuntimeError(f"{n} writers stored {stored} of {records} records")
        row = {"writers": n, "records": records,
               "logkit_rate": records / times["logkit"],
               "floor_rate": records / times["os.write"],
               "sqlite_rate": records / times["sqlite"]}
        row["vs_floor"] = row["logkit_rate"] / row["floor_rate"]
        row["vs_sqlite"] = row["logkit_rate"] / row["sqlite_rate"]
        rows.append(row)
        for path in (data, floor, db_path, db_path + "-wal", db_path + "-shm"):
            shutil.rmtree(path, ignore_errors=True) if os.path.isdir(path) else \
                (os.path.exists(path) and os.unlink(path))
        sys.stderr.write(f"curves: {n} writer process(es): {row['logkit_rate']:,.0f} rec/s "
                         f"({row['vs_floor']:.2f}x os.write, {row['vs_sqlite']:.2f}x "
                         f"SQLite)\n")
    return rows


def _records_in(batch: bytearray) -> int:
    from logkit.records import read_header
    header = read_header(batch, 0, len(batch))
    assert header is not None
    return header.last_offset_delta + 1


# ---- output ----------------------------------------------------------------------------

def plot(doc: dict[str, Any], directory: str) -> list[str]:
    """One PNG per curve in `directory` (needs matplotlib: the bench extra)."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        sys.stderr.write("matplotlib is not installed (pip install logkit[bench]): "
                         "no plots\n")
        return []
    specs: dict[str, tuple[str, str, str, list[tuple[str, str]], bool]] = {
        "create": ("create", "partitions", "ms per partition",
                   [("create_topic", "create_ms_per_partition"),
                    ("floor: mkdir + create the files", "create_floor_ms_per_partition"),
                    ("reopen (Broker + every partition)", "reopen_ms_per_partition"),
                    ("floor: list + open each file", "reopen_floor_ms_per_partition")],
                   True),
        "seek": ("seek", "log size (GB)", "µs per random-offset read",
                 [("Partition.read p50", "read_us_p50"), ("Partition.read p99",
                                                          "read_us_p99"),
                  ("os.pread p50", "floor_us_p50"), ("os.pread p99", "floor_us_p99")],
                 False),
        "values": ("values", "value bytes", "MB/s",
                   [("producer.send", "produce_mb_per_s"), ("os.write", "write_mb_per_s"),
                    ("consumer.poll", "consume_mb_per_s"), ("os.read", "read_mb_per_s")],
                   True),
        "rebalance": ("rebalance", "member processes", "ms",
                      [("rebalance (join to all settled), members poll 50 ms",
                        "rebalance_ms"),
                       ("the same, members poll 5 ms", "rebalance_poll5_ms"),
                       ("pipe broadcast floor", "floor_ms")], True),
        "writers": ("writers", "writer processes on one partition", "records/s",
                    [("Partition.append_batch", "logkit_rate"),
                     ("os.write O_APPEND", "floor_rate"), ("SQLite WAL", "sqlite_rate")],
                    False),
    }
    xkeys = {"create": "partitions", "seek": "gb", "values": "value_bytes",
             "rebalance": "members", "writers": "writers"}
    written = []

    def save(fig: Any, name: str) -> None:
        path = os.path.join(directory, f"curves-{name}.png")
        fig.tight_layout()
        fig.savefig(path, dpi=90)
        plt.close(fig)
        written.append(path)

    for name, (title, xlabel, ylabel, series, logx) in specs.items():
        rows = doc.get(name)
        if not rows:
            continue
        fig, ax = plt.subplots(figsize=(7, 4.2))
        xs = [r[xkeys[name]] for r in rows]
        for label, key in series:
            if all(key in r for r in rows):
                line, = ax.plot(xs, [r[key] for r in rows], marker="o", label=label)
                before = doc.get(f"{name}_before") or []
                if before and all(key in r for r in before):   # an earlier run, dashed
                    ax.plot([r[xkeys[name]] for r in before], [r[key] for r in before],
                            linestyle="--", marker="x", color=line.get_color(),
                            alpha=0.6, label=f"{label} (before)")
        if logx:
            ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
        ax.set_title(f"logkit: {title}")
        save(fig, name)
    rss = doc.get("rss")
    if rss:
        fig, ax = plt.subplots(figsize=(7, 4.2))
        for label, rows, key in (("consumer.poll RSS", rss["consumer"], "VmRSS"),
                                 ("consumer.poll anonymous", rss["consumer"], "RssAnon"),
                                 ("consumer.poll file-backed", rss["consumer"], "RssFile"),
                                 ("os.read RSS", rss["os_read"], "VmRSS")):
            ax.plot([r["gb"] for r in rows], [r[key] for r in rows], marker="o",
                    label=label)
        ax.axhline(150, color="grey", linestyle=":", label="goal 150 MiB")
        ax.set_xlabel("GB consumed")
        ax.set_ylabel("MiB")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
        ax.set_title("logkit: RSS while consuming one partition")
        save(fig, "rss")
    return written


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--curves", default=",".join(CURVES),
                        help="which curves (default %(default)s)")
    parser.add_argument("--quick", action="store_true", help="the tiny sizes")
    parser.add_argument("--create-points", help="partition counts of the create curve")
    parser.add_argument("--seek-gb", help="log sizes of the seek curve, in GB")
    parser.add_argument("--value-sizes", help="value sizes in bytes")
    parser.add_argument("--value-total-mb", type=int, help="bytes per value size, MiB")
    parser.add_argument("--members", help="member process counts")
    parser.add_argument("--writers", help="writer process counts")
    parser.add_argument("--writer-batches", type=int, help="batches per writer")
    parser.add_argument("--member-poll-ms", type=int,
                        help="each member's poll(timeout_ms) in the rebalance curve")
    parser.add_argument("--dir", default=None, help="where temporary data goes")
    parser.add_argument("--json", metavar="FILE", help="write the figures as JSON")
    parser.add_argument("--plots", metavar="DIR", help="draw PNG curves into DIR")
    args = parser.parse_args(argv)
    sizes = dict(QUICK if args.quick else FULL)
    for key, cast in (("create_points", int), ("seek_gb", float), ("value_sizes", int),
                      ("members", int), ("writers", int)):
        given = getattr(args, key)
        if given:
            sizes[key] = tuple(cast(x) for x in given.split(","))
    for key in ("value_total_mb", "writer_batches", "member_poll_ms"):
        if getattr(args, key):
            sizes[key] = getattr(args, key)
    wanted = [c for c in args.curves.split(",") if c]
    unknown = set(wanted) - set(CURVES)
    if unknown:
        parser.error(f"unknown curves {sorted(unknown)}; choose from {CURVES}")
    doc: dict[str, Any] = {"sizes": sizes}
    runners: dict[str, Callable[[dict, str], Any]] = {
        "create": curve_create, "values": curve_values, "rebalance": curve_rebalance,
        "writers": curve_writers}
    for name in CURVES:
        if name not in wanted or (name == "rss" and "seek" in wanted):
            continue
        root = tempfile.mkdtemp(prefix=f"logkit-bench-curves-{name}-", dir=args.dir)
        try:
            if name in ("seek", "rss"):
                seek_rows, rss = curve_seek_rss(sizes, root)
                if "seek" in wanted:
                    doc["seek"] = seek_rows
                if "rss" in wanted:
                    doc["rss"] = rss
            else:
                doc[name] = runners[name](sizes, root)
        finally:
            shutil.rmtree(root, ignore_errors=True)
    print(json.dumps({k: v for k, v in doc.items() if k != "rss"}, indent=1))
    if "rss" in doc:
        print(json.dumps({k: v for k, v in doc["rss"].items()
                          if k not in ("consumer", "os_read")}, indent=1))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(doc, f, indent=1)
            f.write("\n")
    if args.plots:
        for path in plot(doc, args.plots):
            sys.stderr.write(f"wrote {path}\n")
    return doc


if __name__ == "__main__":
    main()
