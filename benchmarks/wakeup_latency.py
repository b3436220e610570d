"""Blocking-poll wake-up latency across processes, beside peers measured in the same run.

A writer process sends one small record every `--interval-us`; a reader process is
blocked in a wait and reports, per record, the time from just before the send to the
moment its wait returned it (CLOCK_MONOTONIC is one clock for every process). The
spacing is long enough that the reader is asleep when each record arrives, so this
measures the wake-up path, not throughput. It also reports the reader's CPU use while
waiting: a spin loop would have low latency and burn a core.

Systems:
  logkit   producer.send(...).result() -> consumer.poll(timeout_ms=1000) (futex doorbell)
  mp.Queue multiprocessing.Queue.put -> blocking get (a pipe plus a feeder thread)
  pipe     Connection.send_bytes -> blocking recv_bytes on an OS pipe (kernel floor)
  SQLite   WAL insert + commit -> a reader polling SELECT every 100 µs

Run from the checkout's root (one module of the `benchmarks` package, with its own
command line and JSON):
    .venv/bin/python -m benchmarks.wakeup_latency [--records 3000] [--json FILE]
(the committed figures are benchmarks/wakeup_latency.json).
Target (docs/benchmarks.md, Targets; issue 3): logkit wake-up p99 <= 1 ms.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import shutil
import sqlite3
import tempfile
import time
from typing import Any, Callable

import logkit

READY_TIMEOUT_S = 60
SQLITE_POLL_S = 0.0001


def _now_ns() -> int:
    return time.monotonic_ns()


def _stamp() -> bytes:
    return b"%d" % _now_ns()


def _finish(samples: list[int], cpu_s: float, wall_s: float, out: Any) -> None:
    out.put({"samples_ns": samples, "cpu_s": cpu_s, "wall_s": wall_s})


# ---- readers (each runs in its own spawned process) -------------------------------------

def _logkit_reader(root: str, count: int, ready: Any, out: Any) -> None:
    with logkit.Broker(root, background=False) as broker:
        consumer = broker.consumer("wake", auto_offset_reset="latest",
                                   enable_auto_commit=False)
        consumer.poll(timeout_ms=0)              # resolve the position before "ready"
        ready.set()
        samples: list[int] = []
        cpu0, wall0 = time.process_time(), time.monotonic()
        while len(samples) < count:
            for record in consumer.poll(timeout_ms=1000):
                samples.append(_now_ns() - int(record.value))
        _finish(samples, time.process_time() - cpu0, time.monotonic() - wall0, out)


def _queue_reader(queue: Any, count: int, ready: Any, out: Any) -> None:
    ready.set()
    samples: list[int] = []
    cpu0, wall0 = time.process_time(), time.monotonic()
    while len(samples) < count:
        stamp = int(queue.get(timeout=10))
        samples.append(_now_ns() - stamp)
    _finish(samples, time.process_time() - cpu0, time.monotonic() - wall0, out)


def _pipe_reader(conn: Any, count: int, ready: Any, out: Any) -> None:
    ready.set()
    samples: list[int] = []
    cpu0, wall0 = time.process_time(), time.monotonic()
    while len(samples) < count:
        stamp = int(conn.recv_bytes())
        samples.append(_now_ns() - stamp)
    _finish(samples, time.process_time() - cpu0, time.monotonic() - wall0, out)


def _sqlite_reader(path: str, count: int, ready: Any, out: Any) -> None:
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    last = db.execute("SELECT coalesce(max(id), 0) FROM q").fetchone()[0]
    ready.set()
    samples: list[int] = []
    cpu0, wall0 = time.process_time(), time.monotonic()
    while len(samples) < count:
        rows = db.execute("SELECT id, stamp FROM q WHERE id > ? ORDER BY id", (last,)).fetchall()
        if not rows:
            time.sleep(SQLITE_POLL_S)
            continue
        now = _now_ns()
        for row_id, stamp in rows:
            samples.append(now - int(stamp))
            last = row_id
    _finish(samples, time.process_time() - cpu0, time.monotonic() - wall0, out)


# ---- the driver -----------------------------------------------------------------------

def _run(ctx: Any, target: Callable, args: tuple, send: Callable[[], None], count: int,
         interval_s: float) -> dict[str, Any]:
    ready, out = ctx.Event(), ctx.Queue()
    reader = ctx.Process(target=target, args=args + (count, ready, out), daemon=True)
    reader.start()
    if not ready.wait(READY_TIMEOUT_S):
        raise RuntimeError("reader did not start")
    time.sleep(0.2)                                # let it block in its wait
    next_at = time.monotonic()
    for _ in range(count):
        next_at += interval_s
        while time.monotonic() < next_at:          # pace without sleeping past the slot
            remaining = next_at - time.monotonic()
            if remaining > 0.0005:
                time.sleep(remaining - 0.0003)
        send()
    result = out.get(timeout=READY_TIMEOUT_S)
    reader.join(timeout=30)
    return result


def _summary(system: str, result: dict[str, Any]) -> dict[str, Any]:
    samples = sorted(result["samples_ns"])

    def pick(q: float) -> float:
        return samples[min(len(samples) - 1, int(q * len(samples)))] / 1000

    return {"system": system, "records": len(samples), "p50_us": pick(0.50),
            "p99_us": pick(0.99), "p999_us": pick(0.999), "max_us": samples[-1] / 1000,
            "reader_cpu_pct": 100 * result["cpu_s"] / max(result["wall_s"], 1e-9)}


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=int, default=3000)
    parser.add_argument("--interval-us", type=int, default=1000)
    parser.add_argument("--json", metavar="FILE")
    args = parser.parse_args(argv)
    ctx = mp.get_context("spawn")                 # LMDB must not cross a fork
    interval_s = args.interval_us / 1e6
    rows = []
    work = tempfile.mkdtemp(prefix="logkit-wakeup-")
    try:
        root = os.path.join(work, "logkit")
        with logkit.Broker(root, background=False) as broker:
            broker.create_topic("wake", 1)
            producer = broker.producer(acks=1, linger_ms=0)
            rows.append(_summary(
                "logkit producer.send().result() -> consumer.poll (futex doorbell)",
                _run(ctx, _logkit_reader, (root,), lambda: producer.send(
                    "wake", _stamp(), partition=0).result(), args.records, interval_s)))
            producer.close()
            partition = broker.topic("wake").partition(0)
            rows.append(_summary(
                "logkit Partition.append -> consumer.poll (no producer thread)",
                _run(ctx, _logkit_reader, (root,), lambda: partition.append(
                    [(None, _stamp(), None, None)]), args.records, interval_s)))

        queue = ctx.Queue()
        rows.append(_summary("multiprocessing.Queue put -> blocking get", _run(
            ctx, _queue_reader, (queue,), lambda: queue.put(_stamp()), args.records,
            interval_s)))

        receiver, sender = ctx.Pipe(duplex=False)
        rows.append(_summary("OS pipe write -> blocking read (kernel floor)", _run(
            ctx, _pipe_reader, (receiver,), lambda: sender.send_bytes(_stamp()),
            args.records, interval_s)))
        receiver.close()
        sender.close()

        path = os.path.join(work, "peer.db")
        db = sqlite3.connect(path, isolation_level=None)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("CREATE TABLE q (id INTEGER PRIMARY KEY, stamp TEXT)")
        rows.append(_summary(f"SQLite WAL insert -> SELECT poll every "
                             f"{SQLITE_POLL_S * 1e6:.0f} µs", _run(
                                 ctx, _sqlite_reader, (path,),
                                 lambda: db.execute("INSERT INTO q (stamp) VALUES (?)",
                                                    (_stamp().decode(),)),
                                 args.records, interval_s)))
        db.close()
    finally:
        shutil.rmtree(work, ignore_errors=True)

    head = rows[0]
    print(f"wake-up latency, {args.records} records spaced {args.interval_us} µs, "
          f"one writer process -> one blocked reader process")
    print(f"{'system':<66} {'p50 µs':>8} {'p99 µs':>8} {'p99.9 µs':>9} {'max µs':>8} "
          f"{'reader CPU':>10} {'p99 vs logkit':>13}")
    for row in rows:
        ratio = row["p99_us"] / head["p99_us"]
        print(f"{row['system']:<66} {row['p50_us']:>8.1f} {row['p99_us']:>8.1f} "
              f"{row['p999_us']:>9.1f} {row['max_us']:>8.1f} {row['reader_cpu_pct']:>9.1f}% "
              f"{ratio:>12.2f}x")
    print(f"target: logkit p99 <= 1000 µs -> {'met' if head['p99_us'] <= 1000 else 'NOT met'}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"records": args.records, "interval_us": args.interval_us,
                       "results": rows}, f, indent=2)
            f.write("\n")
    return rows


if __name__ == "__main__":
    main()
