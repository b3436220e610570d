"""Log compaction under crash points and power cuts: the cleaner's model, the `clean`
workload, and the check of a compacted partition after a kill or a cut (issue 32).

* `clean_pass` — what one cleaning pass leaves (Kafka's rules, DESIGN §16): below the
  first uncleanable offset (the active segment's base; min.compaction.lag.ms is 0 here)
  a record survives when it is its key's latest there; a tombstone also needs its delete
  horizon (stamped by the first pass that kept it: that pass's now + delete.retention.ms)
  not to have passed. The model test (tests/storage/test_compaction_model.py) and the
  checker below both judge the cleaner by it.
* `clean_workload` — variants `clean` (crash points) and `cleansync` (power cuts: a
  `broker.flush()` between `syncing` and `synced` entries after each phase, and `rolled`
  entries). One compacted partition, keyed appends with tombstones, rolls and three
  cleaning passes at chosen clocks. Before each pass it ledgers `cleaning` (the records
  present, the segment bases, the first uncleanable offset `below`, `now_ms`), after it
  `cleaned` (the records present then, and the report). It opens `LEDGER.pass-begin` and
  `LEDGER.pass-end` (outside the root) around each `compact()`, so a trace shows which
  file operations belong to a pass (`pass_targets`).
* `check_compacted` — run by tests/crashpoints/check.py (and so by the power-cut
  checker) for the compacted topic instead of its "every acknowledged record at its
  offset" rule, which compaction breaks on purpose.

The promise checked: offsets strictly increasing; every record present is one written at
that offset (key and value agree with the ledger, none twice); every key's latest
acknowledged record is present, or a later record of its key is, or it is a tombstone
whose horizon a later pass passed; acknowledged records above the last pass's range all
present; below it, each segment of the last pass holds its records as before the pass or
as after it (`clean_pass`), whole; a pass that returned left exactly the model's records;
no `.cleaned` or `.swap` file, nor the staging directory, after the open.
"""

from __future__ import annotations

import os
import re

TOPIC = "c"
KEYS = 5
DELETE_RETENTION_MS = 60_000
CONFIG = {"cleanup.policy": "compact", "segment.bytes": 4096, "segment.index.bytes": 1024,
          "index.interval.bytes": 1024, "delete.retention.ms": DELETE_RETENTION_MS,
          "min.compaction.lag.ms": 0}
VALUE_BYTES = 300
PER_BATCH = 6
# (batches appended, roll after them, the pass's clock after the first pass's, in ms)
PHASES = ((8, True, 0), (4, True, DELETE_RETENTION_MS + 1), (2, False,
                                                               DELETE_RETENTION_MS + 2))
LEFTOVER_SUFFIXES = (".cleaned", ".swap")
LEFTOVER_NAMES = ("cleaner.tmp",)        # the pass's staging directory (logkit/loader.py)


# ---- the model ---------------------------------------------------------------------------

def clean_pass(present: dict[int, tuple[str, bool]], horizons: dict[int, int], below: int,
               now_ms: int, delete_retention_ms: int
               ) -> tuple[dict[int, tuple[str, bool]], dict[int, int]]:
    """One pass over `present` ({offset: (key, is_tombstone)}): the records it keeps and
    the delete horizons of the tombstones it kept ({offset: ms})."""
    latest: dict[str, int] = {}
    for offset, (key, _) in present.items():
        if offset < below and offset > latest.get(key, -1):
            latest[key] = offset
    kept: dict[int, tuple[str, bool]] = {}
    stamped: dict[int, int] = {}
    for offset, (key, tombstone) in sorted(present.items()):
        if offset >= below:
            kept[offset] = (key, tombstone)
            if offset in horizons:
                stamped[offset] = horizons[offset]
            continue
        if latest[key] != offset:
            continue
        if tombstone:
            horizon = horizons.get(offset)
            if horizon is not None and now_ms >= horizon:
                continue
            stamped[offset] = now_ms + delete_retention_ms if horizon is None else horizon
        kept[offset] = (key, tombstone)
    return kept, stamped


