"""Every setting logkit accepts, in one table, and the one coercion they all go through.

Owns: `SETTINGS`, one row per key and scope: the name users write (Kafka's dotted name,
or Spark's option name), the snake_case keyword of client constructors, type, default,
bounds or choices, unit, and whether logkit honours the key, ignores it (accepted so
Kafka code runs unchanged; the row says why) or refuses it. Scopes: `topic`, `broker`,
`producer`, `consumer`, `spark read`, `spark write`. A topic key whose default comes
from a broker key (`retention.ms` from `log.retention.ms`) names that key and takes its
type, bounds and default from it, so each default is written once.

Who calls it: `Broker` (broker and topic configs), `Producer` and `Consumer` (their
keyword options), the Spark data source's options (through `logkit.resolve_config`).
docs/configuration.md is generated from this table (`tools/config_docs.py`) and a test
holds the two equal.

Invariant: every setting logkit reads went through `coerce`, so it is known, typed and
in range. An unknown key, a bad value or a refused key raises `ConfigError` naming the
key and saying what to write instead; an ignored key is accepted only because its row
says so (and a non-default value of one is logged at INFO).
"""

from __future__ import annotations

import difflib
import logging
from dataclasses import dataclass, replace
from typing import Any, Callable, Iterable, Mapping

from .assignors import ASSIGNORS
from .compression import CODEC_NAMES
from .errors import ConfigError

__all__ = ["Setting", "SETTINGS", "TABLE", "TOPIC_CONFIG", "BROKER_CONFIG",
           "BROKER_TO_TOPIC", "SCOPES", "HONOURED", "IGNORED", "REFUSED", "lookup",
           "coerce", "resolve", "resolve_config", "resolve_broker_config",
           "resolve_topic_config", "check_topic_config", "topic_defaults", "is_compacted", "overrides_only",
           "markdown",
           "markdown_flagged",
           "LONG_MAX", "INT_MAX"]

log = logging.getLogger(__name__)

LONG_MAX = 9223372036854775807
INT_MAX = 2147483647              # Kafka's INT settings: positions in an index are int32

TOPIC, BROKER, PRODUCER, CONSUMER = "topic", "broker", "producer", "consumer"
SPARK_READ, SPARK_WRITE = "spark read", "spark write"
SCOPES = (BROKER, TOPIC, PRODUCER, CONSUMER, SPARK_READ, SPARK_WRITE)
CLIENT_SCOPES = (PRODUCER, CONSUMER)         # keys are snake_case keywords
SPARK_SCOPES = (SPARK_READ, SPARK_WRITE)     # keys are case-insensitive, as Spark's are
_WHERE = {TOPIC: "topic config", BROKER: "broker config", PRODUCER: "producer option",
          CONSUMER: "consumer option", SPARK_READ: "Spark read option",
          SPARK_WRITE: "Spark write option"}

HONOURED = "honoured"   # the value changes what logkit does
IGNORED = "ignored"     # accepted for Kafka compatibility, no effect; `why` says why
REFUSED = "refused"     # any value but the default raises ConfigError; `why` says why

PREFIX = ".*"           # a row named "kafka.*" stands for every key with that prefix


@dataclass(frozen=True)
class Setting:
    """One key of one scope. `name` is what `config=` dicts and Spark options use (None
    for a client keyword with no Kafka name); `keyword` is the client constructor's."""

    scope: str
    name: str | None
    kind: str                       # "int", "bool", "str", "callable" or "any" (check)
    default: Any
    doc: str
    keyword: str | None = None
    minimum: int | None = None
    maximum: int | None = None
    choices: tuple[Any, ...] | None = None
    nullable: bool = False          # None is a valid value
    required: bool = False          # no default: the key must be given
    unit: str = ""
    status: str = HONOURED
    why: str = ""                   # why ignored or refused; for choices, why no others
    inherit: str | None = None      # the broker key that supplies this topic default
    check: Callable[["Setting", Any], Any] | None = None   # for kind "any"
    shape: str = ""                 # the type as the docs show it, for kind "any"

    @property
    def key(self) -> str:
        """The key this row is looked up by in its scope."""
        return self.keyword if self.scope in CLIENT_SCOPES else self.name  # type: ignore

    @property
    def label(self) -> str:
        """How errors name the key: 'linger_ms (linger.ms)', 'retention.ms'."""
        if self.scope in CLIENT_SCOPES and self.name and self.name != self.keyword:
            return f"{self.keyword!r} (Kafka's {self.name})"
        return repr(self.key)


_UNSET = object()


# ---- checks of the rows that are not one plain type -------------------------------------

def _fail(row: Setting, what: str, value: Any) -> ConfigError:
    return ConfigError(f"{_WHERE[row.scope]} {row.label} must be {what}, got {value!r}")


def _acks(row: Setting, value: Any) -> Any:
    if isinstance(value, str) and value in ("0", "1", "-1"):
        value = int(value)
    if isinstance(value, bool) or value not in (0, 1, -1, "all"):
        raise _fail(row, "0, 1, -1 or 'all'", value)
    return value


def _partitioner(row: Setting, value: Any) -> Any:
    if value in (None, "sticky", "murmur2", "round_robin") or callable(value):
        return value
    raise _fail(row, "None (Kafka's default: murmur2 for keys, sticky for null keys), "
                "'round_robin' or a callable (key_bytes, all_partitions, available) -> int",
                value)


def _strategy(row: Setting, value: Any) -> Any:
    names = list(value) if isinstance(value, (list, tuple)) else [value]
    if not names or any(not isinstance(n, str) or n not in ASSIGNORS for n in names):
        raise _fail(row, f"one of {sorted(ASSIGNORS)} or a list of them (the first is "
                    "used)", value)
    return value


