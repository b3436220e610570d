"""Transactions in the embedded clients (docs/design.md §15): commit and abort seen
right by read_committed and read_uncommitted readers, control batches never returned,
the last stable offset, calls out of order, fencing (at the call or through the
future), the context manager, offsets sent in a transaction, timeout aborts by the
broker's thread, a SIGKILLed producer's transaction aborted by the next
init_transactions(), a crash between the two phases completed at the next open, and
the headline: a consume-transform-produce loop SIGKILLed at random points and
restarted gives its input exactly once."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import textwrap
import time

import pytest

import logkit

TP = logkit.TopicPartition
COMMITTED = "read_committed"


def values(partition, level=COMMITTED):
    return [r.value for r in partition.read(partition.log_start_offset,
                                            max_records=100_000, isolation_level=level)]


def wait_for(condition, timeout_s=30.0, what="the condition"):
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not hold within {timeout_s} s")
        time.sleep(0.02)


@pytest.fixture
def broker(logkit_broker):
    logkit_broker.create_topic("out", 2)
    logkit_broker.create_topic("in", 1)
    return logkit_broker


def test_a_committed_transaction_is_read_whole_and_an_aborted_one_not_at_all(broker):
    producer = broker.producer(transactional_id="copier")
    producer.init_transactions()
    producer.begin_transaction()
    for i in range(10):
        producer.send("out", b"c%d" % i, partition=0)
    producer.commit_transaction()
    producer.begin_transaction()
    for i in range(5):
        producer.send("out", b"a%d" % i, partition=0)
    producer.abort_transaction()
    p = broker.topic("out").partition(0)
    assert values(p) == [b"c%d" % i for i in range(10)]
    # read_uncommitted returns every data record; no level returns a control batch
    assert values(p, "read_uncommitted") == [b"c%d" % i for i in range(10)] + \
        [b"a%d" % i for i in range(5)]
    assert p.log_end_offset == 17                            # 15 records, 2 markers
    assert p.last_stable_offset == p.high_watermark == 17
    producer.close()


def test_the_last_stable_offset_holds_at_the_open_transaction(broker):
    plain = broker.producer()
    plain.send("out", b"before", partition=0).result(timeout=10)
    producer = broker.producer(transactional_id="copier")
    producer.init_transactions()
    producer.begin_transaction()
    producer.send("out", b"open", partition=0)
    producer.flush()
    plain.send("out", b"after", partition=0).result(timeout=10)
    p = broker.topic("out").partition(0)
    assert (p.last_stable_offset, p.high_watermark) == (1, 3)
    assert values(p) == [b"before"]
    producer.commit_transaction()
    assert p.last_stable_offset == p.high_watermark == 4
    assert values(p) == [b"before", b"open", b"after"]
    producer.close()
    plain.close()


def test_calls_out_of_order_raise_invalid_txn_state(broker):
    producer = broker.producer(transactional_id="copier")
    with pytest.raises(logkit.InvalidTxnStateError):
        producer.send("out", b"v")                          # before init_transactions
    producer.init_transactions()
    with pytest.raises(logkit.InvalidTxnStateError):
        producer.send("out", b"v")                          # outside a transaction
    with pytest.raises(logkit.InvalidTxnStateError):
        producer.commit_transaction()                       # commit without begin
    with pytest.raises(logkit.InvalidTxnStateError):
        producer.abort_transaction()
    producer.begin_transaction()
    with pytest.raises(logkit.InvalidTxnStateError):
        producer.begin_transaction()
    producer.commit_transaction()                           # empty: nothing to end
    plain = broker.producer(acks="all")
    with pytest.raises(logkit.InvalidTxnStateError):
        plain.init_transactions()
    plain.close()
    producer.close()
    assert broker.topic("out").partition(0).log_end_offset == 0


def test_a_fenced_producer_raises_producer_fenced_at_its_next_call(broker):
    zombie = broker.producer(transactional_id="copier")
    zombie.init_transactions()
    zombie.begin_transaction()
    zombie.send("out", b"zombie", partition=0).result(timeout=10)
    successor = broker.producer(transactional_id="copier")
    successor.init_transactions()                  # fences and aborts the zombie's
    p = broker.topic("out").partition(0)
    assert p.last_stable_offset == p.high_watermark
    # a partition already in the transaction: the log refuses the old epoch
    future = zombie.send("out", b"late", partition=0)
    with pytest.raises(logkit.ProducerFencedError):
        future.result(timeout=10)
    with pytest.raises(logkit.ProducerFencedError):
        zombie.send("out", b"later", partition=1)   # every call from now on
    with pytest.raises(logkit.ProducerFencedError):
        zombie.commit_transaction()
    successor.begin_transaction()
    successor.send("out", b"ok", partition=1)
    successor.commit_transaction()
    assert values(p) == [] and values(broker.topic("out").partition(1)) == [b"ok"]
    zombie.close()
    successor.close()


def test_a_fenced_producer_learns_it_at_commit(broker):
    zombie = broker.producer(transactional_id="copier")
    zombie.init_transactions()
    zombie.begin_transaction()
    zombie.send("out", b"zombie", partition=0)
    successor = broker.producer(transactional_id="copier")
    successor.init_transactions()
    with pytest.raises(logkit.ProducerFencedError):
        zombie.commit_transaction()
    assert values(broker.topic("out").partition(0)) == []
    zombie.close()
    successor.close()


def test_closing_a_producer_aborts_its_open_transaction(broker):
    producer = broker.producer(transactional_id="copier")
    producer.init_transactions()
    producer.begin_transaction()
    producer.send("out", b"unfinished", partition=0)
    producer.close()
    p = broker.topic("out").partition(0)
    assert p.last_stable_offset == p.high_watermark == 2
    assert values(p) == []
    assert broker.transaction_coordinator.state("copier") == "CompleteAbort"


def test_an_exception_in_the_block_propagates_after_the_abort(broker):
    producer = broker.producer(transactional_id="copier")
    producer.init_transactions()
    with pytest.raises(KeyError, match="boom"):
        with producer.transaction():
            producer.send("out", b"doomed", partition=0)
            raise KeyError("boom")
    with producer.transaction():
        producer.send("out", b"kept", partition=0)
    p = broker.topic("out").partition(0)
    assert values(p) == [b"kept"]
    assert values(p, "read_uncommitted") == [b"doomed", b"kept"]
    producer.close()


def test_offsets_sent_in_a_transaction_show_at_the_commit_and_go_with_an_abort(broker):
    group = broker.group("g")
    producer = broker.producer(transactional_id="copier")
    producer.init_transactions()
    producer.begin_transaction()
    producer.send("out", b"x", partition=0)
    producer.send_offsets_to_transaction({TP("in", 0): 7}, "g")
    assert group.committed() == {}
    assert broker.transaction_coordinator.pending_offset_partitions("g") == {TP("in", 0)}
    producer.abort_transaction()
    assert group.committed() == {}
    producer.begin_transaction()
    producer.send_offsets_to_transaction({TP("in", 0): (9, "meta")}, "g")
    producer.commit_transaction()
    assert group.committed() == {TP("in", 0): 9}
    producer.close()


def test_the_group_lag_stops_at_the_last_stable_offset_for_read_committed(broker):
    plain = broker.producer()
    for i in range(3):
        plain.send("in", b"%d" % i).result(timeout=10)
    producer = broker.producer(transactional_id="writer")
    producer.init_transactions()
    producer.begin_transaction()
    producer.send("in", b"open")
    producer.flush()
    group = broker.group("g")
    committer = broker.producer(transactional_id="committer")
    committer.init_transactions()
    with committer.transaction():
        committer.send_offsets_to_transaction({TP("in", 0): 3}, "g")
    assert group.lag(isolation_level="read_committed") == {TP("in", 0): 0}
    assert group.lag(isolation_level="read_uncommitted") == {TP("in", 0): 1}
    producer.commit_transaction()
    assert group.lag(isolation_level="read_committed") == {TP("in", 0): 2}  # + marker
    for p in (plain, producer, committer):
        p.close()


def test_a_read_committed_consumer_moves_past_markers_and_aborted_records(broker):
    producer = broker.producer(transactional_id="copier")
    producer.init_transactions()
    with producer.transaction():
        producer.send("out", b"one", partition=0)
    producer.begin_transaction()
    producer.send("out", b"aborted", partition=0)
    producer.abort_transaction()
    consumer = broker.consumer(group_id="g", isolation_level=COMMITTED,
                               auto_offset_reset="earliest", enable_auto_commit=False)
    consumer.assign([TP("out", 0)])
    got = consumer.poll(timeout_ms=2000)
    assert [r.value for r in got] == [b"one"]
    wait_for(lambda: consumer.poll(timeout_ms=50) == [] and
             consumer.position(TP("out", 0)) == 4, what="the position passing the markers")
    uncommitted = broker.consumer(auto_offset_reset="earliest")
    uncommitted.assign([TP("out", 0)])
    assert [r.value for r in uncommitted.poll(timeout_ms=2000)] == [b"one", b"aborted"]
    consumer.close()
    uncommitted.close()
    producer.close()


def test_read_committed_ends_at_the_last_stable_offset_everywhere(broker):
    from logkit.testing import read_all
    producer = broker.producer(transactional_id="copier")
    producer.init_transactions()
    with producer.transaction():
        producer.send("out", b"done", partition=0)
    producer.begin_transaction()
    producer.send("out", b"open", partition=0)
    producer.flush()
    tp = TP("out", 0)
    consumer = broker.consumer(isolation_level=COMMITTED)
    consumer.assign([tp])
    assert consumer.end_offsets([tp]) == {tp: 2}
    consumer.seek_to_end()
    assert consumer.position(tp) == 2
    latest = broker.consumer(isolation_level=COMMITTED, auto_offset_reset="latest")
    latest.assign([tp])
    assert latest.position(tp) == 2
    assert [r.value for r in read_all(broker, "out", isolation_level=COMMITTED)] == \
        [b"done"]
    assert [r.value for r in read_all(broker, "out")] == [b"done", b"open"]
    producer.commit_transaction()
    assert [r.value for r in consumer.poll(timeout_ms=2000)] == [b"open"]
    for client in (consumer, latest, producer):
        client.close()


def test_an_expired_transaction_is_aborted_by_the_broker(broker):
    producer = broker.producer(transactional_id="slow", transaction_timeout_ms=500)
    producer.init_transactions()
    producer.begin_transaction()
    producer.send("out", b"late", partition=0)
    producer.flush()
    p = broker.topic("out").partition(0)
    assert p.last_stable_offset == 0
    started = time.monotonic()
    coordinator = broker.transaction_coordinator
    wait_for(lambda: coordinator.state("slow") == "CompleteAbort", timeout_s=12,
             what="the timeout abort")
    assert time.monotonic() - started < 10.5               # within 10 s of the timeout
    assert p.last_stable_offset == p.high_watermark == 2
    with pytest.raises(logkit.ProducerFencedError):
        producer.commit_transaction()
    assert values(p) == []
    producer.close()


KILLED_MID_TRANSACTION = textwrap.dedent("""
    import os, signal, sys, logkit
    broker = logkit.Broker(sys.argv[1])
    producer = broker.producer(transactional_id="copier")
    producer.init_transactions()
    producer.begin_transaction()
    for i in range(5):
        producer.send("out", b"lost-%d" % i, partition=0)
    producer.flush()
    os.kill(os.getpid(), signal.SIGKILL)
