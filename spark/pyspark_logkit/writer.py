"""Writing DataFrames into topics: batch and streaming sinks, exactly-once.

Owns: turning Arrow record batches (columns `key`/`value` binary or string, optional
`topic`, `partition`, `headers`) into Kafka record batches, the staging files tasks
write, and the driver-side commit that appends them.

How a write runs. Each task encodes its rows as Kafka record batches (keys partitioned
by murmur2 like the producer; null keys stick to one partition per task and topic) and
writes them to a staging file under `<path>/.spark-staging/<writer>/` (a random id for
a batch write; for a stream, a name derived from the query's identity, because Spark
commits a micro-batch with a writer object built afresh); it appends nothing. The
driver's `commit` appends the staged batches of every successful task, in task order,
then deletes the staging directory — including files left by failed task attempts,
which were never in a commit message. `abort` deletes the directory. So a failed job
leaves no records and no files.

Exactly-once for streams. The sink's identity is the `sinkId` option, else Spark's
query id read from `<checkpointLocation>/metadata` (stable across restarts of one
query, new when the checkpoint is deleted), else the checkpoint path, else the query
name; a streaming write without any of them is refused. Every record batch the sink
appends carries Kafka's idempotent-producer fields: a producer id derived from that
identity (a new one every 2^15 micro-batches), the micro-batch id as epoch (mod 2^15)
and, per partition, Kafka's sequence numbering (the records before the batch in that
micro-batch), which the log's producer state checks. Before appending micro-batch
N, the commit records in LMDB (sub-database `spark`) the log end offset of every
partition it will touch; after appending it records N as committed. A replay of N —
Spark crashed between our commit and its checkpoint — finds N committed and appends
nothing; a replay after a crash in the middle of our commit scans the touched partitions
from the recorded offsets for batches with this producer id, epoch and sequence, and
appends only the missing ones. Invariant: each staged batch of a micro-batch is in the
log at most once, whatever replays happen.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
import shutil
import struct
import uuid
from dataclasses import dataclass
from typing import Any, Iterator, Mapping

import pyarrow as pa
from pyspark.sql.datasource import (DataSourceArrowWriter, DataSourceStreamArrowWriter,
                                    WriterCommitMessage)
from pyspark.sql.types import (ArrayType, BinaryType, IntegerType, StringType, StructField,
                               StructType)

import logkit

from . import typed as typed_columns
from .brokers import broker_for
from .options import LogkitSparkError, checked, split_options

__all__ = ["LogkitBatchWriter", "LogkitStreamWriter", "SinkOptions"]

log = logging.getLogger(__name__)

STAGING_DIR = ".spark-staging"
STAGED_BATCH_RECORDS = 2000
_FRAME = struct.Struct(">HiI")                # topic length, partition, batch length


class SinkOptions:
    """Write options, checked on the driver."""

    def __init__(self, options: Mapping[str, str], schema: StructType, *,
                 streaming: bool) -> None:
        checked(options, write=True)
        # `options` is Spark's case-insensitive dict: a plain dict copy of it has
        # lower-cased keys, and options.get("sinkId") would then miss.
        self.path = options.get("path")
        if not self.path:
            raise LogkitSparkError("logkit: option 'path' is required: the broker directory")
        self.path = os.path.abspath(self.path)
        self.topic = options.get("topic")
        if self.topic is None and "topic" not in schema.fieldNames():
            raise LogkitSparkError("logkit: set the 'topic' option or add a 'topic' column")
        broker = broker_for(self.path)
        if self.topic is not None:
            try:
                broker.get_or_create_topic(self.topic)
            except logkit.LogkitError as exc:
                raise LogkitSparkError(f"logkit: cannot write to topic {self.topic!r}: "
                                       f"{exc}") from None
        # typed key/value columns: encoded with the subject's schema, Confluent-framed
        self.typed = typed_columns.resolve(broker, split_options(options)[1], self.topic,
                                           write=True)
        _check_columns(schema, self.typed)
        self.sink_id = options.get("sinkId")
        self.checkpoint = options.get("checkpointLocation")
        self.query_name = options.get("queryName")
        if streaming and not (self.sink_id or self.checkpoint or self.query_name):
            raise LogkitSparkError(
                "logkit: a streaming write needs an identity that survives restarts, for "
                "its exactly-once commits: set option('checkpointLocation', ...), or "
                "queryName(...) with spark.sql.streaming.checkpointLocation, or "
                "option('sinkId', ...)")

    def staging_name(self) -> str:
        """The stream's staging directory name: the same in the planner that pickles
        the task writer and in the commit runner, which builds its own writer."""
        identity = (f"sinkId:{self.sink_id}" if self.sink_id else
                    f"checkpoint:{self.checkpoint}" if self.checkpoint else
                    f"queryName:{self.query_name}")
        return "stream-" + hashlib.sha256(identity.encode()).hexdigest()[:20]

    def commit_key(self) -> str:
        """Whose micro-batch ids the commit log tracks: the `sinkId` option, else the
        streaming query's id (Spark keeps it in <checkpoint>/metadata, so it survives
        restarts and changes when the checkpoint is deleted), else the checkpoint path,
        else the query name. Called on the driver at commit time, when the metadata
        file exists."""
        if self.sink_id:
            return self.sink_id
        if self.checkpoint:
            local = self.checkpoint[len("file:"):] if self.checkpoint.startswith("file:") \
                else self.checkpoint
            try:
                with open(os.path.join(local, "metadata"), encoding="utf-8") as f:
                    return "query:" + json.loads(f.readline())["id"]
            except (OSError, ValueError, KeyError):
                return "checkpoint:" + self.checkpoint     # not a local file system
        return "queryName:" + str(self.query_name)


_HEADERS = ArrayType(StructType([StructField("key", StringType()),
                                 StructField("value", BinaryType())]))


def _check_columns(schema: StructType, typed: Mapping[str, Any] | None = None) -> None:
    """The DataFrame's columns, checked on the driver before any task runs: `value`
    (and `key`) binary or string (or, typed, whatever the schema encodes), `topic`
    string, `partition` int, `headers` as the source's headers column. Other columns are
    ignored, as Spark's Kafka sink does."""
    types = {field.name: field.dataType for field in schema.fields}
    if "value" not in types:
        raise LogkitSparkError("logkit: the DataFrame needs a 'value' column (binary or "
                               f"string); it has {schema.fieldNames()}")
    wanted = {"key": "binary or string", "value": "binary or string", "topic": "string",
              "partition": "int", "headers": "array<struct<key:string,value:binary>>"}
    for name, kind in wanted.items():
        if name not in types or name in (typed or {}):
            continue
        data_type = types[name]
        ok = (isinstance(data_type, (BinaryType, StringType)) if kind == "binary or string"
              else isinstance(data_type, StringType) if kind == "string"
              else isinstance(data_type, IntegerType) if kind == "int"
              else _same_headers(data_type))
        if not ok:
            raise LogkitSparkError(f"logkit: column {name!r} must be {kind}, got "
                                   f"{data_type.simpleString()}; cast it, e.g. "
                                   f"CAST({name} AS STRING)")


