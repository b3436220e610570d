"""Log compaction against a model, through the public API (issue 32, DESIGN §16).

Goal: whatever the order of keyed appends (tombstones among them), rolls, cleaning passes
at any clock and reopens, a compacted partition holds exactly the records Kafka's cleaner
would leave (`tests/crashpoints/compaction.py`'s `clean_pass`: below the active segment
every key's latest record, a tombstone until the delete horizon its first pass stamped),
at the offsets they were appended at, and once everything is cleaned a read gives every
key's latest value once (checked against a plain dict); `check()` passes after each pass.
And readers in two other processes, one following `Partition.fetch_records` and one a
consumer, tailing the partition from offset 0 while this process appends and cleans,
never see an offset go backwards, a duplicate, a record that was not appended at its
offset, or a gap that is not a record the cleaner removed.

`LOGKIT_COMPACTION_EXAMPLES=N` runs N examples instead of the quick default.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter

import pytest
from hypothesis import HealthCheck, Phase, settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, rule

import logkit
from tests.crashpoints.compaction import clean_pass

TOPIC = "c"
DELETE_RETENTION_MS = 1000
CONFIG = {"cleanup.policy": "compact", "segment.bytes": 1024, "segment.index.bytes": 1024,
          "delete.retention.ms": DELETE_RETENTION_MS, "min.compaction.lag.ms": 0}
EXAMPLES = int(os.environ.get("LOGKIT_COMPACTION_EXAMPLES", 20))
NO_CLEANER = {"log.cleaner.enable": False}      # the test runs every pass itself
ROOT_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STATS: Counter = Counter()            # what the run covered, printed at the end

KEYS = st.sampled_from([b"a", b"b", b"c", b"d", b"e", b"f"])
VALUES = st.one_of(st.none(), st.binary(max_size=8),
                   st.integers(40, 300).map(lambda n: bytes(range(n % 251)) * 2))


def read_all(p) -> list[tuple[int, bytes | None, bytes | None]]:
    """Every record of the partition, following `fetch_records`' next offset."""
    out, offset, end = [], p.log_start_offset, p.log_end_offset
    while offset < end:
        fetched = p.fetch_records(offset, 50)
        out += [(r.offset, r.key, r.value) for r in fetched.records]
        assert fetched.next_offset > offset, (offset, fetched)
        offset = fetched.next_offset
    return out


