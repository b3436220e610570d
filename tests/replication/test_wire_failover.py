"""Replication on the wire (docs/kafka-protocol.md "Replicas on the wire",
docs/replication.md "Real Kafka clients across a failover"): Metadata names the
replicas, the ISR, the leader and its epoch; a follower's listener sends clients to the
leader (NOT_LEADER_OR_FOLLOWER, NOT_COORDINATOR) until it is promoted, then answers as
the leader with the new epoch while a fenced old leader's listener refuses; acks=-1
follows the leader's acks="all" rules; CreateTopics passes the replication factor; and
real confluent-kafka clients follow a SIGKILLed leader to the promoted follower
without losing an acknowledged record or skipping a committed position.

Run as a script, this file is the replica processes of the failover test:
`python tests/replication/test_wire_failover.py leader ROOT` / `follower ROOT LEADER_ROOT`."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

FAST = {"broker.session.timeout.ms": 1000}
TOPIC = "orders"


def _replica_main(role: str, root: str, leader_root: str | None = None) -> None:
    """A replica process: prints its listener's port, serves until stdin closes."""
    import logkit
    if role == "leader":
        broker = logkit.Broker(root, config={**FAST, "broker.id": 1})
        broker.create_topic(TOPIC, 1, replication_factor=2,
                            config={"min.insync.replicas": 1}, exist_ok=True)
        server = broker.serve()
    else:
        follower = logkit.Follower(root, logkit.DirectorySource(leader_root),
                                   config={**FAST, "broker.id": 2})
        follower.start()
        server = follower.serve()
    print(server.port, flush=True)
    sys.stdin.read()                                 # until the test closes it
    os._exit(0)


if __name__ == "__main__":
    _replica_main(*sys.argv[1:])

import pytest  # noqa: E402

import logkit  # noqa: E402
from logkit.protocol import errors as E  # noqa: E402
from tests.helpers.procs import ROOT_DIR, wait_until  # noqa: E402
from tests.protocol.test_protocol_listener import Raw, _batch, _produce  # noqa: E402


def _metadata(raw, topic=TOPIC):
    return raw.call(3, 12, {"topics": [{"topic_id": bytes(16), "name": topic}],
                            "allow_auto_topic_creation": False,
                            "include_topic_authorized_operations": False})


def _in_sync(raw, count):
    parts = _metadata(raw)["topics"][0]["partitions"]
    return all(len(p["isr_nodes"]) == count for p in parts)


@pytest.fixture
def pair(tmp_path):
    """A leader Broker (node 1) serving, and a serving Follower (node 2) in its ISR,
    in this process."""
    leader = logkit.Broker(tmp_path / "L", config={**FAST, "broker.id": 1})
    leader_server = leader.serve()
    leader.create_topic(TOPIC, 2, replication_factor=2, config={"min.insync.replicas": 2})
    follower = logkit.Follower(tmp_path / "F", logkit.DirectorySource(leader.path),
                               config={**FAST, "broker.id": 2})
    follower.start()
    follower.catch_up(timeout=20)
    follower_server = follower.serve()
    raw = Raw(leader_server)
    wait_until(lambda: _in_sync(raw, 2) and follower.leader_listener is not None, 20,
               "the follower in the ISR, its listener named")
    yield leader, leader_server, follower, follower_server, raw
    raw.close()
    follower_server.close()
    follower.stop()
    leader.close()


def test_metadata_names_the_replicas_the_isr_the_leader_and_its_epoch(pair):
    leader, leader_server, follower, follower_server, raw = pair
    meta = _metadata(raw)
    assert sorted((b["node_id"], b["port"]) for b in meta["brokers"]) == \
        [(1, leader_server.port), (2, follower_server.port)]
    assert meta["controller_id"] == 1
    for p in meta["topics"][0]["partitions"]:
        assert (p["leader_id"], p["leader_epoch"]) == (1, 0)
        assert p["replica_nodes"] == [1, 2] and p["isr_nodes"] == [1, 2]


