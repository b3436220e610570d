"""Test helper: a fault-injecting TCP proxy, for any test of a client and server that
talk over TCP (written for replication; nothing in it knows logkit).

    with FaultProxy(server_host, server_port) as proxy:
        client connects to (proxy.host, proxy.port) ...
        proxy.delay(0.05)    # every chunk, both ways, forwarded 50 ms late
        proxy.cut()          # close every open connection now (FIN); new ones pass
        proxy.drop()         # reset every open connection (RST), and every new one,
                             # until heal()
        proxy.half_open()    # open connections go silent for good: what is sent is
                             # discarded, nothing arrives, nothing closes (a peer that
                             # died without a FIN); new connections pass
        proxy.partition()    # nothing passes either way, on open or new connections,
                             # until heal(); then the held bytes flow again
        proxy.heal()         # back to passing everything (half-open ones stay dead)

Owns: one listening socket on 127.0.0.1, an acceptor thread, and two pump threads per
proxied connection. Invariant: bytes pass in order and unchanged, or not at all (a
fault never corrupts or reorders a stream); `close()` closes everything and is safe
twice. Counters: `accepted` (connections accepted).
"""

from __future__ import annotations

import select
import socket
import struct
import threading
import time

__all__ = ["FaultProxy"]

SLICE_S = 0.02                # pumps look at the fault flags this often


class _Link:
    """One proxied connection: the client's socket and the server's."""

    def __init__(self, client: socket.socket, server: socket.socket) -> None:
        self.client = client
        self.server = server
        self.dead = False          # half-open: discard both ways, never close
        self.closed = False

    def close(self, *, reset: bool = False) -> None:
        if self.closed:
            return
        self.closed = True
        for sock in (self.client, self.server):
            try:
                if reset:          # SO_LINGER 0: close() sends RST instead of FIN
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                                    struct.pack("ii", 1, 0))
                else:
                    sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            try:
                sock.close()
            except OSError:
                pass


class FaultProxy:
    """A proxy from (self.host, self.port) to (target_host, target_port)."""

    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self._lock = threading.Lock()
        self._links: list[_Link] = []
        self._threads: list[threading.Thread] = []
        self._delay_s = 0.0
        self._dropping = False
        self._partitioned = False
        self._closing = threading.Event()
        self.accepted = 0
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(64)
        self._listener.settimeout(SLICE_S * 5)
        self.host, self.port = self._listener.getsockname()[:2]
        self._start(self._accept_loop)

    def __enter__(self) -> "FaultProxy":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _start(self, target, *args) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True)
        with self._lock:
            self._threads.append(thread)
        thread.start()

    # ---- faults -------------------------------------------------------------------

    def delay(self, seconds: float) -> None:
        self._delay_s = seconds

    def cut(self) -> None:
        for link in self._open_links():
            link.close()

    def drop(self) -> None:
        self._dropping = True
        for link in self._open_links():
            link.close(reset=True)

    def half_open(self) -> None:
        for link in self._open_links():
            link.dead = True

    def partition(self) -> None:
        self._partitioned = True

    def heal(self) -> None:
        self._delay_s = 0.0
        self._dropping = False
        self._partitioned = False

    def _open_links(self) -> list[_Link]:
        with self._lock:
            self._links = [link for link in self._links if not link.closed]
            return list(self._links)

    # ---- plumbing -----------------------------------------------------------------

    def _accept_loop(self) -> None:
        while not self._closing.is_set():
            try:
                client, _ = self._listener.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            self.accepted += 1
            if self._dropping:
                _Link(client, socket.socket()).close(reset=True)
                continue
            try:
                server = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()               # the target is down: so is the proxy
                continue
            for sock in (client, server):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                sock.setblocking(True)
            link = _Link(client, server)
            with self._lock:
                self._links.append(link)
            self._start(self._pump, link, client, server)
            self._start(self._pump, link, server, client)

    def _pump(self, link: _Link, src: socket.socket, dst: socket.socket) -> None:
        try:
            while not link.closed and not self._closing.is_set():
                if self._partitioned and not link.dead:
                    time.sleep(SLICE_S)      # hold the bytes in the kernel's buffers
                    continue
                readable, _, _ = select.select([src], [], [], SLICE_S)
                if not readable:
                    continue
                data = src.recv(1 << 16)
                if not data:
                    if not link.dead:
                        dst.shutdown(socket.SHUT_WR)
                    return
                if link.dead:
                    continue                 # half-open: into the void
                if self._delay_s:
                    time.sleep(self._delay_s)
                dst.sendall(data)
        except (OSError, ValueError):
            link.close()

    def close(self) -> None:
        if self._closing.is_set():
            return
        self._closing.set()
        self._listener.close()
        for link in self._open_links():
            link.close()
        with self._lock:
            threads = list(self._threads)
        for thread in threads:
            if thread is not threading.current_thread():
                thread.join(timeout=5)