class CompactionModel(RuleBasedStateMachine):
    """The partition beside `present` ({offset: (key, value)}: what the model keeps),
    `horizons` (the stamped tombstones' delete horizons) and `latest` (key -> (offset,
    value) of its last append: the dict)."""

    @initialize()
    def open_topic(self) -> None:
        self.dir = tempfile.mkdtemp(prefix="compaction-model-")
        self.broker = logkit.Broker(self.dir, background=False, config=NO_CLEANER)
        self.broker.create_topic(TOPIC, 1, config=CONFIG)
        self.present: dict[int, tuple[bytes, bytes | None]] = {}
        self.horizons: dict[int, int] = {}
        self.latest: dict[bytes, tuple[int, bytes | None]] = {}
        self.end = 0
        # the pass clock: past every record's timestamp (min.compaction.lag.ms is 0) by
        # more than an example lasts, then moved by the steps alone, so a pass can land
        # exactly on a delete horizon
        self.clock_ms = int(time.time() * 1000) + 600_000
        self.passes = 0

    def teardown(self) -> None:
        if hasattr(self, "broker"):
            self.broker.close()
            shutil.rmtree(self.dir, ignore_errors=True)

    @property
    def p(self):
        return self.broker.topic(TOPIC).partition(0)

    @rule(rows=st.lists(st.tuples(KEYS, VALUES), min_size=1, max_size=8))
    def append(self, rows) -> None:
        base = self.p.append([(k, v, None, None) for k, v in rows])
        assert base == self.end, (base, self.end)        # offsets stay dense on append
        for i, (k, v) in enumerate(rows):
            self.present[base + i] = (k, v)
            self.latest[k] = (base + i, v)
        self.end = base + len(rows)

    @rule()
    def roll(self) -> None:
        self.p.roll()

    @rule(advance_ms=st.sampled_from([0, 10, DELETE_RETENTION_MS - 1, DELETE_RETENTION_MS,
                                      3 * DELETE_RETENTION_MS]),
          roll_first=st.booleans())
    def compact(self, advance_ms: int, roll_first: bool) -> None:
        p = self.p
        if roll_first:
            p.roll()
        self.clock_ms += advance_ms
        now_ms = self.clock_ms
        below = p.segment_base_offsets()[-1]
        report = p.compact(now_ms=now_ms)
        self.passes += 1
        before = {o: (k, v is None) for o, (k, v) in self.present.items()}
        kept, self.horizons = clean_pass(before, self.horizons, below, now_ms,
                                         DELETE_RETENTION_MS)
        STATS["passes"] += 1
        STATS["records removed"] += len(self.present) - len(kept)
        STATS["tombstones expired"] += sum(
            1 for o, (_, tombstone) in before.items() if tombstone and o < below
            and o not in kept and max(p for p, (k, _) in before.items()
                                      if k == before[o][0]) == o)
        self.present = {o: self.present[o] for o in kept}
        self.check_log(f"after pass {self.passes} (now {now_ms}, below {below}, "
                       f"report {report!r})")
        assert report.records_after <= report.records_before, report
        if below == self.end:
            STATS["full passes checked against the dict"] += 1
            self.check_against_dict(now_ms)

    @rule()
    def reopen(self) -> None:
        STATS["reopens"] += 1
        self.broker.close()
        self.broker = logkit.Broker(self.dir, background=False, config=NO_CLEANER)
        self.check_log("after a reopen")

    def check_log(self, when: str) -> None:
        p = self.p
        got = read_all(p)
        offsets = [o for o, _, _ in got]
        assert offsets == sorted(set(offsets)), f"{when}: offsets not strictly increasing"
        want = [(o, k, v) for o, (k, v) in sorted(self.present.items())]
        assert got == want, (f"{when}: the log holds {len(got)} records, the model "
                             f"{len(want)}; extra {sorted(set(got) - set(want))[:5]}, "
                             f"missing {sorted(set(want) - set(got))[:5]}")
        assert p.log_end_offset == self.end, (when, p.log_end_offset, self.end)
        p.check()

    def check_against_dict(self, now_ms: int) -> None:
        """Everything is below the active segment and cleaned: each key once, with its
        latest value; a tombstone until its horizon, then nothing."""
        got = read_all(self.p)
        keys = [k for _, k, _ in got]
        assert len(keys) == len(set(keys)), f"a key twice after a full pass: {keys}"
        by_key = {k: (o, v) for o, k, v in got}
        for key, (offset, value) in self.latest.items():
            if value is None and key not in by_key:
                assert offset not in self.present, (key, offset)    # past its horizon
                continue
            assert by_key.get(key) == (offset, value), (key, by_key.get(key), offset)
        assert set(by_key) <= set(self.latest)


PHASES = [Phase.explicit, Phase.reuse, Phase.generate] + \
    ([Phase.shrink] if os.environ.get("LOGKIT_MODEL_SHRINK") else [])
CompactionModel.TestCase.settings = settings(
    max_examples=EXAMPLES, stateful_step_count=40, deadline=None, derandomize=True,
    database=None, phases=PHASES,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def test_compacted_partition_follows_the_cleaner_model():
    """Every pass leaves exactly the model's records at their append offsets; a full
    pass leaves each key's latest value once; check() passes; reopening changes nothing."""
    CompactionModel.TestCase().runTest()
    print("model run:", ", ".join(f"{k}: {v}" for k, v in sorted(STATS.items())))
    assert STATS["tombstones expired"] and STATS["full passes checked against the dict"]


# ---- readers in other processes while the cleaner runs ----------------------------------

RUN_S = 8.0
READER_CHUNK = 4
READER_PACE_MS = 1


class Reader:
    """A tests/helpers/compaction_reader.py process."""

    def __init__(self, root: str, mode: str, workdir: str) -> None:
        self.mode = mode
        self.out = os.path.join(workdir, f"reader-{mode}.json")
        self.stop = os.path.join(workdir, "stop")
        self.err = os.path.join(workdir, f"reader-{mode}.stderr")
        with open(self.err, "w") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "tests.helpers.compaction_reader", root, TOPIC, "0",
                 mode, self.out, self.stop, str(READER_CHUNK), str(READER_PACE_MS)],
                cwd=ROOT_DIR, stdout=subprocess.PIPE, stderr=err, text=True,
                env={**os.environ, "PYTHONPATH": ROOT_DIR})

    def wait_ready(self) -> None:
        line = self.proc.stdout.readline().strip()
        assert line == "ready", f"{self.mode} reader did not start: {line!r}"

    def result(self, timeout_s: float) -> dict:
        code = self.proc.wait(timeout=timeout_s)
        if not os.path.exists(self.out):
            with open(self.err) as f:
                raise AssertionError(f"{self.mode} reader exited {code} without a report:"
                                     f"\n{f.read()[-3000:]}")
        with open(self.out) as f:
            return json.load(f)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def _append(p, rng: random.Random, written: dict, n: int) -> int:
    rows = []
    for i in range(rng.randint(1, 10)):
        key = b"k%d" % rng.randrange(8)
        value = None if rng.random() < 0.15 else b"v%d-%d" % (n, i) + bytes(rng.randrange(80))
        rows.append((key, value))
    base = p.append([(k, v, None, None) for k, v in rows])
    for i, row in enumerate(rows):
        written[base + i] = row
    return len(rows)