def _timeout_or_forever(row: Setting, value: Any) -> Any:
    if value == float("inf") and isinstance(value, float):
        return value
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise _fail(row, "a non-negative integer of milliseconds, or float('inf')", value)
    return value


_POLICIES = {"delete": "delete", "compact": "compact", "compact,delete": "compact,delete",
             "delete,compact": "compact,delete"}


def _cleanup_policy(row: Setting, value: Any) -> str:
    """cleanup.policy in Kafka's string form: a list, or a comma-separated string in any
    order, becomes 'delete', 'compact' or 'compact,delete'."""
    if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
        value = ",".join(value)
    if isinstance(value, str):
        policy = _POLICIES.get(",".join(sorted({v.strip() for v in value.split(",")})))
        if policy is not None:
            return policy
    raise _fail(row, "'delete', 'compact' or 'compact,delete'", value)


def is_compacted(config: Mapping[str, Any]) -> bool:
    """True when a topic config's cleanup.policy includes compact."""
    return "compact" in config.get("cleanup.policy", "delete")


def _float(row: Setting, value: Any, low: float, high: float, low_open: bool) -> float:
    if isinstance(value, str):
        try:
            value = float(value.strip())
        except ValueError:
            raise _fail(row, "a number", value) from None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
            (low < value if low_open else low <= value) and value <= high):
        raise _fail(row, f"a number in {'(' if low_open else '['}{low}, {high}]", value)
    return float(value)


def _ratio(row: Setting, value: Any) -> float:
    return _float(row, value, 0.0, 1.0, False)


def _ratio_above_zero(row: Setting, value: Any) -> float:
    return _float(row, value, 0.0, 1.0, True)


# ---- the table --------------------------------------------------------------------------

_CODECS = tuple(CODEC_NAMES)                     # none, uncompressed, gzip, ...
_TOPIC_CODECS = ("producer", "uncompressed", "gzip", "snappy", "lz4", "zstd")
_TIMESTAMP_TYPES = ("CreateTime", "LogAppendTime")


def _broker(name: str, kind: str, default: Any, doc: str, **more: Any) -> Setting:
    return Setting(BROKER, name, kind, default, doc, **more)


def _topic(name: str, doc: str, *, inherit: str | None = None, **more: Any) -> Setting:
    """A topic row; with `inherit`, type, bounds, unit and default come from that broker
    row when the table is built (see `_inherit`)."""
    if inherit is not None:
        return Setting(TOPIC, name, "", _UNSET, doc, inherit=inherit, **more)
    return Setting(TOPIC, name, more.pop("kind"), more.pop("default"), doc, **more)


def _client(scope: str, name: str | None, kind: str, default: Any, doc: str, *,
            keyword: str | None = None, **more: Any) -> Setting:
    assert name is not None or keyword is not None
    return Setting(scope, name, kind, default, doc,
                   keyword=keyword or name.replace(".", "_"), **more)  # type: ignore


def _spark(scope: str, name: str, kind: str, default: Any, doc: str,
           **more: Any) -> Setting:
    return Setting(scope, name, kind, default, doc, **more)


_NO_REQUESTS = ("the embedded client sends no requests: it appends to, or reads, the "
                "Broker it was made from")
_NO_PREALLOCATE = ("segment files grow with each append, so the file ends at the last "
                   "batch written, which recovery relies on")
_NO_KAFKA_CLIENT = ("the source reads the log files itself; there is no Kafka client to "
                    "pass them to (accepted so Kafka jobs run unchanged)")

# The Spark source's typed key/value columns (docs/spark.md; spark/pyspark_logkit/typed.py
# checks their values): one row per side.
_SPARK_TYPED = (
    ("Format", "avro, json or protobuf: the {side} as a typed column (unset: binary)"),
    ("Schema", "the {side}'s schema text (Avro, JSON Schema or .proto); not with "
     "{side}Subject"),
    ("Subject", "the registry subject of the {side}'s schema (default <topic>-{side})"),
    ("SchemaVersion", "the version of {side}Subject (default the latest when the query "
     "starts)"))