def _same_headers(data_type: Any) -> bool:
    if not isinstance(data_type, ArrayType) or not isinstance(data_type.elementType,
                                                              StructType):
        return False
    fields = data_type.elementType.fields
    return ([f.name for f in fields] == ["key", "value"]
            and isinstance(fields[0].dataType, StringType)
            and isinstance(fields[1].dataType, (BinaryType, StringType)))


@dataclass
class StagedFile(WriterCommitMessage):
    path: str
    records: int
    task_order: int


def _column(batch: pa.RecordBatch, name: str) -> list | None:
    index = batch.schema.get_field_index(name)
    if index < 0:
        return None
    column = batch.column(index)
    if name in ("key", "value") and pa.types.is_string(column.type):
        column = column.cast(pa.binary())     # UTF-8 bytes, in C++, not per row
    return column.to_pylist()


def _as_bytes(value: Any) -> bytes | None:
    if value is None or isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, (bytearray, memoryview)):
        return bytes(value)
    raise LogkitSparkError(f"logkit: key/value must be binary or string, got {type(value)}")


class _Slots:
    """A task's pending rows per (topic, partition), emitted as Kafka record batches
    under STAGED_BATCH_RECORDS records and half the topic's max.message.bytes (Kafka's
    limit counts the whole batch)."""

    def __init__(self, out: Any) -> None:
        self.out = out
        self.builders: dict[tuple[str, int], logkit.BatchBuilder] = {}

    def add(self, slot: tuple[str, int], key: bytes | None, value: bytes | None,
            headers: list | None, limit_bytes: int) -> None:
        builder = self.builders.get(slot)
        if builder is not None:
            if builder.try_append(key, value, headers):
                return
            self.emit(slot)
        builder = self.builders[slot] = logkit.BatchBuilder(
            limit_bytes=limit_bytes, max_records=STAGED_BATCH_RECORDS)
        builder.append(key, value, headers)

    def emit(self, slot: tuple[str, int]) -> None:
        encoded = self.builders.pop(slot).build()
        name = slot[0].encode()
        self.out.write(_FRAME.pack(len(name), slot[1], len(encoded)))
        self.out.write(name)
        self.out.write(encoded)

    def emit_all(self) -> None:
        for slot in list(self.builders):
            self.emit(slot)


