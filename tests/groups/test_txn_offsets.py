"""The transaction coordinator on its own (logkit/transactions.py): its state in real
LMDB, Kafka's state machine, fencing by epoch, timeouts, offsets sent in a transaction
becoming the group's committed offsets at the commit only, and the two-phase commit a
SIGKILL between PrepareCommit and CompleteCommit leaves for the next open to finish.
The markers go to a recording callback here (the log's `append_control` is tested with
the clients, tests/clients/test_transactions.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest

import logkit
from logkit.group import committed_offsets
from logkit.meta import MetaStore
from logkit.transactions import TransactionCoordinator

TP = logkit.TopicPartition


class Markers:
    """The coordinator's `write_markers`: records every call."""

    def __init__(self) -> None:
        self.calls: list[tuple[list[TP], int, int, bool]] = []

    def __call__(self, partitions, producer_id, epoch, commit) -> None:
        self.calls.append((sorted(partitions), producer_id, epoch, commit))


@pytest.fixture
def store(tmp_path):
    meta = MetaStore(str(tmp_path / "meta"))
    yield meta
    meta.close()


def coordinator(store, markers=None):
    return TransactionCoordinator(store, markers or Markers(),
                                  lock_path=os.path.join(os.path.dirname(store.path),
                                                         "transactions.lock"))


def test_idempotent_producers_get_fresh_ids_with_epoch_zero(store):
    c = coordinator(store)
    ids = [c.init_producer_id(None) for _ in range(100)]
    assert all(epoch == 0 for _, epoch in ids)
    assert len({pid for pid, _ in ids}) == 100
    other = coordinator(store)                  # another process's block: no overlap
    assert other.init_producer_id(None)[0] not in {pid for pid, _ in ids}


def test_init_bumps_the_epoch_and_fences_the_older_producer(store):
    c = coordinator(store)
    pid, epoch = c.init_producer_id("copier", 60000)
    assert (pid, epoch) == (pid, 0)
    pid2, epoch2 = c.init_producer_id("copier", 60000)
    assert (pid2, epoch2) == (pid, 1)
    with pytest.raises(logkit.ProducerFencedError):
        c.add_partitions("copier", pid, 0, [TP("out", 0)])
    with pytest.raises(logkit.InvalidProducerIdMappingError):
        c.add_partitions("copier", pid + 1000, 1, [TP("out", 0)])
    c.add_partitions("copier", pid, 1, [TP("out", 0)])
    assert c.state("copier") == "Ongoing"


def test_commit_writes_markers_then_moves_the_pending_offsets_into_the_group(store):
    markers = Markers()
    c = coordinator(store, markers)
    pid, epoch = c.init_producer_id("copier", 60000)
    c.add_partitions("copier", pid, epoch, [TP("out", 0), TP("out", 1)])
    c.add_offsets("copier", pid, epoch, "g")
    c.txn_offset_commit("copier", pid, epoch, "g", {TP("in", 0): (43, "m")})
    assert committed_offsets(store, "g") == {}               # pending: not visible
    assert c.pending_offset_partitions("g") == {TP("in", 0)}
    c.end_txn("copier", pid, epoch, commit=True)
    assert markers.calls == [([TP("out", 0), TP("out", 1)], pid, epoch, True)]
    assert committed_offsets(store, "g") == {TP("in", 0): logkit.OffsetAndMetadata(43, "m")}
    assert c.state("copier") == "CompleteCommit"
    assert c.pending_offset_partitions("g") == set()
    c.end_txn("copier", pid, epoch, commit=True)             # a retry: answered, no-op
    assert len(markers.calls) == 1
    with pytest.raises(logkit.InvalidTxnStateError):
        c.end_txn("copier", pid, epoch, commit=False)


def test_abort_drops_the_pending_offsets(store):
    markers = Markers()
    c = coordinator(store, markers)
    pid, epoch = c.init_producer_id("copier", 60000)
    c.add_offsets("copier", pid, epoch, "g")
    c.txn_offset_commit("copier", pid, epoch, "g", {TP("in", 0): (7, None)})
    c.end_txn("copier", pid, epoch, commit=False)
    assert committed_offsets(store, "g") == {}
    assert c.state("copier") == "CompleteAbort"
    assert markers.calls == []            # offsets only: no partition to mark


