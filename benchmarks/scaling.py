"""How cost grows with the number of partitions, beside SQLite and the file-system floor.

Each point (a partition count) runs in a fresh child process, so descriptors, memory and
page cache are that point's alone. Through the public API only, with Kafka's defaults
(`Broker()`, `create_topic`, `producer.send` with unique keys and 100-byte values,
a group consumer's `poll`), it measures:

  create_topic     seconds to create the topic; floor: mkdir + creating the same files
  produce          producer.send rate; floor: os.write of the same batches to one file
                   per partition; peer: SQLite, a table per partition, a txn per batch
  batches          records per appended batch (mean, and the share under 10 records)
  fds              descriptors held by the producing process, per partition
  index cache      page cache resident in the .index/.timeindex files after producing
                   (mincore), per partition: what index writes grew
  consume          a group consumer's poll rate; reference: a Partition.read loop over
                   the same partitions; peer: SQLite SELECT per table
  consumer fds     descriptors held by the consuming process once it has read all

and, once per run, reopening one partition of `--reopen-mb` (64 MiB segments) after a
writer died mid-update of the tail (its sequence number left odd): the reopen beside a
clean reopen and the floor (the clean reopen plus reading and CRC-32C-checking the bytes
above the recovery point), and how long a reader that has the partition open takes to
repair it.

Run from the checkout's root (its own command line and JSON, not part of `all`):
    .venv/bin/python -m benchmarks.scaling [--points 10,100,1000] [--records N]
        [--json benchmarks/scaling.json] [--plots docs]
`--quick` is the small size the test suite smoke-tests. Speed is never asserted.
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import json
import mmap
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from typing import Any

TOPIC = "scale"
VALUE = b"v" * 100
MAX_RECORDS_PER_POLL = 500
IDLE_POLLS_MAX = 50
DEFAULT_POINTS = (10, 100, 1000)
QUICK_POINTS = (2, 8)
QUICK_RECORDS = 3000
QUICK_REOPEN_MB = 2
CHILD_TIMEOUT_S = 3600

_libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                       ctypes.c_int, ctypes.c_long]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]


def resident_bytes(path: str) -> int:
    """Bytes of `path` in the page cache now (mincore over a fresh map, which faults
    nothing in)."""
    size = os.path.getsize(path)
    if not size:
        return 0
    fd = os.open(path, os.O_RDONLY)
    try:
        addr = _libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        if addr in (None, ctypes.c_void_p(-1).value):
            raise OSError(ctypes.get_errno(), "mmap failed", path)
        try:
            pages = (size + mmap.PAGESIZE - 1) // mmap.PAGESIZE
            vec = (ctypes.c_ubyte * pages)()
            if _libc.mincore(addr, size, vec) != 0:
                raise OSError(ctypes.get_errno(), "mincore failed", path)
            return sum(b & 1 for b in vec) * mmap.PAGESIZE
        finally:
            _libc.munmap(addr, size)
    finally:
        os.close(fd)


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def keys(records: int) -> list[bytes]:
    """Unique keys, spread over the partitions by murmur2."""
    return [b"key-%010d" % i for i in range(records)]


# ---- one point (in the child process) --------------------------------------------------

def point(partitions: int, records: int, root: str) -> dict[str, Any]:
    from logkit import Broker
    from logkit.murmur2 import partition_for_key
    out: dict[str, Any] = {"partitions": partitions, "records": records}
    ks = keys(records)
    owner = [partition_for_key(k, partitions) for k in ks]
    base_fds = open_fds()

    data = os.path.join(root, "logkit")
    broker = Broker(data, background=False)
    started = time.perf_counter()
    broker.create_topic(TOPIC, partitions=partitions)
    out["create_topic_s"] = time.perf_counter() - started
    topic_files = sorted(os.path.relpath(os.path.join(d, n), data)
                         for d, _, names in os.walk(data) for n in names
                         if os.path.basename(d).startswith(TOPIC + "-"))
    out["create_floor_s"] = create_floor(os.path.join(root, "floor-create"), topic_files)

    producer = broker.producer()
    send = producer.send
    started = time.perf_counter()
    for k in ks:
        send(TOPIC, VALUE, key=k)
    producer.flush()
    out["produce_s"] = time.perf_counter() - started
    out["produce_rate"] = records / out["produce_s"]
    out["producer_fds_per_partition"] = (open_fds() - base_fds) / partitions
    index_files = [os.path.join(data, f) for f in topic_files
                   if f.endswith((".index", ".timeindex"))]
    out["index_cache_kib_per_partition"] = \
        sum(resident_bytes(f) for f in index_files) / 1024 / partitions
    producer.close()
    out["batch_records_mean"], out["batches_under_10_share"] = _batch_sizes(data)

    # The first pass over a partition's segments pays for mapping them, whoever reads:
    # an unmeasured read loop first, so the consumer and the measured read loop after
    # it both read mapped segments (they differ by the consumer's own work only).
    _read_loop(broker, partitions)
    consumer = broker.consumer(TOPIC, group_id="scaling", auto_offset_reset="earliest",
                               enable_auto_commit=False)
    seen = idle = 0
    started = time.perf_counter()
    while seen < records and idle < IDLE_POLLS_MAX:
        got = consumer.poll(timeout_ms=100, max_records=MAX_RECORDS_PER_POLL)
        idle = 0 if got else idle + 1
        for r in got:
            r.value
        seen += len(got)
    out["consume_s"] = time.perf_counter() - started
    if seen != records:
        raise RuntimeError(f"consumer.poll returned {seen} of {records} records")
    out["consume_rate"] = records / out["consume_s"]
    out["consumer_fds_per_partition"] = (open_fds() - base_fds) / partitions
    consumer.close()

    started = time.perf_counter()
    _read_loop(broker, partitions)
    out["read_loop_rate"] = records / (time.perf_counter() - started)
    out["rss_mb"] = rss_mb()
    broker.close()
    shutil.rmtree(data, ignore_errors=True)

    out["floor_write_rate"] = _write_floor(os.path.join(root, "floor-write"), ks, owner,
                                           partitions)
    out["sqlite_produce_rate"], out["sqlite_consume_rate"] = \
        _sqlite(os.path.join(root, "peer.db"), ks, owner, partitions)
    return out


def _read_loop(broker: Any, partitions: int) -> int:
    """`Partition.read` over every partition from offset 0 to its high watermark, the
    reference the group consumer is compared with; the records read."""
    from benchmarks._common import read_all
    return read_all(broker.topic(TOPIC), partitions, MAX_RECORDS_PER_POLL)


def create_floor(root: str, files: list[str]) -> float:
    """mkdir + create (O_CREAT, empty) the topic's directories and files."""
    started = time.perf_counter()
    os.makedirs(root)
    made: set[str] = set()
    for rel in files:
        d = os.path.join(root, os.path.dirname(rel))
        if d not in made:
            os.mkdir(d)
            made.add(d)
        os.close(os.open(os.path.join(root, rel), os.O_WRONLY | os.O_CREAT, 0o600))
    return time.perf_counter() - started


