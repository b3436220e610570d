"""A cleaning pass killed at its file operations, and a power cut during one (issue 32,
DESIGN §16: "a cleaning pass killed at any step leaves the old segments or the new ones,
whole").

The workload is tests/crashpoints/compaction.py's (`clean`: one compacted partition,
keyed appends and tombstones, rolls, three cleaning passes at chosen clocks), and so is
the promise checked after each trial: the partition opens, `check()` passes, no
`.cleaned`/`.swap` file is left, every key's latest acknowledged record is there (or a
later one of its key, or its tombstone expired), every record there was written there,
and each segment of an interrupted pass holds its records as before the pass or as
after it (exactly as after, once the pass returned).

Crash points (tests/crashpoints/driver.py): the counting run under strace names the file
operations made inside `compact()`; the slice tries PER_SYSCALL of them per system call
(first, last, between), with the kill modes and an injected error in turn, 2 trials at
a time. `python -m tests.crashpoints.compaction --crashpoints` runs every one in every mode.

Power cuts (tests/powercut/): the `cleansync` variant recorded once, then POWERCUT_CUTS
cuts spread over the operations of the passes and POWERCUT_ANYWHERE anywhere in the
trace, the three modes in turn; the promise adds that every record synced before a pass
is there or superseded by a later synced record of its key.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import tempfile

import pytest

from tests.crashpoints import compaction, driver
from tests.powercut import model, runner

pytestmark = pytest.mark.timeout(600) if hasattr(pytest.mark, "timeout") else []

_REASON = driver.strace_usable()
needs_strace = pytest.mark.skipif(_REASON is not None, reason="crash points need strace "
                                  f"with ptrace: {_REASON}")
VARIANT = "clean"
PER_SYSCALL = 2
POWERCUT_CUTS = 45
POWERCUT_ANYWHERE = 15
SEED = 32



def slice_plan(targets: dict) -> list:
    """PER_SYSCALL targets per system call, the modes cycled over them."""
    plan, turn = [], 0
    for syscall in sorted({t.syscall for t in targets.values()}):
        picked = driver.plan(targets, syscalls=(syscall,), sample=PER_SYSCALL)
        chosen = sorted({t.n: t for t, _ in picked}.values(), key=lambda t: t.n)
        modes = driver.all_modes(syscall)
        for t in chosen:
            plan.append((t, modes[turn % len(modes)]))
            turn += 1
    return plan


@pytest.fixture(scope="module")
def counted():
    if _REASON is not None:
        pytest.skip(f"crash points need strace with ptrace: {_REASON}")
    workdir = tempfile.mkdtemp(prefix="cp-clean-count-")
    result = driver.count(VARIANT, workdir)
    in_pass = compaction.pass_targets(os.path.join(workdir, "trace"),
                                      os.path.join(workdir, "ledger"), result["targets"])
    with open(os.path.join(workdir, "ledger")) as f:
        ledger = [json.loads(line) for line in f]
    yield result, in_pass, ledger, workdir
    shutil.rmtree(workdir, ignore_errors=True)


@needs_strace
def test_the_workload_cleans_and_the_checker_passes_it_uncut(counted):
    """The uninjected run: three passes returned, each left what the model says (the
    checker compares), nothing raised, and the pass's file operations are targets."""
    result, in_pass, ledger, _ = counted
    assert result["returncode"] == 0, result["stderr"]
    assert not result["baseline_events"], result["baseline_events"][:3]
    assert not result["baseline_check"]["failures"], result["baseline_check"]
    cleaned = [e for e in ledger if e["kind"] == "cleaned"]
    assert len(cleaned) == len(compaction.PHASES), cleaned
    assert any(e["records_after"] < e["records_before"] for e in cleaned), cleaned
    kinds = {t.syscall for t in in_pass.values()}
    for kind in ("openat", "rename", "fsync"):
        assert kind in kinds, f"no {kind} inside a pass: {sorted(kinds)}"
    print(f"crash points inside the passes: {len(in_pass)} file operations "
          f"({len(driver.plan(in_pass))} trials in every mode)")


@pytest.fixture(scope="module")
def crash_results(counted):
    result, in_pass, _, _ = counted
    work = slice_plan(in_pass)
    return driver.run_plan(VARIANT, result, work, jobs=2)


