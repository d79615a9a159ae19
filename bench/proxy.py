"""A loopback TCP proxy that counts round trips, for section 2's round-trip counts.

A round trip is counted each time a connection's traffic turns from client → server to
server → client: the client sent something and now gets an answer to it. The count is
raised before the answer is passed on, so once the client has its answer the count includes
it. One thread serves every connection (``selectors``); nothing is delayed or dropped.
"""

from __future__ import annotations

import contextlib
import selectors
import socket
import threading
from urllib.parse import urlsplit


class _Link:
    """One proxied connection: the client's socket, the server's, the last direction seen."""

    def __init__(self, client: socket.socket, server: socket.socket) -> None:
        self.client, self.server = client, server
        self.last = ""  # "up" (client → server) or "down"

    def peer(self, sock: socket.socket) -> tuple[socket.socket, str]:
        return (self.server, "up") if sock is self.client else (self.client, "down")


class CountingProxy:
    """Listens on 127.0.0.1:<free port> and forwards every connection to ``target``."""

    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self.listener.getsockname()[1]
        self.round_trips = 0
        self.connections = 0
        self._lock = threading.Lock()
        self._selector = selectors.DefaultSelector()
        self._selector.register(self.listener, selectors.EVENT_READ, None)
        self._closed = False
        self._thread = threading.Thread(target=self._serve, name="bench-proxy", daemon=True)
        self._thread.start()

    def url_for(self, url: str) -> str:
        """``url`` with its first host:port replaced by the proxy's."""
        host_port = urlsplit(url).netloc.split("@")[-1].split(",")[0]
        return url.replace(host_port, f"127.0.0.1:{self.port}", 1)

    def take(self) -> int:
        """Round trips counted since the last call."""
        with self._lock:
            count, self.round_trips = self.round_trips, 0
        return count

    def close(self) -> None:
        self._closed = True
        self._thread.join(timeout=2)
        for key in list(self._selector.get_map().values()):
            with contextlib.suppress(OSError):
                # (ignore: the selector's type allows bare fds; only sockets are registered)
                key.fileobj.close()  # type: ignore[union-attr]
        self._selector.close()

    def __enter__(self) -> CountingProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _serve(self) -> None:
        while not self._closed:
            for key, _ in self._selector.select(timeout=0.05):
                if key.data is None:
                    self._accept()
                else:
                    self._forward(key.fileobj, key.data)  # type: ignore[arg-type]  # (as in close)

    def _accept(self) -> None:
        client, _ = self.listener.accept()
        try:
            server = socket.create_connection(self.target, timeout=5)
        except OSError:
            client.close()
            return
        for sock in (client, server):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.setblocking(True)
        link = _Link(client, server)
        self._selector.register(client, selectors.EVENT_READ, link)
        self._selector.register(server, selectors.EVENT_READ, link)
        self.connections += 1

    def _forward(self, source: socket.socket, link: _Link) -> None:
        sink, direction = link.peer(source)
        try:
            data = source.recv(65536)
        except OSError:
            data = b""
        if not data:
            self._drop(link)
            return
        with self._lock:
            if direction == "down" and link.last == "up":
                self.round_trips += 1
            link.last = direction
        try:
            sink.sendall(data)
        except OSError:
            self._drop(link)

    def _drop(self, link: _Link) -> None:
        for sock in (link.client, link.server):
            with contextlib.suppress(KeyError, ValueError):
                self._selector.unregister(sock)
            with contextlib.suppress(OSError):
                sock.close()
