#!/usr/bin/env python
"""Power-cut trials of logkit's storage (docs/powercut.md).

    python tools/powercut.py --trials 1000 --workload acks1 --workload flush1 --seed 1
    python tools/powercut.py --trials 50 --workload flush1 --keep /tmp/pc-failed

Records each workload once under strace, then runs --trials trials per workload: a
moment (uniform over the trace's file operations) and a mode (synced, prefix, subset:
docs/powercut.md), the directory a power cut then could leave, and the checks of the
promise on it. Prints per workload the trials and the violations by class, with one
example per class; writes one JSON line per trial to --results.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tests.powercut import check, runner  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workload", action="append", choices=sorted(runner.ALL_WORKLOADS))
    ap.add_argument("--trials", type=int, default=100, help="trials per workload")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--results", default="powercut-results.jsonl")
    ap.add_argument("--keep", default=None,
                    help="copy failing trials' directories (as the cut left them) here")
    ap.add_argument("--budget-s", type=float, default=None,
                    help="stop starting trials after this many seconds")
    args = ap.parse_args()
    logging.basicConfig(level=logging.ERROR)
    deadline = time.monotonic() + args.budget_s if args.budget_s else None
    out = open(args.results, "a")
    failed_total = 0
    for workload in args.workload or sorted(runner.WORKLOADS):
        rec = runner.record(workload, tempfile.mkdtemp(prefix=f"pc-{workload}-"))
        tr = rec.parse()
        trials = runner.plan(args.trials, args.seed, len(tr.ops))
        acks = sum(1 for op in tr.ops if op.kind == "ack")
        print(f"== {workload} (variant {rec.variant}): {tr.calls} calls traced, "
              f"{len(tr.ops)} operations, {acks} acknowledgements; {len(trials)} trials",
              flush=True)

        def progress(r):
            out.write(json.dumps(dict(r, workload=workload), sort_keys=True) + "\n")
            out.flush()
            if r["classes"]:
                print(f"   trial {r['trial']} cut {r['cut']} {r['mode']} seed "
                      f"{r['seed']}: {sorted(set(r['classes']))} {r['details'][0][:200]}",
                      flush=True)

        started = time.monotonic()
        results = runner.run(rec, trials, jobs=args.jobs, keep=args.keep,
                             deadline=deadline, progress=progress)
        summary = runner.summarize(results).get(rec.variant, {"trials": 0, "failed": 0,
                                                               "classes": {}})
        classes = {c: summary["classes"].get(c, 0) for c in check.CLASSES}
        extra = {c: n for c, n in summary["classes"].items() if c not in classes}
        failed_total += summary["failed"]
        print(f"   {workload}: {summary['trials']} trials in "
              f"{time.monotonic() - started:.0f} s, {summary['failed']} with violations; "
              f"by class {classes}{' ' + str(extra) if extra else ''}", flush=True)
    out.close()
    return 1 if failed_total else 0


if __name__ == "__main__":
    sys.exit(main())
