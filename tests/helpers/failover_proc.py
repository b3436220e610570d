"""Test helper process for the failover tests (tests/replication/test_replication_failover.py).

    python failover_proc.py lead ROOT TTL_MS WRITER_ID
        open ROOT as a leader (broker.session.timeout.ms = TTL_MS, background chores on,
        so it renews its lease once a follower reports), produce "<WRITER_ID>-<n>" to
        partition 0 of topic t with acks=1 and print "<offset> <n>" per acknowledged
        record; prints "ready" first; runs until killed.
    python failover_proc.py promote FOLLOWER_DIR LEADER_DIR
        for each "go" line on stdin: Follower(FOLLOWER_DIR, DirectorySource(LEADER_DIR))
        .promote(), then print "won" or "lost <error class>"; prints "ready" first.
    python failover_proc.py node ROOT SOURCE|- WRITER_ID [gate]
        one replica of the fault test and the failover benchmark (TTL 1 s, topic t:
        replication factor 2, min.insync.replicas=2, acks="all"). With a SOURCE (the
        leader's directory) it first opens ROOT, when it exists, as a broker and tries a write, printing
        "refused <log end>" when NotLeaderError refuses it ("wrote" when it does not),
        then follows SOURCE (auto-promotion on), prints "following <log end>" once
        caught up and "promoted <wall time>" when it promoted itself. With "gate" it
        waits for a "go" line on stdin before anything (a process started ahead), and
        for a "lead" line before it leads after a promotion. Then (or at once with "-": a fresh
        leader) it opens ROOT as the leader, prints "leading", and produces
        "<WRITER_ID>-<n>", printing "first <wall time>" at the first acknowledged
        record and "<offset> <n>" per acknowledged record; runs until killed.
"""

from __future__ import annotations

import os
import sys
import time

import logkit
from logkit.topic import Partition

NODE_CONFIG = {"broker.session.timeout.ms": 1000}
TOPIC_CONFIG = {"min.insync.replicas": 2, "segment.bytes": 65536}


def lead(root: str, ttl_ms: int, writer_id: str) -> None:
    with logkit.Broker(root, config={"broker.session.timeout.ms": ttl_ms}) as broker:
        broker.create_topic("t", 1, config={"segment.bytes": 8192}, exist_ok=True)
        producer = broker.producer(acks=1, linger_ms=0)
        print("ready", flush=True)
        number = 0
        while True:
            futures = [(n, producer.send("t", b"%s-%d" % (writer_id.encode(), n),
                                         partition=0))
                       for n in range(number, number + 1 + number % 7)]
            producer.flush()
            for n, future in futures:
                print(future.result().offset, n, flush=True)
            number = futures[-1][0] + 1


def promote(follower_dir: str, leader_dir: str) -> None:
    print("ready", flush=True)
    for line in sys.stdin:
        if line.strip() != "go":
            continue
        follower = logkit.Follower(follower_dir, logkit.DirectorySource(leader_dir))
        try:
            follower.promote()
        except logkit.LogkitError as exc:
            print("lost", type(exc).__name__, flush=True)
        else:
            print("won", flush=True)


def _wait_for_line(word: str) -> None:
    for line in sys.stdin:
        if line.strip() == word:
            return
    sys.exit(0)                                       # stdin closed: not needed after all


def node(root: str, source: str, writer_id: str, gate: bool) -> None:
    print("ready", flush=True)
    if gate:
        _wait_for_line("go")
    if source != "-" and os.path.exists(root):
        with logkit.Broker(root, config=NODE_CONFIG, background=False) as old:
            p = old.topic("t").partition(0)
            try:
                p.append([(None, b"stale", None, None)])
            except logkit.NotLeaderError:
                print("refused", Partition.log_end_offset.fget(p), flush=True)
            else:
                print("wrote", flush=True)
    if source != "-":
        follower = logkit.Follower(root, logkit.DirectorySource(source), config=NODE_CONFIG)
        follower.start()
        follower.catch_up(timeout=60)
        print("following", sum(follower.log_end_offsets().values()), flush=True)
        while not follower.promoted.wait(0.05):
            if follower.error is not None:
                raise follower.error
        print("promoted", repr(time.time()), flush=True)
        follower.stop()
        if gate:
            _wait_for_line("lead")
    with logkit.Broker(root, config=NODE_CONFIG) as broker:
        broker.create_topic("t", 1, replication_factor=2, config=TOPIC_CONFIG,
                            exist_ok=True)
        producer = broker.producer(acks="all", linger_ms=0)
        print("leading", flush=True)
        number, first = 0, True
        while True:
            batch = [(n, producer.send("t", b"%s-%d" % (writer_id.encode(), n),
                                       partition=0))
                     for n in range(number, number + 1 + number % 5)]
            number += len(batch)
            try:
                producer.flush()
                acked = [(future.result().offset, n) for n, future in batch]
            except logkit.LogkitError:            # not enough replicas yet: not acked
                time.sleep(0.01)
                continue
            if first:
                print("first", repr(time.time()), flush=True)
                first = False
            print("\n".join(f"{offset} {n}" for offset, n in acked), flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "lead":
        lead(sys.argv[2], int(sys.argv[3]), sys.argv[4])
    elif sys.argv[1] == "node":
        node(sys.argv[2], sys.argv[3], sys.argv[4], "gate" in sys.argv[5:])
    else:
        promote(sys.argv[2], sys.argv[3])
