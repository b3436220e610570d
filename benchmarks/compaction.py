"""Log compaction's figures (issue 32's Numbers), logkit's cleaner beside Kafka's.

Owns `python -m benchmarks.compaction` and benchmarks/compaction.json. One data set: a
one-partition compacted topic of `records` keyed records (`keys` distinct keys drawn at
random with a fixed seed, 100-byte values, 1 % tombstones, all stamped one hour ago),
written by the same confluent-kafka producer (batch.size 16384, linger.ms 5, no
compression) into `logkit serve`'s listener and into a single-node Apache Kafka 4.3.1
(tests/helpers/kafka.KafkaBroker), both with the same `segment.bytes`, so both hold the
same records in the same kind of batches. Then:

  clean        logkit: `p.compact()`, one pass in a child process over a fresh copy of
               the (rolled) data, timed around the call; MiB/s = the bytes of the
               sealed segments it cleaned ÷ seconds. Kafka: the data set is written
               into one topic per round with cleanup.policy=delete, and each is altered
               to compact once written, so Kafka's cleaner (backoff 100 ms) cleans it
               whole in one pass; its time is from its log line "Beginning cleaning of
               log" to its "cleaned log" summary (server.log, millisecond timestamps),
               its bytes the sealed segments'. Three rounds each, the median kept
  scan         `Partition.read` from the log start to the end, every value touched, in
               a child process over the uncleaned data: the same bytes as the clean
               (three rounds, each before a clean, the median kept)
  memory       the child's anonymous resident memory (RssAnon, sampled every 5 ms)
               during the pass, less what it held before; with Kafka's default
               `log.cleaner.dedupe.buffer.size` (128 MiB) and with a buffer too small
               for the keys (more passes), against that buffer
  produce      the embedded producer sending keyed records into the same partition
               alone, while a pass runs on a thread of the same process (as the
               Broker's LogCleaner does), alone, while a pass runs in another process
               (`logkit topics compact`), alone: the rate while cleaning ÷ the mean of
               the two alone runs beside it. A control last: the producer beside a
               process that only burns CPU for as long as the other process's pass
               took (what the CPU share alone costs on this machine)
  size         the sealed segments' bytes after the pass ÷ the ideal: the surviving
               records written afresh by the embedded producer (batch_size 16384) into
               an empty topic; Kafka's cleaned segments against the same ideal

`--quick` runs a tenth of the records (seconds); the full form's JSON is committed.
Invariant: every directory is temporary and removed at the end, Kafka is stopped
whatever fails, and no figure is asserted here (tests/tools/test_bench_compaction.py
checks the committed run's figures are sane and docs/benchmarks.md shows them).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

JSON_PATH = Path(__file__).with_name("compaction.json")
KAFKA_VERSION = "4.3.1"                   # tools/kafka/pom.xml's kafka.version
TOPIC = "bench"
VALUE_BYTES = 100
TOMBSTONE_EVERY = 100
KAFKA_BACKOFF_MS = 100
DEDUPE_DEFAULT = 134_217_728              # Kafka's log.cleaner.dedupe.buffer.size
CLEAN_TIMEOUT_S = 900.0
MIB = 2 ** 20

# issue 32's Numbers: (figure key, goal, ">=" or "<=")
GOALS = {
    "clean_vs_scan": (0.5, ">="),          # cleaner MiB/s ÷ read-scan MiB/s
    "clean_vs_kafka": (1.0, ">="),         # logkit's cleaner MiB/s ÷ Kafka's
    "memory_vs_buffer": (1.0, "<="),       # a pass's anonymous memory ÷ the dedupe buffer
    "produce_while_cleaning": (0.8, ">="),  # produce rate while a pass runs ÷ alone
    "size_vs_ideal": (1.10, "<="),         # compacted bytes ÷ the survivors' ideal bytes
}


class Plan:
    """How much data the run cleans."""

    def __init__(self, quick: bool) -> None:
        self.quick = quick
        self.records = 100_000 if quick else 1_000_000
        self.keys = self.records // 10
        self.segment_bytes = MIB if quick else 16 * MIB     # Kafka's minimum is 1 MiB
        self.small_buffer = 256 * 1024 if quick else 1 * MIB   # fewer keys than the data
        self.produce_records = 50_000 if quick else 300_000    # each "alone" run
        self.repeats = 3                   # scan, clean and Kafka's clean: the median

    def as_dict(self) -> dict[str, Any]:
        return {"quick": self.quick, "records": self.records, "keys": self.keys,
                "value_bytes": VALUE_BYTES, "tombstone_every": TOMBSTONE_EVERY,
                "segment_bytes": self.segment_bytes, "small_buffer": self.small_buffer,
                "produce_records": self.produce_records, "repeats": self.repeats}


def _progress(text: str) -> None:
    sys.stderr.write(f"  {text}\n")
    sys.stderr.flush()


def _workload(plan: Plan):
    """The data set: (key, value or None) pairs, the same in every run."""
    rng = random.Random(32)
    pad = rng.randbytes(VALUE_BYTES - 8)
    for n in range(plan.records):
        key = b"key-%08d" % rng.randrange(plan.keys)
        value = None if n % TOMBSTONE_EVERY == TOMBSTONE_EVERY - 1 else \
            n.to_bytes(8, "big") + pad
        yield key, value


def _produce_wire(bootstrap: str, plan: Plan, timestamp_ms: int, topic: str = TOPIC
                  ) -> None:
    from confluent_kafka import Producer
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5,
                         "batch.size": 16384, "queue.buffering.max.messages": 500_000,
                         "enable.idempotence": False, "acks": "all"})
    for n, (key, value) in enumerate(_workload(plan)):
        while True:
            try:
                producer.produce(topic, value, key, partition=0, timestamp=timestamp_ms)
                break
            except BufferError:
                producer.poll(0.05)
        if n % 10_000 == 0:
            producer.poll(0)
    assert producer.flush(120) == 0


def _sealed_log_bytes(directory: Path, below: int | None = None) -> int:
    """The bytes of a partition directory's segment files, the active (last) one left
    out, or every one whose base is below `below`."""
    bases = sorted(int(p.name[:20]) for p in directory.glob("*.log"))
    keep = bases[:-1] if below is None else [b for b in bases if b < below]
    return sum((directory / f"{b:020d}.log").stat().st_size for b in keep)


# ---- the logkit side: data set, then each measurement in a child process -----------------

def _logkit_data(root: Path, plan: Plan, timestamp_ms: int) -> dict[str, Any]:
    import logkit
    began = time.monotonic()
    with logkit.Broker(root, config={"log.cleaner.enable": False}) as broker, \
            broker.serve() as server:
        broker.create_topic(TOPIC, 1, config={"cleanup.policy": "compact",
                                              "segment.bytes": plan.segment_bytes})
        _produce_wire(server.bootstrap_servers, plan, timestamp_ms)
        partition = broker.topic(TOPIC).partition(0)
        partition.roll()
        assert partition.high_watermark == plan.records
        directory = Path(partition.directory)
        return {"produce_s": time.monotonic() - began,
                "segments": len(partition.segment_base_offsets()) - 1,
                "bytes": _sealed_log_bytes(directory),
                "directory": str(directory.relative_to(root))}


def _child(kind: str, **args: Any) -> dict[str, Any]:
    """Run one measurement in a fresh interpreter (its own memory, its own GIL)."""
    command = [sys.executable, "-m", "benchmarks.compaction", "--child",
               json.dumps({"kind": kind, **args})]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=CLEAN_TIMEOUT_S,
                          cwd=Path(__file__).resolve().parents[1])
    if proc.returncode != 0:
        raise RuntimeError(f"child {kind} failed:\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _rss_kb(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


class _AnonPeak:
    """The peak of this process's anonymous resident memory while the block runs,
    sampled every 5 ms on a thread (the kernel keeps no peak of RssAnon alone)."""

    def __enter__(self) -> "_AnonPeak":
        self.before_kb = self.peak_kb = _rss_kb("RssAnon")
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(0.005):
            self.peak_kb = max(self.peak_kb, _rss_kb("RssAnon"))

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak_kb = max(self.peak_kb, _rss_kb("RssAnon"))

    @property
    def delta_mib(self) -> float:
        return (self.peak_kb - self.before_kb) / 1024


def _open(root: str, **config: Any) -> Any:
    """A writable broker over a data set with no background chores (the cleaner,
    retention), so only what the benchmark calls runs."""
    import logkit
    return logkit.Broker(root, config={"log.cleaner.enable": False, **config},
                         background=False)


def _child_scan(root: str) -> dict[str, Any]:
    import logkit
    with logkit.Broker(root, read_only=True) as broker:
        partition = broker.topic(TOPIC).partition(0)
        end = partition.segment_base_offsets()[-1]
        records = 0
        offset = partition.log_start_offset
        began = time.perf_counter()
        while offset < end:
            batch = partition.read(offset, max_records=10_000)
            for r in batch:
                r.value
            records += len(batch)
            offset = batch[-1].offset + 1
        seconds = time.perf_counter() - began
        return {"records": records, "seconds": seconds,
                "bytes": _sealed_log_bytes(Path(partition.directory))}


def _child_compact(root: str, buffer: int) -> dict[str, Any]:
    """Passes until the cleaner checkpoint reaches the active segment (one, when the
    buffer holds every key)."""
    with _open(root, **{"log.cleaner.dedupe.buffer.size": buffer}) as broker:
        partition = broker.topic(TOPIC).partition(0)
        end = partition.segment_base_offsets()[-1]
        bytes_before = _sealed_log_bytes(Path(partition.directory))
        reports = []
        with _AnonPeak() as memory:
            began = time.perf_counter()
            while partition.first_dirty_offset < end and len(reports) < 1000:
                reports.append(partition.compact()._asdict())
            seconds = time.perf_counter() - began
        return {"buffer": buffer, "passes": len(reports), "reports": reports,
                "seconds": seconds, "bytes_before": bytes_before,
                "bytes_after": _sealed_log_bytes(Path(partition.directory)),
                "anon_before_mib": memory.before_kb / 1024,
                "anon_peak_delta_mib": memory.delta_mib,
                "vm_hwm_mib": _rss_kb("VmHWM") / 1024}


def _send_keyed(producer: Any, keys: list[bytes], value: bytes, count: int) -> None:
    send = producer.send
    n = len(keys)
    for i in range(count):
        send(TOPIC, value, keys[i % n], partition=0)


_BURN = "import time\nend = time.monotonic() + {seconds}\nwhile time.monotonic() < end: pass"


def _child_produce(root: str, keys: int, records: int) -> dict[str, Any]:
    """Keyed sends alone, while a pass runs on a thread, alone, while a pass runs in
    another process (`logkit topics compact`), alone: each "while" is compared with the
    mean of the two "alone" runs beside it."""
    rng = random.Random(7)
    key_list = [b"key-%08d" % rng.randrange(keys) for _ in range(10_000)]
    value = rng.randbytes(VALUE_BYTES)
    chunk = 5_000
    with _open(root) as broker:
        partition = broker.topic(TOPIC).partition(0)
        producer = broker.producer(linger_ms=5, batch_size=16384)

        def alone() -> float:
            began = time.perf_counter()
            _send_keyed(producer, key_list, value, records)
            producer.flush()
            return records / (time.perf_counter() - began)

        def during(running: Any) -> dict[str, float]:
            sent = 0
            began = time.perf_counter()
            while running():
                _send_keyed(producer, key_list, value, chunk)
                sent += chunk
            producer.flush()
            seconds = time.perf_counter() - began
            return {"records": sent, "seconds": seconds, "records_per_s": sent / seconds}

        alone_rates = [alone()]
        result: dict[str, Any] = {}
        thread = threading.Thread(target=lambda: result.setdefault("report",
                                                                   partition.compact()))
        thread.start()
        in_thread = during(thread.is_alive)
        thread.join()
        in_thread["report"] = result["report"]._asdict()
        alone_rates.append(alone())
        # the first pass left clean segments; roll what the sends added since, so the
        # other process has dirty segments to clean
        partition.roll()
        other = subprocess.Popen(
            [os.path.join(os.path.dirname(sys.executable), "logkit"), "topics", "compact",
             root, TOPIC, "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        in_process = during(lambda: other.poll() is None)
        out, err = other.communicate()
        if other.returncode != 0:
            raise RuntimeError(f"logkit topics compact failed: {err[-2000:]!r}")
        in_process["report"] = json.loads(out)[0]
        alone_rates.append(alone())
        # the control: another process as long as the pass took, burning CPU without
        # touching logkit's files; what the producer loses to it is the CPU share alone
        burner = subprocess.Popen([sys.executable, "-c", _BURN.format(
            seconds=in_process["seconds"])])
        beside_burner = during(lambda: burner.poll() is None)
        producer.close()
        return {"alone_records_per_s": alone_rates, "thread": in_thread,
                "process": in_process, "burner": beside_burner}


def _child_ideal(root: str, out: str, batch_size: int) -> dict[str, Any]:
    """The surviving records of a cleaned partition written afresh into an empty
    topic: what a perfect compaction would leave."""
    import logkit
    survivors = []
    with logkit.Broker(root, read_only=True) as broker:
        partition = broker.topic(TOPIC).partition(0)
        end = partition.segment_base_offsets()[-1]
        offset = partition.log_start_offset
        while offset < end:
            batch = partition.read(offset, max_records=10_000)
            if not batch:
                break
            survivors += [(r.key, r.value, r.timestamp) for r in batch if r.offset < end]
            offset = batch[-1].offset + 1
    with _open(out) as broker:
        broker.create_topic(TOPIC, 1, config={"cleanup.policy": "compact",
                                              "segment.bytes": 1 << 30})
        producer = broker.producer(linger_ms=1000, batch_size=batch_size)
        for key, value, timestamp in survivors:
            producer.send(TOPIC, value, key, partition=0, timestamp_ms=timestamp)
        producer.flush()
        producer.close()
        partition = broker.topic(TOPIC).partition(0)
        size = sum(p.stat().st_size for p in Path(partition.directory).glob("*.log"))
    raw = sum(len(k) + (len(v) if v is not None else 0) for k, v, _ in survivors)
    return {"records": len(survivors), "bytes": size, "key_value_bytes": raw}


def _run_child(spec: str) -> None:
    args = json.loads(spec)
    kind = args.pop("kind")
    fn = {"scan": _child_scan, "compact": _child_compact, "produce": _child_produce,
          "ideal": _child_ideal}[kind]
    print(json.dumps(fn(**args)))


# ---- the Kafka side -----------------------------------------------------------------------

_LOG_LINE = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})\] ")


def _log_time(line: str) -> float | None:
    m = _LOG_LINE.match(line)
    if m is None:
        return None
    stamp = datetime.datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f")
    return stamp.timestamp()


def _kafka_clean_times(server_log: Path, topic: str) -> dict[str, Any]:
    """Kafka's own account of its cleaning passes over topic-0 from its server.log:
    each pass's seconds from "Beginning cleaning of log" to the "cleaned log" summary
    logged after the swap, and the summary's lines."""
    passes = []
    began = None
    lines = server_log.read_text(errors="replace").splitlines()
    for i, line in enumerate(lines):
        if f"Beginning cleaning of log {topic}-0" in line:
            began = _log_time(line)
        elif f"cleaned log {topic}-0 " in line and began is not None:
            stamp = next(t for t in (_log_time(lines[j]) for j in range(i, -1, -1))
                         if t is not None)
            summary = [s.strip() for s in lines[i:i + 9] if s.startswith("\t")]
            passes.append({"seconds": stamp - began, "summary": summary})
            began = None
    return {"passes": passes}


