"""Growing a topic's partition count (Kafka's `create_partitions`, `kafka-topics --alter
--partitions`): the count only grows, records already stored stay where they are, a
SIGKILL at any point leaves the old count or the new one with every directory in place,
other processes learn the count without reopening, producers map keys by the new count,
group members rebalance onto the new partitions, and Kafka clients grow a topic through
the listener. Real directories, real processes, real LMDB."""

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
from logkit import TopicPartition
from logkit.murmur2 import partition_for_key
from logkit.topic import MAX_PARTITIONS

ROOT_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from tests.helpers.procs import Worker, wait_until  # noqa: E402


def _child(script: str, *args: str, **popen: object) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(script), *args],
                            env={**os.environ, "PYTHONPATH": ROOT_DIR}, text=True,
                            **popen)


def _topic_ids(root, topic: str) -> dict[int, str | None]:
    """partition number -> the topic id its directory's partition.metadata names."""
    from logkit.broker import read_topic_id
    out = {}
    for entry in os.listdir(root):
        name, _, number = entry.rpartition("-")
        if name == topic and number.isdigit():
            out[int(number)] = read_topic_id(os.path.join(root, entry))
    return out


def _every_partition_works(broker, topic: str) -> None:
    """Each partition of the topic takes a record and reads it back."""
    handle = broker.topic(topic)
    for p in handle.partitions:
        end = p.log_end_offset
        offset = p.append([(b"probe", b"after-%d" % p.partition, None, None)])
        assert offset == end
        assert p.read(offset)[0].value == b"after-%d" % p.partition


# ---- step 1: the broker call ------------------------------------------------------------

def test_growing_a_topic_keeps_its_records_and_adds_empty_partitions_of_the_same_topic(
        broker):
    topic = broker.create_topic("orders", 2)
    for n in range(2):
        topic.partition(n).append([(b"k", b"old-%d" % n, None, None)])
    grown = broker.create_partitions("orders", 5)
    assert grown is topic and topic.num_partitions == 5
    assert broker.topic("orders").num_partitions == 5
    for n in range(2):
        assert [r.value for r in topic.partition(n).read(0)] == [b"old-%d" % n]
    for n in range(2, 5):
        p = topic.partition(n)
        assert (p.log_start_offset, p.log_end_offset) == (0, 0)
    assert _topic_ids(broker.path, "orders") == {n: topic.topic_id for n in range(5)}
    _every_partition_works(broker, "orders")
    with logkit.Broker(broker.path, read_only=True) as reader:
        assert reader.topic("orders").num_partitions == 5


def test_a_total_not_above_the_count_or_past_the_limit_is_refused_and_nothing_changes(
        broker):
    broker.create_topic("orders", 3)
    for total in (3, 2):
        with pytest.raises(logkit.ConfigError, match=f"has 3 partition.*got {total}"):
            broker.create_partitions("orders", total)
    for total in (MAX_PARTITIONS + 1, 0, True, "4", None):
        with pytest.raises(logkit.ConfigError, match="partitions must be an integer"):
            broker.create_partitions("orders", total)
    with pytest.raises(logkit.UnknownTopicError):
        broker.create_partitions("missing", 4)
    with pytest.raises(logkit.InvalidTopicError):
        broker.create_partitions("../x", 4)
    assert broker.topic("orders").num_partitions == 3
    assert sorted(_topic_ids(broker.path, "orders")) == [0, 1, 2]


def test_a_read_only_broker_refuses_to_grow_a_topic(tmp_path):
    with logkit.Broker(tmp_path) as broker:
        broker.create_topic("orders", 1)
    with logkit.Broker(tmp_path, read_only=True) as reader:
        with pytest.raises(logkit.ReadOnlyError):
            reader.create_partitions("orders", 2)