_ROWS: tuple[Setting, ...] = (
    # ---- broker: Kafka's broker names; the log.* ones are defaults of topic keys
    _broker("num.partitions", "int", 1, "partitions of a topic created without a count "
            "(and of auto-created topics)", minimum=1, unit="partitions"),
    _broker("auto.create.topics.enable", "bool", True,
            "a producer or consumer naming a missing topic creates it"),
    _broker("auto.create.topics.max.per.request", "int", 100, "logkit's own: at most "
            "this many topics are auto-created by one Metadata request (the rest answer "
            "UNKNOWN_TOPIC_OR_PARTITION, and the client's retry creates more)",
            minimum=0, maximum=10000, unit="topics"),
    _broker("create.topic.max.partitions", "int", 1000, "logkit's own stand-in for "
            "Kafka's create.topic.policy.class.name: CreateTopics and CreatePartitions "
            "over the wire may not make a topic of more partitions (POLICY_VIOLATION); "
            "Broker.create_topic is not bound by it", minimum=1, maximum=10000,
            unit="partitions"),
    # ---- broker: the Kafka listener's socket limits (docs/security.md)
    _broker("max.connections", "int", 1000, "connections the Kafka listener keeps open "
            "(Kafka's default is unbounded); a new one past it takes the slot of the "
            "oldest unauthenticated, else the longest idle, connection",
            minimum=1, maximum=INT_MAX, unit="connections"),
    _broker("max.connections.per.ip", "int", 500, "connections from one address (Kafka's "
            "default is unbounded); half of max.connections, so one address cannot "
            "take them all", minimum=1, maximum=INT_MAX, unit="connections"),
    _broker("connections.max.idle.ms", "int", 600000, "close a Kafka connection idle "
            "this long", minimum=1, unit="ms"),
    _broker("connections.max.unauthenticated.ms", "int", 10000, "logkit's own: a Kafka "
            "connection must finish SASL (without SASL: send its first request) within "
            "this", minimum=1, unit="ms"),
    _broker("connection.failed.authentication.delay.ms", "int", 100, "after a failed "
            "SASL authentication, wait this long before answering and closing",
            minimum=0, unit="ms"),
    _broker("sasl.server.max.receive.size", "int", 524288, "largest frame read from a "
            "Kafka connection before SASL succeeds (a larger one closes it unread)",
            minimum=1, maximum=INT_MAX, unit="bytes"),
    _broker("socket.request.max.bytes", "int", 104857600, "largest request frame the "
            "Kafka listener reads (a larger one closes its connection unread)",
            minimum=1, maximum=INT_MAX, unit="bytes"),
    _broker("log.retention.check.interval.ms", "int", 300000,
            "how often the background thread enforces retention", minimum=1, unit="ms"),
    _broker("log.flush.scheduler.interval.ms", "int", 1000,
            "how often the background thread checks flush.ms", minimum=1, unit="ms"),
    _broker("log.retention.ms", "int", 604800000, "default of retention.ms",
            minimum=-1, unit="ms"),
    _broker("log.retention.bytes", "int", -1, "default of retention.bytes",
            minimum=-1, unit="bytes"),
    _broker("log.segment.bytes", "int", 1073741824, "default of segment.bytes",
            minimum=1024, maximum=INT_MAX, unit="bytes"),
    _broker("log.roll.ms", "int", 604800000, "default of segment.ms", minimum=1, unit="ms"),
    _broker("log.index.size.max.bytes", "int", 10485760, "default of segment.index.bytes",
            minimum=64, maximum=INT_MAX, unit="bytes"),
    _broker("log.index.interval.bytes", "int", 4096, "default of index.interval.bytes",
            minimum=0, maximum=INT_MAX, unit="bytes"),
    _broker("message.max.bytes", "int", 1048588, "default of max.message.bytes",
            minimum=64, maximum=INT_MAX, unit="bytes"),
    _broker("log.flush.interval.messages", "int", LONG_MAX, "default of flush.messages",
            minimum=1, unit="records"),
    _broker("log.flush.interval.ms", "int", LONG_MAX, "default of flush.ms",
            minimum=0, unit="ms"),
    _broker("log.segment.delete.delay.ms", "int", 60000, "default of file.delete.delay.ms",
            minimum=0, unit="ms"),
    _broker("log.message.timestamp.type", "str", "CreateTime",
            "default of message.timestamp.type", choices=_TIMESTAMP_TYPES),
    _broker("compression.type", "str", "producer", "default of the topic compression.type",
            choices=_TOPIC_CODECS),
    _broker("min.insync.replicas", "int", 1, "default of the topic min.insync.replicas",
            minimum=1, unit="replicas"),
    _broker("log.preallocate", "bool", False, "default of preallocate", status=IGNORED,
            why=_NO_PREALLOCATE),
    _broker("offset.metadata.max.bytes", "int", 4096,
            "longest commit metadata, in UTF-8 bytes", minimum=0, maximum=1 << 20,
            unit="bytes"),
    _broker("offsets.retention.minutes", "int", 10080,
            "how long Kafka keeps the committed offsets of an empty group", minimum=1,
            unit="minutes", status=IGNORED,
            why="committed offsets are kept until the group is deleted (`logkit groups "
                "delete`) or their topic is; they never expire"),
    _broker("group.initial.rebalance.delay.ms", "int", 3000,
            "how long Kafka waits for more members before the first rebalance of a new "
            "group", minimum=0, unit="ms", status=IGNORED,
            why="embedded groups (broker.consumer) rebalance at every join at once; members "
                "learn the result on their next poll, so a group formed by several members "
                "may go through a few quick generations. The Kafka listener's wire groups "
                "take this delay as `broker.serve(initial_rebalance_delay_ms=...)`, default "
                "0 (docs/kafka-protocol.md)"),
    _broker("default.replication.factor", "int", 1, "replicas of a topic created without "
            "replication_factor: the leader and the first replication_factor - 1 "
            "followers to report (docs/replication.md)", minimum=1, maximum=32767,
            unit="replicas"),
    _broker("replica.lag.time.max.ms", "int", 30000, "a follower that has not been caught "
            "up to the leader's log end for this long leaves the ISR",
            minimum=1, unit="ms"),
    _broker("replica.fetch.max.bytes", "int", 1048576, "bytes of whole batches a "
            "logkit.Follower copies per partition per request (at least one batch)",
            minimum=1, maximum=INT_MAX, unit="bytes"),
    _broker("replica.fetch.wait.max.ms", "int", 500, "how long a caught-up "
            "logkit.Follower waits for new data before asking its source again",
            minimum=0, unit="ms"),
    _broker("replica.fetch.backoff.ms", "int", 1000, "how long a logkit.Follower waits "
            "after its source failed before trying again", minimum=0, unit="ms"),
    _broker("ship.interval.ms", "int", 1000, "how often broker.ship(url) uploads the "
            "active segment's new batches and a new manifest (rolled segments go as soon "
            "as a pass sees them)", minimum=10, unit="ms"),
    _broker("broker.id", "int", -1, "this replica's node id on the Kafka listener "
            "(Metadata's broker, leader, replica and ISR ids); -1: 1 for a root that never "
            "followed, else a number made from its follower id (docs/kafka-protocol.md)",
            minimum=-1, maximum=INT_MAX, unit="id"),
    _broker("broker.session.timeout.ms", "int", 10000, "the leader's lease: a replicated "
            "leader renews it every third of this; a follower promotes itself once it "
            "goes unrenewed this long (docs/replication.md)", minimum=1000, unit="ms"),

    _broker("log.cleanup.policy", "any", "delete", "default of cleanup.policy",
            check=_cleanup_policy, shape="'delete', 'compact' or 'compact,delete'"),
    _broker("log.cleaner.enable", "bool", True, "run the background cleaner in every "
            "writable Broker (compacted topics are cleaned only by Partition.compact() "
            "and `logkit topics compact` when off)"),
    _broker("log.cleaner.backoff.ms", "int", 15000, "how long the background cleaner "
            "sleeps when no partition is due", minimum=0, unit="ms"),
    _broker("log.cleaner.dedupe.buffer.size", "int", 134217728, "memory of the cleaner's "
            "key -> offset map: 24 bytes per key as Kafka counts it (a pass that meets more "
            "keys cleans up to where the map filled and leaves the rest for the next)",
            minimum=1 << 16, unit="bytes"),
    _broker("log.cleaner.io.buffer.load.factor", "any", 0.9, "how full the cleaner's "
            "key map may get", check=_ratio_above_zero, shape="float in (0, 1]"),
    _broker("log.cleaner.threads", "int", 1, "Kafka's cleaner threads per broker",
            minimum=1, status=IGNORED, why="each writable Broker runs one cleaner thread; "
            "several processes on one directory clean different partitions at once"),
    _broker("log.cleaner.min.cleanable.ratio", "any", 0.5,
            "default of min.cleanable.dirty.ratio", check=_ratio, shape="float in [0, 1]"),
    _broker("log.cleaner.min.compaction.lag.ms", "int", 0,
            "default of min.compaction.lag.ms", minimum=0, unit="ms"),
    _broker("log.cleaner.max.compaction.lag.ms", "int", LONG_MAX,
            "default of max.compaction.lag.ms", minimum=1, unit="ms"),
    _broker("log.cleaner.delete.retention.ms", "int", 86400000,
            "default of delete.retention.ms", minimum=0, unit="ms"),

    # ---- topic: Kafka's topic names
    _topic("cleanup.policy", "'delete': retention deletes old segments; 'compact': the "
           "cleaner keeps the latest record of every key (retention.ms/bytes not applied); "
           "'compact,delete': both (docs/storage.md)", inherit="log.cleanup.policy"),
    _topic("min.cleanable.dirty.ratio", "the background cleaner cleans a compacted "
           "partition once its uncleaned bytes are this share of its cleanable bytes",
           inherit="log.cleaner.min.cleanable.ratio"),
    _topic("min.compaction.lag.ms", "records younger than this are never compacted",
           inherit="log.cleaner.min.compaction.lag.ms"),
    _topic("max.compaction.lag.ms", "a record is compacted at the latest this long after "
           "it was written, whatever the dirty ratio",
           inherit="log.cleaner.max.compaction.lag.ms"),
    _topic("delete.retention.ms", "a tombstone (null value) survives this long after the "
           "cleaning pass that first saw it (KIP-534's delete horizon, stamped in its "
           "batch)", inherit="log.cleaner.delete.retention.ms"),
    _topic("retention.ms", "delete segments whose newest record is older; -1 keeps all",
           inherit="log.retention.ms"),
    _topic("retention.bytes", "delete the oldest segments while the log is bigger; -1 off",
           inherit="log.retention.bytes"),
    _topic("segment.bytes", "roll the active segment at this size",
           inherit="log.segment.bytes"),
    _topic("segment.ms", "roll the active segment when it is this old",
           inherit="log.roll.ms"),
    _topic("segment.index.bytes", "preallocated size of each offset and time index",
           inherit="log.index.size.max.bytes"),
    _topic("index.interval.bytes", "log bytes between two offset index entries",
           inherit="log.index.interval.bytes"),
    _topic("max.message.bytes", "largest record batch the log accepts",
           inherit="message.max.bytes"),
    _topic("flush.messages", "fsync after this many unflushed records (1: every append)",
           inherit="log.flush.interval.messages"),
    _topic("flush.ms", "fsync when the oldest unflushed write is this old",
           inherit="log.flush.interval.ms"),
    _topic("file.delete.delay.ms", "keep a retired segment as .deleted this long",
           inherit="log.segment.delete.delay.ms"),
    _topic("message.timestamp.type", "CreateTime keeps the producer's timestamps; "
           "LogAppendTime stamps the append time", inherit="log.message.timestamp.type"),
    _topic("compression.type", "'producer' stores batches as sent; a codec name refuses "
           "batches compressed otherwise", inherit="compression.type"),
    _topic("min.insync.replicas", "acks='all' needs this many in-sync replicas; without "
           "replication the leader is the only one, so a value above 1 fails acks='all' "
           "sends with NotEnoughReplicasError (as Kafka does with one replica)",
           inherit="min.insync.replicas"),
    _topic("preallocate", "Kafka creates each segment file at full size",
           inherit="log.preallocate", status=IGNORED, why=_NO_PREALLOCATE),

    # ---- producer: kafka-python's keywords, Kafka's names and defaults
    _client(PRODUCER, "acks", "any", 1, "0: do not wait; 1: wait for the append; 'all' "
            "(-1): also wait for the in-sync replicas (see min.insync.replicas)",
            check=_acks, shape="0, 1, -1, 'all'"),
    _client(PRODUCER, "linger.ms", "int", 0, "how long a batch waits for more records",
            minimum=0, unit="ms"),
    _client(PRODUCER, "batch.size", "int", 16384, "seal a partition's batch at this size",
            minimum=0, unit="bytes"),
    _client(PRODUCER, "compression.type", "str", None, "codec of the batches written; "
            "None writes them uncompressed", nullable=True, choices=_CODECS),
    _client(PRODUCER, "buffer.memory", "int", 33554432, "bytes held by open and sealed "
            "batches; send() blocks when it is used up", minimum=0, unit="bytes"),
    _client(PRODUCER, "max.block.ms", "int", 60000, "how long send() waits for buffer "
            "space or a partition's append lock", minimum=0, unit="ms"),
    _client(PRODUCER, "max.request.size", "int", 1048576, "largest record send() takes",
            minimum=0, unit="bytes"),
    _client(PRODUCER, "delivery.timeout.ms", "int", 120000, "a batch not stored this long "
            "after it was opened fails with LogkitTimeoutError", minimum=0, unit="ms"),
    _client(PRODUCER, "key.serializer", "callable", None, "key -> bytes", nullable=True),
    _client(PRODUCER, "value.serializer", "callable", None, "value -> bytes", nullable=True),
    _client(PRODUCER, "partitioner.class", "any", None, "None: Kafka's (murmur2 for keys, "
            "sticky for null keys); 'round_robin'; or a callable (key, all_partitions, "
            "available) -> partition", keyword="partitioner", nullable=True,
            check=_partitioner, shape="None, 'round_robin', callable"),
    _client(PRODUCER, "client.id", "str", "logkit-producer", "the client's name in Kafka's "
            "request logs", status=IGNORED, why=_NO_REQUESTS),
    _client(PRODUCER, "retries", "int", 0, "how often Kafka resends a failed request",
            minimum=0, status=IGNORED,
            why="an append is local and is never retried: a failed append fails its "
                "records' futures at once"),
    _client(PRODUCER, "request.timeout.ms", "int", 30000, "acks='all' to a replicated "
            "topic: how long a stored batch waits for the in-sync replicas before its "
            "futures fail with LogkitTimeoutError (the records stay in the log)",
            minimum=0, unit="ms"),
    _client(PRODUCER, "enable.idempotence", "bool", None, "a producer id and epoch, and "
            "a sequence number per batch, so a batch is never stored twice; None: True "
            "exactly when acks='all' (Kafka's rule); True with acks 0 or 1 is refused; "
            "a transactional producer implies it", nullable=True),
    _client(PRODUCER, "transactional.id", "str", None, "makes a transactional producer "
            "(init_transactions, begin/commit/abort_transaction); implies "
            "enable_idempotence and acks='all'; one namespace with the Kafka listener's "
            "producers", nullable=True),
    _client(PRODUCER, "transaction.timeout.ms", "int", 60000, "an open transaction older "
            "than this is aborted by the coordinator (and the producer fenced)",
            minimum=1, maximum=900000, unit="ms"),
    _client(PRODUCER, "bootstrap.servers", "any", None, "Kafka brokers to connect to",
            nullable=True, status=REFUSED, shape="str or list of str",
            why="the producer writes to the Broker it is made from (broker.producer()); "
                "remove the option"),

    # ---- consumer: kafka-python's keywords, Kafka's names and defaults
    _client(CONSUMER, "group.id", "str", None, "join this group (with subscribe) and "
            "commit to it; None reads without a group", nullable=True),
    _client(CONSUMER, "client.id", "str", "logkit-consumer", "prefix of the member id, "
            "shown by group.members()"),
    _client(CONSUMER, "auto.offset.reset", "str", "latest", "where to start without a "
            "valid committed offset; 'none' raises NoOffsetForPartitionError",
            choices=("earliest", "latest", "none")),
    _client(CONSUMER, "enable.auto.commit", "bool", True, "commit positions every "
            "auto_commit_interval_ms from poll(), on revocation and on close()"),
    _client(CONSUMER, "auto.commit.interval.ms", "int", 5000, "period of auto-commits",
            minimum=1, unit="ms"),
    _client(CONSUMER, "max.poll.records", "int", 500, "most records one poll() returns",
            minimum=1, unit="records"),
    _client(CONSUMER, "fetch.max.bytes", "int", 52428800, "value bytes one poll() reads "
            "at most (at least one record)", minimum=1, unit="bytes"),
    _client(CONSUMER, "max.partition.fetch.bytes", "int", 1048576, "bytes read from one "
            "partition per poll() at most (at least one batch)", minimum=1, unit="bytes"),
    _client(CONSUMER, None, "any", float("inf"), "iteration (for record in consumer) ends "
            "after this long without a record", keyword="consumer_timeout_ms",
            check=_timeout_or_forever, unit="ms", shape="int or float('inf')"),
    _client(CONSUMER, None, "int", 0, "a poll() with nothing to return spins this long on "
            "the doorbell before it sleeps (CPU for wake-up latency; 0: sleep at once)",
            keyword="poll_spin_us", minimum=0, maximum=10000, unit="µs"),
    _client(CONSUMER, "session.timeout.ms", "int", 45000, "a member without a heartbeat "
            "this long is evicted", minimum=1, unit="ms"),
    _client(CONSUMER, "heartbeat.interval.ms", "int", 3000, "period of the heartbeat "
            "thread", minimum=1, unit="ms"),
    _client(CONSUMER, "max.poll.interval.ms", "int", 300000, "a member that does not poll "
            "this long is evicted", minimum=1, unit="ms"),
    _client(CONSUMER, "partition.assignment.strategy", "any", "range", "the assignor: "
            "range, roundrobin, sticky or cooperative-sticky (of a list, the first)",
            check=_strategy, shape="str or list of str"),
    _client(CONSUMER, "key.deserializer", "callable", None, "bytes -> key", nullable=True),
    _client(CONSUMER, "value.deserializer", "callable", None, "bytes -> value",
            nullable=True),
    _client(CONSUMER, None, "callable", None, "called with the partitions assigned at a "
            "rebalance", keyword="on_assign", nullable=True),
    _client(CONSUMER, None, "callable", None, "called with the partitions revoked at a "
            "rebalance (before they are committed and released)", keyword="on_revoke",
            nullable=True),
    _client(CONSUMER, "isolation.level", "str", "read_uncommitted", "read_committed hides "
            "records of open or aborted transactions",
            choices=("read_uncommitted", "read_committed"),
            why="Kafka's two levels; any other value is refused"),
    _client(CONSUMER, "bootstrap.servers", "any", None, "Kafka brokers to connect to",
            nullable=True, status=REFUSED, shape="str or list of str",
            why="the consumer reads the Broker it is made from (broker.consumer()); "
                "remove the option"),

    # ---- Spark source (reads): Spark's Kafka source names, case-insensitive
    _spark(SPARK_READ, "path", "str", None, "the broker directory, e.g. "
           ".option('path', 'data/'), or the URL a leader's broker.ship() writes to "
           "(s3://bucket/prefix: options prefixed fs. go to fsspec; docs/spark.md)",
           required=True),
    _spark(SPARK_READ, "subscribe", "str", None, "topics to read, comma-separated (one of "
           "subscribe, subscribePattern, assign)", nullable=True),
    _spark(SPARK_READ, "subscribePattern", "str", None, "a regular expression over topic "
           "names", nullable=True),
    _spark(SPARK_READ, "assign", "str", None, 'JSON {"topic": [0, 1]}: these partitions',
           nullable=True),
    _spark(SPARK_READ, "startingOffsets", "str", None, "'earliest', 'latest' or JSON "
           '{"topic": {"0": 42}} (-2 earliest, -1 latest); default earliest for batch '
           "reads, latest for streams", nullable=True),
    _spark(SPARK_READ, "endingOffsets", "str", "latest", "batch reads only: 'latest' or "
           "JSON as startingOffsets (-1 latest)"),
    _spark(SPARK_READ, "maxOffsetsPerTrigger", "int", None, "records per micro-batch at "
           "most, spread over partitions by backlog", minimum=1, nullable=True,
           unit="records"),
    _spark(SPARK_READ, "minPartitions", "int", None, "at least this many Spark input "
           "partitions", minimum=1, nullable=True, unit="partitions"),
    _spark(SPARK_READ, "maxRecordsPerPartition", "int", None, "records per Spark input "
           "partition at most", minimum=1, nullable=True, unit="records"),
    _spark(SPARK_READ, "includeHeaders", "bool", False, "add the headers column"),
    _spark(SPARK_READ, "failOnDataLoss", "bool", True, "fail when retention removed "
           "offsets before they were read; false skips them"),
    _spark(SPARK_READ, "kafka.isolation.level", "str", "read_uncommitted",
           "read_committed stops at each partition's last stable offset and leaves out "
           "aborted transactions' records", choices=("read_uncommitted", "read_committed"),
           why="Kafka's two levels; any other value is refused"),
    _spark(SPARK_READ, "kafka" + PREFIX, "str", None, "Kafka consumer settings "
           "(kafka.bootstrap.servers, ...)", nullable=True, status=IGNORED,
           why=_NO_KAFKA_CLIENT),
    _spark(SPARK_READ, "groupIdPrefix", "str", None, "prefix of the Kafka consumer group "
           "Spark uses", nullable=True, status=IGNORED,
           why="no consumer group is used: offsets live in Spark's checkpoint, as with "
               "Spark's Kafka source"),
    _spark(SPARK_READ, "kafkaConsumer.pollTimeoutMs", "int", None, "Kafka fetch timeout",
           minimum=0, nullable=True, unit="ms", status=IGNORED, why=_NO_KAFKA_CLIENT),
    _spark(SPARK_READ, "fetchOffset.numRetries", "int", None, "Kafka offset-fetch retries",
           minimum=0, nullable=True, status=IGNORED, why=_NO_KAFKA_CLIENT),
    _spark(SPARK_READ, "fetchOffset.retryIntervalMs", "int", None, "Kafka offset-fetch "
           "retry interval", minimum=0, nullable=True, unit="ms", status=IGNORED,
           why=_NO_KAFKA_CLIENT),
    *(_spark(SPARK_READ, name, "str", None, doc, nullable=True, status=REFUSED,
             why="not built: give offsets in startingOffsets / endingOffsets JSON "
                 "(Partition.offset_for_timestamp finds the offset of a time)")
      for name, doc in (("startingTimestamp", "start every partition at a time"),
                        ("startingOffsetsByTimestamp", "start each partition at a time"),
                        ("startingOffsetsByTimestampStrategy", "what to do when no "
                         "offset matches a starting timestamp"),
                        ("endingTimestamp", "end every partition at a time"),
                        ("endingOffsetsByTimestamp", "end each partition at a time"))),
    *(_spark(SPARK_READ, name, "str", None, doc, nullable=True, status=REFUSED,
             why="not built: maxOffsetsPerTrigger is the only trigger limit")
      for name, doc in (("minOffsetsPerTrigger", "wait for this many records per "
                         "micro-batch"),
                        ("maxTriggerDelay", "longest wait for minOffsetsPerTrigger"))),
    *(_spark(SPARK_READ, side + what, "str", None, doc.format(side=side), nullable=True)
      for side in ("key", "value") for what, doc in _SPARK_TYPED),
    _spark(SPARK_READ, "failOnDecodeError", "bool", True, "with keyFormat/valueFormat: "
           "fail the query at a record that does not decode (naming topic, partition, "
           "offset); false reads it with a null typed column and a WARNING"),

    # ---- Spark sink (writes)
    _spark(SPARK_WRITE, "path", "str", None, "the broker directory", required=True),
    _spark(SPARK_WRITE, "topic", "str", None, "topic of rows without a topic column",
           nullable=True),
    _spark(SPARK_WRITE, "sinkId", "str", None, "identity of a streaming sink for its "
           "exactly-once commits (default: the query id from checkpointLocation)",
           nullable=True),
    _spark(SPARK_WRITE, "checkpointLocation", "str", None, "Spark's checkpoint; its query "
           "id names a streaming sink without sinkId", nullable=True),
    _spark(SPARK_WRITE, "queryName", "str", None, "names a streaming sink with neither "
           "sinkId nor a checkpoint metadata file", nullable=True),
    _spark(SPARK_WRITE, "kafka" + PREFIX, "str", None, "Kafka producer settings "
           "(kafka.bootstrap.servers, ...)", nullable=True, status=IGNORED,
           why="the sink appends to the log files itself; there is no Kafka client to "
               "pass them to (accepted so Kafka jobs run unchanged)"),
    *(_spark(SPARK_WRITE, side + what, "str", None, doc.format(side=side), nullable=True)
      for side in ("key", "value") for what, doc in _SPARK_TYPED),
)


