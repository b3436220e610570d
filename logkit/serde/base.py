"""What every schema'd serde shares: its subject, its writer id, its decoders by id.

Owns: the part of AvroSerde, JsonSchemaSerde and ProtobufSerde that is not the format:
choosing the subject (a subject name strategy), getting the id to write with (register
the schema, look it up, or use the subject's latest version), framing, and a cache of
decoders keyed by the writer's schema id. Formats supply `_compile(schema, parsed)`
(an encoder and a decoder for one schema) and `_reader_decoder(writer)`.

Invariant: `serialize` either returns Confluent-framed bytes of a value that matches the
schema or raises `SerializationError` (naming the dotted field path when the value is at
fault; wrapping the registry's refusal when the schema is); `deserialize` either returns
a value or raises `SerializationError` for bytes that are not a frame, a schema id the
registry does not know, or a payload that does not decode. The id is resolved once,
under a lock; decoders are built once per writer id. Any thread may use a serde.
"""

from __future__ import annotations

import logging
import threading
from abc import ABC, abstractmethod
from typing import Any, Callable, Iterable

from ..compat import ParsedSchema
from ..compat.errors import SchemaRegistryError
from ..errors import ConfigError, LogkitError, SerializationError
from ..schema_registry import (SUBJECT_NAME_STRATEGIES, Reference, Schema, SchemaRegistry,
                               subject_name)
from . import wire

__all__ = ["SchemaSerde", "as_registry"]

log = logging.getLogger(__name__)

MAX_DECODERS = 1024          # writer ids a serde keeps decoders for, then starts over


def as_registry(registry: Any) -> SchemaRegistry:
    """A SchemaRegistry from a registry or a Broker."""
    if isinstance(registry, SchemaRegistry):
        return registry
    try:
        opener = registry.schema_registry       # a Broker hands out its own registry
    except AttributeError:
        raise ConfigError(f"expected a logkit SchemaRegistry or Broker, got "
                          f"{type(registry).__name__}") from None
    return opener()


