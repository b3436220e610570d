"""Exactly-once's costs (issue 33): idempotence, transactions and read_committed beside
the paths without them, the commit latency beside Apache Kafka's in the same run, and
the recovery of a transaction whose producer was SIGKILLed.

Cases (embedded clients unless said; 100 B values, 10 B keys, 3 partitions, acks="all"
everywhere; each throughput case a fresh topic per run, the systems interleaved
round by round, the median of --repeats kept, as `_common.interleaved_medians`):

  produce      non-idempotent (enable_idempotence=False), idempotent (the default with
               acks="all") and transactional (100 records per transaction: begin, 100
               sends, commit) — `producer.send` then `flush`, records per second
  consume      a consumer (no group) reading a topic of committed transactions of 100
               records from the start to the end, read_uncommitted and read_committed,
               records per second; and the same over a topic where one transaction in
               ten was aborted (read_committed skips those through the .txnindex)
  commit       the latency of `commit_transaction()` (10 records per transaction, one
               partition) for the embedded producer, for confluent-kafka's producer
               against logkit's listener, and for the same client against a
               single-node KRaft Apache Kafka (tests/helpers/kafka.py, `make kafka`'s
               classpath): p50 and p99 in ms; for confluent-kafka also the whole
               transaction (begin, sends, flush, commit: `cycle_*`), since the listener
               answers EndTxn at PrepareCommit, as Kafka does, and the next
               transaction's AddPartitionsToTxn waits for the markers
  recovery     a child process with an open transaction (its records in the log) is
               SIGKILLed; how long until read_committed readers move again (the last
               stable offset reaches the high watermark): by the next
               `init_transactions()` of the id in a new process (from the kill,
               process start and Broker open included), and by the broker's expiry
               thread with transaction_timeout_ms=--recovery-timeout-ms (bounded by
               the timeout plus the thread's period)

Run from the checkout's root (its own command line and JSON, not part of `all`):
    .venv/bin/python -m benchmarks.transactions [--json benchmarks/transactions.json]
    .venv/bin/python -m benchmarks.transactions --cases consume --json benchmarks/transactions.json
The second re-runs only the cases named and merges them into the JSON: the other
cases keep their figures, each re-run case is stamped under "reruns" with its UTC
time and load average, and the ratios are recomputed from the merged rows.
    .venv/bin/python -m benchmarks.transactions --profile transactional   # cProfile top
`--quick` is a smoke size. Goals (issue 33): transactional >= 0.7x idempotent;
idempotent >= 0.95x non-idempotent; read_committed >= 0.9x read_uncommitted; commit
latency <= Kafka's. Speed is never asserted.
"""

from __future__ import annotations

import argparse
import cProfile
import datetime
import io
import itertools
import json
import os
import pstats
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable

import logkit

from ._common import BenchConfig, interleaved_medians, make_records

GOALS = {"transactional_vs_idempotent": 0.7, "idempotent_vs_plain": 0.95,
         "read_committed_vs_uncommitted": 0.9, "commit_p50_vs_kafka": 1.0,
         "commit_p99_vs_kafka": 1.0}
PER_TRANSACTION = 100
COMMIT_RECORDS = 10
PARTITIONS = 3
CASES = ("produce", "consume", "commit", "recovery")
_names = itertools.count()


def _progress(text: str) -> None:
    print(f"  {text}", file=sys.stderr, flush=True)


# ---- produce --------------------------------------------------------------------------

def _producer_run(broker, records, per_transaction: int = PER_TRANSACTION,
                  **options) -> Callable[[], None]:
    """One run: a fresh topic, a producer with `options`, every record sent, flushed
    (transactional: in transactions of `per_transaction` records)."""
    transactional = "transactional_id" in options

    def run() -> None:
        topic = f"p{next(_names)}"
        broker.create_topic(topic, PARTITIONS)
        producer = broker.producer(acks="all", linger_ms=5, **options)
        send = producer.send
        if transactional:
            producer.init_transactions()
            for start in range(0, len(records), per_transaction):
                producer.begin_transaction()
                for key, value in records[start:start + per_transaction]:
                    send(topic, value, key=key)
                producer.commit_transaction()
        else:
            for key, value in records:
                send(topic, value, key=key)
            producer.flush()
        producer.close()
        broker.delete_topic(topic)
    return run