def _inherit(rows: Iterable[Setting]) -> tuple[Setting, ...]:
    """Fill each inheriting topic row from its broker row: one default, one set of
    bounds."""
    rows = tuple(rows)
    broker = {row.name: row for row in rows if row.scope == BROKER}
    out = []
    for row in rows:
        if row.inherit is not None:
            source = broker[row.inherit]
            row = replace(row, kind=source.kind, default=source.default,
                          minimum=source.minimum, maximum=source.maximum,
                          choices=source.choices, unit=source.unit, check=source.check,
                          shape=source.shape)
        out.append(row)
    return tuple(out)


SETTINGS: tuple[Setting, ...] = _inherit(_ROWS)


def _index(rows: Iterable[Setting]) -> dict[str, dict[str, Setting]]:
    table: dict[str, dict[str, Setting]] = {scope: {} for scope in SCOPES}
    for row in rows:
        assert row.key not in table[row.scope], (row.scope, row.key)   # each key once
        table[row.scope][row.key] = row
    return table


TABLE = _index(SETTINGS)
TOPIC_CONFIG = TABLE[TOPIC]
BROKER_CONFIG = TABLE[BROKER]
# Which broker key supplies the default of which topic key (Kafka's mapping).
BROKER_TO_TOPIC = {row.inherit: row.name for row in TOPIC_CONFIG.values() if row.inherit}
_FOLDED = {scope: {key.lower(): row for key, row in TABLE[scope].items()}
           for scope in SPARK_SCOPES}
