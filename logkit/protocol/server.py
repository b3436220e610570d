"""The socket loop of the Kafka listener: accept connections, read frames, hand each
request to the handlers, write the answers back in order. It knows sockets, TLS and the
SASL/PLAIN exchange, and nothing of Kafka's APIs beyond the frame and header shapes.

Threads (chosen over a selector loop because a Kafka connection is strictly one request
at a time, in order — Kafka itself mutes a connection until its answer is written — and
because Fetch long-polls and JoinGroup waits block the request that asked for them):
one acceptor thread, and one thread per connection that reads a frame, runs the handler,
and writes the answer. Blocking calls hold no lock shared with other connections, so a
slow or hostile client stalls only its own thread.

Bounds (each defaults to the broker setting named, docs/security.md): at most
`max_connections` connections (max.connections) and `max_connections_per_ip` from one
address (max.connections.per.ip); a new connection past a cap takes the slot of the
oldest one not yet authenticated, else of the one idle the longest (listener.py); a
connection must authenticate — or, without SASL, send its first request — within
`unauthenticated_timeout_ms` (connections.max.unauthenticated.ms); a frame declaring
more than `max_request_bytes` (socket.request.max.bytes) closes its connection before
any of its body is read; a request must be whole within `request_timeout_ms` of its
first byte, however the bytes trickle in; an idle connection is closed after
`idle_timeout_ms` (connections.max.idle.ms); an answer that cannot be written within
`request_timeout_ms` closes the connection. A frame that does not parse closes its
connection and reaches no handler, so nothing of it is ever written.

SASL/PLAIN (`sasl_plain_users`): the exchange is the table `_SASL_NEXT` (Kafka's
SaslServerAuthenticator states). Before it succeeds, only ApiVersions, SaslHandshake and
SaslAuthenticate are read, each frame at most `sasl_max_receive_bytes`
(sasl.server.max.receive.size); any other API key, or a bigger frame, closes the
connection from its header, never decoding its body. SaslAuthenticate without a
handshake is answered ILLEGAL_SASL_STATE and closed. A failed authentication is logged
(peer and user, never the password), answered after
`failed_authentication_delay_ms` (connection.failed.authentication.delay.ms) and
closed: one guess per connection. Passwords are compared in constant time.

Invariant: `close()` stops accepting, wakes every blocked handler (long polls, group
waits), closes every connection and joins the threads; it is safe twice.
"""

from __future__ import annotations

import collections
import hmac
import logging
import socket
import struct
import time
from typing import TYPE_CHECKING, Any, Callable, Mapping

from ..listener import POLL_SLICE_S, Slot, ThreadedListener, tls_handshake
from .cluster import LeaderView, Node, node_id_for, remove_listener, write_listener
from .errors import (ILLEGAL_SASL_STATE, SASL_AUTHENTICATION_FAILED,
                     UNSUPPORTED_SASL_MECHANISM, FrameTooLargeError, ProtocolError)
from .frame import FrameDecoder, encode_response, parse_request
from .handlers import Handlers, Session
from .messages import APIS, API_VERSIONS_KEY

if TYPE_CHECKING:                  # ssl is imported by whoever makes the context:
    import ssl                     # a listener without TLS does not pay for it

__all__ = ["KafkaServer", "serve"]

log = logging.getLogger(__name__)

RECV_BYTES = 1 << 16                  # below malloc's mmap threshold: a recv stays cheap
REQUEST_TIMEOUT_MS = 30000
SASL_HANDSHAKE, SASL_AUTHENTICATE = 17, 36
_ALWAYS_ALLOWED = (API_VERSIONS_KEY, SASL_HANDSHAKE, SASL_AUTHENTICATE)
_API_KEY = struct.Struct(">h")                # the first field of a request header

# keyword option -> the broker setting that gives its default (logkit/config.py)
_FROM_BROKER_CONFIG = {
    "max_request_bytes": "socket.request.max.bytes",
    "idle_timeout_ms": "connections.max.idle.ms",
    "max_connections": "max.connections",
    "max_connections_per_ip": "max.connections.per.ip",
    "unauthenticated_timeout_ms": "connections.max.unauthenticated.ms",
    "failed_authentication_delay_ms": "connection.failed.authentication.delay.ms",
    "sasl_max_receive_bytes": "sasl.server.max.receive.size"}

