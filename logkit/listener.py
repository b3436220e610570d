"""The thread-per-connection TCP listener under logkit's servers (the Kafka protocol
listener, the replication listener): a bound socket, one acceptor thread, one thread per
connection, caps on connections, and a close that stops them all.

Owns: binding (a bind failure is a ConfigError naming the address), accepting (a
descriptor or memory shortage on accept is logged and retried, never fatal), the
connection caps and who gives up a slot when they are reached, the registry of open
connections (one `Slot` each) and their threads, and `close()`.

Slots: at most `max_connections` connections (Kafka's max.connections) and
`max_connections_per_ip` from one address (max.connections.per.ip). A connection that
would pass a cap takes the slot of a connection that has not yet proven itself (not
authenticated: the oldest first), else, when the subclass allows it
(`evict_idle_authenticated`), of the connection idle the longest between requests
(Kafka's KIP-402 closes the least recently used one the same way); with no such
connection it is closed on accept. So connections that never authenticate, or sit idle,
cannot lock a legitimate client out. An evicted connection's `Slot.evicted` is set and
its socket shut down; its thread notices within POLL_SLICE_S.

Subclasses own what is said on a connection: they implement `_converse_on(sock,
address, slot)`, which runs in the connection's thread and keeps its slot current
(`slot.sock` after a TLS wrap, `slot.authenticated`, `slot.busy` while a request is
served); the socket is closed and forgotten when it returns or raises (OSError ends a
connection quietly; any other exception is logged, and ends only that connection).

Invariant: `close()` stops accepting, shuts every open connection down (waking the
threads blocked on them), calls `_closing_hook()` for what the subclass must wake,
joins the threads, then calls `_closed_hook()`; it is safe twice.
"""

from __future__ import annotations

import abc
import errno
import logging
import socket
import threading
import time
from typing import Any

from ._threads import start_thread
from .errors import ConfigError, ResourceError

__all__ = ["ThreadedListener", "Slot", "POLL_SLICE_S", "tls_handshake"]

log = logging.getLogger(__name__)

POLL_SLICE_S = 0.25                   # blocking socket calls re-check closing this often
_RETRY_ACCEPT = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)


class Slot:
    """One open connection as the acceptor sees it. The connection's thread writes the
    fields; the acceptor reads them under the listener's lock (a stale read only picks
    another victim)."""

    __slots__ = ("sock", "ip", "opened", "last_active", "authenticated", "busy",
                 "evicted")

    def __init__(self, sock: socket.socket, ip: str) -> None:
        self.sock = sock
        self.ip = ip
        self.opened = self.last_active = time.monotonic()
        self.authenticated = False       # set by the subclass once the peer proved itself
        self.busy = False                # a request is being served: never evicted
        self.evicted = False             # set by the acceptor: end this connection now

    def touch(self) -> None:
        self.last_active = time.monotonic()


def tls_handshake(context: Any, sock: socket.socket, slot: Slot, deadline: float,
                  closing: threading.Event) -> socket.socket:
    """The server side of a TLS handshake on `sock`, done by `deadline` however slowly
    the peer's bytes arrive (a socket timeout bounds each read only). Returns the TLS
    socket (also `slot.sock`); raises OSError past the deadline or when the slot is
    evicted or the listener closes."""
    tls = context.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
    slot.sock = tls
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or slot.evicted or closing.is_set():
                raise TimeoutError("the TLS handshake did not finish in time")
            tls.settimeout(min(POLL_SLICE_S, left))
            try:
                tls.do_handshake()
                return tls
            except socket.timeout:
                continue
    except BaseException:
        tls.close()
        raise


