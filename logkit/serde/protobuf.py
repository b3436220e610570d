"""ProtobufSerde: Protobuf messages in Confluent's framing, message indexes included.

Owns: registering a generated message class's .proto file the way confluent-kafka's
ProtobufSerializer does (the base64 `FileDescriptorProto`, each imported file other than
Google's well-known types registered first under its own path as subject and named as a
reference), writing `SerializeToString()` after the prefix and the message-index path,
and reading back: into the given message class (after checking that the record's
indexes name that message in the writer's schema), or, without a class, into a message
class built from the writer's schema.

Invariant: a value that is not the serde's message (nor a dict that parses into it) or
misses a proto2 required field raises SerializationError naming the field; bytes that
do not parse, or whose indexes name another message, raise SerializationError.
"""

from __future__ import annotations

import logging
import base64
import importlib
from typing import Any, Callable

from ..compat import ParsedSchema, parse
from ..compat.protobuf import message_at, message_indexes
from ..errors import CodecUnavailableError, SerializationError
from ..schema_registry import Reference, Schema
from .base import SchemaSerde

__all__ = ["ProtobufSerde"]

log = logging.getLogger(__name__)

WELL_KNOWN_PREFIX = "google/protobuf/"


def _protobuf() -> Any:
    try:
        from google.protobuf import (descriptor_pool, json_format, message,
                                     message_factory)
    except ImportError:
        raise CodecUnavailableError("ProtobufSerde needs protobuf: pip install "
                                    "'logkit[schemas]'") from None
    return descriptor_pool, json_format, message, message_factory