def _batch_sizes(data: str) -> tuple[float, float]:
    """Mean records per batch over the topic, and the share of batches under 10 among
    those appended while the producer was saturated: each partition's first and last
    batch are left out of the share (the sender takes the first records before the
    loop is running at full speed, and flush() appends whatever is left)."""
    from logkit.records import iter_batches
    counts: list[int] = []
    middle: list[int] = []
    for d, _, names in os.walk(data):
        if not os.path.basename(d).startswith(TOPIC + "-"):
            continue
        partition: list[int] = []
        for n in sorted(names):
            if n.endswith(".log"):
                with open(os.path.join(d, n), "rb") as f:
                    buf = f.read()
                partition += [h.last_offset_delta + 1
                              for _, h in iter_batches(buf, 0, len(buf), n)]
        counts += partition
        middle += partition[1:-1]
    if not counts:
        return 0.0, 0.0
    return (sum(counts) / len(counts),
            sum(c < 10 for c in middle) / len(middle) if middle else 0.0)


def _per_partition_batches(ks: list[bytes], owner: list[int], partitions: int
                           ) -> list[tuple[int, list[tuple]]]:
    """The records grouped the way a producer batches them: per partition, a batch
    every `records_per_batch` records, in the order they fill."""
    from benchmarks._common import BenchConfig, records_per_batch
    per = records_per_batch(BenchConfig(value_bytes=len(VALUE), key_bytes=len(ks[0])))
    pending: list[list[tuple]] = [[] for _ in range(partitions)]
    out: list[tuple[int, list[tuple]]] = []
    for k, p in zip(ks, owner):
        rows = pending[p]
        rows.append((k, VALUE))
        if len(rows) >= per:
            out.append((p, rows))
            pending[p] = []
    out += [(p, rows) for p, rows in enumerate(pending) if rows]
    return out


