"""Test helper process: tail one partition from offset 0 while another process appends to
it and compacts it, and report every record seen and every position the reads moved to.

Usage: python -m tests.helpers.compaction_reader ROOT TOPIC PARTITION MODE OUT STOP
       [CHUNK [PACE_MS]]

MODE is `fetch` (`Partition.fetch_records`, following `next_offset`) or `consumer`
(`Broker.consumer`, `assign`, `seek(tp, 0)`, `poll`, following `position()`). CHUNK
(default 200) is the most records one read asks for, PACE_MS (default 0) a pause after
each read that returned records: a small chunk and a pace keep the reader behind the
writer, in the segments the cleaner rewrites, rather than at the log end. Prints
"ready" once the partition is open. It reads until the file STOP holds an offset N (the
log end when the writer stopped, written whole by a rename) and its position has reached
N, or until its deadline; then writes OUT (JSON, by a rename):

    {"seen": [[offset, key hex, value hex or null], ...],
     "positions": [position after each read that moved, ...],
     "errors": ["what went wrong", ...], "reads": N, "timed_out": bool}

The reader asserts nothing itself: the test judges what it saw against the writer's
record of every append (tests/storage/test_compaction_model.py).
"""

from __future__ import annotations

import faulthandler
import json
import os
import sys
import time
import traceback

import logkit
from logkit import TopicPartition

DEADLINE_S = 90.0
IDLE_WAIT_S = 0.002          # between two reads that found nothing new (a poll, not a sync)


def _stop_offset(path: str) -> int | None:
    try:
        with open(path) as f:
            return int(f.read())
    except (FileNotFoundError, ValueError):
        return None


def _row(record) -> list:
    return [record.offset, None if record.key is None else record.key.hex(),
            None if record.value is None else record.value.hex()]


def tail_fetch(partition, stop_path: str, out: dict, deadline: float, chunk: int,
               pace_s: float) -> None:
    offset = 0
    while time.monotonic() < deadline:
        fetched = partition.fetch_records(offset, chunk)
        out["reads"] += 1
        if fetched.records and pace_s:
            time.sleep(pace_s)
        for r in fetched.records:
            out["seen"].append(_row(r))
        if fetched.next_offset < offset:
            out["errors"].append(f"next_offset {fetched.next_offset} after {offset}")
        if fetched.next_offset != offset:
            out["positions"].append(fetched.next_offset)
            offset = fetched.next_offset
            continue
        stop = _stop_offset(stop_path)
        if stop is not None and offset >= stop:
            return
        time.sleep(IDLE_WAIT_S)
    out["timed_out"] = True


def tail_consumer(broker, topic: str, partition: int, stop_path: str, out: dict,
                  deadline: float, chunk: int, pace_s: float) -> None:
    tp = TopicPartition(topic, partition)
    consumer = broker.consumer(enable_auto_commit=False, auto_offset_reset="earliest")
    try:
        consumer.assign([tp])
        consumer.seek(tp, 0)
        position = 0
        while time.monotonic() < deadline:
            records = consumer.poll(timeout_ms=20, max_records=chunk)
            out["reads"] += 1
            if records and pace_s:
                time.sleep(pace_s)
            for r in records:
                out["seen"].append(_row(r))
            now = consumer.position(tp)
            if now < position:
                out["errors"].append(f"position {now} after {position}")
            if now != position:
                out["positions"].append(now)
                position = now
                continue
            if records:
                continue
            stop = _stop_offset(stop_path)
            if stop is not None and position >= stop:
                return
        out["timed_out"] = True
    finally:
        consumer.close(autocommit=False)


def main(argv: list[str]) -> int:
    faulthandler.enable()        # a crash (SIGBUS, SIGSEGV) prints its stack to stderr
    root, topic, partition, mode, out_path, stop_path = argv[:6]
    chunk = int(argv[6]) if len(argv) > 6 else 200
    pace_s = float(argv[7]) / 1000 if len(argv) > 7 else 0.0
    out: dict = {"seen": [], "positions": [], "errors": [], "reads": 0, "timed_out": False}
    deadline = time.monotonic() + DEADLINE_S
    try:
        with logkit.Broker(root, background=False,
                           config={"log.cleaner.enable": False}) as broker:
            p = broker.topic(topic).partition(int(partition))
            print("ready", flush=True)
            if mode == "fetch":
                tail_fetch(p, stop_path, out, deadline, chunk, pace_s)
            else:
                tail_consumer(broker, topic, int(partition), stop_path, out, deadline,
                              chunk, pace_s)
    except Exception as exc:         # noqa: BLE001 — reported to the test, which fails
        out["errors"].append(f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}")
    finally:
        with open(out_path + ".tmp", "w") as f:
            json.dump(out, f)
        os.replace(out_path + ".tmp", out_path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
