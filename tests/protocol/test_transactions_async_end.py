"""The listener answers EndTxn once PrepareCommit/PrepareAbort is durable, as Kafka does,
and the coordinator's completion thread writes the markers, the offsets and CompleteX
after (logkit/transactions.py). The tests hold that thread with the coordinator's
`before_complete` hook — never a sleep — to see: the answer comes before the markers; a
late batch of the ended transaction is refused meanwhile; the id's next call waits for
the completion and is not refused; a failed completion is logged and finished later;
broker close finishes the queued completions, or leaves a Prepare* the next open
finishes; a broker SIGKILLed between the answer and the completion loses nothing. And
confluent-kafka runs 200 back-to-back transactions, one in five aborted, read back
read_committed exactly once."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

import logkit
from logkit.protocol import errors as E
from logkit.records import encode_batch
from tests.helpers.raw_kafka import Raw
from tests.helpers.txn_waits import wait_stable

WAIT_S = 30.0                       # the deadline of every wait


class Held:
    """A `before_complete` hook that holds the completion thread until released."""

    def __init__(self) -> None:
        self.reached = threading.Event()
        self.release = threading.Event()
        self.calls: list[str] = []

    def __call__(self, transactional_id: str) -> None:
        self.calls.append(transactional_id)
        self.reached.set()
        assert self.release.wait(WAIT_S), "the test never released the completion"


@pytest.fixture
def broker(tmp_path):
    with logkit.Broker(tmp_path / "data") as b:
        b.create_topic("t", 1)
        yield b


def _init(raw, txn_id):
    answer = raw.call(22, 3, {"transactional_id": txn_id, "transaction_timeout_ms": 60000,
                              "producer_id": -1, "producer_epoch": -1})
    assert answer["error_code"] == E.NONE, answer
    return answer["producer_id"], answer["producer_epoch"]


def _add(raw, txn_id, pid, epoch):
    answer = raw.call(24, 3, {
        "v3_and_below_transactional_id": txn_id, "v3_and_below_producer_id": pid,
        "v3_and_below_producer_epoch": epoch,
        "v3_and_below_topics": [{"name": "t", "partitions": [0]}]})
    return answer["results_by_topic_v3_and_below"][0]["results_by_partition"][0][
        "partition_error_code"]


def _produce(raw, txn_id, pid, epoch, sequence, values):
    batch = bytes(encode_batch([(b"k", v, None, None) for v in values], producer_id=pid,
                               producer_epoch=epoch, base_sequence=sequence,
                               transactional=True))
    answer = raw.call(0, 9, {"transactional_id": txn_id, "acks": -1, "timeout_ms": 5000,
                             "topic_data": [{"name": "t", "partition_data": [
                                 {"index": 0, "records": batch}]}]})
    return answer["responses"][0]["partition_responses"][0]["error_code"]


def _end(raw, txn_id, pid, epoch, commit):
    return raw.call(26, 3, {"transactional_id": txn_id, "producer_id": pid,
                            "producer_epoch": epoch, "committed": commit})["error_code"]


def _committed(partition):
    return [r.value for r in partition.read(0, max_records=10000,
                                            isolation_level="read_committed")]


def _open_transaction(raw, txn_id, values):
    pid, epoch = _init(raw, txn_id)
    assert _add(raw, txn_id, pid, epoch) == E.NONE
    assert _produce(raw, txn_id, pid, epoch, 0, values) == E.NONE
    return pid, epoch


def test_end_txn_is_answered_before_the_markers_and_the_next_call_after_them(broker):
    held = Held()
    broker.transaction_coordinator.before_complete = held
    partition = broker.topic("t").partition(0)
    with broker.serve() as server:
        raw = Raw(server)
        pid, epoch = _open_transaction(raw, "a", [b"a1", b"a2"])
        assert _end(raw, "a", pid, epoch, True) == E.NONE
        assert held.reached.wait(WAIT_S)
        # answered; PrepareCommit is durable, the marker is not written
        assert broker.transaction_coordinator.state("a") == "PrepareCommit"
        assert partition.last_stable_offset == 0 and partition.high_watermark == 2
        assert _committed(partition) == []
        # a batch of the ended transaction is refused, though the log still has it open
        assert _produce(raw, "a", pid, epoch, 1, [b"late"]) == E.INVALID_TXN_STATE
        # the next transaction's AddPartitions waits for the completion, then succeeds
        answer = {}
        nxt = threading.Thread(target=lambda: answer.update(code=_add(raw, "a", pid, epoch)))
        nxt.start()
        held.release.set()
        nxt.join(WAIT_S)
        assert answer == {"code": E.NONE}
        assert _committed(partition) == [b"a1", b"a2"]
        assert partition.high_watermark == 3                 # the two records, one marker
        assert held.calls == ["a"]
        raw.close()


def test_a_failed_background_completion_is_logged_and_finished_by_the_next_call(
        broker, caplog):
    """The completion thread's failure (here the hook raises an EIO, as a disk would)
    leaves PrepareCommit and a warning; the id's next call (InitProducerId) finishes
    it: the records are committed once, one marker."""
    failed = threading.Event()

    def fail(transactional_id):
        failed.set()
        raise OSError(5, "Input/output error (injected)")

    broker.transaction_coordinator.before_complete = fail
    partition = broker.topic("t").partition(0)
    with caplog.at_level(logging.WARNING, logger="logkit.transactions"), \
            broker.serve() as server:
        raw = Raw(server)
        pid, epoch = _open_transaction(raw, "b", [b"b1"])
        assert _end(raw, "b", pid, epoch, True) == E.NONE
        assert failed.wait(WAIT_S)
        broker.transaction_coordinator.before_complete = None
        assert _init(raw, "b")[1] == epoch + 1
        raw.close()
    assert any("in the background failed" in r.getMessage() and "Input/output" in
               r.getMessage() for r in caplog.records), caplog.text
    assert broker.transaction_coordinator.state("b") == "Empty"
    assert _committed(partition) == [b"b1"]
    assert partition.high_watermark == 2


def test_broker_close_finishes_the_queued_completions(tmp_path):
    path = tmp_path / "data"
    held = Held()
    broker = logkit.Broker(path)
    broker.create_topic("t", 1)
    broker.transaction_coordinator.before_complete = held
    with broker.serve() as server:
        raw = Raw(server)
        pid, epoch = _open_transaction(raw, "c", [b"c1"])
        assert _end(raw, "c", pid, epoch, True) == E.NONE
        raw.close()
    assert held.reached.wait(WAIT_S)
    closer = threading.Thread(target=broker.close)
    closer.start()
    closer.join(0.2)
    assert closer.is_alive()                 # close waits for the held completion
    held.release.set()
    closer.join(WAIT_S)
    assert not closer.is_alive()
    # read-only: an open that completes nothing itself
    with logkit.Broker(path, read_only=True) as after:
        assert after.transaction_coordinator.state("c") == "CompleteCommit"
        assert _committed(after.topic("t").partition(0)) == [b"c1"]


def test_broker_close_that_stops_waiting_leaves_prepare_commit_for_the_next_open(
        tmp_path):
    path = tmp_path / "data"
    held = Held()
    broker = logkit.Broker(path)
    broker.create_topic("t", 1)
    coordinator = broker.transaction_coordinator
    coordinator.before_complete = held
    coordinator.close_timeout_s = 0.1
    with broker.serve() as server:
        raw = Raw(server)
        pid, epoch = _open_transaction(raw, "d", [b"d1"])
        assert _end(raw, "d", pid, epoch, True) == E.NONE
        raw.close()
    assert held.reached.wait(WAIT_S)
    broker.close()                           # gives up on the held completion
    held.release.set()                       # the thread then touches nothing
    with logkit.Broker(path, read_only=True) as after:
        assert after.transaction_coordinator.state("d") == "PrepareCommit"
        assert _committed(after.topic("t").partition(0)) == []
    with logkit.Broker(path) as after:       # a writable open completes it
        assert after.transaction_coordinator.state("d") == "CompleteCommit"
        assert _committed(after.topic("t").partition(0)) == [b"d1"]


_CHILD = textwrap.dedent("""
    import sys, threading
    import logkit
    broker = logkit.Broker(sys.argv[1])
    if "t" not in broker.topics():
        broker.create_topic("t", 1)
    def hold(transactional_id):
        print("held", flush=True)
        threading.Event().wait()             # until SIGKILL
    broker.transaction_coordinator.before_complete = hold
    server = broker.serve()
    print(server.port, flush=True)
    sys.stdin.read()