def test_calls_out_of_order_raise_invalid_txn_state(store):
    c = coordinator(store)
    pid, epoch = c.init_producer_id("copier", 60000)
    with pytest.raises(logkit.InvalidTxnStateError):
        c.end_txn("copier", pid, epoch, commit=True)          # nothing begun
    with pytest.raises(logkit.InvalidTxnStateError):
        c.txn_offset_commit("copier", pid, epoch, "g", {TP("in", 0): (1, "")})
    with pytest.raises(logkit.TransactionalIdNotFoundError):
        c.add_partitions("never-initialised", 1, 0, [TP("out", 0)])


def test_init_aborts_the_open_transaction_with_a_bumped_epoch(store):
    markers = Markers()
    c = coordinator(store, markers)
    pid, epoch = c.init_producer_id("copier", 60000)
    c.add_partitions("copier", pid, epoch, [TP("out", 0)])
    c.add_offsets("copier", pid, epoch, "g")
    c.txn_offset_commit("copier", pid, epoch, "g", {TP("in", 0): (5, "")})
    pid2, epoch2 = c.init_producer_id("copier", 60000)
    # the abort's markers carry the fencing epoch, above the old producer's
    assert markers.calls == [([TP("out", 0)], pid, epoch + 1, False)]
    assert (pid2, epoch2) == (pid, epoch + 2)
    assert committed_offsets(store, "g") == {}
    with pytest.raises(logkit.ProducerFencedError):
        c.end_txn("copier", pid, epoch, commit=True)


def test_expired_transactions_are_aborted_and_their_producer_fenced(store):
    markers = Markers()
    c = coordinator(store, markers)
    pid, epoch = c.init_producer_id("slow", 1000)
    c.add_partitions("slow", pid, epoch, [TP("out", 0)])
    start = c.describe_transactions(["slow"])[0].transaction_start_ms
    assert c.abort_expired(start + 999) == []
    assert c.abort_expired(start + 1000) == ["slow"]
    assert c.state("slow") == "CompleteAbort"
    assert markers.calls == [([TP("out", 0)], pid, epoch + 1, False)]
    with pytest.raises(logkit.ProducerFencedError):
        c.end_txn("slow", pid, epoch, commit=True)


def test_an_epoch_about_to_overflow_takes_a_new_producer_id(store):
    c = coordinator(store)
    pid, _ = c.init_producer_id("old", 60000)

    def near_overflow(txn):
        record = c._load(txn, b"old")
        record["epoch"] = 32765
        store.put(txn, "txn", b"old", record)

    store.write(near_overflow)
    pid2, epoch2 = c.init_producer_id("old", 60000)
    assert pid2 != pid and epoch2 == 0
    with pytest.raises(logkit.ProducerFencedError):
        c.add_partitions("old", pid, 32765, [TP("out", 0)])


def test_list_and_describe_use_kafkas_state_names(store):
    c = coordinator(store)
    pid, epoch = c.init_producer_id("a", 60000)
    c.init_producer_id("b", 60000)
    c.add_partitions("a", pid, epoch, [TP("out", 2)])
    assert {(t.transactional_id, t.state) for t in c.list_transactions()} == \
        {("a", "Ongoing"), ("b", "Empty")}
    assert [t.transactional_id for t in c.list_transactions(states=["Ongoing"])] == ["a"]
    described = c.describe_transactions(["a"])[0]
    assert (described.state, described.producer_id, described.partitions) == \
        ("Ongoing", pid, [TP("out", 2)])
    with pytest.raises(logkit.TransactionalIdNotFoundError):
        c.describe_transactions(["nobody"])


def test_a_bad_timeout_is_refused(store):
    c = coordinator(store)
    for bad in (0, -1, 900001, "60000"):
        with pytest.raises(logkit.InvalidTransactionTimeoutError):
            c.init_producer_id("t", bad)