# ---- the workload ------------------------------------------------------------------------

def key_of(n: int) -> str:
    return f"k{n % KEYS}"


def is_tombstone(n: int) -> bool:
    return n % 9 == 4


def value_of(n: int) -> bytes | None:
    if is_tombstone(n):
        return None
    head = f"c:{n}:".encode()
    return head + bytes((n * 13 + i) % 251 for i in range(VALUE_BYTES - len(head)))


def present_records(partition) -> list[list]:
    """[[offset, key, is_tombstone], ...] of every record now in the partition."""
    out, offset = [], partition.log_start_offset
    end = partition.log_end_offset
    while offset < end:
        fetched = partition.fetch_records(offset, 500)
        for r in fetched.records:
            out.append([r.offset, (r.key or b"").decode(), r.value is None])
        if fetched.next_offset <= offset:
            break
        offset = fetched.next_offset
    return out


def _mark(path: str) -> None:
    """An openat outside the root that a trace shows between the pass's calls (an error
    injected into it is the harness's, not logkit's: ignored)."""
    try:
        os.close(os.open(path, os.O_RDONLY | os.O_CREAT | os.O_CLOEXEC, 0o600))
    except OSError:
        pass


def clean_workload(root: str, variant: str, ledger_path: str) -> int:
    import time

    import logkit

    from .workload import Ledger, Runner
    ledger = Ledger(ledger_path)
    run = Runner(ledger, "main")
    synced = variant == "cleansync"
    ok, broker = run.guard("open", logkit.Broker, root, background=False,
                           config={"log.cleaner.enable": False})   # only our passes
    if not ok:
        return 0
    ok, _ = run.guard("create_topic", broker.create_topic, TOPIC, 1, config=CONFIG)
    if ok:
        ledger.ack(kind="created", topic=TOPIC)
    ok, topic = run.guard("topic", broker.topic, TOPIC)
    if not ok:
        run.guard("close", broker.close)
        return 0
    p = topic.partition(0)
    t0 = int(time.time() * 1000) + 1000       # after every record's timestamp
    n, active = 0, 0
    for number, (batches, roll, clock_ms) in enumerate(PHASES, 1):
        for _ in range(batches):
            rows = [(key_of(m).encode(), value_of(m), None, None)
                    for m in range(n, n + PER_BATCH)]
            ok, base = run.guard("append", p.append, rows)
            if ok:
                for i, m in enumerate(range(n, n + PER_BATCH)):
                    ledger.ack(kind="record", topic=TOPIC, partition=0, offset=base + i,
                               key=key_of(m), value=None if is_tombstone(m) else f"c:{m}")
            n += PER_BATCH
            active = ledger_roll(run, p, active)
        if roll:
            run.guard("roll", p.roll)
            active = ledger_roll(run, p, active)
        if synced:
            ledger.ack(kind="syncing")
            ok, _ = run.guard("flush", broker.flush)
            if ok:
                ledger.ack(kind="synced")
        clean(run, p, ledger, ledger_path, number, t0 + clock_ms)
        active = ledger_roll(run, p, active)
    ok, _ = run.guard("close", broker.close)
    if ok:
        ledger.ack(kind="closed")
    return 0


def ledger_roll(run, partition, seen: int) -> int:
    """Ledger the active segment's base when it moved (a roll synced what is below)."""
    ok, bases = run.guard("bases", partition.segment_base_offsets)
    if ok and bases and bases[-1] > seen:
        run.ledger.ack(kind="rolled", topic=TOPIC, partition=0, below=bases[-1])
        return bases[-1]
    return seen