@needs_strace
@pytest.mark.parametrize("cls", driver.CLASSES)
def test_a_pass_killed_or_failed_at_a_file_operation_leaves_old_or_new(crash_results,
                                                                      cls):
    failed = [r for r in crash_results if cls in r["classes"]]
    lines = [f"{r['syscall']}#{r['n']} {r['mode']}: "
             f"{r['details'][r['classes'].index(cls)][:400]}\n    {r['reproducer']}"
             for r in failed[:4]]
    assert not failed, f"{len(failed)} of {len(crash_results)} trials: {cls}\n" + \
        "\n".join(lines)


@needs_strace
def test_the_slice_reached_the_pass(crash_results):
    tried = [r for r in crash_results if r["status"] == "tried"]
    assert len(tried) >= 0.8 * len(crash_results), \
        [(r["syscall"], r["n"], r["mode"], r["status"]) for r in crash_results
         if r["status"] != "tried"]
    assert {r["mode"] for r in tried} >= {"kill-before", "kill-after"}


@needs_strace
def test_the_checker_reports_a_latest_value_that_is_gone(counted, tmp_path):
    """Not vacuous: a key's latest record acknowledged at an offset the log no longer
    holds is reported."""
    _, _, ledger, workdir = counted
    root = str(tmp_path / "root")
    shutil.copytree(os.path.join(workdir, "root"), root)
    doctored = str(tmp_path / "ledger")
    gone = next(o for e in ledger if e["kind"] == "cleaned"
                for o in range(e["post"][-1][0]) if o not in {p[0] for p in e["post"]})
    with open(doctored, "w") as f:
        for e in ledger:
            f.write(json.dumps(e) + "\n")
        f.write(json.dumps({"kind": "record", "topic": compaction.TOPIC, "partition": 0,
                            "offset": gone, "key": "k9", "value": "c:9"}) + "\n")
    failures = driver.run_checker(root, doctored)["failures"]
    assert any(f"acknowledged offset {gone}" in f["detail"] for f in failures), failures


@needs_strace
def test_the_checker_reports_a_segment_neither_old_nor_new(counted, tmp_path):
    """Not vacuous: the last pass's `cleaned` entry dropped and its `pre` claiming an
    extra record of a key of its own in its first segment (which the pass would have
    kept): the segment as the pass left it is neither."""
    _, _, ledger, workdir = counted
    root = str(tmp_path / "root")
    shutil.copytree(os.path.join(workdir, "root"), root)
    last = max(i for i, e in enumerate(ledger) if e["kind"] == "cleaning")
    doctored = str(tmp_path / "ledger")
    with open(doctored, "w") as f:
        for i, e in enumerate(ledger):
            if e["kind"] == "cleaned" and i > last:
                continue
            if i == last:
                pre = {row[0] for row in e["pre"]}
                extra = next(o for o in range(e["below"]) if o not in pre)
                e = dict(e, pre=sorted(e["pre"] + [[extra, "k9", False]]))
            f.write(json.dumps(e) + "\n")
    failures = driver.run_checker(root, doctored)["failures"]
    assert any("neither old nor new" in f["detail"] for f in failures), failures


# ---- power cuts -------------------------------------------------------------------------

@pytest.fixture(scope="module")
def recorded():
    if _REASON is not None:
        pytest.skip(f"power-cut trials need strace with ptrace: {_REASON}")
    workdir = tempfile.mkdtemp(prefix="pc-clean-")
    rec = runner.record("clean", workdir)
    yield rec, rec.parse()
    shutil.rmtree(workdir, ignore_errors=True)


def pass_windows(tr) -> list[tuple[int, int]]:
    """(first, last) operation index of each pass: after its `cleaning` entry, up to its
    `cleaned` entry."""
    out, begin = [], None
    for i, op in enumerate(tr.ops):
        if op.kind == "ack" and op.entry["kind"] == "cleaning":
            begin = i + 1
        elif op.kind == "ack" and op.entry["kind"] == "cleaned" and begin is not None:
            out.append((begin, i + 1))
            begin = None
    return out


def powercut_plan(tr) -> list[dict]:
    rng = random.Random(SEED)
    windows = pass_windows(tr)
    cuts = [c for lo, hi in windows for c in range(lo, hi + 1)]
    step = max(1, len(cuts) / POWERCUT_CUTS)
    chosen = [cuts[int(i * step)] for i in range(min(POWERCUT_CUTS, len(cuts)))]
    chosen += [rng.randint(1, len(tr.ops)) for _ in range(POWERCUT_ANYWHERE)]
    return [{"trial": i, "cut": cut, "mode": model.MODES[i % 3],
             "seed": rng.getrandbits(32)} for i, cut in enumerate(chosen)]


