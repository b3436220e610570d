"""Issue 32: Kafka Connect in distributed mode (Kafka 4's own ConnectDistributed, one
worker) on logkit's listener. The worker creates its config, offset and status topics
compacted (it refuses to start on topics that are not: it reads their cleanup.policy
back through DescribeConfigs) and joins its group with Connect's own group protocol;
FileStreamSource → a topic → FileStreamSink are created through the REST API, and a
file comes out whole. The worker is stopped, every partition of its three topics is
rolled and cleaned, more lines are appended, and a new worker on the same group starts
its connectors from the config topic and resumes the source from its offsets topic:
the sink's file equals the source's, byte for byte, and the topic holds each line once."""

from __future__ import annotations

import json
import signal
import subprocess
import time
import urllib.error
import urllib.request

import pytest

import logkit
from tests.helpers.kafka import free_port, java_command, skip_reason
from tests.helpers.kafka_ecosystem import wait_for

pytestmark = pytest.mark.skipif(skip_reason() is not None, reason=str(skip_reason()))

LINES = 4000
BUDGET_S = 85.0                     # the whole test, both workers' starts included
# A short-lived JVM on two busy cores: the C1 compiler only, and one GC thread.
FAST_START = ["-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC"]
INTERNAL = {"config.storage.topic": "connect-configs",
            "offset.storage.topic": "connect-offsets",
            "status.storage.topic": "connect-status"}


def _lines(first, count):
    # ASCII only: FileStreamSource keeps its position as a count of characters
    # (docs/kafka.md, Kafka Connect standalone)
    return "".join(f"line {n}\t{'~!' * (n % 5)}{'x' * (n % 97)}\n"
                   for n in range(first, first + count))


def _worker_config(tmp, bootstrap, port):
    path = tmp / "worker.properties"
    settings = {
        "bootstrap.servers": bootstrap,
        "group.id": "connect-cluster",
        "key.converter": "org.apache.kafka.connect.storage.StringConverter",
        "value.converter": "org.apache.kafka.connect.storage.StringConverter",
        **INTERNAL,
        "config.storage.replication.factor": 1,
        "offset.storage.replication.factor": 1,
        "status.storage.replication.factor": 1,
        "offset.storage.partitions": 3,
        "status.storage.partitions": 1,
        "offset.flush.interval.ms": 500,
        "listeners": f"http://127.0.0.1:{port}",
        "rest.advertised.host.name": "127.0.0.1",
        "rest.advertised.port": port,
        # one worker: nothing to wait for when it comes back
        "scheduled.rebalance.max.delay.ms": 0,
        "consumer.auto.offset.reset": "earliest",
    }
    path.write_text("".join(f"{k}={v}\n" for k, v in settings.items()))
    return path


class _Worker:
    """One ConnectDistributed JVM and its REST API; stop() is a graceful SIGTERM (the
    source's offsets flushed, the sink's committed, the group left)."""

    def __init__(self, tmp, config, port):
        self.log_path = tmp / "connect.log"
        self.log = open(self.log_path, "ab")
        command = java_command("org.apache.kafka.connect.cli.ConnectDistributed",
                               str(config), heap="-Xmx256m")
        command[2:2] = FAST_START
        self.proc = subprocess.Popen(command, stdout=self.log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL)
        self.url = f"http://127.0.0.1:{port}"

    def alive(self):
        if self.proc.poll() is not None:
            raise AssertionError(f"Connect exited {self.proc.returncode}:\n"
                                 + self.log_path.read_text()[-6000:])
        return True

    def request(self, method, path, body=None):
        """The REST answer as JSON, or None while the worker does not answer yet."""
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.url + path, data=data, method=method,
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return json.loads(response.read() or b"null")
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            self.alive()
            return None

    def running(self, connector):
        """True when the connector and its one task run (the status topic says so)."""
        status = self.request("GET", f"/connectors/{connector}/status")
        return bool(status) and status["connector"]["state"] == "RUNNING" and \
            [t["state"] for t in status["tasks"]] == ["RUNNING"]

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


def test_connect_distributed_runs_on_logkit_and_resumes_from_its_compacted_topics(tmp_path):
    topic = "lines"
    first, second = _lines(0, LINES // 2), _lines(LINES // 2, LINES // 2)
    source, sink = tmp_path / "in.txt", tmp_path / "out.txt"
    source.write_text(first, encoding="utf-8")
    port = free_port()
    deadline = time.monotonic() + BUDGET_S

    def left():
        return max(deadline - time.monotonic(), 0.0)

    with logkit.Broker(tmp_path / "data") as broker, broker.serve() as server:
        broker.create_topic(topic, 1)
        config = _worker_config(tmp_path, server.bootstrap_servers, port)
        worker = _Worker(tmp_path, config, port)
        try:
            wait_for(lambda: worker.alive() and worker.request("GET", "/connectors")
                     is not None, "Connect's REST API", timeout_s=left(), interval_s=0.2)
            for name, connector, setting in (
                    ("file-source", "FileStreamSourceConnector", {"file": str(source),
                                                                  "topic": topic}),
                    ("file-sink", "FileStreamSinkConnector", {"file": str(sink),
                                                              "topics": topic})):
                created = worker.request("POST", "/connectors", {"name": name, "config": {
                    "connector.class": f"org.apache.kafka.connect.file.{connector}",
                    "tasks.max": "1", **setting}})
                assert created is not None and created["name"] == name
            wait_for(lambda: worker.alive() and _line_count(sink) >= LINES // 2,
                     "the first half in the sink's file", timeout_s=left())
            assert worker.running("file-source") and worker.running("file-sink")
        finally:
            worker.stop()

        # the worker made its topics compacted; clean them before it comes back
        cleaned = 0
        for name in INTERNAL.values():
            t = broker.topic(name)
            assert t.config["cleanup.policy"] == "compact", name
            for partition in t.partitions:
                if partition.high_watermark:
                    partition.roll()
                    report = partition.compact()
                    cleaned += report.records_before - report.records_after
        assert cleaned > 0            # the status and offset topics repeat their keys
        assert len(broker.topic("connect-configs").partitions) == 1

        with open(source, "a", encoding="utf-8") as f:
            f.write(second)
        worker = _Worker(tmp_path, config, port)
        try:
            wait_for(lambda: worker.alive() and _line_count(sink) >= LINES,
                     "all lines in the sink's file", timeout_s=left())
            assert sorted(worker.request("GET", "/connectors")) == ["file-sink", "file-source"]
        finally:
            worker.stop()
        assert sink.read_bytes() == (first + second).encode("utf-8")
        assert broker.topic(topic).partition(0).high_watermark == LINES
