"""logkit beside Apache Kafka itself: the same tools, the same records, one run.

Owns `python -m benchmarks.kafka` and benchmarks/kafka.json. Two servers run side by
side on 127.0.0.1 for the whole run: `logkit serve` in a child process over a fresh
directory (tests/helpers/kafka_tools.LogkitServe) and a single-node KRaft Apache Kafka
(tests/helpers/kafka.KafkaBroker, the broker the Kafka tests start, from `make kafka`'s
classpath). Every workload is Kafka's own tool, run the same way at both, the two runs
back to back (which goes first alternates), three rounds in the full form with the median
kept, so the machine's load falls on both alike:

  produce      kafka-producer-perf-test (the Java producer with Kafka 4's defaults:
               idempotent, linger.ms 5, batch.size 16384; acks as the case says),
               record sizes 100 B and 1 KiB x 1 and 6 partitions x acks 1 and all
  consume      kafka-consumer-perf-test over what the acks=1 case wrote
  latency      the end-to-end latency tool (a send, then a poll that returns it), 100 B,
               1 partition, acks 1 and all: p50 and p99 in ms (the tool prints whole ms)
  embedded     logkit's in-process `producer.send` (unkeyed, as the perf test sends;
               linger_ms 5, batch_size 16384, the case's acks) beside the Java producer
               into Kafka (the produce case's Kafka figure)
  ready        process start -> the first Metadata answer that lists a broker, on a
               fresh directory (Kafka's includes `kafka-storage format`, which a new
               Kafka needs) and again on the same directory after a clean stop
  RSS          each server process's resident set after the workloads (and split into
               anonymous memory and mapped files' pages), and its peak

Ratios are logkit ÷ Kafka for rates and Kafka ÷ logkit for times and memory, so > 1
always means logkit does better. `--quick` runs one case of each (100 B, 1 partition,
acks=all) with few records, well under a minute after Kafka's start; the full form is
the one whose JSON is committed. Invariant: both servers' directories are temporary
and removed at the end, and both processes are stopped whatever fails.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

from tests.helpers.kafka import KafkaBroker, run_tool, skip_reason
from tests.helpers.kafka_tools import (LogkitServe, parse_consumer_perf, parse_e2e_latency,
                                       parse_producer_perf, rss_mb)

KAFKA_VERSION = "4.3.1"        # tools/kafka/pom.xml's kafka.version
JSON_PATH = Path(__file__).with_name("kafka.json")
READY_TIMEOUT_S = 90.0
RUN_TIMEOUT_S = 600.0

# issue 31's goals, as (figure, comparison, goal): each ratio is "> 1 is logkit better"
GOALS = {
    "produce_vs_kafka": 1.0,          # kafka-producer-perf-test into logkit ÷ into Kafka
    "consume_vs_kafka": 1.0,          # kafka-consumer-perf-test from logkit ÷ from Kafka
    "latency_vs_kafka": 1.0,          # Kafka's p50 / p99 ÷ logkit's (≤ Kafka's)
    "embedded_vs_kafka": 3.0,         # producer.send ÷ the Java producer into Kafka
    "ready_vs_kafka": 10.0,           # Kafka's start-up ÷ logkit's (≤ 1/10)
    "rss_vs_kafka": 4.0,              # Kafka's RSS ÷ logkit's (≤ 1/4)
}


class Plan:
    """Which cases run and how many records each."""

    def __init__(self, quick: bool) -> None:
        self.quick = quick
        self.sizes = (100,) if quick else (100, 1024)
        self.partitions = (1,) if quick else (1, 6)
        self.acks = ("all",) if quick else ("1", "all")
        self.latency_acks = ("all",) if quick else ("1", "all")
        self.records = {100: 20_000, 1024: 5_000} if quick else {100: 300_000, 1024: 100_000}
        self.latency_records = 300 if quick else 3_000
        self.restart = not quick
        self.repeats = 1 if quick else 3

    def as_dict(self) -> dict[str, Any]:
        return {"quick": self.quick, "sizes": self.sizes, "partitions": self.partitions,
                "acks": self.acks, "records": self.records,
                "latency_records": self.latency_records, "repeats": self.repeats}


def _progress(text: str) -> None:
    sys.stderr.write(f"  {text}\n")
    sys.stderr.flush()


def _wait_metadata(bootstrap: str, deadline: float) -> None:
    """Until a Metadata answer lists a broker (the criterion KafkaBroker.start waits on)."""
    from confluent_kafka.admin import AdminClient
    import logging
    quiet = logging.getLogger("benchmarks.kafka.wait")
    quiet.setLevel(logging.CRITICAL)
    admin = AdminClient({"bootstrap.servers": bootstrap, "logger": quiet})
    while time.monotonic() < deadline:
        try:
            if admin.list_topics(timeout=1).brokers:
                return
        except Exception:          # KafkaException while it starts: ask again
            pass
        time.sleep(0.005)
    raise TimeoutError(f"no metadata answer from {bootstrap}")


def _start_logkit(directory: Path) -> tuple[LogkitServe, float]:
    began = time.monotonic()
    server = LogkitServe(directory).start()
    _wait_metadata(server.bootstrap_servers, began + READY_TIMEOUT_S)
    return server, time.monotonic() - began


class Servers:
    """The two servers of the run; `targets` maps each name to its bootstrap."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.logkit: LogkitServe | None = None
        self.kafka = KafkaBroker(root / "kafka")
        self.ready: dict[str, dict[str, float]] = {"logkit": {}, "kafka": {}}

    def start(self, restart: bool) -> None:
        self.logkit, self.ready["logkit"]["fresh_s"] = _start_logkit(self.root / "logkit")
        self.kafka.start()
        self.ready["kafka"]["fresh_s"] = self.kafka.start_seconds
        if restart:
            self.logkit.stop()
            self.logkit, self.ready["logkit"]["restart_s"] = _start_logkit(self.root / "logkit")
            self.kafka.stop()
            self.kafka.start()
            self.ready["kafka"]["restart_s"] = self.kafka.start_seconds
        self.idle_rss = self.rss()

    @property
    def targets(self) -> dict[str, str]:
        assert self.logkit is not None
        return {"logkit": self.logkit.bootstrap_servers, "kafka": self.kafka.bootstrap_servers}

    @property
    def pids(self) -> dict[str, int]:
        assert self.logkit is not None and self.logkit.proc is not None
        assert self.kafka.proc is not None
        return {"logkit": self.logkit.proc.pid, "kafka": self.kafka.proc.pid}

    def rss(self) -> dict[str, dict[str, float]]:
        assert self.logkit is not None and self.logkit.proc is not None
        assert self.kafka.proc is not None
        return {"logkit": rss_mb(self.logkit.proc.pid), "kafka": rss_mb(self.kafka.proc.pid)}

    def stop(self) -> None:
        if self.logkit is not None:
            self.logkit.stop()
        self.kafka.stop()


