"""The end-to-end latency benchmark: one record at a time from a send in this process to a
poll in another, through logkit's producer and consumer (sleeping on the doorbell, and
spinning SPIN_US on it first: `poll_spin_us`) and through `Partition.append` /
`Partition.read` with the doorbell, beside an OS pipe (the floor) and SQLite polled every
100 µs; Kafka's 2014 figure as a labelled anchor.

Every row also carries, in `extra`, what the latency cost: the reader process's CPU
seconds per second of waiting (`resource.getrusage` over its receive loop, user +
system: 1.0 is a whole core) and the sender's own time per send call (p50/p99 µs, the
part of each sample spent before the record was even stored).

Owns: the `e2e` rows and their reader processes (spawned, so each reader is a top-level
function here). Invariant: each record carries its send time (CLOCK_MONOTONIC, one clock
for every process), the sender sleeps between records (never spins), and every wait on
the reader is bounded.
"""

from __future__ import annotations

import multiprocessing
import os
import resource
import sqlite3
import struct
import time
from typing import Any, Callable

from ._common import (KAFKA_2014, TOPIC, BenchConfig, Progress, Result, open_broker,
                      peak_rss_mb, percentiles, reset_peak_rss, scratch)
from ._peers import sqlite_open

_STAMP = struct.Struct(">q")
READY_TIMEOUT_S = 30
READ_TIMEOUT_S = 60
SQLITE_POLL_S = 0.0001
SPIN_US = 500           # the spinning row's poll_spin_us: above the 200 µs spacing


def run(config: BenchConfig) -> list[Result]:
    from dataclasses import replace
    count = config.e2e_records
    interval_s = config.e2e_interval_us / 1e6
    pad = b"\0" * max(0, config.value_bytes - 8)
    key = b"k" * config.key_bytes
    out: list[Result] = []
    for level, spin_us in (("producer", 0), ("producer", SPIN_US), ("log", 0)):
        with scratch(config, "e2e") as path:
            broker = open_broker(path, replace(config, partitions=1))
            partition = broker.topic(TOPIC).partition(0)
            producer = broker.producer(linger_ms=0, acks=1) if level == "producer" else None

            def send(i: int) -> None:
                stamped = _STAMP.pack(time.monotonic_ns()) + pad
                if producer is not None:
                    # A synchronous send per record, as Kafka's EndToEndLatency tool does.
                    producer.send(TOPIC, stamped, key=key, partition=0).result()
                else:
                    partition.append([(key, stamped, None, None)])

            reset_peak_rss()
            progress = Progress(f"e2e logkit {level}", count, config.progress)
            samples, extra = _run_pair(_logkit_reader, (path, count, level, spin_us), send,
                                       count, interval_s, progress)
            if producer is not None:
                producer.close()
            broker.close()
            if level == "log":
                system = "logkit Partition.append -> Partition.read + doorbell (2 processes)"
            elif spin_us:
                system = (f"logkit producer.send -> consumer.poll, poll_spin_us={spin_us} "
                          "(2 processes)")
            else:
                system = "logkit producer.send -> consumer.poll (2 processes)"
            out.append(Result("e2e", system, len(samples), peak_rss_mb=peak_rss_mb(),
                              headline=level == "producer" and not spin_us,
                              extra={**extra, "poll_spin_us": spin_us},
                              **percentiles(samples)))

    receiver, sender = multiprocessing.get_context("spawn").Pipe(duplex=False)
    try:
        progress = Progress("e2e pipe", count, config.progress)
        samples, extra = _run_pair(
            _pipe_reader, (receiver, count),
            lambda i: sender.send_bytes(_STAMP.pack(time.monotonic_ns())), count,
            interval_s, progress)
        out.append(Result("e2e", "OS pipe write -> blocked read (physical limit)",
                          len(samples), extra=extra, **percentiles(samples)))
    finally:
        receiver.close()
        sender.close()

    with scratch(config, "e2e") as path:
        db_path = os.path.join(path, "peer.db")
        db = sqlite_open(db_path, "NORMAL")
        progress = Progress("e2e sqlite", count, config.progress)
        samples, extra = _run_pair(
            _sqlite_reader, (db_path, count),
            lambda i: db.execute("INSERT INTO log VALUES (?, 0, 0, ?, ?)",
                                 (i, key, _STAMP.pack(time.monotonic_ns()) + pad)),
            count, interval_s, progress)
        db.close()
        out.append(Result("e2e", "SQLite WAL insert -> SELECT poll every 100 µs "
                          "(2 processes)", len(samples), extra=extra,
                          **percentiles(samples)))
    out.append(Result("e2e", "Kafka 2014 end-to-end (historical anchor, not this machine)",
                      latency_us_p50=KAFKA_2014["e2e_latency_ms_p50"] * 1000,
                      latency_us_p99=KAFKA_2014["e2e_latency_ms_p99"] * 1000, note="anchor"))
    return out


