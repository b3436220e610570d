"""The JVM reader's planner: `python -m pyspark_logkit.plan`, one process per Spark
driver, started by the jar's reader (logkit.spark.Planner) and asked one JSON line per
batch query.

Owns: turning the read options into what the JVM reads — per Spark input partition a
topic partition's offsets [start, end) and the byte ranges of the segment files that
hold them (`Partition.batch_file_ranges`: whole batches below each segment's published
end). Invariant: the options, offsets and range cuts are the Python source's own
(`SourceOptions`, `LogkitBatchReader`), so both readers read the same records; a refused
option answers {"ok": false, "error": "LogkitSparkError: logkit: ..."} and the JVM fails
the query on the driver with that message.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from typing import Any, TextIO

import logkit

from .brokers import broker_for
from .options import SourceOptions
from .reader import LogkitBatchReader, _past_lost

__all__ = ["plan", "main"]

log = logging.getLogger(__name__)

ALL_BYTES = 1 << 62                  # batch_file_ranges' byte budget: no limit


def plan(options: dict[str, str]) -> dict[str, Any]:
    """The JVM reader's plan for a batch read with these options."""
    source = SourceOptions(options, streaming=False)
    reader = LogkitBatchReader(source)
    broker = broker_for(source.path)
    out = []
    for part in reader.partitions():
        partition = broker.topic(part.topic).partition(part.partition)
        offset = _past_lost(partition, part, part.start)
        while True:
            try:
                ranges = (partition.batch_file_ranges(offset, part.end, max_bytes=ALL_BYTES)
                          if offset < part.end else [])
                break
            except logkit.OffsetOutOfRangeError:       # retention moved the log start
                offset = _past_lost(partition, part, offset, raced=True)
        out.append({"topic": part.topic, "partition": part.partition, "start": offset,
                    "end": part.end, "segments": [list(r) for r in ranges]})
    return {"ok": True, "failOnDataLoss": source.fail_on_data_loss, "partitions": out}


def serve(requests: TextIO, replies: TextIO) -> None:
    """Answer one JSON request line with one JSON reply line until stdin closes."""
    for line in requests:
        if not line.strip():
            continue
        try:
            reply = plan(json.loads(line)["options"])
        except logkit.LogkitError as exc:
            reply = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        except Exception as exc:       # noqa: BLE001 - the JVM raises it on the driver
            log.warning("planning a JVM read failed: %r", exc)
            reply = {"ok": False, "error": f"logkit: planning the read failed: "
                                           f"{type(exc).__name__}: {exc}"}
        replies.write(json.dumps(reply) + "\n")
        replies.flush()


def main() -> int:
    # replies go to the real stdout only: anything printed by accident goes to stderr
    replies = os.fdopen(os.dup(sys.stdout.fileno()), "w")
    sys.stdout = sys.stderr
    serve(sys.stdin, replies)
    return 0


if __name__ == "__main__":
    sys.exit(main())
