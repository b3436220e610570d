"""Kafka's classic group protocol on the listener with real clients in real processes:
two consumers of one group in two processes split the partitions; one is killed with
SIGKILL and the other takes its partitions after the session timeout; the wire members
show in `broker.group(id)`; an embedded consumer may not join a group with live wire
members, and a lone consumer gets its first assignment without waiting."""

import multiprocessing
import multiprocessing.connection
import os
import signal
import threading
import time

import pytest

import logkit
from logkit.protocol import errors as E

# Every client runs by default (about 4-5 s each). The session stays at 3 s: a shorter
# one under a loaded machine expires live members (a rebalance the flow does not expect).
SESSION_MS = 3000
HEARTBEAT_MS = 500
CLIENTS = ["kafka-python", "confluent-kafka", "aiokafka"]
_MODULES = {"kafka-python": "kafka", "confluent-kafka": "confluent_kafka",
            "aiokafka": "aiokafka"}


def _member(client, bootstrap, topic, group, reports, stop, log_path):
    """A consumer process: sends ("assigned", pid, partitions) on its own pipe `reports`
    whenever its assignment changes, committing what it reads, until the `stop` pipe
    ends. The client library logs at INFO to `log_path` (joins, assignments, errors),
    which a failed wait shows.

    Pipes, one per member, not a shared multiprocessing Queue or Event: those hold a
    lock shared between processes, and a member killed by SIGKILL inside it (putting a
    report, reading the event) leaves it held, so the survivor's reports never arrive
    (seen under load: the survivor held every partition, the test never heard)."""
    import logging
    logging.basicConfig(filename=log_path, level=logging.INFO,
                        format="%(asctime)s %(threadName)s %(name)s %(message)s")
    pid = os.getpid()
    last = None

    def report(partitions):
        nonlocal last
        partitions = sorted(partitions)
        if partitions != last:
            last = partitions
            reports.send(("assigned", pid, partitions))

    if client == "kafka-python":
        import kafka
        consumer = kafka.KafkaConsumer(topic, bootstrap_servers=bootstrap, group_id=group,
                                       session_timeout_ms=SESSION_MS,
                                       heartbeat_interval_ms=HEARTBEAT_MS,
                                       auto_offset_reset="earliest")
        # kafka-python 3.0.12 loses a rebalance's outcome when a poll's timeout ends
        # while a JoinGroup it sent because the topic's metadata changed is in flight
        # (its poll re-awaits a join only while need_rejoin(), which that join's own
        # assignment has made false): the member never heartbeats again and is expired.
        # A member that knows the topic's partitions before its first join has no such
        # rejoin.
        deadline = time.monotonic() + 60
        while not consumer.partitions_for_topic(topic):
            assert time.monotonic() < deadline, f"kafka-python never saw {topic}'s metadata"
            time.sleep(0.05)        # polling a state with a deadline
        while not stop.poll():
            consumer.poll(timeout_ms=100)
            report(tp.partition for tp in consumer.assignment())
        consumer.close()
    elif client == "confluent-kafka":
        import confluent_kafka
        logging.getLogger("librdkafka").setLevel(logging.DEBUG)     # its "cgrp" debug
        consumer = confluent_kafka.Consumer({
            "bootstrap.servers": bootstrap, "group.id": group,
            "session.timeout.ms": SESSION_MS, "heartbeat.interval.ms": HEARTBEAT_MS,
            "auto.offset.reset": "earliest", "debug": "cgrp",
            "logger": logging.getLogger("librdkafka")})
        consumer.subscribe([topic])
        while not stop.poll():
            consumer.poll(0.1)
            report(tp.partition for tp in consumer.assignment())
        consumer.close()
    else:
        import asyncio

        import aiokafka

        async def run():
            consumer = aiokafka.AIOKafkaConsumer(
                topic, bootstrap_servers=bootstrap, group_id=group,
                session_timeout_ms=SESSION_MS, heartbeat_interval_ms=HEARTBEAT_MS,
                auto_offset_reset="earliest")
            await consumer.start()
            while not stop.poll():
                await consumer.getmany(timeout_ms=100)
                report(tp.partition for tp in consumer.assignment())
            await consumer.stop()
        asyncio.run(run())


# A bound on each wait for the group to settle, not an expected duration: about 5 s
# each when idle; a loaded machine (load average 6-10) stretches a spawned process's
# start (imports) and each rebalance.
SETTLE_S = 120


