"""Replication over TCP, the leader's side: `ReplicationServer`, made by
`broker.serve_replication(host="127.0.0.1", port=0, *, secret, ssl_context=None)`.

Owns: the listening socket, one thread per follower connection, the handshake's
server half (wire format and proofs in `tcp.py`), the table from request kind to the
`ReplicaSource` method that answers it, and shipping fetched batches from the segment
files with sendfile.

Answers come from a `DirectorySource` over the broker's own root, shared by every
connection under one lock, so the leader's ISR and leases see a TCP follower exactly as
they see a directory follower (its progress lands in `<root>/replicas/<id>.json`). A
fetch is the one exception: its bytes go from the segment files straight to the socket
(`Partition.batch_file_ranges` of the serving broker, then `socket.sendfile`, which is
`os.sendfile` on a plain socket and read-and-send under TLS), never through Python
buffers, and without that lock.

Bounds: at most `max_connections` connections (`max_connections_per_ip` from one
address); one past a cap takes the slot of the oldest connection that has not finished
the handshake, else it is closed on accept (listener.py), so connections that never log
in cannot starve a follower; the handshake must finish within
`unauthenticated_timeout_ms` of the connection; a request frame larger than MAX_REQUEST_BYTES
closes its connection before its body is read, and one begun must be complete within
`request_timeout_ms`; an idle connection closes after `idle_timeout_ms`; a long poll
lasts at most MAX_WAIT_MS; a fetch asks for at most MAX_FETCH_BYTES. A request that
does not parse, names an unknown kind, or fails (unknown topic-partition, an offset
outside the log) gets an ERROR answer and the connection stays usable. Nothing a
client sends names a byte position: the server derives the ranges from offsets and
checks each lies inside its segment file before sending a byte of it.

Invariant: `close()` stops accepting, closes every connection, joins the threads and
closes the source; it is safe twice. Nothing here writes to the broker's data.
"""

from __future__ import annotations

import hmac
import json
import logging
import os
import socket
import struct
import threading
import time
from typing import TYPE_CHECKING, Any, Callable

from ..errors import ConfigError, LogkitError, OffsetOutOfRangeError, StorageError
from ..listener import POLL_SLICE_S, Slot, ThreadedListener, tls_handshake
from ..notify import Doorbell
from ..segment import DELETED_SUFFIX
from ..topic import TopicPartition
from .directory import DirectorySource, SegmentDigests
from ..leader.replicas import Progress
from .tcp import (AUTH, AUTH_OK, BATCHES, COMMITTED, ERROR, FETCH, HELLO, LEASE, LISTENER,
                  MAC_BYTES, MAGIC, MAX_FETCH_BYTES, MAX_REQUEST_BYTES, MAX_WAIT_MS, NONCE_BYTES,
                  PARTITION, REPORT, REQUEST_KINDS, RESULT, SEGMENTS, SIZE, TAKE_LEASE, TOPICS,
                  WAIT,
                  client_proof, frame, json_frame, lease_body, secret_bytes, server_proof)

if TYPE_CHECKING:
    import ssl

__all__ = ["ReplicationServer"]

log = logging.getLogger(__name__)

IDLE_TIMEOUT_MS = 600000            # Kafka's connections.max.idle.ms
REQUEST_TIMEOUT_MS = 30000
MAX_CONNECTIONS = 64
UNAUTHENTICATED_TIMEOUT_MS = 10000  # the handshake's deadline (Kafka listener's default too)
_BATCH_PREFIX = struct.Struct(">qi")   # baseOffset, batchLength: the first 12 bytes


class _Refused(LogkitError):
    """A request this server does not answer (malformed, unknown kind); answered with
    an ERROR and the connection kept."""


class _Close(Exception):
    """End this connection (after a bound was crossed)."""


class _Ranges:
    """A fetch answer: opened segment files and the (position, length) in each."""

    def __init__(self, parts: list[tuple[Any, int, int]]) -> None:
        self.parts = parts
        self.size = sum(length for _, _, length in parts)

    def close(self) -> None:
        for f, _, _ in self.parts:
            f.close()


