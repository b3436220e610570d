"""Settings tables: Kafka's names, types, defaults and bounds, in one place.

Owns: the topic config table (`TOPIC_CONFIG`), the broker config table
(`BROKER_CONFIG`), and validation of user-given dicts against them. Invariant: every
config value logkit reads went through `resolve_*`, so it is known, typed and in range;
an unknown key or a bad value raises `ConfigError` naming the key.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from .errors import ConfigError

__all__ = ["Setting", "TOPIC_CONFIG", "BROKER_CONFIG", "resolve_topic_config",
           "resolve_broker_config", "LONG_MAX", "INT_MAX"]

LONG_MAX = 9223372036854775807
INT_MAX = 2147483647              # Kafka's INT settings: positions in an index are int32


@dataclass(frozen=True)
class Setting:
    """One config key: its type, Kafka's default, its lowest value and what it means."""

    kind: type
    default: Any
    minimum: int | None = None
    maximum: int | None = None
    choices: tuple[str, ...] | None = None
    doc: str = ""


_INT = int
_STR = str
_BOOL = bool

# Topic configs: Kafka's names and Kafka's defaults. Units are in the names.
TOPIC_CONFIG: dict[str, Setting] = {
    "cleanup.policy": Setting(_STR, "delete", choices=("delete",),
                              doc="only 'delete' (retention); compaction is not built"),
    "retention.ms": Setting(_INT, 604800000, minimum=-1,
                            doc="delete segments whose newest record is older; -1 keeps all"),
    "retention.bytes": Setting(_INT, -1, minimum=-1,
                               doc="delete oldest segments while the log is bigger; -1 off"),
    "segment.bytes": Setting(_INT, 1073741824, minimum=1024, maximum=INT_MAX, doc="roll at this size"),
    "segment.ms": Setting(_INT, 604800000, minimum=1, doc="roll a segment this old"),
    "segment.index.bytes": Setting(_INT, 10485760, minimum=64, maximum=INT_MAX,
                                   doc="preallocated size of each offset/time index"),
    "index.interval.bytes": Setting(_INT, 4096, minimum=0, maximum=INT_MAX,
                                    doc="log bytes between two offset index entries"),
    "max.message.bytes": Setting(_INT, 1048588, minimum=64, maximum=INT_MAX,
                                 doc="largest record batch the log accepts"),
    "flush.messages": Setting(_INT, LONG_MAX, minimum=1,
                              doc="fsync after this many unflushed records (1: every append)"),
    "flush.ms": Setting(_INT, LONG_MAX, minimum=0,
                        doc="fsync when the oldest unflushed write is this old"),
    "file.delete.delay.ms": Setting(_INT, 60000, minimum=0,
                                    doc="keep a retired segment as .deleted this long"),
    "message.timestamp.type": Setting(_STR, "CreateTime",
                                      choices=("CreateTime", "LogAppendTime")),
    "compression.type": Setting(_STR, "producer",
                                choices=("producer", "uncompressed", "gzip", "snappy",
                                         "lz4", "zstd")),
    "min.insync.replicas": Setting(_INT, 1, minimum=1),
    "preallocate": Setting(_BOOL, False),
}

# Broker configs: Kafka's broker names. The log.* ones are defaults for topic configs.
BROKER_CONFIG: dict[str, Setting] = {
    "num.partitions": Setting(_INT, 1, minimum=1, doc="partitions of auto-created topics"),
    "auto.create.topics.enable": Setting(_BOOL, True),
    "log.retention.check.interval.ms": Setting(_INT, 300000, minimum=1,
                                               doc="background retention period"),
    "log.flush.scheduler.interval.ms": Setting(_INT, 1000, minimum=1,
                                               doc="how often flush.ms is checked"),
    "log.retention.ms": Setting(_INT, 604800000, minimum=-1),
    "log.retention.bytes": Setting(_INT, -1, minimum=-1),
    "log.segment.bytes": Setting(_INT, 1073741824, minimum=1024, maximum=INT_MAX),
    "log.roll.ms": Setting(_INT, 604800000, minimum=1),
    "log.index.size.max.bytes": Setting(_INT, 10485760, minimum=64, maximum=INT_MAX),
    "log.index.interval.bytes": Setting(_INT, 4096, minimum=0, maximum=INT_MAX),
    "message.max.bytes": Setting(_INT, 1048588, minimum=64, maximum=INT_MAX),
    "log.flush.interval.messages": Setting(_INT, LONG_MAX, minimum=1),
    "log.flush.interval.ms": Setting(_INT, LONG_MAX, minimum=0),
    "log.segment.delete.delay.ms": Setting(_INT, 60000, minimum=0),
    "log.message.timestamp.type": Setting(_STR, "CreateTime",
                                          choices=("CreateTime", "LogAppendTime")),
    "compression.type": Setting(_STR, "producer",
                                choices=("producer", "uncompressed", "gzip", "snappy",
                                         "lz4", "zstd")),
    "min.insync.replicas": Setting(_INT, 1, minimum=1),
    "log.preallocate": Setting(_BOOL, False),
    "offsets.retention.minutes": Setting(_INT, 10080, minimum=1),
    "offset.metadata.max.bytes": Setting(_INT, 4096, minimum=0, maximum=1 << 20,
                                         doc="longest commit metadata, in UTF-8 bytes"),
    "group.initial.rebalance.delay.ms": Setting(_INT, 3000, minimum=0),
}

