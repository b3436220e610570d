"""Issue 31 section 5: Kafka Connect standalone (Kafka 4's own ConnectStandalone, with
connect-file's FileStreamSource and FileStreamSink) on logkit's listener. A 10,000-line
file goes FileStreamSource → a logkit topic → FileStreamSink and comes out byte for
byte; the worker is stopped halfway and started again on the same offsets file and
group, and resumes without a duplicate line."""

from __future__ import annotations

import signal
import subprocess

import pytest

import logkit
from tests.helpers.kafka import free_port, java_command, skip_reason
from tests.helpers.kafka_ecosystem import wait_for

pytestmark = pytest.mark.skipif(skip_reason() is not None, reason=str(skip_reason()))

LINES = 10_000
# A short-lived JVM on two busy cores: the C1 compiler only, and one GC thread.
FAST_START = ["-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC"]


def _lines(first, count):
    # varied lengths, tabs and punctuation, ASCII only: FileStreamSource keeps its
    # position as a count of characters and resumes by skipping that many bytes, so a
    # multi-byte UTF-8 line before the stop makes it resume early (docs/kafka.md)
    return "".join(f"line {n}\t{'~!' * (n % 5)}{'x' * (n % 97)}\n"
                   for n in range(first, first + count))


def _write_configs(tmp, bootstrap, topic):
    worker = tmp / "worker.properties"
    worker.write_text(
        f"bootstrap.servers={bootstrap}\n"
        "key.converter=org.apache.kafka.connect.storage.StringConverter\n"
        "value.converter=org.apache.kafka.connect.storage.StringConverter\n"
        f"offset.storage.file.filename={tmp / 'connect.offsets'}\n"
        "offset.flush.interval.ms=1000\n"
        f"listeners=http://127.0.0.1:{free_port()}\n"
        # the sink's consumer: start at the topic's beginning the first time
        "consumer.auto.offset.reset=earliest\n")
    source = tmp / "source.properties"
    source.write_text("name=file-source\n"
                      "connector.class=org.apache.kafka.connect.file.FileStreamSourceConnector\n"
                      f"tasks.max=1\nfile={tmp / 'in.txt'}\ntopic={topic}\n")
    sink = tmp / "sink.properties"
    sink.write_text("name=file-sink\n"
                    "connector.class=org.apache.kafka.connect.file.FileStreamSinkConnector\n"
                    f"tasks.max=1\nfile={tmp / 'out.txt'}\ntopics={topic}\n")
    return worker, source, sink


class _Worker:
    """One ConnectStandalone JVM; stop() is a graceful SIGTERM (offsets committed)."""

    def __init__(self, tmp, configs):
        self.log = open(tmp / "connect.log", "ab")
        command = java_command("org.apache.kafka.connect.cli.ConnectStandalone",
                               *map(str, configs), heap="-Xmx256m")
        command[2:2] = FAST_START
        self.proc = subprocess.Popen(command, stdout=self.log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL)
        self.tmp = tmp

    def alive(self):
        if self.proc.poll() is not None:
            raise AssertionError(f"Connect exited {self.proc.returncode}:\n"
                                 + (self.tmp / "connect.log").read_text()[-4000:])
        return True

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.log.close()


def _line_count(path):
    return path.read_bytes().count(b"\n") if path.exists() else 0


def test_connect_file_source_and_sink_copy_a_file_through_logkit_byte_for_byte(tmp_path):
    """Half the file, a graceful stop, the other half appended, a restart: the sink's
    file equals the source's, byte for byte (no line lost, none twice), and the topic
    holds each line once."""
    topic = "lines"
    first, second = _lines(0, LINES // 2), _lines(LINES // 2, LINES // 2)
    (tmp_path / "in.txt").write_text(first, encoding="utf-8")
    with logkit.Broker(tmp_path / "data") as broker, broker.serve() as server:
        broker.create_topic(topic, 1)
        configs = _write_configs(tmp_path, server.bootstrap_servers, topic)
        worker = _Worker(tmp_path, configs)
        try:
            wait_for(lambda: worker.alive() and
                     _line_count(tmp_path / "out.txt") >= LINES // 2,
                     "the first half in the sink's file", timeout_s=90)
        finally:
            worker.stop()
        with open(tmp_path / "in.txt", "a", encoding="utf-8") as f:
            f.write(second)
        worker = _Worker(tmp_path, configs)
        try:
            wait_for(lambda: worker.alive() and _line_count(tmp_path / "out.txt") >= LINES,
                     "all lines in the sink's file", timeout_s=90)
        finally:
            worker.stop()
        assert (tmp_path / "out.txt").read_bytes() == (first + second).encode("utf-8")
        partition = broker.topic(topic).partition(0)
        assert partition.high_watermark == LINES
        assert partition.read(LINES - 1, max_records=1)[0].value == \
            _lines(LINES - 1, 1).rstrip("\n").encode()
