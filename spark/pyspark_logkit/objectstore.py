"""Reading a leader's shipped object store from Spark (DESIGN §18): the `logkit` source
with `path` set to the URL `broker.ship()` writes to (`s3://bucket/prefix`, any fsspec
URL) and storage options in `fs.`-prefixed options.

Owns: the `fs.*` options (strings; a JSON object or list for a nested value such as
`fs.client_kwargs`), planning on the driver from the latest manifest (its partitions'
log start and log end: published ranges only), and the executors' reads: each input
partition carries the manifest records (key, offsets, size, SHA-256) of the objects
holding its offsets, and a task fetches only those objects' byte ranges through fsspec
— an object it reads whole in one GET, checked against the recorded size and SHA-256;
part of an object by walking its batch headers with ranged GETs of one header each and
then one ranged GET of the batches it reads — and checks every batch's size and CRC.

Invariant: a task never opens a local path (nothing of the driver's disk is needed),
and it yields only bytes that passed those checks. A damaged object fails the task with
a `LogkitSparkError` whose message says "corrupt" and names the object's URL; tasks that
never read it succeed. An object the task's plan names but the store no longer holds
(a tail chunk retired by a later upload) is re-planned from the newer manifest, from
the offset the task has reached; only an object that the newer manifest still names is
missing data (corrupt). A URL without a manifest is a `ConfigError` naming it.

`kafka.isolation.level=read_committed` reads as the directory source reads: the driver
plans each partition's end at most at the last stable offset the manifest records
(every 'latest' is that LSO), and each input partition carries the manifest's aborted
transactions meeting its range, so a task leaves out their batches and every control
batch (`logkit.shipped.AbortedBatches`) without reading anything more. A manifest
shipped before it recorded them is refused for read_committed (`committed_view`: a
`ConfigError` naming it). Not served here (refused on the driver with the reason):
typed key/value columns (the schema registry lives in the leader's directory).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any, Iterator, Mapping

import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (ReadAllAvailable, ReadMaxRows,
                                              SupportsTriggerAvailableNow)

import logkit
from logkit import Columns
from logkit.shipped import (BATCH_HEADER_BYTES, AbortedBatches, committed_view, decode_batch,
                            iter_batches, may_have_gaps, read_header, read_manifest)

from .options import FS_PREFIX, EARLIEST, LATEST, LogkitSparkError, is_store_url, storage_options

__all__ = ["FS_PREFIX", "is_store_url", "storage_options", "Store", "StoreRange",
           "StoreBatchReader", "StoreStreamReader", "read_store_range"]

CHUNK_RECORDS = 20_000           # records per Arrow batch a task yields (about)


def _join(url: str, key: str) -> str:
    return f"{url.rstrip('/')}/{key}"


class Store:
    """The driver's view of a shipped store: its latest manifest, read afresh by
    `manifest()`."""

    def __init__(self, url: str, options: Mapping[str, Any]) -> None:
        self.url, self.options = url, dict(options)

    def manifest(self) -> dict[str, Any]:
        try:
            body = read_manifest(self.url, storage_options=self.options)
        except logkit.CorruptRecordError as exc:
            raise LogkitSparkError(f"logkit: corrupt manifest at {self.url}: {exc}") \
                from None
        if body is None:
            raise logkit.ConfigError(f"logkit: {self.url} holds no manifest.json: nothing "
                                     "was shipped there yet (broker.ship(url) writes it)")
        return body


def _entries(body: Mapping[str, Any]) -> dict[logkit.TopicPartition, dict[str, Any]]:
    return {logkit.TopicPartition(e["topic"], int(e["partition"])): e
            for e in body["partitions"]}


def store_partitions(source: Any, body: Mapping[str, Any]) -> list[logkit.TopicPartition]:
    """The topic partitions a source's subscribe/subscribePattern/assign names, from the
    manifest."""
    topics = body["topics"]
    if source.assign is not None:
        out = []
        for topic, numbers in source.assign.items():
            count = _count(source, topics, topic)
            for n in numbers:
                if not 0 <= n < count:
                    raise LogkitSparkError(f"logkit: {topic} has {count} partitions at "
                                           f"{source.path}; no partition {n}")
                out.append(logkit.TopicPartition(topic, n))
        return sorted(out)
    names = source.subscribe if source.subscribe is not None else \
        [t for t in topics if source.pattern and source.pattern.fullmatch(t)]
    return sorted(logkit.TopicPartition(t, n) for t in names
                  for n in range(_count(source, topics, t)))


def _count(source: Any, topics: Mapping[str, Any], topic: str) -> int:
    if topic not in topics:
        raise LogkitSparkError(f"logkit: topic {topic!r} is not in the store at "
                               f"{source.path}; topics there: {sorted(topics)}")
    return int(topics[topic]["partitions"])


def _resolve(spec: Any, tps: list[logkit.TopicPartition], store: Store,
             body: Mapping[str, Any], *, default: int, name: str, committed: bool,
             cap: bool = False) -> dict[logkit.TopicPartition, int]:
    """Concrete offsets from the manifest: earliest is a partition's shipped log start,
    latest its shipped log end (what the leader had published when it wrote it), or
    with read_committed (`committed`) its shipped last stable offset, which also holds
    an ending offset (`cap`), as the directory source holds it at the leader's."""
    entries = _entries(body)
    out = {}
    for tp in tps:
        entry = entries.get(tp)
        start = int(entry["log_start_offset"]) if entry else 0
        end = int(entry["log_end_offset"]) if entry else 0
        latest = committed_view(store.url, entry)[0] if committed and entry else end
        wanted = EARLIEST if spec == "earliest" else LATEST if spec == "latest" else \
            spec.get(tp.topic, {}).get(tp.partition, default)
        if wanted == EARLIEST:
            out[tp] = start
        elif wanted == LATEST:
            out[tp] = latest
        elif wanted > end:
            raise LogkitSparkError(f"logkit: {name} offset {wanted} of {tp.topic}-"
                                   f"{tp.partition} is beyond its shipped end ({end})")
        else:
            out[tp] = min(wanted, latest) if cap else wanted
    return out


