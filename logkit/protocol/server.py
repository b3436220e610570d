"""The socket loop of the Kafka listener: accept connections, read frames, hand each
request to the handlers, write the answers back in order. It knows sockets, TLS and the
SASL/PLAIN exchange, and nothing of Kafka's APIs beyond the frame and header shapes.

Threads (chosen over a selector loop because a Kafka connection is strictly one request
at a time, in order — Kafka itself mutes a connection until its answer is written — and
because Fetch long-polls and JoinGroup waits block the request that asked for them):
one acceptor thread, and one thread per connection that reads a frame, runs the handler,
and writes the answer. Blocking calls hold no lock shared with other connections, so a
slow or hostile client stalls only its own thread.

Bounds: at most `max_connections` connections (more are closed on accept); a frame
declaring more than `max_request_bytes` closes its connection before any of its body is
read; a frame begun must be complete within `request_timeout_ms` (a slow or half-open
client is cut off), an idle connection is closed after `idle_timeout_ms` (Kafka's
connections.max.idle.ms); an answer that cannot be written within `request_timeout_ms`
closes the connection. A frame that does not parse closes its connection and reaches no
handler, so nothing of it is ever written.

Invariant: `close()` stops accepting, wakes every blocked handler (long polls, group
waits), closes every connection and joins the threads; it is safe twice.
"""

from __future__ import annotations

import collections
import logging
import socket
import time
from typing import TYPE_CHECKING, Any, Callable, Mapping

from ..listener import POLL_SLICE_S, ThreadedListener
from .cluster import LeaderView, Node, node_id_for, remove_listener, write_listener
from .errors import FrameTooLargeError, ProtocolError
from .frame import MAX_REQUEST_BYTES, FrameDecoder, encode_response, parse_request
from .handlers import Handlers, Session
from .messages import APIS, API_VERSIONS_KEY

if TYPE_CHECKING:                  # ssl is imported by whoever makes the context:
    import ssl                     # a listener without TLS does not pay for it

__all__ = ["KafkaServer", "serve"]

log = logging.getLogger(__name__)

RECV_BYTES = 1 << 16                  # below malloc's mmap threshold: a recv stays cheap
IDLE_TIMEOUT_MS = 600000              # Kafka's connections.max.idle.ms
REQUEST_TIMEOUT_MS = 30000
MAX_CONNECTIONS = 1000
SASL_HANDSHAKE, SASL_AUTHENTICATE = 17, 36
_ALWAYS_ALLOWED = (API_VERSIONS_KEY, SASL_HANDSHAKE, SASL_AUTHENTICATE)