def _encoded(broker: logkit.Broker, batch: pa.RecordBatch, side: str,
             typed: Mapping[str, Any], topic: str | None, first_row: int) -> list | None:
    """The key or value column as bytes: typed ones encoded by their schema."""
    spec = typed.get(side)
    if spec is None:
        return _column(batch, side)
    index = batch.schema.get_field_index(side)
    if index < 0:
        return None
    return typed_columns.encode_column(broker, spec, topic or "spark", batch.column(index),
                                       first_row)


def _keyless(topic: str, policy: str) -> str:
    return (f"logkit: topic {topic!r} is compacted (cleanup.policy={policy}): every row "
            "needs a non-null 'key' (a keyless record is refused, as Kafka refuses it); "
            "nothing of this write was appended")


def stage(path: str, writer_id: str, default_topic: str | None,
          batches: Iterator[pa.RecordBatch],
          typed: Mapping[str, Any] | None = None) -> StagedFile:
    """Encode rows as Kafka batches into one staging file (runs on a Spark worker).
    Keyed rows go to murmur2(key) like the producer; null keys stick to one random
    partition per topic for this task, like the producer's sticky partitioner."""
    broker = broker_for(path)
    directory = os.path.join(path, STAGING_DIR, writer_id)
    os.makedirs(directory, exist_ok=True)
    file_path = os.path.join(directory, f"{uuid.uuid4().hex}.stage")
    rng = random.Random()
    # name -> topic, partitions, batch byte limit, compacted (null keys refused)
    topics: dict[str, tuple[Any, int, int, bool]] = {}
    sticky: dict[str, int] = {}
    total = 0
    with open(file_path, "wb") as out:
        slots = _Slots(out)
        for batch in batches:
            count = batch.num_rows
            keys = _encoded(broker, batch, "key", typed or {}, default_topic, total) \
                or [None] * count
            values = _encoded(broker, batch, "value", typed or {}, default_topic, total)
            names = _column(batch, "topic") if default_topic is None else None
            partitions = _column(batch, "partition")
            headers = _column(batch, "headers")
            for i in range(count):
                name = default_topic or names[i]
                if not name:
                    raise LogkitSparkError("logkit: a row has no topic (null 'topic' column "
                                           "and no 'topic' option)")
                known = topics.get(name)
                if known is None:
                    topic = broker.get_or_create_topic(name)
                    known = topics[name] = (topic, topic.num_partitions,
                                            topic.config["max.message.bytes"] // 2,
                                            "compact" in topic.config["cleanup.policy"])
                topic, num_partitions, limit_bytes, compacted = known
                key = keys[i]
                if key is None and compacted:
                    raise LogkitSparkError(_keyless(name, topic.config["cleanup.policy"]))
                if partitions is not None and partitions[i] is not None:
                    number = partitions[i]
                    if not 0 <= number < num_partitions:
                        raise LogkitSparkError(f"logkit: partition {number} does not exist "
                                               f"in topic {name!r} ({num_partitions} "
                                               "partitions); as with Spark's Kafka sink, "
                                               "a 'partition' column picks the partition: "
                                               "to let keys choose, select the columns to "
                                               "write, e.g. df.select('key', 'value')")
                elif key is not None:
                    number = topic.partition_for(key)
                else:
                    number = sticky.get(name)
                    if number is None:
                        number = sticky[name] = rng.randrange(num_partitions)
                row_headers = None
                if headers is not None and headers[i]:
                    row_headers = [(h["key"], _as_bytes(h["value"])) for h in headers[i]]
                slots.add((name, number), key, values[i], row_headers, limit_bytes)
            total += count
        slots.emit_all()
        out.flush()
        os.fsync(out.fileno())
    return StagedFile(file_path, total, 0)


