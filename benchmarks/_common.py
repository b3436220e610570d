"""What every benchmark of the suite shares: the run's parameters, the result row, timing,
peak memory, progress, scratch directories and the records themselves.

Owns: `BenchConfig`, `Result`, `measure`, `percentiles`, `scratch` and the record
workload (keys, one value, batches sized the way the producer sizes them). Invariant:
every benchmark works in its own `scratch` directory, which is removed when it ends, and
every loop is bounded by the record count it was given. Benchmarks may use logkit's
internals (they measure the log-level path beside the client path); the library never
imports anything from here.
"""

from __future__ import annotations

import contextlib
import functools
import random
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Sequence

# Kafka's 2014 single-node figures (Jay Kreps, "Benchmarking Apache Kafka: 2 Million
# Writes Per Second (On Three Cheap Machines)"): 100-byte records, one producer thread,
# no replication; end-to-end latency median and 99th percentile. A labelled historical
# anchor, never a same-run peer.
KAFKA_2014 = {"produce_records_per_s": 821_557, "consume_records_per_s": 940_521,
              "e2e_latency_ms_p50": 2.0, "e2e_latency_ms_p99": 3.0}

TARGETS = {"produce": 1_000_000, "consume": 1_500_000, "durable": 300_000,
           "e2e_p50_us": 100, "e2e_p99_us": 1000, "open_ms": 20, "recover_gb_per_s": 1.0}

TOPIC = "bench"
PROGRESS_INTERVAL_S = 0.5
MAX_RECORDS = 100_000_000            # bound on any one run's record count
NOT_INSTALLED = "not installed (pip install logkit[bench])"


@dataclass(frozen=True)
class BenchConfig:
    """The parameters of a run (units last in names)."""

    records: int = 1_000_000
    value_bytes: int = 100
    key_bytes: int = 10
    partitions: int = 3
    batch_bytes: int = 16384          # producer batch_size / bytes per appended batch
    compression: str = "none"
    e2e_records: int = 5000
    e2e_interval_us: int = 200        # spacing of sends in the latency run
    durable_records: int = 200_000
    open_partitions: int = 30
    recover_mb: int = 512
    peer_records_cap: int = 200_000   # slow peers run at most this many records
    directory: str | None = None      # where temporary data goes (default: tempdir)
    progress: bool = True

    def codec_name(self) -> str | None:
        return None if self.compression in ("none", "", None) else self.compression


@dataclass
class Result:
    """One row of the table. Rates are per second; latencies in microseconds."""

    benchmark: str
    system: str
    records: int = 0
    seconds: float = 0.0
    records_per_s: float | None = None
    mb_per_s: float | None = None
    latency_us_p50: float | None = None
    latency_us_p99: float | None = None
    latency_us_p999: float | None = None
    latency_us_max: float | None = None
    peak_rss_mb: float | None = None
    ratio: float | None = None        # logkit's headline figure vs this peer
    headline: bool = False            # logkit's figure that ratios compare against
    note: str = ""
    extra: dict = field(default_factory=dict)


# ---- timing and memory -----------------------------------------------------------------

class Progress:
    """Prints `benchmark: n/total` to stderr at most every PROGRESS_INTERVAL_S."""

    def __init__(self, label: str, total: int, enabled: bool) -> None:
        self.label, self.total, self.enabled = label, total, enabled
        self._next = time.monotonic() + PROGRESS_INTERVAL_S
        self._shown = False

    def update(self, done: int) -> None:
        if self.enabled and time.monotonic() >= self._next:
            self._next = time.monotonic() + PROGRESS_INTERVAL_S
            end = "\r" if sys.stderr.isatty() else "\n"
            sys.stderr.write(f"  {self.label}: {done:,}/{self.total:,} "
                             f"({100 * done / max(self.total, 1):.0f}%)   {end}")
            sys.stderr.flush()
            self._shown = True

    def done(self) -> None:
        if self._shown and sys.stderr.isatty():
            sys.stderr.write(" " * 70 + "\r")


def reset_peak_rss() -> None:
    """Reset the kernel's peak-RSS mark (VmHWM) so each row reports its own peak."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def peak_rss_mb() -> float | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    try:
        import resource
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    except (ImportError, OSError):
        return None


def measure(benchmark: str, system: str, records: int, payload_bytes: int,
            fn: Callable[[], Any], **kwargs: Any) -> Result:
    """Run fn once, timing it; records/s and payload MB/s from the given counts."""
    reset_peak_rss()
    started = time.perf_counter()
    fn()
    seconds = max(time.perf_counter() - started, 1e-9)
    return Result(benchmark, system, records, seconds, records / seconds,
                  payload_bytes / seconds / 1e6, peak_rss_mb=peak_rss_mb(), **kwargs)


def percentiles(samples_ns: Sequence[int]) -> dict[str, float]:
    """p50, p99, p99.9 and max of nanosecond samples, as Result's microsecond fields."""
    ordered = sorted(samples_ns)
    n = len(ordered)

    def pick(q: float) -> float:
        return ordered[min(n - 1, int(q * n))] / 1000

    return {"latency_us_p50": pick(0.50), "latency_us_p99": pick(0.99),
            "latency_us_p999": pick(0.999), "latency_us_max": ordered[-1] / 1000}


