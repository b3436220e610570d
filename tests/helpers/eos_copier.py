"""The exactly-once kill loop (issue 33): a consume-transform-produce copier in a child
process, SIGKILLed at random points and restarted with the same transactional id, and
the check that its output is its input exactly once.

    python -m tests.helpers.eos_copier embedded ROOT          # the child: logkit in-process
    python -m tests.helpers.eos_copier confluent BOOTSTRAP    # the child: confluent-kafka

The copier reads every partition of topic `in` (assigned, group `copy`, read_committed)
and for each poll sends every record's value upper-cased, with its key, to topic `out`
and the consumer's next offsets to the group, in one transaction of transactional id
`copier`. It prints `ready` once `init_transactions()` returned (the dead copier before
it is fenced and its open transaction aborted), `committed N` after each commit (N
records this life), and `done` once its positions reached the end of the input.

`KillLoop` (the parent): feeds `in`, runs copier lives, SIGKILLs each at a random moment
(mostly after `ready`, some while it starts), and after every kill checks, from its
own Broker over the same directory, the invariant a crash must keep: after
`complete_prepared()` (what the next open does), the records read_committed shows in
`out` are exactly the transformed input below the group's committed offsets, none twice
(both read as one snapshot: over the listener, the live broker may still be completing
the EndTxn a killed client sent just before it died).
After the last kill one more life runs to `done`, and the same check covers the whole
input; the last stable offsets are then at the high watermarks (no open transaction).
tests/clients/test_eos_kill_loop.py runs a bounded slice; tools/eos_kill_loop.py the long
run reported in docs/testing.md.
"""

from __future__ import annotations

import collections
import os
import random
import select
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field

ROOT_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
INPUT, OUTPUT, GROUP, TRANSACTIONAL_ID = "in", "out", "copy", "copier"
INPUT_PARTITIONS, OUTPUT_PARTITIONS = 2, 3
MAX_PER_TRANSACTION = 17
READY_TIMEOUT_S = 60.0
LIFE_TIMEOUT_S = 120.0


def transform(value: bytes) -> bytes:
    return value.upper()


def input_value(n: int) -> bytes:
    return b"record-%07d" % n


# ---- the child ---------------------------------------------------------------------------

def say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def copy_embedded(root: str) -> None:
    import logkit
    with logkit.Broker(root) as broker:
        producer = broker.producer(transactional_id=TRANSACTIONAL_ID, linger_ms=1)
        producer.init_transactions()          # fences the dead copier, aborts its txn
        consumer = broker.consumer(group_id=GROUP, isolation_level="read_committed",
                                   auto_offset_reset="earliest", enable_auto_commit=False)
        partitions = broker.topic(INPUT).partitions
        tps = [logkit.TopicPartition(INPUT, p.partition) for p in partitions]
        end = {tp: p.high_watermark for tp, p in zip(tps, partitions)}
        consumer.assign(tps)
        say("ready")
        copied = 0
        while True:
            records = consumer.poll(timeout_ms=20, max_records=MAX_PER_TRANSACTION)
            if not records:
                if all(consumer.position(tp) >= end[tp] for tp in tps):
                    break
                continue
            with producer.transaction():
                for r in records:
                    producer.send(OUTPUT, transform(r.value), key=r.key)
                producer.send_offsets_to_transaction(
                    {tp: consumer.position(tp) for tp in tps}, consumer.group_metadata())
            copied += len(records)
            say(f"committed {copied}")
        producer.close()
        consumer.close(autocommit=False)
    say("done")


def copy_confluent(bootstrap: str) -> None:
    import confluent_kafka as ck
    producer = ck.Producer({"bootstrap.servers": bootstrap, "linger.ms": 1,
                            "transactional.id": TRANSACTIONAL_ID})
    producer.init_transactions(30)
    consumer = ck.Consumer({"bootstrap.servers": bootstrap, "group.id": GROUP,
                            "isolation.level": "read_committed",
                            "auto.offset.reset": "earliest", "enable.auto.commit": False})
    count = len(consumer.list_topics(INPUT, timeout=30).topics[INPUT].partitions)
    tps = [ck.TopicPartition(INPUT, n) for n in range(count)]
    end = {n: consumer.get_watermark_offsets(tp, timeout=30)[1] for n, tp in enumerate(tps)}
    # librdkafka's position() is unset until a partition returns a message: keep our own
    next_offset = {tp.partition: max(tp.offset, 0)
                   for tp in consumer.committed(tps, timeout=30)}
    consumer.assign(tps)
    say("ready")
    copied = 0
    while True:
        messages = consumer.consume(num_messages=MAX_PER_TRANSACTION, timeout=0.05)
        for m in messages:
            if m.error() is not None:
                raise ck.KafkaException(m.error())
        if not messages:
            if all(next_offset[n] >= end[n] for n in end):
                break
            continue
        producer.begin_transaction()
        for m in messages:
            producer.produce(OUTPUT, transform(m.value()), m.key())
            next_offset[m.partition()] = m.offset() + 1
        producer.send_offsets_to_transaction(
            [ck.TopicPartition(INPUT, p, o) for p, o in sorted(next_offset.items())],
            consumer.consumer_group_metadata(), 30)
        producer.commit_transaction(30)
        copied += len(messages)
        say(f"committed {copied}")
    consumer.close()
    say("done")