def test_keyed_records_map_by_murmur2_mod_the_new_count_after_growth(broker):
    broker.create_topic("orders", 2)
    producer = broker.producer()
    keys = [b"key-%d" % n for n in range(40)]
    before = [producer.send("orders", b"v", key=k) for k in keys]
    producer.flush()
    broker.create_partitions("orders", 7)
    after = [producer.send("orders", b"v", key=k) for k in keys]
    producer.flush()
    assert [f.result().partition for f in before] == [partition_for_key(k, 2) for k in keys]
    assert [f.result().partition for f in after] == [partition_for_key(k, 7) for k in keys]
    assert {f.result().partition for f in after} - {0, 1}     # some keys moved
    assert producer.partitions_for("orders") == set(range(7))
    assert broker.topic("orders").partition_for(b"key-1") == partition_for_key(b"key-1", 7)


def test_a_topic_grown_twice_and_deleted_leaves_no_directory_behind(broker):
    broker.create_topic("orders", 1)
    broker.create_partitions("orders", 2)
    broker.create_partitions("orders", 4)
    broker.delete_topic("orders")
    assert _topic_ids(broker.path, "orders") == {}
    assert broker.create_topic("orders", 1).num_partitions == 1


# ---- step 1: SIGKILL at each point of a growth -------------------------------------------

# A child process grows "orders" from 2 to 5 partitions and SIGKILLs itself at one point:
# after making the k-th new directory (before the commit), inside the transaction after
# the record is put (before the commit), or after the commit, before the doorbell bump.
KILLER = """
    import os, signal, sys
    import logkit, logkit.broker, logkit.group, logkit.notify
    root, point = sys.argv[1], sys.argv[2]

    def die(*_args, **_kwargs):
        os.kill(os.getpid(), signal.SIGKILL)

    if point.startswith("dir-"):
        calls = [0]
        real = logkit.broker.write_topic_id
        def write_then_maybe_die(directory, topic_id):
            real(directory, topic_id)
            calls[0] += 1
            if calls[0] == int(point[4:]):
                die()
        logkit.broker.write_topic_id = write_then_maybe_die
    elif point == "in-transaction":
        logkit.broker.rebalance_subscribers = die     # where the broker calls it
    elif point == "after-commit":
        logkit.notify.Doorbell.metadata_changed = die
    broker = logkit.Broker(root)
    broker.create_partitions("orders", 5)
    print("grown", flush=True)
"""


@pytest.mark.parametrize("point, count", [("dir-1", 2), ("dir-3", 2),
                                          ("in-transaction", 2), ("after-commit", 5)])
def test_a_sigkill_during_growth_leaves_the_old_count_or_the_new_one_whole(tmp_path,
                                                                           point, count):
    with logkit.Broker(tmp_path) as broker:
        topic = broker.create_topic("orders", 2)
        for n in range(2):
            topic.partition(n).append([(b"k", b"old-%d" % n, None, None)])
    child = _child(KILLER, str(tmp_path), point, stdout=subprocess.PIPE)
    out, _ = child.communicate(timeout=60)
    assert child.returncode == -signal.SIGKILL and "grown" not in out
    with logkit.Broker(tmp_path) as broker:
        topic = broker.topic("orders")
        assert topic.num_partitions == count
        ids = _topic_ids(tmp_path, "orders")
        assert all(ids[n] == topic.topic_id for n in range(count))
        for n in range(2):
            assert topic.partition(n).read(0)[0].value == b"old-%d" % n
        _every_partition_works(broker, "orders")
        # the next growth goes through; directories an interrupted one left are
        # moved away, never adopted with whatever they held
        if count < 5:
            broker.create_partitions("orders", 5)
        broker.create_partitions("orders", 6)
        for n in range(2, 6):
            assert topic.partition(n).log_end_offset <= 1     # a probe at most
        assert sorted(_topic_ids(tmp_path, "orders")) == list(range(6))
        _every_partition_works(broker, "orders")