""")


def test_a_sigkilled_producers_transaction_is_aborted_by_the_next_init(tmp_path):
    with logkit.Broker(tmp_path) as broker:
        broker.create_topic("out", 1)
    done = subprocess.run([sys.executable, "-c", KILLED_MID_TRANSACTION, str(tmp_path)],
                          timeout=60)
    assert done.returncode == -signal.SIGKILL
    with logkit.Broker(tmp_path) as broker:
        p = broker.topic("out").partition(0)
        assert (p.last_stable_offset, p.high_watermark) == (0, 5)
        producer = broker.producer(transactional_id="copier")
        producer.init_transactions()
        assert p.last_stable_offset == p.high_watermark == 6
        with producer.transaction():
            producer.send("out", b"kept", partition=0)
        assert values(p) == [b"kept"]
        producer.close()


KILLED_BETWEEN_PHASES = textwrap.dedent("""
    import os, signal, sys, logkit
    broker = logkit.Broker(sys.argv[1])
    coordinator = broker.transaction_coordinator
    write_markers = coordinator._write_markers

    def then_die(*args, **kwargs):           # fault injection: a kill, before or after
        if sys.argv[2] == "after":            # the markers
            write_markers(*args, **kwargs)
        os.kill(os.getpid(), signal.SIGKILL)

    coordinator._write_markers = then_die
    producer = broker.producer(transactional_id="copier")
    producer.init_transactions()
    producer.begin_transaction()
    producer.send("out", b"v", partition=0)
    producer.send_offsets_to_transaction({logkit.TopicPartition("in", 0): 1}, "g")
    if sys.argv[3] == "commit":
        producer.commit_transaction()
    else:
        producer.abort_transaction()
