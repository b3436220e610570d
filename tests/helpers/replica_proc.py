"""Test helper process for the replication fault tests.

    python replica_proc.py follow LEADER DIR FETCH_BYTES
        run a logkit.Follower of the leader root LEADER into DIR in the foreground
        (replica.fetch.max.bytes = FETCH_BYTES); prints "ready", runs until killed.
    python replica_proc.py produce ROOT TOPIC WRITER_ID
        produce "<WRITER_ID>-<n>" values to partition 0 of TOPIC with acks=1, printing
        "<offset> <n>" for each acknowledged record; runs until killed.
"""

from __future__ import annotations

import sys

import logkit


def follow(leader: str, directory: str, fetch_bytes: int) -> None:
    follower = logkit.Follower(directory, logkit.DirectorySource(leader),
                               config={"replica.fetch.max.bytes": fetch_bytes,
                                       "replica.fetch.backoff.ms": 20})
    print("ready", flush=True)
    follower.run()


def produce(root: str, topic: str, writer_id: str) -> None:
    with logkit.Broker(root, background=False) as broker:
        broker.create_topic(topic, 1, config={"segment.bytes": 8192}, exist_ok=True)
        producer = broker.producer(acks=1, linger_ms=0)
        print("ready", flush=True)
        number = 0
        while True:
            futures = [(n, producer.send(topic, b"%s-%d" % (writer_id.encode(), n),
                                         partition=0))
                       for n in range(number, number + 1 + number % 13)]
            producer.flush()
            for n, future in futures:
                print(future.result().offset, n, flush=True)
            number = futures[-1][0] + 1


if __name__ == "__main__":
    if sys.argv[1] == "follow":
        follow(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    else:
        produce(sys.argv[2], sys.argv[3], sys.argv[4])