_PREFIXES = {scope: [(key[:-len(PREFIX)].lower() + ".", row)
                     for key, row in TABLE[scope].items() if key.endswith(PREFIX)]
             for scope in SCOPES}


# ---- lookup and coercion ----------------------------------------------------------------

def lookup(scope: str, key: Any) -> Setting:
    """The row of `key` in `scope`, or ConfigError saying what to write instead."""
    table = TABLE[scope]
    where = _WHERE[scope]
    if not isinstance(key, str):
        raise ConfigError(f"{where} keys are strings, got {key!r}")
    row = table.get(key)
    if row is None and scope in SPARK_SCOPES:
        row = _FOLDED[scope].get(key.lower())
    if row is None:
        folded = key.lower()
        for prefix, prefixed in _PREFIXES[scope]:
            if folded.startswith(prefix):
                return prefixed
    if row is not None:
        return row
    if scope in CLIENT_SCOPES:
        for candidate in table.values():
            if key == candidate.name:
                raise ConfigError(f"{where} {key!r} is Kafka's dotted name: write the "
                                  f"keyword {candidate.keyword}=...")
    offered = {name: name for name, row in table.items() if row.status != REFUSED}
    if scope in SPARK_SCOPES:                     # Spark passes names lower-cased
        offered = {name.lower(): name for name in offered}
    hint = [offered[m] for m in difflib.get_close_matches(
        key.lower() if scope in SPARK_SCOPES else key, list(offered), n=1)]
    known = ", ".join(sorted(offered.values()))
    raise ConfigError(f"unknown {where} {key!r}"
                      + (f"; did you mean {hint[0]!r}?" if hint else "")
                      + f" Known keys: {known}")