def _create(bootstrap: str, topic: str, partitions: int) -> None:
    run_tool("kafka-topics", "--bootstrap-server", bootstrap, "--create", "--topic", topic,
             "--partitions", str(partitions), "--replication-factor", "1")


def cpu_seconds(pid: int) -> float:
    """A live process's CPU time so far, user + system, from /proc/PID/stat."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _both(order: int, fn: Callable[[str, str], dict[str, float]], servers: Servers,
          repeats: int = 1) -> dict[str, dict[str, Any]]:
    """fn(name, bootstrap) at each server `repeats` times, the two alternating (logkit
    first in even rounds), each run's figures with the CPU seconds the server process
    spent meanwhile (`server_cpu_s`: on 2 shared cores, the server's CPU is taken from
    the tool's); each figure is the median of the rounds, and every round's figures are
    kept under "rounds"."""
    targets, pids = servers.targets, servers.pids
    runs: dict[str, list[dict[str, float]]] = {"logkit": [], "kafka": []}
    for round_ in range(repeats):
        names = ["logkit", "kafka"] if (order + round_) % 2 == 0 else ["kafka", "logkit"]
        for name in names:
            before = cpu_seconds(pids[name])
            figures = fn(name, targets[name])
            figures["server_cpu_s"] = cpu_seconds(pids[name]) - before
            runs[name].append(figures)
    out: dict[str, dict[str, Any]] = {}
    for name, rounds in runs.items():
        out[name] = {key: statistics.median(r[key] for r in rounds) for key in rounds[0]}
        if repeats > 1:
            out[name]["rounds"] = rounds
    return out


def _produce(topic: str, size: int, records: int, acks: str
             ) -> Callable[[str, str], dict[str, float]]:
    def run(name: str, bootstrap: str) -> dict[str, float]:
        proc = run_tool("kafka-producer-perf-test", "--topic", topic, "--num-records",
                        str(records), "--record-size", str(size), "--throughput", "-1",
                        "--command-property", f"bootstrap.servers={bootstrap}",
                        f"acks={acks}", timeout_s=RUN_TIMEOUT_S)
        return parse_producer_perf(proc.stdout)
    return run


def _consume(topic: str, records: int) -> Callable[[str, str], dict[str, float]]:
    def run(name: str, bootstrap: str) -> dict[str, float]:
        proc = run_tool("kafka-consumer-perf-test", "--bootstrap-server", bootstrap,
                        "--topic", topic, "--num-records", str(records), "--timeout", "60000",
                        timeout_s=RUN_TIMEOUT_S)
        got = parse_consumer_perf(proc.stdout)
        assert got["records"] >= records, f"{name}: {got['records']} of {records} consumed"
        return got
    return run


def _latency(topic: str, records: int, acks: str) -> Callable[[str, str], dict[str, float]]:
    def run(name: str, bootstrap: str) -> dict[str, float]:
        proc = run_tool("kafka-e2e-latency", "--bootstrap-server", bootstrap, "--topic", topic,
                        "--num-records", str(records), "--producer-acks", acks,
                        "--record-size", "100", timeout_s=RUN_TIMEOUT_S)
        return parse_e2e_latency(proc.stdout)
    return run


def _embedded(size: int, partitions: int, records: int, acks: str) -> dict[str, float]:
    """logkit's in-process producer: `records` unkeyed sends of one `size`-byte value
    into a fresh topic of `partitions` partitions, then flush."""
    import logkit
    value = os.urandom(size)
    directory = tempfile.mkdtemp(prefix="logkit-bench-kafka-embedded-")
    try:
        with logkit.Broker(directory) as broker:
            broker.create_topic("embedded", partitions)
            producer = broker.producer(acks=-1 if acks == "all" else 1, linger_ms=5,
                                       batch_size=16384)
            send = producer.send
            began = time.perf_counter()
            for _ in range(records):
                send("embedded", value)
            producer.flush()
            seconds = time.perf_counter() - began
            stored = sum(p.high_watermark for p in broker.topic("embedded").partitions)
            assert stored == records, f"{stored} of {records} stored"
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    return {"records": records, "seconds": seconds, "records_per_s": records / seconds,
            "mb_per_s": records * size / seconds / 2**20}


def run(plan: Plan) -> dict[str, Any]:
    reason = skip_reason()
    if reason:
        raise SystemExit(f"cannot run beside Kafka: {reason}")
    root = Path(tempfile.mkdtemp(prefix="logkit-bench-kafka-"))
    servers = Servers(root)
    cases: list[dict[str, Any]] = []
    order = 0
    try:
        _progress("starting logkit serve and Kafka")
        servers.start(plan.restart)
        targets = servers.targets
        for size in plan.sizes:
            records = plan.records[size]
            for partitions in plan.partitions:
                for acks in plan.acks:
                    topic = f"perf-{size}b-{partitions}p-acks{acks}"
                    for bootstrap in targets.values():
                        _create(bootstrap, topic, partitions)
                    _progress(f"produce {topic} ({records:,} records x {plan.repeats})")
                    produce = _both(order, _produce(topic, size, records, acks), servers,
                                    plan.repeats)
                    order += 1
                    _progress(f"embedded producer.send {topic}")
                    embedded_rounds = [_embedded(size, partitions, records, acks)
                                       for _ in range(plan.repeats)]
                    embedded = {key: statistics.median(r[key] for r in embedded_rounds)
                                for key in embedded_rounds[0]}
                    case: dict[str, Any] = {
                        "size_bytes": size, "partitions": partitions, "acks": acks,
                        "records": records, "produce": produce, "embedded": embedded}
                    if acks == plan.acks[0]:
                        _progress(f"consume {topic}")
                        case["consume"] = _both(order, _consume(topic, records), servers,
                                                plan.repeats)
                        order += 1
                    cases.append(case)
        latency = []
        for acks in plan.latency_acks:
            topic = f"latency-acks{acks}"
            for bootstrap in targets.values():
                _create(bootstrap, topic, 1)
            _progress(f"end-to-end latency, acks={acks}")
            latency.append({"acks": acks, "records": plan.latency_records, "size_bytes": 100,
                            **_both(order, _latency(topic, plan.latency_records, acks),
                                    servers, plan.repeats)})
            order += 1
        serving_rss = servers.rss()
    finally:
        servers.stop()
        shutil.rmtree(root, ignore_errors=True)
    doc = {"date": datetime.date.today().isoformat(), "kafka_version": KAFKA_VERSION,
           "environment": _environment(), "plan": plan.as_dict(),
           "kafka_heap": "-Xmx512m (tests/helpers/kafka.py BROKER_HEAP)",
           "ready": servers.ready, "rss_idle_mb": servers.idle_rss,
           "rss_serving_mb": serving_rss, "cases": cases, "latency": latency}
    doc["figures"] = figures(doc)
    return doc


def _environment() -> dict[str, Any]:
    import platform
    import subprocess
    java = subprocess.run(["java", "-version"], capture_output=True, text=True).stderr
    return {"python": platform.python_version(), "machine": platform.machine(),
            "cpus": os.cpu_count(), "load_average": os.getloadavg(),
            "java": java.splitlines()[0] if java else None}


def figures(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """Every figure of the side-by-side table: what, logkit's, Kafka's, the ratio
    (> 1: logkit better), the goal and whether it is met."""
    out = []

    def add(figure: str, unit: str, logkit: float, kafka: float, ratio: float,
            goal_key: str) -> None:
        goal = GOALS[goal_key]
        out.append({"figure": figure, "unit": unit, "logkit": logkit, "kafka": kafka,
                    "ratio": round(ratio, 3), "goal": goal, "met": ratio >= goal})

    for case in doc["cases"]:
        label = f"{case['size_bytes']} B, {case['partitions']} partition(s), acks={case['acks']}"
        lk, kf = case["produce"]["logkit"], case["produce"]["kafka"]
        add(f"kafka-producer-perf-test, {label}", "records/s", lk["records_per_s"],
            kf["records_per_s"], lk["records_per_s"] / kf["records_per_s"], "produce_vs_kafka")
        if "consume" in case:
            lk, kf = case["consume"]["logkit"], case["consume"]["kafka"]
            add(f"kafka-consumer-perf-test, {case['size_bytes']} B, "
                f"{case['partitions']} partition(s)", "records/s", lk["records_per_s"],
                kf["records_per_s"], lk["records_per_s"] / kf["records_per_s"],
                "consume_vs_kafka")
        em = case["embedded"]["records_per_s"]
        add(f"embedded producer.send ÷ the Java producer into Kafka, {label}", "records/s",
            em, kf_rate(case), em / kf_rate(case), "embedded_vs_kafka")
    for row in doc["latency"]:
        lk, kf = row["logkit"]["latency_ms_avg"], row["kafka"]["latency_ms_avg"]
        add(f"end-to-end latency average, acks={row['acks']}", "ms", lk, kf, kf / lk,
            "latency_vs_kafka")
        for q in ("p50", "p99"):
            lk, kf = row["logkit"][f"latency_ms_{q}"], row["kafka"][f"latency_ms_{q}"]
            # the tool prints whole milliseconds: 0 ms counts as 0.5 ms for the ratio
            add(f"end-to-end latency {q}, acks={row['acks']}", "ms", lk, kf,
                max(kf, 0.5) / max(lk, 0.5), "latency_vs_kafka")
    for when in ("fresh_s", "restart_s"):
        if when in doc["ready"]["logkit"]:
            lk, kf = doc["ready"]["logkit"][when], doc["ready"]["kafka"][when]
            add(f"ready to serve, {'fresh directory' if when == 'fresh_s' else 'restart'}",
                "s", lk, kf, kf / lk, "ready_vs_kafka")
    lk, kf = doc["rss_serving_mb"]["logkit"]["rss_mb"], doc["rss_serving_mb"]["kafka"]["rss_mb"]
    add("RSS while serving (after the workloads)", "MiB", lk, kf, kf / lk, "rss_vs_kafka")
    lk = doc["rss_serving_mb"]["logkit"]["anon_rss_mb"]
    kf = doc["rss_serving_mb"]["kafka"]["anon_rss_mb"]
    add("RSS while serving, anonymous memory alone (no mapped files' pages)", "MiB", lk, kf,
        kf / lk, "rss_vs_kafka")
    lk = doc["rss_serving_mb"]["logkit"]["peak_rss_mb"]
    kf = doc["rss_serving_mb"]["kafka"]["peak_rss_mb"]
    add("peak RSS over the run", "MiB", lk, kf, kf / lk, "rss_vs_kafka")
    return out


def kf_rate(case: dict[str, Any]) -> float:
    return case["produce"]["kafka"]["records_per_s"]


def markdown(doc: dict[str, Any]) -> str:
    """The side-by-side table docs/benchmarks.md shows, every cell from `doc`."""
    def num(value: float) -> str:
        return f"{value:,.0f}" if value >= 100 else f"{value:,.2f}"

    lines = ["| figure | logkit | Kafka | logkit ÷ Kafka (> 1: logkit better) | goal | met |",
             "|---|---|---|---|---|---|"]
    for f in doc["figures"]:
        # three decimals where two would round a miss up to its goal
        ratio = f"{f['ratio']:.3f}" if f"{f['ratio']:.2f}" == f"{f['goal']:.2f}" else (
            f"{f['ratio']:.2f}")
        lines.append(f"| {f['figure']} | {num(f['logkit'])} {f['unit']} | {num(f['kafka'])} "
                     f"{f['unit']} | {ratio}× | ≥ {f['goal']:g}× | "
                     f"{'yes' if f['met'] else '**no**'} |")
    lines += ["", "| workload (median run) | logkit serve's CPU | Kafka's CPU | "
              "records/s: logkit / Kafka |", "|---|---|---|---|"]
    for case in doc["cases"]:
        label = f"{case['size_bytes']} B, {case['partitions']} partition(s)"
        for what in ("produce", "consume"):
            if what not in case:
                continue
            lk, kf = case[what]["logkit"], case[what]["kafka"]
            name = (f"kafka-producer-perf-test, {label}, acks={case['acks']}"
                    if what == "produce" else f"kafka-consumer-perf-test, {label}")
            lines.append(f"| {name} | {lk['server_cpu_s']:.2f} s | {kf['server_cpu_s']:.2f} s "
                         f"| {num(lk['records_per_s'])} / {num(kf['records_per_s'])} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.kafka", description=__doc__.split("\n")[0],
        epilog="example: python -m benchmarks.kafka --json benchmarks/kafka.json --markdown")
    parser.add_argument("--quick", action="store_true",
                        help="one case of each, few records (well under a minute)")
    parser.add_argument("--json", metavar="FILE", default=None,
                        help=f"write the run's JSON here (the committed one: {JSON_PATH.name})")
    parser.add_argument("--markdown", action="store_true", help="print the markdown table")
    parser.add_argument("--from-json", metavar="FILE", default=None,
                        help="run nothing: print the figures of a run's JSON (its figures "
                             "computed again, so a table change needs no new run)")
    args = parser.parse_args(argv)
    if args.from_json:
        with open(args.from_json, encoding="utf-8") as f:
            doc = json.load(f)
        doc["figures"] = figures(doc)
    else:
        doc = run(Plan(args.quick))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(doc, f, indent=2)
            f.write("\n")
    if args.markdown:
        print(markdown(doc))
    else:
        for f in doc["figures"]:
            print(f"{f['figure']}: logkit {f['logkit']:,.2f} {f['unit']}, Kafka "
                  f"{f['kafka']:,.2f} {f['unit']}, {f['ratio']:.2f}x "
                  f"(goal {f['goal']:g}x, {'met' if f['met'] else 'NOT met'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
