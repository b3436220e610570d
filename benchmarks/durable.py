"""The durable benchmark: the produce benchmark with an fsync behind every appended batch
(topic config flush.messages=1), beside SQLite with synchronous=FULL, persist-queue and
`os.write` + `fsync` of the same batches (the disk's limit); then the durable matrix
(issue 16, goal 3).

The matrix: one benchmark per case — `durable-1p`, `durable-3p` (one thread calling
`producer.send`), `durable-1p-4threads`, `durable-3p-4threads` (four threads sharing one
producer) and `durable-1p-2procs` (two processes, a producer each, one partition). Each
case's headline is the producer; its peers, measured right after it on the same
records, are the log-level append (`encode_batch` + `append_batch`, full batches, with
as many threads or processes as the producer had) and the physical floor: `os.write` +
`fsync`, and `os.write` + `fdatasync`, of the same batches, one after the other, into
one file per partition. So `logkit x` of the floor rows is the goal's ratio. A disk's
fsync time swings with the machine's other I/O, so each round runs all four systems one
after the other, each row is its system's median round, and the producer row's `extra`
also holds the median of the per-round ratios to each floor (`vs_fsync`,
`vs_fdatasync`), the steadier figure. Every
logkit row carries the batches the log stored and the fsyncs it cost (`extra`), read
back from the log: group commit shows as fewer device flushes than batches.

Owns: the `durable` rows and the `durable-*` matrix; the single-thread measurement is
`produce.produce_rows`, so the produce and durable benchmarks cannot drift apart.
Invariant: every system writes the same records, each into its own scratch directory.
"""

from __future__ import annotations

import multiprocessing
import os
import statistics
import threading
import time
from dataclasses import replace
from typing import Any, Callable

from ._common import (TOPIC, BenchConfig, Result, append_all, chunks, encoded_batches,
                      make_records, measure, open_broker, peak_rss_mb, scratch)
from .produce import BENCH_LINGER_MS, batch_stats, produce_rows

DURABLE_CONFIG = {"flush.messages": 1}
ROUNDS = 3                  # rounds per matrix case; each row is its median round
# (name, partitions, threads, processes)
MATRIX = [("durable-1p", 1, 1, 1), ("durable-3p", 3, 1, 1),
          ("durable-1p-4threads", 1, 4, 1), ("durable-3p-4threads", 3, 4, 1),
          ("durable-1p-2procs", 1, 1, 2)]


def run(config: BenchConfig) -> list[Result]:
    return produce_rows(config, durable=True) + matrix_rows(config)


def matrix_rows(config: BenchConfig) -> list[Result]:
    pairs = make_records(config, config.durable_records)
    out: list[Result] = []
    for name, parts, threads, procs in MATRIX:
        out += _case(config, pairs, name, parts, threads, procs)
    return out


