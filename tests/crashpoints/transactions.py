"""Transactions under crash points (issue 33, DESIGN §15: "a two-phase commit that a
crash at any step completes or aborts at the next open"): the `txn` workload and the
check of what a kill or an injected error at any file or LMDB operation leaves.

* `txn_workload` — variant `txn`. A source topic fed with plain records (ledgered as
  `record`, checked by check.py's usual rule), then transactions of transactional id
  `cp` over three partitions of topic `x`, each sending records to every partition and
  the source offset it "consumed" to group `txg`: committed ones, aborted ones, one left
  open and aborted by a second producer's `init_transactions()` (the fence), and the
  last left open (`broker.close()` aborts it through the producer's close; a kill
  before that leaves it to the timeout or the next init).
  Before each it ledgers `txn-begin` (the intent: its values, partitions, offset, and
  whether it commits), after `commit_transaction()`/`abort_transaction()` returned
  `txn-end` (with the offsets its records got). Every transaction call runs between
  opens of `LEDGER.txn-begin` and `LEDGER.txn-end` (outside the root), so a trace shows
  which file operations belong to init_transactions, a send, send_offsets, a commit or
  an abort (`txn_targets`).
* `check_transactions` — run by check.py after its usual checks, in each of its phases.
  After the reopen (which finishes a `Prepare*` left by a crash): no `Prepare*` is left;
  a transaction whose commit returned is visible whole, its records at their offsets;
  one whose abort returned shows nothing to read_committed; one in doubt (begun, its end
  unknown) shows all of its records or none, on every partition; the group's committed
  offset is the one of the last transaction visible (offsets and records atomically);
  exactly one control record per partition follows each finished transaction's records
  and none the open one's; the last stable offset is the first offset of the open
  transaction, else the high watermark. Then the open transaction is ended the two ways
  Kafka ends a dead producer's — after its timeout (`abort_expired`) or by the next
  `init_transactions()`, one in the first phase and the other after the roll, which
  first by the ledger's length — and all of it is checked again, with no transaction
  open.
* variant `txnsync` (the power-cut harness's, tests/powercut/): `txn` plus a
  `broker.flush()` after the source records and after every third transaction, between
  a `syncing` and a `synced` entry (as `acks1sync`'s), so the source records a
  transaction's offsets name are durable at a known point; the source topic gets `x`'s
  small segments and index. Same calls otherwise.
"""

from __future__ import annotations

import os
import time

TOPIC, SOURCE, GROUP, TRANSACTIONAL_ID = "x", "xsrc", "txg", "cp"
PARTITIONS = 3
PER_PARTITION = 2                 # records per partition per transaction
CONFIG = {"segment.bytes": 2048, "segment.index.bytes": 1024, "index.interval.bytes": 512}
VALUE_BYTES = 120
SOURCE_RECORDS = 16
# (commit?, leave open and fence with a new producer's init?) per transaction
PLAN = ((True, False), (True, False), (False, False), (True, False), (None, True),
        (True, False), (False, False), (True, False), (None, False))
FAR_FUTURE_MS = 1 << 62


def value_of(txn: int, partition: int, n: int) -> bytes:
    head = f"tx{txn}:{partition}:{n}:".encode()
    return head + bytes((txn * 31 + n) % 251 for _ in range(VALUE_BYTES - len(head)))


def tag_of(value: bytes | None) -> str:
    """`tx3` for a record of transaction 3; `probe` for the checker's probes."""
    return (value or b"").split(b":", 1)[0].decode(errors="replace")


def _mark(path: str) -> None:
    """Open a marker file outside the root (a trace shows which call follows). An
    injection whose numbering thread timing moved onto this open is not logkit's."""
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o600))
    except OSError:
        pass


# ---- the workload ------------------------------------------------------------------------

