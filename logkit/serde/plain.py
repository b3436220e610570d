"""Plain serdes, Kafka's built-in ones: strings, integers, floats, UUIDs.

Owns: the byte layouts of Kafka's StringSerializer (UTF-8 by default),
Short/Integer/LongSerializer (2, 4, 8 bytes, big-endian, two's complement),
Float/DoubleSerializer (4, 8 bytes, IEEE 754 big-endian) and UUIDSerializer (the
36-character string form, UTF-8; `binary=True` for the 16 raw bytes). Records written
by Kafka's Java serializers or confluent-kafka's Python ones read back unchanged.

Invariant: each serde either converts or raises SerializationError: a value of the
wrong type, an integer out of range, or stored bytes of the wrong length. None passes
through both ways (a tombstone). Called with bytes a serde deserializes, with anything
else it serializes.
"""

from __future__ import annotations

import logging
import struct
import uuid
from abc import ABC, abstractmethod
from typing import Any

from ..errors import ConfigError, SerializationError

__all__ = ["StringSerde", "IntSerde", "FloatSerde", "UUIDSerde"]

log = logging.getLogger(__name__)


class _Plain(ABC):
    def __init__(self, *, topic: str | None = None) -> None:
        self.topic = topic

    def fail(self, message: str) -> SerializationError:
        return SerializationError(message, topic=self.topic)

    @abstractmethod
    def serialize(self, value: Any) -> bytes | None:
        """The value in this type's Kafka byte layout (None stays None)."""

    @abstractmethod
    def deserialize(self, data: bytes | None) -> Any:
        """The value these bytes hold (None stays None)."""

    def __call__(self, value: Any) -> Any:
        if isinstance(value, (bytes, bytearray, memoryview)):
            return self.deserialize(value)
        return self.serialize(value)


class StringSerde(_Plain):
    """str <-> bytes in `encoding` (UTF-8, as Kafka's StringSerializer)."""

    def __init__(self, encoding: str = "utf-8", *, topic: str | None = None) -> None:
        super().__init__(topic=topic)
        try:
            "".encode(encoding)
        except LookupError:
            raise ConfigError(f"unknown encoding {encoding!r}") from None
        self.encoding = encoding

    def __repr__(self) -> str:
        return f"StringSerde({self.encoding!r})"

    def serialize(self, value: Any) -> bytes | None:
        if value is None:
            return None
        if not isinstance(value, str):
            raise self.fail(f"StringSerde serializes str, got {type(value).__name__}")
        try:
            return value.encode(self.encoding)
        except UnicodeEncodeError as exc:
            raise self.fail(f"value is not {self.encoding}: {exc}") from exc

    def deserialize(self, data: bytes | None) -> str | None:
        if data is None:
            return None
        try:
            return bytes(data).decode(self.encoding)
        except UnicodeDecodeError as exc:
            raise self.fail(f"the payload is not {self.encoding}: {exc}") from exc


class IntSerde(_Plain):
    """int <-> `bits`/8 big-endian bytes: 32 (Kafka's IntegerSerializer, the default),
    64 (LongSerializer) or 16 (ShortSerializer)."""

    FORMATS = {16: struct.Struct(">h"), 32: struct.Struct(">i"), 64: struct.Struct(">q")}

    def __init__(self, bits: int = 32, *, topic: str | None = None) -> None:
        super().__init__(topic=topic)
        if bits not in self.FORMATS:
            raise ConfigError(f"IntSerde bits must be 16, 32 or 64, got {bits!r}")
        self.bits = bits
        self._struct = self.FORMATS[bits]

    def __repr__(self) -> str:
        return f"IntSerde({self.bits})"

    def serialize(self, value: Any) -> bytes | None:
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.fail(f"IntSerde serializes int, got {type(value).__name__}")
        limit = 1 << (self.bits - 1)
        if not -limit <= value < limit:
            raise self.fail(f"{value} does not fit in a {self.bits}-bit integer")
        return self._struct.pack(value)

    def deserialize(self, data: bytes | None) -> int | None:
        if data is None:
            return None
        if len(data) != self._struct.size:
            raise self.fail(f"a {self.bits}-bit integer is {self._struct.size} bytes, got "
                            f"{len(data)}")
        return self._struct.unpack(data)[0]


class FloatSerde(_Plain):
    """float <-> IEEE 754 big-endian: 64 bits (Kafka's DoubleSerializer, the default)
    or 32 (FloatSerializer)."""

    FORMATS = {32: struct.Struct(">f"), 64: struct.Struct(">d")}

    def __init__(self, bits: int = 64, *, topic: str | None = None) -> None:
        super().__init__(topic=topic)
        if bits not in self.FORMATS:
            raise ConfigError(f"FloatSerde bits must be 32 or 64, got {bits!r}")
        self.bits = bits
        self._struct = self.FORMATS[bits]

    def __repr__(self) -> str:
        return f"FloatSerde({self.bits})"

    def serialize(self, value: Any) -> bytes | None:
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise self.fail(f"FloatSerde serializes float, got {type(value).__name__}")
        try:
            return self._struct.pack(value)
        except (OverflowError, struct.error) as exc:
            raise self.fail(f"{value} does not fit in a {self.bits}-bit float") from exc

    def deserialize(self, data: bytes | None) -> float | None:
        if data is None:
            return None
        if len(data) != self._struct.size:
            raise self.fail(f"a {self.bits}-bit float is {self._struct.size} bytes, got "
                            f"{len(data)}")
        return self._struct.unpack(data)[0]


class UUIDSerde(_Plain):
    """uuid.UUID (or its string) <-> the 36-character string form in UTF-8, as Kafka's
    UUIDSerializer; `binary=True` uses the 16 raw bytes instead."""

    def __init__(self, *, binary: bool = False, topic: str | None = None) -> None:
        super().__init__(topic=topic)
        self.binary = binary

    def __repr__(self) -> str:
        return f"UUIDSerde(binary={self.binary})"

    def serialize(self, value: Any) -> bytes | None:
        if value is None:
            return None
        if isinstance(value, str):
            try:
                value = uuid.UUID(value)
            except ValueError as exc:
                raise self.fail(f"{value!r} is not a UUID") from exc
        if not isinstance(value, uuid.UUID):
            raise self.fail(f"UUIDSerde serializes uuid.UUID, got {type(value).__name__}")
        return value.bytes if self.binary else str(value).encode()

    def deserialize(self, data: bytes | None) -> uuid.UUID | None:
        if data is None:
            return None
        try:
            if self.binary:
                if len(data) != 16:
                    raise ValueError(f"{len(data)} bytes, not 16")
                return uuid.UUID(bytes=bytes(data))
            if len(data) != 36:
                raise ValueError(f"{len(data)} bytes, not the 36-character form")
            return uuid.UUID(bytes(data).decode("ascii"))
        except (ValueError, UnicodeDecodeError) as exc:
            raise self.fail(f"the payload is not a UUID: {exc}") from exc