class KafkaServer(ThreadedListener):
    """A running listener. `.host`, `.port`, `.bootstrap_servers`; `close()` is safe
    twice; a context manager. Made by `Broker.serve()`."""

    kind = "Kafka listener"

    def __init__(self, broker: Any, host: str = "127.0.0.1", port: int = 0, *,
                 advertised_host: str | None = None,
                 max_request_bytes: int = MAX_REQUEST_BYTES,
                 idle_timeout_ms: int = IDLE_TIMEOUT_MS,
                 request_timeout_ms: int = REQUEST_TIMEOUT_MS,
                 max_connections: int = MAX_CONNECTIONS,
                 initial_rebalance_delay_ms: int = 0,
                 ssl_context: ssl.SSLContext | None = None,
                 sasl_plain_users: Mapping[str, str] | None = None,
                 node_id: int | None = None,
                 view: Callable[[Node], Any] | None = None) -> None:
        for name, value in (("max_request_bytes", max_request_bytes),
                            ("idle_timeout_ms", idle_timeout_ms),
                            ("request_timeout_ms", request_timeout_ms),
                            ("max_connections", max_connections)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise _config_error(f"{name} must be a positive integer, got {value!r}")
        if isinstance(initial_rebalance_delay_ms, bool) or \
                not isinstance(initial_rebalance_delay_ms, int) or initial_rebalance_delay_ms < 0:
            raise _config_error("initial_rebalance_delay_ms must be an integer >= 0")
        self.max_request_bytes = max_request_bytes
        self.idle_timeout_s = idle_timeout_ms / 1000
        self.request_timeout_s = request_timeout_ms / 1000
        self._ssl = ssl_context
        self._users = dict(sasl_plain_users) if sasl_plain_users else None
        # (client id, API name, version) -> requests answered: which client used what
        self.versions_seen: collections.Counter[tuple[str, str, int]] = collections.Counter()
        super().__init__(host, port, max_connections=max_connections, backlog=128)
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

    def _converse_on(self, sock: socket.socket, address: Any) -> None:
        peer = f"{address[0]}:{address[1]}"
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if self._ssl is not None:
            sock.settimeout(self.request_timeout_s)
            sock = self._ssl.wrap_socket(sock, server_side=True)
        try:
            sock.settimeout(POLL_SLICE_S)
            self._converse(sock, peer, Session(address[0], self._closing))
        except FrameTooLargeError as exc:
            log.info("Kafka listener: closing %s: %s", peer, exc)
        except ProtocolError as exc:
            log.info("Kafka listener: closing %s: a frame that does not parse: %s", peer, exc)
        finally:
            sock.close()                 # the TLS socket (the listener closes the plain one)

    def _converse(self, sock: socket.socket, peer: str, session: Session) -> None:
        decoder = FrameDecoder(self.max_request_bytes)
        authenticated = self._users is None
        raw_sasl = False                          # SaslHandshake v0: raw tokens follow
        last_activity = time.monotonic()
        begun_at: float | None = None
        while not self._closing.is_set():
            try:
                data = sock.recv(RECV_BYTES)
            except socket.timeout:
                now = time.monotonic()
                if decoder.pending_bytes and begun_at is not None \
                        and now - begun_at > self.request_timeout_s:
                    log.info("Kafka listener: closing %s: a request begun %.1f s ago is "
                             "still incomplete", peer, now - begun_at)
                    return
                if now - last_activity > self.idle_timeout_s:
                    log.debug("Kafka listener: closing idle connection %s", peer)
                    return
                continue
            if not data:
                return
            last_activity = time.monotonic()
            if begun_at is None or not decoder.pending_bytes:
                begun_at = last_activity
            for frame in decoder.feed(data):
                if raw_sasl:
                    authenticated = self._check_plain(frame)
                    if not authenticated:
                        log.info("Kafka listener: closing %s: SASL/PLAIN refused", peer)
                        return
                    self._send(sock, b"\0\0\0\0")
                    raw_sasl = False
                    continue
                answer, authenticated, raw_sasl = self._answer(frame, session,
                                                               authenticated)
                if answer is not None:
                    self._send(sock, answer)
            if not decoder.pending_bytes:
                begun_at = None

    def _send(self, sock: socket.socket, data: bytes | bytearray) -> None:
        sock.settimeout(self.request_timeout_s)
        try:
            sock.sendall(data)
        finally:
            sock.settimeout(POLL_SLICE_S)

    def _answer(self, frame: bytes, session: Session,
                authenticated: bool) -> tuple[bytearray | None, bool, bool]:
        """(the answer frame or None, authenticated, raw SASL tokens follow)."""
        request = parse_request(frame)         # ProtocolError: the caller closes
        key = request.api.key
        self.versions_seen[(request.client_id or "", request.api.name, request.version)] += 1
        if not authenticated and key not in _ALWAYS_ALLOWED:
            raise ProtocolError(f"{request.api.name} before SASL authentication")
        raw = False
        if key == SASL_HANDSHAKE:
            mechanism = request.body["mechanism"]
            ok = self._users is not None and mechanism == "PLAIN"
            body = {"error_code": 0 if ok else 33, "mechanisms": ["PLAIN"] if self._users
                    else []}
            raw = ok and request.version == 0
        elif key == SASL_AUTHENTICATE:
            if self._users is None:
                body = {"error_code": 34, "error_message": "SASL is not enabled",
                        "auth_bytes": b""}
            else:
                authenticated = self._check_plain(request.body["auth_bytes"])
                body = {"error_code": 0 if authenticated else 58,
                        "error_message": None if authenticated else
                        "Authentication failed: invalid username or password",
                        "auth_bytes": b""}
        else:
            body = self.handlers.handle(request, session)
        if body is None:
            return None, authenticated, raw
        version = request.version
        if key == API_VERSIONS_KEY and version > request.api.max_version:
            version = 0                         # KIP-511: the fallback answer is v0-shaped
        return (encode_response(request.api, version, request.correlation_id, body),
                authenticated, raw)

    def _check_plain(self, token: bytes) -> bool:
        parts = bytes(token).split(b"\0")
        if self._users is None or len(parts) != 3:
            return False
        user, password = parts[1].decode("utf-8", "replace"), parts[2]
        expected = self._users.get(user)
        return expected is not None and expected.encode() == password

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