@needs_strace
def test_a_power_cut_during_a_pass_keeps_every_synced_record_or_its_successor(recorded):
    rec, tr = recorded
    windows = pass_windows(tr)
    assert len(windows) == len(compaction.PHASES), windows
    inside = sum(hi - lo for lo, hi in windows)
    assert inside > 10, windows
    results = runner.run(rec, powercut_plan(tr), jobs=2)
    assert len(results) == POWERCUT_CUTS + POWERCUT_ANYWHERE
    failed = [r for r in results if r["classes"]]
    lines = [f"trial {r['trial']} cut {r['cut']} {r['mode']} seed {r['seed']}: "
             f"{r['classes']} {r['details'][0][:400]}" for r in failed[:5]]
    assert not failed, f"{len(failed)} of {len(results)} cuts\n" + "\n".join(lines)
    assert sum(1 for r in results if r["durable"]) >= len(results) // 2
    print(f"power cuts: {len(results)} states checked, {inside} operations inside "
          f"{len(windows)} passes of {len(tr.ops)}")


class _Everything(random.Random):
    """A chooser that keeps every unsynced operation and the newest mapped version."""

    def randint(self, a: int, b: int) -> int:
        return b

    def random(self) -> float:
        return 0.0

    def choice(self, seq):
        return seq[-1]


@needs_strace
def test_the_powercut_model_replays_the_cleaned_log(recorded, tmp_path):
    """The model follows a cleaning pass's calls (its renames and unlinks among them):
    replaying the whole trace gives the compacted partition's files as the run left
    them."""
    rec, tr = recorded
    dest = str(tmp_path / "replayed")
    model.materialise(tr, len(tr.ops), "prefix", _Everything(), dest)
    part = os.path.join(rec.root, f"{compaction.TOPIC}-0")
    names = sorted(n for n in os.listdir(part) if n.endswith((".log", ".index",
                                                               ".timeindex")))
    assert sorted(n for n in os.listdir(dest + part[len(rec.root):])
                  if n.endswith((".log", ".index", ".timeindex"))) == names
    for name in names:
        with open(os.path.join(part, name), "rb") as a, \
                open(os.path.join(dest + part[len(rec.root):], name), "rb") as b:
            assert a.read() == b.read(), name


# ---- what the enumeration found ------------------------------------------------------

def test_cleaned_files_of_a_pass_failed_at_its_swap_go_at_the_next_open(tmp_path):
    """A pass whose swap could not take the partition lock (the enumeration's flock
    EIO/ENOSPC/ENOLCK at the swap) raises StorageError and leaves its `.cleaned` files
    in the partition directory, its staging directory gone; the broker then closes
    cleanly. The next open (or at worst the next pass) removes them, as
    docs/storage.md promises ("What survives a crash mid-pass")."""
    import logkit
    root = str(tmp_path / "root")
    with logkit.Broker(root, background=False, config={"log.cleaner.enable": False}) as b:
        b.create_topic(compaction.TOPIC, 1, config=compaction.CONFIG)
        p = b.topic(compaction.TOPIC).partition(0)
        for n in range(0, 48, compaction.PER_BATCH):
            p.append([(compaction.key_of(m).encode(), compaction.value_of(m), None, None)
                      for m in range(n, n + compaction.PER_BATCH)])
        p.roll()
        directory = p.directory
        first = p.segment_base_offsets()[0]
    # the files such a pass leaves: its group's new segment, renamed .cleaned
    for suffix in (".log", ".index", ".timeindex"):
        name = os.path.join(directory, f"{first:020d}{suffix}")
        shutil.copy(name, name + ".cleaned")
    with logkit.Broker(root, background=False, config={"log.cleaner.enable": False}) as b:
        p = b.topic(compaction.TOPIC).partition(0)
        p.check()
        after_open = sorted(n for n in os.listdir(directory) if n.endswith(".cleaned"))
        p.compact()
        after_pass = sorted(n for n in os.listdir(directory) if n.endswith(".cleaned"))
    assert after_open == [] and after_pass == [], (after_open, after_pass)