def read_staged(file_path: str) -> Iterator[tuple[str, int, bytearray]]:
    with open(file_path, "rb") as f:
        data = f.read()
    pos = 0
    while pos < len(data):
        name_length, partition, length = _FRAME.unpack_from(data, pos)
        pos += _FRAME.size
        topic = data[pos:pos + name_length].decode()
        pos += name_length
        yield topic, partition, bytearray(data[pos:pos + length])
        pos += length


EPOCHS_PER_PRODUCER_ID = 32768      # a producer epoch is an int16 that may only grow
_LAST_OFFSET_DELTA = struct.Struct(">i")    # a Kafka v2 batch's lastOffsetDelta field ...
_LAST_OFFSET_DELTA_AT = 23                  # ... at this byte (docs/design.md §3)


def _producer_id(sink_id: str, batch_id: int = 0) -> int:
    """The sink's producer id for a micro-batch, whose epoch is batch_id % 32768: a new
    id every 32768 micro-batches, so the log's producer state never sees an epoch go
    back (the first block keeps the id of the sink alone)."""
    block = batch_id // EPOCHS_PER_PRODUCER_ID
    name = sink_id if block == 0 else f"{sink_id}/{block}"
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big") >> 1


def _cleanup(path: str, writer_id: str) -> None:
    shutil.rmtree(os.path.join(path, STAGING_DIR, writer_id), ignore_errors=True)