def test_offsets_from_a_stale_generation_are_refused(tmp_path):
    with logkit.Broker(tmp_path / "b") as broker:
        broker.create_topic("in", 1)
        consumer = broker.consumer("in", group_id="g", auto_offset_reset="earliest")
        consumer.poll(100)
        meta = consumer.group_metadata()
        c = broker.transaction_coordinator
        pid, epoch = c.init_producer_id("copier", 60000)
        c.add_offsets("copier", pid, epoch, "g")
        with pytest.raises(logkit.CommitFailedError):
            c.txn_offset_commit("copier", pid, epoch, "g", {TP("in", 0): (0, "")},
                                generation_id=meta.generation_id + 5,
                                member_id=meta.member_id)
        with pytest.raises(logkit.CommitFailedError):
            c.txn_offset_commit("copier", pid, epoch, "g", {TP("in", 0): (0, "")},
                                generation_id=meta.generation_id, member_id="nobody")
        c.txn_offset_commit("copier", pid, epoch, "g", {TP("in", 0): (0, "")},
                            generation_id=meta.generation_id, member_id=meta.member_id)
        consumer.close()


CRASH_CHILD = textwrap.dedent("""
    import os, signal, sys
    from logkit.meta import MetaStore
    from logkit.transactions import TransactionCoordinator
    from logkit.topic import TopicPartition as TP

    def die(partitions, producer_id, epoch, commit):
        if sys.argv[2] == "after-markers":
            with open(sys.argv[3], "w") as f:
                f.write("marked")
        os.kill(os.getpid(), signal.SIGKILL)

    root = sys.argv[1]
    meta = MetaStore(os.path.join(root, "meta"))
    c = TransactionCoordinator(meta, die, lock_path=os.path.join(root, "transactions.lock"))
    pid, epoch = c.init_producer_id("copier", 60000)
    c.add_partitions("copier", pid, epoch, [TP("out", 0)])
    c.add_offsets("copier", pid, epoch, "g")
    c.txn_offset_commit("copier", pid, epoch, "g", {TP("in", 0): (11, "x")})
    c.end_txn("copier", pid, epoch, commit=True)
""")


@pytest.mark.parametrize("where", ["before-markers", "after-markers"])
def test_a_commit_killed_between_its_phases_is_completed_at_the_next_open(tmp_path, where):
    root = str(tmp_path)
    done = subprocess.run([sys.executable, "-c", CRASH_CHILD, root, where,
                           str(tmp_path / "flag")], timeout=60)
    assert done.returncode == -signal.SIGKILL
    meta = MetaStore(os.path.join(root, "meta"))
    try:
        markers = Markers()
        c = coordinator(meta, markers)
        assert c.state("copier") == "PrepareCommit"     # the first phase is durable
        assert committed_offsets(meta, "g") == {}
        assert c.complete_prepared() == 1
        assert c.state("copier") == "CompleteCommit"
        assert committed_offsets(meta, "g") == {TP("in", 0): logkit.OffsetAndMetadata(11,
                                                                                       "x")}
        assert [call[:1] + call[3:] for call in markers.calls] == [([TP("out", 0)], True)]
        assert c.complete_prepared() == 0
    finally:
        meta.close()


def test_brokers_on_one_root_in_one_process_share_the_transaction_lock(tmp_path):
    """POSIX record locks belong to the process (and closing any descriptor of the
    file drops them all): two Broker objects on one root must share one lock, and
    closing one leaves the other's working."""
    first = logkit.Broker(tmp_path, background=False)
    second = logkit.Broker(tmp_path, background=False)
    try:
        assert first.transaction_coordinator._lock is second.transaction_coordinator._lock
        first.create_topic("out", 1)
        producer = first.producer(transactional_id="copier")
        producer.init_transactions()
        with producer.transaction():
            producer.send("out", b"v")
        producer.close()
        first.close()
        c = second.transaction_coordinator
        pid, epoch = c.init_producer_id("copier", 60000)
        c.add_partitions("copier", pid, epoch, [TP("out", 0)])
        c.end_txn("copier", pid, epoch, commit=False)
        assert c.state("copier") == "CompleteAbort"
    finally:
        first.close()
        second.close()