def test_a_followers_listener_sends_clients_to_the_leader(pair):
    leader, leader_server, follower, follower_server, raw = pair
    other = Raw(follower_server)
    try:
        meta = _metadata(other)
        assert meta["cluster_id"] == _metadata(raw)["cluster_id"]
        assert meta["controller_id"] == 1
        topic = meta["topics"][0]
        assert topic["topic_id"] == _metadata(raw)["topics"][0]["topic_id"]
        assert [(p["leader_id"], p["replica_nodes"]) for p in topic["partitions"]] == \
            [(1, [1, 2])] * 2
        assert _produce(other, TOPIC, 0, _batch([b"x"]))["error_code"] == \
            E.NOT_LEADER_OR_FOLLOWER
        fetched = other.call(1, 11, {
            "replica_id": -1, "max_wait_ms": 0, "min_bytes": 0, "max_bytes": 1 << 20,
            "isolation_level": 0, "session_id": 0, "session_epoch": -1,
            "topics": [{"topic": TOPIC, "partitions": [
                {"partition": 0, "current_leader_epoch": 0, "fetch_offset": 0,
                 "log_start_offset": -1, "partition_max_bytes": 1 << 20}]}],
            "forgotten_topics_data": [], "rack_id": ""})
        assert fetched["responses"][0]["partitions"][0]["error_code"] == \
            E.NOT_LEADER_OR_FOLLOWER
        coordinator = other.call(10, 3, {"key": "g", "key_type": 0})
        assert (coordinator["error_code"], coordinator["node_id"],
                coordinator["port"]) == (0, 1, leader_server.port)
        assert other.call(12, 3, {"group_id": "g", "generation_id": 1, "member_id": "m",
                                  "group_instance_id": None})["error_code"] == \
            E.NOT_COORDINATOR
        created = other.call(19, 5, {"topics": [
            {"name": "x", "num_partitions": 1, "replication_factor": 1, "assignments": [],
             "configs": []}], "timeout_ms": 1000, "validate_only": False})
        assert created["topics"][0]["error_code"] == E.NOT_CONTROLLER
        assert "x" not in leader.topics()
    finally:
        other.close()


def test_acks_all_follows_the_leaders_rules_on_a_replicated_topic(pair):
    leader, leader_server, follower, follower_server, raw = pair
    answer = _produce(raw, TOPIC, 0, _batch([b"a", b"b"]))
    assert (answer["error_code"], answer["base_offset"]) == (0, 0)
    assert leader.topic(TOPIC).partition(0).high_watermark == 2   # the follower holds it
    # an ISR (at most 2) below min.insync.replicas (3): refused, nothing written
    leader.create_topic("strict", 1, replication_factor=2,
                        config={"min.insync.replicas": 3})
    refused = _produce(raw, "strict", 0, _batch([b"c"]))
    assert refused["error_code"] == E.NOT_ENOUGH_REPLICAS
    assert leader.topic("strict").partition(0).log_end_offset == 0
    # the follower stopped (still in the ISR for replica.lag.time.max.ms): no ack
    # within the request's timeout; the record stays in the leader's log, as Kafka's
    follower.stop()
    late = raw.call(0, 9, {"transactional_id": None, "acks": -1, "timeout_ms": 300,
                           "topic_data": [{"name": TOPIC, "partition_data": [
                               {"index": 0, "records": _batch([b"d"])}]}]})
    assert late["responses"][0]["partition_responses"][0]["error_code"] == \
        E.REQUEST_TIMED_OUT
    assert leader.topic(TOPIC).partition(0).log_end_offset == 3
    assert leader.topic(TOPIC).partition(0).high_watermark == 2


def test_a_promoted_followers_listener_leads_with_the_next_epoch(tmp_path, pair):
    leader, leader_server, follower, follower_server, raw = pair
    assert _produce(raw, TOPIC, 0, _batch([b"a"]))["error_code"] == 0
    follower.catch_up(timeout=20)
    leader.close()                          # releases the lease: promote() may take it
    follower.promote()
    other = Raw(follower_server)
    try:
        meta = _metadata(other)
        assert meta["controller_id"] == 2
        for p in meta["topics"][0]["partitions"]:
            assert (p["leader_id"], p["leader_epoch"]) == (2, 1)
        # alone, it cannot meet min.insync.replicas=2 (Kafka's answer too); acks=1 goes
        assert _produce(other, TOPIC, 0, _batch([b"b"]))["error_code"] == \
            E.NOT_ENOUGH_REPLICAS
        answer = _produce(other, TOPIC, 0, _batch([b"b"]), acks=1)
        assert (answer["error_code"], answer["base_offset"]) == (0, 1)
    finally:
        other.close()
    # the old leader reopened and serving: fenced, it sends clients away
    with logkit.Broker(tmp_path / "L", config={**FAST, "broker.id": 1}) as old, \
            old.serve() as old_server:
        stale = Raw(old_server)
        try:
            assert _produce(stale, TOPIC, 0, _batch([b"stale"]))["error_code"] == \
                E.NOT_LEADER_OR_FOLLOWER
            parts = _metadata(stale)["topics"][0]["partitions"]
            assert [p["leader_id"] for p in parts] == [2, 2]   # from its progress report
        finally:
            stale.close()
        assert old.topic(TOPIC).partition(0).log_end_offset == 1


