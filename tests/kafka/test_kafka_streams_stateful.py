"""Issue 32: a stateful Kafka Streams application — a word count, a KTable over a
persistent store whose changelog topic is compacted, a repartition topic between the
split and the count (tools/kafka/src/StatefulStreams.java) — runs on logkit's listener
and on the real Kafka over the same lines, and the final count of every word is the same
on both, and the count a Python Counter gives. On logkit it runs in two lives: the first
counts the first part of the input and is killed (SIGKILL, once its group's committed
offsets show all of it committed: at least once, a kill before that would count some
lines twice); its local state directory is deleted and its changelog cleaned
(`p.compact()`: each word's last count left, with gaps between); the second starts on
an empty directory, restores the store from the cleaned changelog (it says how many
records it read back: one per word) and counts the rest on top."""

from __future__ import annotations

import shutil
import signal
import struct
import subprocess
import time
from collections import Counter

import pytest

import logkit
from tests.helpers.kafka import compile_java, create_topics, java_command, skip_reason
from tests.helpers.kafka_ecosystem import kafka_rows, unique, wait_for

pytestmark = pytest.mark.skipif(skip_reason() is not None, reason=str(skip_reason()))
pytest.importorskip("confluent_kafka")

# A short-lived JVM on two busy cores: the C1 compiler only, and one GC thread.
FAST_START = ["-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC"]
PARTITIONS = 2
FIRST, SECOND = 300, 150          # lines in each life on logkit
WORDS = ("alpha bravo charlie delta echo foxtrot golf hotel india juliett kilo lima "
         "mike november oscar papa quebec romeo sierra tango").split()
STAMP_MS = int(time.time() * 1000) - 3_600_000    # inside Kafka's retention and clock skew
BUDGET_S = 115.0                 # the whole test: three Streams lives, both brokers


class _Budget:
    """What is left of the test's time, for each wait and child in turn."""

    def __init__(self, seconds: float) -> None:
        self.deadline = time.monotonic() + seconds

    def left(self) -> float:
        return max(self.deadline - time.monotonic(), 0.1)


def _line(n: int) -> str:
    words = [WORDS[(n * 7 + i * i) % len(WORDS)] for i in range(1 + n % 6)]
    return " ".join(words) + ("  " if n % 9 == 0 else "")


def _words(first: int, count: int) -> list[str]:
    return [w for n in range(first, first + count) for w in _line(n).split()]


def _create(bootstrap: str, *topics: str) -> None:
    from confluent_kafka.admin import NewTopic
    create_topics(bootstrap, [NewTopic(t, PARTITIONS, 1) for t in topics])


def _produce(bootstrap: str, topic: str, first: int, count: int) -> None:
    from confluent_kafka import Producer
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for n in range(first, first + count):
        producer.produce(topic, _line(n).encode(), b"line-%d" % n, timestamp=STAMP_MS + n)
    assert producer.flush(30) == 0


def _command(bootstrap: str, application: str, source: str, sink: str, updates: int,
             state_dir, *hold: str) -> list[str]:
    command = java_command("StatefulStreams", bootstrap, application, source, sink,
                           str(updates), str(state_dir), *hold,
                           extra_classpath=compile_java("StatefulStreams"))
    command[2:2] = FAST_START
    return command


def _restored(stdout: str) -> int:
    restored = [int(line.split()[1]) for line in stdout.splitlines()
                if line.startswith("restored ")]
    assert len(restored) == 1, stdout
    return restored[0]


def _repartition_topic(broker) -> str:
    """The topic Streams made between the split and the count."""
    names = [t for t in broker.topics() if t.startswith("wordcount-")
             and t.endswith("-repartition")]
    assert len(names) == 1, broker.topics()
    return names[0]


def _run(budget: _Budget, *args) -> int:
    """One life of the word count until it wrote `updates` count updates and closed;
    returns the records it restored from its changelog at start."""
    proc = subprocess.run(_command(*args), capture_output=True, text=True,
                          timeout=budget.left(), stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-4000:]}"
    return _restored(proc.stdout)