def _kafka_checkpoint(kafka: Any, topic: str) -> int | None:
    path = kafka.data_dir / "cleaner-offset-checkpoint"
    if not path.exists():
        return None
    for line in path.read_text().splitlines()[2:]:
        name, partition, offset = line.rsplit(" ", 2)
        if name == topic and partition == "0":
            return int(offset)
    return None


def _kafka_run(root: Path, plan: Plan, timestamp_ms: int) -> dict[str, Any]:
    """The data set written `repeats` times, into topics bench-0, bench-1, ... (written
    with cleanup.policy=delete, so nothing cleans them meanwhile), then each altered to
    compact in turn and cleaned by Kafka's cleaner thread."""
    from confluent_kafka.admin import AdminClient, NewTopic
    from tests.helpers.kafka import KafkaBroker
    kafka = KafkaBroker(root, config={"log.cleaner.backoff.ms": KAFKA_BACKOFF_MS})
    kafka.start()
    try:
        admin = AdminClient({"bootstrap.servers": kafka.bootstrap_servers})
        config = {"cleanup.policy": "delete", "retention.ms": "-1",
                  "segment.bytes": str(plan.segment_bytes), "segment.ms": "60000",
                  "min.cleanable.dirty.ratio": "0.01"}
        topics = [f"{TOPIC}-{n}" for n in range(plan.repeats)]
        new = [NewTopic(t, 1, 1, config=config) for t in topics]
        for future in admin.create_topics(new).values():
            future.result(timeout=60)
        runs = []
        for topic in topics:
            runs.append(_kafka_write(kafka, topic, plan, timestamp_ms))
        for topic, run_ in zip(topics, runs):
            _progress(f"Kafka cleans {topic}")
            run_.update(_kafka_clean(kafka, admin, topic, plan))
        return {**_median_run(runs), "rounds": runs}
    finally:
        kafka.stop()


