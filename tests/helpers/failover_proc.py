"""Test helper process for the failover tests (tests/test_replication_failover.py).

    python failover_proc.py lead ROOT TTL_MS WRITER_ID
        open ROOT as a leader (broker.session.timeout.ms = TTL_MS, background chores on,
        so it renews its lease once a follower reports), produce "<WRITER_ID>-<n>" to
        partition 0 of topic t with acks=1 and print "<offset> <n>" per acknowledged
        record; prints "ready" first; runs until killed.
    python failover_proc.py promote FOLLOWER_DIR LEADER_DIR
        for each "go" line on stdin: Follower(FOLLOWER_DIR, DirectorySource(LEADER_DIR))
        .promote(), then print "won" or "lost <error class>"; prints "ready" first.
"""

from __future__ import annotations

import sys

import logkit


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


if __name__ == "__main__":
    if sys.argv[1] == "lead":
        lead(sys.argv[2], int(sys.argv[3]), sys.argv[4])
    else:
        promote(sys.argv[2], sys.argv[3])
