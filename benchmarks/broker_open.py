"""The open benchmark: open a cleanly closed broker whose topic has `open_partitions`
partitions, each holding data, and touch every partition's high watermark; median of 7
opens after one warm-up. Peers: SQLite connect + first query, and `os.open` + `fstat` of
the same files (the limit).

Owns: the `open` rows (their figure is the median time per open, in `extra`).
"""

from __future__ import annotations

import os
import sqlite3
import statistics
import time
from dataclasses import replace

from ._common import (TOPIC, BenchConfig, Result, append_all, make_records, open_broker,
                      peak_rss_mb, reset_peak_rss, scratch)
from ._peers import sqlite_open, sqlite_write

REPEATS = 7
RECORDS_PER_PARTITION = 200


def run(config: BenchConfig) -> list[Result]:
    from logkit import Broker
    parts = config.open_partitions
    cfg = replace(config, partitions=parts)
    out: list[Result] = []
    with scratch(config, "open") as path:
        broker = open_broker(path, cfg)
        append_all(broker, cfg, make_records(cfg, parts * RECORDS_PER_PARTITION), None)
        broker.close()

        def open_once() -> float:
            started = time.perf_counter()
            broker = Broker(path, background=False)
            topic = broker.topic(TOPIC)
            for p in range(parts):
                topic.partition(p).high_watermark
            seconds = time.perf_counter() - started
            broker.close()
            return seconds

        open_once()                               # warm the page cache and imports
        reset_peak_rss()
        times = [open_once() for _ in range(REPEATS)]
        out.append(open_result(f"logkit Broker() + topic with {parts} partitions (clean)",
                               times, headline=True))

        db_path = os.path.join(path, "peer.db")
        db = sqlite_open(db_path, "NORMAL")
        sqlite_write(db, make_records(cfg, parts * RECORDS_PER_PARTITION),
                     RECORDS_PER_PARTITION, parts)
        db.close()

        def sqlite_once() -> float:
            started = time.perf_counter()
            db = sqlite3.connect(db_path)
            db.execute("SELECT max(offset) FROM log").fetchone()
            seconds = time.perf_counter() - started
            db.close()
            return seconds

        sqlite_once()
        out.append(open_result("SQLite WAL connect + first query (one database)",
                               [sqlite_once() for _ in range(REPEATS)]))
        names = sorted(os.path.join(root, n) for root, _, files in os.walk(path)
                       for n in files if n.endswith((".log", ".index", ".timeindex")))

        def files_once() -> float:
            started = time.perf_counter()
            fds = [os.open(n, os.O_RDONLY) for n in names]
            for fd in fds:
                os.fstat(fd)
            seconds = time.perf_counter() - started
            for fd in fds:
                os.close(fd)
            return seconds

        out.append(open_result(f"os.open + fstat of the same {len(names)} files "
                               "(physical limit)", [files_once() for _ in range(REPEATS)]))
    return out


def open_result(system: str, times: list[float], headline: bool = False) -> Result:
    """A row whose figure is the median of `times` (seconds per open)."""
    median = statistics.median(times)
    return Result("open", system, 0, median, peak_rss_mb=peak_rss_mb(), headline=headline,
                  extra={"open_ms_median": median * 1000, "open_ms_max": max(times) * 1000})
