"""The benchmark suite: logkit beside its peers, measured in the same run.

Owns: `python -m benchmarks` / `logkit bench` — the benchmarks `codec`, `produce`,
`consume`, `e2e`, `durable`, `open` and `recover`, in the spirit of Kafka's
`kafka-producer-perf-test` and `kafka-consumer-perf-test`. Each benchmark measures logkit
and at least one peer on the same records in the same process run, because only
same-run ratios are comparable on a noisy machine:

    codec     kafka-python's DefaultRecordBatchBuilder / DefaultRecordBatch
    storage   SQLite in WAL mode, `executemany` in one transaction per batch
    queue     persist-queue's SQLiteQueue (the Python queue peer)
    physical  plain `os.write` / `os.read` / CRC of the same bytes (the limit)

Kafka's published 2014 single-node figures are printed as a labelled historical anchor,
never as a same-run peer. Results are rows (`Result`); `ratio` is how many times better
logkit's headline row is than the peer (>1: logkit faster, or lower latency).

Speed is never asserted anywhere: tests run each benchmark small and check only that
the figures are sane. Invariant: every benchmark works in its own temporary directory
and removes it, and every loop is bounded by the record count it was given.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import random
import shutil
import sqlite3
import statistics
import struct
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Iterator, Sequence

__all__ = ["BenchConfig", "Result", "BENCHMARKS", "run", "format_table", "main"]

# Kafka's 2014 single-node figures (Jay Kreps, "Benchmarking Apache Kafka: 2 Million
# Writes Per Second (On Three Cheap Machines)"): 100-byte records, one producer thread,
# no replication; end-to-end latency median and 99th percentile.
KAFKA_2014 = {"produce_records_per_s": 821_557, "consume_records_per_s": 940_521,
              "e2e_latency_ms_p50": 2.0, "e2e_latency_ms_p99": 3.0}

TARGETS = {"produce": 1_000_000, "consume": 1_500_000, "durable": 300_000,
           "e2e_p50_us": 100, "e2e_p99_us": 1000, "open_ms": 20, "recover_gb_per_s": 1.0}

TOPIC = "bench"
PROGRESS_INTERVAL_S = 0.5
MAX_RECORDS = 100_000_000            # bound on any one run's record count


@dataclass(frozen=True)
class BenchConfig:
    """The parameters of a run (units last in names)."""

    records: int = 1_000_000
    value_bytes: int = 100
    key_bytes: int = 10
    partitions: int = 3
    batch_bytes: int = 16384          # producer batch_size / records per appended batch
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


# ---- helpers ---------------------------------------------------------------------------

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


def _reset_peak_rss() -> None:
    """Reset the kernel's peak-RSS mark (VmHWM) so each row reports its own peak."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def _peak_rss_mb() -> float | None:
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


def _measure(benchmark: str, system: str, records: int, payload_bytes: int,
             fn: Callable[[], Any], **kwargs: Any) -> Result:
    """Run fn once, timing it; records/s and payload MB/s from the given counts."""
    _reset_peak_rss()
    started = time.perf_counter()
    fn()
    seconds = max(time.perf_counter() - started, 1e-9)
    return Result(benchmark, system, records, seconds, records / seconds,
                  payload_bytes / seconds / 1e6, peak_rss_mb=_peak_rss_mb(), **kwargs)


def _percentiles(samples_ns: Sequence[int]) -> dict[str, float]:
    ordered = sorted(samples_ns)
    n = len(ordered)

    def pick(q: float) -> float:
        return ordered[min(n - 1, int(q * n))] / 1000

    return {"latency_us_p50": pick(0.50), "latency_us_p99": pick(0.99),
            "latency_us_p999": pick(0.999), "latency_us_max": ordered[-1] / 1000}


def _workdir(config: BenchConfig, name: str) -> str:
    return tempfile.mkdtemp(prefix=f"logkit-bench-{name}-", dir=config.directory)


def _records(config: BenchConfig, count: int) -> list[tuple[bytes, bytes]]:
    """`count` (key, value) pairs: 10,000 distinct random keys cycling, one random value
    (as Kafka's perf test reuses one payload)."""
    rng = random.Random(42)
    distinct = min(count, 10_000)
    keys = [rng.randbytes(config.key_bytes) for _ in range(distinct)]
    value = rng.randbytes(config.value_bytes)
    return [(keys[i % distinct], value) for i in range(count)]