def _int(body: dict[str, Any], key: str, low: int, high: int) -> int:
    value = body.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise _Refused(f"{key} must be an integer in {low}..{high}, got {value!r}")
    return value


def _str(body: dict[str, Any], key: str) -> str:
    value = body.get(key)
    if not isinstance(value, str):
        raise _Refused(f"{key} must be a string, got {type(value).__name__}")
    return value


_MAX_OFFSET = (1 << 63) - 1
_MAX_REPORTED = 1 << 16                # partitions in one report_progress


def _offsets(body: dict[str, Any], key: str) -> dict[TopicPartition, int]:
    """A list of [topic, partition, number] as {TopicPartition: number}."""
    entries = body.get(key)
    if not isinstance(entries, list) or len(entries) > _MAX_REPORTED:
        raise _Refused(f"{key} must be a list of at most {_MAX_REPORTED} "
                       "[topic, partition, number]")
    out = {}
    for entry in entries:
        if not (isinstance(entry, list) and len(entry) == 3):
            raise _Refused(f"{key} must be a list of [topic, partition, number]")
        item = dict(zip(("topic", "partition", "number"), entry))
        out[TopicPartition(_str(item, "topic"), _int(item, "partition", 0, 1 << 31))] = \
            _int(item, "number", 0, _MAX_OFFSET)
    return out