def test_fetch_with_an_older_leader_epoch_is_fenced(pair):
    leader, leader_server, follower, follower_server, raw = pair
    for asked, code in ((0, E.NONE), (1, E.UNKNOWN_LEADER_EPOCH)):
        fetched = raw.call(1, 11, {
            "replica_id": -1, "max_wait_ms": 0, "min_bytes": 0, "max_bytes": 1 << 20,
            "isolation_level": 0, "session_id": 0, "session_epoch": -1,
            "topics": [{"topic": TOPIC, "partitions": [
                {"partition": 0, "current_leader_epoch": asked, "fetch_offset": 0,
                 "log_start_offset": -1, "partition_max_bytes": 1 << 20}]}],
            "forgotten_topics_data": [], "rack_id": ""})
        assert fetched["responses"][0]["partitions"][0]["error_code"] == code


def test_kafka_python_reads_the_replicas_isr_and_leader(pair):
    kafka = pytest.importorskip("kafka")
    leader, leader_server, follower, follower_server, raw = pair
    admin = kafka.KafkaAdminClient(bootstrap_servers=follower_server.bootstrap_servers)
    try:
        described = admin.describe_topics([TOPIC])[0]
        brokers = admin.describe_cluster()["brokers"]
    finally:
        admin.close()
    assert sorted((b["broker_id"], b["port"]) for b in brokers) == \
        [(1, leader_server.port), (2, follower_server.port)]
    for p in described["partitions"]:
        assert (p["leader_id"], p["leader_epoch"]) == (1, 0)
        assert (p["replica_nodes"], p["isr_nodes"]) == ([1, 2], [1, 2])


def test_listeners_are_learned_over_a_tcp_source_too(tmp_path):
    secret = "s3cret"
    with logkit.Broker(tmp_path / "L", config={**FAST, "broker.id": 1}) as leader, \
            leader.serve() as leader_server, \
            leader.serve_replication(secret=secret) as replication:
        leader.create_topic(TOPIC, 1, replication_factor=2)
        source = logkit.TcpSource("127.0.0.1", replication.port, secret=secret)
        with logkit.Follower(tmp_path / "F", source,
                             config={**FAST, "broker.id": 2}) as follower:
            follower.catch_up(timeout=20)
            with follower.serve() as follower_server:
                raw = Raw(leader_server)
                try:
                    # the leader learns the follower's listener from a progress report
                    # sent after serve() started, which may come after the ISR has it
                    wait_until(lambda: _in_sync(raw, 2) and follower.leader_listener
                               is not None and {b["node_id"] for b in
                                                _metadata(raw)["brokers"]} == {1, 2},
                               20, "both listeners known")
                    assert follower.leader_listener.port == leader_server.port
                finally:
                    raw.close()
                other = Raw(follower_server)
                try:
                    meta = _metadata(other)
                    assert meta["topics"][0]["partitions"][0]["leader_id"] == 1
                    assert meta["topics"][0]["topic_id"] == \
                        bytes.fromhex(leader.topic(TOPIC).topic_id)
                finally:
                    other.close()


def test_logkit_follow_serve_runs_a_followers_listener(tmp_path):
    cli = "import sys; from logkit.cli import main; sys.exit(main())"
    with logkit.Broker(tmp_path / "L", config={"broker.id": 1}) as leader, \
            leader.serve() as leader_server:
        leader.create_topic(TOPIC, 1, replication_factor=2)
        proc = subprocess.Popen([sys.executable, "-c", cli, "follow", str(tmp_path / "L"),
                                 str(tmp_path / "F"), "--serve", "127.0.0.1:0",
                                 "--config", "broker.id=7"],
                                stdout=subprocess.PIPE, text=True,
                                env={**os.environ, "PYTHONPATH": ROOT_DIR})
        try:
            line = proc.stdout.readline()
            assert line.startswith("serving Kafka clients on 127.0.0.1:"), line
            port = int(line.rsplit(":", 1)[1])
            raw = Raw(leader_server)
            try:
                wait_until(lambda: any(b["node_id"] == 7 and b["port"] == port
                                       for b in _metadata(raw)["brokers"]), 20,
                           "the leader naming the follower's listener")
            finally:
                raw.close()
        finally:
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=20) == 0


# ---- real processes, confluent-kafka -------------------------------------------------

def _spawn(*args):
    proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), *map(str, args)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": ROOT_DIR})
    line = proc.stdout.readline().strip()
    assert line.isdigit(), f"replica process said {line!r}"
    return proc, int(line)