class SchemaSerde(ABC):
    """Base of the schema'd serdes. Pass one as a producer's `value_serializer` (or
    `key_serializer` with `is_key=True`) and a consumer's `value_deserializer`: called
    with bytes it deserializes, with anything else it serializes. (For a schema whose
    values are bytes themselves, pass `serde.serialize` / `serde.deserialize`.)"""

    schema_type = "AVRO"
    uses_indexes = False

    def __init__(self, registry: Any, topic: str, schema: Any = None, *,
                 is_key: bool = False,
                 subject_name_strategy: str | Callable[[str, bool, str | None], str]
                 = "topic",
                 auto_register: bool = True, use_latest_version: bool = False,
                 references: Iterable[Any] | None = None) -> None:
        self.registry = as_registry(registry)
        if not isinstance(topic, str) or not topic:
            raise ConfigError(f"a serde needs its topic's name, got {topic!r}")
        self.topic = topic
        self.is_key = bool(is_key)
        self.auto_register = bool(auto_register)
        self.use_latest_version = bool(use_latest_version)
        self._strategy = subject_name_strategy
        self._references = tuple(references or ())
        self._lock = threading.Lock()
        self._writer: tuple[int, Callable[[Any], bytes]] | None = None
        self._decoders: dict[Any, Callable[[bytes], Any]] = {}
        self.schema: Schema | None = None
        self.parsed: ParsedSchema | None = None
        if schema is not None:
            self.schema, self.parsed = self._own_schema(schema)
            self._encode, self._decode = self._compile(self.schema, self.parsed)
        if not callable(subject_name_strategy) and \
                subject_name_strategy not in SUBJECT_NAME_STRATEGIES:
            subject_name(subject_name_strategy, topic, self.is_key, None)  # ConfigError

    def __repr__(self) -> str:
        return f"{type(self).__name__}(topic={self.topic!r}, is_key={self.is_key})"

    # -- format hooks --

    @abstractmethod
    def _own_schema(self, schema: Any) -> tuple[Schema, ParsedSchema]:
        """This format's Schema and parsed form for a user-given schema."""

    @abstractmethod
    def _compile(self, schema: Schema, parsed: ParsedSchema
                 ) -> tuple[Callable[[Any], bytes], Callable[[bytes], Any]]:
        """(encode value -> payload, decode payload -> value) for one schema."""

    @abstractmethod
    def _reader_decoder(self, schema_id: int, writer: Schema, parsed: ParsedSchema,
                        indexes: list[int] | None) -> Callable[[bytes], Any]:
        """A decoder for payloads written with `writer` into this serde's schema (or,
        without one, into the writer's)."""

    def _indexes(self) -> list[int] | None:
        return None

    # -- the subject and the id written --

    @property
    def subject(self) -> str:
        """The subject this serde registers under (its subject name strategy)."""
        return subject_name(self._strategy, self.topic, self.is_key,
                            self.parsed.record_name if self.parsed else None)

    def _registered(self) -> tuple[int, Callable[[Any], bytes]]:
        with self._lock:
            if self._writer is not None:
                return self._writer
            if self.use_latest_version:
                latest = self.registry.latest(self.subject)
                schema = Schema(latest.schema, latest.schema_type, latest.references)
                _, parsed = self.registry.get(latest.schema_id)
                encode = self._compile(schema, parsed)[0] if self.parsed is None or \
                    parsed.canonical != self.parsed.canonical else self._encode
                self._writer = (latest.schema_id, encode)
            elif self.schema is None:
                raise ConfigError(f"{type(self).__name__} for {self.topic!r} has no schema "
                                  "to serialize with (give one, or use_latest_version)")
            elif self.auto_register:
                schema_id = self.registry.register(
                    self.subject, self.schema.schema, self.schema_type,
                    references=self.schema.references)
                self._writer = (schema_id, self._encode)
            else:
                found = self.registry.lookup(self.subject, self.schema.schema,
                                             self.schema_type,
                                             references=self.schema.references)
                self._writer = (found.schema_id, self._encode)
            return self._writer

    @property
    def schema_id(self) -> int:
        """The id this serde writes with (registering the schema if it must)."""
        return self._registered()[0]

    # -- public --

    def serialize(self, value: Any) -> bytes | None:
        """Confluent-framed bytes of `value`; None stays None (a tombstone)."""
        if value is None:
            return None
        writer = self._writer
        if writer is None:
            try:
                writer = self._registered()
            except SchemaRegistryError as exc:
                raise SerializationError(f"the schema registry refused the schema for "
                                         f"subject {self.subject!r}: {exc}",
                                         topic=self.topic) from exc
        schema_id, encode = writer
        return wire.frame(schema_id, encode(value), self._indexes())

    def deserialize(self, data: bytes | None) -> Any:
        """The value in Confluent-framed `data`; None stays None."""
        if data is None:
            return None
        try:
            schema_id, indexes, payload = wire.unframe(data, indexes=self.uses_indexes)
            key = schema_id if indexes is None else (schema_id, tuple(indexes))
            decode = self._decoders.get(key)
            if decode is None:
                decode = self._decoder(schema_id, indexes, key)
            return decode(payload)
        except SerializationError as exc:
            if exc.topic is None:
                raise SerializationError(exc.message, topic=self.topic,
                                         field=exc.field) from exc
            raise

    def _decoder(self, schema_id: int, indexes: list[int] | None,
                 key: Any) -> Callable[[bytes], Any]:
        try:
            writer, parsed = self.registry.get(schema_id)
        except SchemaRegistryError as exc:
            raise SerializationError(f"unknown schema id {schema_id}: {exc}",
                                     topic=self.topic) from exc
        except LogkitError as exc:
            raise SerializationError(f"cannot read schema {schema_id} from the registry: "
                                     f"{exc}", topic=self.topic) from exc
        if writer.schema_type != self.schema_type:
            raise SerializationError(f"schema {schema_id} is {writer.schema_type}, not "
                                     f"{self.schema_type}", topic=self.topic)
        decode = self._reader_decoder(schema_id, writer, parsed, indexes)
        with self._lock:
            if len(self._decoders) >= MAX_DECODERS:
                self._decoders.clear()
            self._decoders[key] = decode
        return decode

    def __call__(self, value: Any) -> Any:
        if isinstance(value, (bytes, bytearray, memoryview)):
            return self.deserialize(value)
        return self.serialize(value)

    # -- helpers for formats --

    def _referenced(self, references: Iterable[Any]) -> list[tuple[Reference, Schema]]:
        """Each reference with its stored schema (read from the registry)."""
        out = []
        for ref in references:
            if isinstance(ref, dict):
                ref = Reference(ref["name"], ref["subject"], ref["version"])
            elif not isinstance(ref, Reference):
                ref = Reference(*ref)
            found = self.registry.version(ref.subject, ref.version, deleted=True)
            out.append((ref, Schema(found.schema, found.schema_type, found.references)))
        return out