def coerce(row: Setting, value: Any) -> Any:
    """`value` typed for `row`, or ConfigError naming the key and what to write."""
    if row.status == REFUSED and not (value is None and row.default is None):
        raise ConfigError(f"{_WHERE[row.scope]} {row.label} is not supported by logkit: "
                          f"{row.why}")
    if value is None and row.nullable:
        return None
    kind = row.kind
    if kind == "any":
        assert row.check is not None
        return row.check(row, value)
    if kind == "callable":
        if not callable(value):
            raise _fail(row, "a callable" + (" or None" if row.nullable else ""), value)
        return value
    if kind == "bool":
        if isinstance(value, str) and value.lower() in ("true", "false"):
            return value.lower() == "true"
        if not isinstance(value, bool):
            raise _fail(row, "a boolean (True/False or the string 'true'/'false')", value)
        return value
    if kind == "int":
        return _integer(row, value)
    if not isinstance(value, str):
        raise _fail(row, "a string" + (" or None" if row.nullable else ""), value)
    if row.choices is not None and value not in row.choices:
        why = f" ({row.why})" if row.why else ""
        raise _fail(row, f"one of {', '.join(map(repr, row.choices))}{why}", value)
    return value


def _integer(row: Setting, value: Any) -> int:
    low, high = row.minimum, row.maximum
    what = ("a positive integer" if low == 1 else
            "a non-negative integer" if low == 0 else "an integer")
    if isinstance(value, str):
        try:
            value = int(value.strip())
        except ValueError:
            raise _fail(row, what, value) from None
    if isinstance(value, bool) or not isinstance(value, int):
        raise _fail(row, what, value)
    if low is not None and value < low:
        raise _fail(row, f">= {low}" + (f" ({what})" if low in (0, 1) else ""), value)
    if high is not None and value > high:
        raise _fail(row, f"<= {high}", value)
    return value


