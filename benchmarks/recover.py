"""The recover benchmark: the scan rate of a forced full recovery (`Partition.recover()`:
every batch's header and CRC checked, the indexes rebuilt) over a log of `recover_mb` MB.
Peers: the bare CRC-32C of the same batches (the limit), kafka-python's CRC check of the
same file, SQLite's `PRAGMA quick_check` over the same records.

Owns: the `recover` rows (their figure is MB/s; `extra` holds GB/s and segments checked).
"""

from __future__ import annotations

import mmap
import os
from dataclasses import replace

from ._common import (TOPIC, BenchConfig, Progress, Result, batch_appender, encoded_batches,
                      make_records, measure, peak_rss_mb, records_per_batch, reset_peak_rss,
                      scratch)
from ._peers import kafka_python, sqlite_open, sqlite_write

SEGMENT_BYTES = 1 << 30               # one segment holds the whole log
KAFKA_PYTHON_SCAN_BYTES_MAX = 64_000_000
BATCHES_PER_ROUND = 64


def run(config: BenchConfig) -> list[Result]:
    from logkit import Broker
    cfg = replace(config, partitions=1)
    out: list[Result] = []
    with scratch(config, "recover") as path:
        broker = Broker(path, background=False)
        broker.create_topic(TOPIC, partitions=1, config={"segment.bytes": SEGMENT_BYTES})
        partition = broker.topic(TOPIC).partition(0)
        append_batch = batch_appender(partition)
        batches = encoded_batches(cfg, make_records(cfg, records_per_batch(cfg) *
                                                    BATCHES_PER_ROUND))
        target = config.recover_mb * 1_000_000
        written = 0
        progress = Progress("recover: writing", target, config.progress)
        while written < target:
            for batch in batches:
                append_batch(bytearray(batch))     # the log stamps offsets in place
                written += len(batch)
            progress.update(written)
        progress.done()
        reset_peak_rss()
        report = partition.recover()
        rss = peak_rss_mb()
        records = partition.log_end_offset
        mb_per_s = report.bytes_checked / report.seconds / 1e6
        out.append(Result("recover", f"logkit Partition.recover() over "
                          f"{report.bytes_checked / 1e6:,.0f} MB", records, report.seconds,
                          records / report.seconds, mb_per_s, peak_rss_mb=rss,
                          headline=True, extra={"gb_per_s": mb_per_s / 1000,
                                                "segments": report.segments_checked}))
        segment_paths = sorted(os.path.join(partition.directory, n)
                               for n in os.listdir(partition.directory) if n.endswith(".log"))
        broker.close()
        total_bytes = sum(os.path.getsize(p) for p in segment_paths)

        result = measure("recover", "read_header + CRC-32C per batch, nothing else "
                         "(physical limit)", records, 0, lambda: _crc_only(segment_paths))
        result.mb_per_s = total_bytes / result.seconds / 1e6
        out.append(result)
        out += _kafka_python_rows(segment_paths[0], total_bytes)
        out.append(_sqlite_row(cfg, os.path.join(path, "peer.db"),
                               min(records, config.peer_records_cap * 5)))
    return out


def _crc_only(segment_paths: list[str]) -> None:
    """Each batch's header read and its CRC-32C computed: the least a recovery can do."""
    from logkit.crc import crc32c
    from logkit.records import ATTRIBUTES_OFFSET, iter_batches
    for path in segment_paths:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            mm = mmap.mmap(f.fileno(), size, access=mmap.ACCESS_READ)
        view = memoryview(mm)
        try:
            for pos, header in iter_batches(mm, 0, size, path):
                crc32c(view[pos + ATTRIBUTES_OFFSET:pos + header.size])
        finally:
            view.release()
            mm.close()


def _kafka_python_rows(path: str, total_bytes: int) -> list[Result]:
    kp = kafka_python()
    if kp is None:
        return []
    limit = min(total_bytes, KAFKA_PYTHON_SCAN_BYTES_MAX)

    def kp_scan() -> None:
        with open(path, "rb") as f:
            batches = kp.MemoryRecords(f.read(limit))
        while (batch := batches.next_batch()) is not None:
            if not batch.validate_crc():
                raise RuntimeError("kafka-python rejects a logkit batch")

    result = measure("recover", "kafka-python DefaultRecordBatch.validate_crc "
                     f"(first {limit / 1e6:.0f} MB)", 0, 0, kp_scan)
    result.mb_per_s = limit / result.seconds / 1e6
    result.records_per_s = None
    return [result]


def _sqlite_row(config: BenchConfig, db_path: str, count: int) -> Result:
    db = sqlite_open(db_path, "NORMAL")
    try:
        sqlite_write(db, make_records(config, count), records_per_batch(config), 1)
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        db_bytes = os.path.getsize(db_path)
        result = measure("recover", f"SQLite PRAGMA quick_check ({db_bytes / 1e6:.0f} MB "
                         "database)", count, 0,
                         lambda: db.execute("PRAGMA quick_check").fetchall())
    finally:
        db.close()
    result.mb_per_s = db_bytes / result.seconds / 1e6
    result.records_per_s = count / result.seconds
    return result