def interleaved_medians(runs: dict[str, Callable[[], Any]], repeats: int) -> dict[str, float]:
    """Median seconds of each run over `repeats` rounds, after one warm-up round; each
    round runs every system once, so the machine's noise hits all of them alike."""
    for fn in runs.values():
        fn()                                          # warm every path (and workers)
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(repeats):
        for name, fn in runs.items():
            started = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - started)
    return {name: statistics.median(t) for name, t in times.items()}


@contextlib.contextmanager
def scratch(config: BenchConfig, name: str) -> Iterator[str]:
    """A fresh temporary directory for one benchmark, removed when the block ends."""
    path = tempfile.mkdtemp(prefix=f"logkit-bench-{name}-", dir=config.directory)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


# ---- the workload ----------------------------------------------------------------------

def make_records(config: BenchConfig, count: int) -> list[tuple[bytes, bytes]]:
    """`count` (key, value) pairs: 10,000 distinct random keys cycling, one random value
    (as Kafka's perf test reuses one payload). The same config gives the same pairs in
    every process (a fixed seed)."""
    rng = random.Random(42)
    distinct = min(count, 10_000)
    keys = [rng.randbytes(config.key_bytes) for _ in range(distinct)]
    value = rng.randbytes(config.value_bytes)
    return [(keys[i % distinct], value) for i in range(count)]


def records_per_batch(config: BenchConfig) -> int:
    """How many records fill `batch_bytes`, by the estimate the producer's accumulator
    uses, so the log-level rows append the batches the producer would build."""
    from logkit.records import RECORDS_OFFSET, record_size_estimate
    per_record = record_size_estimate(b"k" * config.key_bytes, b"v" * config.value_bytes,
                                      None)
    return max(1, (config.batch_bytes - RECORDS_OFFSET) // per_record)


def chunks(items: Sequence[Any], size: int) -> Iterator[Sequence[Any]]:
    for start in range(0, len(items), size):
        yield items[start:start + size]


def encoded_batches(config: BenchConfig, pairs: list[tuple[bytes, bytes]]) -> list[bytearray]:
    """The pairs as logkit record batches of `records_per_batch` records each."""
    from logkit.compression import codec_id
    from logkit.records import encode_batch
    codec = codec_id(config.codec_name())
    now = int(time.time() * 1000)
    return [encode_batch([(k, v, None, now) for k, v in chunk], codec=codec, now_ms=now)
            for chunk in chunks(pairs, records_per_batch(config))]


# ---- logkit, shared by several benchmarks ----------------------------------------------

def open_broker(path: str, config: BenchConfig, topic_config: dict | None = None) -> Any:
    """A broker at `path` with topic TOPIC of `config.partitions` partitions."""
    from logkit import Broker
    broker = Broker(path, background=False)
    conf = dict(topic_config or {})
    if config.codec_name():
        conf["compression.type"] = "producer"
    broker.create_topic(TOPIC, partitions=config.partitions, config=conf)
    return broker


def append_all(broker: Any, config: BenchConfig, pairs: list[tuple[bytes, bytes]],
               progress: Progress | None) -> None:
    """The log-level producer: murmur2 partitioning (cached per key), one batch per
    `batch_bytes` per partition, encoded and appended whole as `Partition.append` does."""
    from logkit.compression import codec_id
    from logkit.murmur2 import partition_for_key
    from logkit.records import encode_batch
    topic = broker.topic(TOPIC)
    appenders = [batch_appender(topic.partition(p)) for p in range(config.partitions)]
    per_batch = records_per_batch(config)
    codec = codec_id(config.codec_name())
    cache: dict[bytes, int] = {}
    pending: list[list[tuple]] = [[] for _ in appenders]
    parts = config.partitions
    now = int(time.time() * 1000)
    for n, (key, value) in enumerate(pairs):
        p = cache.get(key)
        if p is None:
            p = cache[key] = partition_for_key(key, parts)
        rows = pending[p]
        rows.append((key, value, None, now))
        if len(rows) >= per_batch:
            appenders[p](encode_batch(rows, codec=codec, now_ms=now))
            pending[p] = []
            if progress is not None and p == 0:
                progress.update(n)
    for p, rows in enumerate(pending):
        if rows:
            appenders[p](encode_batch(rows, codec=codec, now_ms=now))


def batch_appender(partition: Any) -> Callable[[bytearray], Any]:
    """`Partition.append_batch` for batches this process has just encoded: no CRC
    re-check, as the producer appends (the log stamps offsets in place)."""
    return functools.partial(partition.append_batch, verify=False)


def read_all(topic: Any, partitions: int, max_records: int) -> int:
    """The `Partition.read` loop the consumers are compared with: every partition of
    `topic` from offset 0 to its high watermark, `max_records` per read, each value
    touched; the records read."""
    seen = 0
    for p in range(partitions):
        partition = topic.partition(p)
        offset, end = 0, partition.high_watermark
        while offset < end:
            records = partition.read(offset, max_records=max_records)
            for r in records:
                r.value
            seen += len(records)
            offset = records[-1].offset + 1
    return seen