class ProtobufSerde(SchemaSerde):
    """`ProtobufSerde(registry, topic, message_class, *, is_key=False)`: values are
    instances of the generated `message_class` (dicts are parsed into it). Without a
    class it only deserializes, into classes built from each record's writer schema."""

    schema_type = "PROTOBUF"
    uses_indexes = True

    def __init__(self, registry: Any, topic: str, message_class: Any = None,
                 **options: Any) -> None:
        (self._pool_module, self._json_format, self._message,
         self._factory) = _protobuf()
        self.message_class = message_class
        self.full_name: str | None = None
        self._message_indexes: list[int] | None = None
        schema = None
        if message_class is not None:
            descriptor = getattr(message_class, "DESCRIPTOR", None)
            if descriptor is None or not hasattr(descriptor, "full_name"):
                raise CodecUnavailableError(f"{message_class!r} is not a generated "
                                            "Protobuf message class")
            self.full_name = descriptor.full_name
            schema = base64.b64encode(descriptor.file.serialized_pb).decode("ascii")
        super().__init__(registry, topic, schema, **options)
        if message_class is not None:
            self._message_indexes = message_indexes(self.parsed.model.file, self.full_name)

    def _indexes(self) -> list[int] | None:
        return self._message_indexes

    # -- schema and references --

    def _dependency_references(self, file_descriptor: Any, depth: int = 0
                               ) -> tuple[Reference, ...]:
        """Register (or look up) each non-well-known import; their references."""
        references = []
        for dependency in file_descriptor.dependencies:
            if dependency.name.startswith(WELL_KNOWN_PREFIX) or depth > 16:
                continue
            inner = self._dependency_references(dependency, depth + 1)
            text = base64.b64encode(dependency.serialized_pb).decode("ascii")
            if self.auto_register:
                found = self.registry.register_version(dependency.name, text, "PROTOBUF",
                                                       references=inner)
            else:
                found = self.registry.lookup(dependency.name, text, "PROTOBUF",
                                             references=inner)
            references.append(Reference(dependency.name, dependency.name, found.version))
        return tuple(references)

    def _own_schema(self, schema: Any) -> tuple[Schema, ParsedSchema]:
        references = self._dependency_references(self.message_class.DESCRIPTOR.file)
        return Schema(schema, "PROTOBUF", references), parse("PROTOBUF", schema)

    # -- encoding --

    def _compile(self, schema: Schema, parsed: ParsedSchema
                 ) -> tuple[Callable[[Any], bytes], Callable[[bytes], Any]]:
        cls = self.message_class
        encode_error = self._message.EncodeError
        parse_error = self._json_format.ParseError
        topic = self.topic

        def encode(value: Any) -> bytes:
            if isinstance(value, dict):
                try:
                    value = self._json_format.ParseDict(value, cls())
                except parse_error as exc:
                    raise SerializationError(f"value does not match {self.full_name}: "
                                             f"{exc}", topic=topic) from exc
            if not isinstance(value, cls):
                raise SerializationError(f"expected a {self.full_name} message (or a dict), "
                                         f"got {type(value).__name__}", topic=topic)
            try:
                return value.SerializeToString()
            except encode_error as exc:
                missing = value.FindInitializationErrors()
                raise SerializationError(f"value does not match {self.full_name}: "
                                         f"required field(s) not set: "
                                         f"{', '.join(missing)}", topic=topic,
                                         field=missing[0] if missing else None) from exc

        return encode, self._reading(cls, None)

    def _reading(self, cls: Any, writer_file: Any) -> Callable[[bytes], Any]:
        decode_error = self._message.DecodeError

        def decode(payload: bytes) -> Any:
            try:
                return cls.FromString(payload)
            except (decode_error, RuntimeError, ValueError) as exc:
                raise SerializationError(f"the Protobuf payload does not parse as "
                                         f"{cls.DESCRIPTOR.full_name}: {exc}") from exc
        return decode

    def _reader_decoder(self, schema_id: int, writer: Schema, parsed: ParsedSchema,
                        indexes: list[int] | None) -> Callable[[bytes], Any]:
        try:
            name = message_at(parsed.model.file, indexes or [0])
        except KeyError as exc:
            raise SerializationError(f"schema {schema_id} has no message at index path "
                                     f"{indexes}") from exc
        if self.message_class is not None:
            if name != self.full_name:
                raise SerializationError(f"the record holds a {name} (schema {schema_id}), "
                                         f"not a {self.full_name}")
            return self._decode
        return self._reading(self._dynamic_class(writer, parsed, name), parsed.model.file)

    def message_class_for(self, schema_id: int, indexes: Any = (0,)) -> Any:
        """A message class built from registered schema `schema_id`: the message at
        Confluent's index path `indexes` (default the file's first). For readers that
        hold a registered schema but no generated code (the Spark data source)."""
        writer, parsed = self.registry.get(schema_id)
        try:
            name = message_at(parsed.model.file, list(indexes))
        except KeyError as exc:
            raise SerializationError(f"schema {schema_id} has no message at index path "
                                     f"{list(indexes)}") from exc
        return self._dynamic_class(writer, parsed, name)

    def message_class_from_text(self, text: str, indexes: Any = (0,)) -> Any:
        """A message class built from .proto text (or Confluent's base64 descriptor)
        without protoc, by the same parser the registry uses: the message at index path
        `indexes` (default the file's first). Imports other than Google's well-known
        types need the registry (register the files and use `message_class_for`).
        Invalid text raises InvalidSchemaError, as registering it would."""
        parsed = parse("PROTOBUF", text)
        try:
            name = message_at(parsed.model.file, list(indexes))
        except KeyError as exc:
            raise SerializationError(f"the schema has no message at index path "
                                     f"{list(indexes)}") from exc
        return self._dynamic_class(Schema(text, "PROTOBUF"), parsed, name)

    def _dynamic_class(self, writer: Schema, parsed: ParsedSchema, name: str) -> Any:
        pool = self._pool_module.DescriptorPool()
        added: set[str] = set()

        def add(file: Any, references: tuple[Reference, ...], depth: int) -> None:
            for dependency in file.dependency:
                if dependency in added:
                    continue
                if dependency.startswith(WELL_KNOWN_PREFIX):
                    module = dependency[len(WELL_KNOWN_PREFIX):-len(".proto")] + "_pb2"
                    try:
                        well_known = importlib.import_module(f"google.protobuf.{module}")
                    except ImportError:
                        continue
                    pool.AddSerializedFile(well_known.DESCRIPTOR.serialized_pb)
                    added.add(dependency)
            for _, referenced in self._referenced(references):
                if depth < 16:
                    ref_parsed = parse("PROTOBUF", referenced.schema)
                    if ref_parsed.model.file.name not in added:
                        add(ref_parsed.model.file, referenced.references, depth + 1)
            if file.name not in added:
                pool.Add(file)
                added.add(file.name)

        try:
            add(parsed.model.file, writer.references, 0)
            return self._factory.GetMessageClass(pool.FindMessageTypeByName(name))
        except (TypeError, KeyError, ValueError) as exc:
            raise SerializationError(f"cannot build a message class for {name} from its "
                                     f"schema: {exc}") from exc
