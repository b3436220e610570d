"""Test helper process: a consumer-group member.

Usage: python group_worker.py ROOT GROUP TOPIC MODE
MODE "owned": poll forever, print "owned t/p,t/p,..." whenever the owned set changes.
MODE "alo" / "amo": at-least-once (process, then commit) or at-most-once (commit, then
process); "processing" a record prints "rec <partition> <offset>".
"""

from __future__ import annotations

import sys
import time

import logkit


def main() -> None:
    root, group, topic, mode = sys.argv[1:5]
    with logkit.Broker(root, background=False) as broker:
        consumer = broker.consumer(topic, group_id=group, auto_offset_reset="earliest",
                                   enable_auto_commit=False, session_timeout_ms=1500,
                                   heartbeat_interval_ms=200)
        print("ready", flush=True)
        last = None
        while True:
            records = consumer.poll(timeout_ms=50, max_records=20)
            if mode == "owned":
                owned = sorted(consumer._owned)
                if owned != last:
                    print("owned " + ",".join(f"{t}/{p}" for t, p in owned), flush=True)
                    last = owned
                continue
            if not records:
                continue
            if mode == "amo":
                consumer.commit({logkit.TopicPartition(r.topic, r.partition): r.offset + 1
                                 for r in records})
            for r in records:
                print(f"rec {r.partition} {r.offset}", flush=True)
                time.sleep(0.001)
            if mode == "alo":
                consumer.commit()


if __name__ == "__main__":
    main()
