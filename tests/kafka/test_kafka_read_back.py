"""logkit reads Apache Kafka's bytes: the Java producer (tools/kafka/src/ShapesProducer.java)
writes known records into the real Kafka — plain, each codec, idempotent, and enough to
roll a segment — then Kafka is stopped (a clean shutdown, its files as it leaves them)
and logkit reads the partition directories it wrote, record for record: through
`logkit.iter_segment_batches` (the Python way: a segment file on its own, no broker) and
through `logkit dump --records` (the CLI)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import logkit
from logkit.compression import codec_id
from tests.helpers.kafka import create_topics, run_java, skip_reason

pytestmark = [
    pytest.mark.skipif(skip_reason() is not None, reason=str(skip_reason())),
    pytest.mark.skipif(shutil.which("javac") is None,
                       reason="javac is not installed (the Java producer is compiled here)"),
]

BASE_TIMESTAMP_MS = 1_700_000_000_000        # ShapesProducer.BASE_TIMESTAMP_MS
# topic -> (compression.type, enable.idempotence, records)
TOPICS = {
    "rb-plain": ("none", False, 300),
    "rb-idempotent": ("none", True, 300),
    "rb-gzip": ("gzip", True, 300),
    "rb-snappy": ("snappy", True, 300),
    "rb-lz4": ("lz4", True, 300),
    "rb-zstd": ("zstd", False, 300),
    # past Kafka's smallest segment.bytes (1 MiB), so the broker rolls a segment
    "rb-rolled": ("none", True, 24_000),
}
ROLLED_SEGMENT_BYTES = 1_048_576


def expected(topic: str, i: int) -> tuple:
    """Record i as ShapesProducer wrote it: (offset, timestamp, key, value, headers)."""
    key = None if i % 5 == 0 else b"key-%d" % (i % 23)
    value = None if i % 17 == 16 else f"{topic} {i} {'x' * (i % 20)}".encode()
    headers = [] if i % 3 == 0 else [("trace", b"t%d" % i), ("n", b"")]
    return (i, BASE_TIMESTAMP_MS + i, key, value, headers)


@pytest.fixture(scope="module")
def kafka_dirs(kafka, tmp_path_factory) -> dict[str, Path]:
    """Each topic's partition directory, copied while the broker was stopped."""
    from confluent_kafka.admin import NewTopic
    # retention.ms -1: the records' fixed timestamps are years old, and Kafka's retention
    # pass (every 5 min, from 30 s after start) would otherwise delete them under the test
    config = {"segment.bytes": str(ROLLED_SEGMENT_BYTES), "retention.ms": "-1"}
    create_topics(kafka.bootstrap_servers, [NewTopic(t, 1, 1, config=config) for t in TOPICS])
    specs = [f"{t}:{codec}:{str(idem).lower()}:{n}" for t, (codec, idem, n) in TOPICS.items()]
    out = run_java("ShapesProducer", kafka.bootstrap_servers, *specs).stdout
    for topic, (_, _, count) in TOPICS.items():
        assert f"produced {topic} {count} last offset {count - 1}" in out, out
    root = tmp_path_factory.mktemp("kafka-read-back")
    with kafka.stopped():
        for topic in TOPICS:
            shutil.copytree(kafka.partition_dir(topic, 0), root / f"{topic}-0")
    return {topic: root / f"{topic}-0" for topic in TOPICS}


def segments(directory: Path) -> list[Path]:
    return sorted(directory.glob("*.log"))


def read_partition_directory(directory: Path) -> list[logkit.SegmentBatch]:
    """The documented way to read a bare Kafka partition directory with logkit: each
    segment file, oldest first, through logkit.iter_segment_batches."""
    return [batch for segment in segments(directory)
            for batch in logkit.iter_segment_batches(segment, decode=True)]


@pytest.mark.parametrize("topic", TOPICS)
def test_logkit_reads_every_record_the_java_producer_wrote(kafka_dirs, topic):
    batches = read_partition_directory(kafka_dirs[topic])
    got = [(r.offset, r.timestamp, r.key, r.value, list(r.headers))
           for b in batches for r in b.records]
    assert got == [expected(topic, i) for i in range(TOPICS[topic][2])]


@pytest.mark.parametrize("topic", TOPICS)
def test_the_batch_headers_carry_the_producers_codec_and_idempotence(kafka_dirs, topic):
    codec, idempotent, _ = TOPICS[topic]
    batches = read_partition_directory(kafka_dirs[topic])
    assert len(batches) > 1                    # the producer's batch.size split them
    producer_ids = {b.header.producer_id for b in batches}
    for b in batches:
        assert b.header.magic == 2
        assert b.header.attributes & 0x07 == codec_id(None if codec == "none" else codec)
        assert not b.header.is_control
        if idempotent:                         # one producer session from offset 0
            assert b.header.base_sequence == b.header.base_offset
            assert b.header.producer_epoch >= 0
        else:
            assert (b.header.producer_id, b.header.base_sequence) == (-1, -1)
    assert len(producer_ids) == 1 and (min(producer_ids) >= 0) == idempotent


def test_a_segment_kafka_rolled_reads_on_from_the_next(kafka_dirs):
    files = segments(kafka_dirs["rb-rolled"])
    assert len(files) >= 2
    first_of_each = [next(logkit.iter_segment_batches(f)).header.base_offset for f in files]
    assert first_of_each == [int(f.stem) for f in files]


def show(data: bytes | None) -> str:
    return "null" if data is None else repr(data)


@pytest.mark.parametrize("topic", ["rb-plain", "rb-zstd", "rb-idempotent", "rb-rolled"])
def test_logkit_dump_prints_the_records_of_kafkas_segments(kafka_dirs, topic):
    want = [expected(topic, i) for i in range(TOPICS[topic][2])]
    lines = []
    for segment in segments(kafka_dirs[topic]):
        proc = subprocess.run([sys.executable, "-m", "logkit.cli", "dump", "--records",
                               str(segment)], capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
        out = proc.stdout.splitlines()
        assert out[-1].endswith(f"{segment.stat().st_size} bytes: all CRCs valid")
        lines += [line for line in out if line.startswith("| ")]
    assert lines == [f"| offset: {o} timestamp: {ts} key: {show(k)} value: {show(v)}"
                     + (f" headers: {h}" if h else "") for o, ts, k, v, h in want]
