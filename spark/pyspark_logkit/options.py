"""Options of the `logkit` Spark data source, parsed and checked on the driver.

Owns: reading the options (mirroring Spark's Kafka source: `path`, `subscribe`,
`subscribePattern`, `assign`, `startingOffsets`, `endingOffsets`,
`maxOffsetsPerTrigger`, `minPartitions`, `maxRecordsPerPartition`, `includeHeaders`,
`failOnDataLoss`, `kafka.isolation.level`; for writes `path`, `topic`, `sinkId`, `checkpointLocation`,
`queryName`) and the offsets JSON format `{"topic": {"0": 42}}` with -2 for earliest
and -1 for latest. The names, types, defaults and bounds are the "spark read" and
"spark write" rows of logkit's one settings table (`logkit.resolve_config`, listed in
docs/configuration.md): the same coercion as every other setting, and an unknown option
is refused as an unknown config key is; `kafka.isolation.level` is honoured, the other
`kafka.*` options are accepted and ignored so a job written for Spark's Kafka source runs
unchanged. Options prefixed `fs.` are an object store's storage options when
`path` is a store's URL (objectstore.py, DESIGN §18). Option names are case-insensitive,
as Spark's are.

Invariant: a bad option raises `LogkitSparkError` with a message that names the option
and says what to write instead, before any Spark job starts.
"""

from __future__ import annotations

import json
import os
import re
from typing import Any, Mapping

import logkit

__all__ = ["LogkitSparkError", "SourceOptions", "checked", "parse_offsets", "EARLIEST",
           "LATEST", "TYPED_OPTIONS", "split_options"]

EARLIEST, LATEST = -2, -1
# The typed-column options: documented in logkit's settings table (docs/configuration.md),
# split off before it checks the others; typed.py checks their values.
TYPED_OPTIONS = ("keyFormat", "keySchema", "keySubject", "keySchemaVersion",
                 "valueFormat", "valueSchema", "valueSubject", "valueSchemaVersion",
                 "failOnDecodeError")
Offsets = dict[str, dict[int, int]]


class LogkitSparkError(logkit.LogkitError, ValueError):
    """A bad option or state of the logkit Spark data source."""