def resolve(scope: str, given: Mapping[str, Any] | None, *,
            defaults: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Every key of `scope` (except refused and prefix rows): `defaults` or the table's
    default, overlaid with `given`, each value coerced. Keys of the result are the
    table's (canonical spelling for Spark options)."""
    where = _WHERE[scope]
    if given is not None and not isinstance(given, Mapping):
        raise ConfigError(f"{where}s must be a dict, got {type(given).__name__}")
    defaults = defaults or {}
    resolved = {key: defaults.get(key, row.default) for key, row in TABLE[scope].items()
                if row.status != REFUSED and not key.endswith(PREFIX)}
    for key, value in (given or {}).items():
        row = lookup(scope, key)
        value = coerce(row, value)
        if row.key.endswith(PREFIX):
            continue
        if row.status == IGNORED and value != row.default:
            log.info("%s %s=%r is accepted and ignored: %s", where, row.label, value,
                     row.why)
        resolved[row.key] = value
    for key, row in TABLE[scope].items():
        if row.required and resolved.get(key) in (None, ""):
            raise ConfigError(f"{where} {key!r} is required: {row.doc}")
    return resolved


def resolve_config(scope: str, given: Mapping[str, Any] | None) -> dict[str, Any]:
    """Public: settings of one scope ('broker', 'topic', 'producer', 'consumer',
    'spark read', 'spark write') checked against logkit's table and completed with the
    defaults, or ConfigError naming the first bad key. Topic defaults here are Kafka's
    (a Broker applies its own log.* settings on top)."""
    if scope not in TABLE:
        raise ConfigError(f"unknown config scope {scope!r}; use one of {list(SCOPES)}")
    if scope == TOPIC:
        return resolve_topic_config(given, resolve_broker_config(None))
    return resolve(scope, given)


def resolve_broker_config(given: Mapping[str, Any] | None) -> dict[str, Any]:
    """Broker settings: Kafka's defaults overlaid with `given`."""
    return resolve(BROKER, given)


def topic_defaults(broker_config: Mapping[str, Any]) -> dict[str, Any]:
    """Topic defaults implied by broker settings (log.retention.ms -> retention.ms...)."""
    return {topic_key: broker_config[broker_key]
            for broker_key, topic_key in BROKER_TO_TOPIC.items()}


def resolve_topic_config(given: Mapping[str, Any] | None,
                         broker_config: Mapping[str, Any]) -> dict[str, Any]:
    """Topic settings: broker-implied defaults overlaid with `given`."""
    return resolve(TOPIC, given, defaults=topic_defaults(broker_config))


def check_topic_config(given: Mapping[str, Any] | None,
                       broker_config: Mapping[str, Any]) -> dict[str, Any]:
    """resolve_topic_config for a create or an alter: also Kafka's rule across keys
    (LogConfig's min.compaction.lag.ms <= max.compaction.lag.ms), ConfigError otherwise.
    Opening a stored topic resolves without it, as Kafka loads a log."""
    resolved = resolve_topic_config(given, broker_config)
    least, most = resolved["min.compaction.lag.ms"], resolved["max.compaction.lag.ms"]
    if least > most:
        raise ConfigError(f"conflict topic config setting min.compaction.lag.ms ({least}) "
                          f"> max.compaction.lag.ms ({most}), as Kafka refuses it")
    return resolved


def overrides_only(given: Mapping[str, Any] | None) -> dict[str, Any]:
    """Validate `given` and return just its typed entries (what a topic stores)."""
    if given is not None and not isinstance(given, Mapping):
        raise ConfigError(f"topic config must be a dict, got {type(given).__name__}")
    out = {}
    for key, value in (given or {}).items():
        row = lookup(TOPIC, key)
        out[row.key] = coerce(row, value)
    return out


# ---- documentation ----------------------------------------------------------------------

def _shown(value: Any) -> str:
    if value is None:
        return "None"
    if type(value) is int and value == LONG_MAX:
        return "2^63-1"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float) and value == float("inf"):
        return "float('inf')"
    return repr(value) if isinstance(value, str) else str(value)