class _Txn:
    """The workload's transactional producer, remade after a failure or a fence."""

    def __init__(self, run, broker, ledger_path: str) -> None:
        self.run, self.broker, self.ledger_path = run, broker, ledger_path
        self.producer = None

    def call(self, op: str, fn, *args, **kwargs):
        _mark(f"{self.ledger_path}.txn-begin.{op}")
        try:
            return self.run.guard(op, fn, *args, **kwargs)
        finally:
            _mark(self.ledger_path + ".txn-end")

    def fresh(self) -> bool:
        """A new producer of the id, initialised (fencing the last one)."""
        ok, producer = self.run.guard("producer", self.broker.producer,
                                      transactional_id=TRANSACTIONAL_ID, linger_ms=60000,
                                      batch_size=1 << 20)
        if not ok:
            return False
        ok, _ = self.call("init_transactions", producer.init_transactions)
        if ok:
            self.run.ledger.ack(kind="txn-init")
            self.producer = producer
        return ok

    def one(self, number: int, commit: bool | None, source_offset: int) -> None:
        """Transaction `number`: records to every partition, the source offset; then
        commit (True), abort (False) or leave it open (None)."""
        if self.producer is None and not self.fresh():
            return
        p = self.producer
        values = {part: [value_of(number, part, n) for n in range(PER_PARTITION)]
                  for part in range(PARTITIONS)}
        self.run.ledger.ack(kind="txn-begin", txn=number, commit=commit,
                            offset=source_offset,
                            values={str(k): [tag3(v) for v in vs]
                                    for k, vs in values.items()})
        ok, _ = self.call("begin_transaction", p.begin_transaction)
        futures = []
        for part, vs in values.items():
            for v in vs:
                sent, future = self.call("send", p.send, TOPIC, v, key=b"k%d" % part,
                                         partition=part) if ok else (False, None)
                if sent:
                    futures.append((part, tag3(v), future))
        if ok:
            ok, _ = self.call("send_offsets", p.send_offsets_to_transaction,
                              {_tp(SOURCE, 0): source_offset}, GROUP)
        if commit is None:
            self.call("flush", p.flush)           # its records in the log, left open
            return
        ended, _ = self.call("commit" if commit else "abort",
                             p.commit_transaction if commit and ok else p.abort_transaction)
        if ended:
            offsets = {}
            for part, tag, future in futures:
                got, meta = self.run.guard("ack", future.result, 30)
                if got:
                    offsets[tag] = [part, meta.offset]
            self.run.ledger.ack(kind="txn-end", txn=number,
                                committed=bool(commit and ok), offsets=offsets)
            return
        # the end failed: the outcome is in doubt; abort what can be, start afresh
        if commit and ok:
            aborted, _ = self.call("abort", p.abort_transaction)
            if aborted:
                self.run.ledger.ack(kind="txn-end", txn=number, committed=False,
                                    offsets={})
        self.run.guard("producer.close", p.close)
        self.producer = None


def tag3(value: bytes) -> str:
    """`tx3:1:0`: transaction, partition and number of a workload value."""
    return ":".join(value.decode(errors="replace").split(":", 3)[:3])


def txn_workload(root: str, variant: str, ledger_path: str) -> int:
    import logkit

    from .workload import Ledger, Runner
    ledger = Ledger(ledger_path)
    run = Runner(ledger, "main")
    ok, broker = run.guard("open", logkit.Broker, root, background=False)
    if not ok:
        return 0
    synced = variant == "txnsync"
    # txnsync: a small index for the source too (the power-cut trace holds each
    # index's whole map at every msync)
    for name, count, config in ((TOPIC, PARTITIONS, CONFIG),
                                (SOURCE, 1, CONFIG if synced else {})):
        ok, _ = run.guard("create_topic", broker.create_topic, name, count, config=config)
        if ok:
            ledger.ack(kind="created", topic=name)
    ok, feeder = run.guard("producer", broker.producer, acks=1, linger_ms=60000)
    if ok:
        from .workload import produce
        produce(run, feeder, SOURCE, "src", 0, SOURCE_RECORDS)
        run.guard("producer.close", feeder.close)
    if synced:
        _flush(run, broker)
    txn = _Txn(run, broker, ledger_path)
    for number, (commit, fence) in enumerate(PLAN):
        txn.one(number, commit, source_offset=number + 1)
        if synced and number % 3 == 2:
            _flush(run, broker)
        if fence:        # a second producer of the id fences the first, aborting its txn
            old, txn.producer = txn.producer, None
            if txn.fresh() and old is not None:
                run.ledger.ack(kind="txn-end", txn=number, committed=False, offsets={},
                               by="init_transactions")
            if old is not None:
                run.guard("producer.close", old.close)
    # the last transaction stays open: the producer dies with the process
    ok, _ = run.guard("close", broker.close)
    if ok:
        ledger.ack(kind="closed")
    return 0