def _kafka_write(kafka: Any, topic: str, plan: Plan, timestamp_ms: int) -> dict[str, Any]:
    from confluent_kafka import Producer
    began = time.monotonic()
    _produce_wire(kafka.bootstrap_servers, plan, timestamp_ms, topic)
    # a record stamped past segment.ms rolls the last data segment: it alone is active
    producer = Producer({"bootstrap.servers": kafka.bootstrap_servers})
    producer.produce(topic, b"end", b"sentinel", partition=0,
                     timestamp=timestamp_ms + 120_000)
    assert producer.flush(30) == 0
    directory = kafka.partition_dir(topic, 0)
    bases = sorted(int(p.name[:20]) for p in directory.glob("*.log"))
    assert bases[-1] == plan.records, bases
    return {"topic": topic, "produce_s": time.monotonic() - began,
            "segments": len(bases) - 1, "bytes_before": _sealed_log_bytes(directory)}


def _kafka_clean(kafka: Any, admin: Any, topic: str, plan: Plan) -> dict[str, Any]:
    from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource
    resource = ConfigResource("TOPIC", topic, incremental_configs=[
        ConfigEntry("cleanup.policy", "compact", incremental_operation=AlterConfigOpType.SET)])
    for future in admin.incremental_alter_configs([resource]).values():
        future.result(timeout=60)
    deadline = time.monotonic() + CLEAN_TIMEOUT_S
    while _kafka_checkpoint(kafka, topic) != plan.records:
        if time.monotonic() > deadline:
            raise TimeoutError(f"Kafka's cleaner did not reach {topic}'s active segment")
        time.sleep(0.05)
    times = _kafka_clean_times(kafka.root / "server.log", topic)
    return {"bytes_after": _sealed_log_bytes(kafka.partition_dir(topic, 0),
                                             below=plan.records),
            "seconds": sum(p["seconds"] for p in times["passes"]), **times}