def _write_floor(root: str, ks: list[bytes], owner: list[int], partitions: int) -> float:
    """os.write of the same record batches, one file per partition (encoded first)."""
    from logkit.records import encode_batch
    os.makedirs(root)
    now = int(time.time() * 1000)
    batches = [(p, encode_batch([(k, v, None, now) for k, v in rows], now_ms=now))
               for p, rows in _per_partition_batches(ks, owner, partitions)]
    fds = [os.open(os.path.join(root, f"{p}.log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND,
                   0o600) for p in range(partitions)]
    try:
        started = time.perf_counter()
        for p, batch in batches:
            os.write(fds[p], batch)
        return len(ks) / (time.perf_counter() - started)
    finally:
        for fd in fds:
            os.close(fd)
        shutil.rmtree(root, ignore_errors=True)


def _sqlite(path: str, ks: list[bytes], owner: list[int], partitions: int
            ) -> tuple[float, float]:
    """SQLite WAL, a table per partition: inserts a transaction per batch, then reads
    every table back 500 rows per query."""
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=NORMAL")
    for p in range(partitions):
        db.execute(f"CREATE TABLE p{p} (offset INTEGER PRIMARY KEY, timestamp INTEGER, "
                   "key BLOB, value BLOB)")
    batches = _per_partition_batches(ks, owner, partitions)
    next_offset = [0] * partitions
    now = int(time.time() * 1000)
    started = time.perf_counter()
    for p, rows in batches:
        first = next_offset[p]
        next_offset[p] = first + len(rows)
        db.execute("BEGIN")
        db.executemany(f"INSERT INTO p{p} VALUES (?, ?, ?, ?)",
                       [(first + i, now, k, v) for i, (k, v) in enumerate(rows)])
        db.execute("COMMIT")
    produce = len(ks) / (time.perf_counter() - started)
    seen = 0
    started = time.perf_counter()
    for p in range(partitions):
        offset = 0
        while True:
            got = db.execute(f"SELECT offset, timestamp, key, value FROM p{p} WHERE "
                             "offset >= ? ORDER BY offset LIMIT ?",
                             (offset, MAX_RECORDS_PER_POLL)).fetchall()
            if not got:
                break
            for row in got:
                row[3]
            seen += len(got)
            offset = got[-1][0] + 1
    consume = len(ks) / (time.perf_counter() - started)
    db.close()
    if seen != len(ks):
        raise RuntimeError(f"SQLite returned {seen} of {len(ks)} rows")
    return produce, consume


# ---- reopening after a torn tail --------------------------------------------------------

def _tear_tail(directory: str) -> None:
    """Leave the tail as a writer SIGKILLed mid-update does: an odd sequence number."""
    with open(os.path.join(directory, "logkit.tail"), "r+b") as f:
        f.seek(8)
        sequence = int.from_bytes(f.read(8), "little")
        f.seek(8)
        f.write((sequence | 1).to_bytes(8, "little"))


def reopen(megabytes: int, root: str) -> dict[str, Any]:
    """Clean and torn reopens of one partition of `megabytes` MB, and the floor."""
    import statistics

    import logkit
    from logkit.crc import crc32c
    data = os.path.join(root, "reopen")
    with logkit.Broker(data, background=False) as broker:
        partition = broker.create_topic(TOPIC, 1, config={"segment.bytes": 64 << 20}) \
            .partition(0)
        batch = [(None, b"v" * 1000, None, None)] * 100
        for _ in range(megabytes * 10):
            partition.append(batch)
        directory = partition.directory

    def open_once() -> tuple[float, Any]:
        started = time.perf_counter()
        with logkit.Broker(data, background=False) as broker:
            p = broker.topic(TOPIC).partition(0)
            p.high_watermark
            seconds = time.perf_counter() - started
            return seconds, p.last_recovery

    open_once()
    clean = statistics.median(open_once()[0] for _ in range(3))
    _tear_tail(directory)
    torn, report = open_once()
    active = max(n for n in os.listdir(directory) if n.endswith(".log"))
    started = time.perf_counter()
    with open(os.path.join(directory, active), "rb") as f:
        crc32c(f.read())
    scan = time.perf_counter() - started
    with logkit.Broker(data, background=False) as broker:
        p = broker.topic(TOPIC).partition(0)
        p.high_watermark
        _tear_tail(directory)
        started = time.perf_counter()
        p.high_watermark                     # a reader meets the torn tail and repairs it
        repair = time.perf_counter() - started
    shutil.rmtree(data, ignore_errors=True)
    return {"megabytes": megabytes, "clean_reopen_s": clean, "torn_reopen_s": torn,
            "torn_bytes_checked": report.bytes_checked if report else 0,
            "floor_s": clean + scan, "reader_repair_s": repair}


# ---- the driver ------------------------------------------------------------------------

def run_point(partitions: int, records: int, directory: str | None) -> dict[str, Any]:
    """One point in a fresh child process (its own descriptors, memory and maps)."""
    root = tempfile.mkdtemp(prefix=f"logkit-bench-scaling-{partitions}-", dir=directory)
    checkout = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=checkout + os.pathsep + os.environ.get("PYTHONPATH",
                                                                              ""))
    try:
        proc = subprocess.run([sys.executable, "-m", "benchmarks.scaling", "--child",
                               str(partitions), "--records", str(records), "--dir", root],
                              cwd=checkout, env=env, capture_output=True, text=True,
                              timeout=CHILD_TIMEOUT_S)
        if proc.returncode != 0:
            raise RuntimeError(f"scaling point {partitions} failed:\n{proc.stderr[-4000:]}")
        return json.loads(proc.stdout)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def combine(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One row from repeated runs of a point: the median of each figure, and for the
    rates their min and max too (`<key>_min`, `<key>_max`)."""
    import statistics
    row: dict[str, Any] = {"runs": len(runs)}
    for key, value in runs[0].items():
        values = [r[key] for r in runs]
        if key in ("partitions", "records"):
            row[key] = value
            continue
        row[key] = statistics.median(values)
        if key.endswith("_rate"):
            row[key + "_min"], row[key + "_max"] = min(values), max(values)
    return row


COLUMNS = [("partitions", "partitions", "{:d}"),
           ("produce rec/s", "produce_rate", "{:,.0f}"),
           ("os.write floor", "floor_write_rate", "{:,.0f}"),
           ("SQLite produce", "sqlite_produce_rate", "{:,.0f}"),
           ("rec/batch", "batch_records_mean", "{:.1f}"),
           ("<10 share", "batches_under_10_share", "{:.2f}"),
           ("consume rec/s", "consume_rate", "{:,.0f}"),
           ("read loop", "read_loop_rate", "{:,.0f}"),
           ("SQLite consume", "sqlite_consume_rate", "{:,.0f}"),
           ("create_topic ms", "create_topic_s", "{:.0f}"),
           ("create floor ms", "create_floor_s", "{:.0f}"),
           ("fds/p produce", "producer_fds_per_partition", "{:.2f}"),
           ("fds/p consume", "consumer_fds_per_partition", "{:.2f}"),
           ("index KiB/p", "index_cache_kib_per_partition", "{:.0f}"),
           ("RSS MiB", "rss_mb", "{:.0f}")]


def markdown(rows: list[dict[str, Any]]) -> str:
    lines = ["| " + " | ".join(c[0] for c in COLUMNS) + " |",
             "|" + "---:|" * len(COLUMNS)]
    for row in rows:
        cells = []
        for _, key, fmt in COLUMNS:
            value = row[key] * 1000 if key.endswith("_s") else row[key]
            cells.append(fmt.format(value))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(rows: list[dict[str, Any]], directory: str, suffix: str = "",
         before: list[dict[str, Any]] | None = None) -> list[str]:
    """Draw the curves as PNGs in `directory` (needs matplotlib: the bench extra);
    `before` (rows of an earlier run) adds its curves dashed."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        sys.stderr.write("matplotlib is not installed (pip install logkit[bench]): "
                         "no plots\n")
        return []
    xs = [r["partitions"] for r in rows]
    figures = {
        "rates": ("records/s", [("logkit produce", "produce_rate"),
                                ("os.write floor", "floor_write_rate"),
                                ("SQLite produce", "sqlite_produce_rate"),
                                ("logkit consume (group poll)", "consume_rate"),
                                ("Partition.read loop", "read_loop_rate"),
                                ("SQLite consume", "sqlite_consume_rate")]),
        "costs": ("per partition", [("fds (producer)", "producer_fds_per_partition"),
                                    ("fds (consumer)", "consumer_fds_per_partition"),
                                    ("index page cache KiB", "index_cache_kib_per_partition"),
                                    ("create_topic ms", "create_topic_ms_per_partition"),
                                    ("create floor ms", "create_floor_ms_per_partition")]),
    }
    for r in rows + (before or []):
        r["create_topic_ms_per_partition"] = r["create_topic_s"] * 1000 / r["partitions"]
        r["create_floor_ms_per_partition"] = r["create_floor_s"] * 1000 / r["partitions"]
    written = []
    for name, (ylabel, series) in figures.items():
        fig, ax = plt.subplots(figsize=(7, 4.2))
        for label, key in series:
            line, = ax.plot(xs, [r[key] for r in rows], marker="o", label=label)
            if before and all(key in r for r in before):
                ax.plot([r["partitions"] for r in before], [r[key] for r in before],
                        linestyle="--", marker="x", color=line.get_color(), alpha=0.6,
                        label=f"{label} (before)")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("partitions")
        ax.set_ylabel(ylabel)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
        ax.set_title(f"logkit: how cost grows with partitions ({name})")
        path = os.path.join(directory, f"scaling-{name}{suffix}.png")
        fig.tight_layout()
        fig.savefig(path, dpi=90)
        plt.close(fig)
        written.append(path)
    return written


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--points", default=",".join(map(str, DEFAULT_POINTS)),
                        help="partition counts (default %(default)s)")
    parser.add_argument("--records", type=int, default=300_000,
                        help="records per point (default %(default)s)")
    parser.add_argument("--reopen-mb", type=int, default=256,
                        help="size of the partition reopened after a torn tail "
                        "(default %(default)s; 0: skip)")
    parser.add_argument("--quick", action="store_true",
                        help=f"tiny: points {QUICK_POINTS}, {QUICK_RECORDS} records, "
                        f"{QUICK_REOPEN_MB} MB reopened")
    parser.add_argument("--repeats", type=int, default=1,
                        help="runs of each point; figures are medians, rates also "
                        "keep their min and max (default %(default)s)")
    parser.add_argument("--dir", default=None, help="where temporary data goes")
    parser.add_argument("--json", metavar="FILE", help="write the rows as JSON")
    parser.add_argument("--plots", metavar="DIR", help="draw PNG curves into DIR")
    parser.add_argument("--plot-suffix", default="", help="suffix of the PNG names")
    parser.add_argument("--before", metavar="JSON",
                        help="an earlier run's --json, drawn dashed beside this one")
    parser.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child is not None:
        json.dump(point(args.child, args.records, args.dir), sys.stdout)
        return []
    points = QUICK_POINTS if args.quick else tuple(int(p) for p in args.points.split(","))
    records = QUICK_RECORDS if args.quick else args.records
    rows = []
    for n in points:
        sys.stderr.write(f"scaling: {n} partitions, {records:,} records ...\n")
        rows.append(combine([run_point(n, records, args.dir)
                             for _ in range(max(1, args.repeats))]))
    print(markdown(rows))
    reopen_mb = QUICK_REOPEN_MB if args.quick else args.reopen_mb
    reopened = None
    if reopen_mb:
        sys.stderr.write(f"scaling: reopen after a torn tail, {reopen_mb} MB ...\n")
        root = tempfile.mkdtemp(prefix="logkit-bench-scaling-reopen-", dir=args.dir)
        try:
            reopened = reopen(reopen_mb, root)
        finally:
            shutil.rmtree(root, ignore_errors=True)
        print(f"\nreopen of {reopen_mb} MB after a torn tail: "
              f"{reopened['torn_reopen_s'] * 1000:.1f} ms (scanned "
              f"{reopened['torn_bytes_checked'] / 1e6:.1f} MB); clean reopen "
              f"{reopened['clean_reopen_s'] * 1000:.1f} ms; floor (clean + read and CRC "
              f"of the bytes above the recovery point) {reopened['floor_s'] * 1000:.1f} "
              f"ms; an open reader repairs it in "
              f"{reopened['reader_repair_s'] * 1000:.1f} ms")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"records": records, "rows": rows, "reopen": reopened}, f, indent=1)
            f.write("\n")
    if args.plots:
        before = None
        if args.before:
            with open(args.before, encoding="utf-8") as f:
                before = json.load(f)["rows"]
        for path in plot(rows, args.plots, args.plot_suffix, before):
            sys.stderr.write(f"wrote {path}\n")
    return rows


if __name__ == "__main__":
    main()