@dataclass
class StoreRange(InputPartition):
    """One topic partition's offsets [start, end) for one Spark task, with the manifest
    records of the objects holding them."""

    url: str
    options: dict[str, Any]
    topic: str
    partition: int
    start: int
    end: int
    include_headers: bool
    fail_on_data_loss: bool
    gaps: bool
    objects: list[dict[str, Any]]
    aborted: list[list[int]] | None     # read_committed: [producer id, first, last]

    def __init__(self, url: str, options: dict[str, Any], topic: str, partition: int,
                 start: int, end: int, include_headers: bool, fail_on_data_loss: bool,
                 gaps: bool, objects: list[dict[str, Any]],
                 aborted: list[list[int]] | None = None) -> None:
        super().__init__((topic, partition, start, end))
        self.url, self.options, self.topic, self.partition = url, options, topic, partition
        self.start, self.end = start, end
        self.include_headers, self.fail_on_data_loss = include_headers, fail_on_data_loss
        self.gaps, self.objects, self.aborted = gaps, objects, aborted


def _covering(entry: Mapping[str, Any], start: int, end: int) -> list[dict[str, Any]]:
    return [dict(o) for o in entry["objects"]
            if int(o["end_offset"]) > start and int(o["first_offset"]) < end]


def _ranges(source: Any, store: Store, body: Mapping[str, Any],
            spans: list[tuple[logkit.TopicPartition, int, int]]) -> list[StoreRange]:
    """Input partitions for [start, end) spans, cut as the directory source cuts them
    (minPartitions, maxRecordsPerPartition); each names only the objects it reads and,
    read_committed, the aborted transactions meeting its range."""
    from .reader import _ranges as cut
    entries = _entries(body)
    out = []
    for piece in cut(source, spans, {}):
        tp = logkit.TopicPartition(piece.topic, piece.partition)
        entry = entries[tp]
        aborted = None
        if _committed(source):
            aborted = [list(t) for t in committed_view(store.url, entry)[1]
                       if t.last_offset >= piece.start and t.first_offset < piece.end]
        out.append(StoreRange(store.url, store.options, piece.topic, piece.partition,
                              piece.start, piece.end, source.include_headers,
                              source.fail_on_data_loss, may_have_gaps(body, entry),
                              _covering(entry, piece.start, piece.end), aborted))
    return out