""")


@pytest.mark.parametrize("where", ["before", "after"])
@pytest.mark.parametrize("end", ["commit", "abort"])
def test_an_end_killed_between_its_phases_is_completed_at_the_next_open(tmp_path, where,
                                                                       end):
    with logkit.Broker(tmp_path) as broker:
        broker.create_topic("out", 1)
        broker.create_topic("in", 1)
    done = subprocess.run([sys.executable, "-c", KILLED_BETWEEN_PHASES, str(tmp_path),
                           where, end], timeout=60)
    assert done.returncode == -signal.SIGKILL
    with logkit.Broker(tmp_path, background=False) as broker:
        commit = end == "commit"
        assert broker.transaction_coordinator.state("copier") == \
            ("CompleteCommit" if commit else "CompleteAbort")
        assert broker.group("g").committed() == ({TP("in", 0): 1} if commit else {})
        p = broker.topic("out").partition(0)
        assert values(p) == ([b"v"] if commit else [])
        assert p.log_end_offset == 2 == p.last_stable_offset     # one marker, not two


# ---- the headline: consume-transform-produce, SIGKILLed at random, exactly once ---------

INPUT_RECORDS = 3000
COPIER = textwrap.dedent("""
    import sys, logkit
    TP = logkit.TopicPartition
    with logkit.Broker(sys.argv[1]) as broker:
        consumer = broker.consumer(group_id="copy", isolation_level="read_committed",
                                   auto_offset_reset="earliest", enable_auto_commit=False)
        consumer.assign([TP("in", 0), TP("in", 1)])
        producer = broker.producer(transactional_id="copier", linger_ms=1)
        producer.init_transactions()
        idle = 0
        while idle < 20:
            records = consumer.poll(timeout_ms=50, max_records=17)
            if not records:
                idle += 1
                continue
            idle = 0
            with producer.transaction():
                for r in records:
                    producer.send("out", r.value.upper(), key=r.key)
                producer.send_offsets_to_transaction(
                    {tp: consumer.position(tp) for tp in consumer.assignment()},
                    consumer.group_metadata())
            print("committed", flush=True)
        print("done", flush=True)