def _bounds(row: Setting) -> str:
    if row.choices is not None:
        return ", ".join(map(_shown, row.choices))
    if row.minimum is None and row.maximum is None:
        return ""
    high = "" if row.maximum is None else ("2^31-1" if row.maximum == INT_MAX
                                           else str(row.maximum))
    return f"{'' if row.minimum is None else row.minimum}..{high}"


def markdown_flagged(status: str) -> str:
    """A bullet list of every key with `status` (ignored or refused), and why."""
    lines = []
    for row in SETTINGS:
        if row.status == status:
            name = row.keyword if row.scope in CLIENT_SCOPES else row.name
            lines.append(f"- `{name}` ({row.scope}): {row.why}")
    return "\n".join(lines) + "\n"


def markdown(scope: str) -> str:
    """The rows of one scope as a Markdown table (docs/configuration.md)."""
    client = scope in CLIENT_SCOPES
    head = ["Kafka name", "keyword"] if client else ["option" if scope in SPARK_SCOPES
                                                     else "name"]
    head += ["type", "default", "bounds", "unit", "status", "meaning"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in TABLE[scope].values():
        names = [f"`{row.name}`" if row.name else "—", f"`{row.keyword}`"] if client \
            else [f"`{row.name}`"]
        if row.required:
            default = "required"
        elif row.inherit:
            default = f"`{_shown(row.default)}` (from `{row.inherit}`)"
        else:
            default = f"`{_shown(row.default)}`"
        status = row.status if row.status == HONOURED else f"**{row.status}**: {row.why}"
        meaning = row.doc
        if row.status == HONOURED and row.why:
            meaning += f" ({row.why})"
        cells = names + [row.shape or row.kind, default, _bounds(row),
                         row.unit, status, meaning]
        lines.append("| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |")
    return "\n".join(lines) + "\n"