GROWER = """
    import sys
    import logkit
    with logkit.Broker(sys.argv[1]) as broker:
        print("open", flush=True)
        for total in range(2, 200):
            broker.create_partitions("orders", total)
"""


def test_sigkill_at_random_moments_of_repeated_growth_never_leaves_a_counted_partition_missing(
        tmp_path):
    with logkit.Broker(tmp_path) as broker:
        broker.create_topic("orders", 1)
    rng = random.Random(11)
    for _round in range(6):
        child = _child(GROWER, str(tmp_path), stdout=subprocess.PIPE)
        assert child.stdout.readline().strip() == "open"
        time.sleep(rng.uniform(0.0, 0.15))
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
        child.stdout.close()
        with logkit.Broker(tmp_path) as broker:
            topic = broker.topic("orders")
            ids = _topic_ids(tmp_path, "orders")
            assert all(ids.get(n) == topic.topic_id for n in range(topic.num_partitions))
            broker.create_partitions("orders", topic.num_partitions + 1)
            _every_partition_works(broker, "orders")
            # leave it at a count the next child can grow from
            count = topic.num_partitions
        assert count >= 2


# ---- step 1: other processes learn the count without reopening ---------------------------

# A child with the broker open and a producer that has already used the topic sends one
# keyed round per line it reads; it prints the partitions the round went to, the count
# its broker reports for the topic, and where an explicit send to the last partition went.
SENDER = """
    import sys
    import logkit
    with logkit.Broker(sys.argv[1]) as broker:
        producer = broker.producer()
        producer.send("orders", b"warm", key=b"warm").result()
        print("ready", flush=True)
        keys = [b"key-%d" % n for n in range(30)]
        for line in sys.stdin:
            futures = [producer.send("orders", b"v", key=k) for k in keys]
            producer.flush()
            parts = [f.result().partition for f in futures]
            count = broker.topic("orders").num_partitions
            last = producer.send("orders", b"x", partition=count - 1).result().partition
            print(" ".join(map(str, parts)), "|", count, last, flush=True)
"""