class ReplicationServer(ThreadedListener):
    """A running replication listener over one broker. `.host`, `.port`,
    `.connections`; `close()` is safe twice; a context manager."""

    kind = "replication listener"

    def __init__(self, broker: Any, host: str = "127.0.0.1", port: int = 0, *,
                 secret: str | bytes, ssl_context: ssl.SSLContext | None = None,
                 idle_timeout_ms: int = IDLE_TIMEOUT_MS,
                 request_timeout_ms: int = REQUEST_TIMEOUT_MS,
                 max_connections: int = MAX_CONNECTIONS,
                 max_connections_per_ip: int | None = None,
                 unauthenticated_timeout_ms: int = UNAUTHENTICATED_TIMEOUT_MS) -> None:
        max_connections_per_ip = max_connections_per_ip or max_connections
        for name, value in (("idle_timeout_ms", idle_timeout_ms),
                            ("request_timeout_ms", request_timeout_ms),
                            ("max_connections", max_connections),
                            ("max_connections_per_ip", max_connections_per_ip),
                            ("unauthenticated_timeout_ms", unauthenticated_timeout_ms)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"{name} must be a positive integer, got {value!r}")
        self._secret = secret_bytes(secret)
        self._broker = broker
        self._ssl = ssl_context
        self.idle_timeout_s = idle_timeout_ms / 1000
        self.request_timeout_s = request_timeout_ms / 1000
        self.unauthenticated_timeout_s = unauthenticated_timeout_ms / 1000
        self._source = DirectorySource(broker.path)
        self._source_lock = threading.Lock()
        self._digests: dict[TopicPartition, SegmentDigests] = {}
        self._doorbell = Doorbell(broker.path)
        try:
            super().__init__(host, port, max_connections=max_connections,
                             max_connections_per_ip=max_connections_per_ip, backlog=64)
        except ConfigError:
            self._doorbell.close()
            raise
        self._start_accepting()
        log.info("replication listener on %s:%d%s for %s", host, self.port,
                 " (TLS)" if ssl_context is not None else "", broker.path)

    # request kind -> the method answering it: one row per ReplicaSource method
    def _handlers(self) -> dict[int, Callable[[dict[str, Any]], Any]]:
        return {TOPICS: self._topics, PARTITION: self._partition, FETCH: self._fetch,
                COMMITTED: self._committed, REPORT: self._report, WAIT: self._wait,
                LEASE: self._lease, TAKE_LEASE: self._take_lease,
                LISTENER: self._leader_listener, SEGMENTS: self._segments}

    def __repr__(self) -> str:
        return f"ReplicationServer('{self.host}:{self.port}')"

    # ---- one connection --------------------------------------------------------------

    def _converse_on(self, sock: socket.socket, address: Any, slot: Slot) -> None:
        peer = f"{address[0]}:{address[1]}"
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        deadline = slot.opened + min(self.request_timeout_s, self.unauthenticated_timeout_s)
        try:
            if self._ssl is not None:
                sock = tls_handshake(self._ssl, sock, slot, deadline, self._closing)
            sock.settimeout(max(0.001, deadline - time.monotonic()))
            if self._handshake(sock, peer, slot):
                slot.authenticated = True
                self._converse(sock, peer, slot)
        except _Close as exc:
            log.info("replication listener: closing %s: %s", peer, exc)
        finally:
            sock.close()                 # the TLS socket (the listener closes the plain one)

    def _handshake(self, sock: socket.socket, peer: str, slot: Slot) -> bool:
        """The server half of the challenge-response (tcp.py); False after refusing."""
        server_nonce = os.urandom(NONCE_BYTES)
        sock.sendall(frame(HELLO, MAGIC + server_nonce))
        deadline = slot.opened + min(self.request_timeout_s, self.unauthenticated_timeout_s)
        kind, body = self._read_frame(sock, slot, NONCE_BYTES + MAC_BYTES, deadline)
        if kind != AUTH or len(body) != NONCE_BYTES + MAC_BYTES:
            raise _Close("the first frame is not an authentication")
        client_nonce, proof = body[:NONCE_BYTES], body[NONCE_BYTES:]
        if not hmac.compare_digest(proof, client_proof(self._secret, server_nonce,
                                                       client_nonce)):
            log.warning("replication listener: %s presented a wrong secret; refused", peer)
            sock.sendall(json_frame(ERROR, {
                "error": "ConfigError",
                "message": "authentication failed: wrong replication secret"}))
            return False
        sock.sendall(frame(AUTH_OK, server_proof(self._secret, server_nonce,
                                                 client_nonce)))
        log.debug("replication listener: %s authenticated", peer)
        return True

    def _read_frame(self, sock: socket.socket, slot: Slot, limit: int,
                    deadline: float | None) -> tuple[int, bytes]:
        """One frame of at most `limit` body bytes. Its first byte may take the idle
        timeout (or until `deadline`); once begun, the frame must be complete within
        the request timeout. Raises _Close past a bound, ConnectionError on EOF."""
        start_by = deadline if deadline is not None else \
            time.monotonic() + self.idle_timeout_s
        first = self._recv(sock, slot, 1, start_by, "idle past idle_timeout_ms" if deadline
                           is None else "no handshake within unauthenticated_timeout_ms")
        complete_by = time.monotonic() + self.request_timeout_s
        if deadline is not None:
            complete_by = min(complete_by, deadline)
        incomplete = "a frame stayed incomplete past request_timeout_ms"
        size, kind = SIZE.unpack(first + self._recv(sock, slot, SIZE.size - 1, complete_by,
                                                    incomplete))
        if not 1 <= size <= limit + 1:
            raise _Close(f"a frame declares {size} bytes (the limit is {limit + 1})")
        return kind, self._recv(sock, slot, size - 1, complete_by, incomplete)

    def _recv(self, sock: socket.socket, slot: Slot, size: int, until: float,
              why: str) -> bytes:
        buffer = bytearray()
        while len(buffer) < size:
            if self._closing.is_set():
                raise _Close("the server is closing")
            if slot.evicted:
                raise _Close("its slot went to a new connection (the listener was full)")
            left = until - time.monotonic()
            if left <= 0:
                raise _Close(why)
            sock.settimeout(min(POLL_SLICE_S, left))
            try:
                chunk = sock.recv(min(size - len(buffer), 1 << 20))
            except socket.timeout:
                continue
            if not chunk:
                raise ConnectionError("the follower closed the connection")
            buffer += chunk
        return bytes(buffer)

    def _converse(self, sock: socket.socket, peer: str, slot: Slot) -> None:
        handlers = self._handlers()
        while not self._closing.is_set():
            kind, body = self._read_frame(sock, slot, MAX_REQUEST_BYTES, None)
            try:
                handler = handlers.get(kind)
                if handler is None:
                    raise _Refused(f"unknown request kind {kind}")
                try:
                    request = json.loads(body)
                except (ValueError, RecursionError):     # RecursionError: deep nesting
                    raise _Refused(f"the body of a {REQUEST_KINDS[kind]} request is not "
                                   "JSON") from None
                if not isinstance(request, dict):
                    raise _Refused(f"the body of a {REQUEST_KINDS[kind]} request is not "
                                   "a JSON object")
                answer = handler(request)
            except (LogkitError, OSError) as exc:
                self._send(sock, json_frame(ERROR, self._error_body(exc)))
                continue
            if isinstance(answer, _Ranges):
                try:
                    self._send_ranges(sock, answer)
                finally:
                    answer.close()
            else:
                self._send(sock, json_frame(RESULT, answer))

    @staticmethod
    def _error_body(exc: BaseException) -> dict[str, str]:
        if isinstance(exc, _Refused):
            name = "LogkitError"
        elif isinstance(exc, LogkitError):
            name = type(exc).__name__
        else:
            name = "StorageError"                   # an OSError reading the leader
        return {"error": name, "message": str(exc)}

    def _send(self, sock: socket.socket, data: bytes) -> None:
        sock.settimeout(self.request_timeout_s)
        sock.sendall(data)

    def _send_ranges(self, sock: socket.socket, answer: _Ranges) -> None:
        sock.settimeout(self.request_timeout_s)
        sock.sendall(SIZE.pack(answer.size + 1, BATCHES))
        for f, position, length in answer.parts:
            sent = sock.sendfile(f, position, length)
            if sent != length:                       # the frame cannot be completed
                raise _Close(f"{f.name} ended {length - sent} bytes short of a range "
                             "being sent")

    # ---- the handlers: one per ReplicaSource method ---------------------------------

    def _topics(self, request: dict[str, Any]) -> dict[str, Any]:
        with self._source_lock:
            topics = self._source.topics()
        return {"topics": {name: {"partitions": t.partitions, "config": t.config,
                                  "topic_id": t.topic_id,
                                  "replication_factor": t.replication_factor,
                                  "wire_topic_id": t.wire_topic_id}
                           for name, t in topics.items()}}

    def _partition(self, request: dict[str, Any]) -> dict[str, Any]:
        topic, number = _str(request, "topic"), _int(request, "partition", 0, 1 << 31)
        bell = self._doorbell.value()           # before the state: no missed append
        with self._source_lock:
            info = self._source.partition(topic, number)
        return {"log_start_offset": info.log_start_offset,
                "log_end_offset": info.log_end_offset,
                "epochs": [[e.epoch, e.start_offset] for e in info.epochs],
                "segment_base_offsets": list(info.segment_base_offsets), "bell": bell,
                "clean_count": info.clean_count}

    def _segments(self, request: dict[str, Any]) -> dict[str, Any]:
        """The sealed segments and their SHA-256 (DirectorySource.segments' listing),
        read from the serving broker's partition without the source's lock: the
        checksums of a freshly cleaned log take a while."""
        topic, number = _str(request, "topic"), _int(request, "partition", 0, 1 << 31)
        partition = self._broker.topic(topic).partition(number)
        digests = self._digests.setdefault(TopicPartition(topic, number), SegmentDigests())
        return {"segments": [list(s) for s in digests.listing(partition)]}

    def _fetch(self, request: dict[str, Any]) -> _Ranges:
        topic, number = _str(request, "topic"), _int(request, "partition", 0, 1 << 31)
        offset = _int(request, "offset", 0, _MAX_OFFSET)
        max_bytes = _int(request, "max_bytes", 1, MAX_FETCH_BYTES)
        partition = self._broker.topic(topic).partition(number)
        ranges = partition.batch_file_ranges(offset, upto=partition.log_end_offset,
                                             max_bytes=max_bytes)
        parts: list[tuple[Any, int, int]] = []
        try:
            for path, position, length in ranges:
                parts.append((self._open_range(path, position, length), position, length))
        except BaseException:
            _Ranges(parts).close()
            raise
        return _Ranges(parts)

    def _open_range(self, path: str, position: int, length: int) -> Any:
        """The segment file holding [position, position + length), checked: the range
        lies inside the file and starts with a whole batch (a segment retired meanwhile
        is read under its `.deleted` name)."""
        for name in (path, path + DELETED_SUFFIX):
            try:
                fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
                break
            except FileNotFoundError:
                continue
        else:
            raise StorageError(f"{path} went away during a fetch; fetch again",
                               operation="fetch", path=path)
        f = os.fdopen(fd, "rb")
        try:
            size = os.fstat(fd).st_size
            head = os.pread(fd, _BATCH_PREFIX.size, position)
            if position < 0 or length < 0 or position + length > size \
                    or len(head) < _BATCH_PREFIX.size \
                    or _BATCH_PREFIX.size + _BATCH_PREFIX.unpack(head)[1] > length:
                raise OffsetOutOfRangeError(
                    f"bytes {position}..{position + length} are not whole batches inside "
                    f"{path} ({size} bytes); refused (the segment changed: fetch again)")
        except BaseException:
            f.close()
            raise
        return f

    def _committed(self, request: dict[str, Any]) -> dict[str, Any]:
        with self._source_lock:
            groups = self._source.committed_offsets()
        return {"groups": {group: [[tp.topic, tp.partition, o] for tp, o in offsets.items()]
                           for group, offsets in groups.items()}}

    def _report(self, request: dict[str, Any]) -> dict[str, Any]:
        """The follower's log end offsets and last caught-up times (leader.Progress),
        written by the DirectorySource where the leader's ISR reads them."""
        follower_id = _str(request, "follower_id")
        ends = _offsets(request, "log_end_offsets")
        caught = _offsets(request, "caught_up_ms") if "caught_up_ms" in request else {}
        listener = request.get("listener")
        if listener is not None and not (
                isinstance(listener, dict) and len(listener) <= 8
                and all(isinstance(k, str) and isinstance(v, (str, int))
                        and not isinstance(v, bool) and len(str(v)) <= 255
                        for k, v in listener.items())):
            raise _Refused("listener must be a small object of strings and integers")
        with self._source_lock:
            self._source.report_progress(follower_id, Progress(ends, caught, listener))
        return {}

    def _leader_listener(self, request: dict[str, Any]) -> dict[str, Any]:
        with self._source_lock:
            return {"listener": self._source.leader_listener()}

    def _lease(self, request: dict[str, Any]) -> dict[str, Any]:
        with self._source_lock:
            return {"lease": lease_body(self._source.lease())}

    def _take_lease(self, request: dict[str, Any]) -> dict[str, Any]:
        holder = _str(request, "holder")
        ttl_ms = _int(request, "ttl_ms", 1, _MAX_OFFSET)
        min_epoch = _int(request, "min_epoch", 0, 1 << 31)
        with self._source_lock:
            return {"lease": lease_body(self._source.take_lease(
                holder, ttl_ms=ttl_ms, min_epoch=min_epoch))}

    def _wait(self, request: dict[str, Any]) -> dict[str, Any]:
        """Hold the answer until the doorbell differs from `bell` (the value the
        follower saw first since its previous wait; null: the value now) or
        `timeout_ms` passes."""
        timeout_ms = _int(request, "timeout_ms", 0, MAX_WAIT_MS)
        seen = request.get("bell")
        if seen is None:
            seen = self._doorbell.value()
        elif isinstance(seen, bool) or not isinstance(seen, int):
            raise _Refused(f"bell must be an integer, got {seen!r}")
        deadline = time.monotonic() + timeout_ms / 1000
        while self._doorbell.value() == seen and not self._closing.is_set():
            left = deadline - time.monotonic()
            if left <= 0:
                break
            self._doorbell.wait(seen, left)
        return {"bell": self._doorbell.value()}

    # ---- closing ---------------------------------------------------------------------

    def _closed_hook(self) -> None:
        with self._source_lock:
            self._source.close()
        self._doorbell.close()


assert set(REQUEST_KINDS) == {TOPICS, PARTITION, FETCH, COMMITTED, REPORT, WAIT, LEASE,
                              TAKE_LEASE, LISTENER, SEGMENTS}