def clean(run, p, ledger, ledger_path: str, number: int, now_ms: int) -> None:
    ok, pre = run.guard("pre-read", present_records, p)
    ok2, bases = run.guard("bases", p.segment_base_offsets)
    if not (ok and ok2):
        return
    ledger.ack(kind="cleaning", topic=TOPIC, partition=0, number=number, now_ms=now_ms,
               below=bases[-1], bases=bases, pre=pre, delete_retention_ms=DELETE_RETENTION_MS)
    _mark(ledger_path + ".pass-begin")
    ok, report = run.guard("compact", p.compact, now_ms=now_ms)
    _mark(ledger_path + ".pass-end")
    if not ok:
        return
    ok, post = run.guard("post-read", present_records, p)
    if ok:
        ledger.ack(kind="cleaned", topic=TOPIC, partition=0, number=number, post=post,
                   records_before=report.records_before, records_after=report.records_after,
                   segments_before=report.segments_before,
                   segments_after=report.segments_after)


# ---- the check ---------------------------------------------------------------------------

_VALUE = re.compile(rb"^c:(\d+):")


def _passes(entries: list[dict]) -> list[tuple[dict, dict | None]]:
    """(cleaning entry, its cleaned entry or None), in order."""
    out: list[tuple[dict, dict | None]] = []
    for e in entries:
        if e.get("topic") != TOPIC:
            continue
        if e["kind"] == "cleaning":
            out.append((e, None))
        elif e["kind"] == "cleaned" and out and out[-1][0]["number"] == e["number"]:
            out[-1] = (out[-1][0], e)
    return out


def _as_map(rows: list[list]) -> dict[int, tuple[str, bool]]:
    return {o: (k, t) for o, k, t in rows}


def check_compacted(checker, broker, partition: int, expected: list[dict]) -> None:
    """The promise of the module docstring on the compacted topic; failures go to
    `checker.fail` (classes "integrity", and the checker's `foreign_class` for a record
    never written there)."""
    where = f"{TOPIC}-{partition}"
    foreign = getattr(checker, "foreign_class", "integrity")
    try:
        p = broker.topic(TOPIC).partition(partition)
        start, end = p.log_start_offset, p.log_end_offset
        leftovers = sorted(name for name in os.listdir(p.directory)
                           if name.endswith(LEFTOVER_SUFFIXES) or name in LEFTOVER_NAMES)
    except BaseException as exc:             # noqa: BLE001
        checker.fail("integrity", f"{where}: open: {type(exc).__name__}: {exc}")
        return
    if leftovers:
        checker.fail("integrity", f"{where}: cleaner files left after the open: "
                     f"{leftovers}")
    present: dict[int, tuple[bytes | None, bytes | None]] = {}
    offset, last = start, -1
    try:
        while offset < end:
            fetched = p.fetch_records(offset, 500)
            for r in fetched.records:
                if r.offset <= last:
                    checker.fail("integrity", f"{where}: offset {r.offset} read after "
                                 f"{last}")
                last = r.offset
                present[r.offset] = (r.key, r.value)
            if fetched.next_offset <= offset:
                checker.fail("integrity", f"{where}: fetch_records({offset}) moved to "
                             f"{fetched.next_offset} (log {start}..{end})")
                break
            offset = fetched.next_offset
    except BaseException as exc:             # noqa: BLE001
        checker.fail("integrity", f"{where}: read at {offset}: {type(exc).__name__}: {exc}")
        return
    acked = {e["offset"]: e for e in expected}
    # every record present is one written there
    tags: dict[int, int] = {}
    for o, (key, value) in sorted(present.items()):
        if value == b"probe" and key == b"probe":
            continue
        m = _VALUE.match(value or b"")
        if value is not None and not m:
            checker.fail(foreign, f"{where}: offset {o} holds a value never written: "
                         f"{value[:24]!r}")
            continue
        if m:
            n = int(m.group(1))
            if n in tags:
                checker.fail(foreign, f"{where}: c:{n} at {tags[n]} and again at {o}")
            tags[n] = o
            if key != key_of(n).encode() or value != value_of(n):
                checker.fail(foreign, f"{where}: offset {o}: c:{n} with key {key!r} or "
                             "its bytes changed")
        elif not (key or b"").decode("ascii", "replace").startswith("k"):
            checker.fail(foreign, f"{where}: offset {o}: a tombstone of key {key!r}")
        e = acked.get(o)
        if e is not None and (key != e["key"].encode() or (
                (None if value is None else _VALUE.match(value).group(0)[:-1].decode())
                != e["value"])):
            checker.fail(foreign, f"{where}: offset {o}: expected {e['key']}={e['value']},"
                         f" found {key!r}={(value or b'')[:12]!r}")
    passes = _passes(checker.entries)
    expired = _expired_tombstones(passes)
    # every key's latest acknowledged record, or something later of its key
    latest: dict[str, dict] = {}
    for e in expected:
        if e["offset"] > latest.get(e["key"], {"offset": -1})["offset"]:
            latest[e["key"]] = e
    for key, e in sorted(latest.items()):
        if e["offset"] in present or e["offset"] < start:
            continue
        if any(o > e["offset"] and k == key.encode() for o, (k, _) in present.items()):
            continue
        if e["value"] is None and e["offset"] in expired:
            continue
        checker.fail("integrity", f"{where}: acknowledged offset {e['offset']} "
                     f"({key}={e['value']}), its key's latest, missing (log {start}..{end})")
    if not passes:
        for o, e in sorted(acked.items()):
            if o >= start and o not in present:
                checker.fail("integrity", f"{where}: acknowledged offset {o} "
                             f"({e['key']}={e['value']}) missing before any pass")
        return
    check_last_pass(checker, where, passes, present, acked)


