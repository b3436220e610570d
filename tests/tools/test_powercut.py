"""A bounded slice of the power-cut trials (tools/powercut.py runs as many as asked;
docs/powercut.md explains the method).

Each workload (`acks1`, `flush1`, `twowriters`) is recorded once under strace; then
SLICE trials per workload, the modes in turn, each checked for every class of violation
(one test per class and workload, so a report says which broke). Two tests keep the
check from being vacuous: an acknowledgement the cut did not make durable, claimed
durable, is reported as `lost`; and the model replays the whole trace into the directory
the run left. Then the regression tests of what the trials found (issue 36), each of
which failed before its fix. Skipped, with the reason, when strace is missing or ptrace
is not permitted (the two that drive logkit directly need neither).
"""

from __future__ import annotations

import os
import random
import tempfile

import pytest

from tests.crashpoints import driver
from tests.powercut import check, model, runner

_REASON = driver.strace_usable()
needs_strace = pytest.mark.skipif(_REASON is not None, reason="power-cut trials need "
                                  f"strace with ptrace: {_REASON}")

SLICE = 20
SEED = 20261128


class _Everything(random.Random):
    """A chooser that keeps every unsynced operation and the newest mapped version."""

    def randint(self, a: int, b: int) -> int:
        return b

    def random(self) -> float:
        return 0.0

    def choice(self, seq):
        return seq[-1]


@pytest.fixture(scope="module")
def recorded():
    if _REASON is not None:
        pytest.skip(f"power-cut trials need strace with ptrace: {_REASON}")
    out = {}
    for workload in sorted(runner.WORKLOADS):
        rec = runner.record(workload, tempfile.mkdtemp(prefix=f"pc-test-{workload}-"))
        out[workload] = (rec, rec.parse())
    return out


@pytest.fixture(scope="module")
def slice_results(recorded):
    out = {}
    for workload, (rec, tr) in recorded.items():
        out[workload] = runner.run(rec, runner.plan(SLICE, SEED, len(tr.ops)), jobs=2)
    return out


@needs_strace
def test_trace_sees_every_kind_of_operation(recorded):
    for workload, (_, tr) in recorded.items():
        kinds = {op.kind for op in tr.ops}
        for kind in ("create", "mkdir", "rename", "unlink", "rmdir", "write", "truncate",
                     "fsync", "dirsync", "syncfs", "mapped", "snap", "ack"):
            assert kind in kinds, f"{workload}: no {kind} in the trace: {sorted(kinds)}"
        snaps = {op.snap for op in tr.ops if op.kind == "snap"}
        assert snaps == {"tail-version", "tail-sync", "index-sync"}, snaps
        names = {os.path.basename(tr.ino_paths[i]) for i in tr.mapped}
        assert {"logkit.tail", "lock.mdb"} <= names, names


@needs_strace
def test_replaying_everything_gives_the_directory_the_run_left(recorded, tmp_path):
    """The model is faithful: every unsynced write kept, the logs, indexes and LMDB's
    data file come out byte for byte as the workload left them."""
    for workload, (rec, tr) in recorded.items():
        dest = str(tmp_path / workload)
        model.materialise(tr, len(tr.ops), "prefix", _Everything(), dest)
        compared = 0
        for directory, _, files in os.walk(rec.root):
            for name in files:
                if name in ("logkit.tail", "lock.mdb", "doorbell"):
                    continue
                path = os.path.join(directory, name)
                with open(path, "rb") as a, open(dest + path[len(rec.root):], "rb") as b:
                    assert a.read() == b.read(), path
                compared += 1
        assert compared > 20, compared


@needs_strace
@pytest.mark.parametrize("workload", sorted(runner.WORKLOADS))
@pytest.mark.parametrize("cls", check.CLASSES + ("harness-error",))
def test_no_violations_of_class(slice_results, workload, cls):
    results = slice_results[workload]
    assert len(results) == SLICE
    failed = [r for r in results if cls in r["classes"]]
    lines = [f"trial {r['trial']} cut {r['cut']} {r['mode']} seed {r['seed']}: "
             f"{r['details'][r['classes'].index(cls)][:400]}" for r in failed[:5]]
    assert not failed, f"{len(failed)} of {len(results)} trials: {cls}\n" + "\n".join(lines)


@needs_strace
def test_slice_covers_durable_acknowledgements(slice_results):
    """The slice's cuts fall where durable records exist, so `lost` could fire."""
    for workload, results in slice_results.items():
        assert sum(1 for r in results if r["durable"] > 0) >= SLICE // 3, workload
        assert {r["mode"] for r in results} == set(model.MODES)


