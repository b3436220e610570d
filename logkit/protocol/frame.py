"""Kafka's framing: a 4-byte big-endian size, then that many bytes of request; and the
request/response headers inside a frame. No sockets here (h11's shape): bytes in,
typed requests out; responses in, bytes out.

Owns: `FrameDecoder` (accumulates received bytes, yields complete frames, refuses a
declared size above `max_request_bytes` before reading any of its body), `parse_request`
(header + body by the API table) and `encode_response`.

Invariants: a frame never grows the decoder's buffer past one frame plus one `recv`;
`parse_request` either returns a `Request` or raises `ProtocolError`
(`UnsupportedRequest` for a well-formed header naming an API or version we do not serve,
so the caller can answer it instead of closing).
"""

from __future__ import annotations

import logging
import struct
from typing import Any, NamedTuple

from .errors import FrameTooLargeError, ProtocolError
from .messages import (API_VERSIONS_KEY, APIS, REQUEST_HEADER, RESPONSE_HEADER, Api,
                       response_header_flexible)
from .schema import Reader

__all__ = ["FrameDecoder", "Request", "UnsupportedRequest", "parse_request",
           "encode_response", "encode_request", "parse_response", "MAX_REQUEST_BYTES",
           "SIZE_BYTES"]

log = logging.getLogger(__name__)

MAX_REQUEST_BYTES = 104857600        # Kafka's socket.request.max.bytes
SIZE_BYTES = 4
_SIZE = struct.Struct(">i")
_HEADER_PREFIX = struct.Struct(">hhi")       # api key, api version, correlation id


class Request(NamedTuple):
    api: Api
    version: int
    correlation_id: int
    client_id: str | None
    body: dict[str, Any]


class UnsupportedRequest(ProtocolError):
    """A readable header naming an API key or version this listener does not serve."""

    def __init__(self, message: str, api_key: int, version: int,
                 correlation_id: int) -> None:
        super().__init__(message)
        self.api_key = api_key
        self.version = version
        self.correlation_id = correlation_id


class FrameDecoder:
    """Received bytes in, whole frames out. Not thread-safe: one per connection."""

    def __init__(self, max_request_bytes: int = MAX_REQUEST_BYTES) -> None:
        self.max_request_bytes = max_request_bytes
        self._buffer = bytearray()
        self._need: int | None = None          # body size of the frame being read

    @property
    def pending_bytes(self) -> int:
        """Bytes of a frame begun but not complete (0 between frames)."""
        return len(self._buffer)

    def feed(self, data: bytes) -> list[bytes]:
        """Add received bytes; return the frames they complete, in order. Raises
        FrameTooLargeError for a size outside 0..max_request_bytes."""
        self._buffer += data
        frames = []
        while True:
            if self._need is None:
                if len(self._buffer) < SIZE_BYTES:
                    return frames
                size = _SIZE.unpack_from(self._buffer)[0]
                if not 0 < size <= self.max_request_bytes:
                    raise FrameTooLargeError(
                        f"frame declares {size} bytes; the limit (socket.request.max.bytes)"
                        f" is {self.max_request_bytes}")
                del self._buffer[:SIZE_BYTES]
                self._need = size
            if len(self._buffer) < self._need:
                return frames
            frames.append(bytes(self._buffer[:self._need]))
            del self._buffer[:self._need]
            self._need = None


def parse_request(frame: bytes) -> Request:
    """One frame (without its size) -> Request; ProtocolError if it does not parse."""
    if len(frame) < _HEADER_PREFIX.size:
        raise ProtocolError(f"a {len(frame)}-byte frame is shorter than a request header")
    api_key, version, correlation_id = _HEADER_PREFIX.unpack_from(frame)
    api = APIS.get(api_key)
    if api is None or not api.min_version <= version <= api.max_version:
        if api_key == API_VERSIONS_KEY and version > api.max_version:
            # KIP-511: a newer client's ApiVersions; its body is unreadable to us, and the
            # answer (v0-shaped, UNSUPPORTED_VERSION, our ranges) needs none of it.
            return Request(api, version, correlation_id, None, {})
        what = f"API key {api_key}" if api is None else f"{api.name} v{version}"
        raise UnsupportedRequest(f"{what} is not served", api_key, version, correlation_id)
    reader = Reader(frame)
    flexible = api.is_flexible(version)
    header = REQUEST_HEADER.read(reader, 1, False)
    if flexible:
        _skip_tagged_fields(reader)
    body = api.request.read(reader, version, flexible)
    # Bytes after the body are ignored, as Kafka's own parser does: librdkafka 2.x sends
    # Metadata v12 with a field that ended at v10, and Kafka brokers accept it.
    return Request(api, version, correlation_id, header["client_id"], body)


def _skip_tagged_fields(reader: Reader) -> None:
    for _ in range(reader.uvarint()):
        reader.uvarint()
        size = reader.uvarint()
        reader.take(size)


def encode_response(api: Api, version: int, correlation_id: int,
                    body: dict[str, Any]) -> bytearray:
    """The whole frame (size included) of a response."""
    out = bytearray(SIZE_BYTES)
    RESPONSE_HEADER.write(out, {"correlation_id": correlation_id}, 0, False)
    if response_header_flexible(api, version):
        out.append(0)                              # no tagged fields in the header
    api.response.write(out, body, version, api.is_flexible(version))
    _SIZE.pack_into(out, 0, len(out) - SIZE_BYTES)
    return out


def encode_request(api_key: int, version: int, correlation_id: int, body: dict[str, Any],
                   client_id: str | None = "logkit") -> bytearray:
    """The whole frame of a request (the client side: tests, benchmarks, tools)."""
    api = APIS[api_key]
    flexible = api.is_flexible(version)
    out = bytearray(SIZE_BYTES)
    REQUEST_HEADER.write(out, {"request_api_key": api_key, "request_api_version": version,
                               "correlation_id": correlation_id, "client_id": client_id},
                         1, False)
    if flexible:
        out.append(0)
    api.request.write(out, body, version, flexible)
    _SIZE.pack_into(out, 0, len(out) - SIZE_BYTES)
    return out


def parse_response(api_key: int, version: int, frame: bytes) -> tuple[int, dict[str, Any]]:
    """(correlation id, body) of one response frame (without its size)."""
    api = APIS[api_key]
    reader = Reader(frame)
    correlation_id = reader.int32()
    if response_header_flexible(api, version):
        _skip_tagged_fields(reader)
    body = api.response.read(reader, version, api.is_flexible(version))
    return correlation_id, body