""")


def test_a_copier_killed_at_random_points_copies_its_input_exactly_once(tmp_path):
    rng = random.Random(int(os.environ.get("LOGKIT_KILL_SEED", "33")))
    with logkit.Broker(tmp_path) as broker:
        broker.create_topic("in", 2)
        broker.create_topic("out", 3)
        with broker.producer() as feeder:
            for i in range(INPUT_RECORDS):
                feeder.send("in", b"record-%04d" % i, key=b"%d" % i)
    kills = killed_mid_stream = 0
    started = time.monotonic()
    for attempt in range(200):
        child = subprocess.Popen([sys.executable, "-c", COPIER, str(tmp_path)],
                                 stdout=subprocess.PIPE, text=True)
        first = ""
        if kills < 20:
            if rng.random() < 0.25:           # anywhere: opening, init, the first txn
                time.sleep(rng.uniform(0.05, 0.4))
            else:              # mid-stream: after a few commits, inside a transaction
                for _ in range(rng.randint(1, 4)):
                    line = child.stdout.readline()
                    first += line
                    if line.strip() != "committed":
                        break
                time.sleep(rng.uniform(0.0, 0.005))
            if child.poll() is None:
                child.send_signal(signal.SIGKILL)
                kills += 1
        out, _ = child.communicate(timeout=60)
        out = first + out
        if "done" in out:
            break
        killed_mid_stream += child.returncode == -signal.SIGKILL and "committed" in out
    assert kills >= 10, "the copier finished before it could be killed often"
    assert killed_mid_stream >= 5, "the kills all came before the copier began"
    assert time.monotonic() - started < 60
    with logkit.Broker(tmp_path) as broker:
        copied = [v for n in range(3) for v in values(broker.topic("out").partition(n))]
        assert sorted(copied) == sorted(b"RECORD-%04d" % i for i in range(INPUT_RECORDS))
        assert broker.group("copy").committed() == {
            TP("in", n): broker.topic("in").partition(n).high_watermark for n in range(2)}


def test_a_failed_send_makes_the_commit_raise_and_the_abort_recover(broker):
    broker.create_topic("small", 1, config={"max.message.bytes": 1024})
    producer = broker.producer(transactional_id="copier")
    producer.init_transactions()
    producer.begin_transaction()
    producer.send("small", b"fits")
    too_big = producer.send("small", b"x" * 4000)        # refused by the topic
    with pytest.raises(logkit.RecordTooLargeError):
        too_big.result(timeout=10)
    with pytest.raises(logkit.TransactionAbortedError) as caught:
        producer.commit_transaction()
    assert isinstance(caught.value.__cause__, logkit.RecordTooLargeError)
    with pytest.raises(logkit.InvalidTxnStateError):
        producer.send("small", b"more")                  # only the abort is allowed now
    producer.abort_transaction()
    with producer.transaction():
        producer.send("small", b"next")
    assert values(broker.topic("small").partition(0)) == [b"next"]
    producer.close()


def test_the_cli_consumes_with_either_isolation_level(tmp_path, capsys):
    from logkit import cli
    with logkit.Broker(tmp_path) as broker:
        broker.create_topic("out", 1)
        producer = broker.producer(transactional_id="copier")
        producer.init_transactions()
        with producer.transaction():
            producer.send("out", b"committed")
        producer.begin_transaction()
        producer.send("out", b"aborted")
        producer.abort_transaction()
        producer.begin_transaction()
        producer.send("out", b"open")
        producer.flush()
        for level, expected in (("read_committed", "committed\n"),
                                ("read_uncommitted", "committed\naborted\nopen\n")):
            code = cli.main(["consume", str(tmp_path), "out", "--from-beginning",
                             "--isolation-level", level, "--timeout-ms", "500"])
            assert (code, capsys.readouterr().out) == (0, expected)
        producer.abort_transaction()
        producer.close()


def test_a_group_member_sends_its_offsets_with_its_group_metadata(broker):
    plain = broker.producer()
    for i in range(4):
        plain.send("in", b"%d" % i).result(timeout=10)
    consumer = broker.consumer("in", group_id="g", isolation_level=COMMITTED,
                               auto_offset_reset="earliest", enable_auto_commit=False)
    records = []
    wait_for(lambda: records.extend(consumer.poll(timeout_ms=100)) or len(records) == 4,
             what="the member's records")
    metadata = consumer.group_metadata()
    assert (metadata.group_id, metadata.generation_id >= 1, bool(metadata.member_id)) == \
        ("g", True, True)
    producer = broker.producer(transactional_id="copier")
    producer.init_transactions()
    with producer.transaction():
        for r in records:
            producer.send("out", r.value, partition=0)
        producer.send_offsets_to_transaction(
            {tp: consumer.position(tp) for tp in consumer.assignment()}, metadata)
    group = broker.group("g")
    assert group.committed() == {TP("in", 0): 4}
    assert group.lag() == {TP("in", 0): 0}            # a live member reads committed
    assert consumer.committed(TP("in", 0)) == 4
    for client in (consumer, producer, plain):
        client.close()


def test_sends_racing_a_commit_join_the_transaction_or_are_refused(broker):
    import threading
    producer = broker.producer(transactional_id="copier")
    producer.init_transactions()
    producer.begin_transaction()
    futures, refused = [], []

    def sender():
        key = 0
        while True:
            try:
                futures.append(producer.send("out", b"%d" % key, key=b"%d" % key))
            except logkit.InvalidTxnStateError as exc:
                refused.append(exc)
                return
            key += 1

    thread = threading.Thread(target=sender)
    thread.start()
    wait_for(lambda: len(futures) > 2000, what="the sender thread's records")
    producer.commit_transaction()
    thread.join(timeout=30)
    assert refused and not thread.is_alive()
    stored = [f.result(timeout=10) for f in futures]       # every accepted send stored
    for n in range(2):
        p = broker.topic("out").partition(n)
        assert p.last_stable_offset == p.high_watermark   # nothing left open
    committed = [v for n in range(2) for v in values(broker.topic("out").partition(n))]
    assert len(committed) == len(stored)
    producer.close()


def test_a_zombie_write_to_a_partition_the_fence_did_not_mark_leaves_nothing_open(broker):
    zombie = broker.producer(transactional_id="copier")
    zombie.init_transactions()
    zombie.begin_transaction()
    zombie.send("out", b"zombie", partition=0).result(timeout=10)   # "out" joined whole
    successor = broker.producer(transactional_id="copier")
    successor.init_transactions()        # its ABORT marker lands on partition 0 only
    future = zombie.send("out", b"late", partition=1)        # registered, never marked
    with pytest.raises(logkit.ProducerFencedError):
        future.result(timeout=10)
    for n in range(2):
        p = broker.topic("out").partition(n)
        assert p.last_stable_offset == p.high_watermark       # nothing left open
        assert values(p) == []
    with successor.transaction():
        successor.send("out", b"ok", partition=1)
    assert values(broker.topic("out").partition(1)) == [b"ok"]
    zombie.close()
    successor.close()


WRITER = textwrap.dedent("""
    import sys, logkit
    name = sys.argv[2]
    with logkit.Broker(sys.argv[1]) as broker:
        producer = broker.producer(transactional_id=name)
        producer.init_transactions()
        for t in range(15):
            producer.begin_transaction()
            for n in range(6):
                producer.send("out", b"%s:%d:%d" % (name.encode(), t, n), partition=n % 2)
            if t % 3 == 2:
                producer.abort_transaction()
            else:
                producer.commit_transaction()
        producer.close()
""")


def test_transactions_of_several_processes_interleave_on_shared_partitions(tmp_path):
    with logkit.Broker(tmp_path) as broker:
        broker.create_topic("out", 2)
    writers = [subprocess.Popen([sys.executable, "-c", WRITER, str(tmp_path), f"w{i}"])
               for i in range(3)]
    for writer in writers:
        assert writer.wait(timeout=60) == 0
    with logkit.Broker(tmp_path) as broker:
        got = sorted(v for n in range(2) for v in values(broker.topic("out").partition(n)))
        assert got == sorted(b"w%d:%d:%d" % (i, t, n) for i in range(3) for t in range(15)
                             if t % 3 != 2 for n in range(6))
        for n in range(2):
            p = broker.topic("out").partition(n)
            assert p.last_stable_offset == p.high_watermark
            # every transaction ended with exactly one marker on each partition
            assert p.high_watermark == 3 * 15 * 4
        assert {t.state for t in broker.transaction_coordinator.list_transactions()} <= \
            {"CompleteCommit", "CompleteAbort"}