@needs_strace
def test_an_unsynced_acknowledgement_claimed_durable_is_reported(recorded):
    """Not vacuous: an acks=1 record acknowledged after the last sync, cut in "synced"
    mode, is gone; a ledger that claims it durable (a sync after it) must be reported as
    lost."""
    _, tr = recorded["acks1"]
    acks = [(i, op.entry) for i, op in enumerate(tr.ops) if op.kind == "ack"]
    synced_at = [i for i, e in acks if e["kind"] == "synced"]
    # the last main-topic record acknowledged before the first sync point
    last = max(i for i, e in acks if e["kind"] == "record" and e["topic"] == "t"
               and i < synced_at[0])
    cut = last + 1
    entries = [e for i, e in acks if i < cut]
    trial = {"trial": 0, "cut": cut, "mode": "synced", "seed": 1}
    honest = runner.run_trial(tr, "acks1sync", trial)
    assert honest["classes"] == [], honest["details"]
    lying = runner.run_trial(tr, "acks1sync", trial,
                             acks_override=entries + [{"kind": "syncing"},
                                                      {"kind": "synced"}])
    assert "lost" in lying["classes"], lying


@needs_strace
def test_no_commit_points_past_the_durable_log_end(recorded):
    """A cut right after each acknowledged group commit, unsynced writes dropped: the
    committed offsets must be within the log that survived (issue 36: they pointed past
    it, since a commit is synced by LMDB and the acks=1 log below it was not)."""
    _, tr = recorded["acks1"]
    cuts = [i + 1 for i, op in enumerate(tr.ops) if op.kind == "ack"
            and op.entry["kind"] == "commit" and op.entry["partition"] == 2]
    assert len(cuts) >= 3, cuts
    for n, cut in enumerate(cuts):
        result = runner.run_trial(tr, "acks1sync", {"trial": n, "cut": cut,
                                                    "mode": "synced", "seed": n})
        assert result["classes"] == [], result["details"]


def test_a_group_commit_syncs_the_log_below_the_offset(tmp_path):
    """The committed offset is durable when commit returns, so the records below it are
    made durable first (acks=1, the default flush policy: nothing else syncs them)."""
    import logkit
    from logkit.topic import TopicPartition
    broker = logkit.Broker(str(tmp_path / "root"), background=False)
    try:
        broker.create_topic("t", 2)
        p0, p1 = broker.topic("t").partitions
        p0.append([(b"k", b"v%d" % i, None, None) for i in range(5)])
        p1.append([(b"k", b"w%d" % i, None, None) for i in range(3)])
        assert p0._log.tail().recovery_point == 0 and p1._log.tail().recovery_point == 0
        consumer = broker.consumer(group_id="g", enable_auto_commit=False)
        consumer.assign([TopicPartition("t", 0), TopicPartition("t", 1)])
        consumer.commit({TopicPartition("t", 0): 4})
        assert p0._log.tail().recovery_point >= 4
        assert p1._log.tail().recovery_point == 0      # nothing committed there
        consumer.close()
    finally:
        broker.close()



@needs_strace
@pytest.mark.parametrize("workload", sorted(runner.WORKLOADS))
def test_a_synced_segment_has_a_durable_name_before_its_recovery_point(recorded,
                                                                      workload):
    """A `.log` whose data is fsynced (a roll, a flush, a group commit) has its
    directory entry synced too before the tail publishes a recovery point past it:
    fsync of a file does not make its name durable (issue 36: a roll fsynced the old
    segment and published the recovery point with the directory unsynced, so a power
    cut could take a sealed segment from between its neighbours, and every read across
    the gap failed)."""
    _, tr = recorded[workload]
    created: dict[int, tuple[int, str]] = {}
    covered: set[int] = set()
    awaiting: dict[str, set[int]] = {}       # directory -> logs fsynced, name unsynced
    late = []
    for i, op in enumerate(tr.ops):
        if op.kind == "create" and op.path.endswith(".log"):
            created[op.ino] = (i, os.path.dirname(op.path))
        elif op.kind == "dirsync":
            covered |= {ino for ino, (_, d) in created.items() if d == op.path}
            awaiting.pop(op.path, None)
        elif op.kind == "syncfs":
            covered |= set(created)
            awaiting.clear()
        elif op.kind == "fsync" and op.ino in created and op.ino not in covered:
            awaiting.setdefault(created[op.ino][1], set()).add(op.ino)
        elif op.kind == "snap" and op.snap == "tail-version":
            d = os.path.dirname(tr.ino_paths[op.ino])
            if awaiting.get(d):
                late.append((i, sorted(tr.ino_paths[n] for n in awaiting[d])))
                awaiting.pop(d)
    assert not late, late[:5]

class _EntriesLost(_Everything):
    """Every unsynced write kept, every unsynced directory-entry change lost."""

    def choose_entries(self, pending) -> set[int]:
        return set()