def append_staged(path: str, files: list[str], *, sink_id: str | None,
                  batch_id: int | None) -> int:
    """Append staged batches (driver). With sink_id/batch_id: exactly once per batch id."""
    broker = broker_for(path)
    staged = [frame for f in files for frame in read_staged(f)]
    if sink_id is None:
        for topic, partition, batch in staged:
            broker.topic(topic).partition(partition).append_batch(batch)
        return len(staged)
    meta = broker.meta
    key = sink_id.encode()
    with meta.begin() as txn:
        raw = txn.get(key, db=meta.db("spark"))
    state = json.loads(raw) if raw else {"committed": -1, "intent": None}
    if batch_id <= state["committed"]:               # a replay of a committed batch
        log.debug("sink %s: micro-batch %d is already committed (a replay): nothing "
                  "appended", sink_id, batch_id)
        return 0
    producer_id = _producer_id(sink_id, batch_id)
    epoch = batch_id % EPOCHS_PER_PRODUCER_ID
    intent = state.get("intent")
    present: set[tuple[str, int, int]] = set()
    if intent and intent["batch"] == batch_id:       # crashed mid-commit: what got in?
        for slot, start in intent["starts"].items():
            topic, partition = slot.rsplit("/", 1)
            for header in broker.topic(topic).partition(int(partition)).batch_headers(start):
                if header.producer_id == producer_id and header.producer_epoch == epoch:
                    present.add((topic, int(partition), header.base_sequence))
        log.warning("sink %s: micro-batch %d resumes a commit that stopped half-way: %d of "
                    "its %d staged batch(es) were already appended", sink_id, batch_id,
                    len(present), len(staged))
    else:
        starts = {f"{t}/{p}": broker.topic(t).partition(p).log_end_offset
                  for t, p, _ in staged}
        state["intent"] = {"batch": batch_id, "starts": starts}
        with meta.begin(write=True) as txn:
            txn.put(key, json.dumps(state).encode(), db=meta.db("spark"))
    appended = 0
    # Kafka's numbering, which the log's producer state checks: per partition, each
    # batch's base sequence counts the records before it in this epoch.
    next_sequence: dict[tuple[str, int], int] = {}
    for topic, partition, batch in staged:
        sequence = next_sequence.get((topic, partition), 0)
        next_sequence[(topic, partition)] = sequence + \
            _LAST_OFFSET_DELTA.unpack_from(batch, _LAST_OFFSET_DELTA_AT)[0] + 1
        if (topic, partition, sequence) in present:
            continue
        logkit.stamp_producer(batch, producer_id, epoch, sequence)
        broker.topic(topic).partition(partition).append_batch(batch)
        appended += 1
    state["committed"], state["intent"] = batch_id, None
    with meta.begin(write=True) as txn:
        txn.put(key, json.dumps(state).encode(), db=meta.db("spark"))
    return appended


class _StagingWriter:
    """What the batch and stream sinks share: tasks stage, the driver appends."""

    def __init__(self, options: SinkOptions, writer_id: str) -> None:
        self.options = options
        self.writer_id = writer_id

    def write(self, iterator: Iterator[pa.RecordBatch]) -> StagedFile:
        return stage(self.options.path, self.writer_id, self.options.topic, iterator,
                     self.options.typed)

    def _commit(self, messages: list[StagedFile | None], *, sink_id: str | None,
                batch_id: int | None) -> None:
        try:
            append_staged(self.options.path, [m.path for m in messages if m is not None],
                          sink_id=sink_id, batch_id=batch_id)
        finally:
            _cleanup(self.options.path, self.writer_id)


class LogkitBatchWriter(_StagingWriter, DataSourceArrowWriter):
    """`df.write.format("logkit")`: all rows appear, or none do. Spark commits with the
    very writer object its tasks ran, so a random staging id is shared by both."""

    def __init__(self, options: SinkOptions) -> None:
        super().__init__(options, uuid.uuid4().hex)

    def commit(self, messages: list[StagedFile | None]) -> None:
        self._commit(messages, sink_id=None, batch_id=None)

    def abort(self, messages: list[StagedFile | None]) -> None:
        _cleanup(self.options.path, self.writer_id)


class LogkitStreamWriter(_StagingWriter, DataSourceStreamArrowWriter):
    """`writeStream.format("logkit")`: exactly once per micro-batch id.

    Spark's commit runner builds a new writer for every commit, so the staging directory
    is named from the query's identity, not from this object. Micro-batches run one after
    another, so when batch N commits or aborts, every file in that directory belongs to
    batch N (or to attempts that died): committing appends the files named in the
    messages and then removes the directory."""

    def __init__(self, options: SinkOptions) -> None:
        super().__init__(options, options.staging_name())

    def commit(self, messages: list[StagedFile | None], batchId: int) -> None:
        self._commit(messages, sink_id=self.options.commit_key(), batch_id=batchId)

    def abort(self, messages: list[StagedFile | None], batchId: int) -> None:
        _cleanup(self.options.path, self.writer_id)