def _latest(readers, state, until, what, explain, bound_s=SETTLE_S):
    """Read the members' pipes (`readers`; one that ends is dropped) until until(state)
    holds; state maps pid -> partitions. Past the bound, AssertionError naming `what`,
    the state and explain() (the listener's view and the members' logs)."""
    end = time.monotonic() + bound_s
    while not until(state):
        remaining = end - time.monotonic()
        if remaining <= 0 or not readers:
            raise AssertionError(f"{what}: not within {bound_s} s; the members reported "
                                 f"{state}\n{explain()}")
        for reader in multiprocessing.connection.wait(readers, timeout=remaining):
            try:
                _, pid, partitions = reader.recv()
            except EOFError:            # that member is gone (killed)
                readers.remove(reader)
                continue
            state[pid] = partitions
    return state


def _wire_members_show(broker, want, what, explain, bound_s=SETTLE_S):
    """Wait until broker.group("billing").members(), which reads the listener's LMDB
    snapshot (a member counts as live while its last stored heartbeat is within its
    session timeout, stored about every second), shows one member per list in `want`
    holding those partitions."""
    end = time.monotonic() + bound_s
    while True:
        shown = sorted(sorted(tp.partition for tp in m.assignment)
                       for m in broker.group("billing").members())
        if shown == sorted(want):
            return
        if time.monotonic() > end:
            raise AssertionError(f"{what}: broker.group() showed {shown}, not "
                                 f"{sorted(want)}, within {bound_s} s\n{explain()}")
        time.sleep(0.01)            # polling a state with a deadline


@pytest.mark.parametrize("client", CLIENTS)
def test_two_processes_split_the_partitions_and_one_takes_over_from_a_killed_one(
        tmp_path, client):
    pytest.importorskip(_MODULES[client])
    ctx = multiprocessing.get_context("spawn")
    with logkit.Broker(tmp_path / "data") as broker, broker.serve() as server:
        broker.create_topic("orders", 4)
        stop, stopping = ctx.Pipe(duplex=False)     # closing `stopping` ends the members
        readers, members = [], []

        def start_member():
            log_path = tmp_path / f"member-{len(members)}.log"
            reader, writer = ctx.Pipe(duplex=False)
            # daemon: a test that fails never leaves a member spinning, nor pytest's
            # exit waiting for it
            process = ctx.Process(target=_member, daemon=True, args=(
                client, server.bootstrap_servers, "orders", "billing", writer, stop,
                str(log_path)))
            process.start()
            writer.close()                  # the member's end: its death ends the pipe
            readers.append(reader)
            members.append((process, log_path))
            return process

        def explain():
            lines = [f"listener: {server.handlers.groups.describe('billing')}"]
            for process, log_path in members:
                text = log_path.read_text(errors="replace") if log_path.exists() else ""
                lines.append(f"--- member pid {process.pid} (exit {process.exitcode}), "
                             f"{log_path.name}, last lines:\n"
                             + "\n".join(text.splitlines()[-30:]))
            return "\n".join(lines)

        try:
            first = start_member()
            state = _latest(readers, {}, lambda s: s.get(first.pid) == [0, 1, 2, 3],
                            "the first member assigned every partition", explain)
            second = start_member()
            state = _latest(readers, state, lambda s: sorted(
                s.get(first.pid, []) + s.get(second.pid, [])) == [0, 1, 2, 3]
                and s.get(first.pid) and s.get(second.pid),
                "the two members splitting the partitions", explain)
            _wire_members_show(broker, [state[first.pid], state[second.pid]],
                               "the two wire members in broker.group()", explain)
            with pytest.raises(logkit.IllegalStateError, match="Kafka protocol listener"):
                broker.consumer("orders", group_id="billing").poll(timeout_ms=100)
            os.kill(first.pid, signal.SIGKILL)
            first.join(10)
            _latest(readers, state, lambda s: s.get(second.pid) == [0, 1, 2, 3],
                    "the second member taking over the killed one's partitions", explain)
        finally:
            stopping.close()
            for process, _ in members:
                process.join(30)
                if process.is_alive():
                    process.kill()
                    process.join(10)


