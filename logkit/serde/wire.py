"""Confluent's wire format: the five-byte prefix (and Protobuf's message indexes).

Owns: framing a schema'd payload and taking a frame apart. The layout, as Confluent's
serializers write it and its deserializers read it:

| off | field                                   | type                        |
|-----|-----------------------------------------|-----------------------------|
| 0   | magic byte = 0                          | int8                        |
| 1   | schema id (the registry's global id)    | uint32, big-endian          |
| 5   | Protobuf only: message indexes          | zig-zag varints: count, then each index; the common [0] is the single byte 0 |
| ... | payload (Avro binary, JSON text, Protobuf message) |                  |

Invariant: `unframe` checks everything it reads (length, magic byte, varint length and
count) and raises `SerializationError` for bytes that are not a frame: garbage is never
handed to a decoder. Hot path: `frame` is one struct pack and one concatenation.
"""

from __future__ import annotations

import logging
import struct
from typing import Sequence

from ..errors import SerializationError

__all__ = ["MAGIC_BYTE", "HEADER", "HEADER_BYTES", "MAX_SCHEMA_ID", "MAX_MESSAGE_INDEXES",
           "frame", "unframe", "encode_indexes", "decode_indexes"]

log = logging.getLogger(__name__)

MAGIC_BYTE = 0
MAGIC_OFFSET = 0
SCHEMA_ID_OFFSET = MAGIC_OFFSET + 1
PAYLOAD_OFFSET = SCHEMA_ID_OFFSET + 4
HEADER = struct.Struct(">bI")
HEADER_BYTES = PAYLOAD_OFFSET
assert HEADER.size == HEADER_BYTES
MAX_SCHEMA_ID = (1 << 32) - 1
MAX_MESSAGE_INDEXES = 128              # nesting depth of a message in its .proto file
MAX_VARINT_BYTES = 10
_ROOT_INDEXES = b"\x00"                # [0]: the file's first message, one byte


def _zigzag_varint(value: int) -> bytes:
    value = (value << 1) ^ (value >> 63)
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def encode_indexes(indexes: Sequence[int]) -> bytes:
    """Protobuf message indexes as Confluent writes them."""
    if list(indexes) == [0]:
        return _ROOT_INDEXES
    return _zigzag_varint(len(indexes)) + b"".join(_zigzag_varint(i) for i in indexes)


def frame(schema_id: int, payload: bytes, indexes: Sequence[int] | None = None) -> bytes:
    """Magic byte, schema id, (message indexes,) payload."""
    if indexes is None:
        return HEADER.pack(MAGIC_BYTE, schema_id) + payload
    return HEADER.pack(MAGIC_BYTE, schema_id) + encode_indexes(indexes) + payload


def _read_varint(data: bytes, position: int) -> tuple[int, int]:
    value = shift = 0
    for i in range(MAX_VARINT_BYTES):
        if position + i >= len(data):
            raise SerializationError("truncated Protobuf message indexes")
        byte = data[position + i]
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return (value >> 1) ^ -(value & 1), position + i + 1
    raise SerializationError("a message-index varint longer than 10 bytes")


def decode_indexes(data: bytes, position: int) -> tuple[list[int], int]:
    """(indexes, position after them) from Protobuf message indexes at `position`."""
    count, position = _read_varint(data, position)
    if count == 0:
        return [0], position
    if not 0 < count <= MAX_MESSAGE_INDEXES:
        raise SerializationError(f"invalid message-index count {count}")
    indexes = []
    for _ in range(count):
        index, position = _read_varint(data, position)
        if index < 0:
            raise SerializationError(f"invalid message index {index}")
        indexes.append(index)
    return indexes, position


def unframe(data: bytes, *, indexes: bool = False) -> tuple[int, list[int] | None, bytes]:
    """(schema id, message indexes or None, payload) of a framed value."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise SerializationError(f"expected bytes to decode, got {type(data).__name__}")
    if len(data) < HEADER_BYTES:
        raise SerializationError(f"{len(data)} bytes is shorter than the {HEADER_BYTES}-"
                                 "byte schema-registry header (magic byte + schema id)")
    magic, schema_id = HEADER.unpack_from(data, 0)
    if magic != MAGIC_BYTE:
        raise SerializationError(f"unknown magic byte {magic} (expected {MAGIC_BYTE}): "
                                 "these bytes were not written by a schema-registry "
                                 "serializer")
    if not indexes:
        return schema_id, None, bytes(data[PAYLOAD_OFFSET:])
    found, position = decode_indexes(bytes(data), PAYLOAD_OFFSET)
    return schema_id, found, bytes(data[position:])