# ---- the run ------------------------------------------------------------------------------

def run(plan: Plan) -> dict[str, Any]:
    from tests.helpers.kafka import skip_reason
    reason = skip_reason()
    if reason:
        raise SystemExit(f"cannot run beside Kafka: {reason}")
    work = Path(tempfile.mkdtemp(prefix="logkit-bench-compaction-"))
    timestamp_ms = int(time.time() * 1000) - 3_600_000
    doc: dict[str, Any] = {"date": datetime.date.today().isoformat(),
                           "kafka_version": KAFKA_VERSION, "environment": _environment(),
                           "plan": plan.as_dict()}
    try:
        _progress(f"writing {plan.records:,} keyed records into logkit serve")
        data = work / "logkit"
        doc["logkit_data"] = _logkit_data(data, plan, timestamp_ms)

        def copy(name: str) -> str:
            target = work / name
            shutil.copytree(data, target)
            return str(target)

        scans, cleans = [], []
        for round_ in range(plan.repeats):
            _progress(f"read scan and clean (Kafka's default dedupe buffer), round "
                      f"{round_ + 1} of {plan.repeats}")
            scans.append(_child("scan", root=str(data)))
            cleaned = copy("clean")
            cleans.append(_child("compact", root=cleaned, buffer=DEDUPE_DEFAULT))
            if round_ < plan.repeats - 1:
                shutil.rmtree(cleaned)
        doc["scan"] = _median_run(scans)
        doc["clean"] = _median_run(cleans)
        _progress("the survivors written afresh (the ideal size)")
        doc["ideal"] = _child("ideal", root=cleaned, out=str(work / "ideal"),
                              batch_size=16384)
        shutil.rmtree(cleaned)
        _progress(f"clean, a {plan.small_buffer:,}-byte dedupe buffer")
        small = copy("small")
        doc["clean_small_buffer"] = _child("compact", root=small, buffer=plan.small_buffer)
        shutil.rmtree(small)
        _progress("produce alone and while cleaning")
        produce = copy("produce")
        doc["produce"] = _child("produce", root=produce, keys=plan.keys,
                                records=plan.produce_records)
        shutil.rmtree(produce)
        shutil.rmtree(data)
        _progress("Kafka: the same records, then its cleaner")
        doc["kafka"] = _kafka_run(work / "kafka", plan, timestamp_ms)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    doc["figures"] = figures(doc)
    return doc


