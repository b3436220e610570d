"""The produce benchmark: keyed records into a 3-partition topic through logkit's producer
and through log-level appends, beside SQLite in WAL mode, persist-queue and `os.write`
of the same batches; Kafka's 2014 figure as a labelled anchor.

Then the client's cost matrix (issue 16, goal 1): `producer.send` for {keyed, unkeyed}
x {1, 3 partitions} x {no callback, a callback per record}, each case its own benchmark
(`produce-keyed-3p`, `produce-unkeyed-1p-callback`, ...) whose headline is the producer
and whose one peer is the log-level append of the same records into the same partitions,
measured right after it (MATRIX_REPEATS interleaved rounds, the fastest of each side
kept), so the row's `logkit x` is producer / log. Every producer row
also carries the batches it wrote (`extra`: batch count, records per batch, the share of
batches under SMALL_BATCH_RECORDS records), read back from the log; one more case runs
with linger_ms=0 (goal 5: no small batches while the producer is saturated).

Owns: the `produce` rows, and the measurement `durable` shares (`produce_rows(...,
durable=True)`: a topic with flush.messages=1 and the peers' durable settings).
Invariant: every system writes the same records, each into its own scratch directory.
"""

from __future__ import annotations

import os
import struct
import time
from dataclasses import replace
from functools import partial
from typing import Any, Callable

from ._common import (KAFKA_2014, NOT_INSTALLED, TOPIC, BenchConfig, Progress, Result,
                      append_all, batch_appender, chunks, encoded_batches, make_records,
                      measure, open_broker, records_per_batch, scratch)
from ._peers import persist_queue, sqlite_open, sqlite_write


SMALL_BATCH_RECORDS = 10           # goal 5: no batches under this while saturated
BENCH_LINGER_MS = 5                # the producer rows' linger_ms unless a case says
MATRIX_REPEATS = 3                 # rounds per matrix case; the fastest of each side counts


def run(config: BenchConfig) -> list[Result]:
    return produce_rows(config, durable=False) + matrix_rows(config)


def produce_rows(config: BenchConfig, *, durable: bool) -> list[Result]:
    name = "durable" if durable else "produce"
    count = config.durable_records if durable else config.records
    pairs = make_records(config, count)
    payload_each = config.key_bytes + config.value_bytes
    topic_config = {"flush.messages": 1} if durable else {}
    out: list[Result] = []
    for level in ("producer", "log"):
        with scratch(config, name) as path:
            broker = open_broker(path, config, topic_config)
            progress = Progress(f"{name} logkit {level}", count, config.progress)
            if level == "producer":
                system = "logkit producer.send (keyed, 3 partitions)"
                fn = partial(producer_send_all, broker, config, pairs, progress)
            else:
                system = "logkit log append (encode_batch + append_batch)"
                fn = partial(append_all, broker, config, pairs, progress)
            out.append(measure(name, system, count, count * payload_each, fn,
                               headline=level == "producer"))
            progress.done()
            broker.close()
    out += _peer_rows(config, name, pairs[:min(count, config.peer_records_cap)], durable)
    if not durable:
        out.append(Result(name, "Kafka 2014, 1 producer thread, no replication "
                          "(historical anchor, not this machine)",
                          records_per_s=KAFKA_2014["produce_records_per_s"], note="anchor"))
    return out


def producer_send_all(broker: Any, config: BenchConfig, pairs: list[tuple[bytes, bytes]],
                      progress: Progress | None, *, keyed: bool = True,
                      callback: bool = False, linger_ms: int = BENCH_LINGER_MS) -> None:
    """Every pair through one `producer.send` (keys dropped when not `keyed`; with
    `callback`, a callback added to every future), then flush: the client path."""
    producer = broker.producer(batch_size=config.batch_bytes, linger_ms=linger_ms,
                               compression_type=config.codec_name())
    send = producer.send
    step = 100_000
    called = [0]

    def on_stored(metadata: Any) -> None:
        called[0] += 1

    for start in range(0, len(pairs), step):
        chunk = pairs[start:start + step]
        if callback and keyed:
            for key, value in chunk:
                send(TOPIC, value, key=key).add_callback(on_stored)
        elif callback:
            for key, value in chunk:
                send(TOPIC, value).add_callback(on_stored)
        elif keyed:
            for key, value in chunk:
                send(TOPIC, value, key=key)
        else:
            for key, value in chunk:
                send(TOPIC, value)
        if progress is not None:
            progress.update(start + step)
    producer.flush()
    producer.close()
    if callback and called[0] != len(pairs):
        raise RuntimeError(f"{called[0]} callbacks ran for {len(pairs)} records")


# ---- the client's cost matrix (issue 16, goals 1 and 5) -----------------------------

MATRIX = [(keyed, parts, callback) for keyed in (True, False) for parts in (3, 1)
          for callback in (False, True)]


def matrix_rows(config: BenchConfig) -> list[Result]:
    """Each case: producer.send (headline) then the log-level append of the same
    records into the same partitions, one after the other; plus the linger_ms=0 case."""
    pairs = make_records(config, config.records)
    out: list[Result] = []
    for keyed, parts, callback in MATRIX:
        name = (f"produce-{'keyed' if keyed else 'unkeyed'}-{parts}p"
                f"{'-callback' if callback else ''}")
        out += _case(config, pairs, name, keyed, parts, callback, BENCH_LINGER_MS)
    out += _case(config, pairs, "produce-keyed-3p-linger0", True, 3, False, 0)
    return out