def split_options(given: Mapping[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """(the other options, the typed-column ones keyed by lower-cased name). Spark's
    option names ignore case."""
    wanted = {name.lower() for name in TYPED_OPTIONS}
    rest, typed = {}, {}
    for key, value in given.items():
        if key.lower().startswith("fs."):
            continue            # an object store's storage options (objectstore.py)
        if key.lower() in wanted:
            typed[key.lower()] = value
        else:
            rest[key] = value
    return rest, typed


def checked(options: Mapping[str, str], *, write: bool = False) -> dict[str, Any]:
    """Every read (or write) option, typed and defaulted by logkit's settings table;
    LogkitSparkError naming the option otherwise. Keys are spelled as in the table
    (`maxOffsetsPerTrigger`), whatever case Spark passed them in. The typed-column
    options (TYPED_OPTIONS) are left to typed.py."""
    try:
        return logkit.resolve_config("spark write" if write else "spark read",
                                     split_options(options)[0])
    except logkit.ConfigError as exc:
        raise LogkitSparkError(f"logkit: {exc}") from None


def parse_offsets(name: str, raw: str, *, allow_latest: bool = True,
                  allow_earliest: bool = True) -> str | Offsets:
    """'earliest' / 'latest' / JSON {"topic": {"0": 23, "1": -2}} -> str or dict."""
    text = raw.strip()
    if text in ("earliest", "latest"):
        if (text == "latest" and not allow_latest) or (text == "earliest" and not allow_earliest):
            raise LogkitSparkError(f"logkit: option {name!r} cannot be {text!r} here")
        return text
    try:
        parsed = json.loads(text)
    except ValueError as exc:
        raise LogkitSparkError(
            f"logkit: option {name!r} must be 'earliest', 'latest' or JSON like "
            f'{{"topic": {{"0": 42}}}}; could not parse {raw!r}: {exc}') from None
    if not isinstance(parsed, dict):
        raise LogkitSparkError(f"logkit: option {name!r} JSON must be an object of "
                               f"topics, got {raw!r}")
    out: Offsets = {}
    for topic, partitions in parsed.items():
        if not isinstance(partitions, dict):
            raise LogkitSparkError(f"logkit: option {name!r}: topic {topic!r} must map "
                                   f"partition numbers to offsets, got {partitions!r}")
        out[topic] = {}
        for partition, offset in partitions.items():
            try:
                number = int(partition)
            except ValueError:
                raise LogkitSparkError(f"logkit: option {name!r}: partition {partition!r} "
                                       f"of topic {topic!r} is not a number") from None
            if isinstance(offset, bool) or not isinstance(offset, int) or offset < -2:
                raise LogkitSparkError(f"logkit: option {name!r}: offset {offset!r} of "
                                       f"{topic}-{partition} must be >= 0, -2 (earliest) or "
                                       "-1 (latest)")
            if offset == LATEST and not allow_latest:
                raise LogkitSparkError(f"logkit: option {name!r} cannot use -1 (latest)")
            if offset == EARLIEST and not allow_earliest:
                raise LogkitSparkError(f"logkit: option {name!r} cannot use -2 (earliest)")
            out[topic][number] = offset
    return out


FS_PREFIX = "fs."                 # options passed to fsspec as storage options


def is_store_url(path: str) -> bool:
    """Whether a `path` option names an object store (an fsspec URL) rather than a
    logkit directory."""
    return "://" in path


def storage_options(given: Mapping[str, str]) -> dict[str, Any]:
    """The `fs.*` options as fsspec storage options: the prefix dropped, keys lower-cased
    (Spark's option keys ignore case), values strings, except a JSON object or list
    (`fs.client_kwargs={"region_name": "eu-west-1"}`), which is parsed."""
    out: dict[str, Any] = {}
    for key, value in given.items():
        if not key.lower().startswith(FS_PREFIX):
            continue
        name = key[len(FS_PREFIX):].lower()
        if not name:
            raise LogkitSparkError("logkit: option 'fs.' names no storage option; write "
                                   "fs.<name>, e.g. fs.endpoint_url")
        text = str(value)
        if text.strip()[:1] in ("{", "["):
            try:
                out[name] = json.loads(text)
                continue
            except ValueError as exc:
                raise LogkitSparkError(f"logkit: option {key!r} looks like JSON but does "
                                       f"not parse: {exc}") from None
        out[name] = text
    return out


class SourceOptions:
    """Read options, checked. `topics_now(broker)` lists the matching partitions."""

    def __init__(self, given: Mapping[str, str], *, streaming: bool) -> None:
        options = checked(given)
        # an fsspec URL is a leader's shipped object store (objectstore.py)
        self.store = bool(options["path"]) and is_store_url(options["path"])
        self.storage_options = storage_options(given)
        if self.store:
            self.path = options["path"]
        else:
            self.path = os.path.abspath(options["path"])
            if not os.path.isdir(self.path):
                raise LogkitSparkError(f"logkit: path {self.path!r} is not a logkit "
                                       "directory")
            if self.storage_options:
                named = ", ".join(f"fs.{k}" for k in sorted(self.storage_options))
                raise LogkitSparkError(
                    f"logkit: options {named} are an object store's storage options; "
                    f"path {self.path!r} is a directory. Give the store's URL as path, "
                    "or drop them")
        chosen = [k for k in ("subscribe", "subscribePattern", "assign") if options[k]]
        if len(chosen) != 1:
            raise LogkitSparkError("logkit: set exactly one of 'subscribe', "
                                   f"'subscribePattern' or 'assign' (got {chosen or 'none'})")
        self.subscribe = [t.strip() for t in (options["subscribe"] or "").split(",")
                          if t.strip()] or None
        pattern = options["subscribePattern"]
        try:
            self.pattern = re.compile(pattern) if pattern else None
        except re.error as exc:
            raise LogkitSparkError(f"logkit: subscribePattern {pattern!r} is not a valid "
                                   f"regular expression: {exc}") from None
        self.assign: dict[str, list[int]] | None = None
        if options["assign"]:
            try:
                assign = json.loads(options["assign"])
                self.assign = {t: [int(p) for p in ps] for t, ps in assign.items()}
            except (ValueError, AttributeError, TypeError):
                raise LogkitSparkError("logkit: option 'assign' must be JSON like "
                                       f'{{"topic": [0, 1]}}, got {options["assign"]!r}') \
                    from None
        default_start = "latest" if streaming else "earliest"
        self.starting = parse_offsets("startingOffsets",
                                      options["startingOffsets"] or default_start)
        if streaming and any(key.lower() == "endingoffsets" for key in given):
            raise LogkitSparkError("logkit: 'endingOffsets' is for batch reads only")
        self.ending = parse_offsets("endingOffsets", options["endingOffsets"],
                                    allow_earliest=False)
        self.include_headers: bool = options["includeHeaders"]
        self.fail_on_data_loss: bool = options["failOnDataLoss"]
        self.max_offsets_per_trigger: int | None = options["maxOffsetsPerTrigger"]
        self.min_partitions: int | None = options["minPartitions"]
        self.max_records_per_partition: int | None = options["maxRecordsPerPartition"]
        # Kafka's consumer setting, which Spark's Kafka source passes on: read_committed
        # reads stop at each partition's last stable offset and leave out aborted records
        self.isolation_level: str = options["kafka.isolation.level"]
        self.typed_options = split_options(given)[1]

    def single_topic(self) -> str | None:
        """The one topic this source reads (names the default subject), else None."""
        if self.subscribe is not None and len(self.subscribe) == 1:
            return self.subscribe[0]
        if self.assign is not None and len(self.assign) == 1:
            return next(iter(self.assign))
        return None

    def partitions(self, broker: logkit.Broker) -> list[logkit.TopicPartition]:
        """The topic partitions this source reads, as of now."""
        if self.assign is not None:
            out = []
            for topic, numbers in self.assign.items():
                handle = _topic(broker, topic)
                for n in numbers:
                    handle.partition(n)
                    out.append(logkit.TopicPartition(topic, n))
            return sorted(out)
        names = self.subscribe if self.subscribe is not None else \
            [t for t in broker.topics() if self.pattern and self.pattern.fullmatch(t)]
        return sorted(logkit.TopicPartition(t, p.partition)
                      for t in names for p in _topic(broker, t).partitions)


def _topic(broker: logkit.Broker, name: str) -> Any:
    try:
        return broker.topic(name)
    except logkit.UnknownTopicError:
        raise LogkitSparkError(f"logkit: topic {name!r} does not exist in {broker.path}; "
                               f"topics there: {broker.topics()}") from None
    except logkit.InvalidTopicError as exc:
        raise LogkitSparkError(f"logkit: {exc}") from None
