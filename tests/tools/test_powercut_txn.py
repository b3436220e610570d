"""Power cuts during transactions: a bounded slice of the `txn` power-cut workload
(tests/powercut/runner.py TXN_WORKLOADS; tools/powercut.py --workload txn runs as many
as asked, docs/powercut.md reports them), and the regression tests of the hole the
trials found: the coordinator made `Complete*` durable in LMDB while the markers it had
just appended were not synced, so a power cut could keep a transaction's records, lose
its marker, and leave it hanging (or lose the records of a commit that had returned).
Skipped, with the reason, when strace is missing or ptrace is not permitted (the test
that drives logkit directly needs neither).
"""

from __future__ import annotations

import tempfile

import pytest

from tests.crashpoints import driver
from tests.powercut import check, model, runner

_REASON = driver.strace_usable()
needs_strace = pytest.mark.skipif(_REASON is not None, reason="power-cut trials need "
                                  f"strace with ptrace: {_REASON}")

SLICE = 60
SEED = 20261128


@pytest.fixture(scope="module")
def recorded():
    if _REASON is not None:
        pytest.skip(f"power-cut trials need strace with ptrace: {_REASON}")
    rec = runner.record("txn", tempfile.mkdtemp(prefix="pc-test-txn-"))
    return rec, rec.parse()


@pytest.fixture(scope="module")
def slice_results(recorded):
    rec, tr = recorded
    return runner.run(rec, runner.plan(SLICE, SEED, len(tr.ops)), jobs=2)


def _lines(failed: list[dict], cls: str | None = None) -> str:
    return "\n".join(f"trial {r['trial']} cut {r['cut']} {r['mode']} seed {r['seed']}: "
                     f"{r['details'][r['classes'].index(cls) if cls else 0][:400]}"
                     for r in failed[:5])


@needs_strace
@pytest.mark.parametrize("cls", check.CLASSES + ("harness-error",))
def test_no_violations_of_class(slice_results, cls):
    assert len(slice_results) == SLICE
    failed = [r for r in slice_results if cls in r["classes"]]
    assert not failed, f"{len(failed)} of {SLICE} trials: {cls}\n" + _lines(failed, cls)


@needs_strace
def test_slice_covers_every_mode_and_finished_transactions(slice_results, recorded):
    """Not vacuous: the cuts fall after transactions ended, in every mode."""
    _, tr = recorded
    ends = [i + 1 for i, op in enumerate(tr.ops)
            if op.kind == "ack" and op.entry["kind"] == "txn-end"]
    assert len(ends) >= 7, ends
    assert sum(1 for r in slice_results if r["cut"] > ends[0]) >= SLICE // 2
    assert {r["mode"] for r in slice_results} == set(model.MODES)


@needs_strace
def test_a_cut_right_after_each_transaction_end_keeps_it_whole(recorded):
    """A cut right after each commit_transaction()/abort_transaction() returned (its
    Complete* durable in LMDB), every unsynced write dropped: the committed transaction
    is visible whole with its offsets, the aborted one not at all, and no partition
    holds a transaction open that the coordinator considers complete. Failed before
    the coordinator synced the marked partitions before Complete* (hanging markers,
    committed records gone)."""
    _, tr = recorded
    cuts = [i + 1 for i, op in enumerate(tr.ops)
            if op.kind == "ack" and op.entry["kind"] == "txn-end"]
    failed = []
    for n, cut in enumerate(cuts):
        result = runner.run_trial(tr, "txnsync", {"trial": n, "cut": cut,
                                                  "mode": "synced", "seed": n})
        if result["classes"]:
            failed.append(result)
    assert not failed, f"{len(failed)} of {len(cuts)} cuts\n" + _lines(failed)


def test_commit_transaction_syncs_every_partition_it_marked(tmp_path):
    """When commit_transaction() returns, each partition of the transaction is durable
    through its marker (the default flush policy: nothing else syncs them), and so is
    the partition its offsets name."""
    import logkit
    from logkit.topic import TopicPartition
    broker = logkit.Broker(str(tmp_path / "root"), background=False)
    try:
        broker.create_topic("out", 3)
        broker.create_topic("src", 1)
        src = broker.topic("src").partition(0)
        src.append([(b"k", b"s%d" % i, None, None) for i in range(4)])
        with broker.producer(transactional_id="tx") as producer:
            producer.init_transactions()
            for commit in (True, False):
                producer.begin_transaction()
                for p in (0, 2):
                    producer.send("out", b"v", partition=p)
                producer.send_offsets_to_transaction({TopicPartition("src", 0): 3}, "g")
                if commit:
                    producer.commit_transaction()
                else:
                    producer.abort_transaction()
                for p in broker.topic("out").partitions:
                    point = p._log.tail().recovery_point
                    if p.partition == 1:
                        assert point == 0                  # not in the transaction
                    else:
                        assert point == p.log_end_offset, (commit, p.partition, point)
                assert src._log.tail().recovery_point >= 3
    finally:
        broker.close()