def _committed(source: Any) -> bool:
    return source.isolation_level == "read_committed"


def _refuse_unserved(source: Any) -> None:
    if source.typed_options:
        raise LogkitSparkError("logkit: typed key/value columns are not served from an "
                               f"object store ({source.path}): the schema registry is in "
                               "the leader's directory. Decode the binary columns instead")


class StoreBatchReader(DataSourceReader):
    """A batch read of a shipped store: planned from one manifest."""

    def __init__(self, source: Any) -> None:
        _refuse_unserved(source)
        self.source = source
        self.store = Store(source.path, source.storage_options)
        self.body = self.store.manifest()
        tps = store_partitions(source, self.body)
        committed = _committed(source)
        self.starts = _resolve(source.starting, tps, self.store, self.body,
                               default=EARLIEST, name="startingOffsets", committed=committed)
        self.ends = _resolve(source.ending, tps, self.store, self.body, default=LATEST,
                             name="endingOffsets", committed=committed, cap=True)

    def partitions(self) -> list[StoreRange]:
        return _ranges(self.source, self.store, self.body,
                       [(tp, self.starts[tp], self.ends[tp]) for tp in sorted(self.starts)])

    def read(self, partition: StoreRange) -> Iterator[pa.RecordBatch]:
        return read_store_range(partition)


class StoreStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batches that follow the manifest as the shipper publishes: each trigger's
    latest offset is each partition's log end in the manifest read then."""

    def __init__(self, source: Any) -> None:
        _refuse_unserved(source)
        self.source = source
        self.store = Store(source.path, source.storage_options)
        self._target: dict[logkit.TopicPartition, int] | None = None

    def initialOffset(self) -> dict:
        from .reader import _to_json
        body = self.store.manifest()
        return _to_json(_resolve(self.source.starting, store_partitions(self.source, body),
                                 self.store, body, default=LATEST, name="startingOffsets",
                                 committed=_committed(self.source)))

    def getDefaultReadLimit(self) -> Any:
        limit = self.source.max_offsets_per_trigger
        return ReadMaxRows(limit) if limit else ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = self._latest()

    def _latest(self) -> dict[logkit.TopicPartition, int]:
        body = self.store.manifest()
        return _resolve("latest", store_partitions(self.source, body), self.store, body,
                        default=LATEST, name="latest", committed=_committed(self.source))

    def latestOffset(self, start: dict, limit: Any) -> dict:
        from .reader import _from_json, _next_end
        latest = self._target if self._target is not None else self._latest()
        return _next_end(_from_json(start), latest, limit, self._log_start)

    def _log_start(self, tp: Any) -> int:
        """A partition that appeared starts at its log start in the manifest (one read
        per new partition: rare)."""
        entries = _entries(self.store.manifest())
        return int(entries[tp]["log_start_offset"]) if tp in entries else 0

    def reportLatestOffset(self) -> dict:
        from .reader import _to_json
        return _to_json(self._latest())

    def partitions(self, start: dict, end: dict) -> list[StoreRange]:
        from .reader import _from_json
        begin, finish = _from_json(start), _from_json(end)
        body = self.store.manifest()
        entries = _entries(body)
        spans = [(tp, begin.get(tp, int(entries[tp]["log_start_offset"])), stop)
                 for tp, stop in sorted(finish.items())]
        return _ranges(self.source, self.store, body, spans)

    def read(self, partition: StoreRange) -> Iterator[pa.RecordBatch]:
        return read_store_range(partition)

    def commit(self, end: dict) -> None:
        """Nothing to release: offsets live in Spark's checkpoint."""


# ---- the executor side ------------------------------------------------------------------

def _corrupt(where: str, why: Any) -> LogkitSparkError:
    return LogkitSparkError(f"logkit: corrupt object {where}: {why}")