def _case(config: BenchConfig, pairs: list[tuple[bytes, bytes]], name: str, parts: int,
          threads: int, procs: int) -> list[Result]:
    count = len(pairs)
    payload = count * (config.key_bytes + config.value_bytes)
    case_config = replace(config, partitions=parts, progress=False)
    workers = threads * procs
    how = (f"{parts} partition{'s' * (parts > 1)}, "
           + (f"{threads} threads" if threads > 1 else
              f"{procs} processes" if procs > 1 else "1 thread"))
    batches = encoded_batches(config, pairs)
    rounds: dict[str, list[Result]] = {}
    for _ in range(ROUNDS):
        for level in ("producer", "log"):
            with scratch(config, name) as path:
                if procs > 1:
                    open_broker(path, case_config, DURABLE_CONFIG).close()
                    seconds, rss = _in_processes(path, case_config, pairs, procs, level)
                    row = Result(name, "", count, seconds, count / seconds,
                                 payload / seconds / 1e6, peak_rss_mb=rss)
                    broker = _open(path)
                else:
                    broker = open_broker(path, case_config, DURABLE_CONFIG)
                    row = measure(name, "", count, payload,
                                  lambda: _in_threads(broker, case_config, pairs, threads,
                                                      level))
                row.system = (f"logkit producer.send, flush.messages=1 ({how})"
                              if level == "producer" else
                              f"logkit log append, flush.messages=1 ({how})")
                row.headline = level == "producer"
                row.extra = batch_stats(broker, parts)
                if procs == 1:
                    row.extra["fsyncs_saved"] = _fsyncs_saved(broker, parts,
                                                              row.extra["batches"])
                broker.close()
            rounds.setdefault(level, []).append(row)
        for sync in (os.fsync, os.fdatasync):
            key = sync.__name__
            with scratch(config, name) as path:
                row = measure(name, f"os.write + {key} of the same batches, one file per "
                              f"partition (physical limit)", count, payload,
                              lambda: _raw(path, batches, parts, sync))
            rounds.setdefault(key, []).append(row)
    out = []
    for rows in rounds.values():
        row = sorted(rows, key=lambda r: r.seconds)[len(rows) // 2]
        row.extra["rounds"] = ROUNDS
        row.extra["writers"] = workers
        out.append(row)
    for floor in ("fsync", "fdatasync"):
        out[0].extra[f"vs_{floor}"] = statistics.median(
            f.seconds / p.seconds for p, f in zip(rounds["producer"], rounds[floor]))
    return out


def _open(path: str) -> Any:
    from logkit import Broker
    return Broker(path, background=False)


def _raw(path: str, batches: list[bytearray], parts: int,
         sync: Callable[[int], None]) -> None:
    fds = [os.open(os.path.join(path, f"raw-{p}.log"),
                   os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600) for p in range(parts)]
    try:
        for n, batch in enumerate(batches):
            fd = fds[n % parts]
            os.write(fd, batch)
            sync(fd)
    finally:
        for fd in fds:
            os.close(fd)


def _in_threads(broker: Any, config: BenchConfig, pairs: list[tuple[bytes, bytes]],
                threads: int, level: str) -> None:
    """`threads` threads share one producer (or append at the log level), each sending
    its slice of the records."""
    if level == "log":
        work = [lambda s=s: append_all(broker, config, s, None)
                for s in _slices(pairs, threads)]
    else:
        producer = broker.producer(batch_size=config.batch_bytes,
                                   linger_ms=BENCH_LINGER_MS)
        work = [lambda s=s: _send(producer, s) for s in _slices(pairs, threads)]
    if threads == 1:
        work[0]()
    else:
        running = [threading.Thread(target=w) for w in work]
        for t in running:
            t.start()
        for t in running:
            t.join()
    if level == "producer":
        producer.flush()
        producer.close()


def _send(producer: Any, pairs: list[tuple[bytes, bytes]]) -> None:
    send = producer.send
    for key, value in pairs:
        send(TOPIC, value, key=key)
    producer.flush()


def _slices(pairs: list, n: int) -> list[list]:
    size = -(-len(pairs) // n)
    return [list(c) for c in chunks(pairs, size)]


def _in_processes(path: str, config: BenchConfig, pairs: list[tuple[bytes, bytes]],
                  procs: int, level: str) -> tuple[float, float | None]:
    """`procs` processes, each with its own broker, send their slices at once; seconds
    from the start signal until the last one is done, and the largest peak RSS (MB) of
    the writer processes."""
    ctx = multiprocessing.get_context("spawn")
    ready, go, peaks = ctx.Barrier(procs + 1), ctx.Event(), ctx.Queue()
    slices = _slices(pairs, procs)
    running = [ctx.Process(target=_process_main,
                           args=(path, config, slices[i], level, ready, go, peaks))
               for i in range(procs)]
    for p in running:
        p.start()
    ready.wait()
    started = time.perf_counter()
    go.set()
    rss = [peaks.get(timeout=600) for _ in running]   # before join (a full pipe blocks it)
    seconds = time.perf_counter() - started
    for p in running:
        p.join()
    bad = [p.exitcode for p in running if p.exitcode != 0]
    if bad:
        raise RuntimeError(f"a writer process failed: exit codes {bad}")
    return seconds, max((r for r in rss if r is not None), default=None)


def _process_main(path: str, config: BenchConfig, pairs: list[tuple[bytes, bytes]],
                  level: str, ready: Any, go: Any, peaks: Any) -> None:
    broker = _open(path)
    broker.topic(TOPIC).partition(0)          # opened before the clock starts
    ready.wait()
    go.wait()
    try:
        _in_threads(broker, config, pairs, 1, level)
        broker.close()
    finally:
        peaks.put(peak_rss_mb())


def _fsyncs_saved(broker: Any, parts: int, batches: int) -> int | None:
    """Batches that shared a device flush with another, when the log counts its flushes
    (`PartitionLog.sync_count`, this process only); None when it does not."""
    topic = broker.topic(TOPIC)
    counts = [getattr(topic.partition(p)._log, "sync_count", None) for p in range(parts)]
    if any(c is None for c in counts):
        return None
    return batches - sum(counts)
