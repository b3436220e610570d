"""The transaction APIs on a real socket, request by request (our codec on the client
side, so each answer is checked field by field): InitProducerId with a transactional
id and fencing by epoch, AddPartitionsToTxn (v0-3 and v4's batches and verify_only),
a transactional Produce refused outside its transaction, EndTxn, TxnOffsetCommit with
KIP-447's member checks, OffsetFetch require_stable, Fetch and ListOffsets with
read_committed, FindCoordinator for transactions, List/DescribeTransactions. The
versions used are the ones the clients send: v0 (aiokafka), v1-v3 (librdkafka, the Java
client), v4 (brokers' verification)."""

import itertools

import pytest

import logkit
from logkit.protocol import errors as E
from logkit.records import ATTR_CONTROL, decode_batch, encode_batch, iter_batches
from tests.helpers.raw_kafka import Raw
from tests.helpers.txn_waits import wait_completed

_ids = itertools.count()


@pytest.fixture
def broker(tmp_path):
    with logkit.Broker(tmp_path / "data", config={"num.partitions": 1}) as b:
        b.create_topic("t", 2)
        yield b


@pytest.fixture
def raw(broker):
    with broker.serve() as server:
        client = Raw(server)
        yield client
        client.close()


def _init(raw, txn_id, version=3, timeout_ms=60000):
    return raw.call(22, version, {"transactional_id": txn_id,
                                  "transaction_timeout_ms": timeout_ms,
                                  "producer_id": -1, "producer_epoch": -1})


def _producer(raw):
    txn_id = f"txn-{next(_ids)}"
    answer = _init(raw, txn_id)
    assert answer["error_code"] == E.NONE, answer
    return txn_id, answer["producer_id"], answer["producer_epoch"]


def _add(raw, txn_id, pid, epoch, topics, version=1):
    answer = raw.call(24, version, {
        "v3_and_below_transactional_id": txn_id, "v3_and_below_producer_id": pid,
        "v3_and_below_producer_epoch": epoch,
        "v3_and_below_topics": [{"name": n, "partitions": ps} for n, ps in topics]})
    return {(t["name"], p["partition_index"]): p["partition_error_code"]
            for t in answer["results_by_topic_v3_and_below"]
            for p in t["results_by_partition"]}


def _end(raw, txn_id, pid, epoch, commit, version=1):
    return raw.call(26, version, {"transactional_id": txn_id, "producer_id": pid,
                                  "producer_epoch": epoch, "committed": commit})["error_code"]


def _txn_batch(pid, epoch, sequence, values):
    return bytes(encode_batch([(b"k", v, None, None) for v in values], producer_id=pid,
                              producer_epoch=epoch, base_sequence=sequence,
                              transactional=True))


def _produce(raw, txn_id, partition, records, version=9):
    answer = raw.call(0, version, {
        "transactional_id": txn_id, "acks": -1, "timeout_ms": 5000,
        "topic_data": [{"name": "t", "partition_data": [
            {"index": partition, "records": records}]}]})
    return answer["responses"][0]["partition_responses"][0]


def _fetch(raw, isolation_level, offset=0, partition=0):
    answer = raw.call(1, 11, {
        "max_wait_ms": 0, "min_bytes": 0, "max_bytes": 1 << 20,
        "isolation_level": isolation_level, "session_id": 0, "session_epoch": -1,
        "topics": [{"topic": "t", "partitions": [
            {"partition": partition, "fetch_offset": offset, "log_start_offset": -1,
             "partition_max_bytes": 1 << 20}]}],
        "forgotten_topics_data": [], "rack_id": ""})
    return answer["responses"][0]["partitions"][0]


def _records(data):
    """The data records of fetched bytes (control batches left out, as a client does)."""
    return [r for pos, h in iter_batches(data, 0, len(data), verify=True)
            if not h.attributes & ATTR_CONTROL for r in decode_batch(data, pos, h, "t", 0)]


def _latest(raw, isolation_level):
    answer = raw.call(2, 5, {"replica_id": -1, "isolation_level": isolation_level,
                             "topics": [{"name": "t", "partitions": [
                                 {"partition_index": 0, "timestamp": -1}]}]})
    return answer["topics"][0]["partitions"][0]["offset"]