def test_a_lone_consumer_is_assigned_at_its_first_join(tmp_path):
    kafka = pytest.importorskip("kafka")
    with logkit.Broker(tmp_path / "data") as broker, broker.serve() as server:
        broker.create_topic("t", 2)
        consumer = kafka.KafkaConsumer("t", bootstrap_servers=server.bootstrap_servers,
                                       group_id="solo")
        polls = 0
        while not consumer.assignment() and polls < 100:
            consumer.poll(timeout_ms=100)
            polls += 1
        assert {tp.partition for tp in consumer.assignment()} == {0, 1}
        described = server.handlers.groups.describe("solo")
        assert described["group_state"] == "Stable" and len(described["members"]) == 1
        assert len(broker.group("solo").members()) == 1
        assert "solo" in broker.groups() and broker.group("solo").state == "Stable"
        # kafka-python's admin client lists and describes the group, and its offsets
        consumer.commit({kafka.TopicPartition("t", 0): kafka.OffsetAndMetadata(0, "m", -1)})
        admin = kafka.KafkaAdminClient(bootstrap_servers=server.bootstrap_servers)
        assert [(g["group_id"], g["group_state"]) for g in admin.list_groups()] == \
            [("solo", "Stable")]
        described = admin.describe_groups(["solo"])["solo"]
        assert described["group_state"] == "Stable" and described["protocol_data"] == "range"
        (member,) = described["members"]
        assert member["member_metadata"]["topics"] == ["t"]
        assert member["member_assignment"]["assigned_partitions"] == \
            [{"topic": "t", "partitions": [0, 1]}]
        offsets = admin.list_group_offsets("solo")["solo"]
        assert offsets[kafka.TopicPartition("t", 0)].offset == 0
        assert offsets[kafka.TopicPartition("t", 0)].metadata == "m"
        admin.close()
        consumer.close()
        assert broker.group("solo").members() == []


# ---- a member that dies during a rebalance (GroupManager driven call by call) ----------

def _manager():
    from logkit.protocol.groups import GroupManager
    closing = threading.Event()
    return GroupManager(persist=lambda group, snapshot: None,
                        embedded_live=lambda group: False, closing=closing), closing


def _join(manager, member_id="", client="c"):
    # session 1 s, rebalance 60 s: a wait past a few seconds is the rebalance timeout's
    return manager.join("g", member_id, client, "127.0.0.1", 1000, 60000, "consumer",
                        [("range", b"\x00\x00\x00\x00\x00\x01\x00\x01t\xff\xff\xff\xff")])


def _in_thread(call):
    out = {}
    thread = threading.Thread(target=lambda: out.update(call()), daemon=True)
    thread.start()
    return thread, out


def test_a_member_killed_before_it_rejoins_is_removed_at_its_session_timeout():
    """A rebalance waits for every known member to rejoin, but not for a dead one past
    its session timeout (Kafka expires it): the joiner's JoinGroup completes without it
    in seconds, not after the 60 s rebalance timeout."""
    manager, closing = _manager()
    try:
        first = _join(manager, client="a")
        a = first["member_id"]
        assert manager.sync("g", first["generation_id"], a,
                            [{"member_id": a, "assignment": b"x"}])["error_code"] == 0
        started = time.monotonic()
        thread, joined = _in_thread(lambda: _join(manager, client="b"))   # a is dead now
        thread.join(10)
        assert not thread.is_alive(), "the join waited for a dead member past 10 s"
        assert joined["error_code"] == 0 and time.monotonic() - started < 10
        assert [m["member_id"] for m in joined["members"]] == [joined["member_id"]]
        assert [m["member_id"] for m in manager.describe("g")["members"]] == \
            [joined["member_id"]]
    finally:
        closing.set()


def test_a_leader_killed_before_its_sync_sends_the_followers_back_to_rejoin():
    """The leader dies between JoinGroup and SyncGroup: a follower waiting in SyncGroup
    gets REBALANCE_IN_PROGRESS once the leader's session timeout passes, not after the
    rebalance timeout, and its rejoin makes it the leader of a new generation."""
    manager, closing = _manager()
    try:
        first = _join(manager, client="a")
        a = first["member_id"]
        manager.sync("g", first["generation_id"], a, [{"member_id": a, "assignment": b"x"}])
        joining, follower = _in_thread(lambda: _join(manager, client="b"))
        deadline = time.monotonic() + 20
        while manager.describe("g")["group_state"] != "PreparingRebalance":
            assert time.monotonic() < deadline
            time.sleep(0.001)
        leader = _join(manager, member_id=a)       # the leader's last call: then it dies
        joining.join(20)
        assert leader["leader"] == a and follower["generation_id"] == leader["generation_id"]
        started = time.monotonic()
        syncing, synced = _in_thread(lambda: manager.sync(
            "g", follower["generation_id"], follower["member_id"], []))
        syncing.join(10)
        assert not syncing.is_alive(), "the follower's sync waited for a dead leader"
        assert synced["error_code"] == E.REBALANCE_IN_PROGRESS
        assert time.monotonic() - started < 10
        again = _join(manager, member_id=follower["member_id"])
        assert again["error_code"] == 0 and again["leader"] == follower["member_id"]
        assert again["generation_id"] > follower["generation_id"]
    finally:
        closing.set()
