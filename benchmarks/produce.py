"""The produce benchmark: keyed records into a 3-partition topic through logkit's producer
and through log-level appends, beside SQLite in WAL mode, persist-queue and `os.write`
of the same batches; Kafka's 2014 figure as a labelled anchor.

Owns: the `produce` rows, and the measurement `durable` shares (`produce_rows(...,
durable=True)`: a topic with flush.messages=1 and the peers' durable settings).
Invariant: every system writes the same records, each into its own scratch directory.
"""

from __future__ import annotations

import os
from functools import partial
from typing import Any

from ._common import (KAFKA_2014, NOT_INSTALLED, TOPIC, BenchConfig, Progress, Result,
                      append_all, chunks, encoded_batches, make_records, measure,
                      open_broker, records_per_batch, scratch)
from ._peers import persist_queue, sqlite_open, sqlite_write


def run(config: BenchConfig) -> list[Result]:
    return produce_rows(config, durable=False)


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
                      progress: Progress | None) -> None:
    """Every pair through one `producer.send`, then flush: the client path."""
    producer = broker.producer(batch_size=config.batch_bytes, linger_ms=5,
                               compression_type=config.codec_name())
    send = producer.send
    step = 100_000
    for start in range(0, len(pairs), step):
        for key, value in pairs[start:start + step]:
            send(TOPIC, value, key=key)
        if progress is not None:
            progress.update(start + step)
    producer.flush()
    producer.close()


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