# ---- the parent --------------------------------------------------------------------------

class Life:
    """One copier process, its stdout read line by line without blocking the caller."""

    def __init__(self, client: str, target: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.helpers.eos_copier", client, target],
            cwd=ROOT_DIR, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            env={**os.environ, "PYTHONPATH": ROOT_DIR})
        self.lines: list[str] = []
        self._buffer = b""

    def read(self, timeout_s: float) -> None:
        """Collect whatever the child printed within `timeout_s`."""
        fd = self.proc.stdout.fileno()
        ready, _, _ = select.select([fd], [], [], max(0.0, timeout_s))
        if not ready:
            return
        chunk = os.read(fd, 65536)
        if not chunk:
            self.proc.wait(timeout=LIFE_TIMEOUT_S)
            return
        self._buffer += chunk
        *whole, self._buffer = self._buffer.split(b"\n")
        self.lines += [line.decode() for line in whole]

    def wait_for(self, word: str, timeout_s: float) -> bool:
        """Whether the child printed `word` (False if it exited without it)."""
        deadline = time.monotonic() + timeout_s
        while word not in self.lines:
            if self.proc.poll() is not None:
                self.read(0.5)                     # the rest of its output
                return word in self.lines
            if time.monotonic() > deadline:
                raise AssertionError(f"the copier did not say {word!r} within "
                                     f"{timeout_s} s: {self.lines[-3:]}")
            self.read(deadline - time.monotonic())
        return True

    def run_for(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while self.proc.poll() is None and time.monotonic() < deadline:
            self.read(deadline - time.monotonic())

    def kill(self) -> bool:
        """SIGKILL; True if the child was still running."""
        alive = self.proc.poll() is None
        if alive:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=LIFE_TIMEOUT_S)
        self.read(0.0)
        return alive

    def errors(self) -> str:
        return self.proc.stderr.read().decode(errors="replace")[-2000:]

    @property
    def commits(self) -> int:
        return sum(line.startswith("committed") for line in self.lines)


@dataclass
class Outcome:
    """What a kill loop did, and what its check found."""

    client: str
    kills: int = 0
    kills_started: int = 0          # killed before `ready` (opening, init_transactions)
    kills_mid_stream: int = 0       # killed after at least one commit of its life
    lives: int = 0
    records: int = 0                # input records, each copied exactly once
    transactions: int = 0           # commits the lives reported
    checks: int = 0                 # per-kill checks of the invariant
    seconds: float = 0.0
    failures: list[str] = field(default_factory=list)

    def as_dict(self) -> dict:
        return dict(self.__dict__)


