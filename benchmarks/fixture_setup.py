"""What the pytest plugin's fixtures cost a test, beside a bare temporary directory.

Owns: the fixture set-up figure in docs/testing.md (goal, issue 13: <= 20 ms per test;
a Kafka broker in a container takes 4-12 s to start, a figure quoted, not measured here:
this machine runs no containers). Two measurements, one run:

- direct: the steps of the `logkit_broker` fixture — a fresh directory, `Broker(...,
  background=False)`, then its close and the directory's removal — timed one by one,
  `--repeats` times; also the same plus what a typical test adds (create a topic, a
  producer, send and flush one record, a consumer that reads it back). Median and p90.
- pytest: a generated test file of `--tests` tests run twice by pytest in a child
  process, once with tests that take `logkit_broker` and once with tests that take
  pytest's own `tmp_path` only; the difference of the two wall times over the test
  count is what the fixture adds per test inside pytest (the plugin loaded through its
  entry point, as a user's project loads it).

Invariant: every loop is bounded by the counts given; every directory is a fresh
temporary one, removed after. Self-contained, with its own command line:
`python -m benchmarks.fixture_setup [--repeats N] [--tests N] [--json PATH]`.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from typing import Any, Callable

import logkit

GOAL_MS = 20.0
CONTAINER_S = (4, 12)              # quoted in issue 13 for a containerised Kafka broker
MAX_REPEATS = 100_000
MAX_TESTS = 10_000


def _stats(samples_s: list[float]) -> dict[str, float]:
    ordered = sorted(samples_s)
    return {"median_ms": statistics.median(ordered) * 1000,
            "p90_ms": ordered[min(len(ordered) - 1, int(len(ordered) * 0.9))] * 1000,
            "max_ms": ordered[-1] * 1000}


TMPFS = "/dev/shm"                 # where fsync costs nothing (pytest --basetemp there)


def _timed(repeats: int, body: Callable[[str], Any], where: str | None = None
           ) -> list[float]:
    samples = []
    for _ in range(repeats):
        started = time.perf_counter()
        path = tempfile.mkdtemp(prefix="logkit-fixture-", dir=where)
        try:
            body(path)
        finally:
            shutil.rmtree(path, ignore_errors=True)
        samples.append(time.perf_counter() - started)
    return samples


def _bare(path: str) -> None:
    """The floor: a fresh directory and nothing else (what tmp_path costs)."""


def _broker_only(path: str) -> None:
    with logkit.Broker(path, background=False):
        pass


def _typical(path: str) -> None:
    with logkit.Broker(path, background=False) as broker:
        broker.create_topic("orders", 1)
        producer = broker.producer(linger_ms=0)
        producer.send("orders", b"v", key=b"k")
        producer.flush()
        consumer = broker.consumer("orders", auto_offset_reset="earliest",
                                   enable_auto_commit=False)
        assert len(consumer.poll(timeout_ms=1000)) == 1
        consumer.close()
        producer.close()


def direct(repeats: int) -> list[dict[str, Any]]:
    for body in (_bare, _broker_only, _typical):        # warm imports and page cache
        _timed(3, body)
    rows = []
    for system, body in (("tempfile.mkdtemp + rmtree (floor)", _bare),
                         ("logkit_broker: Broker(tmp, background=False) + close",
                          _broker_only),
                         ("... + create_topic, send/flush 1 record, poll it back",
                          _typical)):
        rows.append({"measure": "direct", "system": system, "repeats": repeats,
                     **_stats(_timed(repeats, body))})
    if os.path.isdir(TMPFS) and os.access(TMPFS, os.W_OK):
        rows.append({"measure": "direct", "system": f"logkit_broker's work on {TMPFS} "
                     "(tmpfs)", "repeats": repeats,
                     **_stats(_timed(repeats, _broker_only, TMPFS))})
    return rows


TEST_FILE = """
import pytest

@pytest.mark.parametrize("i", range({count}))
def test_one(i, {fixture}):
    assert {fixture} is not None
"""


def _pytest_wall_s(directory: str, fixture: str, count: int) -> float:
    path = os.path.join(directory, f"test_{fixture}.py")
    with open(path, "w", encoding="utf-8") as f:
        f.write(textwrap.dedent(TEST_FILE.format(count=count, fixture=fixture)))
    with open(os.path.join(directory, "pytest.ini"), "w", encoding="utf-8") as f:
        f.write("[pytest]\n")
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           path], cwd=directory, capture_output=True, text=True,
                          timeout=600)
    wall = time.perf_counter() - started
    if proc.returncode != 0:
        raise RuntimeError(f"pytest failed:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    return wall


def in_pytest(tests: int) -> list[dict[str, Any]]:
    directory = tempfile.mkdtemp(prefix="logkit-fixture-pytest-")
    try:
        walls = {}
        for fixture in ("tmp_path", "logkit_broker", "tmp_path", "logkit_broker"):
            walls.setdefault(fixture, []).append(_pytest_wall_s(directory, fixture, tests))
        base, with_broker = min(walls["tmp_path"]), min(walls["logkit_broker"])
        return [{"measure": "pytest", "system": f"pytest, {tests} tests taking tmp_path",
                 "tests": tests, "wall_s": base},
                {"measure": "pytest", "system": f"pytest, {tests} tests taking logkit_broker",
                 "tests": tests, "wall_s": with_broker,
                 "added_per_test_ms": max(0.0, with_broker - base) / tests * 1000}]
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def report(rows: list[dict[str, Any]]) -> str:
    lines = []
    for row in rows:
        if row["measure"] == "direct":
            lines.append(f"{row['system']:<58} median {row['median_ms']:7.2f} ms  "
                         f"p90 {row['p90_ms']:7.2f} ms")
        else:
            extra = (f"  -> {row['added_per_test_ms']:.2f} ms per test"
                     if "added_per_test_ms" in row else "")
            lines.append(f"{row['system']:<58} {row['wall_s']:7.2f} s{extra}")
    lines.append(f"goal: <= {GOAL_MS:g} ms per test; a containerised Kafka broker: "
                 f"{CONTAINER_S[0]}-{CONTAINER_S[1]} s (quoted, not measured here)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.fixture_setup",
        description="The cost of logkit's pytest fixtures per test.")
    parser.add_argument("--repeats", type=int, default=200,
                        help="direct timings per system (default 200)")
    parser.add_argument("--tests", type=int, default=200,
                        help="tests in each generated pytest run (default 200; 0 skips "
                             "the pytest measurement)")
    parser.add_argument("--json", metavar="PATH", help="also write the rows as JSON")
    args = parser.parse_args(argv)
    if not 1 <= args.repeats <= MAX_REPEATS or not 0 <= args.tests <= MAX_TESTS:
        parser.error(f"--repeats must be in 1..{MAX_REPEATS}, --tests in 0..{MAX_TESTS}")
    rows = direct(args.repeats) + (in_pytest(args.tests) if args.tests else [])
    print(report(rows))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"benchmark": "fixture_setup", "goal_ms": GOAL_MS, "results": rows},
                      f, indent=2)
            f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
