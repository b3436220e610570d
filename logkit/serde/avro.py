"""AvroSerde: Avro binary in Confluent's framing, through fastavro.

Owns: encoding a value with its schema (fastavro's schemaless writer, which is what
Confluent's AvroSerializer writes after the five-byte prefix, byte for byte) and
decoding with Avro's schema resolution: each record is read with the schema it was
written with (looked up by the id in its prefix) into this serde's schema, so an old
consumer and a new one each see records in their own shape.

Invariant: a value fastavro refuses is re-checked by logkit.compat.avro.find_error to
name the dotted field path in the `SerializationError`; a payload that does not decode,
or leaves bytes over, raises `SerializationError` (never a partial value).
"""

from __future__ import annotations

import logging
import io
import json
import struct
from typing import Any, Callable

from ..compat import ParsedSchema, parse
from ..compat.avro import PRIMITIVES, find_error
from ..errors import CodecUnavailableError, SerializationError
from ..schema_registry import Schema, _references
from .base import SchemaSerde

__all__ = ["AvroSerde"]

log = logging.getLogger(__name__)

# What fastavro raises for a value that does not fit, or bytes that do not decode.
_ENCODE_ERRORS = (ValueError, TypeError, KeyError, AttributeError, OverflowError,
                  struct.error)
_DECODE_ERRORS = (ValueError, TypeError, KeyError, IndexError, EOFError, OverflowError,
                  UnicodeDecodeError, StopIteration, struct.error)


def _fastavro() -> Any:
    try:
        import fastavro
    except ImportError:
        raise CodecUnavailableError("AvroSerde needs fastavro: pip install "
                                    "'logkit[schemas]'") from None
    return fastavro


class AvroSerde(SchemaSerde):
    """`AvroSerde(registry, topic, schema, *, is_key=False)`: `schema` is Avro schema
    JSON text or its dict, or a primitive's name ("string"), or None to decode with each
    record's writer schema.
    Values are dicts (records), or whatever fastavro accepts for the schema.
    `return_named_type=True`: a decoded union value of a named type (record, enum,
    fixed) is a `(full name, value)` pair, which says which branch it was (fastavro's
    option of that name; the Spark source uses it for unions of several types)."""

    schema_type = "AVRO"

    def __init__(self, registry: Any, topic: str, schema: Any = None, *,
                 return_named_type: bool = False, **options: Any) -> None:
        self._fastavro = _fastavro()
        self._return_named_type = bool(return_named_type)
        super().__init__(registry, topic, schema, **options)

    def _own_schema(self, schema: Any) -> tuple[Schema, ParsedSchema]:
        text = schema if isinstance(schema, str) else json.dumps(schema)
        if text in PRIMITIVES:                   # "string" for '"string"'
            text = json.dumps(text)
        references = _references(self._references)
        parsed = parse("AVRO", text, [self.registry.get(
            self.registry.version(r.subject, r.version, deleted=True).schema_id)[1]
            for r in references])
        return Schema(text, "AVRO", references), parsed

    def _parsed_fast(self, schema: Schema) -> Any:
        named: dict[str, Any] = {}
        for _, referenced in self._referenced(schema.references):
            self._fastavro.parse_schema(json.loads(referenced.schema), named_schemas=named)
        return self._fastavro.parse_schema(json.loads(schema.schema), named_schemas=named)

    def _compile(self, schema: Schema, parsed: ParsedSchema
                 ) -> tuple[Callable[[Any], bytes], Callable[[bytes], Any]]:
        fast = self._parsed_fast(schema)
        if schema is self.schema:
            self._fast = fast
        writer = self._fastavro.schemaless_writer
        topic = self.topic

        def encode(value: Any) -> bytes:
            buffer = io.BytesIO()
            try:
                writer(buffer, fast, value)
            except _ENCODE_ERRORS as exc:
                found = find_error(parsed.model, value)
                if found is None:
                    raise SerializationError(f"value does not match the Avro schema: "
                                             f"{exc}", topic=topic) from exc
                path, what = found
                raise SerializationError(f"value does not match the Avro schema at "
                                         f"{path or '<root>'}: {what}", topic=topic,
                                         field=path) from exc
            return buffer.getvalue()

        return encode, self._reading(fast, None)

    def _reading(self, writer_fast: Any, reader_fast: Any) -> Callable[[bytes], Any]:
        reader = self._fastavro.schemaless_reader
        resolution_error = self._fastavro.read.SchemaResolutionError
        named_type = self._return_named_type

        def decode(payload: bytes) -> Any:
            buffer = io.BytesIO(payload)
            try:
                value = reader(buffer, writer_fast, reader_fast,
                               return_named_type=named_type)
            except resolution_error as exc:
                raise SerializationError(f"the record's schema cannot be read as this "
                                         f"serde's schema: {exc}") from exc
            except _DECODE_ERRORS as exc:
                raise SerializationError(f"the Avro payload does not decode: "
                                         f"{type(exc).__name__}: {exc}") from exc
            if buffer.tell() != len(payload):
                raise SerializationError(f"the Avro payload has {len(payload) - buffer.tell()}"
                                         " bytes after the value: not written with this "
                                         "schema")
            return value

        return decode

    def _reader_decoder(self, schema_id: int, writer: Schema, parsed: ParsedSchema,
                        indexes: list[int] | None) -> Callable[[bytes], Any]:
        if self.parsed is not None and parsed.canonical == self.parsed.canonical:
            return self._decode
        writer_fast = self._parsed_fast(writer)
        reader_fast = self._fast if self.parsed is not None else None
        return self._reading(writer_fast, reader_fast)