def _flush(run, broker) -> None:
    """`txnsync`'s sync point: everything acknowledged before `syncing` is durable once
    `synced` is ledgered."""
    run.ledger.ack(kind="syncing")
    ok, _ = run.guard("flush", broker.flush)
    if ok:
        run.ledger.ack(kind="synced")


def _tp(topic: str, partition: int):
    from logkit.topic import TopicPartition
    return TopicPartition(topic, partition)


# ---- the check ---------------------------------------------------------------------------

def check_transactions(checker, broker) -> None:
    """The promise (module docstring) as the crash left it, then after ending the open
    transaction — by its timeout or by an init_transactions(), the one in the first
    phase and the other after the roll, which first by the ledger's length (so trials
    that stop at different points try both) — again."""
    ways = ("timeout", "init") if len(checker.entries) % 2 else ("init", "timeout")
    finish = ways[0] if checker.phase == "reopen" else ways[1]
    begun = {e["txn"]: e for e in checker.entries if e["kind"] == "txn-begin"}
    if not begun:
        return
    ended = {e["txn"]: e for e in checker.entries if e["kind"] == "txn-end"}
    coordinator = broker.transaction_coordinator
    state = coordinator.state(TRANSACTIONAL_ID)
    if state in ("PrepareCommit", "PrepareAbort", "PrepareEpochFence"):
        checker.fail("integrity", f"transaction {TRANSACTIONAL_ID!r} still {state} after "
                     "the open (the open finishes a prepared transaction)")
    _check_state(checker, broker, begun, ended, open_allowed=state == "Ongoing")
    try:
        if finish == "timeout":
            coordinator.abort_expired(now_ms=FAR_FUTURE_MS)
        else:
            with broker.producer(transactional_id=TRANSACTIONAL_ID) as producer:
                producer.init_transactions()
    except BaseException as exc:         # noqa: BLE001
        from .check import describe
        checker.fail("integrity", f"ending the open transaction by {finish}: "
                     f"{describe(exc)}")
        return
    state = coordinator.state(TRANSACTIONAL_ID)
    if state not in ("Empty", "CompleteCommit", "CompleteAbort"):
        checker.fail("integrity", f"after {finish}: transaction {TRANSACTIONAL_ID!r} "
                     f"is {state}")
    _check_state(checker, broker, begun, ended, open_allowed=False, after=finish)


