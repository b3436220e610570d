"""Compacted topics with offset gaps, for the tests of what reads above the log (the
consumer, the testing kit, the CLI, the listener, Spark): keyed records written in
small batches over several segments, the active segment rolled, cleaned by
`Partition.compact()`, and the survivors a dict model says must remain.

Owns nothing of the cleaner: it only drives the public API and says what Kafka's rule
leaves (the latest record of every key; a tombstone gone after the pass that first saw
it, once delete.retention.ms has passed).
"""

from __future__ import annotations

import time

COMPACTED = {"cleanup.policy": "compact", "segment.bytes": 1024,
             "delete.retention.ms": 0}
NO_CLEANER = {"log.cleaner.enable": False}       # the test decides when a pass runs


def fill_and_compact(broker, name, *, partitions=1, records=120, keys=7, batch=4,
                     unique_every=5, tombstones=(), config=None):
    """Create compacted topic `name`, write `records` keyed records per partition
    (key `k<n % keys>`, but `u<n>`, a key written once, for every `unique_every`-th
    record, so survivors are spread over the log and whole batches between them go;
    value `<partition>-<n>`; `batch` to a batch), then one
    tombstone per key in `tombstones`; roll and clean every partition (twice when there
    are tombstones, so they go). Returns {partition: [(offset, key, value), ...]}, the
    survivors in offset order."""
    topic = broker.create_topic(name, partitions, config={**COMPACTED, **(config or {})})
    expected = {}
    for number in range(partitions):
        partition = topic.partition(number)
        latest = {}
        for first in range(0, records, batch):
            rows = [(b"u%d" % n if unique_every and n % unique_every == 0
                     else b"k%d" % (n % keys), b"%d-%d" % (number, n), None, None)
                    for n in range(first, min(first + batch, records))]
            base = partition.append(rows)
            for i, row in enumerate(rows):
                latest[row[0]] = (base + i, row[1])
        if tombstones:
            rows = [(key, None, None, None) for key in tombstones]
            base = partition.append(rows)
            for i, row in enumerate(rows):
                latest[row[0]] = (base + i, None)
        partition.roll()
        partition.compact()
        if tombstones:
            partition.compact(now_ms=int(time.time() * 1000) + 60_000)
        expected[number] = sorted((offset, key, value) for key, (offset, value)
                                  in latest.items() if value is not None)
    return expected


def removed_offsets(partition, survivors):
    """The offsets in [log start, high watermark) that hold no surviving record."""
    kept = {offset for offset, _, _ in survivors}
    return [o for o in range(partition.log_start_offset, partition.high_watermark)
            if o not in kept]
