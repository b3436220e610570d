"""The enumerated workload: `python -m tests.crashpoints.workload ROOT VARIANT LEDGER`.

VARIANT is `acks1` (acks=1, the default flush policy), `flush1` (flush.messages=1,
acks="all") or `twowriters` (acks1 plus a second writer process on the same root,
`python -m tests.crashpoints.workload ROOT writer2 LEDGER.2`). `acks1sync` (the power-cut
harness's, tests/powercut/) is acks1 plus a `broker.flush()` after each group commit,
between a `{"kind": "syncing"}` and a `{"kind": "synced"}` entry: everything
acknowledged before the first is durable once the second is written; and
after each flush of the producer, a roll seen (the active segment's base moved) is
ledgered as `{"kind": "rolled", "topic", "partition", "below": base}`: a roll fsyncs
the segment it seals, so every record below that base is durable. `twowriterssync` is
`acks1sync` with the second writer. `clean` and `cleansync` (log compaction, one
compacted partition cleaned three times) are tests/crashpoints/compaction.py's; `txn`
(transactions committed, aborted, fenced and left open) is tests/crashpoints/transactions.py's.

Every acknowledged outcome is appended to LEDGER *after* the acknowledgement, as one JSON
line: so the ledger is a subset of what was acknowledged, and the checker trusts only
it. The ledger is opened O_APPEND|O_DSYNC and written with writev(2): each line is
durable when the call returns, and the ledger adds no write/fsync calls to the syscalls
being enumerated. Exceptions raised by logkit calls go to LEDGER.events (a logkit
`LogkitError` is expected under an injected error; anything else is a "raw error").

Everything is deterministic except thread timing: keys, values and the order of
operations are fixed, and appends run on the calling thread (linger_ms is long and
every batch is flushed explicitly), so call numbers repeat from run to run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import traceback

import logkit
from logkit.errors import LogkitError
from logkit.topic import TopicPartition

MAIN_TOPIC = "t"
MAIN_PARTITIONS = 3
RETENTION_TOPIC = "r"
TEMP_TOPIC = "tmp"
GROUP = "g"

MAIN_CONFIG = {"segment.bytes": 16384, "segment.index.bytes": 4096,
               "index.interval.bytes": 1024}
RETENTION_CONFIG = {"segment.bytes": 4096, "segment.index.bytes": 1024,
                    "retention.bytes": 8192, "file.delete.delay.ms": 0}
TEMP_CONFIG = {"segment.bytes": 4096, "segment.index.bytes": 1024}

BATCHES = 16            # producer flushes on the main topic
PER_BATCH = 8           # records per flush
VALUE_BYTES = 600       # ~4.8 KiB per flush over 3 partitions: 1-2 rolls each
WRITER2_BATCHES = 10


class Ledger:
    """One JSON line per acknowledged outcome, durable before the next operation."""

    def __init__(self, path: str) -> None:
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_DSYNC
                          | os.O_CLOEXEC, 0o600)
        self.events_fd = os.open(path + ".events", os.O_WRONLY | os.O_CREAT | os.O_APPEND
                                 | os.O_DSYNC | os.O_CLOEXEC, 0o600)

    def _line(self, fd: int, entry: dict) -> None:
        os.writev(fd, [json.dumps(entry, sort_keys=True).encode() + b"\n"])

    def ack(self, **entry: object) -> None:
        self._line(self.fd, entry)

    def event(self, **entry: object) -> None:
        self._line(self.events_fd, entry)


def value_for(tag: str, n: int) -> bytes:
    head = f"{tag}:{n}:".encode()
    return head + bytes((n * 7 + i) % 251 for i in range(VALUE_BYTES - len(head)))


class Runner:
    """Runs operations, ledgering acks and recording exceptions (the workload goes on
    after an error: what it does next shows whether the failed operation left traces)."""

    def __init__(self, ledger: Ledger, who: str) -> None:
        self.ledger = ledger
        self.who = who

    def guard(self, op: str, fn, *args, **kwargs):
        try:
            return True, fn(*args, **kwargs)
        except LogkitError as exc:
            self.ledger.event(who=self.who, op=op, kind="logkit",
                              type=type(exc).__name__, message=str(exc)[:300])
        except Exception as exc:     # noqa: BLE001 — a raw error is what we look for
            self.ledger.event(who=self.who, op=op, kind="raw", type=type(exc).__name__,
                              message=str(exc)[:300],
                              traceback=traceback.format_exc()[-2000:])
        return False, None


def produce(run: Runner, producer, topic: str, tag: str, start: int, count: int) -> None:
    """Send `count` keyed records, flush, and ledger each acknowledged one."""
    futures = []
    for n in range(start, start + count):
        ok, future = run.guard("send", producer.send, topic, value_for(tag, n),
                               key=f"k{n % 11}".encode())
        if ok:
            futures.append((n, future))
    run.guard("flush", producer.flush)
    for n, future in futures:
        ok, meta = run.guard("ack", future.result, 30)
        if ok:
            run.ledger.ack(kind="record", topic=meta.topic, partition=meta.partition,
                           offset=meta.offset, key=f"k{n % 11}", value=f"{tag}:{n}")


def main_workload(root: str, variant: str, ledger_path: str) -> int:
    ledger = Ledger(ledger_path)
    run = Runner(ledger, "main")
    flush1 = variant == "flush1"
    sync_points = variant in ("acks1sync", "twowriterssync")
    main_config = dict(MAIN_CONFIG, **({"flush.messages": 1} if flush1 else {}))
    ok, broker = run.guard("open", logkit.Broker, root, background=False)
    if not ok:
        return 0
    writer2 = None
    ok, _ = run.guard("create_topic", broker.create_topic, MAIN_TOPIC, MAIN_PARTITIONS,
                      config=main_config)
    if ok:
        ledger.ack(kind="created", topic=MAIN_TOPIC)
    ok, _ = run.guard("create_topic", broker.create_topic, RETENTION_TOPIC, 1,
                      config=RETENTION_CONFIG)
    if ok:
        ledger.ack(kind="created", topic=RETENTION_TOPIC)
    if variant in ("twowriters", "twowriterssync"):
        writer2 = subprocess.Popen([sys.executable, "-m", "tests.crashpoints.workload",
                                    root, "writer2", ledger_path + ".2"])
    acks = "all" if flush1 else 1
    ok, producer = run.guard("producer", broker.producer, acks=acks, linger_ms=60000,
                             batch_size=1 << 20)
    if not ok:
        run.guard("close", broker.close)
        return 0
    ok, consumer = run.guard("consumer", broker.consumer, group_id=GROUP,
                             enable_auto_commit=False)
    if ok:
        run.guard("assign", consumer.assign,
                  [TopicPartition(MAIN_TOPIC, p) for p in range(MAIN_PARTITIONS)])
    tag = "main"
    rolled: dict = {}
    for batch in range(BATCHES):
        produce(run, producer, MAIN_TOPIC, tag, batch * PER_BATCH, PER_BATCH)
        produce(run, producer, RETENTION_TOPIC, "ret", batch * 2, 2)
        if sync_points:
            ledger_rolls(run, broker, rolled)
        if batch % 4 == 3 and consumer is not None:
            # commit "everything up to the log end" of each partition
            offsets = {}
            for p in range(MAIN_PARTITIONS):
                ok, end = run.guard("end", lambda p=p: broker.topic(MAIN_TOPIC)
                                    .partition(p).log_end_offset)
                if ok:
                    offsets[TopicPartition(MAIN_TOPIC, p)] = end
            ok, _ = run.guard("commit", consumer.commit, offsets)
            if ok:
                for tp, offset in offsets.items():
                    ledger.ack(kind="commit", group=GROUP, topic=tp.topic,
                               partition=tp.partition, offset=offset)
            if sync_points:
                ledger.ack(kind="syncing")      # covers what was acknowledged before it
                ok, _ = run.guard("flush", broker.flush)
                if ok:
                    ledger.ack(kind="synced")
        if batch % 5 == 4:
            ok, deleted = run.guard("retention", broker.enforce_retention)
        if batch == 6:
            temp_cycle(run, broker, acks, incarnation=1, delete=True)
        if batch == 10:
            temp_cycle(run, broker, acks, incarnation=2, delete=False)
    if consumer is not None:
        run.guard("consumer.close", consumer.close, autocommit=False)
    run.guard("producer.close", producer.close)
    if writer2 is not None:
        writer2.wait()
    ok, _ = run.guard("close", broker.close)
    if ok:
        ledger.ack(kind="closed")
    return 0


def ledger_rolls(run: Runner, broker, seen: dict) -> None:
    """Ledger each roll since the last call (see the module docstring, `acks1sync`)."""
    for topic, count in ((MAIN_TOPIC, MAIN_PARTITIONS), (RETENTION_TOPIC, 1)):
        for p in range(count):
            ok, bases = run.guard("bases", lambda topic=topic, p=p: broker.topic(topic)
                                  .partition(p).segment_base_offsets())
            if ok and bases and bases[-1] > seen.get((topic, p), 0):
                seen[(topic, p)] = bases[-1]
                run.ledger.ack(kind="rolled", topic=topic, partition=p, below=bases[-1])


def temp_cycle(run: Runner, broker, acks, *, incarnation: int, delete: bool) -> None:
    """Create the temp topic, write to it, and (first time) delete it. A producer of
    its own: one that wrote to the deleted incarnation keeps its closed partitions."""
    ok, _ = run.guard("create_topic", broker.create_topic, TEMP_TOPIC, 1,
                      config=TEMP_CONFIG)
    if not ok:
        return
    run.ledger.ack(kind="created", topic=TEMP_TOPIC, incarnation=incarnation)
    ok, producer = run.guard("producer", broker.producer, acks=acks, linger_ms=60000,
                             batch_size=1 << 20)
    if not ok:
        return
    produce(run, producer, TEMP_TOPIC, f"tmp{incarnation}", 0, 4)
    produce(run, producer, TEMP_TOPIC, f"tmp{incarnation}", 4, 4)
    run.guard("producer.close", producer.close)
    if delete:
        # an intent, not an ack: a deletion that started may finish at the next open
        run.ledger.ack(kind="deleting", topic=TEMP_TOPIC, incarnation=incarnation)
        ok, _ = run.guard("delete_topic", broker.delete_topic, TEMP_TOPIC)
        if ok:
            run.ledger.ack(kind="deleted", topic=TEMP_TOPIC, incarnation=incarnation)


def writer2_workload(root: str, ledger_path: str) -> int:
    """A second process appending to the main topic's partitions directly."""
    ledger = Ledger(ledger_path)
    run = Runner(ledger, "writer2")
    ok, broker = run.guard("open", logkit.Broker, root, background=False)
    if not ok:
        return 0
    ok, topic = run.guard("topic", broker.topic, MAIN_TOPIC)
    if ok:
        for n in range(WRITER2_BATCHES):
            p = n % MAIN_PARTITIONS
            rows = [(f"w{n}".encode(), value_for("w2", n * 3 + i), None, None)
                    for i in range(3)]
            ok, base = run.guard("append", topic.partition(p).append, rows)
            if ok:
                for i in range(3):
                    ledger.ack(kind="record", topic=MAIN_TOPIC, partition=p,
                               offset=base + i, key=f"w{n}", value=f"w2:{n * 3 + i}")
    ledger.ack(kind="closing", who="writer2")   # its close syncs what was acked before
    ok, _ = run.guard("close", broker.close)
    if ok:
        ledger.ack(kind="closed", who="writer2")
    return 0


def main(argv: list[str]) -> int:
    root, variant, ledger_path = argv
    if os.environ.get("LOGKIT_POWERCUT_MARKS"):    # traced by tests/powercut: observe maps
        from tests.powercut import traced
        traced.install(os.environ["LOGKIT_POWERCUT_MARKS"])
    if variant == "writer2":
        return writer2_workload(root, ledger_path)
    if variant in ("clean", "cleansync"):     # log compaction (compaction.py)
        from tests.crashpoints import compaction
        return compaction.clean_workload(root, variant, ledger_path)
    if variant in ("txn", "txnsync"):         # transactions (transactions.py)
        from tests.crashpoints import transactions
        return transactions.txn_workload(root, variant, ledger_path)
    return main_workload(root, variant, ledger_path)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