def _offset_fetch(raw, group, require_stable):
    answer = raw.call(9, 7, {"group_id": group, "require_stable": require_stable,
                             "topics": [{"name": "t", "partition_indexes": [0]}]})
    p = answer["topics"][0]["partitions"][0]
    return p["error_code"], p["committed_offset"]


def _txn_offset_commit(raw, txn_id, pid, epoch, group, offset, version=3, **member):
    body = {"transactional_id": txn_id, "group_id": group, "producer_id": pid,
            "producer_epoch": epoch, "generation_id": -1, "member_id": "",
            "group_instance_id": None,
            "topics": [{"name": "t", "partitions": [
                {"partition_index": 0, "committed_offset": offset,
                 "committed_metadata": "m"}]}]}
    body.update(member)
    answer = raw.call(28, version, body)
    return answer["topics"][0]["partitions"][0]["error_code"]


def test_find_coordinator_answers_this_node_for_a_transactional_id(raw):
    for version in (1, 3):
        answer = raw.call(10, version, {"key": "txn-a", "key_type": 1})
        assert answer["error_code"] == E.NONE and answer["node_id"] >= 0
    answer = raw.call(10, 4, {"key_type": 1, "coordinator_keys": ["a", "b"]})
    assert [(c["key"], c["error_code"]) for c in answer["coordinators"]] == [
        ("a", E.NONE), ("b", E.NONE)]
    answer = raw.call(10, 3, {"key": "s", "key_type": 2})      # share groups: not served
    assert answer["error_code"] == E.INVALID_REQUEST


def test_init_producer_id_bumps_the_epoch_and_the_older_epoch_is_fenced(raw):
    """A second InitProducerId of the same id keeps the producer id and bumps its epoch;
    the older epoch is then PRODUCER_FENCED from the versions that know that code, and
    INVALID_PRODUCER_EPOCH before them (Kafka's rule)."""
    txn_id, pid, epoch = _producer(raw)
    again = _init(raw, txn_id, version=0)
    assert (again["error_code"], again["producer_id"], again["producer_epoch"]) == (
        E.NONE, pid, epoch + 1)
    assert _add(raw, txn_id, pid, epoch, [("t", [0])], version=2) == {
        ("t", 0): E.PRODUCER_FENCED}
    assert _add(raw, txn_id, pid, epoch, [("t", [0])], version=0) == {
        ("t", 0): E.INVALID_PRODUCER_EPOCH}
    assert _end(raw, txn_id, pid, epoch, True, version=3) == E.PRODUCER_FENCED
    assert _end(raw, txn_id, pid, epoch + 1, True) == E.INVALID_TXN_STATE   # none begun


def test_init_producer_id_refuses_a_bad_timeout_and_an_empty_id(raw):
    assert _init(raw, "txn-x", timeout_ms=0)["error_code"] == E.INVALID_TRANSACTION_TIMEOUT
    assert _init(raw, "")["error_code"] == E.INVALID_REQUEST
    idempotent = _init(raw, None, version=4)
    assert idempotent["error_code"] == E.NONE and idempotent["producer_epoch"] == 0


def test_an_unknown_transactional_id_is_an_invalid_mapping(raw):
    assert _add(raw, "never-initialised", 7, 0, [("t", [0])]) == {
        ("t", 0): E.INVALID_PRODUCER_ID_MAPPING}
    assert raw.call(25, 0, {"transactional_id": "never-initialised", "producer_id": 7,
                            "producer_epoch": 0, "group_id": "g"})["error_code"] == \
        E.INVALID_PRODUCER_ID_MAPPING


def test_add_partitions_with_an_unknown_topic_adds_nothing(raw, broker):
    """Kafka's order: the unknown topic's partitions are UNKNOWN_TOPIC_OR_PARTITION, the
    others OPERATION_NOT_ATTEMPTED, and the transaction holds none of them."""
    txn_id, pid, epoch = _producer(raw)
    assert _add(raw, txn_id, pid, epoch, [("t", [0, 5]), ("missing", [0])]) == {
        ("t", 0): E.OPERATION_NOT_ATTEMPTED, ("t", 5): E.UNKNOWN_TOPIC_OR_PARTITION,
        ("missing", 0): E.UNKNOWN_TOPIC_OR_PARTITION}
    described = broker.transaction_coordinator.describe_transactions([txn_id])[0]
    assert described.partitions == [] and described.state == "Empty"


