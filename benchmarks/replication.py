"""Replication: produce throughput with and without a follower, and replication lag.

Throughput: one producer (default batching) writes `--records` 100-byte records to a
3-partition topic at acks=1 and at acks="all", with no follower and with one and two
`logkit.Follower`s copying through a `DirectorySource`, each in its own process (the
topic's replication factor is 1 + followers, so acks="all" waits for the high watermark
to pass each batch), alternating `--repeats` times, each repeat starting at another row
(medians; the same machine's noise hits every row). Reported: the producer's rate, the ratio to the unreplicated acks=1
rate in the same run, and the time until the followers held everything (read from the
progress files they report to the leader).

acks="all" latency: with one follower in the ISR, `send(...).result()` one record at a
time: the append, the follower's wake-up, fetch and append, its progress report (a file
and the leader's doorbell) and the producer's acks waiter working out the high watermark.

Lag: a producer sends one record every `--interval-us` and waits for its ack; a
consumer process blocked on the follower's directory reports, per record, the time
from just before the send to its poll returning the copy (CLOCK_MONOTONIC is one clock
for every process). That is leader append + the follower's wake-up (the leader's
doorbell), fetch, CRC check and append + the reader's wake-up (the copy's doorbell).

The throughput and lag runs are repeated with the follower copying through a
`TcpSource` against the leader's `broker.serve_replication()` (127.0.0.1), in the same
run as the directory figures.

Not measured here: the object-store source and failover time.

Run from the checkout's root:
    .venv/bin/python -m benchmarks.replication [--records 200000] [--lag-records 2000]
        [--json FILE]
(the committed figures are benchmarks/replication.json and docs/replication.md).
Targets (docs/benchmarks.md, Targets; issue 10): one follower >= 0.7x the unreplicated produce rate;
replication lag p99 <= 5 ms.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import shutil
import statistics
import tempfile
import time
from typing import Any

import logkit

READY_TIMEOUT_S = 60
TOPIC = "bench"
SECRET = "benchmark secret"          # the TCP rows: broker.serve_replication(secret=)


def _now_ns() -> int:
    return time.monotonic_ns()


# ---- processes (spawned: LMDB must not cross a fork) -----------------------------------

def _follower_proc(leader: str, copy: str, ready: Any, stop: Any,
                   tcp_port: int | None = None) -> None:
    source = (logkit.DirectorySource(leader) if tcp_port is None else
              logkit.TcpSource("127.0.0.1", tcp_port, secret=SECRET))
    follower = logkit.Follower(copy, source)
    follower.start()
    follower.catch_up(timeout=READY_TIMEOUT_S)
    ready.set()
    stop.wait()
    follower.stop()


def _lag_reader(copy: str, count: int, ready: Any, out: Any) -> None:
    with logkit.Broker(copy, background=False) as broker:
        consumer = broker.consumer(TOPIC, auto_offset_reset="latest",
                                   enable_auto_commit=False)
        consumer.poll(timeout_ms=0)
        ready.set()
        samples: list[int] = []
        while len(samples) < count:
            for record in consumer.poll(timeout_ms=1000):
                samples.append(_now_ns() - int(record.value))
        out.put(samples)


class _FollowerProcess:
    def __init__(self, ctx: Any, leader: str, copy: str, tcp_port: int | None = None
                 ) -> None:
        self.ready, self.stop_event = ctx.Event(), ctx.Event()
        self.proc = ctx.Process(target=_follower_proc,
                                args=(leader, copy, self.ready, self.stop_event, tcp_port),
                                daemon=True)
        self.proc.start()
        if not self.ready.wait(READY_TIMEOUT_S):
            raise RuntimeError("the follower did not start")

    def stop(self) -> None:
        self.stop_event.set()
        self.proc.join(timeout=30)


# ---- throughput ------------------------------------------------------------------------

def _produce(broker: Any, records: int, value: bytes, acks: Any = 1) -> float:
    producer = broker.producer(acks=acks)
    keys = [b"key-%06d" % (i % 10000) for i in range(10000)]
    started = time.perf_counter()
    for i in range(records):
        producer.send(TOPIC, value, key=keys[i % 10000])
    producer.flush()
    seconds = time.perf_counter() - started
    producer.close()
    return seconds


def _caught_up_s(leader: str, broker: Any, started: float, limit_s: float,
                 followers: int = 1) -> float:
    """Seconds from `started` until `followers` followers' reported ends equal the
    leader's."""
    source = logkit.DirectorySource(leader)
    want = {f"{TOPIC}-{p.partition}": p.log_end_offset
            for p in broker.topic(TOPIC).partitions}
    deadline = time.perf_counter() + limit_s
    while time.perf_counter() < deadline:
        done = sum(all(body["log_end_offsets"].get(k, -1) >= v for k, v in want.items())
                   for body in source.progress().values())
        if done >= followers:
            return time.perf_counter() - started
        time.sleep(0.005)
    raise RuntimeError("the followers did not catch up")