class KillLoop:
    """Runs copier lives over `root` (embedded) or over `broker`'s listener (confluent)
    and checks every state a kill leaves. `broker` is the parent's own open Broker over
    `root`, which also feeds the input."""

    def __init__(self, broker, client: str, target: str, *, seed: int = 33,
                 chunk_records: int = 400, max_delay_s: float = 0.3,
                 started_fraction: float = 0.1, check_every: int = 1,
                 log=None) -> None:
        self.broker, self.client, self.target = broker, client, target
        self.rng = random.Random(seed)
        self.chunk_records = chunk_records
        self.max_delay_s = max_delay_s
        self.started_fraction = started_fraction
        self.check_every = check_every
        self.log = log or (lambda text: None)
        self.fed = 0
        if INPUT not in broker.topics():
            broker.create_topic(INPUT, INPUT_PARTITIONS)
            broker.create_topic(OUTPUT, OUTPUT_PARTITIONS)
        self._feeder = broker.producer(acks="all", linger_ms=5)

    def feed(self, count: int) -> None:
        for n in range(self.fed, self.fed + count):
            self._feeder.send(INPUT, input_value(n), key=b"%d" % n)
        self._feeder.flush()
        self.fed += count

    def unconsumed(self) -> int:
        committed = self.broker.group(GROUP).committed()
        return sum(p.high_watermark - committed.get(_tp(INPUT, p.partition), 0)
                   for p in self.broker.topic(INPUT).partitions)

    def run(self, kills: int) -> Outcome:
        out = Outcome(self.client)
        started = time.monotonic()
        while out.kills < kills:
            if self.unconsumed() < self.chunk_records // 2:
                self.feed(self.chunk_records)
            life = Life(self.client, self.target)
            out.lives += 1
            if self.rng.random() < self.started_fraction:
                life.run_for(self.rng.uniform(0.0, 0.8))      # opening or initialising
                ready_first = "ready" in life.lines
            else:
                if not life.wait_for("ready", READY_TIMEOUT_S):
                    out.failures.append(f"life {out.lives} exited before ready: "
                                        f"{life.errors()}")
                    break
                life.run_for(self.rng.uniform(0.0, self.max_delay_s))
                ready_first = True
            if life.kill():
                out.kills += 1
                out.kills_started += not ready_first
                out.kills_mid_stream += life.commits > 0
            elif "done" not in life.lines:
                out.failures.append(f"life {out.lives} exited {life.proc.returncode}: "
                                    f"{life.errors()}")
                break
            out.transactions += life.commits
            if out.kills % self.check_every == 0 or out.kills == kills:
                out.checks += 1
                out.failures += self.check(final=False)
                if out.failures:
                    break
            if out.lives % 50 == 0:
                self.log(f"{out.kills} kills, {self.fed} records fed, "
                         f"{time.monotonic() - started:.0f} s")
        if not out.failures:
            life = Life(self.client, self.target)           # the last life: to the end
            out.lives += 1
            if not life.wait_for("done", LIFE_TIMEOUT_S):
                out.failures.append(f"the last life exited {life.proc.returncode} "
                                    f"without done: {life.errors()}")
            out.transactions += life.commits
            out.failures += self.check(final=True)
        out.records = self.fed
        out.seconds = round(time.monotonic() - started, 1)
        return out

    def _coordinator_view(self) -> tuple:
        import logkit
        try:
            [txn] = self.broker.transaction_coordinator.describe_transactions(
                [TRANSACTIONAL_ID])
        except logkit.TransactionalIdNotFoundError:        # no life got that far yet
            return "none", -1, -1, self.broker.group(GROUP).committed()
        return txn.state, txn.producer_epoch, txn.transaction_start_ms, \
            self.broker.group(GROUP).committed()

    def _snapshot(self) -> tuple[dict, collections.Counter]:
        """The group's committed offsets and the read_committed output, taken together.
        Over the listener the killed client's last requests may still be served (an
        EndTxn read before its socket closed is completed by the live broker): read
        until the coordinator's view is the same before and after the output and no
        transaction is between its phases."""
        deadline = time.monotonic() + LIFE_TIMEOUT_S
        while True:
            self.broker.transaction_coordinator.complete_prepared()
            before = self._coordinator_view()
            got: collections.Counter = collections.Counter()
            for p in self.broker.topic(OUTPUT).partitions:
                got.update(r.value for r in _read(p, p.log_end_offset, "read_committed"))
            if before == self._coordinator_view() and not before[0].startswith("Prepare"):
                return before[3], got
            if time.monotonic() > deadline:
                raise AssertionError(f"the coordinator did not settle: {before}")
            time.sleep(0.05)

    def check(self, *, final: bool) -> list[str]:
        """The invariant after a kill (see the module docstring); `final`: the whole
        input is copied and no transaction is open."""
        committed, got = self._snapshot()
        expected: collections.Counter = collections.Counter()
        failures = []
        for p in self.broker.topic(INPUT).partitions:
            upto = committed.get(_tp(INPUT, p.partition), 0)
            if final and upto != p.high_watermark:
                failures.append(f"{INPUT}-{p.partition}: committed {upto}, "
                                f"end {p.high_watermark}")
            expected.update(transform(r.value) for r in _read(p, upto, "read_committed"))
        for p in self.broker.topic(OUTPUT).partitions:
            if final and (p.last_stable_offset != p.high_watermark or p.open_transactions()):
                failures.append(f"{OUTPUT}-{p.partition}: LSO {p.last_stable_offset}, HW "
                                f"{p.high_watermark}, open {p.open_transactions()}")
        missing, extra = expected - got, got - expected
        if missing or extra:
            dup = [v for v, n in got.items() if n > 1]
            failures.append(f"read_committed output differs from the committed input: "
                            f"{sum(missing.values())} missing (e.g. {sorted(missing)[:3]}), "
                            f"{sum(extra.values())} extra (e.g. {sorted(extra)[:3]}), "
                            f"{len(dup)} twice (e.g. {dup[:3]})")
        return failures


def _tp(topic: str, partition: int):
    import logkit
    return logkit.TopicPartition(topic, partition)


def _read(partition, stop: int, isolation_level: str):
    offset = partition.log_start_offset
    while offset < stop:
        fetched = partition.fetch_records(offset, 5000, stop_offset=stop,
                                          isolation_level=isolation_level)
        yield from fetched.records
        if fetched.next_offset <= offset:
            return
        offset = fetched.next_offset


def main(argv: list[str]) -> int:
    client, target = argv
    if client == "embedded":
        copy_embedded(target)
    elif client == "confluent":
        copy_confluent(target)
    else:
        raise SystemExit(f"unknown client {client!r}: embedded or confluent")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