def _filesystem(url: str, options: Mapping[str, Any]) -> tuple[Any, str]:
    import fsspec
    fs, root = fsspec.core.url_to_fs(url, **dict(options))
    return fs, root.rstrip("/")


class _Fetcher:
    """A task's reads of one store: whole objects or byte ranges, each checked."""

    def __init__(self, part: StoreRange) -> None:
        self.part = part
        self.fs, self.root = _filesystem(part.url, part.options)

    def _cat(self, key: str, start: int | None = None, end: int | None = None) -> bytes:
        path = f"{self.root}/{key}"
        try:
            return self.fs.cat_file(path, start=start, end=end)
        except FileNotFoundError:
            raise
        except OSError as exc:
            if "NoSuchKey" in str(exc) or "Not Found" in str(exc):
                raise FileNotFoundError(path) from exc
            raise

    def batches(self, obj: Mapping[str, Any], offset: int, end: int
                ) -> tuple[bytes, list[tuple[int, Any]]]:
        """(bytes, [(position, header)]) of the object's batches holding offsets in
        [offset, end): the whole object when the range covers it, else a ranged GET of
        just those batches. Every batch's CRC and size is checked; a whole object's
        size and SHA-256 against its manifest record."""
        key, size = obj["key"], int(obj["size"])
        first, last = int(obj["first_offset"]), int(obj["end_offset"])
        where = _join(self.part.url, key)
        if offset <= first and last <= end:
            data = self._cat(key)
            if len(data) != size:
                raise _corrupt(where, f"{len(data)} bytes, the manifest records {size}")
            digest = hashlib.sha256(data).hexdigest()
            if digest != obj["sha256"]:
                raise _corrupt(where, f"SHA-256 {digest}, the manifest records "
                                      f"{obj['sha256']}")
            return data, self._walk(data, where, first, last)
        begin, stop, base = self._locate(key, where, size, offset, end)
        data = self._cat(key, begin, stop)
        if len(data) != stop - begin:
            raise _corrupt(where, f"bytes {begin}..{stop} read back as {len(data)} bytes")
        return data, self._walk(data, where, base, None)

    def _walk(self, data: bytes, where: str, first: int, last: int | None
              ) -> list[tuple[int, Any]]:
        try:
            out = list(iter_batches(data, 0, len(data), where, first_offset=first,
                                    verify=True, gaps=self.part.gaps))
        except logkit.CorruptRecordError as exc:
            raise _corrupt(where, exc) from None
        if last is not None and (not out or out[-1][1].last_offset + 1 != last):
            raise _corrupt(where, f"its batches end elsewhere than at offset {last}")
        return out

    def _locate(self, key: str, where: str, size: int, offset: int, end: int
                ) -> tuple[int, int, int]:
        """(first byte, end byte, first base offset) of the batches holding [offset,
        end) in an object read in part: its headers walked with one small ranged GET
        each (batches below `offset` are skipped, never fetched)."""
        pos, begin, base = 0, None, None
        while pos < size:
            raw = self._cat(key, pos, min(size, pos + BATCH_HEADER_BYTES))
            try:
                header = read_header(raw, 0, size - pos, where)
            except logkit.CorruptRecordError as exc:
                raise _corrupt(where, exc) from None
            if header is None:
                raise _corrupt(where, f"a batch at byte {pos} runs past the object's "
                                      f"recorded size {size}")
            if begin is None and header.last_offset >= offset:
                begin, base = pos, header.base_offset
            if begin is not None and header.base_offset >= end:
                return begin, pos, base
            pos += header.size
        if begin is None:
            raise _corrupt(where, f"no batch holds offset {offset}")
        return begin, size, base


def _data_loss(part: StoreRange, offset: int, start: int) -> int:
    if part.fail_on_data_loss:
        raise LogkitSparkError(
            f"logkit: offsets {offset}..{start - 1} of {part.topic}-{part.partition} were "
            f"removed from {part.url} by retention before they were read. Set "
            "failOnDataLoss=false to skip them.")
    return start


