"""Replication: a follower copies a leader's directory, then takes over.

A leader takes orders and a billing consumer commits its position. A `logkit.Follower`
copies the leader's files through a `DirectorySource` (the leader's directory on this
machine, a second disk, or a shared filesystem). The leader goes away; the follower is
promoted (next leader epoch) and opened as a broker; billing goes on from its commit,
and new orders get the new epoch.

Run: .venv/bin/python examples/replication.py [directory]
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from typing import Any

import logkit


def run(root: str) -> dict[str, Any]:
    leader_dir, replica_dir = os.path.join(root, "leader"), os.path.join(root, "replica")
    with logkit.Broker(leader_dir) as leader:
        leader.create_topic("orders", partitions=2)
        producer = leader.producer(acks=1)
        for n in range(10):
            producer.send("orders", b"order-%d" % n, key=b"customer-%d" % (n % 3))
        producer.flush()
        billing = leader.consumer("orders", group_id="billing",
                                  auto_offset_reset="earliest", enable_auto_commit=False)
        billed = []
        while len(billed) < 6:
            billed += [r.value for r in billing.poll(timeout_ms=200,
                                                     max_records=6 - len(billed))]
        billing.commit()                                # billing is at 6 of 10
        billing.close()

        # The follower runs beside the leader and copies batch for batch.
        with logkit.Follower(replica_dir, logkit.DirectorySource(leader_dir)) as follower:
            follower.catch_up(timeout=30)
            print(f"replica caught up: {follower.log_end_offsets()}")
    # The leader is gone. Promote the replica: it takes leader epoch 1.
    follower.promote()
    with logkit.Broker(replica_dir) as new_leader:
        billing = new_leader.consumer("orders", group_id="billing",
                                      auto_offset_reset="earliest",
                                      enable_auto_commit=False)
        rest = []
        while len(rest) < 4:
            rest += [r.value for r in billing.poll(timeout_ms=200)]
        billing.close()
        producer = new_leader.producer(acks=1)
        meta = producer.send("orders", b"order-10", key=b"customer-1").result()
        producer.close()
        partition = new_leader.topic("orders").partition(meta.partition)
        epoch = partition.leader_epoch
        with open(os.path.join(partition.directory, "leader-epoch-checkpoint")) as f:
            checkpoint = f.read().split("\n")
    print(f"billing went on with {len(rest)} orders after its commit: "
          f"{sorted(v.decode() for v in rest)}")
    print(f"order-10 went to orders-{meta.partition} at offset {meta.offset} in leader "
          f"epoch {epoch}; leader-epoch-checkpoint: {checkpoint[2:-1]}")
    return {"billed": billed, "rest": rest, "epoch": epoch, "offset": meta.offset}


if __name__ == "__main__":
    if len(sys.argv) > 1:
        run(sys.argv[1])
    else:
        work = tempfile.mkdtemp(prefix="logkit-replication-")
        try:
            run(work)
        finally:
            shutil.rmtree(work)
