"""A hostile Redis or Sentinel server owned by a test: it speaks RESP2 and answers each
command with what the test's ``answer`` function says (raw RESP bytes), which lets a test
be the server no real one would be (a sentinel naming port ``notaport``, an error reply
with terminal escapes in it)."""

from __future__ import annotations

import contextlib
import socket
import ssl
import threading
from collections.abc import Callable
from collections.abc import Iterator

#: A command (its words) -> the raw RESP reply.
Answer = Callable[[list[bytes]], bytes]


def bulk(value: str | bytes) -> bytes:
    data = value.encode() if isinstance(value, str) else value
    return b"$%d\r\n%s\r\n" % (len(data), data)


def array(*values: str | bytes) -> bytes:
    return b"*%d\r\n" % len(values) + b"".join(bulk(value) for value in values)


def error(text: str | bytes) -> bytes:
    return b"-" + (text.encode() if isinstance(text, str) else text) + b"\r\n"


OK = b"+OK\r\n"


def sentinel_master(ip: str | None, port: str | None, *more: str | None) -> Answer:
    """A sentinel that names ``ip:port`` (as given, however odd) as the healthy primary of
    every service; ``more`` fields (name, value, ...) replace or add to a real sentinel's
    (``flags`` ``master``, ``num-other-sentinels`` ``2``); a None value leaves it out."""
    fields: dict[str | None, str | None] = {"ip": ip, "port": port, "flags": "master"}
    fields["num-other-sentinels"] = "2"
    fields.update(zip(more[0::2], more[1::2], strict=True))

    def answer(words: list[bytes]) -> bytes:
        if words[0] == b"SENTINEL":
            pairs = [item or "" for pair in fields.items() if pair[1] is not None for item in pair]
            return array("name", words[-1], *pairs)
        return OK

    return answer


class RespServer:
    """Listens on 127.0.0.1:``port``; each connection gets ``answer``'s replies (over TLS
    with ``tls``, a server-side context)."""

    def __init__(self, answer: Answer, tls: ssl.SSLContext | None = None) -> None:
        self.answer = answer
        self.tls = tls
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self.commands: list[list[bytes]] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        with contextlib.suppress(OSError):
            while True:
                sock, _ = self._listener.accept()
                threading.Thread(target=self._serve, args=(sock,), daemon=True).start()

    def _serve(self, sock: socket.socket) -> None:
        if self.tls is not None:
            try:
                sock = self.tls.wrap_socket(sock, server_side=True)
            except (OSError, ValueError):
                sock.close()
                return
        reader = sock.makefile("rb")
        with contextlib.suppress(OSError, ValueError), sock, reader:
            while True:
                words = _read_command(reader)
                if words is None:
                    return
                self.commands.append(words)
                sock.sendall(self.answer(words))

    def close(self) -> None:
        self._listener.close()


def _read_command(reader) -> list[bytes] | None:
    """One command: a RESP array of bulk strings (what redis-py sends); None at EOF."""
    line = reader.readline()
    if not line.startswith(b"*"):
        return None
    words = []
    for _ in range(int(line[1:])):
        size = int(reader.readline()[1:])
        words.append(reader.read(size + 2)[:-2])
    return [words[0].upper(), *words[1:]] if words else None


@contextlib.contextmanager
def resp_server(answer: Answer, tls: ssl.SSLContext | None = None) -> Iterator[RespServer]:
    server = RespServer(answer, tls)
    try:
        yield server
    finally:
        server.close()
