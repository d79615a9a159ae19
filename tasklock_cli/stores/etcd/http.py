"""A minimal HTTP/1.1 client for etcd's JSON gateway: kept-alive connections, pipelined
requests, and streamed replies read with a deadline and a wake-up fd.

Why not ``http.client``:
- It cannot pipeline: a second request may only be sent once the first reply is read. A
  lease grant and the ``txn`` that attaches the lease would cost two round trips.
- A streamed reply (``/v3/watch``) sits in its buffered reader, where ``select`` on the
  socket cannot see it. A watch could not also wait on a wake-up fd.

etcd's gateway (Go's net/http) answers with ``Content-Length`` or chunked bodies only, and
that is all this reads. Sockets are close-on-exec (Python's default): a child never gets one.
"""

from __future__ import annotations

import contextlib
import json
import select
import socket
import time
from typing import TYPE_CHECKING
from typing import Any

if TYPE_CHECKING:  # ssl costs an import only etcds:// needs
    import ssl

_MAX_HEAD = 64 * 1024


class HttpError(OSError):
    """The connection broke or answered something that is not HTTP/1.1."""


class CertificateRejected(Exception):
    """The server's TLS certificate failed verification: a setting to fix, not an outage."""


class Woken(Exception):
    """The wake-up fd became readable (or the deadline passed) before a reply was complete."""