def _check_state(checker, broker, begun: dict, ended: dict, *, open_allowed: bool,
                 after: str = "") -> None:
    from .check import describe
    where = f"[{after}] " if after else ""
    try:
        parts = broker.topic(TOPIC).partitions
        logs = []
        for p in parts:
            everything = _records(p, "read_uncommitted")
            visible = _records(p, "read_committed")
            logs.append((p, everything, visible, p.last_stable_offset, p.high_watermark,
                         p.log_start_offset, p.open_transactions()))
        committed = broker.group(GROUP).committed().get(_tp(SOURCE, 0))
    except BaseException as exc:         # noqa: BLE001
        checker.fail("integrity", f"{where}reading {TOPIC}: {describe(exc)}")
        return
    in_log: dict[int, int] = {}          # txn -> how many of its records the log holds
    shown: dict[int, int] = {}           # txn -> how many read_committed returns
    at: dict[str, int] = {}              # tag3 -> offset
    for p, everything, visible, *_ in logs:
        for offset, value in everything:
            tag = tag_of(value)
            if tag.startswith("tx"):
                in_log[int(tag[2:])] = in_log.get(int(tag[2:]), 0) + 1
                at[tag3(value)] = offset
        for _, value in visible:
            tag = tag_of(value)
            if tag.startswith("tx"):
                shown[int(tag[2:])] = shown.get(int(tag[2:]), 0) + 1
    open_txn = max(begun) if open_allowed else None
    visible_txns = []
    for number, intent in sorted(begun.items()):
        total = sum(len(v) for v in intent["values"].values())
        end = ended.get(number)
        n_shown, n_log = shown.get(number, 0), in_log.get(number, 0)
        name = f"{where}txn {number}"
        if n_shown > n_log or n_log > total:
            checker.fail("integrity", f"{name}: {n_log} records in the log, {n_shown} "
                         f"visible, {total} sent")
        if end is not None and end["committed"]:
            if n_shown != total:
                checker.fail("integrity", f"{name}: committed (acknowledged) but "
                             f"read_committed shows {n_shown} of its {total} records")
            for tag, (part, offset) in end["offsets"].items():
                if at.get(tag) != offset:
                    checker.fail("integrity", f"{name}: {tag} acknowledged at {part}/"
                                 f"{offset}, found at {at.get(tag)}")
        elif end is not None and n_shown:
            checker.fail("integrity", f"{name}: aborted (acknowledged) but read_committed "
                         f"shows {n_shown} of its records")
        elif n_shown not in (0, total):
            checker.fail("integrity", f"{name}: in doubt, and read_committed shows "
                         f"{n_shown} of its {total} records (a partial transaction)")
        if number == open_txn and n_shown:
            checker.fail("integrity", f"{name}: open, yet read_committed shows "
                         f"{n_shown} of its records")
        if n_shown == total and total:
            visible_txns.append(number)
    # the offsets go with the records
    want = begun[max(visible_txns)]["offset"] if visible_txns else None
    if committed != want:
        checker.fail("integrity", f"{where}group {GROUP}: committed {SOURCE}-0 is "
                     f"{committed}, but the last visible transaction "
                     f"({max(visible_txns) if visible_txns else None}) sent {want}")
    for p, everything, _, lso, hw, start, open_txns in logs:
        _check_markers(checker, f"{where}{TOPIC}-{p.partition}", everything, lso, hw,
                       start, open_txns, open_txn)


def _check_markers(checker, name: str, everything: list, lso: int, hw: int, start: int,
                   open_txns: dict, open_txn: int | None) -> None:
    """One control record after each finished transaction's records on the partition,
    none after the open one's; the LSO at the open transaction's first offset."""
    runs: list[list] = []                    # [tag, first offset, last offset]
    for offset, value in everything:
        tag = tag_of(value)
        if runs and runs[-1][0] == tag and tag != "probe":
            runs[-1][2] = offset
        else:
            runs.append([tag, offset, offset])
    for i, (tag, first, last) in enumerate(runs):
        following = runs[i + 1][1] if i + 1 < len(runs) else hw
        gap = following - last - 1
        finished = tag.startswith("tx") and int(tag[2:]) != open_txn
        if gap != (1 if finished else 0):
            checker.fail("integrity", f"{name}: {gap} offsets without a record after "
                         f"{tag}'s records {first}..{last} (want {int(finished)} marker)")
    open_first = [first for tag, first, _ in runs
                  if open_txn is not None and tag == f"tx{open_txn}"]
    want_lso = open_first[0] if open_first else hw
    if lso != want_lso:
        checker.fail("integrity", f"{name}: last stable offset {lso}, want {want_lso} "
                     f"(high watermark {hw}, open {open_txns})")
    if bool(open_txns) != bool(open_first):
        checker.fail("integrity", f"{name}: open transactions {open_txns}, yet the "
                     f"records of an open one start at {open_first}")
    if runs and runs[0][1] > start and start == 0:
        checker.fail("integrity", f"{name}: {runs[0][1]} offsets without a record "
                     "before the first")


def _records(partition, isolation_level: str) -> list[tuple[int, bytes]]:
    out = []
    offset, stop = partition.log_start_offset, partition.log_end_offset
    while offset < stop:
        fetched = partition.fetch_records(offset, 1000, isolation_level=isolation_level)
        out += [(r.offset, r.value) for r in fetched.records]
        if fetched.next_offset <= offset:
            break
        offset = fetched.next_offset
    return out