def produce(broker, n: int, repeats: int) -> dict[str, Any]:
    records = make_records(BenchConfig(), n)
    runs = {"non-idempotent": _producer_run(broker, records, enable_idempotence=False),
            "idempotent": _producer_run(broker, records, enable_idempotence=True),
            "transactional": _producer_run(broker, records, transactional_id="bench"),
            # beside the goal's size: how the cost per transaction amortises
            "transactional, 1000 per transaction": _producer_run(
                broker, records, 1000, transactional_id="bench"),
            "transactional, 10000 per transaction": _producer_run(
                broker, records, 10000, transactional_id="bench")}
    medians = interleaved_medians(runs, repeats)
    return {name: {"records": n, "seconds": s, "records_per_s": n / s}
            for name, s in medians.items()}


# ---- consume --------------------------------------------------------------------------

def _fill(broker, topic: str, records, abort_every: int) -> int:
    """`records` in transactions of PER_TRANSACTION; every `abort_every`-th aborted
    (0: none). Returns how many records were committed."""
    broker.create_topic(topic, PARTITIONS)
    producer = broker.producer(transactional_id=f"fill-{topic}", linger_ms=5)
    producer.init_transactions()
    committed = 0
    for number, start in enumerate(range(0, len(records), PER_TRANSACTION)):
        chunk = records[start:start + PER_TRANSACTION]
        producer.begin_transaction()
        for key, value in chunk:
            producer.send(topic, value, key=key)
        if abort_every and number % abort_every == abort_every - 1:
            producer.abort_transaction()
        else:
            producer.commit_transaction()
            committed += len(chunk)
    producer.close()
    return committed


def _consume_run(broker, topic: str, isolation_level: str, expected: int
                 ) -> Callable[[], None]:
    def run() -> None:
        consumer = broker.consumer(isolation_level=isolation_level,
                                   auto_offset_reset="earliest")
        consumer.assign([logkit.TopicPartition(topic, p) for p in range(PARTITIONS)])
        got = 0
        while got < expected:
            got += len(consumer.poll(timeout_ms=1000, max_records=5000))
        consumer.close()
        assert got == expected, (isolation_level, got, expected)
    return run


def consume(broker, n: int, repeats: int) -> dict[str, Any]:
    records = make_records(BenchConfig(), n)
    out: dict[str, Any] = {}
    for label, abort_every in (("committed", 0), ("one in ten aborted", 10)):
        topic = f"c{next(_names)}"
        committed = _fill(broker, topic, records, abort_every)
        runs = {"read_uncommitted": _consume_run(broker, topic, "read_uncommitted", n),
                "read_committed": _consume_run(broker, topic, "read_committed", committed)}
        medians = interleaved_medians(runs, repeats)
        out[label] = {name: {"records": n, "seconds": s, "offsets_per_s": n / s,
                             "records_returned": n if name == "read_uncommitted"
                             else committed}
                      for name, s in medians.items()}
    return out


# ---- commit latency ---------------------------------------------------------------------

def _summary_ms(samples_s: list[float]) -> dict[str, float]:
    ordered = sorted(samples_s)
    pick = lambda q: ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000  # noqa: E731
    return {"p50_ms": pick(0.5), "p99_ms": pick(0.99), "max_ms": ordered[-1] * 1000,
            "mean_ms": statistics.fmean(ordered) * 1000, "transactions": len(ordered)}


def commit_embedded(broker, transactions: int) -> dict[str, float]:
    topic = f"l{next(_names)}"
    broker.create_topic(topic, 1)
    producer = broker.producer(transactional_id=f"lat-{topic}", linger_ms=0)
    producer.init_transactions()
    samples = []
    for _ in range(transactions):
        producer.begin_transaction()
        for i in range(COMMIT_RECORDS):
            producer.send(topic, b"v" * 100, key=b"k%d" % i)
        producer.flush()                 # the records out, so only the commit is timed
        started = time.perf_counter()
        producer.commit_transaction()
        samples.append(time.perf_counter() - started)
    producer.close()
    return _summary_ms(samples)


def commit_confluent(bootstrap: str, transactions: int, create) -> dict[str, float]:
    import confluent_kafka as ck
    topic = f"l{next(_names)}"
    create(topic)
    producer = ck.Producer({"bootstrap.servers": bootstrap, "linger.ms": 0,
                            "transactional.id": f"lat-{topic}"})
    producer.init_transactions(60)
    samples, cycles = [], []
    for _ in range(transactions + 5):
        began = time.perf_counter()
        producer.begin_transaction()
        for i in range(COMMIT_RECORDS):
            producer.produce(topic, b"v" * 100, b"k%d" % i, partition=0)
        producer.flush(30)
        started = time.perf_counter()
        producer.commit_transaction(30)
        ended = time.perf_counter()
        samples.append(ended - started)
        cycles.append(ended - began)
    out = _summary_ms(samples[5:])            # the first ones find the coordinator
    cycle = _summary_ms(cycles[5:])
    out.update(cycle_p50_ms=cycle["p50_ms"], cycle_p99_ms=cycle["p99_ms"])
    return out