# Which broker key supplies the default of which topic key (Kafka's mapping).
BROKER_TO_TOPIC = {
    "log.retention.ms": "retention.ms",
    "log.retention.bytes": "retention.bytes",
    "log.segment.bytes": "segment.bytes",
    "log.roll.ms": "segment.ms",
    "log.index.size.max.bytes": "segment.index.bytes",
    "log.index.interval.bytes": "index.interval.bytes",
    "message.max.bytes": "max.message.bytes",
    "log.flush.interval.messages": "flush.messages",
    "log.flush.interval.ms": "flush.ms",
    "log.segment.delete.delay.ms": "file.delete.delay.ms",
    "log.message.timestamp.type": "message.timestamp.type",
    "compression.type": "compression.type",
    "min.insync.replicas": "min.insync.replicas",
    "log.preallocate": "preallocate",
}


def coerce(table: Mapping[str, Setting], key: str, value: Any, *, where: str) -> Any:
    """Return `value` typed for `key`, or raise ConfigError naming the key."""
    setting = table.get(key)
    if setting is None:
        known = ", ".join(sorted(table))
        raise ConfigError(f"unknown {where} config {key!r}; known keys: {known}")
    kind = setting.kind
    if kind is bool:
        if isinstance(value, str) and value.lower() in ("true", "false"):
            return value.lower() == "true"
        if not isinstance(value, bool):
            raise ConfigError(f"{where} config {key!r} must be a boolean, got {value!r}")
        return value
    if kind is int:
        if isinstance(value, str):
            try:
                value = int(value)
            except ValueError:
                raise ConfigError(f"{where} config {key!r} must be an integer, "
                                  f"got {value!r}") from None
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{where} config {key!r} must be an integer, got {value!r}")
        if setting.minimum is not None and value < setting.minimum:
            raise ConfigError(f"{where} config {key!r} must be >= {setting.minimum}, "
                              f"got {value}")
        if setting.maximum is not None and value > setting.maximum:
            raise ConfigError(f"{where} config {key!r} must be <= {setting.maximum}, "
                              f"got {value}")
        return value
    if not isinstance(value, str):
        raise ConfigError(f"{where} config {key!r} must be a string, got {value!r}")
    if setting.choices is not None and value not in setting.choices:
        raise ConfigError(f"{where} config {key!r} must be one of {setting.choices}, "
                          f"got {value!r}")
    return value


def _resolve(table: Mapping[str, Setting], given: Mapping[str, Any] | None,
             defaults: Mapping[str, Any], where: str) -> dict[str, Any]:
    if given is not None and not isinstance(given, Mapping):
        raise ConfigError(f"{where} config must be a dict, got {type(given).__name__}")
    resolved = {key: defaults.get(key, setting.default) for key, setting in table.items()}
    for key, value in (given or {}).items():
        resolved[key] = coerce(table, key, value, where=where)
    return resolved


def resolve_broker_config(given: Mapping[str, Any] | None) -> dict[str, Any]:
    """Broker settings: Kafka's defaults overlaid with `given`."""
    return _resolve(BROKER_CONFIG, given, {}, "broker")


def topic_defaults(broker_config: Mapping[str, Any]) -> dict[str, Any]:
    """Topic defaults implied by broker settings (log.retention.ms -> retention.ms...)."""
    return {topic_key: broker_config[broker_key]
            for broker_key, topic_key in BROKER_TO_TOPIC.items()}


def resolve_topic_config(given: Mapping[str, Any] | None,
                         broker_config: Mapping[str, Any]) -> dict[str, Any]:
    """Topic settings: broker-implied defaults overlaid with `given`."""
    return _resolve(TOPIC_CONFIG, given, topic_defaults(broker_config), "topic")


def overrides_only(given: Mapping[str, Any] | None) -> dict[str, Any]:
    """Validate `given` and return just its typed entries (what a topic stores)."""
    if given is not None and not isinstance(given, Mapping):
        raise ConfigError(f"topic config must be a dict, got {type(given).__name__}")
    return {key: coerce(TOPIC_CONFIG, key, value, where="topic")
            for key, value in (given or {}).items()}


def snake_to_kafka(name: str) -> str:
    """'linger_ms' -> 'linger.ms': client keywords map onto Kafka's dotted names."""
    return name.replace("_", ".")