# The SASL exchange: (state, API key) -> the state after a successful step. A pair not
# in the table is answered ILLEGAL_SASL_STATE (SaslHandshake/SaslAuthenticate) or closes
# the connection unread (any other API before authentication). ApiVersions is allowed
# in every state; "raw" is SaslHandshake v0's: the next frame is a bare PLAIN token.
_START, _HANDSHAKEN, _RAW, _AUTHENTICATED = "start", "handshaken", "raw", "authenticated"
_SASL_NEXT = {
    (_START, API_VERSIONS_KEY): _START,
    (_START, SASL_HANDSHAKE): _HANDSHAKEN,            # _RAW for version 0
    (_HANDSHAKEN, API_VERSIONS_KEY): _HANDSHAKEN,
    (_HANDSHAKEN, SASL_AUTHENTICATE): _AUTHENTICATED,
}


class KafkaServer(ThreadedListener):
    """A running listener. `.host`, `.port`, `.bootstrap_servers`; `close()` is safe
    twice; a context manager. Made by `Broker.serve()`."""

    kind = "Kafka listener"

    evict_idle_authenticated = True        # Kafka's clients reconnect on their own

    def __init__(self, broker: Any, host: str = "127.0.0.1", port: int = 0, *,
                 advertised_host: str | None = None,
                 max_request_bytes: int | None = None,
                 idle_timeout_ms: int | None = None,
                 request_timeout_ms: int = REQUEST_TIMEOUT_MS,
                 max_connections: int | None = None,
                 max_connections_per_ip: int | None = None,
                 unauthenticated_timeout_ms: int | None = None,
                 failed_authentication_delay_ms: int | None = None,
                 sasl_max_receive_bytes: int | None = None,
                 initial_rebalance_delay_ms: int = 0,
                 ssl_context: ssl.SSLContext | None = None,
                 sasl_plain_users: Mapping[str, str] | None = None,
                 node_id: int | None = None,
                 view: Callable[[Node], Any] | None = None) -> None:
        given = {"max_request_bytes": max_request_bytes, "idle_timeout_ms": idle_timeout_ms,
                 "max_connections": max_connections,
                 "max_connections_per_ip": max_connections_per_ip,
                 "unauthenticated_timeout_ms": unauthenticated_timeout_ms,
                 "failed_authentication_delay_ms": failed_authentication_delay_ms,
                 "sasl_max_receive_bytes": sasl_max_receive_bytes}
        limits = {name: broker.config[_FROM_BROKER_CONFIG[name]] if value is None else value
                  for name, value in given.items()}
        limits["request_timeout_ms"] = request_timeout_ms
        for name, value in limits.items():
            low = 0 if name == "failed_authentication_delay_ms" else 1
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise _config_error(f"{name} must be an integer >= {low}, got {value!r}")
        if isinstance(initial_rebalance_delay_ms, bool) or \
                not isinstance(initial_rebalance_delay_ms, int) or initial_rebalance_delay_ms < 0:
            raise _config_error("initial_rebalance_delay_ms must be an integer >= 0")
        self.max_request_bytes = limits["max_request_bytes"]
        self.idle_timeout_s = limits["idle_timeout_ms"] / 1000
        self.request_timeout_s = request_timeout_ms / 1000
        self.unauthenticated_timeout_s = limits["unauthenticated_timeout_ms"] / 1000
        self.failed_authentication_delay_s = limits["failed_authentication_delay_ms"] / 1000
        self.sasl_max_receive_bytes = min(limits["sasl_max_receive_bytes"],
                                          self.max_request_bytes)
        self._ssl = ssl_context
        self._users = dict(sasl_plain_users) if sasl_plain_users else None
        # (client id, API name, version) -> requests answered: which client used what
        self.versions_seen: collections.Counter[tuple[str, str, int]] = collections.Counter()
        super().__init__(host, port, max_connections=limits["max_connections"],
                         max_connections_per_ip=limits["max_connections_per_ip"],
                         backlog=128)
        advertised = advertised_host or (host if host not in ("", "0.0.0.0", "::")
                                         else socket.gethostname())
        self.advertised_host = advertised
        # the node this listener is in Metadata (cluster.py): broker.id, else from the root
        self.node = Node(node_id if node_id is not None
                         else node_id_for(broker.path, broker.config), advertised, self.port)
        self.on_close: list[Callable[[], None]] = []    # run once every thread is joined
        self.handlers = Handlers(broker, host=advertised, port=self.port,
                                 view=(view or (lambda node: LeaderView(broker, node)))(
                                     self.node),
                                 initial_rebalance_delay_ms=initial_rebalance_delay_ms,
                                 closing=self._closing)
        self.handlers.sasl = self._users is not None
        self._root = broker.path
        try:
            write_listener(self._root, self.node,      # where replicas' listeners look
                           self.handlers.view.cluster_id())
        except OSError as exc:
            log.warning("Kafka listener: cannot name itself in %s (%s); replicas will "
                        "not learn its address", self._root, exc)
        self._start_accepting()
        log.info("Kafka listener on %s:%d (advertised %s) for %s", host, self.port,
                 advertised, broker.path)

    @property
    def bootstrap_servers(self) -> str:
        host = self.advertised_host
        return f"[{host}]:{self.port}" if ":" in host else f"{host}:{self.port}"

    def __repr__(self) -> str:
        return f"KafkaServer({self.bootstrap_servers!r})"

    @property
    def node_id(self) -> int:
        """This listener's node id in Metadata."""
        return self.node.node_id

    def lead(self, broker: Any) -> None:
        """Answer as the leader over `broker` from now on (a serving follower was
        promoted; `Follower.serve`): the same node, host and port."""
        self.handlers.lead(broker, LeaderView(broker, self.node))

    # ---- one connection --------------------------------------------------------------

    def _converse_on(self, sock: socket.socket, address: Any, slot: Slot) -> None:
        peer = f"{address[0]}:{address[1]}"
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            if self._ssl is not None:
                sock = tls_handshake(self._ssl, sock, slot, slot.opened + min(
                    self.request_timeout_s, self.unauthenticated_timeout_s), self._closing)
            sock.settimeout(POLL_SLICE_S)
            self._converse(sock, peer, slot, Session(address[0], self._closing))
        except FrameTooLargeError as exc:
            log.info("Kafka listener: closing %s: %s", peer, exc)
        except ProtocolError as exc:
            log.info("Kafka listener: closing %s: a frame that does not parse: %s", peer, exc)
        finally:
            sock.close()                 # the TLS socket (the listener closes the plain one)

    def _converse(self, sock: socket.socket, peer: str, slot: Slot,
                  session: Session) -> None:
        """Read frames and answer them in order until the peer leaves, a bound is
        crossed (returns) or a frame is refused (raises ProtocolError)."""
        state = _START if self._users is not None else _AUTHENTICATED
        decoder = FrameDecoder(self.sasl_max_receive_bytes if state != _AUTHENTICATED
                               else self.max_request_bytes)
        request_deadline: float | None = None       # the request begun must be whole by
        while not self._closing.is_set() and not slot.evicted:
            now = time.monotonic()
            why = self._overdue(now, slot, request_deadline)
            if why is not None:
                log.info("Kafka listener: closing %s: %s", peer, why)
                return
            try:
                data = sock.recv(RECV_BYTES)
            except socket.timeout:
                continue
            if not data:
                return
            frames = decoder.feed(data)
            for frame in frames:
                slot.busy = True
                try:
                    state = self._serve_frame(sock, peer, frame, state, session)
                finally:
                    slot.busy = False
                    slot.touch()
                if state is None:
                    return
                if state == _AUTHENTICATED and not slot.authenticated:
                    slot.authenticated = True       # SASL done, or the first request
                    decoder.max_request_bytes = self.max_request_bytes
            # The clock of a request begun runs from its first byte we could read: now,
            # if it came alone or behind frames just served (a pipelining client is not
            # charged for the time our handlers took); only a whole frame restarts it.
            if not decoder.pending_bytes:
                request_deadline = None
            elif frames or request_deadline is None:
                request_deadline = time.monotonic() + self.request_timeout_s

    def _overdue(self, now: float, slot: Slot, request_deadline: float | None
                 ) -> str | None:
        """Why this connection must close now (a bound crossed), or None."""
        if request_deadline is not None and now > request_deadline:
            return (f"a request is still incomplete {self.request_timeout_s:g} s after its "
                    "first byte (request_timeout_ms)")
        if not slot.authenticated and now - slot.opened > self.unauthenticated_timeout_s:
            return (f"not authenticated within {self.unauthenticated_timeout_s:g} s "
                    "(connections.max.unauthenticated.ms)")
        if request_deadline is None and now - slot.last_active > self.idle_timeout_s:
            return "idle past connections.max.idle.ms"
        return None

    def _serve_frame(self, sock: socket.socket, peer: str, frame: bytes, state: str,
                     session: Session) -> str | None:
        """Answer one frame; the SASL state after it, or None to close."""
        if state == _RAW:                        # SaslHandshake v0: a bare PLAIN token
            if not self._check_plain(frame, peer):
                self._pause_after_failure()
                return None                      # v0 has no error answer: just closed
            self._send(sock, b"\0\0\0\0")
            return _AUTHENTICATED
        if state != _AUTHENTICATED:
            key = _API_KEY.unpack_from(frame)[0] if len(frame) >= 2 else -1
            if key not in _ALWAYS_ALLOWED:        # refused from its header: never decoded
                raise ProtocolError(f"API key {key} before SASL authentication")
        request = parse_request(frame)         # ProtocolError: the caller closes
        key = request.api.key
        self.versions_seen[(request.client_id or "", request.api.name, request.version)] += 1
        if key in (SASL_HANDSHAKE, SASL_AUTHENTICATE):
            body, state = self._sasl_step(request, state, peer)
        else:
            body = self.handlers.handle(request, session)
        if body is not None:
            version = request.version
            if key == API_VERSIONS_KEY and version > request.api.max_version:
                version = 0                         # KIP-511: the fallback is v0-shaped
            self._send(sock, encode_response(request.api, version, request.correlation_id,
                                             body))
        return state

    def _sasl_step(self, request: Any, state: str, peer: str
                   ) -> tuple[dict[str, Any], str | None]:
        """(the answer, the next state or None: answer, then close)."""
        key = request.api.key
        following = _SASL_NEXT.get((state, key)) if self._users is not None else None
        if key == SASL_HANDSHAKE:
            if self._users is None:                 # no SASL here: say so, stay open
                return {"error_code": UNSUPPORTED_SASL_MECHANISM, "mechanisms": []}, state
            if following is None:
                return {"error_code": ILLEGAL_SASL_STATE, "mechanisms": []}, None
            if request.body["mechanism"] != "PLAIN":
                return {"error_code": UNSUPPORTED_SASL_MECHANISM,
                        "mechanisms": ["PLAIN"]}, None
            return ({"error_code": 0, "mechanisms": ["PLAIN"]},
                    _RAW if request.version == 0 else following)
        if following is None:
            return {"error_code": ILLEGAL_SASL_STATE, "auth_bytes": b"",
                    "error_message": "SaslAuthenticate without a SaslHandshake before it"
                    if self._users is not None else "SASL is not enabled"}, None
        if self._check_plain(request.body["auth_bytes"], peer):
            return {"error_code": 0, "error_message": None, "auth_bytes": b""}, following
        self._pause_after_failure()
        return {"error_code": SASL_AUTHENTICATION_FAILED, "auth_bytes": b"",
                "error_message": "Authentication failed: invalid username or password"}, None

    def _pause_after_failure(self) -> None:
        """Kafka's connection.failed.authentication.delay.ms: a guesser pays this, plus
        a new connection, per guess."""
        self._closing.wait(self.failed_authentication_delay_s)

    def _send(self, sock: socket.socket, data: bytes | bytearray) -> None:
        sock.settimeout(self.request_timeout_s)
        try:
            sock.sendall(data)
        finally:
            sock.settimeout(POLL_SLICE_S)

    def _check_plain(self, token: bytes, peer: str) -> bool:
        """Whether a PLAIN token ([authzid] NUL user NUL password) names a user and its
        password; a failure is logged with the peer and user, never the password."""
        parts = bytes(token).split(b"\0")
        user = parts[1].decode("utf-8", "replace")[:100] if len(parts) == 3 else None
        expected = (self._users or {}).get(user) if user is not None else None
        given = parts[2] if len(parts) == 3 else b""
        # compared in constant time, against a stand-in when the user is unknown
        ok = hmac.compare_digest((expected if expected is not None else "\0").encode(),
                                 given) and expected is not None
        if not ok:
            log.warning("Kafka listener: SASL/PLAIN authentication failed for user %r "
                        "from %s; closing the connection", user, peer)
        return ok

    # ---- closing ---------------------------------------------------------------------

    def _closing_hook(self) -> None:
        self.handlers.groups.close()

    def _closed_hook(self) -> None:
        try:
            remove_listener(self._root, self.node)
        except OSError:
            pass
        self.handlers.close()
        for hook in self.on_close:
            try:
                hook()
            except Exception:                   # a hook's failure must not stop the rest
                log.exception("Kafka listener: a close hook failed")


def serve(broker: Any, host: str = "127.0.0.1", port: int = 0, **options: Any) -> KafkaServer:
    """Start a Kafka protocol listener over `broker` (see KafkaServer for options)."""
    return KafkaServer(broker, host, port, **options)


def _config_error(message: str) -> Exception:
    from ..errors import ConfigError
    return ConfigError(message)


assert all(key in APIS for key in _ALWAYS_ALLOWED)
