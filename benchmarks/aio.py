"""The asyncio clients' costs (issue 34, logkit.aio): AIOProducer and AIOConsumer beside
the plain clients they front, and how long the event loop stalls while they work.

Cases (100 B values, 10 B keys, 3 partitions, linger_ms=0, a fresh topic per run, the
plain and asyncio clients interleaved round by round, the median of --repeats kept):

  produce   records per second: the plain producer (`send` N records, `flush`) beside
            AIOProducer (`await send` N records, `await flush()`, every future
            awaited), and a floor: the same loop over a stub whose `send` only makes an
            asyncio.Future and queues a tuple (what any asyncio send costs the loop)
  consume   records per second from the start of a topic of N records to its end: the
            plain consumer's `poll` beside AIOConsumer's `getmany(timeout_ms=1000)`
  stall     a ticker task sleeping 1 ms measures how late each tick wakes (the loop's
            stall): idle (nothing else running), while producing as fast as the loop
            can (the sending task yields every 100 sends), while producing at a paced
            10,000 records/s (100 every 10 ms, as a web service's requests would), and
            while 100k records are produced and consumed at once; p50, p99, max in ms

Run from the checkout's root (its own command line and JSON, not part of `all`):
    .venv/bin/python -m benchmarks.aio [--json benchmarks/aio.json]
    .venv/bin/python -m benchmarks.aio --profile      # cProfile of the loop thread
`--quick` is a smoke size. Goals (issue 34): AIOProducer.send >= 0.8x the plain
producer; loop stall p99 while producing <= 5 ms. Speed is never asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import collections
import datetime
import io
import json
import os
import pstats
import shutil
import statistics
import tempfile
import time
from typing import Any

import logkit
from logkit.aio import AIOConsumer, AIOProducer

GOALS = {"produce_vs_plain": 0.8, "stall_ms_p99_producing": 5.0}
TICK_S = 0.001
PARTITIONS = 3


def records(n: int) -> tuple[list[bytes], list[bytes]]:
    return [b"k%09d" % i for i in range(n)], [b"v" * 100] * n


def plain_produce(broker: Any, topic: str, keys: list, values: list) -> float:
    producer = broker.producer(linger_ms=0)
    started = time.perf_counter()
    send = producer.send
    for key, value in zip(keys, values):
        send(topic, value, key)
    producer.flush()
    elapsed = time.perf_counter() - started
    producer.close()
    return len(keys) / elapsed


async def aio_produce(broker: Any, topic: str, keys: list, values: list) -> float:
    async with AIOProducer(broker, linger_ms=0) as producer:
        started = time.perf_counter()
        send = producer.send
        futures = [await send(topic, value, key) for key, value in zip(keys, values)]
        await producer.flush()
        for future in futures:
            await future
        return len(keys) / (time.perf_counter() - started)


async def stub_produce(keys: list, values: list) -> float:
    """The floor: what any asyncio send returning a future costs the loop thread."""
    loop = asyncio.get_running_loop()
    queued: collections.deque = collections.deque()

    async def send(topic: str, value: Any, key: Any) -> asyncio.Future:
        future = loop.create_future()
        queued.append((future, topic, value, key))
        return future
    started = time.perf_counter()
    for key, value in zip(keys, values):
        await send("stub", value, key)
    return len(keys) / (time.perf_counter() - started)


def plain_consume(broker: Any, topic: str, total: int) -> float:
    consumer = broker.consumer(auto_offset_reset="earliest", enable_auto_commit=False)
    consumer.assign([logkit.TopicPartition(topic, p) for p in range(PARTITIONS)])
    started = time.perf_counter()
    seen = 0
    while seen < total:
        seen += len(consumer.poll(timeout_ms=1000))
    elapsed = time.perf_counter() - started
    consumer.close()
    return total / elapsed


async def aio_consume(broker: Any, topic: str, total: int) -> float:
    async with AIOConsumer(broker, auto_offset_reset="earliest") as consumer:
        consumer.assign([logkit.TopicPartition(topic, p) for p in range(PARTITIONS)])
        started = time.perf_counter()
        seen = 0
        while seen < total:
            batch = await consumer.getmany(timeout_ms=1000)
            seen += sum(map(len, batch.values()))
        return total / (time.perf_counter() - started)


def summary(stalls: list[float]) -> dict[str, float]:
    ordered = sorted(stalls)
    pick = (lambda q: ordered[min(len(ordered) - 1, int(len(ordered) * q))] * 1000)
    return {"ticks": len(ordered), "stall_ms_p50": round(pick(0.5), 3),
            "stall_ms_p99": round(pick(0.99), 3), "stall_ms_max": round(ordered[-1] * 1000, 3)}


async def with_ticker(work: Any) -> dict[str, float]:
    loop = asyncio.get_running_loop()
    stalls: list[float] = []
    done = False

    async def ticker() -> None:
        while not done:
            before = loop.time()
            await asyncio.sleep(TICK_S)
            stalls.append(max(0.0, loop.time() - before - TICK_S))
    ticking = asyncio.ensure_future(ticker())
    started = time.perf_counter()
    await work
    elapsed = time.perf_counter() - started
    done = True
    await ticking
    out = summary(stalls)
    out["seconds"] = round(elapsed, 3)
    return out


async def produce_yielding(producer: AIOProducer, topic: str, keys: list, values: list,
                           every: int = 100, pace_s: float = 0.0) -> None:
    futures = []
    for i, (key, value) in enumerate(zip(keys, values)):
        futures.append(await producer.send(topic, value, key))
        if i % every == every - 1:
            await asyncio.sleep(pace_s)
            if len(futures) >= 10_000:           # await in bounded bunches
                for future in futures:
                    await future
                futures = []
    for future in futures:
        await future


async def stall_cases(broker: Any, n: int) -> dict[str, Any]:
    keys, values = records(n)
    out: dict[str, Any] = {}
    out["idle"] = await with_ticker(asyncio.sleep(1.0))
    async with AIOProducer(broker, linger_ms=0) as producer:
        broker.create_topic("stall-fast", PARTITIONS)
        out["producing, as fast as possible"] = await with_ticker(
            produce_yielding(producer, "stall-fast", keys, values))
        broker.create_topic("stall-paced", PARTITIONS)
        paced = min(n, 20_000)
        out["producing, paced 10k records/s"] = await with_ticker(
            produce_yielding(producer, "stall-paced", keys[:paced], values[:paced],
                             pace_s=0.01))
        broker.create_topic("stall-both", PARTITIONS)

        async def consume() -> None:
            async with AIOConsumer(broker, "stall-both",
                                   auto_offset_reset="earliest") as consumer:
                seen = 0
                while seen < n:
                    batch = await consumer.getmany(timeout_ms=1000)
                    seen += sum(map(len, batch.values()))

        async def both() -> None:
            await asyncio.gather(consume(),
                                 produce_yielding(producer, "stall-both", keys, values))
        out["producing and consuming"] = await with_ticker(both())
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--profile", action="store_true",
                        help="cProfile AIOProducer's produce on the loop thread")
    args = parser.parse_args()
    n = 20_000 if args.quick else args.records
    root = tempfile.mkdtemp(prefix="bench-aio-")
    results: dict[str, Any] = {
        "date": datetime.date.today().isoformat(), "quick": args.quick,
        "records": n, "machine": {"cpus": os.cpu_count(),
                                  "load_1m": [os.getloadavg()[0]]}}
    try:
        with logkit.Broker(os.path.join(root, "data"), background=False) as broker:
            keys, values = records(n)
            if args.profile:
                broker.create_topic("profile", PARTITIONS)
                profile = cProfile.Profile()
                profile.enable()
                asyncio.run(aio_produce(broker, "profile", keys, values))
                profile.disable()
                text = io.StringIO()
                pstats.Stats(profile, stream=text).sort_stats("tottime").print_stats(15)
                print(text.getvalue())
                return
            rounds: dict[str, list[float]] = collections.defaultdict(list)
            for r in range(args.repeats):
                broker.create_topic(f"plain-{r}", PARTITIONS)
                broker.create_topic(f"aio-{r}", PARTITIONS)
                rounds["plain"].append(plain_produce(broker, f"plain-{r}", keys, values))
                rounds["aio"].append(asyncio.run(aio_produce(broker, f"aio-{r}", keys,
                                                             values)))
                rounds["floor"].append(asyncio.run(stub_produce(keys, values)))
                rounds["consume plain"].append(plain_consume(broker, f"plain-{r}", n))
                rounds["consume aio"].append(asyncio.run(aio_consume(broker, f"aio-{r}",
                                                                     n)))
                print(f"round {r + 1}: " + ", ".join(
                    f"{name} {values_[-1]:,.0f}/s" for name, values_ in rounds.items()),
                    flush=True)
            med = {name: statistics.median(v) for name, v in rounds.items()}
            results["produce"] = {
                "plain_records_per_s": round(med["plain"]),
                "aio_records_per_s": round(med["aio"]),
                "asyncio_future_floor_records_per_s": round(med["floor"]),
                "aio_vs_plain": round(med["aio"] / med["plain"], 3),
                "goal": GOALS["produce_vs_plain"],
                "met": med["aio"] / med["plain"] >= GOALS["produce_vs_plain"]}
            results["consume"] = {
                "plain_records_per_s": round(med["consume plain"]),
                "aio_records_per_s": round(med["consume aio"]),
                "aio_vs_plain": round(med["consume aio"] / med["consume plain"], 3)}
            results["stall"] = asyncio.run(stall_cases(broker, min(n, 100_000)))
            p99 = results["stall"]["producing, paced 10k records/s"]["stall_ms_p99"]
            results["stall"]["goal_ms_p99"] = GOALS["stall_ms_p99_producing"]
            results["stall"]["met_paced"] = p99 <= GOALS["stall_ms_p99_producing"]
            results["machine"]["load_1m"].append(os.getloadavg()[0])
    finally:
        shutil.rmtree(root, ignore_errors=True)
    text = json.dumps(results, indent=1)
    print(text)
    if args.json:
        with open(args.json, "w") as out:
            out.write(text + "\n")


if __name__ == "__main__":
    main()
