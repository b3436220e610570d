"""JsonSchemaSerde: JSON text validated by a JSON Schema, in Confluent's framing.

Owns: validating a value against its JSON Schema (the `jsonschema` package, the
validator class the schema's `$schema` names, draft 7 by default as Confluent's) before
writing it as compact UTF-8 JSON (orjson when installed, else the standard library),
and validating what it reads: against this serde's schema when it has one (the
consumer's reader schema), else against the schema the record was written with.

Invariant: nothing leaves `serialize` that its schema refuses, and nothing leaves
`deserialize` that the reading schema refuses; the `SerializationError` names the dotted
path of the offending field (for a missing required property, the property's path).
"""

from __future__ import annotations

import logging
import json
from typing import Any, Callable

from ..compat import ParsedSchema, parse
from ..compat.json_schema import linear_time_validator
from ..errors import CodecUnavailableError, SerializationError
from ..schema_registry import Schema
from .base import SchemaSerde
from .json_plain import dumps, loads

__all__ = ["JsonSchemaSerde"]

log = logging.getLogger(__name__)


def _jsonschema() -> Any:
    try:
        import jsonschema
        import jsonschema.validators
    except ImportError:
        raise CodecUnavailableError("JsonSchemaSerde needs jsonschema: pip install "
                                    "'logkit[schemas]'") from None
    return jsonschema


def error_path(error: Any) -> str:
    """The dotted path of a jsonschema ValidationError (lists as [i])."""
    path = ""
    for part in error.absolute_path:
        path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else part)
    if error.validator == "required" and isinstance(error.instance, dict):
        missing = [name for name in error.validator_value if name not in error.instance]
        if missing:
            path = f"{path}.{missing[0]}" if path else missing[0]
    return path


class JsonSchemaSerde(SchemaSerde):
    """`JsonSchemaSerde(registry, topic, schema, *, is_key=False)`: `schema` is JSON
    Schema text or its dict (or None to validate with each record's writer schema)."""

    schema_type = "JSON"

    def __init__(self, registry: Any, topic: str, schema: Any = None, **options: Any
                 ) -> None:
        self._jsonschema = _jsonschema()
        super().__init__(registry, topic, schema, **options)

    def _own_schema(self, schema: Any) -> tuple[Schema, ParsedSchema]:
        text = schema if isinstance(schema, str) else json.dumps(schema)
        return Schema(text, "JSON"), parse("JSON", text)

    def _validator(self, document: Any) -> Any:
        validators = self._jsonschema.validators
        cls = validators.validator_for(document, default=validators.Draft7Validator)
        return linear_time_validator(cls)(document)     # regexes in RE2 (compat)

    def _check(self, validator: Any, value: Any, what: str) -> None:
        error = self._jsonschema.exceptions.best_match(validator.iter_errors(value))
        if error is not None:
            path = error_path(error)
            raise SerializationError(f"{what} does not match the JSON Schema at "
                                     f"{path or '<root>'}: {error.message}",
                                     topic=self.topic, field=path)

    def _compile(self, schema: Schema, parsed: ParsedSchema
                 ) -> tuple[Callable[[Any], bytes], Callable[[bytes], Any]]:
        validator = self._validator(parsed.model)
        if schema is self.schema:
            self._own_validator = validator

        def encode(value: Any) -> bytes:
            self._check(validator, value, "value")
            try:
                return dumps(value)
            except (TypeError, ValueError) as exc:
                raise SerializationError(f"value is not JSON: {exc}",
                                         topic=self.topic) from exc

        return encode, self._reading(validator)

    def _reading(self, validator: Any) -> Callable[[bytes], Any]:
        def decode(payload: bytes) -> Any:
            value = loads(payload)
            self._check(validator, value, "the stored record")
            return value
        return decode

    def _reader_decoder(self, schema_id: int, writer: Schema, parsed: ParsedSchema,
                        indexes: list[int] | None) -> Callable[[bytes], Any]:
        if self.parsed is not None:
            return self._decode
        return self._reading(self._validator(parsed.model))
