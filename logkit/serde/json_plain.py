"""JsonSerde: values as JSON text, no schema and no framing (Kafka's JsonSerializer).

Owns: the one choice of JSON library for the serde package: orjson when it is installed
(several times faster), else the standard library. Both write compact UTF-8 JSON; orjson
also writes datetimes, UUIDs and dataclasses, which the standard library refuses.
Integers beyond 64 bits, which orjson refuses, fall back to the standard library.

Invariant: `serialize` returns UTF-8 JSON or raises SerializationError; `deserialize`
returns the parsed value or raises SerializationError (invalid UTF-8 or JSON).
"""

from __future__ import annotations

import logging
import json
from typing import Any

from ..errors import SerializationError

__all__ = ["JsonSerde", "dumps", "loads", "ORJSON"]

log = logging.getLogger(__name__)

try:
    import orjson as _orjson
except ImportError:             # the standard library is the fallback
    _orjson = None
ORJSON = _orjson is not None


def _std_dumps(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False,
                      allow_nan=False).encode()


if _orjson is not None:
    _orjson_dumps = _orjson.dumps
    _orjson_error = _orjson.JSONEncodeError

    def dumps(value: Any) -> bytes:
        """Compact UTF-8 JSON; TypeError/ValueError for what JSON cannot hold."""
        try:
            return _orjson_dumps(value)
        except _orjson_error:
            return _std_dumps(value)    # e.g. an int beyond 64 bits
else:
    dumps = _std_dumps


def loads(data: bytes) -> Any:
    """The parsed value; SerializationError for bytes that are not UTF-8 JSON."""
    try:
        return _orjson.loads(data) if _orjson is not None else json.loads(data)
    except (ValueError, TypeError) as exc:     # orjson.JSONDecodeError is a ValueError
        raise SerializationError(f"the payload is not JSON: {exc}") from exc


class JsonSerde:
    """`JsonSerde()`: any JSON value <-> UTF-8 JSON bytes. Called with bytes it
    deserializes, with anything else it serializes."""

    def __init__(self, *, topic: str | None = None) -> None:
        self.topic = topic

    def __repr__(self) -> str:
        return "JsonSerde()"

    def serialize(self, value: Any) -> bytes | None:
        if value is None:
            return None
        try:
            return dumps(value)
        except (TypeError, ValueError) as exc:
            raise SerializationError(f"value is not JSON: {exc}", topic=self.topic) \
                from exc

    def deserialize(self, data: bytes | None) -> Any:
        if data is None:
            return None
        try:
            return loads(data)
        except SerializationError as exc:
            raise SerializationError(exc.message, topic=self.topic) from exc

    def __call__(self, value: Any) -> Any:
        if isinstance(value, (bytes, bytearray, memoryview)):
            return self.deserialize(value)
        return self.serialize(value)