def _all_in_sync(broker: Any, followers: int, limit_s: float) -> None:
    """Wait until every partition's ISR holds the leader and `followers` followers."""
    deadline = time.perf_counter() + limit_s
    for p in broker.topic(TOPIC).partitions:
        while len(p.in_sync_replicas()) < 1 + followers:
            if time.perf_counter() > deadline:
                raise RuntimeError("the followers did not join the ISR")
            time.sleep(0.01)


def _throughput_round(ctx: Any, work: str, records: int, followers: int, acks: Any,
                      tcp: bool = False) -> dict[str, float]:
    leader_path = tempfile.mkdtemp(dir=work)
    copies = [tempfile.mkdtemp(dir=work) for _ in range(followers)]
    value = os.urandom(100)
    with logkit.Broker(leader_path, background=False) as broker:
        broker.create_topic(TOPIC, 3, replication_factor=1 + followers)
        port = broker.serve_replication(secret=SECRET).port if tcp else None
        procs = [_FollowerProcess(ctx, leader_path, copy, port) for copy in copies]
        try:
            if followers:
                _all_in_sync(broker, followers, READY_TIMEOUT_S)
            started = time.perf_counter()
            seconds = _produce(broker, records, value, acks)
            out = {"produce_s": seconds}
            if procs:
                out["replicated_s"] = _caught_up_s(leader_path, broker, started, 120,
                                                   followers)
        finally:
            for proc in procs:
                proc.stop()
    shutil.rmtree(leader_path, ignore_errors=True)
    for copy in copies:
        shutil.rmtree(copy, ignore_errors=True)
    return out


# (followers, acks, over TCP) -> the row's label
KINDS = {
    (0, 1, False): "acks=1, no follower",
    (1, 1, False): "acks=1, one follower (DirectorySource, own process)",
    (2, 1, False): "acks=1, two followers (DirectorySource, own processes)",
    (0, "all", False): "acks=all, no follower (replication factor 1)",
    (1, "all", False): "acks=all, one follower in the ISR (DirectorySource)",
    (2, "all", False): "acks=all, two followers in the ISR (DirectorySource)",
    (1, 1, True): "acks=1, one follower (TcpSource, own process)",
}


def throughput(ctx: Any, work: str, records: int, repeats: int) -> list[dict[str, Any]]:
    runs: dict[tuple, list[dict[str, float]]] = {k: [] for k in KINDS}
    _throughput_round(ctx, work, min(records, 20000), 1, "all")        # warm-up
    kinds = list(KINDS)
    for repeat in range(repeats):
        # each repeat starts at another kind: no row always follows the same one
        shift = repeat * len(kinds) // max(1, repeats)
        for kind in kinds[shift:] + kinds[:shift]:
            runs[kind].append(_throughput_round(ctx, work, records, *kind))
    base = statistics.median(r["produce_s"] for r in runs[(0, 1, False)])
    base_all = statistics.median(r["produce_s"] for r in runs[(0, "all", False)])
    rows = []
    for kind, label in KINDS.items():
        followers, acks = kind[0], kind[1]
        produce_s = statistics.median(r["produce_s"] for r in runs[kind])
        row = {"system": label, "followers": followers, "acks": acks, "records": records,
               "records_per_s": records / produce_s,
               "ratio_to_unreplicated": base / produce_s,
               "ratio_to_unreplicated_same_acks": (base if acks == 1 else base_all)
               / produce_s}
        if followers:
            replicated = statistics.median(r["replicated_s"] for r in runs[kind])
            row["replicated_records_per_s"] = records / replicated
            row["follower_done_after_s"] = replicated
        rows.append(row)
    return rows


