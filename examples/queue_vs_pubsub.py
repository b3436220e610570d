"""Queue vs publish-subscribe with one mechanism, as in Kafka: consumers in the *same*
group share a topic's partitions (a queue: each record to one of them); consumers in
*different* groups each get every record (pub/sub).

Run: .venv/bin/python examples/queue_vs_pubsub.py
"""

from __future__ import annotations

import shutil
import tempfile
from typing import Any

import logkit


def drain_all(consumers: list[Any], idle_rounds: int = 5) -> list[list[int]]:
    """Poll the consumers in turn until none has received anything for a while."""
    got: list[list[int]] = [[] for _ in consumers]
    quiet = 0
    while quiet < idle_rounds:
        progress = False
        for i, consumer in enumerate(consumers):
            for record in consumer.poll(timeout_ms=100):
                got[i].append(int(record.value))
                progress = True
        quiet = 0 if progress else quiet + 1
    return got


def run(root: str, jobs: int = 90) -> dict[str, Any]:
    with logkit.Broker(root) as broker:
        broker.create_topic("jobs", partitions=3)
        producer = broker.producer()
        for n in range(jobs):
            producer.send("jobs", b"%d" % n, key=b"job-%d" % n)
        producer.flush()
        options = dict(auto_offset_reset="earliest", session_timeout_ms=3000,
                       heartbeat_interval_ms=200)
        workers = [broker.consumer("jobs", group_id="workers", **options) for _ in range(2)]
        queue = drain_all(workers)
        audit = broker.consumer("jobs", group_id="audit", **options)
        billing = broker.consumer("jobs", group_id="billing", **options)
        pubsub = drain_all([audit, billing])
        return {"queue": queue, "pubsub": pubsub, "jobs": jobs}


def main() -> None:
    root = tempfile.mkdtemp(prefix="logkit-queue-")
    try:
        result = run(root)
    finally:
        shutil.rmtree(root)
    a, b = result["queue"]
    print(f"queue (one group, two consumers): {len(a)} + {len(b)} jobs, "
          f"overlap {len(set(a) & set(b))}, all {len(set(a) | set(b))} of {result['jobs']}")
    audit, billing = result["pubsub"]
    print(f"pub/sub (two groups): audit got {len(set(audit))}, billing got "
          f"{len(set(billing))} of {result['jobs']}")


if __name__ == "__main__":
    main()