def _kafka_create(bootstrap: str) -> Callable[[str], None]:
    from confluent_kafka.admin import AdminClient, NewTopic
    admin = AdminClient({"bootstrap.servers": bootstrap})

    def create(topic: str) -> None:
        for future in admin.create_topics([NewTopic(topic, 1, 1)]).values():
            future.result(60)
    return create


def commit(broker, transactions: int, with_kafka: bool) -> dict[str, Any]:
    out: dict[str, Any] = {"records_per_transaction": COMMIT_RECORDS}
    _progress("commit latency: embedded")
    out["logkit embedded"] = commit_embedded(broker, transactions)
    try:
        import confluent_kafka  # noqa: F401
    except ImportError:
        out["note"] = "confluent-kafka not installed"
        return out
    with broker.serve() as server:
        _progress("commit latency: confluent-kafka -> logkit's listener")
        out["confluent-kafka -> logkit"] = commit_confluent(
            server.bootstrap_servers, transactions, lambda t: broker.create_topic(t, 1))
    if not with_kafka:
        return out
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from tests.helpers.kafka import KafkaBroker, skip_reason
    reason = skip_reason()
    if reason:
        out["kafka_note"] = reason
        return out
    kafka_dir = tempfile.mkdtemp(prefix="logkit-bench-txn-kafka-")
    try:
        with KafkaBroker(kafka_dir) as kafka:
            _progress("commit latency: confluent-kafka -> Apache Kafka")
            out["confluent-kafka -> Kafka"] = commit_confluent(
                kafka.bootstrap_servers, transactions, _kafka_create(kafka.bootstrap_servers))
    finally:
        shutil.rmtree(kafka_dir, ignore_errors=True)
    return out


# ---- recovery ---------------------------------------------------------------------------

_OPEN_TXN = """
import sys, logkit
with logkit.Broker(sys.argv[1]) as broker:
    producer = broker.producer(transactional_id="victim", linger_ms=0,
                               transaction_timeout_ms=int(sys.argv[2]))
    producer.init_transactions()
    producer.begin_transaction()
    for i in range(100):
        producer.send("r", b"v" * 100, key=b"%d" % i)
    producer.flush()
    print("open", flush=True)
    sys.stdin.read()
"""

_INIT = """
import sys, logkit
with logkit.Broker(sys.argv[1]) as broker:
    broker.producer(transactional_id="victim").init_transactions()
"""