""")


def test_a_broker_killed_between_the_answer_and_the_markers_keeps_the_commit(tmp_path):
    path = str(tmp_path / "data")
    child = subprocess.Popen([sys.executable, "-c", _CHILD, path], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True,
                             cwd=os.path.dirname(os.path.dirname(logkit.__file__)))
    try:
        port = int(child.stdout.readline())
        server = type("Server", (), {"host": "127.0.0.1", "port": port})()
        raw = Raw(server)
        pid, epoch = _open_transaction(raw, "e", [b"e1", b"e2"])
        assert _end(raw, "e", pid, epoch, True) == E.NONE
        assert child.stdout.readline().strip() == "held"
        os.kill(child.pid, signal.SIGKILL)
        child.wait(WAIT_S)
        raw.close()
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(WAIT_S)
    with logkit.Broker(path, read_only=True) as after:
        assert after.transaction_coordinator.state("e") == "PrepareCommit"
        assert _committed(after.topic("t").partition(0)) == []
    with logkit.Broker(path) as after:
        assert after.transaction_coordinator.state("e") == "CompleteCommit"
        partition = after.topic("t").partition(0)
        assert _committed(partition) == [b"e1", b"e2"]
        assert partition.last_stable_offset == partition.high_watermark == 3


def test_confluent_kafka_runs_200_back_to_back_transactions_read_committed_once(broker):
    ck = pytest.importorskip("confluent_kafka")
    broker.create_topic("eos", 2)
    with broker.serve() as server:
        servers = server.bootstrap_servers
        producer = ck.Producer({"bootstrap.servers": servers,
                                "transactional.id": "back-to-back", "linger.ms": 0})
        producer.init_transactions(WAIT_S)
        committed, aborted = [], []
        for n in range(200):
            producer.begin_transaction()
            values = [b"%d-%d" % (n, i) for i in range(2)]
            for i, value in enumerate(values):
                producer.produce("eos", value, b"k", partition=i)
            if n % 5 == 4:
                producer.abort_transaction(WAIT_S)
                aborted += values
            else:
                producer.commit_transaction(WAIT_S)
                committed += values
        producer.flush(WAIT_S)
        consumer = ck.Consumer({"bootstrap.servers": servers, "group.id": "reader",
                                "auto.offset.reset": "earliest",
                                "enable.auto.commit": False,
                                "isolation.level": "read_committed"})
        consumer.subscribe(["eos"])
        got = []
        try:
            deadline = time.monotonic() + WAIT_S
            while len(got) < len(committed) and time.monotonic() < deadline:
                msg = consumer.poll(0.5)
                if msg is not None and msg.error() is None:
                    got.append(msg.value())
            for _ in range(4):                  # a little more: nothing else arrives
                msg = consumer.poll(0.25)
                if msg is not None and msg.error() is None:
                    got.append(msg.value())
        finally:
            consumer.close()
    assert len(got) == len(set(got)) == len(committed)
    assert sorted(got) == sorted(committed)
    assert not set(got) & set(aborted)
    wait_stable(broker, "eos")                   # the last abort's markers too
    embedded = [v for p in broker.topic("eos").partitions for v in _committed(p)]
    assert sorted(embedded) == sorted(committed)
