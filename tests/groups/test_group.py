"""Consumer groups across real processes: assignment, rebalance on a killed member,
resumption from commits, fencing, assignors, the admin API. (Delivery semantics under
SIGKILL: test_delivery.py.)"""

from __future__ import annotations

import time

import pytest

import logkit
from logkit import CommitFailedError, TopicPartition
from logkit.assignors import assign
from tests.helpers.procs import Worker, wait_until


def all_partitions(n):
    return {("t", str(p)) for p in range(n)}


def disjoint_and_complete(workers, n):
    sets = [w.owned() for w in workers]
    union = set().union(*sets)
    return union == all_partitions(n) and sum(len(s) for s in sets) == len(union)


def test_members_in_processes_split_partitions_and_rebalance_after_sigkill(tmp_path):
    """3 member processes own disjoint, complete shares; after one is SIGKILLed the
    survivors take its partitions within the session timeout plus a heartbeat."""
    with logkit.Broker(tmp_path) as broker:
        broker.create_topic("t", 6)
    workers = [Worker(tmp_path, "g", "t", "owned") for _ in range(3)]
    try:
        wait_until(lambda: disjoint_and_complete(workers, 6) and
                   all(w.owned() for w in workers), 30, "a stable 3-way split")
        with logkit.Broker(tmp_path) as broker:
            members = broker.group("g").members()
            assert len(members) == 3
            assigned = [tp for m in members for tp in m.assignment]
            assert sorted(assigned) == sorted(TopicPartition("t", p) for p in range(6))
        victim = workers.pop(0)
        killed_at = time.monotonic()
        victim.kill()
        done = wait_until(lambda: disjoint_and_complete(workers, 6), 1.5 + 0.2 + 10,
                          "the survivors to take over")
        print(f"rebalance after SIGKILL took {done - killed_at:.2f} s "
              "(session.timeout.ms=1500, heartbeat 200 ms)")
        with logkit.Broker(tmp_path) as broker:
            assert len(broker.group("g").members()) == 2
    finally:
        for w in workers:
            w.stop()


def produce(root, n, partitions=3):
    with logkit.Broker(root) as broker:
        try:
            broker.create_topic("t", partitions)
        except logkit.TopicExistsError:
            pass
        producer = broker.producer(linger_ms=1)
        for i in range(n):
            producer.send("t", b"%d" % i, key=b"%d" % (i % 50))
        producer.close()


def test_restart_resumes_from_committed_offsets(tmp_path):
    """A new consumer in the group starts where the last commit left off."""
    produce(tmp_path, 300)
    with logkit.Broker(tmp_path) as broker:
        c = broker.consumer("t", group_id="r", auto_offset_reset="earliest",
                            enable_auto_commit=False)
        got = []
        while len(got) < 120:
            got += c.poll(timeout_ms=200, max_records=40)
        c.commit()
        positions = {tp: c.position(tp) for tp in c.assignment()}
        c.close()
    with logkit.Broker(tmp_path) as broker:
        c = broker.consumer("t", group_id="r", auto_offset_reset="earliest",
                            enable_auto_commit=False)
        rest = []
        while True:
            batch = c.poll(timeout_ms=300)
            if not batch:
                break
            rest += batch
        first_seen = {}
        for r in rest:
            first_seen.setdefault(TopicPartition(r.topic, r.partition), r.offset)
        for tp, offset in first_seen.items():
            assert offset == positions[tp]
        assert len(got) + len(rest) == 300
        keys = {(r.partition, r.offset) for r in got} | {(r.partition, r.offset) for r in rest}
        assert len(keys) == 300