def test_a_transactional_batch_outside_its_transaction_is_refused_and_not_written(raw,
                                                                                   broker):
    txn_id, pid, epoch = _producer(raw)
    refused = _produce(raw, txn_id, 0, _txn_batch(pid, epoch, 0, [b"a"]))
    assert refused["error_code"] == E.INVALID_TXN_STATE
    assert _add(raw, txn_id, pid, epoch, [("t", [0])]) == {("t", 0): E.NONE}
    # added to partition 0 only: partition 1 still refuses
    assert _produce(raw, txn_id, 1, _txn_batch(pid, epoch, 0, [b"b"]))["error_code"] == \
        E.INVALID_TXN_STATE
    assert _produce(raw, txn_id, 0, _txn_batch(pid, epoch, 0, [b"c"]))["error_code"] == \
        E.NONE
    assert [p.log_end_offset for p in broker.topic("t").partitions] == [1, 0]


def test_v4_verifies_partitions_of_several_transactions_without_adding(raw, broker):
    """AddPartitionsToTxn v4 (what brokers send): per transaction, per partition; with
    verify_only, NONE for a partition in the producer's open transaction and
    INVALID_TXN_STATE for one that is not, and nothing is added."""
    first, pid1, epoch1 = _producer(raw)
    second, pid2, epoch2 = _producer(raw)
    assert _add(raw, first, pid1, epoch1, [("t", [0])]) == {("t", 0): E.NONE}
    answer = raw.call(24, 4, {"transactions": [
        {"transactional_id": first, "producer_id": pid1, "producer_epoch": epoch1,
         "verify_only": True, "topics": [{"name": "t", "partitions": [0, 1]}]},
        {"transactional_id": second, "producer_id": pid2, "producer_epoch": epoch2,
         "verify_only": True, "topics": [{"name": "t", "partitions": [0]}]}]})
    assert answer["error_code"] == E.NONE
    codes = {(r["transactional_id"], p["partition_index"]): p["partition_error_code"]
             for r in answer["results_by_transaction"] for t in r["topic_results"]
             for p in t["results_by_partition"]}
    assert codes == {(first, 0): E.NONE, (first, 1): E.INVALID_TXN_STATE,
                     (second, 0): E.INVALID_TXN_STATE}
    coordinator = broker.transaction_coordinator
    assert coordinator.describe_transactions([second])[0].partitions == []
    # v4 without verify_only adds, as v0-3 do
    answer = raw.call(24, 4, {"transactions": [
        {"transactional_id": second, "producer_id": pid2, "producer_epoch": epoch2,
         "verify_only": False, "topics": [{"name": "t", "partitions": [1]}]}]})
    assert answer["results_by_transaction"][0]["topic_results"][0][
        "results_by_partition"][0]["partition_error_code"] == E.NONE
    assert coordinator.describe_transactions([second])[0].partitions == [
        logkit.TopicPartition("t", 1)]


def test_list_and_describe_transactions_use_kafkas_state_names(raw):
    txn_id, pid, epoch = _producer(raw)
    assert _add(raw, txn_id, pid, epoch, [("t", [1, 0])]) == {("t", 0): 0, ("t", 1): 0}
    idle, _, _ = _producer(raw)
    listed = raw.call(66, 0, {"state_filters": ["Ongoing", "Bogus"],
                              "producer_id_filters": []})
    assert listed["error_code"] == E.NONE
    assert listed["unknown_state_filters"] == ["Bogus"]
    assert [(x["transactional_id"], x["producer_id"], x["transaction_state"])
            for x in listed["transaction_states"]] == [(txn_id, pid, "Ongoing")]
    everything = raw.call(66, 1, {"state_filters": [], "producer_id_filters": [],
                                  "duration_filter": -1})
    assert {x["transactional_id"]: x["transaction_state"]
            for x in everything["transaction_states"]} == {txn_id: "Ongoing", idle: "Empty"}
    # a duration no transaction has lasted yet: none listed
    recent = raw.call(66, 1, {"state_filters": [], "producer_id_filters": [],
                              "duration_filter": 3_600_000})
    assert recent["transaction_states"] == []
    described = raw.call(65, 0, {"transactional_ids": [txn_id, "nobody"]})
    ours, unknown = described["transaction_states"]
    assert (ours["error_code"], ours["transaction_state"], ours["producer_id"],
            ours["producer_epoch"], ours["transaction_timeout_ms"]) == (
        E.NONE, "Ongoing", pid, epoch, 60000)
    assert ours["transaction_start_time_ms"] > 0
    assert ours["topics"] == [{"topic": "t", "partitions": [0, 1]}]
    assert (unknown["transactional_id"], unknown["error_code"]) == (
        "nobody", E.TRANSACTIONAL_ID_NOT_FOUND)


