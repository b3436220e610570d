"""Power-cut trials: record a workload once, then for each trial pick a moment and a
mode, materialise what a power cut then could leave, and check the promise on it.

Owns the workloads (`WORKLOADS`, and `COMPACTION_WORKLOADS` and `TXN_WORKLOADS` kept
apart: a name -> the crash-point workload variant it runs),
the trial plan (seeded: a trial is reproducible from its workload, cut, mode and seed),
and running trials in worker processes (each parses the trace once, and checks in a
fresh directory per trial).
"""

from __future__ import annotations

import json
import logging
import os
import random
import shutil
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context

from . import check, model, trace

# name -> crash-point workload variant (tests/crashpoints/workload.py)
WORKLOADS = {
    # acks=1, the default flush policy; a broker.flush() after each group commit
    "acks1": "acks1sync",
    # flush.messages=1 on topic t, acks="all": every append is synced before its ack
    "flush1": "flush1",
    # acks1 with a second process appending to t's partitions meanwhile
    "twowriters": "twowriterssync",
}
# log compaction (tests/crashpoints/compaction.py): kept apart from WORKLOADS, which the
# storage slice (tests/tools/test_powercut.py) runs whole; tests/storage/
# test_compaction_crash.py runs this one
COMPACTION_WORKLOADS = {
    # one compacted partition: keyed appends and tombstones, rolls, three cleaning
    # passes, a broker.flush() before each
    "clean": "cleansync",
}
# transactions (tests/crashpoints/transactions.py): kept apart too; tests/tools/
# test_powercut_txn.py runs it
TXN_WORKLOADS = {
    # transactional id `cp` over three partitions: commits, aborts, a fence, one left
    # open, offsets sent in each; a broker.flush() after the source and every third
    "txn": "txnsync",
}
ALL_WORKLOADS = {**WORKLOADS, **COMPACTION_WORKLOADS, **TXN_WORKLOADS}
CHUNK = 20


class Recorded:
    """A workload's trace, its ledger, and the paths they came from."""

    def __init__(self, workload: str, workdir: str) -> None:
        self.workload = workload
        self.variant = ALL_WORKLOADS[workload]
        self.root = os.path.join(workdir, "root")
        self.ledger = os.path.join(workdir, "ledger")
        self.trace_path = os.path.join(workdir, "trace")

    def record(self) -> None:
        proc = trace.record(self.root, self.variant, self.ledger, self.trace_path)
        if proc.returncode != 0:
            raise RuntimeError(f"traced workload failed ({proc.returncode}): "
                               f"{proc.stderr[-2000:]}")
        events = self.ledger + ".events"
        if os.path.exists(events) and os.path.getsize(events):
            with open(events) as f:
                raise RuntimeError(f"traced workload raised: {f.read()[:2000]}")

    def parse(self) -> trace.Trace:
        return trace.parse(self.trace_path, self.root, self.ledger)


def record(workload: str, workdir: str | None = None) -> Recorded:
    rec = Recorded(workload, workdir or tempfile.mkdtemp(prefix=f"pc-{workload}-"))
    rec.record()
    return rec


def plan(n: int, seed: int, n_ops: int) -> list[dict]:
    """n trials: the cut uniform over the trace's operations, the modes in turn."""
    rng = random.Random(seed)
    return [{"trial": i, "cut": rng.randint(1, n_ops), "mode": model.MODES[i % 3],
             "seed": rng.getrandbits(32)} for i in range(n)]


def run_trial(tr: trace.Trace, variant: str, trial: dict, keep: str | None = None,
              acks_override: list[dict] | None = None,
              rng: random.Random | None = None) -> dict:
    """One trial; returns its result (classes empty when the promise held). Tests pass
    `acks_override` (a ledger of their own) or `rng` (a chooser of their own)."""
    started = time.monotonic()
    written = [op.entry for op in tr.ops if op.kind == "ack"]
    acks = [op.entry for op in tr.ops[:trial["cut"]] if op.kind == "ack"]
    if acks_override is not None:
        acks = acks_override
    durable = check.durable_entries(acks, variant)
    workdir = tempfile.mkdtemp(prefix="pc-trial-")
    dest = os.path.join(workdir, "root")
    try:
        state = model.materialise(tr, trial["cut"], trial["mode"],
                                  rng or random.Random(trial["seed"]), dest)
        kept_copy = None
        if keep:
            kept_copy = os.path.join(workdir, "as-cut")
            shutil.copytree(dest, kept_copy)
        try:
            failures = check.check(dest, durable, written)
        except BaseException as exc:          # noqa: BLE001 — a harness bug, reported
            failures = [{"class": "harness-error", "phase": "check",
                         "detail": f"{type(exc).__name__}: {exc}"[:600]}]
        if failures and keep:
            target = os.path.join(keep, f"{variant}-{trial['trial']}-{trial['cut']}-"
                                  f"{trial['mode']}")
            shutil.rmtree(target, ignore_errors=True)
            shutil.copytree(kept_copy, target)
        return dict(trial, variant=variant, acked=len(acks), durable=sum(
            1 for e in durable if e["kind"] == "record"),
            classes=[f["class"] for f in failures],
            details=[f"{f['phase']}: {f['detail']}" for f in failures],
            entries_kept=state.entries_kept, entries_dropped=state.entries_dropped,
            content_kept=state.content_kept, content_dropped=state.content_dropped,
            seconds=round(time.monotonic() - started, 3))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


_parsed: dict[str, trace.Trace] = {}


def _chunk(args: tuple) -> list[dict]:
    trace_path, root, ledger, variant, trials, keep = args
    logging.getLogger("logkit").setLevel(logging.ERROR)    # recovery reports are expected
    if trace_path not in _parsed:
        _parsed[trace_path] = trace.parse(trace_path, root, ledger)
    return [run_trial(_parsed[trace_path], variant, t, keep) for t in trials]


def run(rec: Recorded, trials: list[dict], *, jobs: int = 1, keep: str | None = None,
        deadline: float | None = None, progress=None) -> list[dict]:
    """Run the trials, at most `jobs` worker processes at once; a deadline (monotonic)
    stops handing out chunks after it."""
    chunks = [trials[i:i + CHUNK] for i in range(0, len(trials), CHUNK)]
    results: list[dict] = []
    # a pool that recycles its workers (max_tasks_per_child) can hang on Python 3.11
    with ProcessPoolExecutor(max_workers=jobs, mp_context=get_context("spawn")) as pool:
        pending = []
        for c in chunks:
            pending.append(pool.submit(_chunk, (rec.trace_path, rec.root, rec.ledger,
                                                rec.variant, c, keep)))
        for fut in pending:
            if deadline is not None and time.monotonic() > deadline:
                fut.cancel()
                continue
            for r in fut.result():
                results.append(r)
                if progress:
                    progress(r)
    return results


def summarize(results: list[dict]) -> dict:
    out: dict = {}
    for r in results:
        s = out.setdefault(r["variant"], {"trials": 0, "failed": 0, "by_mode": {},
                                          "classes": {}})
        s["trials"] += 1
        s["by_mode"][r["mode"]] = s["by_mode"].get(r["mode"], 0) + 1
        if r["classes"]:
            s["failed"] += 1
        for cls in set(r["classes"]):
            s["classes"][cls] = s["classes"].get(cls, 0) + 1
    return out


def dumps(result: dict) -> str:
    return json.dumps(result, sort_keys=True)
