"""The consume benchmark: read back every record (touching each value) through logkit's
consumer (without a group, and as a group member) and through `Partition.read` (the
reference the consumer's ratio is taken against: the three alternate, median rate of
REPEATS rounds; a consumer's rate is its steady state, the polls after its first,
with the first poll — joining, resolving positions — and close() timed beside it in
`extra`), beside SQLite in WAL mode, persist-queue, `os.read`
of the same batches and kafka-python's batch parser over the same file; Kafka's 2014
figure as a labelled anchor.

Owns: the `consume` rows. Invariant: logkit's rows read exactly the records loaded (a
short read fails the run), and the peers read the same records' bytes.
"""

from __future__ import annotations

import os
import statistics
import time
from typing import Callable

from ._common import (KAFKA_2014, NOT_INSTALLED, TOPIC, BenchConfig, Progress, Result,
                      append_all, encoded_batches, make_records,
                      measure, open_broker, peak_rss_mb, read_all,
                      records_per_batch, reset_peak_rss, scratch)
from ._peers import kafka_python, persist_queue, sqlite_open, sqlite_read, sqlite_write

MAX_RECORDS_PER_POLL = 500
IDLE_POLLS_MAX = 50                   # empty 100 ms polls before the consumer gives up
REPEATS = 5                           # timed rounds of the logkit rows (median reported)


def run(config: BenchConfig) -> list[Result]:
    count = config.records
    pairs = make_records(config, count)
    payload_each = config.key_bytes + config.value_bytes
    out: list[Result] = []
    with scratch(config, "consume") as path:
        broker = open_broker(path, config)
        progress = Progress("consume: loading", count, config.progress)
        append_all(broker, config, pairs, progress)
        progress.done()
        topic = broker.topic(TOPIC)

        def poll_all(group_id: str | None) -> Callable[[], dict[str, float]]:
            def run_consumer() -> dict[str, float]:
                # Timed: the polls after the first. The first poll joins the group
                # (a member) and resolves positions, once per consumer: its time and
                # close()'s are reported beside the rate, not in it.
                started = time.perf_counter()
                consumer = broker.consumer(TOPIC, group_id=group_id,
                                           auto_offset_reset="earliest",
                                           enable_auto_commit=False)
                first = len(consumer.poll(timeout_ms=100, max_records=MAX_RECORDS_PER_POLL))
                steady = time.perf_counter()
                seen, idle = first, 0
                while seen < count and idle < IDLE_POLLS_MAX:
                    records = consumer.poll(timeout_ms=100,
                                            max_records=MAX_RECORDS_PER_POLL)
                    idle = 0 if records else idle + 1
                    for r in records:
                        r.value
                    seen += len(records)
                ended = time.perf_counter()
                consumer.close()
                if seen != count:
                    raise RuntimeError(f"consumer.poll returned {seen} of {count} records")
                return {"records": seen - first, "seconds": ended - steady,
                        "first_poll_ms": (steady - started) * 1000,
                        "close_ms": (time.perf_counter() - ended) * 1000}
            return run_consumer

        def log_read() -> dict[str, float]:
            started = time.perf_counter()
            seen = read_all(topic, config.partitions, MAX_RECORDS_PER_POLL)
            if seen != count:
                raise RuntimeError(f"Partition.read returned {seen} of {count} records")
            return {"records": seen, "seconds": time.perf_counter() - started}

        # The client rows and their reference alternate, after a warm-up round, and
        # each reports its median rate: the machine's noise hits all three alike.
        reset_peak_rss()
        rounds = _alternate({"poll": poll_all(None), "group": poll_all("bench-consume"),
                             "read": log_read}, REPEATS)
        rss = peak_rss_mb()
        rates = {key: statistics.median(r["records"] / r["seconds"] for r in runs)
                 for key, runs in rounds.items()}
        for key, system in (
                ("poll", "logkit consumer.poll(max_records=500) + iterate"),
                ("group", "logkit consumer.poll, group member (subscribe) + iterate"),
                ("read", "logkit Partition.read(max_records=500) + iterate")):
            rate = rates[key]
            extra: dict[str, float] = {"median_of": REPEATS,
                                       "partitions": config.partitions,
                                       "vs_partition_read": rate / rates["read"]}
            if key != "read":
                for field in ("first_poll_ms", "close_ms"):
                    extra[field] = statistics.median(r[field] for r in rounds[key])
            out.append(Result("consume", system, count, count / rate, rate,
                              rate * payload_each / 1e6, peak_rss_mb=rss,
                              headline=key == "poll", extra=extra))
        broker.close()
        out += _peer_rows(config, path, pairs[:min(count, config.peer_records_cap)])
    out.append(Result("consume", "Kafka 2014, 1 consumer (historical anchor, not this "
                      "machine)", records_per_s=KAFKA_2014["consume_records_per_s"],
                      note="anchor"))
    return out


def _alternate(runs: dict[str, Callable[[], dict[str, float]]], repeats: int
               ) -> dict[str, list[dict[str, float]]]:
    """Each run's own figures over `repeats` rounds, after one warm-up round; each
    round runs every system once."""
    for fn in runs.values():
        fn()
    out: dict[str, list[dict[str, float]]] = {name: [] for name in runs}
    for _ in range(repeats):
        for name, fn in runs.items():
            out[name].append(fn())
    return out


def _peer_rows(config: BenchConfig, path: str, pairs: list[tuple[bytes, bytes]]) -> list[Result]:
    count = len(pairs)
    payload_bytes = count * (config.key_bytes + config.value_bytes)
    per_batch = records_per_batch(config)
    out: list[Result] = []
    db = sqlite_open(os.path.join(path, "peer.db"), "NORMAL")
    sqlite_write(db, pairs, per_batch, config.partitions)
    out.append(measure("consume", "SQLite WAL SELECT 500 rows per query + iterate",
                       count, payload_bytes,
                       lambda: sqlite_read(db, count, MAX_RECORDS_PER_POLL)))
    db.close()

    queue_count = min(count, 50_000)
    queue = persist_queue(os.path.join(path, "pq"))
    if queue is None:
        out.append(Result("consume", "persist-queue SQLiteQueue", note=NOT_INSTALLED))
    else:
        for pair in pairs[:queue_count]:
            queue.put(pair)
        queue.task_done()

        def pq_get() -> None:
            for start in range(0, queue_count, per_batch):
                for _ in range(min(per_batch, queue_count - start)):
                    queue.get(block=False)
                queue.task_done()

        out.append(measure("consume", "persist-queue SQLiteQueue get, commit per batch",
                           queue_count, queue_count * (config.key_bytes + config.value_bytes),
                           pq_get))

    raw_path = os.path.join(path, "raw.log")
    with open(raw_path, "wb") as f:
        for batch in encoded_batches(config, pairs):
            f.write(batch)

    def raw_read() -> None:
        fd = os.open(raw_path, os.O_RDONLY)
        try:
            while os.read(fd, 1 << 20):
                pass
        finally:
            os.close(fd)

    out.append(measure("consume", "os.read of the same batches, 1 MiB reads "
                       "(physical limit)", count, payload_bytes, raw_read))
    kp = kafka_python()
    if kp is not None:
        def kp_read() -> None:
            with open(raw_path, "rb") as f:
                batches = kp.MemoryRecords(f.read())
            while (batch := batches.next_batch()) is not None:
                for r in batch:
                    r.value

        out.append(measure("consume", "kafka-python DefaultRecordBatch over the same "
                           "file (codec peer)", count, payload_bytes, kp_read))
    return out