def _expired_tombstones(passes: list[tuple[dict, dict | None]]) -> set[int]:
    """Offsets of tombstones some pass may have removed (past a horizon stamped before)."""
    first_seen: dict[int, int] = {}
    out = set()
    for cleaning, _ in passes:
        for o, _, tombstone in cleaning["pre"]:
            if tombstone and o in first_seen and cleaning["now_ms"] >= first_seen[o]:
                out.add(o)
        for o, _, tombstone in cleaning["pre"]:
            if tombstone and o < cleaning["below"] and o not in first_seen:
                first_seen[o] = cleaning["now_ms"] + cleaning["delete_retention_ms"]
    return out


def check_last_pass(checker, where: str, passes, present: dict, acked: dict) -> None:
    """Above the last pass's range: every acknowledged record. Below it: each of its
    segments as before the pass or as after it, whole (exactly as after, when the pass
    returned); judged by the model when every earlier pass returned."""
    cleaning, cleaned = passes[-1]
    below = cleaning["below"]
    for o, e in sorted(acked.items()):
        if o >= below and o not in present:
            checker.fail("integrity", f"{where}: acknowledged offset {o} ({e['key']}="
                         f"{e['value']}) above the last pass's range ({below}) missing")
    horizons: dict[int, int] = {}
    model = None
    for i, (c, done) in enumerate(passes):
        kept, horizons = clean_pass(_as_map(c["pre"]), horizons, c["below"], c["now_ms"],
                                    c["delete_retention_ms"])
        if done is not None and _as_map(done["post"]) != kept:
            checker.fail("integrity", f"{where}: pass {c['number']} kept "
                         f"{sorted(_as_map(done['post']))}, the model "
                         f"{sorted(kept)}")
        if done is None and i < len(passes) - 1:
            return                      # a failed earlier pass: its stamps are unknown
        model = kept
    pre = {o for o, _, _ in cleaning["pre"] if o < below}
    post = {o for o in model if o < below}
    now = {o for o in present if o < below}
    if cleaned is not None:
        if now != post:
            checker.fail("integrity", f"{where}: pass {cleaning['number']} returned; "
                         f"below {below} the log holds {sorted(now ^ post)} that it "
                         "did not leave" + _detail(now, post))
        return
    bases = [b for b in cleaning["bases"] if b < below] + [below]
    for lo, hi in zip(bases, bases[1:]):
        got = {o for o in now if lo <= o < hi}
        old = {o for o in pre if lo <= o < hi}
        new = {o for o in post if lo <= o < hi}
        if got != old and got != new:
            checker.fail("integrity", f"{where}: segment [{lo}, {hi}) of an interrupted "
                         f"pass {cleaning['number']} is neither old nor new: holds "
                         f"{sorted(got)}, before {sorted(old)}, after {sorted(new)}")