def txn_targets(prefix: str, ledger: str, targets: dict) -> dict:
    """Of the driver's targets, those whose call ran inside a transaction call of the
    workload (between its txn-begin.<op> and txn-end opens) in the counting run's
    traces: {key: (Target, op)}, op the first call it was seen in (init_transactions,
    begin_transaction, send, send_offsets, flush, commit, abort)."""
    from .compaction import _LINE
    from .driver import SYSCALLS
    inside_keys: dict[str, str] = {}
    directory, base = os.path.split(prefix)
    for name in sorted(os.listdir(directory)):
        if not name.startswith(base + "."):
            continue
        counts: dict[str, int] = {}
        inside = None
        with open(os.path.join(directory, name), errors="replace") as f:
            for raw in f:
                m = _LINE.match(raw)
                if not m or m.group(1) not in SYSCALLS:
                    continue
                syscall = m.group(1)
                counts[syscall] = n = counts.get(syscall, 0) + 1
                if syscall == "openat" and ledger + ".txn-begin." in raw:
                    inside = raw.split(ledger + ".txn-begin.", 1)[1].split('"')[0]
                    inside = inside.split(">")[0]
                elif syscall == "openat" and ledger + ".txn-end" in raw:
                    inside = None
                elif inside is not None:
                    inside_keys.setdefault(f"{syscall}#{n}", inside)
    return {k: (t, inside_keys[k]) for k, t in targets.items() if k in inside_keys}


def interleaved(work: list) -> list:
    """The plan reordered round-robin over (syscall, mode), each one's call numbers in
    a fixed shuffled order, so any prefix of it spreads over every system call, mode
    and stretch of the workload."""
    import random
    queues: dict[tuple, list] = {}
    for target, mode in work:
        queues.setdefault((target.syscall, mode), []).append((target, mode))
    for key in sorted(queues):
        random.Random(f"{key}").shuffle(queues[key])
    out: list = []
    while any(queues.values()):
        for key in sorted(queues):
            if queues[key]:
                out.append(queues[key].pop(0))
    return out


def main(argv: list[str]) -> int:
    """`python -m tests.crashpoints.transactions [--jobs N] [--results PATH]`: every
    transaction-call target in every mode (the full count docs/crashpoints.md reports)."""
    import argparse
    import json
    import tempfile

    from . import driver
    ap = argparse.ArgumentParser(description=main.__doc__)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--results", default="crashpoints-txn.jsonl")
    ap.add_argument("--sample", type=int, default=None)
    ap.add_argument("--mode", action="append", help="only these modes (default all)")
    ap.add_argument("--budget-s", type=float, default=None,
                    help="stop starting trials after this many seconds (the order is "
                    "interleaved, so a cut leaves every system call sampled)")
    args = ap.parse_args(argv)
    workdir = tempfile.mkdtemp(prefix="cp-txn-count-")
    counted = driver.count("txn", workdir)
    inside = txn_targets(os.path.join(workdir, "trace"), os.path.join(workdir, "ledger"),
                         counted["targets"])
    ops: dict[str, int] = {}
    for _, op in inside.values():
        ops[op] = ops.get(op, 0) + 1
    work = interleaved(driver.plan({k: t for k, (t, _) in inside.items()},
                                   sample=args.sample,
                                   modes=tuple(args.mode) if args.mode else None))
    print(f"txn: {len(counted['targets'])} targets, {len(inside)} inside transaction "
          f"calls {ops}, {len(work)} trials; baseline {counted['baseline_check']}",
          flush=True)
    started = time.monotonic()
    deadline = started + args.budget_s if args.budget_s else None
    with open(args.results, "a") as out:
        def progress(r):
            r["op"] = inside[f"{r['syscall']}#{r['n']}"][1]
            out.write(json.dumps(r) + "\n")
            out.flush()
            if r["classes"]:
                print(f"  {r['op']} {r['syscall']}#{r['n']} {r['mode']}: "
                      f"{sorted(set(r['classes']))} {r['details'][0][:300]}", flush=True)
        results = driver.run_plan("txn", counted, work, jobs=args.jobs, progress=progress,
                                  deadline=deadline)
    print(driver.format_table(driver.summarize(results)))
    failed = sum(1 for r in results if r["classes"])
    print(f"{len(results)} trials in {time.monotonic() - started:.0f} s, {failed} with "
          "failures")
    return 1 if failed else 0


if __name__ == "__main__":
    import sys
    sys.exit(main(sys.argv[1:]))
