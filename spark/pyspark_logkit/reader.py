"""Reading topics into Spark: the batch reader and the micro-batch stream reader.

Owns: the schema (Spark's Kafka source schema), turning a partition's offset range into
Arrow record batches on a Spark worker, resolving starting/ending offsets, the streaming
offsets `{"topic": {"0": n}}`, read limits (`maxOffsetsPerTrigger`), Trigger.AvailableNow,
and data-loss handling (`failOnDataLoss`). Invariant: an input partition covers one topic
partition's [start, end) offsets and yields exactly the records in that range that still
exist; a range partly removed by retention (below the log start) raises
(failOnDataLoss=true) or is skipped. Offsets a compacted topic's cleaner removed inside
the log are not data loss (Spark's Kafka source learned the same): the reads step over
them (`Partition.fetch_records`' next offset) and return the survivors. With
`kafka.isolation.level=read_committed` every 'latest' offset (a batch read's end, a
stream's latest) is the partition's last stable offset, so no read passes an open
transaction, and aborted transactions' records are left out.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Iterator

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.pandas.types import from_arrow_type
from pyspark.sql.streaming.datasource import (ReadAllAvailable, ReadMaxRows,
                                              SupportsTriggerAvailableNow)
from pyspark.sql.types import (ArrayType, BinaryType, IntegerType, LongType, StringType,
                               StructField, StructType, TimestampType)

import logkit

from . import typed as typed_columns
from .brokers import broker_for
from .options import EARLIEST, LATEST, LogkitSparkError, SourceOptions

__all__ = ["schema", "resolve_typed", "LogkitBatchReader", "LogkitStreamReader"]

log = logging.getLogger(__name__)

CHUNK_RECORDS = 20_000          # records decoded per Arrow batch on a worker


def schema(include_headers: bool, types: dict[str, pa.DataType] | None = None
           ) -> StructType:
    """Spark's Kafka source schema; `types` gives typed key/value columns their Arrow
    type (their Spark type is pyspark's mapping of it)."""
    types = types or {}
    fields = [StructField(side, from_arrow_type(types[side]) if side in types
                          else BinaryType()) for side in ("key", "value")]
    fields += [StructField("topic", StringType()), StructField("partition", IntegerType()),
               StructField("offset", LongType()), StructField("timestamp", TimestampType()),
               StructField("timestampType", IntegerType())]
    if include_headers:
        fields.append(StructField("headers", ArrayType(StructType([
            StructField("key", StringType()), StructField("value", BinaryType())]))))
    return StructType(fields)


def _arrow_schema(include_headers: bool, types: dict[str, pa.DataType] | None = None
                  ) -> pa.Schema:
    types = types or {}
    fields = [("key", types.get("key", pa.binary())),
              ("value", types.get("value", pa.binary())),
              ("topic", pa.string()), ("partition", pa.int32()), ("offset", pa.int64()),
              ("timestamp", pa.timestamp("us", tz="UTC")), ("timestampType", pa.int32())]
    if include_headers:
        fields.append(("headers", pa.list_(pa.struct([("key", pa.string()),
                                                      ("value", pa.binary())]))))
    return pa.schema(fields)


@dataclass
class OffsetRange(InputPartition):
    """One topic partition's offsets [start, end) for one Spark task."""

    path: str
    topic: str
    partition: int
    start: int
    end: int
    include_headers: bool
    fail_on_data_loss: bool
    typed: dict[str, typed_columns.Typed]
    isolation_level: str

    def __init__(self, path: str, topic: str, partition: int, start: int, end: int,
                 include_headers: bool, fail_on_data_loss: bool,
                 typed: dict[str, typed_columns.Typed] | None = None,
                 isolation_level: str = "read_uncommitted") -> None:
        super().__init__((topic, partition, start, end))
        self.path, self.topic, self.partition = path, topic, partition
        self.start, self.end = start, end
        self.include_headers, self.fail_on_data_loss = include_headers, fail_on_data_loss
        self.typed = typed or {}
        self.isolation_level = isolation_level


def read_range(part: OffsetRange) -> Iterator[pa.RecordBatch]:
    """Arrow batches of the records in part's range (runs on a Spark worker)."""
    if not isinstance(part, OffsetRange):
        return      # PySpark reads one placeholder partition when partitions() is empty
    broker = broker_for(part.path)
    partition = broker.topic(part.topic).partition(part.partition)
    types = {side: typed_columns.arrow_type(broker, spec)
             for side, spec in part.typed.items()}
    arrow_schema = _arrow_schema(part.include_headers, types)
    offset = _past_lost(partition, part, part.start)
    if not part.include_headers and not part.typed:
        yield from _read_columns(partition, part, offset, arrow_schema,
                                 _aborted_spans(partition, part))
        return
    while offset < part.end:
        try:
            fetched = partition.fetch_records(offset, min(CHUNK_RECORDS, part.end - offset),
                                              stop_offset=part.end,
                                              isolation_level=part.isolation_level)
        except logkit.OffsetOutOfRangeError:
            offset = _past_lost(partition, part, offset, raced=True)
            continue
        records = fetched.records
        if not records:
            if fetched.next_offset <= offset:    # the end: nothing more below part.end
                break
            offset = fetched.next_offset         # past batches compaction emptied
            continue
        offset = fetched.next_offset
        count = len(records)
        # One C-level transpose of the Record tuples, then one Arrow array per column.
        _, _, offsets, timestamps, keys, values, headers = zip(*records)
        columns = [
            _typed(broker, part, "key", offsets, keys),
            _typed(broker, part, "value", offsets, values),
            _repeat(part.topic, pa.string(), count),
            _repeat(part.partition, pa.int32(), count),
            pa.array(offsets, pa.int64()),
            pc.multiply(pa.array(timestamps, pa.int64()), 1000)
            .cast(pa.timestamp("us", tz="UTC")),
            _repeat(0, pa.int32(), count),
        ]
        if part.include_headers:
            columns.append(pa.array([[{"key": k, "value": v} for k, v in h] for h in headers],
                                    arrow_schema.field("headers").type))
        yield pa.RecordBatch.from_arrays(columns, schema=arrow_schema)


ATTR_TRANSACTIONAL, ATTR_CONTROL = 0x10, 0x20       # a batch's attributes (Kafka's)


def _aborted_spans(partition: logkit.Partition, part: OffsetRange) -> list[list[int]]:
    """read_committed: the [first, end) offsets of the batches of aborted transactions
    in part's range, which the columnar path steps over (empty for read_uncommitted, or
    a range without aborted transactions). Kafka's consumer rule over the batch
    headers: a producer is aborting from its aborted transaction's first offset (the
    `.txnindex`'s list) to its next control batch (the ABORT marker); its transactional
    batches in between are left out. Control batches add no rows in any case."""
    if part.isolation_level != "read_committed":
        return []
    aborted = sorted((first, producer) for producer, first in
                     partition.aborted_transactions(part.start, part.end))
    if not aborted:
        return []
    spans: list[list[int]] = []
    aborting: set[int] = set()
    listed = 0
    for header in partition.batch_headers(aborted[0][0]):
        if header.base_offset >= part.end:
            break
        while listed < len(aborted) and aborted[listed][0] <= header.last_offset:
            aborting.add(aborted[listed][1])
            listed += 1
        if header.attributes & ATTR_CONTROL:
            aborting.discard(header.producer_id)
        elif header.attributes & ATTR_TRANSACTIONAL and header.producer_id in aborting:
            if spans and spans[-1][1] == header.base_offset:
                spans[-1][1] = header.last_offset + 1
            else:
                spans.append([header.base_offset, header.last_offset + 1])
    return spans


def _typed(broker: logkit.Broker, part: OffsetRange, side: str, offsets: tuple,
           data: tuple) -> pa.Array:
    """The key or value column: bytes, or decoded into its typed column."""
    spec = part.typed.get(side)
    if spec is None:
        return pa.array(data, pa.binary())
    return typed_columns.decode_column(broker, spec, part.topic, part.partition, offsets,
                                       list(data))


def _repeat(value: Any, type_: pa.DataType, count: int) -> pa.Array:
    """A constant column (topic, partition, timestampType), built in C++: a Python list
    of 20,000 topic names cost more than decoding the records."""
    return pa.repeat(pa.scalar(value, type_), count)


def _binary(count: int, nulls: pa.Array, bit: int, ends: bytearray,
            data: bytearray) -> pa.Array:
    validity = None
    if pc.any(pc.not_equal(pc.bit_wise_and(nulls, bit), 0)).as_py():
        validity = pc.equal(pc.bit_wise_and(nulls, bit), 0).buffers()[1]
    return pa.Array.from_buffers(pa.binary(), count,
                                 [validity, pa.py_buffer(ends), pa.py_buffer(data)])


def _past_lost(partition: logkit.Partition, part: OffsetRange, offset: int, *,
               raced: bool = False) -> int:
    """Where to read from when `offset` may be below the log start (retention removed
    it): raise per failOnDataLoss, or skip to the log start. `raced`: a read said the
    offset is out of range, so it must be below the start (retention ran while this
    task read), else the error is not data loss and goes up as it is."""
    start = partition.log_start_offset
    if offset >= start:
        if raced:
            raise LogkitSparkError(f"logkit: offset {offset} of {part.topic}-"
                                   f"{part.partition} is out of range (log start {start}, "
                                   f"high watermark {partition.high_watermark})")
        return offset
    if part.fail_on_data_loss:
        raise LogkitSparkError(
            f"logkit: offsets {offset}..{start - 1} of {part.topic}-{part.partition} were "
            "removed by retention before they were read. Set failOnDataLoss=false to skip "
            "them.")
    log.warning("offsets %d..%d of %s-%d were removed by retention before they were "
                "read; skipped (failOnDataLoss=false)", offset, start - 1, part.topic,
                part.partition)
    return start


def _read_columns(partition: logkit.Partition, part: OffsetRange, offset: int,
                  arrow_schema: pa.Schema, skips: list[list[int]]
                  ) -> Iterator[pa.RecordBatch]:
    """The fast path (no headers): batches decoded straight into Arrow buffers
    (`logkit.Columns`, whose buffers are Arrow's layout as they stand), stepping over
    the `skips` spans (aborted transactions' batches, read_committed)."""
    skips = list(skips)
    while offset < part.end:
        while skips and offset >= skips[0][0]:
            offset = max(offset, skips.pop(0)[1])
        if offset >= part.end:
            break
        stop = min(part.end, skips[0][0]) if skips else part.end
        try:
            columns, after = partition.read_columns(offset, CHUNK_RECORDS,
                                                    stop_offset=stop)
        except logkit.OffsetOutOfRangeError:
            offset = _past_lost(partition, part, offset, raced=True)
            continue
        count = columns.count
        if not count:
            if after <= offset:                  # the end: nothing more below part.end
                break
            offset = after                       # past batches compaction emptied
            continue
        offset = after
        yield columns_batch(part, arrow_schema, columns)


def latest_offset(partition: logkit.Partition, isolation_level: str) -> int:
    """Where 'latest' is: the high watermark, or with read_committed the last stable
    offset (the first offset of the oldest open transaction), as Kafka's consumer
    answers a read_committed ListOffsets."""
    if isolation_level == "read_committed":
        return partition.last_stable_offset
    return partition.high_watermark


def _resolve(spec: Any, tps: list[logkit.TopicPartition], broker: logkit.Broker,
             *, default: int, name: str, isolation_level: str = "read_uncommitted",
             cap: bool = False) -> dict[logkit.TopicPartition, int]:
    """Concrete offsets for 'earliest'/'latest'/JSON specs. `cap`: an ending offset,
    which read_committed holds at the last stable offset (no read passes an open
    transaction)."""
    out = {}
    for tp in tps:
        partition = broker.topic(tp.topic).partition(tp.partition)
        if spec == "earliest":
            wanted = EARLIEST
        elif spec == "latest":
            wanted = LATEST
        else:
            wanted = spec.get(tp.topic, {}).get(tp.partition, default)
        if wanted == EARLIEST:
            out[tp] = partition.log_start_offset
        elif wanted == LATEST:
            out[tp] = latest_offset(partition, isolation_level)
        else:
            if wanted > partition.high_watermark:
                raise LogkitSparkError(f"logkit: {name} offset {wanted} of "
                                       f"{tp.topic}-{tp.partition} is beyond its end "
                                       f"({partition.high_watermark})")
            if cap and isolation_level == "read_committed":
                wanted = min(wanted, partition.last_stable_offset)
            out[tp] = wanted
    if isinstance(spec, dict):
        known = {(tp.topic, tp.partition) for tp in tps}
        for topic, partitions in spec.items():
            for number in partitions:
                if (topic, number) not in known:
                    raise LogkitSparkError(f"logkit: {name} names {topic}-{number}, which "
                                           "this query does not read")
    return out


def resolve_typed(options: SourceOptions, declared: StructType | None = None
                  ) -> dict[str, typed_columns.Typed]:
    """The typed key/value columns of a read (driver); with `declared`, the schema Spark
    planned with, which they must still give (a new registered version between planning
    and reading would change it)."""
    broker = broker_for(options.path)
    chosen = typed_columns.resolve(broker, options.typed_options, options.single_topic(),
                                   write=False)
    if declared is not None:
        planned = {f.name: f.dataType for f in declared.fields}
        for side, spec in chosen.items():
            wanted = from_arrow_type(typed_columns.arrow_type(broker, spec))
            if side in planned and planned[side] != wanted:
                raise LogkitSparkError(
                    f"logkit: the {side} column's schema changed while the query was "
                    f"planned ({spec.subject} has a new version?): planned "
                    f"{planned[side].simpleString()}, now {wanted.simpleString()}; run "
                    f"it again, or pin {side}SchemaVersion")
    return chosen


class LogkitBatchReader(DataSourceReader):
    def __init__(self, options: SourceOptions, declared: StructType | None = None
                 ) -> None:
        self.options = options
        self.typed = resolve_typed(options, declared)
        broker = broker_for(options.path)
        tps = options.partitions(broker)
        level = options.isolation_level
        self.starts = _resolve(options.starting, tps, broker, default=EARLIEST,
                               name="startingOffsets", isolation_level=level)
        self.ends = _resolve(options.ending, tps, broker, default=LATEST,
                             name="endingOffsets", isolation_level=level, cap=True)

    def partitions(self) -> list[OffsetRange]:
        return _ranges(self.options, [(tp, self.starts[tp], self.ends[tp])
                                      for tp in sorted(self.starts)], self.typed)

    def read(self, partition: OffsetRange) -> Iterator[pa.RecordBatch]:
        return read_range(partition)


def _ranges(o: SourceOptions, spans: list[tuple[logkit.TopicPartition, int, int]],
            typed: dict[str, typed_columns.Typed]) -> list[OffsetRange]:
    """Input partitions for [start, end) spans: one per topic partition, as Spark's Kafka
    source, unless `minPartitions` / `maxRecordsPerPartition` ask for more, in which case
    the larger spans are cut into equal contiguous pieces (Kafka's rule: a span gets
    pieces in proportion to its share of all records). Empty spans give nothing."""
    spans = [(tp, start, end) for tp, start, end in spans if end > start]
    total = sum(end - start for _, start, end in spans)
    out = []
    for tp, start, end in spans:
        size = end - start
        pieces = 1
        if o.min_partitions and o.min_partitions > len(spans):
            pieces = max(pieces, -(-size * o.min_partitions // total))
        if o.max_records_per_partition:
            pieces = max(pieces, -(-size // o.max_records_per_partition))
        cuts = [start + size * i // pieces for i in range(pieces)] + [end]
        out.extend(OffsetRange(o.path, tp.topic, tp.partition, lo, hi, o.include_headers,
                               o.fail_on_data_loss, typed, o.isolation_level)
                   for lo, hi in zip(cuts, cuts[1:]) if hi > lo)
    return out


def _to_json(offsets: dict[logkit.TopicPartition, int]) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for tp, offset in sorted(offsets.items()):
        out.setdefault(tp.topic, {})[str(tp.partition)] = offset
    return out


def _from_json(offsets: dict[str, dict[str, int]]) -> dict[logkit.TopicPartition, int]:
    return {logkit.TopicPartition(t, int(p)): o for t, ps in offsets.items()
            for p, o in ps.items()}


class LogkitStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batch reader. Offsets are Spark-checkpointed as {"topic": {"0": n}}."""

    def __init__(self, options: SourceOptions, declared: StructType | None = None
                 ) -> None:
        self.options = options
        # the reader schema is chosen once, when the query starts: records written with
        # later (compatible) versions are read into it by their own schema ids
        self.typed = resolve_typed(options, declared)
        self._target: dict[logkit.TopicPartition, int] | None = None

    def initialOffset(self) -> dict:
        broker = broker_for(self.options.path)
        tps = self.options.partitions(broker)
        return _to_json(_resolve(self.options.starting, tps, broker, default=LATEST,
                                 name="startingOffsets",
                                 isolation_level=self.options.isolation_level))

    def getDefaultReadLimit(self) -> Any:
        limit = self.options.max_offsets_per_trigger
        return ReadMaxRows(limit) if limit else ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = self._latest()

    def _latest(self) -> dict[logkit.TopicPartition, int]:
        broker = broker_for(self.options.path)
        return {tp: latest_offset(broker.topic(tp.topic).partition(tp.partition),
                                  self.options.isolation_level)
                for tp in self.options.partitions(broker)}

    def latestOffset(self, start: dict, limit: Any) -> dict:
        latest = self._target if self._target is not None else self._latest()
        return _next_end(_from_json(start), latest, limit, self._log_start)

    def _log_start(self, tp: logkit.TopicPartition) -> int:
        broker = broker_for(self.options.path)
        return broker.topic(tp.topic).partition(tp.partition).log_start_offset

    def reportLatestOffset(self) -> dict:
        return _to_json(self._latest())

    def partitions(self, start: dict, end: dict) -> list[OffsetRange]:
        begin, finish = _from_json(start), _from_json(end)
        broker = broker_for(self.options.path)
        spans = [(tp, begin[tp] if tp in begin else
                  broker.topic(tp.topic).partition(tp.partition).log_start_offset, stop)
                 for tp, stop in sorted(finish.items())]
        return _ranges(self.options, spans, self.typed)

    def read(self, partition: OffsetRange) -> Iterator[pa.RecordBatch]:
        return read_range(partition)

    def commit(self, end: dict) -> None:
        """Nothing to release: offsets live in Spark's checkpoint."""


def columns_batch(part: Any, arrow_schema: pa.Schema, columns: Any) -> pa.RecordBatch:
    """One Arrow batch of the source's schema from `columns` (a `logkit.Columns`, whose
    buffers are Arrow's layout as they stand) of `part`'s topic and partition: the
    directory reader's and the object-store reader's."""
    count = columns.count
    nulls = pa.Array.from_buffers(pa.uint8(), count, [None, pa.py_buffer(columns.nulls)])
    return pa.RecordBatch.from_arrays([
        _binary(count, nulls, 1, columns.key_ends, columns.keys),
        _binary(count, nulls, 2, columns.value_ends, columns.values),
        _repeat(part.topic, pa.string(), count),
        _repeat(part.partition, pa.int32(), count),
        pa.Array.from_buffers(pa.int64(), count, [None, pa.py_buffer(columns.offsets)]),
        pa.Array.from_buffers(pa.timestamp("ms", tz="UTC"), count,
                              [None, pa.py_buffer(columns.timestamps)])
        .cast(pa.timestamp("us", tz="UTC")),
        _repeat(0, pa.int32(), count),
    ], schema=arrow_schema)


def _next_end(begin: dict, latest: dict, limit: Any,
              log_start: Any) -> dict[str, dict[str, int]]:
    """latestOffset's answer (both stream readers): a partition that appeared starts at
    `log_start(tp)`; each end is its latest offset, never behind its start, and a
    ReadMaxRows limit caps the batch."""
    for tp in latest:
        if tp not in begin:
            begin[tp] = log_start(tp)
    end = {tp: max(begin[tp], latest.get(tp, begin[tp])) for tp in begin}
    if isinstance(limit, ReadMaxRows):
        end = _cap(begin, end, limit.max_rows)
    return _to_json(end)


def _cap(begin: dict, end: dict, max_rows: int) -> dict:
    """Spread max_rows over partitions in proportion to their backlog (as Spark's Kafka
    source does), never less than one record for a partition with a backlog."""
    backlog = {tp: end[tp] - begin[tp] for tp in end}
    total = sum(backlog.values())
    if total <= max_rows:
        return end
    out = {}
    for tp, lag in backlog.items():
        share = int(max_rows * lag / total) if lag else 0
        out[tp] = begin[tp] + (min(lag, max(1, share)) if lag else 0)
    return out