def _open_and_kill(root: str, timeout_ms: int) -> float:
    child = subprocess.Popen([sys.executable, "-c", _OPEN_TXN, root, str(timeout_ms)],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "open"
    child.send_signal(signal.SIGKILL)
    killed = time.perf_counter()
    child.wait()
    return killed


def _stable(broker) -> bool:
    return all(p.last_stable_offset == p.high_watermark for p in broker.topic("r").partitions)


def recovery(rounds: int, timeout_ms: int, directory: str | None = None
             ) -> dict[str, Any]:
    by_init, by_timeout = [], []
    for _ in range(rounds):
        root = tempfile.mkdtemp(prefix="logkit-bench-txn-recover-", dir=directory)
        try:
            with logkit.Broker(root) as broker:
                broker.create_topic("r", PARTITIONS)
            killed = _open_and_kill(root, 60000)
            subprocess.run([sys.executable, "-c", _INIT, root], check=True, timeout=120)
            by_init.append(time.perf_counter() - killed)
            with logkit.Broker(root) as broker:
                assert _stable(broker)
                killed = _open_and_kill(root, timeout_ms)
                deadline = killed + timeout_ms / 1000 + 60
                while not _stable(broker):
                    assert time.perf_counter() < deadline, "the expired txn was not aborted"
                    time.sleep(0.005)
                by_timeout.append(time.perf_counter() - killed)
        finally:
            shutil.rmtree(root, ignore_errors=True)
    return {"rounds": rounds, "transaction_timeout_ms": timeout_ms,
            "by_next_init_s": {"median": statistics.median(by_init), "max": max(by_init)},
            "by_timeout_s": {"median": statistics.median(by_timeout),
                             "max": max(by_timeout)}}


# ---- the run ----------------------------------------------------------------------------

def ratios(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The goals' ratios from the cases `doc` holds (a case not run gives none)."""
    out: dict[str, float] = {}
    p = doc.get("produce")
    if p:
        out["transactional_vs_idempotent"] = p["transactional"]["records_per_s"] \
            / p["idempotent"]["records_per_s"]
        out["idempotent_vs_plain"] = p["idempotent"]["records_per_s"] \
            / p["non-idempotent"]["records_per_s"]
    if doc.get("consume"):
        c = doc["consume"]["committed"]
        out["read_committed_vs_uncommitted"] = c["read_committed"]["offsets_per_s"] \
            / c["read_uncommitted"]["offsets_per_s"]
    lat = doc.get("commit") or {}
    kafka = lat.get("confluent-kafka -> Kafka")
    if kafka:
        for q in ("p50", "p99"):
            # Kafka's latency / logkit's: > 1 is logkit faster (both through confluent-kafka)
            out[f"commit_{q}_vs_kafka"] = kafka[f"{q}_ms"] / \
                lat["confluent-kafka -> logkit"][f"{q}_ms"]
            out[f"commit_{q}_embedded_vs_kafka"] = kafka[f"{q}_ms"] / \
                lat["logkit embedded"][f"{q}_ms"]
    return {name: {"ratio": round(value, 3), "goal": GOALS.get(name),
                   "met": None if name not in GOALS else value >= GOALS[name]}
            for name, value in out.items()}


def _utc_now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def run(args) -> dict[str, Any]:
    cases = args.cases
    doc: dict[str, Any] = {"date": datetime.date.today().isoformat(), "utc": _utc_now(),
                           "quick": args.quick, "machine": {"cpus": os.cpu_count()}}
    load_before = os.getloadavg()[0]
    root = tempfile.mkdtemp(prefix="logkit-bench-txn-", dir=args.dir)
    try:
        with logkit.Broker(root) as broker:
            if "produce" in cases:
                _progress(f"produce: {args.records:,} records x3 systems "
                          f"x{args.repeats + 1}")
                doc["produce"] = produce(broker, args.records, args.repeats)
            if "consume" in cases:
                _progress("consume")
                doc["consume"] = consume(broker, args.records, args.repeats)
            if "commit" in cases:
                doc["commit"] = commit(broker, args.transactions, not args.no_kafka)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    if "recovery" in cases:
        _progress("recovery")
        doc["recovery"] = recovery(args.recovery_rounds, args.recovery_timeout_ms,
                                   args.dir)
    doc["ratios"] = ratios(doc)
    doc["machine"]["load_1m"] = [load_before, os.getloadavg()[0]]
    return doc


def merge(old: dict[str, Any], new: dict[str, Any], cases: tuple[str, ...]
          ) -> dict[str, Any]:
    """`old` (a whole run's JSON) with the `cases` of `new` in place of its own, each
    stamped under "reruns" with when and under what load it ran; the ratios again."""
    doc = {**old, **{case: new[case] for case in cases}}
    stamp = {"utc": new["utc"], "quick": new["quick"], "load_1m": new["machine"]["load_1m"]}
    doc["reruns"] = {**old.get("reruns", {}), **dict.fromkeys(cases, stamp)}
    doc["ratios"] = ratios(doc)
    return doc


def profile(case: str, records: int) -> str:
    """cProfile of one case's run (after a warm-up): the top 10 by internal time."""
    root = tempfile.mkdtemp(prefix="logkit-bench-txn-prof-")
    try:
        with logkit.Broker(root) as broker:
            recs = make_records(BenchConfig(), records)
            if case in ("transactional", "idempotent", "non-idempotent"):
                options = {"transactional": {"transactional_id": "prof"},
                           "idempotent": {"enable_idempotence": True},
                           "non-idempotent": {"enable_idempotence": False}}[case]
                fn = _producer_run(broker, recs, **options)
            elif case == "commit":
                def fn() -> None:
                    commit_embedded(broker, 300)
            else:
                level, _, aborted = case.partition("+")
                committed = _fill(broker, "prof", recs, 10 if aborted else 0)
                fn = _consume_run(broker, "prof", level, committed)
            fn()
            prof = cProfile.Profile()
            prof.enable()
            fn()
            prof.disable()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(10)
    return text.getvalue()


def markdown(doc: dict[str, Any]) -> str:
    p, lat, rec = doc.get("produce"), doc.get("commit"), doc.get("recovery")
    lines = ["| case | records/s | ratio | goal |", "|---|---:|---:|---|"]
    r = doc["ratios"]
    for name, key in (("non-idempotent", None), ("idempotent", "idempotent_vs_plain"),
                      ("transactional (100 per transaction)",
                       "transactional_vs_idempotent")) if p else ():
        row = p[name.split(" ")[0]]
        ratio = f"{r[key]['ratio']:.2f}x" if key else ""
        goal = f">= {GOALS[key]}x: {'met' if r[key]['met'] else 'missed'}" if key else ""
        lines.append(f"| produce, {name} | {row['records_per_s']:,.0f} | {ratio} | {goal} |")
    for per in (1000, 10000) if p else ():
        row = p[f"transactional, {per} per transaction"]
        value = row["records_per_s"] / p["idempotent"]["records_per_s"]
        lines.append(f"| produce, transactional ({per} per transaction) | "
                     f"{row['records_per_s']:,.0f} | {value:.2f}x | |")
    for label, c in doc.get("consume", {}).items():
        for name in ("read_uncommitted", "read_committed"):
            row = c[name]
            ratio = goal = ""
            if name == "read_committed":
                value = c["read_committed"]["offsets_per_s"] / \
                    c["read_uncommitted"]["offsets_per_s"]
                ratio = f"{value:.2f}x"
                if label == "committed":
                    key = "read_committed_vs_uncommitted"
                    goal = f">= {GOALS[key]}x: {'met' if r[key]['met'] else 'missed'}"
            lines.append(f"| consume ({label}), {name} | {row['offsets_per_s']:,.0f} | "
                         f"{ratio} | {goal} |")
    if lat:
        lines += ["", "| commit_transaction() latency, 10 records | p50 ms | p99 ms |",
                  "|---|---:|---:|"]
    for name, row in (lat or {}).items():
        if isinstance(row, dict):
            lines.append(f"| {name} | {row['p50_ms']:.2f} | {row['p99_ms']:.2f} |")
    if not rec:
        return "\n".join(lines)
    lines += ["", f"Recovery of a SIGKILLed producer's open transaction ({rec['rounds']} "
              f"rounds): by the next init_transactions() {rec['by_next_init_s']['median']:.2f}"
              f" s median ({rec['by_next_init_s']['max']:.2f} s max, a new process's start "
              f"included); by the timeout ({rec['transaction_timeout_ms']} ms) "
              f"{rec['by_timeout_s']['median']:.2f} s median "
              f"({rec['by_timeout_s']['max']:.2f} s max)."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--records", type=int, default=200_000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--transactions", type=int, default=300,
                    help="commits timed per system in the latency case")
    ap.add_argument("--recovery-rounds", type=int, default=5)
    ap.add_argument("--recovery-timeout-ms", type=int, default=2000)
    ap.add_argument("--no-kafka", action="store_true", help="skip Apache Kafka")
    ap.add_argument("--quick", action="store_true", help="a smoke size")
    ap.add_argument("--dir", default=None)
    ap.add_argument("--json", metavar="FILE")
    ap.add_argument("--profile", choices=("transactional", "idempotent", "non-idempotent",
                                          "read_committed", "read_uncommitted",
                                          "read_committed+aborted", "commit"),
                    help="cProfile one case (+aborted: one transaction in ten aborted)")
    ap.add_argument("--cases", default=",".join(CASES), metavar="CASE,...",
                    help=f"a comma-separated subset of {','.join(CASES)} (default: all); "
                         f"with --json an existing file keeps the cases not run")
    args = ap.parse_args(argv)
    given = [c for c in args.cases.split(",") if c]
    if not given or set(given) - set(CASES):
        ap.error(f"--cases takes names among {','.join(CASES)}, not {args.cases!r}")
    args.cases = tuple(c for c in CASES if c in given)
    if args.quick:
        args.records, args.repeats, args.transactions = 10_000, 1, 20
        args.recovery_rounds = 1
    if args.profile:
        print(profile(args.profile, args.records))
        return 0
    doc = run(args)
    print(markdown(doc))
    if args.json and args.cases != CASES and os.path.exists(args.json):
        with open(args.json, encoding="utf-8") as f:
            doc = merge(json.load(f), doc, args.cases)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(doc, f, indent=1)
            f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