class ThreadedListener(abc.ABC):
    """A bound, accepting listener; `.host`, `.port`, `.closed`, `.connections`; a
    context manager. `kind` names it in logs and thread names."""

    kind = "listener"
    evict_idle_authenticated = False      # may a full listener evict an idle, proven one?

    def __init__(self, host: str, port: int, *, max_connections: int,
                 max_connections_per_ip: int | None = None, backlog: int = 128) -> None:
        self.max_connections = max_connections
        self.max_connections_per_ip = max_connections_per_ip or max_connections
        self._closing = threading.Event()
        self._lock = threading.Lock()
        self._connections: dict[int, Slot] = {}
        self._threads: list[threading.Thread] = []
        self._closed = False
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        listener = socket.socket(family, socket.SOCK_STREAM)
        try:
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind((host, port))
            listener.listen(backlog)
            listener.settimeout(POLL_SLICE_S)
        except OSError as exc:
            listener.close()
            raise ConfigError(f"cannot listen on {host}:{port}: {exc}") from exc
        self._listener = listener
        self.host = host
        self.port = listener.getsockname()[1]
        self._acceptor: threading.Thread | None = None

    def _start_accepting(self) -> None:
        """Start the acceptor (the subclass calls it once its own state is ready). No
        thread for it: the listener is closed (its socket, the subclass's hooks) and
        ResourceError raised."""
        acceptor = threading.Thread(target=self._accept_loop, daemon=True,
                                    name=f"logkit-{self.kind_slug}-{self.port}")
        try:
            start_thread(acceptor, f"the {self.kind}'s accepting thread")
        except ResourceError:
            self.close()
            raise
        self._acceptor = acceptor

    @property
    def kind_slug(self) -> str:
        return self.kind.split()[0].lower()

    @property
    def connections(self) -> int:
        """Connections open now."""
        with self._lock:
            return len(self._connections)

    @property
    def closed(self) -> bool:
        return self._closed

    def __enter__(self) -> "ThreadedListener":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # ---- accepting -------------------------------------------------------------------

    def _accept_loop(self) -> None:
        while not self._closing.is_set():
            try:
                sock, address = self._listener.accept()
            except socket.timeout:
                continue
            except OSError as exc:
                if self._closing.is_set():
                    return
                if exc.errno in _RETRY_ACCEPT:
                    log.warning("%s: accept failed (%s); retrying", self.kind, exc)
                    time.sleep(POLL_SLICE_S)
                    continue
                raise
            slot = Slot(sock, address[0])
            with self._lock:
                self._threads = [t for t in self._threads if t.is_alive()]
                refused, victim = self._admit(slot)
            if victim is not None:
                log.info("%s: full; closing %s connection from %s to admit %s", self.kind,
                         "an idle" if victim.authenticated else "an unauthenticated",
                         victim.ip, address[0])
                victim.evicted = True
                try:
                    victim.sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
            if refused:
                log.warning("%s: %s; refusing %s", self.kind, refused, address)
                sock.close()
                continue
            thread = threading.Thread(target=self._serve_connection,
                                      args=(sock, address, slot),
                                      daemon=True,
                                      name=f"logkit-{self.kind_slug}-conn-{address[1]}")
            with self._lock:
                self._threads.append(thread)
            try:
                start_thread(thread, f"a thread for {address}")
            except ResourceError as exc:   # the process is at its thread limit:
                with self._lock:           # refuse this connection, keep accepting
                    self._threads.remove(thread)
                    self._connections.pop(id(slot), None)
                log.warning("%s: %s; refusing the connection", self.kind, exc)
                sock.close()

    def _admit(self, slot: Slot) -> tuple[str | None, Slot | None]:
        """Under the lock: register `slot`, giving it another's place if a cap is
        reached. (why it was refused or None, the slot evicted for it or None)."""
        same_ip = [s for s in self._connections.values() if s.ip == slot.ip]
        if len(same_ip) >= self.max_connections_per_ip:
            pool, why = same_ip, (f"{len(same_ip)} connections from {slot.ip} (the limit,"
                                  " max.connections.per.ip)")
        elif len(self._connections) >= self.max_connections:
            pool, why = list(self._connections.values()), (
                f"{len(self._connections)} connections open (the limit, max.connections)")
        else:
            pool, why = [], None
        victim = None
        if why is not None:
            victim = self._victim(pool)
            if victim is None:
                return why, None
            self._connections.pop(id(victim), None)
        self._connections[id(slot)] = slot
        return None, victim

    def _victim(self, pool: list[Slot]) -> Slot | None:
        """Who gives up a slot: the oldest unauthenticated connection, else (if allowed)
        the one idle the longest between requests, else nobody."""
        candidates = [s for s in pool if not s.authenticated and not s.evicted]
        if candidates:
            return min(candidates, key=lambda s: s.opened)
        if self.evict_idle_authenticated:
            candidates = [s for s in pool if not s.busy and not s.evicted]
            if candidates:
                return min(candidates, key=lambda s: s.last_active)
        return None

    def _serve_connection(self, sock: socket.socket, address: Any, slot: Slot) -> None:
        key = id(slot)
        try:
            self._converse_on(sock, address, slot)
        except OSError as exc:                     # ssl.SSLError included
            log.debug("%s: connection %s:%s ended: %s", self.kind, address[0], address[1],
                      exc)
        except Exception:                          # a bug: this connection only
            log.exception("%s: closing %s:%s after an unexpected error", self.kind,
                          address[0], address[1])
        finally:
            with self._lock:
                self._connections.pop(key, None)
            try:
                sock.close()
            except OSError:
                pass

    @abc.abstractmethod
    def _converse_on(self, sock: socket.socket, address: Any, slot: Slot) -> None:
        """Serve one connection (in its own thread) until it ends."""

    # ---- closing ---------------------------------------------------------------------

    def _closing_hook(self) -> None:
        """Wake what the subclass's connection threads may be waiting on."""

    def _closed_hook(self) -> None:
        """Release what the subclass holds, once every thread is joined."""

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            connections = [slot.sock for slot in self._connections.values()]
        self._closing.set()
        try:
            self._listener.close()
        except OSError:
            pass
        for sock in connections:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self._closing_hook()
        current = threading.current_thread()
        if self._acceptor is not None and self._acceptor is not current:
            self._acceptor.join(timeout=5)
        with self._lock:
            threads = list(self._threads)
        for thread in threads:
            if thread is not current:
                thread.join(timeout=5)
        self._closed_hook()
        log.info("%s on %s:%d closed", self.kind, self.host, self.port)