def _records_per_batch(config: BenchConfig) -> int:
    """How many records fill `batch_bytes`, as the producer's accumulator would."""
    per_record = config.key_bytes + config.value_bytes + 12     # varints + attributes
    return max(1, (config.batch_bytes - 61) // per_record)


def _chunks(items: Sequence[Any], size: int) -> Iterator[Sequence[Any]]:
    for start in range(0, len(items), size):
        yield items[start:start + size]


def _encoded_batches(config: BenchConfig, pairs: list[tuple[bytes, bytes]]) -> list[bytearray]:
    from logkit.compression import codec_id
    from logkit.records import encode_batch
    codec = codec_id(config.codec_name())
    now = int(time.time() * 1000)
    return [encode_batch([(k, v, None, now) for k, v in chunk], codec=codec, now_ms=now)
            for chunk in _chunks(pairs, _records_per_batch(config))]


def _client_api_present() -> bool:
    try:
        from logkit import consumer  # noqa: F401
        from logkit import producer  # noqa: F401
    except ImportError:
        return False
    return True


def _open_broker(path: str, config: BenchConfig, topic_config: dict | None = None) -> Any:
    from logkit.broker import Broker
    broker = Broker(path, background=False)
    conf = dict(topic_config or {})
    if config.codec_name():
        conf["compression.type"] = "producer"
    broker.create_topic(TOPIC, partitions=config.partitions, config=conf)
    return broker


# ---- SQLite and persist-queue peers -----------------------------------------------------

def _sqlite_open(path: str, synchronous: str) -> sqlite3.Connection:
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute(f"PRAGMA synchronous={synchronous}")
    db.execute("CREATE TABLE IF NOT EXISTS log (offset INTEGER PRIMARY KEY, "
               "partition INTEGER, timestamp INTEGER, key BLOB, value BLOB)")
    return db


def _sqlite_write(db: sqlite3.Connection, pairs: list[tuple[bytes, bytes]],
                  per_batch: int, partitions: int, progress: Progress | None = None) -> None:
    now = int(time.time() * 1000)
    done = 0
    for chunk in _chunks(pairs, per_batch):
        rows = [(done + i, i % partitions, now, k, v) for i, (k, v) in enumerate(chunk)]
        db.execute("BEGIN")
        db.executemany("INSERT INTO log VALUES (?, ?, ?, ?, ?)", rows)
        db.execute("COMMIT")
        done += len(chunk)
        if progress is not None:
            progress.update(done)


def _sqlite_read(db: sqlite3.Connection, count: int, per_poll: int = 500) -> int:
    seen = 0
    offset = 0
    while seen < count:
        rows = db.execute("SELECT offset, timestamp, key, value FROM log WHERE offset >= ? "
                          "ORDER BY offset LIMIT ?", (offset, per_poll)).fetchall()
        if not rows:
            break
        for row in rows:
            row[3]
        seen += len(rows)
        offset = rows[-1][0] + 1
    return seen


def _persist_queue(path: str) -> Any:
    import persistqueue  # type: ignore[import-untyped]
    return persistqueue.SQLiteQueue(path, auto_commit=False)


# ---- codec -------------------------------------------------------------------------------

def bench_codec(config: BenchConfig) -> list[Result]:
    """Encode and decode the same records with logkit (compiled and pure Python) and with
    kafka-python's record batch builder and parser."""
    from logkit import records as rec
    from logkit.compression import codec_id
    count = min(config.records, 1_000_000)
    pairs = _records(config, count)
    per_batch = _records_per_batch(config)
    payload = count * (config.key_bytes + config.value_bytes)
    codec = codec_id(config.codec_name())
    now = int(time.time() * 1000)
    chunks = [[(k, v, None, now) for k, v in chunk] for chunk in _chunks(pairs, per_batch)]
    out: list[Result] = []

    def encode(encoder: Callable) -> Callable[[], None]:
        def run() -> None:
            saved = rec._encode_records
            rec._encode_records = encoder
            try:
                for chunk in chunks:
                    rec.encode_batch(chunk, codec=codec, now_ms=now)
            finally:
                rec._encode_records = saved
        return run

    batches = [rec.encode_batch(chunk, codec=codec, now_ms=now) for chunk in chunks]
    headers = [rec.read_header(b, 0, len(b)) for b in batches]

    def decode(decoder: Callable) -> Callable[[], None]:
        def run() -> None:
            saved = rec._decode_records
            rec._decode_records = decoder
            try:
                for batch, header in zip(batches, headers):
                    for r in rec.decode_batch(batch, 0, header, TOPIC, 0):
                        r.value
            finally:
                rec._decode_records = saved
        return run

    label = "compiled" if rec.SPEEDUPS else "pure Python (no _speedups)"
    out.append(_measure("codec-encode", f"logkit encode_batch ({label})", count, payload,
                        encode(rec._encode_records), headline=True))
    out.append(_measure("codec-encode", "logkit encode_batch (pure Python)", count, payload,
                        encode(rec._encode_records_py)))
    out.append(_measure("codec-decode", f"logkit decode_batch ({label})", count, payload,
                        decode(rec._decode_records), headline=True))
    out.append(_measure("codec-decode", "logkit decode_batch (pure Python)", count, payload,
                        decode(rec._decode_records_py)))
    try:
        from kafka.record.default_records import (DefaultRecordBatch,
                                                  DefaultRecordBatchBuilder)
    except ImportError:
        out.append(Result("codec", "kafka-python", note="not installed (pip install "
                          "logkit[bench])"))
        return out
    kp_codec = {0: 0, 1: 1, 2: 2, 3: 3, 4: 4}[codec]

    def kp_encode() -> None:
        for chunk in chunks:
            builder = DefaultRecordBatchBuilder(2, kp_codec, False, -1, -1, -1, 1 << 30)
            for i, (k, v, _h, ts) in enumerate(chunk):
                builder.append(i, ts, k, v, [])
            builder.build()

    def kp_decode() -> None:
        for batch in batches:
            for r in DefaultRecordBatch(bytes(batch)):
                r.value

    out.append(_measure("codec-encode", "kafka-python DefaultRecordBatchBuilder", count,
                        payload, kp_encode))
    out.append(_measure("codec-decode", "kafka-python DefaultRecordBatch", count, payload,
                        kp_decode))
    return out


# ---- produce -------------------------------------------------------------------------------

def _logkit_append_all(broker: Any, config: BenchConfig, pairs: list[tuple[bytes, bytes]],
                       progress: Progress | None) -> None:
    """The log-level producer: murmur2 partitioning (cached per key), one batch per
    `batch_bytes` per partition, `Partition.append`-style encode + append."""
    from logkit.compression import codec_id
    from logkit.murmur2 import partition_for_key
    from logkit.records import encode_batch
    topic = broker.topic(TOPIC)
    logs = [topic.partition(p)._log for p in range(config.partitions)]
    per_batch = _records_per_batch(config)
    codec = codec_id(config.codec_name())
    cache: dict[bytes, int] = {}
    pending: list[list[tuple]] = [[] for _ in logs]
    parts = config.partitions
    now = int(time.time() * 1000)
    for n, (key, value) in enumerate(pairs):
        p = cache.get(key)
        if p is None:
            p = cache[key] = partition_for_key(key, parts)
        rows = pending[p]
        rows.append((key, value, None, now))
        if len(rows) >= per_batch:
            logs[p].append_batch(encode_batch(rows, codec=codec, now_ms=now))
            pending[p] = []
            if progress is not None and p == 0:
                progress.update(n)
    for p, rows in enumerate(pending):
        if rows:
            logs[p].append_batch(encode_batch(rows, codec=codec, now_ms=now))


def _logkit_producer_send(broker: Any, config: BenchConfig, pairs: list[tuple[bytes, bytes]],
                          progress: Progress | None, **options: Any) -> None:
    producer = broker.producer(batch_size=config.batch_bytes, linger_ms=5,
                               compression_type=config.codec_name(), **options)
    send = producer.send
    step = 100_000
    for start in range(0, len(pairs), step):
        for key, value in pairs[start:start + step]:
            send(TOPIC, value, key=key)
        if progress is not None:
            progress.update(start + step)
    producer.flush()
    producer.close()


def bench_produce(config: BenchConfig, *, durable: bool = False) -> list[Result]:
    """Keyed records into a 3-partition topic: logkit's producer and log-level appends,
    SQLite WAL, persist-queue and os.write of the same bytes."""
    name = "durable" if durable else "produce"
    count = config.durable_records if durable else config.records
    pairs = _records(config, count)
    payload_each = config.key_bytes + config.value_bytes
    topic_config = {"flush.messages": 1} if durable else {}
    per_batch = _records_per_batch(config)
    out: list[Result] = []
    have_producer = _has_producer()
    for level in (("producer", "log") if have_producer else ("log",)):
        path = _workdir(config, name)
        try:
            broker = _open_broker(path, config, topic_config)
            progress = Progress(f"{name} logkit {level}", count, config.progress)
            if level == "producer":
                system = "logkit producer.send (keyed, 3 partitions)"
                fn = lambda: _logkit_producer_send(broker, config, pairs, progress)  # noqa
            else:
                system = "logkit log append (encode_batch + append_batch)"
                fn = lambda: _logkit_append_all(broker, config, pairs, progress)  # noqa
            result = _measure(name, system, count, count * payload_each, fn,
                              headline=level == "producer" or not have_producer)
            progress.done()
            broker.close()
            out.append(result)
        finally:
            shutil.rmtree(path, ignore_errors=True)

    peer_count = min(count, config.peer_records_cap)
    peer_pairs = pairs[:peer_count]
    path = _workdir(config, name)
    try:
        db = _sqlite_open(os.path.join(path, "peer.db"), "FULL" if durable else "NORMAL")
        progress = Progress(f"{name} sqlite", peer_count, config.progress)
        out.append(_measure(name, f"SQLite WAL executemany, txn per batch "
                            f"(synchronous={'FULL' if durable else 'NORMAL'})",
                            peer_count, peer_count * payload_each,
                            lambda: _sqlite_write(db, peer_pairs, per_batch,
                                                  config.partitions, progress)))
        progress.done()
        db.close()

        queue_count = min(peer_count, 20_000 if durable else 100_000)
        try:
            queue = _persist_queue(os.path.join(path, "pq"))
        except ImportError:
            out.append(Result(name, "persist-queue SQLiteQueue",
                              note="not installed (pip install logkit[bench])"))
        else:
            def pq_put() -> None:
                n = 0
                for chunk in _chunks(peer_pairs[:queue_count], per_batch):
                    for pair in chunk:
                        queue.put(pair)
                    queue.task_done()           # commits the batch's puts
                    n += len(chunk)

            out.append(_measure(name, "persist-queue SQLiteQueue, commit per batch",
                                queue_count, queue_count * payload_each, pq_put))

        batches = _encoded_batches(config, peer_pairs)
        fd = os.open(os.path.join(path, "raw.log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND)

        def raw() -> None:
            for batch in batches:
                os.write(fd, batch)
                if durable:
                    os.fsync(fd)

        out.append(_measure(name, "os.write of the same batches" +
                            (" + fsync each" if durable else "") + " (physical limit)",
                            peer_count, peer_count * payload_each, raw))
        os.close(fd)
    finally:
        shutil.rmtree(path, ignore_errors=True)
    if not durable:
        out.append(Result(name, "Kafka 2014, 1 producer thread, no replication "
                          "(historical anchor, not this machine)",
                          records_per_s=KAFKA_2014["produce_records_per_s"],
                          note="anchor"))
    return out


def _has_producer() -> bool:
    try:
        from logkit import producer  # noqa: F401
    except ImportError:
        return False
    return True


def bench_durable(config: BenchConfig) -> list[Result]:
    """Produce with an fsync per appended batch (topic config flush.messages=1)."""
    return bench_produce(config, durable=True)


# ---- consume ---------------------------------------------------------------------------

def bench_consume(config: BenchConfig) -> list[Result]:
    """Read back every record (touching each value): logkit's consumer and log reads,
    SQLite, persist-queue, os.read of the same file, kafka-python's parser."""
    count = config.records
    pairs = _records(config, count)
    payload_each = config.key_bytes + config.value_bytes
    out: list[Result] = []
    path = _workdir(config, "consume")
    try:
        broker = _open_broker(path, config)
        progress = Progress("consume: loading", count, config.progress)
        _logkit_append_all(broker, config, pairs, progress)
        progress.done()
        topic = broker.topic(TOPIC)

        def log_read() -> None:
            seen = 0
            for p in range(config.partitions):
                partition = topic.partition(p)
                offset = 0
                end = partition.high_watermark
                while offset < end:
                    records = partition.read(offset, max_records=500)
                    for r in records:
                        r.value
                    seen += len(records)
                    offset = records[-1].offset + 1
            assert seen == count, (seen, count)

        if _client_api_present():
            def client_poll() -> None:
                consumer = broker.consumer(TOPIC, group_id=None,
                                           auto_offset_reset="earliest",
                                           enable_auto_commit=False)
                seen = 0
                idle = 0
                while seen < count and idle < 50:
                    records = consumer.poll(timeout_ms=100, max_records=500)
                    idle = 0 if records else idle + 1
                    for r in records:
                        r.value
                    seen += len(records)
                consumer.close()
                assert seen == count, (seen, count)

            out.append(_measure("consume", "logkit consumer.poll(max_records=500) + iterate",
                                count, count * payload_each, client_poll, headline=True))
        out.append(_measure("consume", "logkit Partition.read(max_records=500) + iterate",
                            count, count * payload_each, log_read,
                            headline=not _client_api_present()))
        broker.close()

        peer_count = min(count, config.peer_records_cap)
        peer_pairs = pairs[:peer_count]
        db = _sqlite_open(os.path.join(path, "peer.db"), "NORMAL")
        _sqlite_write(db, peer_pairs, _records_per_batch(config), config.partitions)
        out.append(_measure("consume", "SQLite WAL SELECT 500 rows per query + iterate",
                            peer_count, peer_count * payload_each,
                            lambda: _sqlite_read(db, peer_count)))
        db.close()

        queue_count = min(peer_count, 50_000)
        try:
            queue = _persist_queue(os.path.join(path, "pq"))
        except ImportError:
            out.append(Result("consume", "persist-queue SQLiteQueue",
                              note="not installed (pip install logkit[bench])"))
        else:
            for pair in peer_pairs[:queue_count]:
                queue.put(pair)
            queue.task_done()

            def pq_get() -> None:
                per_batch = _records_per_batch(config)
                for start in range(0, queue_count, per_batch):
                    for _ in range(min(per_batch, queue_count - start)):
                        queue.get(block=False)
                    queue.task_done()

            out.append(_measure("consume", "persist-queue SQLiteQueue get, commit per batch",
                                queue_count, queue_count * payload_each, pq_get))

        batches = _encoded_batches(config, peer_pairs)
        raw_path = os.path.join(path, "raw.log")
        with open(raw_path, "wb") as f:
            for batch in batches:
                f.write(batch)

        def raw_read() -> None:
            fd = os.open(raw_path, os.O_RDONLY)
            try:
                while os.read(fd, 1 << 20):
                    pass
            finally:
                os.close(fd)

        out.append(_measure("consume", "os.read of the same batches, 1 MiB reads "
                            "(physical limit)", peer_count, peer_count * payload_each,
                            raw_read))
        try:
            from kafka.record.default_records import DefaultRecordBatch
        except ImportError:
            pass
        else:
            def kp_read() -> None:
                with open(raw_path, "rb") as f:
                    data = f.read()
                pos = 0
                while pos < len(data):
                    length = struct.unpack_from(">i", data, pos + 8)[0] + 12
                    for r in DefaultRecordBatch(data[pos:pos + length]):
                        r.value
                    pos += length

            out.append(_measure("consume", "kafka-python DefaultRecordBatch over the same "
                                "file (codec peer)", peer_count, peer_count * payload_each,
                                kp_read))
    finally:
        shutil.rmtree(path, ignore_errors=True)
    out.append(Result("consume", "Kafka 2014, 1 consumer (historical anchor, not this "
                      "machine)", records_per_s=KAFKA_2014["consume_records_per_s"],
                      note="anchor"))
    return out


# ---- end-to-end latency ----------------------------------------------------------------

_STAMP = struct.Struct(">q")


def _e2e_reader(path: str, count: int, level: str, ready: Any, results: Any) -> None:
    """Child process: poll until `count` records arrived; latency from the send stamp."""
    from logkit.broker import Broker
    samples: list[int] = []
    with Broker(path, background=False) as broker:
        if level == "producer":
            consumer = broker.consumer(TOPIC, group_id=None, auto_offset_reset="latest",
                                       enable_auto_commit=False)
            consumer.poll(timeout_ms=0)
            ready.set()
            deadline = time.monotonic() + 60
            while len(samples) < count and time.monotonic() < deadline:
                for r in consumer.poll(timeout_ms=100, max_records=500):
                    samples.append(time.monotonic_ns() - _STAMP.unpack_from(r.value)[0])
            consumer.close()
        else:
            partition = broker.topic(TOPIC).partition(0)
            doorbell = broker.doorbell
            offset = partition.high_watermark
            ready.set()
            deadline = time.monotonic() + 60
            while len(samples) < count and time.monotonic() < deadline:
                seen = doorbell.value()
                records = partition.read(offset, max_records=500)
                if not records:
                    doorbell.wait(seen, 0.1)
                    continue
                now = time.monotonic_ns()
                for r in records:
                    samples.append(now - _STAMP.unpack_from(r.value)[0])
                offset = records[-1].offset + 1
    results.put(samples)


def _pipe_reader(conn: Any, count: int, ready: Any, results: Any) -> None:
    samples = []
    ready.set()
    for _ in range(count):
        if not conn.poll(60):
            break
        data = conn.recv_bytes()
        samples.append(time.monotonic_ns() - _STAMP.unpack(data)[0])
    results.put(samples)


def _sqlite_reader(path: str, count: int, ready: Any, results: Any) -> None:
    db = sqlite3.connect(path, isolation_level=None)
    samples: list[int] = []
    offset = 0
    ready.set()
    deadline = time.monotonic() + 60
    while len(samples) < count and time.monotonic() < deadline:
        rows = db.execute("SELECT offset, value FROM log WHERE offset >= ?",
                          (offset,)).fetchall()
        if not rows:
            time.sleep(0.0001)                # a 100 µs poll interval
            continue
        now = time.monotonic_ns()
        for row in rows:
            samples.append(now - _STAMP.unpack_from(row[1])[0])
        offset = rows[-1][0] + 1
    results.put(samples)


def _run_pair(target: Callable, args: tuple, send: Callable[[int], None], count: int,
              interval_s: float, progress: Progress) -> list[int]:
    """Start the reader process, wait until it is ready, send `count` stamped records
    spaced by interval_s, collect the reader's latency samples (ns)."""
    ctx = multiprocessing.get_context("spawn")
    ready, results = ctx.Event(), ctx.Queue()
    reader = ctx.Process(target=target, args=(*args, ready, results), daemon=True)
    reader.start()
    try:
        if not ready.wait(30):
            raise RuntimeError("e2e reader did not start within 30 s")
        time.sleep(0.05)
        for i in range(count):
            send(i)
            # sleep, never spin: a spinning sender holds the GIL and would starve the
            # producer's own sender thread for a whole switch interval (5 ms).
            time.sleep(interval_s)
            progress.update(i)
        samples = results.get(timeout=60)
    finally:
        reader.join(10)
        if reader.is_alive():
            reader.terminate()
    progress.done()
    return samples


def bench_e2e(config: BenchConfig) -> list[Result]:
    """Latency from send in this process to poll in another, one record at a time."""
    count = config.e2e_records
    interval_s = config.e2e_interval_us / 1e6
    pad = b"\0" * max(0, config.value_bytes - 8)
    key = b"k" * config.key_bytes
    out: list[Result] = []
    levels = ("producer", "log") if _client_api_present() else ("log",)
    for level in levels:
        path = _workdir(config, "e2e")
        try:
            broker = _open_broker(path, _single_partition(config))
            partition = broker.topic(TOPIC).partition(0)
            if level == "producer":
                producer = broker.producer(linger_ms=0, acks=1)

                def send(i: int) -> None:
                    # A synchronous send per record, as Kafka's EndToEndLatency tool does.
                    producer.send(TOPIC, _STAMP.pack(time.monotonic_ns()) + pad, key=key,
                                  partition=0).result()
            else:
                def send(i: int) -> None:
                    partition.append([(key, _STAMP.pack(time.monotonic_ns()) + pad,
                                       None, None)])
            _reset_peak_rss()
            progress = Progress(f"e2e logkit {level}", count, config.progress)
            samples = _run_pair(_e2e_reader, (path, count, level), send, count, interval_s,
                                progress)
            if level == "producer":
                producer.close()
            broker.close()
            system = ("logkit producer.send -> consumer.poll (2 processes)"
                      if level == "producer" else
                      "logkit Partition.append -> Partition.read + doorbell (2 processes)")
            out.append(Result("e2e", system, len(samples), peak_rss_mb=_peak_rss_mb(),
                              headline=level == levels[0], **_percentiles(samples)))
        finally:
            shutil.rmtree(path, ignore_errors=True)

    receiver, sender = multiprocessing.get_context("spawn").Pipe(duplex=False)
    try:
        progress = Progress("e2e pipe", count, config.progress)
        samples = _run_pair(_pipe_reader, (receiver, count),
                            lambda i: sender.send_bytes(_STAMP.pack(time.monotonic_ns())),
                            count, interval_s, progress)
        out.append(Result("e2e", "OS pipe write -> blocked read (physical limit)",
                          len(samples), **_percentiles(samples)))
    finally:
        receiver.close()
        sender.close()

    path = _workdir(config, "e2e")
    try:
        db_path = os.path.join(path, "peer.db")
        db = _sqlite_open(db_path, "NORMAL")
        progress = Progress("e2e sqlite", count, config.progress)
        samples = _run_pair(
            _sqlite_reader, (db_path, count),
            lambda i: db.execute("INSERT INTO log VALUES (?, 0, 0, ?, ?)",
                                 (i, key, _STAMP.pack(time.monotonic_ns()) + pad)),
            count, interval_s, progress)
        db.close()
        out.append(Result("e2e", "SQLite WAL insert -> SELECT poll every 100 µs "
                          "(2 processes)", len(samples), **_percentiles(samples)))
    finally:
        shutil.rmtree(path, ignore_errors=True)
    out.append(Result("e2e", "Kafka 2014 end-to-end (historical anchor, not this machine)",
                      latency_us_p50=KAFKA_2014["e2e_latency_ms_p50"] * 1000,
                      latency_us_p99=KAFKA_2014["e2e_latency_ms_p99"] * 1000, note="anchor"))
    return out


def _single_partition(config: BenchConfig) -> BenchConfig:
    from dataclasses import replace
    return replace(config, partitions=1)


# ---- open ------------------------------------------------------------------------------

def bench_open(config: BenchConfig) -> list[Result]:
    """Open (cleanly closed) a broker whose topic has `open_partitions` partitions, each
    holding data; median of 7 opens. Peers: SQLite open + first read, os.open of the
    same number of files."""
    from dataclasses import replace
    from logkit.broker import Broker
    parts = config.open_partitions
    repeats = 7
    path = _workdir(config, "open")
    out: list[Result] = []
    try:
        cfg = replace(config, partitions=parts)
        broker = _open_broker(path, cfg)
        _logkit_append_all(broker, cfg, _records(cfg, parts * 200), None)
        broker.close()

        def open_once() -> float:
            started = time.perf_counter()
            broker = Broker(path, background=False)
            topic = broker.topic(TOPIC)
            for p in range(parts):
                topic.partition(p).high_watermark
            seconds = time.perf_counter() - started
            broker.close()
            return seconds

        open_once()                               # warm the page cache and imports
        _reset_peak_rss()
        times = [open_once() for _ in range(repeats)]
        out.append(_open_result(f"logkit Broker() + topic with {parts} partitions (clean)",
                                times, headline=True))

        db_path = os.path.join(path, "peer.db")
        db = _sqlite_open(db_path, "NORMAL")
        _sqlite_write(db, _records(cfg, parts * 200), 200, parts)
        db.close()

        def sqlite_once() -> float:
            started = time.perf_counter()
            db = sqlite3.connect(db_path)
            db.execute("SELECT max(offset) FROM log").fetchone()
            seconds = time.perf_counter() - started
            db.close()
            return seconds

        sqlite_once()
        out.append(_open_result("SQLite WAL connect + first query (one database)",
                                [sqlite_once() for _ in range(repeats)]))
        names = sorted(os.path.join(root, n) for root, _, files in os.walk(path)
                       for n in files if n.endswith((".log", ".index", ".timeindex")))

        def files_once() -> float:
            started = time.perf_counter()
            fds = [os.open(n, os.O_RDONLY) for n in names]
            for fd in fds:
                os.fstat(fd)
            seconds = time.perf_counter() - started
            for fd in fds:
                os.close(fd)
            return seconds

        out.append(_open_result(f"os.open + fstat of the same {len(names)} files "
                                "(physical limit)", [files_once() for _ in range(repeats)]))
    finally:
        shutil.rmtree(path, ignore_errors=True)
    return out


def _open_result(system: str, times: list[float], headline: bool = False) -> Result:
    median = statistics.median(times)
    return Result("open", system, 0, median, peak_rss_mb=_peak_rss_mb(), headline=headline,
                  extra={"open_ms_median": median * 1000, "open_ms_max": max(times) * 1000})


# ---- recover ---------------------------------------------------------------------------

def bench_recover(config: BenchConfig) -> list[Result]:
    """Scan rate of a forced full recovery (`PartitionLog.recover()`: every batch's
    header and CRC checked, indexes rebuilt) over a log of `recover_mb` MB. Peers: the
    bare CRC-32C of the same bytes, kafka-python's CRC check, SQLite's quick_check."""
    from logkit.crc import crc32c
    from logkit.records import read_header
    path = _workdir(config, "recover")
    out: list[Result] = []
    try:
        from logkit.broker import Broker
        from dataclasses import replace
        cfg = replace(config, partitions=1)
        broker = Broker(path, background=False)
        broker.create_topic(TOPIC, partitions=1, config={"segment.bytes": 1 << 30})
        target = config.recover_mb * 1_000_000
        per_batch = _records_per_batch(cfg)
        batch_pairs = _records(cfg, per_batch * 64)
        batches = _encoded_batches(cfg, batch_pairs)
        log = broker.topic(TOPIC).partition(0)._log
        written = 0
        progress = Progress("recover: writing", target, config.progress)
        while written < target:
            for batch in batches:
                log.append_batch(bytearray(batch))
                written += len(batch)
            progress.update(written)
        progress.done()
        _reset_peak_rss()
        report = log.recover()
        rss = _peak_rss_mb()
        records = log.log_end_offset
        out.append(Result("recover", f"logkit PartitionLog.recover() over "
                          f"{report.bytes_checked / 1e6:,.0f} MB", records, report.seconds,
                          records / report.seconds, report.bytes_checked / report.seconds / 1e6,
                          peak_rss_mb=rss, headline=True,
                          extra={"gb_per_s": report.bytes_checked / report.seconds / 1e9,
                                 "segments": report.segments_checked}))
        segment_paths = sorted(os.path.join(log.directory, n)
                               for n in os.listdir(log.directory) if n.endswith(".log"))
        broker.close()

        def crc_only() -> None:
            import mmap
            for seg_path in segment_paths:
                with open(seg_path, "rb") as f:
                    size = os.fstat(f.fileno()).st_size
                    mm = mmap.mmap(f.fileno(), size, access=mmap.ACCESS_READ)
                    view = memoryview(mm)
                    pos = 0
                    while pos < size:
                        header = read_header(mm, pos, size)
                        assert header is not None
                        crc32c(view[pos + 21:pos + header.size])
                        pos += header.size
                    view.release()
                    mm.close()

        total = sum(os.path.getsize(p) for p in segment_paths)
        result = _measure("recover", "read_header + CRC-32C per batch, nothing else "
                          "(physical limit)", records, 0, crc_only)
        result.mb_per_s = total / result.seconds / 1e6
        out.append(result)

        try:
            from kafka.record.default_records import DefaultRecordBatch
        except ImportError:
            pass
        else:
            limit = min(total, 64_000_000)

            def kp_scan() -> None:
                with open(segment_paths[0], "rb") as f:
                    data = f.read(limit)
                pos = 0
                while pos + 61 <= len(data):
                    length = struct.unpack_from(">i", data, pos + 8)[0] + 12
                    if pos + length > len(data):
                        break
                    if not DefaultRecordBatch(data[pos:pos + length]).validate_crc():
                        raise AssertionError("kafka-python rejects a logkit batch")
                    pos += length

            result = _measure("recover", "kafka-python DefaultRecordBatch.validate_crc "
                              f"(first {limit / 1e6:.0f} MB)", 0, 0, kp_scan)
            result.mb_per_s = limit / result.seconds / 1e6
            result.records_per_s = None
            out.append(result)

        db_path = os.path.join(path, "peer.db")
        db = _sqlite_open(db_path, "NORMAL")
        peer_count = min(records, config.peer_records_cap * 5)
        _sqlite_write(db, _records(cfg, peer_count), per_batch, 1)
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        db_bytes = os.path.getsize(db_path)
        result = _measure("recover", f"SQLite PRAGMA quick_check ({db_bytes / 1e6:.0f} MB "
                          "database)", peer_count, 0,
                          lambda: db.execute("PRAGMA quick_check").fetchall())
        result.mb_per_s = db_bytes / result.seconds / 1e6
        result.records_per_s = peer_count / result.seconds
        out.append(result)
        db.close()
    finally:
        shutil.rmtree(path, ignore_errors=True)
    return out


# ---- driver ----------------------------------------------------------------------------

BENCHMARKS: dict[str, Callable[[BenchConfig], list[Result]]] = {
    "codec": bench_codec, "produce": bench_produce, "consume": bench_consume,
    "e2e": bench_e2e, "durable": bench_durable, "open": bench_open,
    "recover": bench_recover,
}


def _add_ratios(results: list[Result]) -> None:
    """ratio = how many times better logkit's headline row is than each peer row."""
    by_bench: dict[str, list[Result]] = {}
    for r in results:
        by_bench.setdefault(r.benchmark, []).append(r)
    for rows in by_bench.values():
        heads = [r for r in rows if r.headline]
        if not heads:
            continue
        head = heads[0]
        for r in rows:
            if r is head:
                continue
            if head.latency_us_p50 and r.latency_us_p50:
                r.ratio = r.latency_us_p50 / head.latency_us_p50
            elif head.benchmark == "open" and r.seconds:
                r.ratio = r.seconds / head.seconds
            elif head.benchmark == "recover" and head.mb_per_s and r.mb_per_s:
                r.ratio = head.mb_per_s / r.mb_per_s
            elif head.records_per_s and r.records_per_s:
                r.ratio = head.records_per_s / r.records_per_s


def run(names: Sequence[str], config: BenchConfig) -> list[Result]:
    """Run the named benchmarks in order; returns every row with ratios filled in."""
    assert 0 < config.records <= MAX_RECORDS, config.records
    results: list[Result] = []
    for name in names:
        if config.progress:
            sys.stderr.write(f"running {name} ...\n")
            sys.stderr.flush()
        results.extend(BENCHMARKS[name](config))
    _add_ratios(results)
    return results


def _fmt(value: float | None, digits: int = 0) -> str:
    if value is None:
        return ""
    return f"{value:,.{digits}f}"


def format_table(results: list[Result], *, markdown: bool = False) -> str:
    """The rows as a table a person reads (plain text, or GitHub markdown)."""
    header = ["benchmark", "system", "records/s", "MB/s", "p50 µs", "p99 µs", "p99.9 µs",
              "max µs", "time", "peak RSS MB", "logkit ×"]
    rows = []
    for r in results:
        if r.benchmark == "open" and r.extra:
            time_cell = f"{r.extra['open_ms_median']:.2f} ms"
        elif r.seconds:
            time_cell = f"{r.seconds:.2f} s"
        else:
            time_cell = ""
        ratio = "(headline)" if r.headline else (f"{r.ratio:.2f}×" if r.ratio else "")
        rows.append([r.benchmark, r.system, _fmt(r.records_per_s), _fmt(r.mb_per_s, 1),
                     _fmt(r.latency_us_p50, 1), _fmt(r.latency_us_p99, 1),
                     _fmt(r.latency_us_p999, 1), _fmt(r.latency_us_max, 1), time_cell,
                     _fmt(r.peak_rss_mb, 0), ratio or r.note])
    if markdown:
        lines = ["| " + " | ".join(header) + " |",
                 "|" + "|".join("---" if i < 2 else "---:" for i in range(len(header))) + "|"]
        lines += ["| " + " | ".join(row) + " |" for row in rows]
        return "\n".join(lines)
    widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(header)]
    widths[1] = min(widths[1], 72)

    def line(cells: list[str]) -> str:
        return "  ".join(c[:w].ljust(w) if i < 2 else c.rjust(w)
                         for i, (c, w) in enumerate(zip(cells, widths)))

    return "\n".join([line(header), line(["-" * w for w in widths])] +
                     [line(row) for row in rows])


def _environment() -> dict[str, Any]:
    import platform
    from logkit import records
    from logkit.crc import IMPLEMENTATION
    return {"python": platform.python_version(), "machine": platform.machine(),
            "cpus": os.cpu_count(), "speedups": records.SPEEDUPS, "crc32c": IMPLEMENTATION,
            "client_api": _client_api_present()}


def build_parser(parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    """The argument parser (shared with `logkit bench`)."""
    if parser is None:
        parser = argparse.ArgumentParser(
            prog="python -m benchmarks",
            description="Benchmark logkit beside its peers in one run.",
            epilog="example: python -m benchmarks all --records 1000000 --json out.json",
            formatter_class=argparse.RawDescriptionHelpFormatter)
    defaults = BenchConfig()
    parser.add_argument("benchmarks", nargs="*", default=["all"],
                        help=f"which to run: all, {', '.join(BENCHMARKS)}")
    parser.add_argument("--records", type=int, default=defaults.records,
                        help="records for codec, produce and consume (default %(default)s)")
    parser.add_argument("--value-size", type=int, default=defaults.value_bytes,
                        help="value bytes (default %(default)s)")
    parser.add_argument("--key-size", type=int, default=defaults.key_bytes,
                        help="key bytes (default %(default)s)")
    parser.add_argument("--partitions", type=int, default=defaults.partitions,
                        help="partitions of the produce/consume topic (default %(default)s)")
    parser.add_argument("--batch-size", type=int, default=defaults.batch_bytes,
                        help="batch bytes, the producer's batch_size (default %(default)s)")
    parser.add_argument("--compression", default=defaults.compression,
                        choices=["none", "gzip", "snappy", "lz4", "zstd"])
    parser.add_argument("--e2e-records", type=int, default=defaults.e2e_records)
    parser.add_argument("--e2e-interval-us", type=int, default=defaults.e2e_interval_us)
    parser.add_argument("--durable-records", type=int, default=defaults.durable_records)
    parser.add_argument("--open-partitions", type=int, default=defaults.open_partitions)
    parser.add_argument("--recover-mb", type=int, default=defaults.recover_mb)
    parser.add_argument("--peer-records", type=int, default=defaults.peer_records_cap,
                        help="cap on records for the slow peers (default %(default)s)")
    parser.add_argument("--dir", default=None, help="where temporary data goes")
    parser.add_argument("--json", metavar="FILE", default=None,
                        help="also write the results as JSON ('-' for stdout only)")
    parser.add_argument("--markdown", action="store_true", help="print a markdown table")
    parser.add_argument("--quiet", action="store_true", help="no progress on stderr")
    return parser


def run_from_args(args: argparse.Namespace) -> int:
    names = list(BENCHMARKS) if "all" in args.benchmarks else args.benchmarks
    unknown = [n for n in names if n not in BENCHMARKS]
    if unknown:
        sys.stderr.write(f"unknown benchmark(s) {unknown}; choose from all, "
                         f"{', '.join(BENCHMARKS)}\n")
        return 2
    config = BenchConfig(records=args.records, value_bytes=args.value_size,
                         key_bytes=args.key_size, partitions=args.partitions,
                         batch_bytes=args.batch_size, compression=args.compression,
                         e2e_records=args.e2e_records, e2e_interval_us=args.e2e_interval_us,
                         durable_records=args.durable_records,
                         open_partitions=args.open_partitions, recover_mb=args.recover_mb,
                         peer_records_cap=args.peer_records, directory=args.dir,
                         progress=not args.quiet)
    results = run(names, config)
    document = {"environment": _environment(), "config": asdict(config),
                "results": [asdict(r) for r in results], "kafka_2014": KAFKA_2014,
                "targets": TARGETS}
    if args.json == "-":
        json.dump(document, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    print(format_table(results, markdown=args.markdown))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(document, f, indent=2)
            f.write("\n")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return run_from_args(build_parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
