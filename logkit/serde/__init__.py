"""Serializers and deserializers for producers and consumers, Confluent-compatible.

Owns: the public names of the serde package. Pass a serde as a producer's
`value_serializer` / `key_serializer` and a consumer's `value_deserializer` /
`key_deserializer` (called with bytes it deserializes, with anything else it
serializes), or call `serialize(value)` / `deserialize(data)` directly.

- Schema'd, in Confluent's wire format (magic byte 0, 4-byte big-endian schema id,
  Protobuf's message indexes), against the embedded registry
  (`broker.schema_registry()`): `AvroSerde` (fastavro), `JsonSchemaSerde` (jsonschema),
  `ProtobufSerde` (protobuf). Records they write are read by confluent-kafka's
  deserializers pointed at `broker.serve_schema_registry()`, and the reverse.
- Plain, as Kafka's built-in serializers: `JsonSerde` (orjson when installed),
  `StringSerde`, `IntSerde`, `FloatSerde`, `UUIDSerde`.

The format libraries are optional (`pip install 'logkit[schemas]'`): this package
imports without them, and a serde whose library is missing raises
CodecUnavailableError when it is made. Invariant: every failure to convert raises
`SerializationError` (also `logkit.SerializationError`) with the topic and, for a value,
the dotted field path; a consumer adds partition and offset.
"""

import logging

from ..compat import LEVELS
from ..compat.errors import (IncompatibleSchemaError, InvalidCompatibilityLevelError,
                             InvalidSchemaError, InvalidSubjectError, InvalidVersionError,
                             SchemaNotFoundError, SchemaRegistryError,
                             SubjectConfigNotFoundError, SubjectNotFoundError,
                             SubjectNotSoftDeletedError, SubjectSoftDeletedError,
                             VersionNotFoundError, VersionNotSoftDeletedError,
                             VersionSoftDeletedError)
from ..errors import SerializationError
from ..schema_registry import (SUBJECT_NAME_STRATEGIES, Reference, RegisteredSchema, Schema,
                               SchemaRegistry, record_name_strategy,
                               topic_name_strategy, topic_record_name_strategy)
from .avro import AvroSerde
from .base import SchemaSerde
from .json_plain import JsonSerde
from .json_schema import JsonSchemaSerde
from .plain import FloatSerde, IntSerde, StringSerde, UUIDSerde
from .protobuf import ProtobufSerde

__all__ = [
    "AvroSerde", "JsonSchemaSerde", "ProtobufSerde", "JsonSerde", "StringSerde",
    "IntSerde", "FloatSerde", "UUIDSerde", "SchemaSerde", "SerializationError",
    "SchemaRegistry", "RegisteredSchema", "Schema", "Reference", "LEVELS",
    "SUBJECT_NAME_STRATEGIES", "topic_name_strategy", "record_name_strategy",
    "topic_record_name_strategy",
    "SchemaRegistryError", "SubjectNotFoundError", "VersionNotFoundError",
    "SchemaNotFoundError", "SubjectSoftDeletedError", "SubjectNotSoftDeletedError",
    "VersionSoftDeletedError", "VersionNotSoftDeletedError", "SubjectConfigNotFoundError",
    "IncompatibleSchemaError", "InvalidSchemaError", "InvalidVersionError",
    "InvalidCompatibilityLevelError", "InvalidSubjectError",
]

log = logging.getLogger(__name__)
