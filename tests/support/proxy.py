"""A TCP proxy owned by a test, to partition a client from its store and heal it again.

While blackholed the proxy stops reading from either side: bytes wait in the kernel's
buffers as they would behind a dead link, and flow again (late) when healed.

It also counts round trips: each time a connection's traffic turns from client -> server
to server -> client, the client has waited for one answer.
"""

from __future__ import annotations

import contextlib
import select
import socket
import threading
from urllib.parse import urlsplit


class TcpProxy:
    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._flowing = threading.Event()
        self._flowing.set()
        self._closed = threading.Event()
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        self.round_trips = 0
        self.accepted = 0  # connections taken from the listener, blackholed or not
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def url_for(self, url: str) -> str:
        """``url`` with its host:port replaced by this proxy's."""
        host_port = urlsplit(url).netloc.split("@")[-1]
        return url.replace(host_port, f"127.0.0.1:{self.port}", 1)

    def blackhole(self) -> None:
        self._flowing.clear()

    def heal(self) -> None:
        self._flowing.set()

    def retarget(self, host: str, port: int, cut: bool = True) -> None:
        """From now on connect new connections to ``host:port`` (an endpoint that moves to
        a promoted replica); the connections open now are cut, or with ``cut=False`` left
        to the old target (a hung one keeps them hanging)."""
        self.target = (host, port)
        if cut:
            self.cut()

    def cut(self) -> None:
        """Close every proxied connection at once (a reset, not a silence)."""
        with self._lock:
            sockets, self._sockets = self._sockets, []
        for sock in sockets:
            with contextlib.suppress(OSError):
                linger_zero = b"\x01\x00\x00\x00\x00\x00\x00\x00"  # close with a reset
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, linger_zero)
                sock.close()

    def close(self) -> None:
        self._closed.set()
        self._flowing.set()
        with contextlib.suppress(OSError):
            self._listener.close()
        self.cut()

    def __enter__(self) -> TcpProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            self.accepted += 1
            self._flowing.wait()  # a partitioned proxy answers no new connection either
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._sockets += [client, upstream]
            last_direction = [""]  # of this connection: "up" or "down"
            for source, sink, direction in ((client, upstream, "up"), (upstream, client, "down")):
                threading.Thread(
                    target=self._pump, args=(source, sink, direction, last_direction), daemon=True
                ).start()

    def _pump(
        self, source: socket.socket, sink: socket.socket, direction: str, last: list[str]
    ) -> None:
        try:
            while not self._closed.is_set():
                self._flowing.wait()
                readable, _, _ = select.select([source], [], [], 0.05)
                if not readable or not self._flowing.is_set():
                    continue
                data = source.recv(65536)
                if not data:
                    break
                with self._lock:
                    if direction == "down" and last[0] == "up":
                        self.round_trips += 1
                    last[0] = direction
                sink.sendall(data)
        except (OSError, ValueError):  # ValueError: the other pump already closed the socket
            pass
        finally:
            for sock in (source, sink):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
