"""DescribeProducers (API 61, KIP-664) on a real socket, our codec on the client side:
each partition asked is answered in order with its producers as the log's producer
state holds them — idempotent and transactional, an open transaction's first offset as
CurrentTxnStartOffset and -1 once it is finished — an empty list for a partition no
producer wrote to, and UNKNOWN_TOPIC_OR_PARTITION for a topic or partition the broker
lacks; a follower's listener answers from its copy. Kafka's own tool against the
same API: tests/kafka/test_kafka_describe_producers.py."""

import time

import pytest

import logkit
from logkit.protocol import errors as E
from logkit.protocol.messages import APIS
from logkit.records import encode_batch
from tests.helpers.raw_kafka import Raw
from tests.helpers.txn_waits import wait_completed


@pytest.fixture
def broker(tmp_path):
    with logkit.Broker(tmp_path / "data", config={"num.partitions": 1}) as b:
        b.create_topic("t", 3)
        yield b


@pytest.fixture
def raw(broker):
    with broker.serve() as server:
        client = Raw(server)
        yield client
        client.close()


def _init(raw, txn_id):
    answer = raw.call(22, 3, {"transactional_id": txn_id, "transaction_timeout_ms": 60000,
                              "producer_id": -1, "producer_epoch": -1})
    assert answer["error_code"] == E.NONE, answer
    return answer["producer_id"], answer["producer_epoch"]


def _produce(raw, txn_id, partition, pid, epoch, sequence, count, *, transactional):
    batch = bytes(encode_batch([(b"k", b"v%d" % i, None, None) for i in range(count)],
                               producer_id=pid, producer_epoch=epoch,
                               base_sequence=sequence, transactional=transactional))
    answer = raw.call(0, 9, {"transactional_id": txn_id, "acks": -1, "timeout_ms": 5000,
                             "topic_data": [{"name": "t", "partition_data": [
                                 {"index": partition, "records": batch}]}]})
    part = answer["responses"][0]["partition_responses"][0]
    assert part["error_code"] == E.NONE, part
    return part["base_offset"]


def _add(raw, txn_id, pid, epoch, partition):
    answer = raw.call(24, 1, {
        "v3_and_below_transactional_id": txn_id, "v3_and_below_producer_id": pid,
        "v3_and_below_producer_epoch": epoch,
        "v3_and_below_topics": [{"name": "t", "partitions": [partition]}]})
    codes = [p["partition_error_code"] for t in answer["results_by_topic_v3_and_below"]
             for p in t["results_by_partition"]]
    assert codes == [E.NONE], answer


def _describe(raw, topics):
    answer = raw.call(61, 0, {"topics": [{"name": n, "partition_indexes": ps}
                                         for n, ps in topics]})
    return [(t["name"], p) for t in answer["topics"] for p in t["partitions"]]


def _rows(partition):
    return [(p["producer_id"], p["producer_epoch"], p["last_sequence"],
             p["current_txn_start_offset"]) for p in partition["active_producers"]]


def test_describe_producers_is_served_at_kafkas_only_version():
    api = APIS[61]
    assert (api.name, api.min_version, api.max_version, api.is_flexible(0)) == (
        "DescribeProducers", 0, 0, True)


def test_api_versions_advertises_describe_producers_v0(raw):
    answer = raw.call(18, 3, {"client_software_name": "t", "client_software_version": "1"})
    ranges = {k["api_key"]: (k["min_version"], k["max_version"]) for k in answer["api_keys"]}
    assert ranges[61] == (0, 0)


