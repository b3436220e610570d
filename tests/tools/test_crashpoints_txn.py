"""Transactions killed or failed at their file and LMDB operations (issue 33, DESIGN
§15): after each kill or injected error and the reopen, a transaction is committed
everywhere or aborted everywhere, read_committed never shows part of one, the offsets
sent in it go with its records, one marker per partition per finished transaction, the
last stable offset right — before and after the open transaction is ended by its
timeout or by the next init_transactions() (tests/crashpoints/transactions.py).

The counting run names the file operations made inside init_transactions, the sends,
send_offsets_to_transaction, the commits and the aborts; the slice tries a few of each
(distinct system calls, the kill modes and an injected error in turn), 2 at a time.
`python -m tests.crashpoints.transactions` runs every one in every mode (the count and
the last result are in docs/crashpoints.md)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile

import pytest

from tests.crashpoints import driver, transactions

pytestmark = pytest.mark.timeout(600) if hasattr(pytest.mark, "timeout") else []

_REASON = driver.strace_usable()
needs_strace = pytest.mark.skipif(_REASON is not None, reason="crash points need strace "
                                  f"with ptrace: {_REASON}")
VARIANT = "txn"
OPS = ("init_transactions", "send", "send_offsets", "commit", "abort")
PER_OP = 2
# the syscalls that make a transaction durable, tried first
PREFERRED = ("fdatasync", "pwrite64", "msync", "fsync", "rename", "ftruncate", "write",
             "openat", "fallocate", "flock", "mmap", "munmap")


def slice_plan(inside: dict) -> list:
    """PER_OP targets of distinct system calls per transaction call, the modes cycled."""
    plan, turn = [], 0
    for op in OPS:
        mine = sorted((t for t, o in inside.values() if o == op), key=lambda t: t.n)
        for syscall in [s for s in PREFERRED if any(t.syscall == s for t in mine)][:PER_OP]:
            calls = [t for t in mine if t.syscall == syscall]
            target = calls[len(calls) // 2]                # one from the middle
            modes = driver.KILL_MODES + ("EIO",)
            plan.append((target, modes[turn % len(modes)]))
            turn += 1
    return plan


@pytest.fixture(scope="module")
def counted():
    if _REASON is not None:
        pytest.skip(f"crash points need strace with ptrace: {_REASON}")
    workdir = tempfile.mkdtemp(prefix="cp-txn-count-")
    result = driver.count(VARIANT, workdir)
    inside = transactions.txn_targets(os.path.join(workdir, "trace"),
                                      os.path.join(workdir, "ledger"), result["targets"])
    yield result, inside
    shutil.rmtree(workdir, ignore_errors=True)


@needs_strace
def test_the_workload_runs_its_transactions_and_the_checker_passes_it_uncut(counted):
    result, inside = counted
    assert result["returncode"] == 0, result["stderr"]
    assert not result["baseline_events"], result["baseline_events"][:3]
    assert not result["baseline_check"]["failures"], result["baseline_check"]
    ops = {op for _, op in inside.values()}
    assert ops >= set(OPS), sorted(ops)
    kinds = {t.syscall for t, op in inside.values() if op == "commit"}
    for kind in ("pwrite64", "fdatasync", "msync"):       # markers, the log, LMDB
        assert kind in kinds, f"no {kind} inside a commit: {sorted(kinds)}"


@pytest.fixture(scope="module")
def crash_results(counted):
    result, inside = counted
    return driver.run_plan(VARIANT, result, slice_plan(inside), jobs=2)


@needs_strace
@pytest.mark.parametrize("cls", driver.CLASSES)
def test_a_transaction_killed_or_failed_at_a_file_operation_is_all_or_nothing(
        crash_results, cls):
    failed = [r for r in crash_results if cls in r["classes"]]
    lines = [f"{r['syscall']}#{r['n']} {r['mode']}: "
             f"{r['details'][r['classes'].index(cls)][:500]}\n    {r['reproducer']}"
             for r in failed[:4]]
    assert not failed, f"{len(failed)} of {len(crash_results)} trials: {cls}\n" + \
        "\n".join(lines)


@needs_strace
def test_the_slice_reached_the_transaction_calls(crash_results):
    tried = [r for r in crash_results if r["status"] == "tried"]
    assert len(tried) >= 0.8 * len(crash_results), \
        [(r["syscall"], r["n"], r["mode"], r["status"]) for r in crash_results
         if r["status"] != "tried"]
    assert {r["mode"] for r in tried} >= {"kill-before", "kill-after"}


def test_the_checker_sees_a_wrong_outcome_and_offsets_apart_from_records(tmp_path):
    """Not vacuous: a ledger saying an aborted transaction committed, and the group's
    offset moved off the last committed transaction's, are both reported."""
    root, ledger = str(tmp_path / "root"), str(tmp_path / "ledger")
    subprocess.run([driver.PYTHON, "-m", "tests.crashpoints.workload", root, VARIANT,
                    ledger], cwd=driver.ROOT_DIR, env=driver.child_env(), check=True,
                   timeout=120)
    assert driver.run_checker(root, ledger)["failures"] == []
    with open(ledger) as f:
        entries = [json.loads(line) for line in f]
    aborted = next(e for e in entries if e["kind"] == "txn-end" and not e["committed"])
    with open(ledger + ".lie", "w") as f:
        for e in entries:
            if e is aborted:
                e = dict(e, committed=True)
            f.write(json.dumps(e) + "\n")
    details = [x["detail"] for x in driver.run_checker(root, ledger + ".lie")["failures"]]
    assert any(f"txn {aborted['txn']}: committed (acknowledged) but read_committed shows "
               "0" in d for d in details), details
    import logkit
    with logkit.Broker(root) as broker:
        broker.group(transactions.GROUP).reset_offsets(
            {logkit.TopicPartition(transactions.SOURCE, 0): 2})
    details = [x["detail"] for x in driver.run_checker(root, ledger)["failures"]]
    assert any("committed xsrc-0 is 2" in d for d in details), details