def _run_and_kill(budget: _Budget, broker, tmp_path, *args) -> int:
    """One life that counts `updates` updates, then is killed with SIGKILL once its
    group ("wordcount") has committed every partition it reads to its end; returns the
    records it restored at start."""
    out_path = tmp_path / "streams-held.out"
    with open(out_path, "wb") as out:
        proc = subprocess.Popen(_command(*args, "hold"), stdout=out,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        def counted():
            if proc.poll() is not None:
                raise AssertionError(f"Streams exited {proc.returncode}:\n"
                                     + out_path.read_text()[-4000:])
            return "counted" in out_path.read_text()
        wait_for(counted, "the first life's count updates", timeout_s=budget.left())

        def committed_to_the_ends():
            committed = broker.group("wordcount").committed()
            ends = {(tp.topic, tp.partition): broker.topic(tp.topic)
                    .partition(tp.partition).high_watermark for tp in committed}
            read = {(topic, p) for topic in ("lines", _repartition_topic(broker))
                    for p in range(PARTITIONS)}
            return set(ends) >= read and all(ends[(tp.topic, tp.partition)] == offset
                                             for tp, offset in committed.items())
        wait_for(committed_to_the_ends, "the group's commits at the ends",
                 timeout_s=budget.left())
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
    assert proc.returncode == -signal.SIGKILL
    return _restored(out_path.read_text())


def _final_counts(bootstrap: str, sink: str) -> dict[str, int]:
    """Each word's last count update in the output topic (a word's updates stay in one
    partition, in order)."""
    counts = {}
    for rows in kafka_rows(bootstrap, sink).values():
        for _, (key, value, _, _) in rows:
            counts[key.decode()] = struct.unpack(">q", value)[0]
    return counts


def test_a_stateful_word_count_gives_the_same_counts_on_logkit_as_on_kafka_and_restores(
        kafka, tmp_path):
    budget = _Budget(BUDGET_S)
    expected = Counter(_words(0, FIRST + SECOND))
    # Kafka: one life over all the input
    application, source, sink = unique("wordcount"), unique("lines"), unique("counts")
    _create(kafka.bootstrap_servers, source, sink)
    _produce(kafka.bootstrap_servers, source, 0, FIRST + SECOND)
    began = time.monotonic()
    assert _run(budget, kafka.bootstrap_servers, application, source, sink,
                len(_words(0, FIRST + SECOND)), tmp_path / "state-kafka") == 0
    kafka_s = time.monotonic() - began
    on_kafka = _final_counts(kafka.bootstrap_servers, sink)
    assert on_kafka == expected

    with logkit.Broker(tmp_path / "data") as broker, broker.serve() as server:
        bootstrap = server.bootstrap_servers
        _create(bootstrap, "lines", "counts")
        state = tmp_path / "state-logkit"
        _produce(bootstrap, "lines", 0, FIRST)
        began = time.monotonic()
        restored = _run_and_kill(budget, broker, tmp_path, bootstrap, "wordcount", "lines",
                                 "counts", len(_words(0, FIRST)), state)
        first_s = time.monotonic() - began
        assert restored == 0
        assert _final_counts(bootstrap, "counts") == Counter(_words(0, FIRST))

        changelog = broker.topic("wordcount-counts-changelog")
        assert changelog.config["cleanup.policy"] == "compact"
        assert broker.topic(_repartition_topic(broker)).config["cleanup.policy"] == "delete"

        shutil.rmtree(state)        # the local store is gone: only the changelog has it
        # and the changelog is cleaned first: each word's last count, with gaps between
        updates = kept = 0
        for partition in changelog.partitions:
            partition.roll()
            report = partition.compact()
            updates += report.records_before
            kept += report.records_after
        assert updates == len(_words(0, FIRST)) and kept == len(Counter(_words(0, FIRST)))
        _produce(bootstrap, "lines", FIRST, SECOND)
        began = time.monotonic()
        restored = _run(budget, bootstrap, "wordcount", "lines", "counts",
                        len(_words(FIRST, SECOND)), state)
        second_s = time.monotonic() - began
        # the store read back exactly what the cleaning kept, and counted on from there
        assert restored == kept
        assert _final_counts(bootstrap, "counts") == expected == on_kafka
    # the figures docs/kafka.md quotes (pytest -s shows them)
    print(f"\nword count on Kafka: {kafka_s:.1f} s; on logkit: {first_s:.1f} s, then "
          f"{second_s:.1f} s restoring {restored} changelog records (of {updates})")