def read_store_range(part: StoreRange) -> Iterator[pa.RecordBatch]:
    """Arrow batches of the records in part's range, from the store (a Spark task)."""
    if not isinstance(part, StoreRange):
        return          # PySpark reads one placeholder partition when there are none
    from .reader import _arrow_schema
    arrow_schema = _arrow_schema(part.include_headers)
    fetcher = _Fetcher(part)
    aborted = AbortedBatches(part.aborted or ())       # read_committed's, else none
    objects = list(part.objects)
    offset = part.start
    replans = 0
    while offset < part.end:
        objects = [o for o in objects if int(o["end_offset"]) > offset]
        if not objects:
            break                       # offsets past the last object: none (gaps)
        obj = objects[0]
        try:
            data, batches = fetcher.batches(obj, offset, part.end)
        except FileNotFoundError:
            # Retired since the plan (a tail chunk merged or a segment rolled): the
            # newer manifest names other objects for these offsets.
            entry = _entries(Store(part.url, part.options).manifest()).get(
                logkit.TopicPartition(part.topic, part.partition))
            if entry is None or any(o["key"] == obj["key"] for o in entry["objects"]) \
                    or replans > 10:
                raise _corrupt(_join(part.url, obj["key"]), "the manifest names it but "
                               "the store does not hold it") from None
            replans += 1
            start = int(entry["log_start_offset"])
            if offset < start:
                offset = _data_loss(part, offset, start)
            objects = _covering(entry, offset, part.end)
            continue
        yield from _arrow(part, arrow_schema, data, batches, offset,
                          _join(part.url, obj["key"]), aborted)
        offset = min(int(obj["end_offset"]), part.end)
        objects = objects[1:]


def _arrow(part: StoreRange, arrow_schema: pa.Schema, data: bytes,
           batches: list[tuple[int, Any]], offset: int, where: str,
           aborted: AbortedBatches) -> Iterator[pa.RecordBatch]:
    """The records in [offset, part.end) of checked batches, as Arrow batches, without
    control batches and the batches of `aborted` transactions."""
    from .reader import columns_batch
    if part.include_headers:
        records: list[Any] = []
        for pos, header in batches:
            if header.is_control or header.last_offset < offset or (
                    aborted and aborted.skips(header)):
                continue
            if header.base_offset >= part.end:
                break
            records.extend(r for r in decode_batch(data, pos, header, part.topic,
                                                   part.partition, min_offset=offset,
                                                   path=where, verify=False)
                           if r[2] < part.end)
            if len(records) >= CHUNK_RECORDS:
                yield _records_batch(part, arrow_schema, records)
                records = []
        if records:
            yield _records_batch(part, arrow_schema, records)
        return
    columns = Columns()
    for i, (pos, header) in enumerate(batches):
        if header.base_offset >= part.end:
            break
        if not header.is_control and header.last_offset >= offset and not (
                aborted and aborted.skips(header)):
            columns.add_batch(data, pos, header, min_offset=offset, stop_offset=part.end,
                              path=where)
        if columns.count >= CHUNK_RECORDS or i == len(batches) - 1:
            if columns.count:
                yield columns_batch(part, arrow_schema, columns)
            columns = Columns()
    if columns.count:
        yield columns_batch(part, arrow_schema, columns)



def _records_batch(part: StoreRange, arrow_schema: pa.Schema, records: list[Any]
                   ) -> pa.RecordBatch:
    import pyarrow.compute as pc
    _, _, offsets, timestamps, keys, values, headers = zip(*records)
    count = len(records)
    return pa.RecordBatch.from_arrays([
        pa.array(keys, pa.binary()), pa.array(values, pa.binary()),
        pa.repeat(pa.scalar(part.topic, pa.string()), count),
        pa.repeat(pa.scalar(part.partition, pa.int32()), count),
        pa.array(offsets, pa.int64()),
        pc.multiply(pa.array(timestamps, pa.int64()), 1000)
        .cast(pa.timestamp("us", tz="UTC")),
        pa.repeat(pa.scalar(0, pa.int32()), count),
        pa.array([[{"key": k, "value": v} for k, v in h] for h in headers],
                 arrow_schema.field("headers").type),
    ], schema=arrow_schema)

