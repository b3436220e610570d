"""The JVM reader's planner: `python -m pyspark_logkit.plan`, one process per Spark
driver, started by the jar's reader (logkit.spark.Planner) and asked one JSON line per
batch query (and, for the jar's batch writer, the sink's driver side: its option and
column checks, and the commit and abort of the staged files).

Owns: turning the read options into what the JVM reads — per Spark input partition a
topic partition's offsets [start, end) and the byte ranges of the segment files that
hold them (`Partition.batch_file_ranges`: whole batches below each segment's published
end), each with its file's inode, and whether the topic is compacted (its cleaner may
swap a cleaned file in for a planned one while the query runs: the JVM reader sees
another inode and reads the cleaned file instead), and with
`kafka.isolation.level=read_committed` the aborted transactions overlapping each range
as [first offset, producer id] (`Partition.aborted_transactions`, a Fetch response's
list; the range already ends at or below the last stable offset), which the JVM reader
skips as Kafka's consumer does. Invariant: the options, offsets and range cuts are the Python source's own
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
from .writer import SinkOptions, _cleanup, append_staged

__all__ = ["plan", "plan_write", "answer", "main"]

log = logging.getLogger(__name__)

ALL_BYTES = 1 << 62                  # batch_file_ranges' byte budget: no limit
PLAN_ATTEMPTS = 5                    # a plan whose files changed under it is made again


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
                ranges = _file_ranges(partition, offset, part.end)
                break
            except logkit.OffsetOutOfRangeError:       # retention moved the log start
                offset = _past_lost(partition, part, offset, raced=True)
        aborted = []
        if source.isolation_level == "read_committed" and offset < part.end:
            aborted = sorted([first, pid] for pid, first in
                             partition.aborted_transactions(offset, part.end))
        out.append({"topic": part.topic, "partition": part.partition, "start": offset,
                    "end": part.end, "segments": ranges,
                    "compacted": "compact" in partition.config["cleanup.policy"],
                    "aborted": aborted})
    return {"ok": True, "failOnDataLoss": source.fail_on_data_loss, "partitions": out}


def _file_ranges(partition: logkit.Partition, start: int, end: int) -> list[list[Any]]:
    """[path, position, length, inode] of the batches holding [start, end): the inodes
    are taken between two identical plans, so each names the file the ranges are of
    (a cleaning pass that swapped a file between them makes the plan again)."""
    if start >= end:
        return []
    ranges = partition.batch_file_ranges(start, end, max_bytes=ALL_BYTES)
    for _ in range(PLAN_ATTEMPTS):
        inodes = [_inode(path) for path, _, _ in ranges]
        again = partition.batch_file_ranges(start, end, max_bytes=ALL_BYTES)
        if again == ranges and -1 not in inodes:
            return [[*r, inode] for r, inode in zip(ranges, inodes)]
        ranges = again
    return [[*r, -1] for r in ranges]        # unchecked: the reader reads them as planned


def _inode(path: str) -> int:
    try:
        return os.stat(path).st_ino
    except FileNotFoundError:
        return -1


def plan_write(options: dict[str, str], schema_json: str) -> dict[str, Any]:
    """The JVM writer's plan: the Python sink's checks of the options and columns (and
    its topic creation), the topic's partition count and batch size limit, and a
    staging directory of its own."""
    import uuid

    from pyspark.sql.datasource import CaseInsensitiveDict
    from pyspark.sql.types import StructType
    sink = SinkOptions(CaseInsensitiveDict(options),
                       StructType.fromJson(json.loads(schema_json)), streaming=False)
    topic = broker_for(sink.path).topic(sink.topic)
    return {"ok": True, "path": sink.path, "topic": sink.topic, "writerId": uuid.uuid4().hex,
            "partitions": topic.num_partitions,
            "limitBytes": topic.config["max.message.bytes"] // 2,
            "compacted": "compact" in topic.config["cleanup.policy"],
            "cleanupPolicy": topic.config["cleanup.policy"]}


def answer(request: dict[str, Any]) -> dict[str, Any]:
    """One request of the jar: op "read" (default), "write", "commit" or "abort"."""
    op = request.get("op", "read")
    if op == "read":
        return plan(request["options"])
    if op == "write":
        return plan_write(request["options"], request["schema"])
    if op == "commit":              # the Python batch sink's commit, as it is
        try:
            append_staged(request["path"], request["files"], sink_id=None, batch_id=None)
        finally:
            _cleanup(request["path"], request["writerId"])
        return {"ok": True}
    if op == "abort":
        _cleanup(request["path"], request["writerId"])
        return {"ok": True}
    raise ValueError(f"unknown planner request {op!r}")


def serve(requests: TextIO, replies: TextIO) -> None:
    """Answer one JSON request line with one JSON reply line until stdin closes."""
    for line in requests:
        if not line.strip():
            continue
        try:
            reply = answer(json.loads(line))
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