def ack_latency(ctx: Any, work: str, count: int) -> dict[str, Any]:
    """acks="all" with one follower in the ISR: send().result() one record at a time."""
    leader_path, copy_path = tempfile.mkdtemp(dir=work), tempfile.mkdtemp(dir=work)
    with logkit.Broker(leader_path, background=False) as broker:
        broker.create_topic(TOPIC, 1, replication_factor=2)
        proc = _FollowerProcess(ctx, leader_path, copy_path)
        try:
            _all_in_sync(broker, 1, READY_TIMEOUT_S)
            producer = broker.producer(acks="all", linger_ms=0)
            samples = []
            for i in range(count):
                started = time.perf_counter_ns()
                producer.send(TOPIC, b"%d" % i, partition=0).result()
                samples.append(time.perf_counter_ns() - started)
            producer.close()
        finally:
            proc.stop()
    samples.sort()

    def pick(q: float) -> float:
        return samples[min(len(samples) - 1, int(q * len(samples)))] / 1e6

    return {"system": "acks=all send().result(), one follower in the ISR "
            "(DirectorySource)", "records": count, "latency_ms_p50": pick(0.5),
            "latency_ms_p99": pick(0.99), "latency_ms_max": samples[-1] / 1e6}


# ---- lag -------------------------------------------------------------------------------

def lag(ctx: Any, work: str, count: int, interval_us: int, tcp: bool = False
        ) -> dict[str, Any]:
    leader_path = tempfile.mkdtemp(dir=work)
    copy_path = tempfile.mkdtemp(dir=work)
    with logkit.Broker(leader_path, background=False) as broker:
        broker.create_topic(TOPIC, 1)
        port = broker.serve_replication(secret=SECRET).port if tcp else None
        proc = _FollowerProcess(ctx, leader_path, copy_path, port)
        try:
            ready, out = ctx.Event(), ctx.Queue()
            reader = ctx.Process(target=_lag_reader, args=(copy_path, count, ready, out),
                                 daemon=True)
            reader.start()
            if not ready.wait(READY_TIMEOUT_S):
                raise RuntimeError("the reader did not start")
            time.sleep(0.2)
            producer = broker.producer(acks=1, linger_ms=0)
            interval_s = interval_us / 1e6
            next_at = time.monotonic()
            for _ in range(count):
                next_at += interval_s
                while time.monotonic() < next_at:
                    remaining = next_at - time.monotonic()
                    if remaining > 0.0005:
                        time.sleep(remaining - 0.0003)
                producer.send(TOPIC, b"%d" % _now_ns(), partition=0).result()
            samples = sorted(out.get(timeout=READY_TIMEOUT_S))
            reader.join(timeout=30)
            producer.close()
        finally:
            proc.stop()

    def pick(q: float) -> float:
        return samples[min(len(samples) - 1, int(q * len(samples)))] / 1e6

    source = "TcpSource" if tcp else "DirectorySource"
    return {"system": f"leader ack -> poll on the follower's directory ({source})",
            "records": len(samples), "lag_ms_p50": pick(0.5), "lag_ms_p99": pick(0.99),
            "lag_ms_p999": pick(0.999), "lag_ms_max": samples[-1] / 1e6}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--lag-records", type=int, default=2000)
    parser.add_argument("--ack-records", type=int, default=1000)
    parser.add_argument("--interval-us", type=int, default=1000)
    parser.add_argument("--json", metavar="FILE")
    args = parser.parse_args(argv)
    ctx = mp.get_context("spawn")
    work = tempfile.mkdtemp(prefix="logkit-replication-")
    try:
        result = {"throughput": throughput(ctx, work, args.records, args.repeats),
                  "ack_latency": ack_latency(ctx, work, args.ack_records),
                  "lag": lag(ctx, work, args.lag_records, args.interval_us),
                  "lag_tcp": lag(ctx, work, args.lag_records, args.interval_us, tcp=True),
                  "machine": {"cpus": os.cpu_count()}}
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"produce, {args.records} x 100-byte records, 3 partitions, median of "
          f"{args.repeats}")
    for row in result["throughput"]:
        extra = (f"  follower done after {row['follower_done_after_s']:.2f} s"
                 if "follower_done_after_s" in row else "")
        print(f"  {row['system']:<55} {row['records_per_s']:>12,.0f} rec/s "
              f"{row['ratio_to_unreplicated']:>6.2f}x "
              f"({row['ratio_to_unreplicated_same_acks']:.2f}x same acks){extra}")
    row = result["ack_latency"]
    print(f"{row['system']}: p50 {row['latency_ms_p50']:.3f} ms, p99 "
          f"{row['latency_ms_p99']:.3f} ms, max {row['latency_ms_max']:.3f} ms")
    for row in (result["lag"], result["lag_tcp"]):
        print(f"replication lag, {row['records']} records spaced {args.interval_us} µs, "
              f"{row['system']}: p50 {row['lag_ms_p50']:.3f} ms, p99 "
              f"{row['lag_ms_p99']:.3f} ms, p99.9 {row['lag_ms_p999']:.3f} ms, max "
              f"{row['lag_ms_max']:.3f} ms")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=1)
            f.write("\n")
    return result


if __name__ == "__main__":
    main()
