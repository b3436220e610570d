"""Test helper process for the leader-side replication tests
(tests/replication/test_replication_leader.py).

    python leader_proc.py follow LEADER DIR WAIT_MS
        a logkit.Follower of the leader root LEADER into DIR on its background thread
        (replica.fetch.wait.max.ms = WAIT_MS: it reports at least that often); prints
        its follower id once it has caught up, then copies until its stdin closes.
    python leader_proc.py consume ROOT TOPIC
        polls partition 0 of TOPIC from offset 0 for half a second in a consumer of its
        own Broker, then prints "<high watermark> <offsets seen, comma separated>".
"""

from __future__ import annotations

import sys
import time

import logkit


def follow(leader: str, directory: str, wait_ms: int) -> None:
    follower = logkit.Follower(directory, logkit.DirectorySource(leader),
                               config={"replica.fetch.wait.max.ms": wait_ms,
                                       "replica.fetch.backoff.ms": 20})
    follower.start()
    follower.catch_up(timeout=30)
    print(follower.follower_id, flush=True)
    sys.stdin.read()
    follower.stop()


def consume(root: str, topic: str) -> None:
    with logkit.Broker(root, background=False) as broker:
        consumer = broker.consumer()
        tp = logkit.TopicPartition(topic, 0)
        consumer.assign([tp])
        consumer.seek(tp, 0)
        seen: list[int] = []
        deadline = time.monotonic() + 0.5
        while time.monotonic() < deadline:
            seen += [r.offset for r in consumer.poll(timeout_ms=50)]
        high_watermark = broker.topic(topic).partition(0).high_watermark
        print(high_watermark, ",".join(map(str, seen)), flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "follow":
        follow(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    else:
        consume(sys.argv[2], sys.argv[3])