def test_commit_from_an_evicted_member_is_rejected(tmp_path):
    """A member that stopped heartbeating is evicted; its commit raises
    CommitFailedError, and the partition is not left without an owner."""
    produce(tmp_path, 30, partitions=1)
    with logkit.Broker(tmp_path) as broker:
        zombie = broker.consumer("t", group_id="z", auto_offset_reset="earliest",
                                 enable_auto_commit=False, session_timeout_ms=400,
                                 heartbeat_interval_ms=100)
        assert zombie.poll(timeout_ms=500)
        zombie._coordinator.heartbeat_stop.set()         # the process "hangs"
        live = broker.consumer("t", group_id="z", auto_offset_reset="earliest",
                               enable_auto_commit=False, session_timeout_ms=400,
                               heartbeat_interval_ms=100)
        wait_until(lambda: live.poll(timeout_ms=50) or live._owned, 15,
                   "the live member to take the partition")
        with pytest.raises(CommitFailedError):
            zombie.commit({TopicPartition("t", 0): 29})
        live.commit({TopicPartition("t", 0): 7})
        assert broker.group("z").committed() == {TopicPartition("t", 0): 7}


def test_commit_of_unassigned_partition_is_rejected(tmp_path):
    """Committing a partition this member does not own raises CommitFailedError."""
    with logkit.Broker(tmp_path) as broker:
        broker.create_topic("a", 1)
        broker.create_topic("b", 1)
        c = broker.consumer("a", group_id="u", enable_auto_commit=False)
        c.poll(timeout_ms=100)
        with pytest.raises(CommitFailedError, match="not assigned"):
            c.commit({TopicPartition("b", 0): 1})


@pytest.mark.parametrize("strategy", ["range", "roundrobin", "sticky", "cooperative-sticky"])
def test_assignors_are_complete_and_disjoint(strategy):
    """Every assignor gives each partition to exactly one subscribed member."""
    import random
    rng = random.Random(strategy)
    for _ in range(50):
        topics = {f"t{i}": rng.randint(1, 7) for i in range(rng.randint(1, 4))}
        members = {f"m{i}": sorted(rng.sample(sorted(topics), rng.randint(1, len(topics))))
                   for i in range(rng.randint(1, 5))}
        out = assign(strategy, members, topics)
        given = [tp for tps in out.values() for tp in tps]
        wanted = {(t, p) for t, n in topics.items() for p in range(n)
                  if any(t in subs for subs in members.values())}
        assert sorted(given) == sorted(wanted)
        for member, tps in out.items():
            assert all(t in members[member] for t, _ in tps)


def test_sticky_keeps_partitions_where_they_were():
    """The sticky assignor moves only what balance needs when a member joins."""
    members = {"a": ["t"], "b": ["t"]}
    first = assign("sticky", members, {"t": 6})
    second = assign("sticky", {**members, "c": ["t"]}, {"t": 6}, first)
    moved = sum(1 for m in ("a", "b") for tp in first[m] if tp not in second[m])
    assert moved == 2 and len(second["c"]) == 2
    assert assign("range", members, {"t": 5}) == {"a": [("t", 0), ("t", 1), ("t", 2)],
                                                  "b": [("t", 3), ("t", 4)]}


def test_group_admin_api(tmp_path):
    """members, generation, committed, lag, reset_offsets, delete, streams."""
    produce(tmp_path, 90)
    with logkit.Broker(tmp_path) as broker:
        group = broker.group("admin")
        streams = group.streams({"t": 3}, auto_offset_reset="earliest",
                                enable_auto_commit=False, consumer_timeout_ms=1500)["t"]
        seen = {}
        for _ in range(3):                        # let the handoffs settle
            for s in streams:
                s.poll(timeout_ms=100, max_records=1)
        wait_until(lambda: [s.poll(timeout_ms=10, max_records=1) for s in streams] and
                   sum(len(s._owned) for s in streams) == 3, 15, "three owners")
        owned = [s._owned for s in streams]
        assert all(len(o) == 1 for o in owned) and len(set().union(*owned)) == 3
        for s in streams:
            s.seek_to_beginning()
            for record in s:
                seen.setdefault(record.partition, []).append(record.offset)
            s.commit()
        assert sum(len(v) for v in seen.values()) == 90
        assert group.generation >= 3 and len(group.members()) == 3
        assert sum(group.committed().values()) == 90 and set(group.lag().values()) == {0}
        with pytest.raises(logkit.IllegalStateError):
            group.reset_offsets("earliest")
        for s in streams:
            s.close()
        assert group.members() == []
        assert set(group.reset_offsets("earliest").values()) == {0}
        assert sum(group.lag().values()) == 90
        group.delete()
        assert group.committed() == {}


