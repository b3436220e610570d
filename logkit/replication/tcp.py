"""Replication over TCP, the follower's side: the wire format, the challenge-response
handshake, and `TcpSource`, a `ReplicaSource` that asks a `broker.serve_replication()`
server (`tcp_server.py`) over one socket.

Owns: the frame layout and the request/answer kinds below (written down once, here;
the server imports them), the HMAC-SHA256 proofs of the handshake, the mapping of an
error answer back to a logkit error class, and the client connection (opened on first
use, dropped on any transport failure, opened again by the next call).

Frames, both ways (big-endian):

| field | bytes | meaning |
|---|---|---|
| size | 4 | bytes that follow: 1 .. the reader's limit (a larger size closes) |
| kind | 1 | a request kind (client) or an answer kind (server) |
| body | size - 1 | JSON object (requests, RESULT, ERROR), raw bytes (HELLO, AUTH, AUTH_OK, BATCHES) |

The handshake, before any request (the secret itself never crosses the wire):

| step | frame | body |
|---|---|---|
| 1. server | HELLO | `MAGIC` + server nonce (32 random bytes) |
| 2. client | AUTH | client nonce (32 random bytes) + HMAC(secret, CLIENT_LABEL + server nonce + client nonce) |
| 3. server | AUTH_OK | HMAC(secret, SERVER_LABEL + server nonce + client nonce); or ERROR, then close |

The client checks the server's proof too, so a server that does not know the secret
is refused as well. Both sides compare with `hmac.compare_digest`. Each nonce is fresh
per connection, so a recorded exchange cannot be replayed.

Invariants: every socket operation of the client has a timeout (a half-open server
costs at most `timeout` seconds, then the call raises and the connection is dropped);
an answer larger than `MAX_ANSWER_BYTES` is refused before its body is read; a refused
secret raises `ReplicationAuthError` (a ConfigError: the follower stops on it instead of
retrying). Thread-safe: one request at a time on the connection, under a lock (a
follower's long poll can overlap a `catch_up()` in another thread).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os
import socket
import struct
import threading
import time
from typing import TYPE_CHECKING, Any, Mapping

from .. import errors
from ..errors import ConfigError, LogkitError, LogkitTimeoutError
from ..topic import TopicPartition
from ..leader.epochs import EpochEntry
from ..leader.lease import Lease
from .source import PartitionInfo, ReplicaSource, SegmentInfo, TopicInfo

if TYPE_CHECKING:                  # ssl is imported by whoever makes a context
    import ssl

__all__ = ["TcpSource", "ReplicationAuthError", "MAGIC", "REQUEST_KINDS"]

log = logging.getLogger(__name__)

# ---- the wire format -----------------------------------------------------------------

SIZE = struct.Struct(">IB")                   # size (kind + body), kind
SIZE_BYTES = 4
MAGIC = b"LKR1"                               # protocol name and version, in HELLO
NONCE_BYTES = 32
MAC_BYTES = hashlib.sha256().digest_size      # 32
CLIENT_LABEL = b"logkit-replication/1 client proof"
SERVER_LABEL = b"logkit-replication/1 server proof"

# request kinds (client -> server)
AUTH = 0x10
TOPICS, PARTITION, FETCH, COMMITTED, REPORT, WAIT, LEASE, TAKE_LEASE, LISTENER, \
    SEGMENTS = range(1, 11)
REQUEST_KINDS = {TOPICS: "topics", PARTITION: "partition", FETCH: "fetch",
                 COMMITTED: "committed_offsets", REPORT: "report_progress", WAIT: "wait",
                 LEASE: "lease", TAKE_LEASE: "take_lease", LISTENER: "leader_listener",
                 SEGMENTS: "segments"}
# answer kinds (server -> client)
RESULT, BATCHES, ERROR, HELLO, AUTH_OK = 0x80, 0x81, 0x82, 0x83, 0x84

MAX_REQUEST_BYTES = 1 << 20          # the server's bound on a request frame
MAX_FETCH_BYTES = 64 << 20           # the largest max_bytes a fetch may ask for
MAX_ANSWER_BYTES = 256 << 20         # the client's bound on an answer frame
MAX_WAIT_MS = 1000                   # the longest long poll the server holds
DEFAULT_TIMEOUT_S = 10.0
RECV_BYTES = 1 << 16


class ReplicationAuthError(ConfigError):
    """The replication server and this side do not share the secret (or one side is
    not a logkit replication endpoint). A configuration error: retrying cannot help."""


def client_proof(secret: bytes, server_nonce: bytes, client_nonce: bytes) -> bytes:
    return hmac.new(secret, CLIENT_LABEL + server_nonce + client_nonce,
                    hashlib.sha256).digest()


def server_proof(secret: bytes, server_nonce: bytes, client_nonce: bytes) -> bytes:
    return hmac.new(secret, SERVER_LABEL + server_nonce + client_nonce,
                    hashlib.sha256).digest()


def secret_bytes(secret: str | bytes) -> bytes:
    """The shared secret as bytes; ConfigError if it is empty or not str/bytes."""
    if isinstance(secret, str):
        secret = secret.encode("utf-8")
    if not isinstance(secret, (bytes, bytearray)) or not secret:
        raise ConfigError("the replication secret must be a non-empty str or bytes")
    return bytes(secret)


def frame(kind: int, body: bytes = b"") -> bytes:
    return SIZE.pack(len(body) + 1, kind) + body


def json_frame(kind: int, body: Mapping[str, Any]) -> bytes:
    return frame(kind, json.dumps(body, separators=(",", ":")).encode("utf-8"))


def recv_exactly(sock: socket.socket, size: int) -> bytes:
    """`size` bytes from `sock`; ConnectionError if the peer closes first."""
    buffer = bytearray(size)
    view = memoryview(buffer)
    got = 0
    while got < size:
        n = sock.recv_into(view[got:], min(size - got, RECV_BYTES * 16))
        if not n:
            raise ConnectionError("the peer closed the connection")
        got += n
    return bytes(buffer)


def error_from_answer(body: bytes) -> LogkitError:
    """The logkit error an ERROR answer names (LogkitError for a name we do not know)."""
    try:
        answer = json.loads(body)
        name, message = str(answer["error"]), str(answer["message"])
    except (ValueError, KeyError, TypeError):
        return LogkitError(f"a malformed error answer: {body[:200]!r}")
    cls = getattr(errors, name, None)
    if not (isinstance(cls, type) and issubclass(cls, LogkitError)):
        cls = LogkitError
    try:
        return cls(message)
    except TypeError:                              # a class with required arguments
        return LogkitError(f"{name}: {message}")


def lease_body(lease: Lease | None) -> dict[str, Any] | None:
    return None if lease is None else lease._asdict()


def _lease(body: Any) -> Lease | None:
    if body is None:
        return None
    return Lease(str(body["holder"]), int(body["epoch"]), int(body["ttl_ms"]),
                 int(body["renewed_ms"]))


# ---- the source ----------------------------------------------------------------------


class TcpSource(ReplicaSource):
    """`logkit.TcpSource(host, port, *, secret, ssl_context=None, timeout=10.0)`: copy
    from the leader served by `broker.serve_replication()` at host:port.

    `secret` is the server's shared secret (str or bytes). `ssl_context` (a client
    context from the standard `ssl` module) wraps the connection in TLS. `timeout`
    bounds every connect, send and receive in seconds; a long poll waits at most its
    own timeout on top. A dropped connection is opened again by the next call."""

    def __init__(self, host: str, port: int, *, secret: str | bytes,
                 ssl_context: ssl.SSLContext | None = None,
                 timeout: float = DEFAULT_TIMEOUT_S) -> None:
        if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
            raise ConfigError(f"port must be 1-65535, got {port!r}")
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) \
                or not timeout > 0:
            raise ConfigError(f"timeout must be a positive number of seconds, got "
                              f"{timeout!r}")
        self.host = host
        self.port = port
        self.timeout = float(timeout)
        self._secret = secret_bytes(secret)
        self._ssl = ssl_context
        self._sock: socket.socket | None = None
        self._lock = threading.RLock()    # one request and its answer at a time
        self._bell: int | None = None     # the doorbell as first seen since the last wait
        self.connects = 0                 # connections opened (tests, `describe`)

    def describe(self) -> str:
        return f"TcpSource('{self.host}:{self.port}')"

    # ---- the connection --------------------------------------------------------------

    def _connection(self) -> socket.socket:
        if self._sock is None:
            self._sock = self._connect()
        return self._sock

    def _connect(self) -> socket.socket:
        where = f"{self.host}:{self.port}"
        sock = socket.create_connection((self.host, self.port), timeout=self.timeout)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self._ssl is not None:
                sock = self._ssl.wrap_socket(sock, server_hostname=self.host)
            kind, body = self._read_answer(sock, NONCE_BYTES + len(MAGIC))
            if kind == ERROR:
                raise error_from_answer(body)
            if kind != HELLO or len(body) != len(MAGIC) + NONCE_BYTES \
                    or not body.startswith(MAGIC):
                raise ReplicationAuthError(f"{where} is not a logkit replication server "
                                           "(its greeting is not one)")
            server_nonce = body[len(MAGIC):]
            client_nonce = os.urandom(NONCE_BYTES)
            sock.sendall(frame(AUTH, client_nonce + client_proof(
                self._secret, server_nonce, client_nonce)))
            kind, body = self._read_answer(sock, 4096)
            if kind == ERROR:
                error = error_from_answer(body)
                raise ReplicationAuthError(f"{where} refused this follower: {error}")
            if kind != AUTH_OK or not hmac.compare_digest(
                    body, server_proof(self._secret, server_nonce, client_nonce)):
                raise ReplicationAuthError(f"{where} does not prove it knows the "
                                           "replication secret")
        except BaseException:
            sock.close()
            raise
        self.connects += 1
        log.debug("%s: connected and authenticated", self.describe())
        return sock

    def _read_answer(self, sock: socket.socket, limit: int) -> tuple[int, bytes]:
        size, kind = SIZE.unpack(recv_exactly(sock, SIZE.size))
        if not 1 <= size <= limit + 1:
            raise LogkitError(f"{self.describe()}: an answer declares {size} bytes "
                              f"(the limit is {limit + 1}); dropping the connection")
        return kind, recv_exactly(sock, size - 1)

    def _drop(self) -> None:
        sock, self._sock = self._sock, None
        if sock is not None:
            try:
                sock.close()
            except OSError:
                pass

    def _call(self, kind: int, body: Mapping[str, Any], *, extra_s: float = 0.0,
              limit: int = MAX_REQUEST_BYTES) -> tuple[int, bytes]:
        """Send one request and read its answer. A transport failure drops the
        connection and raises (LogkitTimeoutError for a timeout, OSError or
        LogkitError otherwise); an ERROR answer raises the error it names and keeps the
        connection."""
        with self._lock:
            return self._call_locked(kind, body, extra_s, limit)

    def _call_locked(self, kind: int, body: Mapping[str, Any], extra_s: float,
                     limit: int) -> tuple[int, bytes]:
        try:
            sock = self._connection()
            sock.settimeout(self.timeout + extra_s)
            sock.sendall(json_frame(kind, body))
            answer_kind, data = self._read_answer(sock, limit)
        except socket.timeout:
            self._drop()
            raise LogkitTimeoutError(f"{self.describe()}: no answer within "
                                     f"{self.timeout + extra_s:.1f} s; dropped the "
                                     "connection") from None
        except ReplicationAuthError:
            self._drop()
            raise
        except (OSError, LogkitError):
            self._drop()
            raise
        if answer_kind == ERROR:
            raise error_from_answer(data)
        if answer_kind not in (RESULT, BATCHES):
            self._drop()
            raise LogkitError(f"{self.describe()}: an answer of unknown kind "
                              f"{answer_kind:#x}; dropped the connection")
        return answer_kind, data

    def _json(self, kind: int, body: Mapping[str, Any], **options: Any) -> Any:
        answer_kind, data = self._call(kind, body, **options)
        try:
            if answer_kind != RESULT:
                raise ValueError("not a RESULT")
            return json.loads(data)
        except ValueError:
            self._drop()
            raise LogkitError(f"{self.describe()}: a malformed answer to "
                              f"{REQUEST_KINDS[kind]}") from None

    # ---- ReplicaSource ---------------------------------------------------------------

    def topics(self) -> dict[str, TopicInfo]:
        answer = self._json(TOPICS, {})
        return {name: TopicInfo(name, t["partitions"], t["config"], t["topic_id"],
                                t.get("replication_factor", 1), t.get("wire_topic_id"))
                for name, t in answer["topics"].items()}

    def partition(self, topic: str, partition: int) -> PartitionInfo:
        a = self._json(PARTITION, {"topic": topic, "partition": partition})
        if self._bell is None:
            self._bell = a["bell"]
        return PartitionInfo(a["log_start_offset"], a["log_end_offset"],
                             tuple(EpochEntry(e, s) for e, s in a["epochs"]),
                             tuple(a["segment_base_offsets"]), a.get("clean_count", 0))

    def segments(self, topic: str, partition: int) -> tuple[SegmentInfo, ...]:
        """The leader's sealed segments with their SHA-256, as the server's
        DirectorySource lists them (a compacted log's follower asks when the clean
        count moves)."""
        a = self._json(SEGMENTS, {"topic": topic, "partition": partition},
                       limit=MAX_ANSWER_BYTES)
        return tuple(SegmentInfo(int(base), int(end), int(first), int(size), str(sha))
                     for base, end, first, size, sha in a["segments"])

    def fetch(self, topic: str, partition: int, offset: int, *, max_bytes: int) -> bytes:
        kind, data = self._call(FETCH, {"topic": topic, "partition": partition,
                                        "offset": offset, "max_bytes": max_bytes},
                                limit=MAX_ANSWER_BYTES)
        if kind != BATCHES:
            self._drop()
            raise LogkitError(f"{self.describe()}: a fetch answered without batches")
        return data

    def committed_offsets(self) -> dict[str, dict[TopicPartition, int]]:
        answer = self._json(COMMITTED, {})
        return {group: {TopicPartition(t, p): o for t, p, o in offsets}
                for group, offsets in answer["groups"].items()}

    def report_progress(self, follower_id: str,
                        log_end_offsets: Mapping[TopicPartition, int]) -> None:
        caught = getattr(log_end_offsets, "caught_up_ms", {})   # leader.Progress
        body = {"follower_id": follower_id,
                "log_end_offsets": [[tp.topic, tp.partition, end]
                                    for tp, end in log_end_offsets.items()],
                "caught_up_ms": [[tp.topic, tp.partition, ms] for tp, ms in caught.items()]}
        listener = getattr(log_end_offsets, "listener", None)
        if listener:
            body["listener"] = listener          # the follower's Kafka listener
        self._json(REPORT, body)

    def leader_listener(self) -> dict[str, Any] | None:
        """The leader's Kafka listener, as the server's DirectorySource reads it."""
        found = self._json(LISTENER, {}).get("listener")
        return found if isinstance(found, dict) else None

    @property
    def keeps_lease(self) -> bool:
        """The server reports progress into the leader's root, so its leader takes
        its lease as for a DirectorySource."""
        return True

    def lease(self) -> Lease | None:
        """The leader's lease, as its DirectorySource reads it (None: no lease, or one
        naming another replica)."""
        return _lease(self._json(LEASE, {})["lease"])

    def take_lease(self, holder: str, *, ttl_ms: int, min_epoch: int) -> Lease | None:
        """A promotion's conditional write of the leader's lease, done by the server
        (NotLeaderError while another holder's lease is valid). With the leader's
        process gone there is no server to ask: the call raises, and promote() needs
        unclean=True, as for any source that cannot be reached."""
        return _lease(self._json(TAKE_LEASE, {"holder": holder, "ttl_ms": ttl_ms,
                                              "min_epoch": min_epoch})["lease"])

    def wait(self, timeout_s: float) -> None:
        """Long poll: the server holds the request until the leader's doorbell moves
        past the value this source first saw since its last wait (so an append between
        a `partition()` call and this wait is never missed), or `timeout_s` passes
        (at most MAX_WAIT_MS).

        A failure is not raised (the follower's next request meets it, and is retried
        after its backoff): the connection is dropped and the rest of the timeout slept.
        """
        seen, self._bell = self._bell, None
        timeout_ms = max(0, min(int(timeout_s * 1000), MAX_WAIT_MS))
        if timeout_ms == 0:
            return
        started = time.monotonic()
        try:
            self._json(WAIT, {"bell": seen, "timeout_ms": timeout_ms},
                       extra_s=timeout_ms / 1000)
        except (LogkitError, OSError) as exc:
            log.debug("%s: a long poll failed: %s", self.describe(), exc)
            time.sleep(max(0.0, timeout_ms / 1000 - (time.monotonic() - started)))

    def close(self) -> None:
        with self._lock:
            self._drop()
            self._bell = None