@needs_strace
@pytest.mark.parametrize("workload", sorted(runner.WORKLOADS))
def test_unsynced_directory_entries_lost_alone(recorded, workload):
    """Write-back kept every byte but no directory change that was not synced: a
    segment sealed by a roll (its records synced, the recovery point past it) must not
    vanish from between its neighbours (issue 36: the roll fsynced the old segment but
    not the directory, so after a power cut a segment in the middle could be missing
    and every read across it failed)."""
    _, tr = recorded[workload]
    variant = runner.WORKLOADS[workload]
    failures = []
    step = len(tr.ops) // 20
    for n, cut in enumerate(range(step, len(tr.ops) + 1, step)):
        result = runner.run_trial(tr, variant, {"trial": n, "cut": cut, "mode": "prefix",
                                                "seed": 0}, rng=_EntriesLost())
        if result["classes"]:
            failures.append((cut, result["details"][:2]))
    assert not failures, failures


@needs_strace
def test_the_format_file_is_durable_before_anything_else_in_the_root(recorded):
    """`logkit.json` lands by a rename; its name must be synced (a root fsync) before
    anything else is made in the root, or a power cut can leave `meta/` or a partition
    without it, and the next `Broker()` refuses the directory as "not a logkit
    directory" (issue 36: found by the subset mode)."""
    for workload, (rec, tr) in recorded.items():
        renamed = None
        for i, op in enumerate(tr.ops):
            if op.kind == "rename" and op.dest == os.path.join(rec.root, "logkit.json"):
                renamed = i
            elif renamed is not None and (op.kind in ("dirsync", "syncfs")
                                          and op.path in ("", rec.root)):
                break
            elif renamed is not None and op.kind in ("create", "mkdir") and \
                    os.path.dirname(op.path) == rec.root:
                pytest.fail(f"{workload}: {op.path} made before logkit.json's name "
                            "was synced")
        assert renamed is not None, workload


def test_a_clean_mark_on_disk_does_not_hide_later_synced_records(tmp_path):
    """A clean close msyncs a tail marked clean; a later open appends and clears the
    mark in the map only. Records synced after that (flush.messages=1) are durable; a
    power cut that leaves the clean tail on disk must not make the next boot skip
    recovery and lose them (issue 36: found by the `twowriters` workload, where the
    second writer's close marked the tail clean mid-run)."""
    import logkit
    root = str(tmp_path / "root")
    broker = logkit.Broker(root, background=False)
    broker.create_topic("t", 1, config={"flush.messages": 1})
    broker.topic("t").partition(0).append([(b"k", b"before", None, None)])
    broker.close()
    tail_path = os.path.join(root, "t-0", "logkit.tail")
    with open(tail_path, "rb") as f:
        on_disk = f.read()                    # the tail as the clean close synced it
    broker = logkit.Broker(root, background=False)
    p = broker.topic("t").partition(0)
    offset = p.append([(b"k", b"after", None, None)])    # synced before it returns
    assert p._log.tail().recovery_point == offset + 1
    broker.close()
    # the power cut: the tail's later stores never reached the disk (the log's synced
    # bytes did), and the next boot has another boot id
    with open(tail_path, "r+b") as f:
        f.write(on_disk[:16] + b"\xee" * 16 + on_disk[32:])
    broker = logkit.Broker(root, background=False)
    try:
        got = [r.value for r in broker.topic("t").partition(0).read(0)]
        assert got == [b"before", b"after"], got
    finally:
        broker.close()


@needs_strace
def test_a_cut_while_a_new_root_makes_its_store_never_wedges_the_root(recorded):
    """A power cut while the first `Broker()` makes LMDB's store: whatever subset of its
    unsynced writes reached the disk, the root opens without repair (it used to keep a
    one-page `meta/data.mdb` that no open could read: 21 wedges in 2,340 such trials;
    the store is now made beside `meta/` and renamed into place once synced)."""
    _, tr = recorded["acks1"]
    first_ack = next(i for i, op in enumerate(tr.ops) if op.kind == "ack")
    store_ops = [i + 1 for i, op in enumerate(tr.ops[:first_ack])
                 if "meta" in (tr.ino_paths.get(op.ino, "") if getattr(op, "ino", None)
                               else op.path or "")]
    cuts = sorted({cut + d for cut in store_ops for d in (0, 1)} & set(range(1, first_ack)))
    assert cuts, "the trace shows no write to the store before the first ack"
    failures = []
    for n, (cut, seed) in enumerate((c, s) for c in cuts for s in range(12)):
        result = runner.run_trial(tr, "acks1", {"trial": n, "cut": cut, "mode": "subset",
                                                "seed": seed})
        if result["classes"]:
            failures.append((cut, seed, result["details"][:1]))
    assert not failures, failures[:3]