def test_txn_offset_commit_is_pending_until_the_commit_and_dropped_by_an_abort(raw,
                                                                              broker):
    """Offsets sent in a transaction: OffsetFetch with require_stable answers
    UNSTABLE_OFFSET_COMMIT while it is open; the commit makes them the group's, an
    abort drops them. The transaction APIs at v0, as aiokafka sends them."""
    txn_id, pid, epoch = _producer(raw)
    for commit, offset in ((True, 5), (False, 9)):
        assert raw.call(25, 0, {"transactional_id": txn_id, "producer_id": pid,
                                "producer_epoch": epoch, "group_id": "g"})["error_code"] == 0
        assert _txn_offset_commit(raw, txn_id, pid, epoch, "g", offset, version=0) == 0
        assert _offset_fetch(raw, "g", require_stable=True) == (
            E.UNSTABLE_OFFSET_COMMIT, -1)
        before = 5 if not commit else -1
        assert _offset_fetch(raw, "g", require_stable=False) == (E.NONE, before)
        assert _end(raw, txn_id, pid, epoch, commit, version=0) == E.NONE
        wait_completed(broker, txn_id)        # EndTxn answers before the offsets move
        assert _offset_fetch(raw, "g", require_stable=True) == (E.NONE, 5)


def test_txn_offset_commit_checks_the_member_and_generation_of_a_wire_group(raw):
    """KIP-447: a member id the group does not hold is UNKNOWN_MEMBER_ID, a generation
    not the group's ILLEGAL_GENERATION; the member's own pass."""
    joined = raw.call(11, 3, {"group_id": "g", "session_timeout_ms": 30000,
                              "rebalance_timeout_ms": 30000, "member_id": "",
                              "protocol_type": "consumer",
                              "protocols": [{"name": "range", "metadata": b""}]})
    assert joined["error_code"] == E.NONE
    member, generation = joined["member_id"], joined["generation_id"]
    synced = raw.call(14, 3, {"group_id": "g", "generation_id": generation,
                              "member_id": member, "group_instance_id": None,
                              "assignments": [{"member_id": member, "assignment": b""}]})
    assert synced["error_code"] == E.NONE
    txn_id, pid, epoch = _producer(raw)
    assert raw.call(25, 3, {"transactional_id": txn_id, "producer_id": pid,
                            "producer_epoch": epoch, "group_id": "g"})["error_code"] == 0
    assert _txn_offset_commit(raw, txn_id, pid, epoch, "g", 1, member_id="stranger",
                              generation_id=generation) == E.UNKNOWN_MEMBER_ID
    assert _txn_offset_commit(raw, txn_id, pid, epoch, "g", 1, member_id=member,
                              generation_id=generation + 1) == E.ILLEGAL_GENERATION
    assert _txn_offset_commit(raw, txn_id, pid, epoch, "g", 1, member_id=member,
                              generation_id=generation) == E.NONE