def _detail(now: set, post: set) -> str:
    return f" (extra {sorted(now - post)[:8]}, missing {sorted(post - now)[:8]})"


# ---- which file operations belong to a pass -------------------------------------------

_LINE = re.compile(r"^(\w+)\((.*)\)\s+=\s+(\S+)")


def pass_targets(prefix: str, ledger: str, targets: dict, passes: tuple[int, ...] = ()
                 ) -> dict:
    """Of the driver's targets ({"syscall#n": Target}), those whose call ran inside a
    `compact()` (between the workload's pass-begin and pass-end opens) in some thread of
    the counting run's trace files `prefix.<tid>`; only inside the passes numbered in
    `passes` (1, 2, 3) when it is given."""
    from .driver import SYSCALLS
    inside_keys: set[str] = set()
    directory, base = os.path.split(prefix)
    for name in sorted(os.listdir(directory)):
        if not name.startswith(base + "."):
            continue
        counts: dict[str, int] = {}
        inside, number = False, 0
        with open(os.path.join(directory, name), errors="replace") as f:
            for raw in f:
                m = _LINE.match(raw)
                if not m or m.group(1) not in SYSCALLS:
                    continue
                syscall = m.group(1)
                counts[syscall] = n = counts.get(syscall, 0) + 1
                if syscall == "openat" and ledger + ".pass-begin" in raw:
                    number += 1
                    inside = not passes or number in passes
                elif syscall == "openat" and ledger + ".pass-end" in raw:
                    inside = False
                elif inside:
                    inside_keys.add(f"{syscall}#{n}")
    return {k: t for k, t in targets.items() if k in inside_keys}


def main(argv: list[str]) -> int:
    """`python -m tests.crashpoints.compaction --crashpoints [--jobs N] [--results F]
    [--pass N] [--mode M]`: every file operation of the `clean` workload's passes (or of
    the passes named), in every mode (or the modes named)."""
    import argparse
    import json
    import tempfile
    import time

    from . import driver
    ap = argparse.ArgumentParser(description=main.__doc__)
    ap.add_argument("--crashpoints", action="store_true", required=True)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--results", default="compaction-crashpoints.jsonl")
    ap.add_argument("--keep", default=None)
    ap.add_argument("--pass", dest="passes", type=int, action="append", default=[],
                    help="only the file operations of this pass (1, 2, 3; repeatable)")
    ap.add_argument("--mode", action="append", help="only these modes (repeatable)")
    args = ap.parse_args(argv)
    workdir = tempfile.mkdtemp(prefix="cp-clean-count-")
    counted = driver.count("clean", workdir)
    in_pass = pass_targets(os.path.join(workdir, "trace"), os.path.join(workdir, "ledger"),
                           counted["targets"], tuple(args.passes))
    work = driver.plan(in_pass, modes=tuple(args.mode) if args.mode else None)
    print(f"clean: {len(counted['targets'])} targets, {len(in_pass)} inside the passes; "
          f"baseline failures {counted['baseline_check'].get('failures')}; "
          f"{len(work)} trials", flush=True)
    started = time.monotonic()
    with open(args.results, "a") as out:
        def progress(r):
            out.write(json.dumps(r) + "\n")
            out.flush()
            if r["classes"]:
                print(f"   {r['syscall']}#{r['n']} {r['mode']}: {sorted(set(r['classes']))}"
                      f" {r['details'][0][:200]}", flush=True)
        results = driver.run_plan("clean", counted, work, jobs=args.jobs, keep=args.keep,
                                  progress=progress)
    print(driver.format_table(driver.summarize(results)))
    print(f"{len(results)} trials in {time.monotonic() - started:.0f} s")
    return 1 if any(r["classes"] for r in results) else 0


if __name__ == "__main__":
    import sys
    sys.exit(main(sys.argv[1:]))