def _stop(proc):
    if proc.poll() is None:
        proc.stdin.close()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_confluent_kafka_clients_follow_a_sigkilled_leader(tmp_path):
    ck = pytest.importorskip("confluent_kafka")
    leader, leader_port = _spawn("leader", tmp_path / "L")
    follower, follower_port = _spawn("follower", tmp_path / "F", tmp_path / "L")
    bootstrap = f"127.0.0.1:{leader_port},127.0.0.1:{follower_port}"
    delivered: dict[bytes, int] = {}                 # value -> offset it was acked at
    failed: list[tuple[bytes, str]] = []
    acked_at: dict[bytes, float] = {}
    lock = threading.Lock()

    def on_delivery(err, msg):
        with lock:
            if err is None:
                delivered[msg.value()] = msg.offset()
                acked_at[msg.value()] = time.monotonic()
            else:
                failed.append((msg.value(), str(err)))

    common = {"bootstrap.servers": bootstrap, "reconnect.backoff.ms": 20,
              "reconnect.backoff.max.ms": 200, "retry.backoff.ms": 20,
              "retry.backoff.max.ms": 200, "topic.metadata.refresh.interval.ms": 500}
    producer = ck.Producer({**common, "acks": "all", "enable.idempotence": True,
                            "linger.ms": 1, "message.timeout.ms": 25000})
    consumer = ck.Consumer({**common, "group.id": "billing",
                            "auto.offset.reset": "earliest", "enable.auto.commit": False,
                            "session.timeout.ms": 6000, "heartbeat.interval.ms": 500})
    consumed: list[tuple[int, bytes]] = []
    committed_before_kill = -1
    try:
        consumer.subscribe([TOPIC])

        def consume_for(seconds):
            deadline = time.monotonic() + seconds
            while time.monotonic() < deadline:
                msg = consumer.poll(0.05)
                if msg is not None and msg.error() is None:
                    consumed.append((msg.offset(), msg.value()))

        # wait until the follower is in the ISR (the first acks=all produce then waits
        # for it) and the consumer is assigned and reading
        sent = 0

        def send(n):
            nonlocal sent
            for _ in range(n):
                producer.produce(TOPIC, b"r%05d" % sent, partition=0,
                                 on_delivery=on_delivery)
                sent += 1
            producer.poll(0)

        send(100)
        assert producer.flush(20) == 0 and not failed, failed
        wait_until(lambda: (consume_for(0.1) or len(consumed) >= 100), 20,
                   "the consumer reading the first records")
        consumer.commit(asynchronous=False)
        committed_before_kill = consumed[-1][0] + 1
        # the follower copies the commit (every second): wait until its root holds it

        def follower_holds_the_commit():
            with logkit.Broker(tmp_path / "F", read_only=True) as copy:
                return copy.group("billing").committed().get(
                    logkit.TopicPartition(TOPIC, 0), -1) >= committed_before_kill

        wait_until(follower_holds_the_commit, 20, "the follower copying the commit")
        # mid-stream: keep producing, kill the leader
        for _ in range(10):
            send(10)
            consume_for(0.02)
        kill_at = time.monotonic()
        consumed_at_kill = len(consumed)
        os.kill(leader.pid, signal.SIGKILL)
        leader.wait()
        sent_at_kill = sent
        deadline = time.monotonic() + 25
        while time.monotonic() < deadline:
            send(5)
            producer.poll(0.05)
            consume_for(0.05)
            with lock:
                after = [v for v in delivered if int(v[1:]) >= sent_at_kill]
            if len(after) >= 200:
                break
        assert producer.flush(25) == 0, "records still in flight after the failover"
        with lock:
            first_after = min(acked_at[v] for v in delivered if int(v[1:]) >= sent_at_kill)
        failover_s = first_after - kill_at
        # the consumer goes on to the end of what was delivered
        last = max(delivered.values())
        wait_until(lambda: (consume_for(0.1) or any(o == last for o, _ in consumed)), 20,
                   "the consumer reaching the last delivered record")
    finally:
        consumer.close()
        _stop(follower)
        if leader.poll() is None:
            leader.kill()
            leader.wait()
    assert not failed, failed[:5]
    # every delivered record is on the new leader exactly once, at its reported offset
    with logkit.Broker(tmp_path / "F", read_only=True) as new:
        p = new.topic(TOPIC).partition(0)
        stored = {}
        offset = p.log_start_offset
        while offset < p.log_end_offset:
            for record in p.read(offset, max_records=1000, stop_offset=p.log_end_offset):
                stored.setdefault(record.value, []).append(record.offset)
                offset = record.offset + 1
        assert p.leader_epoch == 1
    for value, at in delivered.items():
        assert stored.get(value) == [at], (value, at, stored.get(value))
    # the group went on from its committed position (or from where it was) without
    # skipping: its first record after the kill is at most one past the last before
    before = [o for o, _ in consumed[:consumed_at_kill]]
    after = [o for o, _ in consumed[consumed_at_kill:]]
    assert after and committed_before_kill <= after[0] <= max(before) + 1
    assert set(range(committed_before_kill, last + 1)) <= {o for o, _ in consumed}
    assert all(dict(consumed)[o] == v for v, o in delivered.items() if o in dict(consumed))
    print(f"failover: first acknowledged produce on the new leader {failover_s:.2f} s "
          "after the SIGKILL")