@needs_strace
def test_an_undecided_swap_of_the_indexes_is_removed_at_the_next_open(recorded):
    """A pass stopped (a kill, or a power cut keeping every unsynced change) right after
    it renamed a group's `.index.cleaned` to `.index.swap`, before the `.log.swap` that
    decides the swap: the pass is undecided, the old segments stay live, and the next
    open removes every file of it (the power-cut trials found the `.index.swap` left
    behind: recovery took a live `<base>.log` for the decision)."""
    rec, tr = recorded
    cuts = [i + 1 for i, op in enumerate(tr.ops) if op.kind == "rename"
            and op.dest.endswith((".index.swap", ".timeindex.swap"))]
    assert cuts, "the trace shows no .index.swap rename"
    failures = []
    for n, cut in enumerate(cuts[:6]):
        result = runner.run_trial(tr, "cleansync", {"trial": n, "cut": cut,
                                                   "mode": "prefix", "seed": 0},
                                  rng=_Everything())
        if result["classes"]:
            failures.append((cut, result["details"][:1]))
    assert not failures, failures


def decision_fsyncs(workdir: str) -> list[int]:
    """Call numbers (per thread, as strace counts them) of each pass's directory fsync
    that follows the fsync of a new segment in `cleaner.tmp/`: the swap's decision."""
    out = []
    for name in sorted(os.listdir(workdir)):
        if not name.startswith("trace."):
            continue
        n, previous = 0, ""
        with open(os.path.join(workdir, name), errors="replace") as f:
            for line in f:
                if not line.startswith("fsync("):
                    continue
                n += 1
                if "/cleaner.tmp/" in previous and line.split(">", 1)[0].endswith("/c-0"):
                    out.append(n)
                previous = line
    return out


@needs_strace
def test_a_pass_whose_swap_decision_fails_leaves_a_readable_partition(counted):
    """EIO (or ENOSPC) from the directory fsync that decides a group's swap makes
    `compact()` raise; the process goes on appending and cleaning, closes, and the next
    open must find a partition that reads whole (the enumeration found the `.log.swap`
    of the failed pass left behind, unseen by the later passes, and finished by the
    next open on top of their newer segments: overlapping segments, every read from the
    log start failing with "segment ends before the next segment begins")."""
    result, _, _, workdir = counted
    targets = decision_fsyncs(workdir)
    assert targets, "no swap decision found in the counting run's trace"
    raw = driver.baseline_raw_errors(result)
    failures = []
    for n in targets[1:3]:     # groups after the first: a later group starts below them
        trial = driver.run_trial(VARIANT, driver.Target("fsync", n), "EIO", raw)
        assert trial["status"] == "tried", trial
        if trial["classes"]:
            failures.append(f"fsync#{n} EIO: {trial['details'][0][:300]}\n"
                            f"    {trial['reproducer']}")
    assert not failures, "\n".join(failures)


class _SwapWithoutRetire(_Everything):
    """Every unsynced write kept; of the unsynced directory changes, the renames of
    `.swap` files to their live names kept and every other change lost (the POSIX
    minimum orders no two renames in one directory without an fsync between them)."""

    def choose_entries(self, pending) -> set[int]:
        return {id(e) for e in pending if e.kind == "rename" and e.path.endswith(".swap")
                and not e.dest.endswith(".swap")}


@needs_strace
def test_a_power_cut_never_leaves_a_new_segment_live_beside_the_old_ones(recorded):
    """A cut after a group's `.swap` files were renamed live but before the directory
    fsync that follows: a file system may keep those renames and lose the renames that
    retired the old segments (`.deleted`), unless an fsync put the retirement on disk
    first. The partition must still open whole (the power-cut trials found the new
    segment live beside the old ones it replaces: overlapping segments, every read
    from the log start failing)."""
    rec, tr = recorded
    cuts = []
    for i, op in enumerate(tr.ops):
        if op.kind == "rename" and op.path.endswith(".log.swap") and \
                not op.dest.endswith(".swap"):
            cuts.append(next(j for j in range(i, len(tr.ops)) if tr.ops[j].kind in
                             ("dirsync", "syncfs")))
    assert cuts, "the trace shows no .log.swap renamed live"
    failures = []
    for n, cut in enumerate(cuts):
        result = runner.run_trial(tr, "cleansync", {"trial": n, "cut": cut,
                                                   "mode": "subset", "seed": 0},
                                  rng=_SwapWithoutRetire())
        if result["classes"]:
            failures.append((cut, result["details"][:1]))
    assert not failures, f"{len(failures)} of {len(cuts)} swaps: {failures[:3]}"