def _case(config: BenchConfig, pairs: list[tuple[bytes, bytes]], name: str, keyed: bool,
          parts: int, callback: bool, linger_ms: int) -> list[Result]:
    """MATRIX_REPEATS rounds of (producer, log), interleaved so the machine's load hits
    both alike; each side's fastest round is its row (the batch figures are that
    round's)."""
    count = len(pairs)
    payload = count * (config.key_bytes + config.value_bytes)
    case_config = replace(config, partitions=parts)
    what = (f"{'keyed' if keyed else 'unkeyed'}, {parts} partition{'s' * (parts > 1)}, "
            f"linger_ms={linger_ms}{', callback per record' if callback else ''}")
    best: dict[str, Result] = {}
    for _ in range(MATRIX_REPEATS):
        for level in ("producer", "log"):
            with scratch(config, name) as path:
                broker = open_broker(path, case_config)
                progress = Progress(f"{name} {level}", count, config.progress)
                if level == "producer":
                    row = measure(name, f"logkit producer.send ({what})", count, payload,
                                  partial(producer_send_all, broker, case_config, pairs,
                                          progress, keyed=keyed, callback=callback,
                                          linger_ms=linger_ms), headline=True)
                else:
                    append: Callable[[], Any] = partial(
                        append_all if keyed else append_round_robin, broker, case_config,
                        pairs, progress)
                    row = measure(name, "logkit log append (encode_batch + append_batch, "
                                  "full batches)", count, payload, append)
                row.extra = batch_stats(broker, parts)
                row.extra["rounds"] = MATRIX_REPEATS
                progress.done()
                broker.close()
            if level not in best or row.seconds < best[level].seconds:
                best[level] = row
    return [best["producer"], best["log"]]


def append_round_robin(broker: Any, config: BenchConfig, pairs: list[tuple[bytes, bytes]],
                       progress: Progress | None) -> None:
    """The log-level twin of unkeyed sends: full batches of keyless records, each batch
    to the next partition in turn (the sticky partitioner moves on per batch too)."""
    from logkit.compression import codec_id
    from logkit.records import encode_batch
    topic = broker.topic(TOPIC)
    appenders = [batch_appender(topic.partition(p)) for p in range(config.partitions)]
    codec = codec_id(config.codec_name())
    now = int(time.time() * 1000)
    per_batch = records_per_batch(replace(config, key_bytes=0))   # no key: more fit
    for n, chunk in enumerate(chunks(pairs, per_batch)):
        appenders[n % len(appenders)](
            encode_batch([(None, value, None, now) for _, value in chunk], codec=codec,
                         now_ms=now))
        if progress is not None and n % 64 == 0:
            progress.update(n * len(chunk))


_BATCH_LENGTH = struct.Struct(">i")
_BATCH_COUNT = struct.Struct(">i")


def batch_stats(broker: Any, parts: int) -> dict[str, float]:
    """How the records of topic TOPIC were batched: batches, records per batch and the
    share of batches under SMALL_BATCH_RECORDS records, read from the stored batches."""
    from logkit.records import LENGTH_OFFSET, LOG_OVERHEAD, RECORDS_COUNT_OFFSET
    topic = broker.topic(TOPIC)
    counts: list[int] = []
    for p in range(parts):
        partition = topic.partition(p)
        offset, end = partition.log_start_offset, partition.log_end_offset
        while offset < end:
            data = partition.batches_since(offset, upto=end)
            if not data:
                break
            pos = 0
            while pos < len(data):
                length = _BATCH_LENGTH.unpack_from(data, pos + LENGTH_OFFSET)[0]
                n = _BATCH_COUNT.unpack_from(data, pos + RECORDS_COUNT_OFFSET)[0]
                counts.append(n)
                offset = struct.unpack_from(">q", data, pos)[0] + n
                pos += LOG_OVERHEAD + length
    batches = len(counts)
    records = sum(counts)
    small = sum(1 for n in counts if n < SMALL_BATCH_RECORDS)
    return {"batches": batches, "records_per_batch": records / max(batches, 1),
            "small_batch_share": small / max(batches, 1)}


def _peer_rows(config: BenchConfig, name: str, pairs: list[tuple[bytes, bytes]],
               durable: bool) -> list[Result]:
    count = len(pairs)
    payload_each = config.key_bytes + config.value_bytes
    per_batch = records_per_batch(config)
    synchronous = "FULL" if durable else "NORMAL"
    out: list[Result] = []
    with scratch(config, name) as path:
        db = sqlite_open(os.path.join(path, "peer.db"), synchronous)
        progress = Progress(f"{name} sqlite", count, config.progress)
        out.append(measure(name, f"SQLite WAL executemany, txn per batch "
                           f"(synchronous={synchronous})", count, count * payload_each,
                           lambda: sqlite_write(db, pairs, per_batch, config.partitions,
                                                progress)))
        progress.done()
        db.close()

        queue_count = min(count, 20_000 if durable else 100_000)
        queue = persist_queue(os.path.join(path, "pq"))
        if queue is None:
            out.append(Result(name, "persist-queue SQLiteQueue", note=NOT_INSTALLED))
        else:
            def pq_put() -> None:
                for chunk in chunks(pairs[:queue_count], per_batch):
                    for pair in chunk:
                        queue.put(pair)
                    queue.task_done()           # commits the batch's puts

            out.append(measure(name, "persist-queue SQLiteQueue, commit per batch",
                               queue_count, queue_count * payload_each, pq_put))

        batches = encoded_batches(config, pairs)
        fd = os.open(os.path.join(path, "raw.log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        try:
            def raw() -> None:
                for batch in batches:
                    os.write(fd, batch)
                    if durable:
                        os.fsync(fd)

            out.append(measure(name, "os.write of the same batches" +
                               (" + fsync each" if durable else "") + " (physical limit)",
                               count, count * payload_each, raw))
        finally:
            os.close(fd)
    return out