def test_read_committed_fetch_stops_at_the_lso_and_lists_aborted_transactions(raw, broker):
    """An open transaction holds the last stable offset at its first offset: a
    read_committed Fetch returns nothing past it and ListOffsets latest answers it; an
    aborted transaction is listed (producer id, first offset) for the client to drop;
    after the commit everything is stable."""
    partition = broker.topic("t").partition(0)
    txn_id, pid, epoch = _producer(raw)
    assert _add(raw, txn_id, pid, epoch, [("t", [0])]) == {("t", 0): E.NONE}
    assert _produce(raw, txn_id, 0, _txn_batch(pid, epoch, 0, [b"a1", b"a2"]))[
        "error_code"] == E.NONE
    assert _end(raw, txn_id, pid, epoch, False) == E.NONE       # aborted: offsets 0-1, 2
    wait_completed(broker, txn_id)

    assert _add(raw, txn_id, pid, epoch, [("t", [0])]) == {("t", 0): E.NONE}
    assert _produce(raw, txn_id, 0, _txn_batch(pid, epoch, 2, [b"c1"]))["error_code"] == 0
    open_part = _fetch(raw, 1)
    assert open_part["high_watermark"] == 4 and open_part["last_stable_offset"] == 3
    assert _latest(raw, 1) == 3 and _latest(raw, 0) == 4
    assert open_part["aborted_transactions"] == [{"producer_id": pid, "first_offset": 0}]
    # the aborted batch and its marker; the client drops the batch by the list above
    assert [r.offset for r in _records(open_part["records"])] == [0, 1]
    uncommitted = _fetch(raw, 0)
    assert uncommitted["aborted_transactions"] is None
    assert uncommitted["last_stable_offset"] == 3

    assert _end(raw, txn_id, pid, epoch, True) == E.NONE           # marker at 4
    wait_completed(broker, txn_id)
    done = _fetch(raw, 1, offset=3)
    assert done["last_stable_offset"] == done["high_watermark"] == 5
    assert done["aborted_transactions"] == []
    assert [r.value for r in _records(done["records"])] == [b"c1"]
    assert _latest(raw, 1) == 5 == partition.last_stable_offset


def test_two_listeners_over_one_directory_share_each_producers_sequence(tmp_path):
    """The duplicate and sequence checks are the log's (its producer state, caught up
    on every process's appends), not a listener's memory: a producer whose batches
    alternate between two listeners over one directory is neither refused nor
    written twice."""
    def batch(sequence, value):
        return bytes(encode_batch([(b"k", value, None, None)], producer_id=pid,
                                  producer_epoch=0, base_sequence=sequence))

    with logkit.Broker(tmp_path / "data") as one, one.serve() as s1, \
            logkit.Broker(tmp_path / "data") as two, two.serve() as s2:
        one.create_topic("t", 1)
        a, b = Raw(s1), Raw(s2)
        pid = _init(a, None, version=4)["producer_id"]
        answers = [(_produce(a, None, 0, batch(0, b"0")), 0),
                   (_produce(b, None, 0, batch(1, b"1")), 1),
                   (_produce(a, None, 0, batch(2, b"2")), 2),
                   (_produce(b, None, 0, batch(2, b"2")), 2),       # a retry, elsewhere
                   (_produce(a, None, 0, batch(1, b"1")), 1)]
        assert [(r["error_code"], r["base_offset"]) for r, _ in answers] == [
            (E.NONE, offset) for _, offset in answers]
        assert _produce(b, None, 0, batch(5, b"5"))["error_code"] == \
            E.OUT_OF_ORDER_SEQUENCE_NUMBER
        assert one.topic("t").partition(0).log_end_offset == 3
        a.close()
        b.close()


def test_a_finished_or_fenced_transaction_takes_no_more_batches(raw, broker):
    """A partition holding the producer's open transaction takes its next batches
    without asking the coordinator again; once the transaction ends (a commit, or the
    abort a new producer's InitProducerId makes) a batch is verified afresh: without
    AddPartitionsToTxn INVALID_TXN_STATE, from the fenced epoch INVALID_PRODUCER_EPOCH,
    and nothing of either is written."""
    partition = broker.topic("t").partition(0)
    txn_id, pid, epoch = _producer(raw)
    assert _add(raw, txn_id, pid, epoch, [("t", [0])]) == {("t", 0): E.NONE}
    for sequence in range(3):
        assert _produce(raw, txn_id, 0, _txn_batch(pid, epoch, sequence, [b"x"]))[
            "error_code"] == E.NONE
    assert _end(raw, txn_id, pid, epoch, True) == E.NONE
    wait_completed(broker, txn_id)
    end = partition.log_end_offset
    assert _produce(raw, txn_id, 0, _txn_batch(pid, epoch, 3, [b"late"]))[
        "error_code"] == E.INVALID_TXN_STATE
    assert _add(raw, txn_id, pid, epoch, [("t", [0])]) == {("t", 0): E.NONE}
    assert _produce(raw, txn_id, 0, _txn_batch(pid, epoch, 3, [b"open"]))[
        "error_code"] == E.NONE
    assert _init(raw, txn_id)["producer_epoch"] > epoch        # fences, aborts "open"
    zombie = _produce(raw, txn_id, 0, _txn_batch(pid, epoch, 4, [b"zombie"]))
    assert zombie["error_code"] == E.INVALID_PRODUCER_EPOCH
    assert partition.log_end_offset == end + 2                  # "open" and its ABORT
    assert [r.value for r in partition.read(0, isolation_level="read_committed")] == [
        b"x", b"x", b"x"]


