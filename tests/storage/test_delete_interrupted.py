"""A deletion interrupted after it began is never half-visible (issue 36, part 3).

`delete_topic` killed (SIGKILL) or failed (EIO on msync, rename, openat, munmap, flock)
at any of its file operations leaves a root where `topics()` names only topics that
open whole, and the first `Broker()` open after it finishes the deletion (or shows the
topic whole); the process that saw the error lists and opens only whole topics and
its retention does not raise. Each trial is a child process that sets the root up,
then waits; strace attaches to it and injects the fault at the N-th call of one
syscall inside `delete_topic` alone (the window is marked by `getppid()` calls, which
the trace shows), for every N the uninjected run counts.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

import logkit
from tests.crashpoints import driver

ROOT_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_REASON = driver.strace_usable()
pytestmark = pytest.mark.skipif(_REASON is not None, reason=_REASON or "")

TOPIC, KEEP = "doomed", "keep"
PARTITIONS = 3
RECORDS = 8                        # per partition
SYSCALLS = ("msync", "rename", "openat", "munmap", "flock")
DEADLINE_S = 60.0


# ---- the child ------------------------------------------------------------------------

def child(root: str, go: str) -> int:
    """Set the root up, mark the window with getppid() (before: until `go` exists),
    delete the topic, mark the end, then report what this process sees."""
    broker = logkit.Broker(root, background=False,
                           config={"log.retention.check.interval.ms": 3600_000})
    for name in (TOPIC, KEEP):
        topic = broker.create_topic(name, PARTITIONS)
        for p in range(PARTITIONS):
            topic.partition(p).append([(b"k", f"{name}{i}".encode(), [], None)
                                       for i in range(RECORDS)])
    print("ready", flush=True)
    deadline = time.monotonic() + DEADLINE_S
    while not os.path.exists(go):              # polling a state, with a deadline
        os.getppid()
        if time.monotonic() > deadline:
            return 3
        time.sleep(0.005)
    try:
        broker.delete_topic(TOPIC)
        outcome = "ok"
    except logkit.LogkitError as exc:
        outcome = f"named {type(exc).__name__}: {exc}"
    except BaseException as exc:           # noqa: BLE001 — reported, the test fails
        outcome = f"raw {type(exc).__name__}: {exc}"
    os.getppid()                           # the window's end
    report = {"delete": outcome, "seen": seen(broker)}
    try:
        broker.enforce_retention()
        report["retention"] = "ok"
    except BaseException as exc:           # noqa: BLE001
        report["retention"] = f"{type(exc).__name__}: {exc}"
    try:
        broker.close()
    except logkit.LogkitError:
        pass
    print(json.dumps(report), flush=True)
    return 0


def seen(broker: logkit.Broker) -> dict[str, str]:
    """For each of the two topics: 'whole' (listed, opens, every record reads back),
    'gone' (not listed, opening it raises UnknownTopicError), or what went wrong."""
    out = {}
    listed = broker.topics()
    for name in (TOPIC, KEEP):
        try:
            topic = broker.topic(name)
        except logkit.UnknownTopicError as exc:
            out[name] = "gone" if name not in listed else f"listed but {exc}"
            continue
        except BaseException as exc:       # noqa: BLE001
            out[name] = f"open raised {type(exc).__name__}: {exc}"
            continue
        if name not in listed:
            out[name] = "opens but not listed"
            continue
        try:
            values = [[r.value for r in topic.partition(p).read(0, max_records=100)]
                      for p in range(PARTITIONS)]
        except BaseException as exc:       # noqa: BLE001
            out[name] = f"read raised {type(exc).__name__}: {exc}"
            continue
        want = [f"{name}{i}".encode() for i in range(RECORDS)]
        out[name] = "whole" if all(v == want for v in values) else f"partial {values}"
    return out


# ---- the parent -----------------------------------------------------------------------

def run_trial(tmp_path, label: str, inject: str | None, syscalls: tuple[str, ...]
              ) -> tuple[dict | None, str, str]:
    """One child under `strace -e inject=...` attached once it is ready; returns its
    report (None when it was killed), the trace and the root."""
    root = str(tmp_path / f"root-{label}")
    go = str(tmp_path / f"go-{label}")
    trace = str(tmp_path / f"trace-{label}")
    env = dict(os.environ, PYTHONPATH=ROOT_DIR)
    proc = subprocess.Popen([sys.executable, __file__, root, go], cwd=ROOT_DIR, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    strace = None
    try:
        assert proc.stdout.readline().strip() == "ready", proc.stderr.read()
        argv = [driver.STRACE, "-f", "-qq", "-o", trace, "-p", str(proc.pid),
                "-e", "trace=" + ",".join(("getppid",) + syscalls)]
        if inject:
            argv += ["-e", inject]
        strace = subprocess.Popen(argv, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + DEADLINE_S
        while not (os.path.exists(trace) and "getppid(" in open(trace).read()):
            assert time.monotonic() < deadline, "strace never attached"
            assert strace.poll() is None, strace.stderr.read()
            time.sleep(0.01)
        open(go, "w").close()
        out, err = proc.communicate(timeout=DEADLINE_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if strace is not None:
            strace.wait(timeout=DEADLINE_S)
    report = None
    if proc.returncode == 0:
        report = json.loads(out.strip().splitlines()[-1])
    else:
        assert proc.returncode == -signal.SIGKILL, (proc.returncode, err)
    return report, open(trace).read(), root


def window_counts(trace: str) -> dict[str, int]:
    """Calls of each syscall between the last getppid() before delete_topic and the
    first one after it."""
    lines = trace.splitlines()
    calls = [m.group(1) for line in lines
             if (m := re.match(r"^(?:\d+\s+)?(\w+)\(", line))]
    start = next(i for i, name in enumerate(calls) if name != "getppid")
    end = calls.index("getppid", start)
    counts: dict[str, int] = {}
    for name in calls[start:end]:
        counts[name] = counts.get(name, 0) + 1
    return counts


def check_reopened(root: str) -> dict[str, str]:
    """The first open after the trial: every listed topic opens whole, the doomed one
    is whole or gone; when gone, no directory or tombstone of it is left."""
    with logkit.Broker(root, background=False) as broker:
        state = seen(broker)
        assert state[KEEP] == "whole", state
        assert state[TOPIC] in ("whole", "gone"), state
        if state[TOPIC] == "gone":
            left = [e for e in os.listdir(root)
                    if e.startswith(f"{TOPIC}-") or e.endswith(".delete")]
            assert left == [], f"the first open left {left}"
            with pytest.raises(logkit.UnknownTopicError):
                broker.delete_topic(TOPIC)
        else:
            broker.delete_topic(TOPIC)
            assert TOPIC not in broker.topics()
    return state


@pytest.fixture(scope="module")
def counts(tmp_path_factory):
    report, trace, root = run_trial(tmp_path_factory.mktemp("count"), "count", None,
                                    SYSCALLS)
    assert report == {"delete": "ok", "seen": {TOPIC: "gone", KEEP: "whole"},
                      "retention": "ok"}, report
    counted = window_counts(trace)
    assert counted.get("rename", 0) >= PARTITIONS, counted
    return counted


@pytest.mark.parametrize("syscall", ["rename", "msync", "flock"])
def test_a_deletion_killed_at_any_call_is_finished_by_the_first_open(
        tmp_path, counts, syscall):
    for n in range(1, counts.get(syscall, 0) + 1):
        report, _, root = run_trial(
            tmp_path, f"{syscall}{n}", f"inject={syscall}:signal=SIGKILL:when={n}",
            (syscall,))
        assert report is None, f"{syscall}#{n}: the kill missed: {report}"
        check_reopened(root)


@pytest.mark.parametrize("syscall", SYSCALLS)
def test_a_deletion_failing_with_eio_at_any_call_leaves_no_half_deleted_topic(
        tmp_path, counts, syscall):
    for n in range(1, counts.get(syscall, 0) + 1):
        report, _, root = run_trial(
            tmp_path, f"{syscall}{n}", f"inject={syscall}:error=EIO:when={n}",
            (syscall,))
        assert report is not None, f"{syscall}#{n}: the child died"
        assert not report["delete"].startswith("raw"), (syscall, n, report)
        assert report["seen"][KEEP] == "whole", (syscall, n, report)
        assert report["seen"][TOPIC] in ("whole", "gone"), (syscall, n, report)
        assert report["retention"] == "ok", (syscall, n, report)
        check_reopened(root)


if __name__ == "__main__":
    sys.exit(child(*sys.argv[1:]))