def judge(reader: str, out: dict, written: dict, final: dict, end: int) -> int:
    """The promise for one reader's report; returns the offsets it skipped."""
    assert not out["errors"], f"{reader}: {out['errors'][:5]}"
    assert not out["timed_out"], f"{reader}: never reached the log end {end}"
    seen = [(o, None if k is None else bytes.fromhex(k), None if v is None
             else bytes.fromhex(v)) for o, k, v in out["seen"]]
    offsets = [o for o, _, _ in seen]
    for a, b in zip(offsets, offsets[1:]):
        assert a < b, f"{reader}: offset {b} after {a}"
    positions = out["positions"]
    for a, b in zip(positions, positions[1:]):
        assert a < b, f"{reader}: position {b} after {a}"
    for o, k, v in seen:
        assert written.get(o) == (k, v), \
            f"{reader}: offset {o} read as {k!r}={v!r}, appended as {written.get(o)!r}"
    last_of_key: dict[bytes, int] = {}
    for o, (k, _) in written.items():
        last_of_key[k] = max(last_of_key.get(k, -1), o)
    got = set(offsets)
    skipped = 0
    for o in range(end):
        if o in got:
            continue
        skipped += 1
        k, v = written[o]
        assert last_of_key[k] > o or (v is None and o not in final), \
            f"{reader}: skipped offset {o} ({k!r}={v!r}), which the cleaner may not remove"
    missed = sorted(set(final) - got)
    assert not missed, f"{reader}: never saw offsets {missed[:10]} that are in the log"
    return skipped


def test_readers_in_other_processes_never_see_a_wrong_gap_duplicate_or_regression(
        tmp_path):
    """Two reader processes tail from offset 0 while this process appends keyed records
    (tombstones among them), rolls and cleans in a loop for RUN_S seconds; each reader
    starts after passes have already made gaps, and reads in small steps to stay in the
    segments being rewritten."""
    root = str(tmp_path / "root")
    config = dict(CONFIG, **{"delete.retention.ms": 200})
    rng = random.Random(32)
    written: dict[int, tuple[bytes, bytes | None]] = {}
    readers: list[Reader] = []
    with logkit.Broker(root, background=False, config=NO_CLEANER) as broker:
        broker.create_topic(TOPIC, 1, config=config)
        p = broker.topic(TOPIC).partition(0)
        n = 0
        for _ in range(40):
            n += _append(p, rng, written, n)
        p.roll()
        p.compact(now_ms=int(time.time() * 1000))
        passes, skew_ms = 1, 0
        try:
            readers = [Reader(root, mode, str(tmp_path)) for mode in ("fetch", "consumer")]
            for r in readers:
                r.wait_ready()
            deadline = time.monotonic() + RUN_S
            step = 0
            while time.monotonic() < deadline:
                n += _append(p, rng, written, n)
                step += 1
                if rng.random() < 0.15:
                    p.roll()
                if step % 4 == 0:
                    skew_ms += rng.choice((0, 0, 250))
                    p.compact(now_ms=int(time.time() * 1000) + skew_ms)
                    passes += 1
            p.roll()
            p.compact(now_ms=int(time.time() * 1000) + skew_ms + 1000)
            passes += 1
            end = p.log_end_offset
            final = {o: (k, v) for o, k, v in read_all(p)}
            p.check()
            stop = readers[0].stop
            with open(stop + ".tmp", "w") as f:
                f.write(str(end))
            os.replace(stop + ".tmp", stop)
            results = {r.mode: r.result(timeout_s=120) for r in readers}
        finally:
            for r in readers:
                r.kill()
    assert passes > 20, passes
    assert len(final) < end, "the cleaner removed nothing"
    for mode, out in results.items():
        skipped = judge(mode, out, written, final, end)
        assert skipped > 0, f"{mode}: crossed no gap (the test would prove nothing)"
        print(f"{mode} reader: {len(out['seen'])} records seen in {out['reads']} reads, "
              f"{skipped} removed offsets crossed; {end} appended, {len(final)} kept, "
              f"{passes} passes")


pytestmark = pytest.mark.timeout(300) if hasattr(pytest.mark, "timeout") else []
