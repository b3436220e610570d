"""A small stream job, and the subject of examples/test_large_orders.py (how to test a
stream job with logkit's pytest plugin; docs/testing.md walks through it).

The job reads JSON orders from `orders` as consumer group `large-orders`, writes each
order of at least `threshold_cents` to `large-orders` (same key, plus a `flagged_ms`
field), sends any record that is not a JSON order to `orders-dlq` (the dead-letter topic),
and commits after the records of each poll are written: at-least-once, Kafka's usual
consume-transform-produce loop.

Run it on a directory until Ctrl-C:  .venv/bin/python examples/large_orders.py DIR
"""

from __future__ import annotations

import json
import signal
import sys
import threading
import time

import logkit

SOURCE, SINK, DEAD_LETTERS = "orders", "large-orders", "orders-dlq"
GROUP = "large-orders"


class LargeOrders:
    """The job: `step()` handles one poll's records; `run(stop)` steps until stopped."""

    def __init__(self, broker: logkit.Broker, *, threshold_cents: int = 10_000) -> None:
        self.threshold_cents = threshold_cents
        self.consumer = broker.consumer(SOURCE, group_id=GROUP,
                                        auto_offset_reset="earliest",
                                        enable_auto_commit=False)
        self.producer = broker.producer(linger_ms=0)

    def step(self, timeout_ms: int = 100) -> int:
        """Poll once, route what came, commit; returns the records handled."""
        records = self.consumer.poll(timeout_ms=timeout_ms)
        for record in records:
            try:
                order = json.loads(record.value)
                total = int(order["total_cents"])
            except (ValueError, TypeError, KeyError):
                self.producer.send(DEAD_LETTERS, record.value, key=record.key,
                                   headers=[("error", b"not a JSON order with total_cents")])
                continue
            if total >= self.threshold_cents:
                order["flagged_ms"] = record.timestamp
                self.producer.send(SINK, json.dumps(order).encode(), key=record.key)
        if records:
            self.producer.flush()          # written before the commit: at-least-once
            self.consumer.commit()
        return len(records)

    def run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            self.step()

    def close(self) -> None:
        self.consumer.close(autocommit=False)
        self.producer.close()


def main(directory: str) -> None:
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with logkit.Broker(directory) as broker:
        for name in (SOURCE, SINK, DEAD_LETTERS):
            broker.create_topic(name, 1, exist_ok=True)
        job = LargeOrders(broker)
        started = time.monotonic()
        try:
            job.run(stop)
        except KeyboardInterrupt:
            pass
        finally:
            job.close()
        print(f"ran {time.monotonic() - started:.1f} s", file=sys.stderr)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "data/")