def test_a_producer_in_another_process_learns_the_new_count_without_reopening(tmp_path):
    with logkit.Broker(tmp_path) as broker:
        broker.create_topic("orders", 2)
        child = _child(SENDER, str(tmp_path), stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        try:
            assert child.stdout.readline().strip() == "ready"
            keys = [b"key-%d" % n for n in range(30)]

            def round_trip():
                child.stdin.write("go\n")
                child.stdin.flush()
                parts, _, rest = child.stdout.readline().partition("|")
                return [int(p) for p in parts.split()], [int(x) for x in rest.split()]

            parts, (count, last) = round_trip()
            assert parts == [partition_for_key(k, 2) for k in keys] and count == 2
            broker.create_partitions("orders", 6)
            # the first batch after the growth may still be placed by the old count
            # (it tells the producer); the next ones map by the new count
            rounds = [round_trip() for _ in range(3)]
            parts, (count, last) = rounds[-1]
            assert parts == [partition_for_key(k, 6) for k in keys]
            assert (count, last) == (6, 5)
        finally:
            child.stdin.close()
            child.wait(timeout=30)
        assert child.returncode == 0
        keyed_to_5 = sum(parts.count(5) for parts, _ in rounds)
        assert broker.topic("orders").partition(5).log_end_offset == keyed_to_5 + 3


# ---- step 2: consumers --------------------------------------------------------------------

def _drain(consumers, want: int, rounds: int = 200) -> list:
    got: list = []
    for _ in range(rounds):
        for consumer in consumers:
            got += consumer.poll(timeout_ms=10)
        if len(got) >= want:
            break
    return got


def test_group_members_rebalance_onto_new_partitions_and_read_them_from_the_start(broker):
    broker.create_topic("orders", 2)
    members = [broker.consumer("orders", group_id="billing", auto_offset_reset="earliest")
               for _ in range(2)]
    _drain(members, 0, rounds=3)
    generation = broker.group("billing").generation
    assert set().union(*(m.assignment() for m in members)) == {
        TopicPartition("orders", n) for n in range(2)}
    broker.create_partitions("orders", 4)
    assert broker.group("billing").generation == generation + 1
    producer = broker.producer()
    sent = {(n, i) for n in range(4) for i in range(5)}
    for n, i in sorted(sent):
        producer.send("orders", b"%d-%d" % (n, i), partition=n)
    producer.flush()
    got = _drain(members, len(sent))
    assert sorted((r.partition, r.offset) for r in got) == sorted(sent)
    shares = [m.assignment() for m in members]
    assert shares[0].isdisjoint(shares[1]) and len(shares[0]) == len(shares[1]) == 2
    assert set().union(*shares) == {TopicPartition("orders", n) for n in range(4)}
    assert {tp: lag for tp, lag in broker.group("billing").lag().items()
            if tp.partition >= 2} == {TopicPartition("orders", 2): 5,
                                      TopicPartition("orders", 3): 5}


def test_a_new_partition_with_latest_skips_what_was_written_before_its_first_poll(broker):
    """Kafka's rule: a new partition without a commit starts per auto.offset.reset, so
    with "latest" the records written to it between the growth and the member's next
    poll are skipped (why Kafka users often choose "earliest")."""
    broker.create_topic("orders", 1)
    consumer = broker.consumer("orders", group_id="billing", auto_offset_reset="latest")
    assert consumer.poll(timeout_ms=10) == []
    broker.create_partitions("orders", 2)
    producer = broker.producer()
    producer.send("orders", b"early", partition=1).result()
    assert consumer.poll(timeout_ms=10) == []
    assert TopicPartition("orders", 1) in consumer.assignment()
    producer.send("orders", b"late", partition=1).result()
    assert [r.value for r in _drain([consumer], 1)] == [b"late"]


def test_a_manual_assignment_in_another_broker_can_take_a_new_partition_at_once(tmp_path):
    with logkit.Broker(tmp_path) as broker:
        broker.create_topic("orders", 1)
        script = """
            import sys
            import logkit
            with logkit.Broker(sys.argv[1]) as broker:
                assert broker.topic("orders").num_partitions == 1
                print("ready", flush=True)
                sys.stdin.readline()
                consumer = broker.consumer(auto_offset_reset="earliest")
                consumer.assign([logkit.TopicPartition("orders", 2)])
                print([r.value.decode() for r in consumer.poll(timeout_ms=5000)], flush=True)
        """
        child = _child(script, str(tmp_path), stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        assert child.stdout.readline().strip() == "ready"
        broker.create_partitions("orders", 3)
        broker.topic("orders").partition(2).append([(None, b"new", None, None)])
        out, _ = child.communicate("go\n", timeout=60)
        assert child.returncode == 0 and out.strip() == "['new']"


def test_group_members_in_two_processes_take_the_new_partitions_between_them(tmp_path):
    with logkit.Broker(tmp_path) as broker:
        broker.create_topic("orders", 2)
        workers = [Worker(tmp_path, "billing", "orders", "alo") for _ in range(2)]
        try:
            wait_until(lambda: len(broker.group("billing").members()) == 2, 60,
                       "two members")
            broker.create_partitions("orders", 4)
            producer = broker.producer()
            sent = {(n, i) for n in range(4) for i in range(10)}
            for n, i in sorted(sent):
                producer.send("orders", b"v", partition=n)
            producer.flush()
            seen = lambda: {r for w in workers for r in w.records()}  # noqa: E731
            wait_until(lambda: seen() >= sent, 60, "every record, new partitions too")
            assert seen() == sent
            owners = [w for w in workers if any(p >= 2 for p, _ in w.records())]
            assert owners                                # a live member took them
            wait_until(lambda: sum(broker.group("billing").committed().values()) == 40,
                       60, "commits of all four partitions")
        finally:
            for worker in workers:
                worker.stop()


# ---- step 3: the listener -----------------------------------------------------------------

@pytest.fixture
def server(broker):
    with broker.serve() as s:
        yield s


def test_create_partitions_on_the_wire_grows_honours_validate_only_and_refuses_bad_totals(
        broker, server):
    from tests.helpers.raw_kafka import Raw

    from logkit.protocol import errors as E
    from logkit.protocol.handlers import NODE_ID
    broker.create_topic("orders", 2)
    raw = Raw(server)
    try:
        def grow(count, validate_only=False, assignments=None, name="orders"):
            answer = raw.call(37, 3, {"topics": [{"name": name, "count": count,
                                                  "assignments": assignments}],
                                      "timeout_ms": 1000, "validate_only": validate_only})
            return answer["results"][0]["error_code"]

        assert grow(4, validate_only=True) == E.NONE
        assert broker.topic("orders").num_partitions == 2
        assert grow(2) == E.INVALID_PARTITIONS
        assert grow(1, validate_only=True) == E.INVALID_PARTITIONS
        assert grow(MAX_PARTITIONS + 1) == E.INVALID_PARTITIONS
        assert grow(4, assignments=[{"broker_ids": [NODE_ID]}, {"broker_ids": [7]}]) == \
            E.INVALID_REPLICA_ASSIGNMENT
        assert grow(4, name="ghost") == E.UNKNOWN_TOPIC_OR_PARTITION
        assert broker.topic("orders").num_partitions == 2
        assert grow(3, assignments=[{"broker_ids": [NODE_ID]}]) == E.NONE
        assert grow(4) == E.NONE
        assert broker.topic("orders").num_partitions == 4
        metadata = raw.call(3, 12, {"topics": [{"name": "orders", "topic_id": bytes(16)}],
                                    "allow_auto_topic_creation": False,
                                    "include_topic_authorized_operations": False})
        assert [p["partition_index"] for p in metadata["topics"][0]["partitions"]] == \
            [0, 1, 2, 3]
    finally:
        raw.close()


def test_kafka_python_admin_grows_a_topic_and_validate_only_changes_nothing(broker, server):
    kafka = pytest.importorskip("kafka")
    from kafka.admin import NewPartitions
    from kafka.errors import InvalidPartitionsError
    broker.create_topic("kp", 2)
    admin = kafka.KafkaAdminClient(bootstrap_servers=server.bootstrap_servers)
    try:
        admin.create_partitions({"kp": NewPartitions(total_count=5)}, validate_only=True)
        assert broker.topic("kp").num_partitions == 2
        admin.create_partitions({"kp": NewPartitions(total_count=5)})
        assert broker.topic("kp").num_partitions == 5
        with pytest.raises(InvalidPartitionsError):
            admin.create_partitions({"kp": NewPartitions(total_count=3)})
    finally:
        admin.close()
    assert broker.topic("kp").num_partitions == 5


def test_confluent_kafka_grows_a_topic_and_its_clients_use_the_new_partitions(
        broker, server):
    """AdminClient.create_partitions end to end; a producer made before the growth writes
    to a new partition once its metadata shows it, and keyed records follow murmur2 mod
    the new count; a group consumer subscribed before the growth is handed the new
    partitions by its leader's rebalance and reads them from the start (earliest)."""
    ck = pytest.importorskip("confluent_kafka")
    from confluent_kafka.admin import AdminClient, NewPartitions
    broker.create_topic("ck", 2)
    common = {"bootstrap.servers": server.bootstrap_servers,
              "topic.metadata.refresh.interval.ms": 200}
    producer = ck.Producer({**common, "partitioner": "murmur2_random", "linger.ms": 0})
    consumer = ck.Consumer({**common, "group.id": "g", "auto.offset.reset": "earliest",
                            "enable.auto.commit": False})
    consumer.subscribe(["ck"])
    try:
        got = []

        def poll_until(predicate, what):
            for _ in range(240):
                message = consumer.poll(0.25)
                if message is not None:
                    assert message.error() is None, message.error()
                    got.append((message.partition(), message.value()))
                if predicate():
                    return
            raise AssertionError(f"never saw {what}: {got}")

        producer.produce("ck", value=b"before", partition=0)
        assert producer.flush(20) == 0
        poll_until(lambda: (0, b"before") in got, "the first record")

        admin = AdminClient({"bootstrap.servers": server.bootstrap_servers})
        futures = admin.create_partitions([NewPartitions("ck", 4)], validate_only=True)
        assert futures["ck"].result(timeout=20) is None
        assert broker.topic("ck").num_partitions == 2
        futures = admin.create_partitions([NewPartitions("ck", 4)])
        assert futures["ck"].result(timeout=20) is None
        assert broker.topic("ck").num_partitions == 4
        futures = admin.create_partitions([NewPartitions("ck", 3)])
        with pytest.raises(ck.KafkaException, match="INVALID_PARTITIONS"):
            futures["ck"].result(timeout=20)

        assert len(producer.list_topics("ck", timeout=20).topics["ck"].partitions) == 4
        producer.produce("ck", value=b"new", partition=3)
        keys = [b"key-%d" % n for n in range(20)]
        for key in keys:
            producer.produce("ck", key=key, value=b"keyed")
        assert producer.flush(20) == 0
        stored = {(p.partition, r.key) for p in broker.topic("ck").partitions
                  for r in p.read(0, max_records=1000) if r.key is not None}
        assert stored == {(partition_for_key(k, 4), k) for k in keys}
        poll_until(lambda: (3, b"new") in got, "the record in the new partition")
        assert {TopicPartition("ck", n) for n in range(4)} == {
            TopicPartition(tp.topic, tp.partition) for tp in consumer.assignment()}
    finally:
        consumer.close()


# ---- step 4: a follower copies the growth -------------------------------------------------

def test_a_follower_copies_a_topic_grown_on_the_leader_with_its_new_records(tmp_path):
    with logkit.Broker(tmp_path / "leader") as leader:
        topic = leader.create_topic("orders", 2)
        topic.partition(1).append([(b"k", b"old", None, None)])
        source = logkit.DirectorySource(leader.path)
        with logkit.Follower(tmp_path / "f", source) as follower:
            follower.catch_up(timeout=30)
            leader.create_partitions("orders", 4)
            topic.partition(3).append([(b"k", b"new", None, None)])
            follower.catch_up(timeout=30)
            assert follower.log_end_offsets() == {
                TopicPartition("orders", n): (1 if n in (1, 3) else 0) for n in range(4)}
    with logkit.Broker(tmp_path / "f", read_only=True) as copy:
        assert copy.topic("orders").num_partitions == 4
        assert [r.value for r in copy.topic("orders").partition(3).read(0)] == [b"new"]


# ---- step 5: the command line -------------------------------------------------------------

def test_logkit_topics_alter_grows_a_topic_and_refuses_a_smaller_count(tmp_path, capsys):
    from logkit import cli
    with logkit.Broker(tmp_path) as broker:
        broker.create_topic("orders", 2)
    assert cli.main(["topics", "alter", str(tmp_path), "orders", "--partitions", "5"]) == 0
    assert "now has 5 partition(s) (was 2)" in capsys.readouterr().out
    assert cli.main(["topics", "alter", str(tmp_path), "orders", "--partitions", "3"]) == 1
    assert "has 5 partition(s)" in capsys.readouterr().err
    assert cli.main(["topics", "alter", str(tmp_path), "missing", "--partitions", "3"]) == 1
    assert cli.main(["topics", "alter", str(tmp_path), "orders"]) == 2   # no --partitions
    with logkit.Broker(tmp_path, read_only=True) as broker:
        assert broker.topic("orders").num_partitions == 5
