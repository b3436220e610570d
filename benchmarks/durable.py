"""The durable benchmark: the produce benchmark with an fsync behind every appended batch
(topic config flush.messages=1), beside SQLite with synchronous=FULL, persist-queue and
`os.write` + `fsync` of the same batches (the disk's limit).

Owns: the `durable` rows; the measurement itself is `produce.produce_rows`, so the two
benchmarks cannot drift apart.
"""

from __future__ import annotations

from ._common import BenchConfig, Result
from .produce import produce_rows


def run(config: BenchConfig) -> list[Result]:
    return produce_rows(config, durable=True)