def _fill(broker, partitions=4, per_partition=5):
    broker.create_topic("h", partitions)
    producer = broker.producer()
    for p in range(partitions):
        for i in range(per_partition):
            producer.send("h", b"%d-%d" % (p, i), partition=p)
    producer.close()


def test_new_owner_waits_for_the_old_owner_to_release(tmp_path):
    """After a join, the newcomer is assigned partitions the old member still holds;
    it fetches nothing from them until the old member's next poll revokes (and
    commits) them — so no two members ever fetch one partition at once."""
    with logkit.Broker(tmp_path) as broker:
        _fill(broker)
        revoked = []
        old = broker.consumer("h", group_id="hand", auto_offset_reset="earliest",
                              enable_auto_commit=True, on_revoke=revoked.append)
        got = old.poll(timeout_ms=1000, max_records=4)
        assert got and old.assignment() == {TopicPartition("h", p) for p in range(4)}
        new = broker.consumer("h", group_id="hand", auto_offset_reset="earliest",
                              enable_auto_commit=False)
        assert new.poll(timeout_ms=300) == []        # assigned, but not released to it
        assert len(new.assignment()) == 2
        assert old.poll(timeout_ms=0) is not None    # the old member learns, revokes
        assert revoked and set(revoked[0]) == {TopicPartition("h", p) for p in range(4)}
        mine = new.assignment()
        records = []
        wait_until(lambda: records.extend(new.poll(timeout_ms=50)) or
                   {TopicPartition("h", r.partition) for r in records} == mine, 15,
                   "the newcomer to fetch its partitions")
        resumed = {tp: broker.group("hand").committed().get(tp, 0) for tp in mine}
        firsts = {}
        for r in records:
            firsts.setdefault(TopicPartition("h", r.partition), r.offset)
        assert firsts == resumed                     # it starts at the revoke commit
        old.close()
        new.close()


def test_cooperative_sticky_revokes_only_what_moves(tmp_path):
    """cooperative-sticky: on a join, the old member's on_revoke names only the
    partitions that move; eager range revokes everything."""
    with logkit.Broker(tmp_path) as broker:
        _fill(broker)
        for strategy, expect_all in (("cooperative-sticky", False), ("range", True)):
            revoked, assigned = [], []
            first = broker.consumer("h", group_id=strategy, auto_offset_reset="earliest",
                                    partition_assignment_strategy=strategy,
                                    on_revoke=revoked.append, on_assign=assigned.append)
            first.poll(timeout_ms=200)
            assert set(assigned[0]) == {TopicPartition("h", p) for p in range(4)}
            second = broker.consumer("h", group_id=strategy, auto_offset_reset="earliest",
                                     partition_assignment_strategy=strategy)
            second.poll(timeout_ms=0)
            first.poll(timeout_ms=0)
            moved = set(second.assignment())
            assert len(moved) == 2
            assert set(revoked[-1]) == ({TopicPartition("h", p) for p in range(4)}
                                        if expect_all else moved)
            assert first.assignment() == {TopicPartition("h", p) for p in range(4)} - moved
            first.close()
            second.close()