def encode_request(host: str, path: str, body: Any, headers: dict[str, str]) -> bytes:
    payload = json.dumps(body, separators=(",", ":")).encode()
    lines = [f"POST {path} HTTP/1.1", f"Host: {host}", "Content-Type: application/json"]
    lines += [f"{name}: {value}" for name, value in headers.items()]
    lines.append(f"Content-Length: {len(payload)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + payload


class Connection:
    """One kept-alive connection to one member."""

    def __init__(self, host: str, port: int, tls: ssl.SSLContext | None, deadline: float) -> None:
        self.host = host
        self.port = port
        timeout = max(0.001, deadline - time.monotonic())
        sock = socket.create_connection((host, port), timeout=timeout)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if tls is not None:
            import ssl

            try:
                sock = tls.wrap_socket(sock, server_hostname=host)
            except ssl.SSLCertVerificationError as exc:
                sock.close()
                raise CertificateRejected(f"{host}:{port}: {exc.verify_message}") from None
            except BaseException:
                sock.close()
                raise
        self.sock: socket.socket = sock
        self._buf = bytearray()
        #: The Date header of the last reply (the server's clock, whole seconds), if any.
        self.last_date: str | None = None

    def fileno(self) -> int:
        return self.sock.fileno()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()

    def send(self, data: bytes, deadline: float) -> None:
        self.sock.settimeout(max(0.001, deadline - time.monotonic()))
        self.sock.sendall(data)

    def _fill(self, deadline: float, wake_fd: int | None) -> None:
        """Read more bytes into the buffer; Woken at the deadline or on wake_fd."""
        pending = hasattr(self.sock, "pending") and self.sock.pending()  # TLS-buffered bytes
        if not pending:
            left = deadline - time.monotonic()
            if left <= 0:
                raise Woken()
            fds: list[int] = [self.sock.fileno()]
            if wake_fd is not None:
                fds.append(wake_fd)
            readable, _, _ = select.select(fds, [], [], left)
            if not readable:
                raise Woken()
            if self.sock.fileno() not in readable:
                raise Woken()
        self.sock.settimeout(max(0.001, deadline - time.monotonic()))
        data = self.sock.recv(65536)
        if not data:
            raise HttpError("the server closed the connection")
        self._buf += data

    def _read_until(self, marker: bytes, deadline: float, wake_fd: int | None) -> bytes:
        while True:
            at = self._buf.find(marker)
            if at >= 0:
                out = bytes(self._buf[:at])
                del self._buf[: at + len(marker)]
                return out
            if len(self._buf) > _MAX_HEAD:
                raise HttpError("reply line too long")
            self._fill(deadline, wake_fd)

    def _read_exact(self, size: int, deadline: float, wake_fd: int | None) -> bytes:
        while len(self._buf) < size:
            self._fill(deadline, wake_fd)
        out = bytes(self._buf[:size])
        del self._buf[:size]
        return out

    def read_head(self, deadline: float, wake_fd: int | None = None) -> tuple[int, dict[str, str]]:
        head = self._read_until(b"\r\n\r\n", deadline, wake_fd).decode("latin-1")
        status_line, *header_lines = head.split("\r\n")
        parts = status_line.split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
            raise HttpError(f"not an HTTP reply: {status_line[:80]!r}")
        headers = {}
        for line in header_lines:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        return int(parts[1]), headers

    def read_chunk(self, deadline: float, wake_fd: int | None = None) -> bytes | None:
        """The next chunk of a chunked body; None after the last one (trailers read). A
        chunk is taken from the buffer only once it is all there: a read cut short (the
        deadline, wake_fd) leaves the stream where it was, to be read on later."""
        while True:
            chunk = self._whole_chunk()
            if chunk is not None:
                return chunk or None
            self._fill(deadline, wake_fd)

    def _whole_chunk(self) -> bytes | None:
        """The buffer's first chunk when it is all there (b"" for the last one, trailers
        and all), taken off the buffer; None while more is to come."""
        line_end = self._buf.find(b"\r\n")
        if line_end < 0:
            if len(self._buf) > _MAX_HEAD:
                raise HttpError("chunk size line too long")
            return None
        size_line = bytes(self._buf[:line_end])
        try:
            size = int(size_line.split(b";")[0].strip(), 16)
        except ValueError:
            raise HttpError(f"bad chunk size {size_line[:40]!r}") from None
        if size == 0:  # then trailers, up to an empty line
            end = self._buf.find(b"\r\n\r\n", line_end)
            if end < 0:
                return None
            del self._buf[: end + 4]
            return b""
        end = line_end + 2 + size + 2
        if len(self._buf) < end:
            return None
        data = bytes(self._buf[line_end + 2 : end - 2])
        del self._buf[:end]
        return data

    def read_body(self, headers: dict[str, str], deadline: float) -> bytes:
        if "chunked" in headers.get("transfer-encoding", "").lower():
            parts = []
            while (chunk := self.read_chunk(deadline)) is not None:
                parts.append(chunk)
            return b"".join(parts)
        length = headers.get("content-length")
        if length is None or not length.isdigit():
            raise HttpError("reply without a length")
        return self._read_exact(int(length), deadline, None)

    def exchange(self, requests: list[bytes], deadline: float) -> list[tuple[int, dict[str, Any]]]:
        """Send every request at once (pipelined), then read their replies in order."""
        self.send(b"".join(requests), deadline)
        replies = []
        for _ in requests:
            status, headers = self.read_head(deadline)
            body = self.read_body(headers, deadline)
            replies.append((status, decode_json(body)))
            self.last_date = headers.get("date")
            if headers.get("connection", "").lower() == "close":
                raise HttpError("the server is closing the connection")
        return replies


def decode_json(body: bytes) -> dict[str, Any]:
    """The first JSON object of a body (a streamed reply of one message ends with a newline)."""
    text = body.decode("utf-8", "replace").strip()
    if not text:
        return {}
    try:
        value, _ = json.JSONDecoder().raw_decode(text)
    except ValueError:
        return {"error": f"not JSON: {text[:120]}"}
    return value if isinstance(value, dict) else {"error": f"unexpected reply: {text[:120]}"}


class Stream:
    """A streamed reply (one JSON object per line), e.g. a watch."""

    def __init__(self, connection: Connection) -> None:
        self.connection = connection
        self._pending = bytearray()
        self._ended = False

    def next(self, deadline: float, wake_fd: int | None = None) -> dict[str, Any] | None:
        """The next message; None at the deadline or when wake_fd is readable. Raises
        HttpError when the stream ends or breaks."""
        while True:
            newline = self._pending.find(b"\n")
            if newline >= 0:
                line = bytes(self._pending[:newline])
                del self._pending[: newline + 1]
                if line.strip():
                    return decode_json(line)
                continue
            if self._ended:
                raise HttpError("the stream ended")
            try:
                chunk = self.connection.read_chunk(deadline, wake_fd)
            except Woken:
                return None
            if chunk is None:
                self._ended = True
                self._pending += b"\n"
            else:
                self._pending += chunk

    def close(self) -> None:
        self.connection.close()