def test_idempotent_and_transactional_producers_with_open_and_finished_transactions(
        raw, broker):
    """Partition 0: an idempotent producer (two batches), a transaction still open and
    a committed one; each listed with its epoch, last sequence and the open one's first
    offset, the finished one's -1."""
    started_ms = int(time.time() * 1000)
    idem_pid, idem_epoch = _init(raw, None)
    _produce(raw, None, 0, idem_pid, idem_epoch, 0, 3, transactional=False)
    _produce(raw, None, 0, idem_pid, idem_epoch, 3, 2, transactional=False)

    open_pid, open_epoch = _init(raw, "open")
    _add(raw, "open", open_pid, open_epoch, 0)
    open_first = _produce(raw, "open", 0, open_pid, open_epoch, 0, 4, transactional=True)

    done_pid, done_epoch = _init(raw, "done")
    _add(raw, "done", done_pid, done_epoch, 0)
    _produce(raw, "done", 0, done_pid, done_epoch, 0, 2, transactional=True)
    assert raw.call(26, 1, {"transactional_id": "done", "producer_id": done_pid,
                            "producer_epoch": done_epoch, "committed": True}
                    )["error_code"] == E.NONE
    assert wait_completed(broker, "done") == "CompleteCommit"

    [(name, part)] = _describe(raw, [("t", [0])])
    assert (name, part["partition_index"], part["error_code"], part["error_message"]) == (
        "t", 0, E.NONE, None)
    assert _rows(part) == sorted([
        (idem_pid, idem_epoch, 4, -1),
        (open_pid, open_epoch, 3, open_first),
        (done_pid, done_epoch, 1, -1)])
    assert open_first == 5
    # the last timestamp is the producer's last batch's (a marker's, for the finished
    # one: a marker carries its coordinator's epoch too, here logkit's 0)
    now_ms = int(time.time() * 1000)
    for p in part["active_producers"]:
        assert started_ms <= p["last_timestamp"] <= now_ms, p
    assert {p["producer_id"]: p["coordinator_epoch"] for p in part["active_producers"]} == {
        idem_pid: -1, open_pid: -1, done_pid: 0}


def test_unknown_topics_and_partitions_are_answered_in_the_order_asked(raw):
    """A partition beyond the topic's count, a topic that does not exist and an empty
    partition, in one request: one entry each, in order."""
    answer = _describe(raw, [("t", [7, 2]), ("nope", [0])])
    assert [(n, p["partition_index"], p["error_code"], p["active_producers"])
            for n, p in answer] == [
        ("t", 7, E.UNKNOWN_TOPIC_OR_PARTITION, []),
        ("t", 2, E.NONE, []),
        ("nope", 0, E.UNKNOWN_TOPIC_OR_PARTITION, [])]


def test_an_aborted_transaction_leaves_its_producer_with_no_open_offset(raw, broker):
    pid, epoch = _init(raw, "ab")
    _add(raw, "ab", pid, epoch, 1)
    first = _produce(raw, "ab", 1, pid, epoch, 0, 1, transactional=True)
    [(_, before)] = _describe(raw, [("t", [1])])
    assert _rows(before) == [(pid, epoch, 0, first)]
    assert raw.call(26, 1, {"transactional_id": "ab", "producer_id": pid,
                            "producer_epoch": epoch, "committed": False}
                    )["error_code"] == E.NONE
    assert wait_completed(broker, "ab") == "CompleteAbort"
    [(_, after)] = _describe(raw, [("t", [1])])
    assert _rows(after) == [(pid, epoch, 0, -1)]


def test_a_followers_listener_describes_the_producers_of_its_copy(tmp_path):
    """As any Kafka replica with the log answers from its own producer state, a
    follower's listener answers from its copy: the same producers as the leader's,
    the open transaction's first offset included."""
    with logkit.Broker(tmp_path / "L", config={"broker.id": 1}) as leader, \
            leader.serve() as leader_server:
        leader.create_topic("t", 1)
        with leader.producer(transactional_id="f-open") as producer:
            producer.init_transactions()
            producer.begin_transaction()
            producer.send("t", b"v", key=b"k", partition=0)
            producer.flush()
            follower = logkit.Follower(tmp_path / "F", logkit.DirectorySource(leader.path),
                                       config={"broker.id": 2})
            follower.start()
            try:
                follower.catch_up(timeout=20)
                with follower.serve() as follower_server:
                    theirs, ours = Raw(leader_server), Raw(follower_server)
                    [(_, at_leader)] = _describe(theirs, [("t", [0])])
                    [(_, at_follower)] = _describe(ours, [("t", [0])])
                    theirs.close()
                    ours.close()
            finally:
                follower.stop()
            producer.abort_transaction()
    assert at_leader["error_code"] == at_follower["error_code"] == E.NONE
    assert _rows(at_follower) == _rows(at_leader)
    [(_, epoch, last_sequence, first_offset)] = _rows(at_leader)
    assert (last_sequence, first_offset) == (0, 0)
