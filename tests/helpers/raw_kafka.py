"""A minimal Kafka client for tests that must send what a real client cannot: one
request at a time on one socket, logkit's own codec on the client side."""

from __future__ import annotations

import socket
import struct

from logkit.protocol.frame import encode_request, parse_response


class Raw:
    def __init__(self, server, timeout_s: float = 20.0) -> None:
        self.sock = socket.create_connection((server.host, server.port), timeout=timeout_s)
        self.correlation = 0

    def send(self, api_key: int, version: int, body) -> None:
        self.correlation += 1
        self.sock.sendall(encode_request(api_key, version, self.correlation, body))

    def receive_sized(self, api_key: int, version: int):
        """(the decoded answer, its size in bytes)."""
        size = struct.unpack(">i", self._exactly(4))[0]
        correlation, body = parse_response(api_key, version, self._exactly(size))
        assert correlation == self.correlation
        return body, size

    def receive(self, api_key: int, version: int):
        return self.receive_sized(api_key, version)[0]

    def call(self, api_key: int, version: int, body):
        self.send(api_key, version, body)
        return self.receive(api_key, version)

    def call_sized(self, api_key: int, version: int, body):
        self.send(api_key, version, body)
        return self.receive_sized(api_key, version)

    def _exactly(self, size: int) -> bytes:
        parts, got = [], 0
        while got < size:
            chunk = self.sock.recv(min(size - got, 1 << 20))
            if not chunk:
                raise ConnectionError("closed by the listener")
            parts.append(chunk)
            got += len(chunk)
        return b"".join(parts)

    def close(self) -> None:
        self.sock.close()