def test_a_member_that_stops_polling_is_evicted(tmp_path):
    """max_poll_interval_ms: a member whose heartbeats go on but whose loop stalls is
    evicted; its partitions move, its commit fails, and its next poll rejoins."""
    with logkit.Broker(tmp_path) as broker:
        _fill(broker, partitions=2)
        options = dict(group_id="stall", auto_offset_reset="earliest",
                       enable_auto_commit=False, session_timeout_ms=5000,
                       heartbeat_interval_ms=50, max_poll_interval_ms=400)
        stalled = broker.consumer("h", **options)
        assert stalled.poll(timeout_ms=1000)
        live = broker.consumer("h", **options)
        records = []
        wait_until(lambda: records.extend(live.poll(timeout_ms=50)) or
                   {r.partition for r in records} == {0, 1}, 20,
                   "the live member to own both partitions")
        assert [m.member_id for m in broker.group("stall").members()] == \
            [live._coordinator.member_id]
        with pytest.raises(CommitFailedError):
            stalled.commit({TopicPartition("h", 0): 1})
        stalled.poll(timeout_ms=0)                   # rejoins: a new generation
        assert len(broker.group("stall").members()) == 2
        stalled.close()
        live.close()


def test_reset_offsets_after_a_member_was_sigkilled(tmp_path):
    """A SIGKILLed member blocks reset_offsets() only until its session timeout: the
    refusal names the member it found (pid, last heartbeat), and once the timeout has
    passed the reset goes through although no live member ever evicted the dead one."""
    produce(tmp_path, 30, partitions=2)
    worker = Worker(tmp_path, "crashy", "t", "owned")          # session.timeout.ms=1500
    try:
        wait_until(lambda: worker.owned(), 30, "the member to own its partitions")
        with logkit.Broker(tmp_path) as broker:
            group = broker.group("crashy")
            with pytest.raises(logkit.IllegalStateError,
                               match=rf"1 live member\(s\): .*pid {worker.proc.pid}"):
                group.reset_offsets("earliest", topics=["t"])
            assert group.state == "Stable"
            worker.kill()
            wait_until(lambda: group.members() == [], 30, "the session timeout to pass")
            assert group.state == "Empty"
            assert group.reset_offsets("latest", topics=["t"]) == {
                TopicPartition("t", 0): broker.topic("t").partition(0).high_watermark,
                TopicPartition("t", 1): broker.topic("t").partition(1).high_watermark}
            assert set(group.lag().values()) == {0}
    finally:
        worker.stop()


def test_lag_covers_partitions_without_a_commit(tmp_path):
    """lag() counts every partition of a subscribed or committed topic: a partition
    with no commit is behind by everything from its log start; committed() omits it."""
    produce(tmp_path, 40, partitions=2)
    with logkit.Broker(tmp_path) as broker:
        broker.create_topic("other", 1).partition(0).append([(None, b"x", None, None)] * 3)
        consumer = broker.consumer("t", group_id="late", enable_auto_commit=False)
        consumer.poll(timeout_ms=50)
        group = broker.group("late")
        ends = {p.topic_partition: p.high_watermark for p in broker.topic("t").partitions}
        assert group.committed() == {} and group.lag() == ends       # subscribed only
        consumer.close()
        assert group.lag() == {}                     # no live member, nothing committed
        group.reset_offsets({TopicPartition("other", 0): 1})
        assert group.lag() == {TopicPartition("other", 0): 2}
        assert group.committed() == {TopicPartition("other", 0): 1}


def test_groups_are_listed_and_an_unknown_id_is_dead(tmp_path):
    """broker.groups() lists every group with members or commits, sorted; a misspelt
    id is "Dead", a group whose members left is "Empty"."""
    produce(tmp_path, 10, partitions=1)
    with logkit.Broker(tmp_path) as broker:
        assert broker.groups() == []
        member = broker.consumer("t", group_id="b-members", enable_auto_commit=False)
        member.poll(timeout_ms=50)
        broker.group("a-commits").reset_offsets({TopicPartition("t", 0): 4})
        broker.group("a-commits\x01x").reset_offsets({TopicPartition("t", 0): 1})
        assert broker.groups() == ["a-commits", "a-commits\x01x", "b-members"]
        assert broker.group("b-members").state == "Stable"
        assert broker.group("a-commits").state == "Empty"
        assert broker.group("a-comits").state == "Dead"
        member.close()
        assert broker.group("b-members").state == "Empty"
        broker.group("a-commits").delete()
        assert broker.groups() == ["a-commits\x01x", "b-members"]
