"""`logkit serve DIR --port N` in the foreground of its own process: a Kafka client
produces through it, SIGTERM makes it close the broker and exit 0, and the records are
then in the directory for the embedded API."""

import signal
import subprocess
import sys

import pytest

import logkit
from logkit import cli


def _has_serve():
    return any(c.name == "serve" for c in getattr(cli, "COMMANDS", []))


@pytest.mark.skipif(not _has_serve(), reason="this cli.py has no serve command yet")
def test_logkit_serve_takes_kafka_clients_and_exits_0_on_sigterm(tmp_path):
    kafka = pytest.importorskip("kafka")
    directory = tmp_path / "data"
    process = subprocess.Popen([sys.executable, "-m", "logkit.cli", "serve", str(directory),
                                "--port", "0"], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    try:
        line = process.stdout.readline()
        address = line.strip().rsplit(" ", 1)[-1]
        assert address.startswith("127.0.0.1:"), line
        producer = kafka.KafkaProducer(bootstrap_servers=address)
        producer.send("served", key=b"k", value=b"through the CLI").get(timeout=20)
        producer.close()
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0
    finally:
        if process.poll() is None:
            process.kill()
    with logkit.Broker(directory) as broker:
        records = broker.topic("served").partition(0).read(0)
        assert [(r.key, r.value) for r in records] == [(b"k", b"through the CLI")]


@pytest.mark.skipif(not any(c.name == "mirror" for c in getattr(cli, "COMMANDS", [])),
                    reason="this cli.py has no mirror command yet")
def test_logkit_mirror_copies_to_a_listener_and_resumes(tmp_path, capsys):
    pytest.importorskip("confluent_kafka")
    with logkit.Broker(tmp_path / "src") as source:
        source.create_topic("orders", 2)
        source.topic("orders").partition(1).append([(b"k", b"v", None, None)] * 3)
    with logkit.Broker(tmp_path / "dst") as target, target.serve() as server:
        argv = ["mirror", str(tmp_path / "src"), "--to", server.bootstrap_servers]
        assert cli.main(argv) == 0
        assert "orders: 3 record(s) copied" in capsys.readouterr().out
        assert cli.main(argv) == 0
        assert "orders: 0 record(s) copied" in capsys.readouterr().out
        assert target.topic("orders").partition(1).high_watermark == 3
        assert cli.main(argv + ["--client-config", "nonsense"]) == 2


@pytest.mark.skipif(not _has_serve(), reason="this cli.py has no serve command yet")
def test_logkit_serve_takes_broker_settings(tmp_path):
    """--config num.partitions=3 reaches the broker: an auto-created topic gets 3."""
    kafka = pytest.importorskip("kafka")
    directory = tmp_path / "data"
    process = subprocess.Popen([sys.executable, "-m", "logkit.cli", "serve", str(directory),
                                "--port", "0", "--config", "num.partitions=3"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        address = process.stdout.readline().strip().rsplit(" ", 1)[-1]
        producer = kafka.KafkaProducer(bootstrap_servers=address)
        producer.send("auto", b"x").get(timeout=20)
        assert len(producer.partitions_for("auto")) == 3
        producer.close()
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0
    finally:
        if process.poll() is None:
            process.kill()
