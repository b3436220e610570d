#!/usr/bin/env python
"""Crash-point enumeration of logkit's storage (docs/crashpoints.md).

    python tools/crashpoints.py --full                 # every call, every mode, every variant
    python tools/crashpoints.py --sample 5             # 5 call numbers per syscall
    python tools/crashpoints.py --variant flush1 --syscall pwrite64 --mode kill-after

Counts the workload's file-operation syscalls under strace, then runs one trial per
(variant, syscall, call number, mode) — at most --jobs at once — and prints per
variant/syscall/mode the crash points tried and the failures by class, with one
reproducer (the exact strace command, then the checker) per class. Results go to
--results as JSON lines.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tests.crashpoints import driver  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--full", action="store_true", help="every target, mode and variant")
    ap.add_argument("--variant", action="append", choices=driver.VARIANTS)
    ap.add_argument("--syscall", action="append", choices=driver.SYSCALLS)
    ap.add_argument("--mode", action="append")
    ap.add_argument("--sample", type=int, default=None,
                    help="call numbers per syscall (evenly spread); default all with --full")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--results", default="crashpoints-results.jsonl")
    ap.add_argument("--keep", default=None, help="copy failing trial directories here")
    ap.add_argument("--budget-s", type=float, default=None,
                    help="stop starting trials after this many seconds")
    args = ap.parse_args()
    if not args.full and args.sample is None and not args.syscall:
        ap.error("say --full, --sample N or --syscall")
    reason = driver.strace_usable()
    if reason:
        print(f"cannot run: {reason}", file=sys.stderr)
        return 2
    variants = tuple(args.variant or driver.VARIANTS)
    deadline = time.monotonic() + args.budget_s if args.budget_s else None
    all_results = []
    out = open(args.results, "a")
    for variant in variants:
        counted = driver.count(variant, tempfile.mkdtemp(prefix=f"cp-count-{variant}-"))
        baseline = counted["baseline_check"].get("failures", [])
        print(f"== {variant}: {len(counted['targets'])} targets; per-thread maxima "
              f"{counted['maxima']}; baseline failures {baseline}; baseline raw errors "
              f"{sorted(driver.baseline_raw_errors(counted))}", flush=True)
        work = driver.plan(counted["targets"],
                           modes=tuple(args.mode) if args.mode else None,
                           syscalls=tuple(args.syscall) if args.syscall else None,
                           sample=None if args.full and args.sample is None else args.sample)
        print(f"   {len(work)} trials", flush=True)
        done = [0]

        def progress(r, total=len(work)):
            done[0] += 1
            out.write(json.dumps(r) + "\n")
            out.flush()
            if r["classes"]:
                print(f"   [{done[0]}/{total}] {r['syscall']}#{r['n']} {r['mode']}: "
                      f"{sorted(set(r['classes']))} {r['details'][0][:160]}", flush=True)

        all_results += driver.run_plan(variant, counted, work, jobs=args.jobs,
                                       keep=args.keep, deadline=deadline,
                                       progress=progress)
    out.close()
    table = driver.summarize(all_results)
    print()
    print(driver.format_table(table))
    print()
    seen = set()
    for key in sorted(table):
        for cls, (repro, detail) in sorted(table[key]["examples"].items()):
            if (cls, key[1], key[2]) in seen:
                continue
            seen.add((cls, key[1], key[2]))
            print(f"{cls} {'/'.join(key)}: {detail[:300]}\n    {repro}")
    failed = sum(1 for r in all_results if r["classes"])
    print(f"\n{len(all_results)} trials, {failed} with failures")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