def _median_run(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The run of median seconds, with every run's seconds beside it."""
    ordered = sorted(runs, key=lambda r: r["seconds"])
    return {**ordered[len(ordered) // 2], "rounds_seconds": [r["seconds"] for r in runs]}


def _environment() -> dict[str, Any]:
    import platform
    java = subprocess.run(["java", "-version"], capture_output=True, text=True).stderr
    return {"python": platform.python_version(), "machine": platform.machine(),
            "cpus": os.cpu_count(), "load_average": os.getloadavg(),
            "java": java.splitlines()[0] if java else None}


def figures(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """Every figure of the table: what, its value, what it is compared with, the ratio,
    the goal and whether it is met."""
    out = []

    def add(figure: str, value: str, against: str, ratio: float, goal_key: str) -> None:
        goal, sense = GOALS[goal_key]
        met = ratio >= goal if sense == ">=" else ratio <= goal
        out.append({"figure": figure, "value": value, "against": against,
                    "ratio": round(ratio, 3), "goal": goal, "sense": sense, "met": met})

    clean, scan, kafka = doc["clean"], doc["scan"], doc["kafka"]
    clean_rate = clean["bytes_before"] / clean["seconds"] / MIB
    scan_rate = scan["bytes"] / scan["seconds"] / MIB
    kafka_rate = kafka["bytes_before"] / kafka["seconds"] / MIB
    add("cleaner throughput ÷ a Partition.read scan of the same bytes",
        f"{clean_rate:,.1f} MiB/s", f"{scan_rate:,.1f} MiB/s", clean_rate / scan_rate,
        "clean_vs_scan")
    add("cleaner throughput ÷ Kafka's cleaner on the same records",
        f"{clean_rate:,.1f} MiB/s", f"{kafka_rate:,.1f} MiB/s", clean_rate / kafka_rate,
        "clean_vs_kafka")
    for row in (clean, doc["clean_small_buffer"]):
        buffer = row["buffer"] / MIB
        add(f"a pass's anonymous memory ÷ log.cleaner.dedupe.buffer.size "
            f"({buffer:g} MiB, {row['passes']} pass(es))",
            f"{row['anon_peak_delta_mib']:,.1f} MiB", f"{buffer:g} MiB",
            row["anon_peak_delta_mib"] / buffer, "memory_vs_buffer")
    produce = doc["produce"]
    for i, where, label in ((0, "thread", "a pass on a thread of the producing process"),
                            (1, "process", "a pass in another process")):
        alone = sum(produce["alone_records_per_s"][i:i + 2]) / 2
        rate = produce[where]["records_per_s"]
        add(f"produce while {label} ÷ produce alone", f"{rate:,.0f} records/s",
            f"{alone:,.0f} records/s", rate / alone, "produce_while_cleaning")
    ideal = doc["ideal"]["bytes"]
    add("compacted size ÷ the survivors written afresh",
        f"{clean['bytes_after'] / MIB:,.2f} MiB", f"{ideal / MIB:,.2f} MiB",
        clean["bytes_after"] / ideal, "size_vs_ideal")
    add("Kafka's compacted size ÷ the same ideal (for comparison)",
        f"{kafka['bytes_after'] / MIB:,.2f} MiB", f"{ideal / MIB:,.2f} MiB",
        kafka["bytes_after"] / ideal, "size_vs_ideal")
    return out


def markdown(doc: dict[str, Any]) -> str:
    """The table docs/benchmarks.md shows, every cell from `doc`."""
    lines = ["| figure | logkit | compared with | ratio | goal | met |",
             "|---|---|---|---|---|---|"]
    for f in doc["figures"]:
        lines.append(f"| {f['figure']} | {f['value']} | {f['against']} | "
                     f"{f['ratio']:.2f}× | {'≥' if f['sense'] == '>=' else '≤'} "
                     f"{f['goal']:g}× | {'yes' if f['met'] else '**no**'} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.compaction", description=__doc__.split("\n")[0],
        epilog="example: python -m benchmarks.compaction --json benchmarks/compaction.json "
               "--markdown")
    parser.add_argument("--quick", action="store_true",
                        help="a tenth of the records (well under a minute after Kafka's start)")
    parser.add_argument("--json", metavar="FILE", default=None,
                        help=f"write the run's JSON here (the committed one: {JSON_PATH.name})")
    parser.add_argument("--markdown", action="store_true", help="print the markdown table")
    parser.add_argument("--from-json", metavar="FILE", default=None,
                        help="run nothing: print the figures of a run's JSON")
    parser.add_argument("--child", metavar="SPEC", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        _run_child(args.child)
        return 0
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
            print(f"{f['figure']}: {f['value']} against {f['against']}, {f['ratio']:.2f}x "
                  f"(goal {f['sense']} {f['goal']:g}x, {'met' if f['met'] else 'NOT met'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
