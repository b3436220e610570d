"""The peers several benchmarks measure beside logkit: SQLite in WAL mode, persist-queue's
SQLiteQueue and kafka-python's record batch classes.

Owns: opening, filling and reading the SQLite peer table (one row per record, offset as
primary key, one transaction per batch) and the optional imports of the two pip peers.
Invariant: a peer that is not installed is reported as a row with a note, never skipped
silently and never an error (`logkit[bench]` installs both).
"""

from __future__ import annotations

import sqlite3
import time
from types import SimpleNamespace
from typing import Any

from ._common import Progress, chunks


def sqlite_open(path: str, synchronous: str) -> sqlite3.Connection:
    """A WAL-mode database with the `log` table, `synchronous` NORMAL or FULL."""
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute(f"PRAGMA synchronous={synchronous}")
    db.execute("CREATE TABLE IF NOT EXISTS log (offset INTEGER PRIMARY KEY, "
               "partition INTEGER, timestamp INTEGER, key BLOB, value BLOB)")
    return db


def sqlite_write(db: sqlite3.Connection, pairs: list[tuple[bytes, bytes]],
                 per_batch: int, partitions: int, progress: Progress | None = None) -> None:
    """Insert the pairs with `executemany`, one transaction per `per_batch` rows."""
    now = int(time.time() * 1000)
    done = 0
    for chunk in chunks(pairs, per_batch):
        rows = [(done + i, i % partitions, now, k, v) for i, (k, v) in enumerate(chunk)]
        db.execute("BEGIN")
        db.executemany("INSERT INTO log VALUES (?, ?, ?, ?, ?)", rows)
        db.execute("COMMIT")
        done += len(chunk)
        if progress is not None:
            progress.update(done)


def sqlite_read(db: sqlite3.Connection, count: int, per_poll: int = 500) -> int:
    """Read `count` rows back in offset order, `per_poll` per query, touching each value."""
    seen = 0
    offset = 0
    while seen < count:
        rows = db.execute("SELECT offset, timestamp, key, value FROM log WHERE offset >= ? "
                          "ORDER BY offset LIMIT ?", (offset, per_poll)).fetchall()
        if not rows:
            break
        for row in rows:
            row[3]
        seen += len(rows)
        offset = rows[-1][0] + 1
    return seen


def persist_queue(path: str) -> Any | None:
    """A persist-queue SQLiteQueue at `path`, or None when persist-queue is missing."""
    try:
        import persistqueue  # type: ignore[import-untyped]
    except ImportError:
        return None
    return persistqueue.SQLiteQueue(path, auto_commit=False)


def kafka_python() -> SimpleNamespace | None:
    """kafka-python's batch builder, batch parser and batch walker (the codec peer), or
    None when kafka-python is missing."""
    try:
        from kafka.record import MemoryRecords  # type: ignore[import-untyped]
        from kafka.record.default_records import (  # type: ignore[import-untyped]
            DefaultRecordBatch, DefaultRecordBatchBuilder)
    except ImportError:
        return None
    return SimpleNamespace(MemoryRecords=MemoryRecords, DefaultRecordBatch=DefaultRecordBatch,
                           DefaultRecordBatchBuilder=DefaultRecordBatchBuilder)
