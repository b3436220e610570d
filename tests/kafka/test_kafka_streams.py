"""Issue 31 section 5: a stateless Kafka Streams topology (filter and mapValues, at
least once; tools/kafka/src/StatelessStreams.java) run by Kafka 4's own Streams library
gives the same output topic on logkit's listener as on the real Kafka: the same
records, in the same partitions, in the same order per input partition, with the same
timestamps.
(Stateful topologies need compacted changelog topics: the compaction issue's check.)"""

from __future__ import annotations

import subprocess
import time

import pytest

import logkit
from tests.helpers.kafka import compile_java, create_topics, java_command, skip_reason
from tests.helpers.kafka_ecosystem import kafka_rows, unique, without_offsets

pytestmark = pytest.mark.skipif(skip_reason() is not None, reason=str(skip_reason()))
pytest.importorskip("confluent_kafka")

RECORDS = 3000
# A short-lived JVM on two busy cores: the C1 compiler only, and one GC thread.
FAST_START = ["-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC"]
PARTITIONS = 3
STAMP_MS = int(time.time() * 1000) - 3_600_000    # inside Kafka's retention and clock skew


def _input(n):
    key = f"k{n % 17}"
    value = f"drop-{n}" if n % 5 == 0 else f"value-{n}"
    return key, value


def _produce(bootstrap, source, sink):
    """The same topics and input records on either broker, through the same client."""
    from confluent_kafka import Producer
    from confluent_kafka.admin import NewTopic
    create_topics(bootstrap, [NewTopic(source, PARTITIONS, 1), NewTopic(sink, PARTITIONS, 1)])
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for n in range(RECORDS):
        key, value = _input(n)
        producer.produce(source, value.encode(), key.encode(), partition=n % PARTITIONS,
                         timestamp=STAMP_MS + n)
    assert producer.flush(30) == 0


def _run_topology(bootstrap, tmp_path, name):
    source, sink = unique("streams-in"), unique("streams-out")
    _produce(bootstrap, source, sink)
    began = time.monotonic()
    command = java_command("StatelessStreams", bootstrap, unique("app"), source, sink,
                           str(RECORDS), str(tmp_path / f"state-{name}"),
                           extra_classpath=compile_java("StatelessStreams"))
    command[2:2] = FAST_START
    proc = subprocess.run(command, capture_output=True, text=True, timeout=180,
                          stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-4000:]}"
    seconds = time.monotonic() - began
    return without_offsets(kafka_rows(bootstrap, sink)), seconds, proc.stdout


def test_a_stateless_streams_topology_gives_the_same_output_on_logkit_as_on_kafka(
        kafka, tmp_path):
    on_kafka, kafka_s, kafka_out = _run_topology(kafka.bootstrap_servers, tmp_path, "kafka")
    with logkit.Broker(tmp_path / "data") as broker, broker.serve() as server:
        on_logkit, logkit_s, logkit_out = _run_topology(server.bootstrap_servers, tmp_path,
                                                        "logkit")
    # the figures docs/kafka.md quotes (pytest -s shows them)
    print(f"\nStreams on Kafka: {kafka_s:.1f} s ({kafka_out.strip()}); "
          f"on logkit: {logkit_s:.1f} s ({logkit_out.strip()})")
    kept = [n for n in range(RECORDS) if n % 5]
    assert sum(len(rows) for rows in on_kafka.values()) == len(kept)
    expected = sorted((_input(n)[0].encode(),
                       f"{_input(n)[1].upper()}|{_input(n)[0]}".encode()) for n in kept)
    assert sorted((k, v) for rows in on_kafka.values() for k, v, _, _ in rows) == expected
    # An output partition interleaves the input partitions' tasks as they happen to run;
    # what Streams orders is each input partition's records: compare those sequences.
    assert _by_origin(on_logkit) == _by_origin(on_kafka)


def _by_origin(output):
    """{(output partition, input partition): [rows in output order]}; the input
    partition is n % PARTITIONS, n read back from the value."""
    out = {}
    for partition, rows in output.items():
        for row in rows:
            n = int(row[1].split(b"|")[0].split(b"-")[1])
            out.setdefault((partition, n % PARTITIONS), []).append(row)
    return out