def test_a_followers_listener_sends_transactional_producers_to_the_leader(tmp_path):
    """The coordinator's store is the leader's: a follower's listener answers the
    transaction APIs NOT_COORDINATOR (the client asks FindCoordinator again, which
    names the leader) and hands an idempotent producer an id of its own range."""
    with logkit.Broker(tmp_path / "L", config={"broker.id": 1}) as leader, \
            leader.serve() as leader_server:
        leader.create_topic("t", 1)
        follower = logkit.Follower(tmp_path / "F", logkit.DirectorySource(leader.path),
                                   config={"broker.id": 2})
        follower.start()
        try:
            follower.catch_up(timeout=20)
            with follower.serve() as follower_server:
                raw = Raw(follower_server)
                assert _init(raw, "txn-f")["error_code"] == E.NOT_COORDINATOR
                assert _add(raw, "txn-f", 0, 0, [("t", [0])]) == {
                    ("t", 0): E.NOT_COORDINATOR}
                assert _end(raw, "txn-f", 0, 0, True) == E.NOT_COORDINATOR
                listed = raw.call(66, 0, {"state_filters": [], "producer_id_filters": []})
                assert listed["error_code"] == E.NOT_COORDINATOR
                idempotent = _init(raw, None, version=4)
                assert idempotent["error_code"] == E.NONE
                assert idempotent["producer_id"] > 1 << 40     # the clock's range
                found = raw.call(10, 3, {"key": "txn-f", "key_type": 1})
                assert found["error_code"] in (E.NONE, E.COORDINATOR_NOT_AVAILABLE)
                if found["error_code"] == E.NONE:
                    assert found["port"] == leader_server.port
                raw.close()
        finally:
            follower.stop()


def test_txn_offset_commit_refuses_metadata_above_the_limit_per_partition(raw, broker):
    txn_id, pid, epoch = _producer(raw)
    assert raw.call(25, 3, {"transactional_id": txn_id, "producer_id": pid,
                            "producer_epoch": epoch, "group_id": "g"})["error_code"] == 0
    most = broker.config["offset.metadata.max.bytes"]
    answer = raw.call(28, 3, {
        "transactional_id": txn_id, "group_id": "g", "producer_id": pid,
        "producer_epoch": epoch, "generation_id": -1, "member_id": "",
        "group_instance_id": None, "topics": [{"name": "t", "partitions": [
            {"partition_index": 0, "committed_offset": 1,
             "committed_metadata": "x" * (most + 1)},
            {"partition_index": 1, "committed_offset": 2, "committed_metadata": "ok"}]}]})
    assert [p["error_code"] for p in answer["topics"][0]["partitions"]] == [
        E.OFFSET_METADATA_TOO_LARGE, E.NONE]
    assert _end(raw, txn_id, pid, epoch, True) == E.NONE
    wait_completed(broker, txn_id)
    committed = broker.group("g").committed()
    assert committed == {logkit.TopicPartition("t", 1): 2}


def test_txn_offset_commit_from_a_stranger_to_an_embedded_group_is_refused(raw, broker):
    """A group of embedded consumers is checked by the coordinator (KIP-447): a member
    id it does not hold is refused, ILLEGAL_GENERATION, and nothing is pending."""
    consumer = broker.consumer("t", group_id="embedded")
    try:
        consumer.poll(timeout_ms=100)
        assert broker.group("embedded").members()
        txn_id, pid, epoch = _producer(raw)
        assert raw.call(25, 3, {"transactional_id": txn_id, "producer_id": pid,
                                "producer_epoch": epoch,
                                "group_id": "embedded"})["error_code"] == 0
        assert _txn_offset_commit(raw, txn_id, pid, epoch, "embedded", 1,
                                  member_id="stranger", generation_id=1) == \
            E.ILLEGAL_GENERATION
        assert not broker.transaction_coordinator.pending_offset_partitions("embedded")
    finally:
        consumer.close()