def _run_pair(target: Callable, args: tuple, send: Callable[[int], None], count: int,
              interval_s: float, progress: Progress) -> tuple[list[int], dict[str, float]]:
    """Start the reader process, wait until it is ready, send `count` stamped records
    spaced by interval_s; the reader's latency samples (ns) and the row's `extra`: the
    reader's CPU seconds per second of its receive loop and the send call's own
    p50/p99 (µs)."""
    ctx = multiprocessing.get_context("spawn")
    ready, results = ctx.Event(), ctx.Queue()
    reader = ctx.Process(target=target, args=(*args, ready, results), daemon=True)
    reader.start()
    try:
        if not ready.wait(READY_TIMEOUT_S):
            raise RuntimeError(f"e2e reader did not start within {READY_TIMEOUT_S} s")
        time.sleep(0.05)
        sends: list[int] = []
        for i in range(count):
            started = time.perf_counter_ns()
            send(i)
            sends.append(time.perf_counter_ns() - started)
            # sleep, never spin: a spinning sender holds the GIL and would starve the
            # producer's own sender thread for a whole switch interval (5 ms).
            time.sleep(interval_s)
            progress.update(i)
        samples, cpu_s, wall_s = results.get(timeout=READ_TIMEOUT_S)
    finally:
        reader.join(10)
        if reader.is_alive():
            reader.terminate()
    progress.done()
    sends.sort()
    return samples, {"reader_cpu_s_per_s": round(cpu_s / max(wall_s, 1e-9), 3),
                     "send_call_us_p50": sends[len(sends) // 2] / 1000,
                     "send_call_us_p99": sends[min(len(sends) - 1,
                                                   int(0.99 * len(sends)))] / 1000}


def _cpu_s() -> float:
    """This process's CPU time so far (user + system), from getrusage."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


# ---- readers (each runs in its own spawned process) ------------------------------------

def _logkit_reader(path: str, count: int, level: str, spin_us: int, ready: Any,
                   results: Any) -> None:
    """Poll until `count` records arrived; latency from each record's send stamp."""
    from logkit import Broker
    samples: list[int] = []
    with Broker(path, background=False) as broker:
        deadline = time.monotonic() + READ_TIMEOUT_S
        if level == "producer":
            consumer = broker.consumer(TOPIC, group_id=None, auto_offset_reset="latest",
                                       enable_auto_commit=False, poll_spin_us=spin_us)
            consumer.poll(timeout_ms=0)          # resolve the position before "ready"
            ready.set()
            cpu0, wall0 = _cpu_s(), time.monotonic()
            while len(samples) < count and time.monotonic() < deadline:
                for r in consumer.poll(timeout_ms=100, max_records=500):
                    samples.append(time.monotonic_ns() - _STAMP.unpack_from(r.value)[0])
            consumer.close()
        else:
            partition = broker.topic(TOPIC).partition(0)
            doorbell = broker.doorbell
            offset = partition.high_watermark
            ready.set()
            cpu0, wall0 = _cpu_s(), time.monotonic()
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
        cpu_s, wall_s = _cpu_s() - cpu0, time.monotonic() - wall0
    results.put((samples, cpu_s, wall_s))


def _pipe_reader(conn: Any, count: int, ready: Any, results: Any) -> None:
    samples = []
    ready.set()
    cpu0, wall0 = _cpu_s(), time.monotonic()
    for _ in range(count):
        if not conn.poll(READ_TIMEOUT_S):
            break
        data = conn.recv_bytes()
        samples.append(time.monotonic_ns() - _STAMP.unpack(data)[0])
    results.put((samples, _cpu_s() - cpu0, time.monotonic() - wall0))


def _sqlite_reader(path: str, count: int, ready: Any, results: Any) -> None:
    db = sqlite3.connect(path, isolation_level=None)
    samples: list[int] = []
    offset = 0
    ready.set()
    cpu0, wall0 = _cpu_s(), time.monotonic()
    deadline = time.monotonic() + READ_TIMEOUT_S
    while len(samples) < count and time.monotonic() < deadline:
        rows = db.execute("SELECT offset, value FROM log WHERE offset >= ?",
                          (offset,)).fetchall()
        if not rows:
            time.sleep(SQLITE_POLL_S)
            continue
        now = time.monotonic_ns()
        for row in rows:
            samples.append(now - _STAMP.unpack_from(row[1])[0])
        offset = rows[-1][0] + 1
    results.put((samples, _cpu_s() - cpu0, time.monotonic() - wall0))
