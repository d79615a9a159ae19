"""The etcd store's connection: the members of its URL, and the calls it makes.

Client: the standard library only (sockets, ``ssl``, ``json``) — see ``http``: no new
dependency and a fast import, and pipelining, which ``http.client`` cannot do. The python
``etcd3`` package is broken with protobuf >= 4; etcd3gw pulls in ``requests``.

Failover: every member listed in the URL may answer. On a connection error, a timeout or
an "unavailable"/"no leader" answer, the call moves to the next member, all within the
I/O timeout (``set_io_timeout``).
"""

from __future__ import annotations

import base64
import math
import os
import socket
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING
from typing import Any
from urllib.parse import parse_qsl
from urllib.parse import unquote

from tasklock_cli.errors import ConfigError
from tasklock_cli.errors import StoreUnavailable
from tasklock_cli.errors import TasklockError
from tasklock_cli.stores.etcd import http
from tasklock_cli.stores.urls import check_host
from tasklock_cli.stores.urls import redact_url
from tasklock_cli.stores.urls import scrub
from tasklock_cli.stores.urls import split_url
from tasklock_cli.stores.urls import unknown_parameter
from tasklock_cli.stores.urls import url_passwords
from tasklock_cli.util.fds import fd_readable
from tasklock_cli.util.numbers import decimal
from tasklock_cli.util.records import dataclass
from tasklock_cli.util.records import field

if TYPE_CHECKING:  # imported when an etcds:// URL needs it
    import ssl

DEFAULT_PREFIX = "tasklock/"
DEFAULT_PORT = 2379
DEFAULT_IO_TIMEOUT_S = 5.0
#: Leases whose remaining time one pipelined call asks.
TTL_BATCH = 64
NOT_FOUND = 5
_UNAUTHENTICATED = 16
_RETRY_ELSEWHERE = (
    "no leader",
    "leader changed",
    "timed out",
    "too many requests",
    "not capable",
    "unhealthy",
    "stopped",
)


class EtcdError(Exception):
    """etcd answered with an error (gRPC ``code`` and message)."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass
class EtcdConfig:
    members: list[tuple[str, int]]
    tls: bool = False
    user: str | None = None
    password: str | None = None
    prefix: str = DEFAULT_PREFIX
    cacert: str | None = None
    cert: str | None = None
    key: str | None = None
    secrets: list[str] = field(default_factory=list)


def parse_url(url: str) -> EtcdConfig:
    """``etcd[s]://[user:password@]HOST:PORT[,HOST:PORT...][/][?prefix=&cacert=&cert=&key=]``."""
    shown = redact_url(url)
    scheme, netloc, path, query = split_url(url)
    userinfo, at, hosts = netloc.rpartition("@")
    config = EtcdConfig(members=[], tls=scheme == "etcds", secrets=sorted(url_passwords(url)))
    if at:
        user, colon, password = userinfo.partition(":")
        config.user = unquote(user)
        config.password = unquote(password) if colon else ""
        if config.password and config.password not in config.secrets:
            config.secrets.append(config.password)
    for item in hosts.split(","):
        config.members.append(_member(item, shown))
    if path not in ("", "/"):
        raise ConfigError(f"etcd store URL {shown!r}: unexpected path {path!r}")
    for name, value in parse_qsl(query, keep_blank_values=True):
        if name in ("prefix", "cacert", "cert", "key"):
            setattr(config, name, value)
        else:
            raise unknown_parameter("etcd", url, name, "known: prefix, cacert, cert, key")
    if not config.prefix:
        raise ConfigError(f"etcd store URL {shown!r}: prefix= must not be empty")
    if (config.cacert or config.cert or config.key) and not config.tls:
        raise ConfigError(f"etcd store URL {shown!r}: cacert/cert/key need etcds://")
    if bool(config.cert) != bool(config.key):
        raise ConfigError(f"etcd store URL {shown!r}: cert= and key= go together")
    return config


def _member(item: str, shown: str) -> tuple[str, int]:
    item = item.strip()
    if item.startswith("["):
        host, bracket, rest = item[1:].partition("]")
        if not bracket:
            raise ConfigError(f"etcd store URL {shown!r}: {item!r} has no closing ']'")
        port_text = rest[1:] if rest.startswith(":") else ""
    else:
        host, _, port_text = item.partition(":")
    if not host:
        raise ConfigError(f"etcd store URL {shown!r}: a member without a host")
    port = decimal(port_text, 1, 65535) if port_text else DEFAULT_PORT
    if port is None:
        raise ConfigError(f"etcd store URL {shown!r}: bad port in {item!r}")
    check_host("etcd", shown, host)
    return host, port


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def unb64(text: str | None) -> bytes:
    return base64.b64decode(text or "")


def prefix_end(prefix: bytes) -> bytes:
    """etcd's range end for every key starting with ``prefix``."""
    chars = bytearray(prefix)
    while chars:
        if chars[-1] < 0xFF:
            chars[-1] += 1
            return bytes(chars)
        chars.pop()
    return b"\0"


def ttl_seconds(seconds: float, what: str) -> int:
    if not math.isfinite(seconds) or seconds <= 0:
        raise ConfigError(f"the {what} must be a positive, finite duration (got {seconds!r})")
    return max(1, math.ceil(seconds))


def new_lease_id() -> int:
    # Not the random module: a program (or a test framework) that seeds it would hand out
    # the same IDs again, and etcd refuses to grant an ID that exists. Not secrets either:
    # it imports OpenSSL, a cost on every start.
    return (int.from_bytes(os.urandom(8), "big") >> 2) | 1  # positive int64, never 0


class Members:
    """Kept-alive connections to the listed members; calls fail over between them."""

    def __init__(self, config: EtcdConfig, display_url: str) -> None:
        self.config = config
        self.display_url = display_url
        self.io_timeout = DEFAULT_IO_TIMEOUT_S
        self._tls = self._tls_context() if config.tls else None
        self._connections: dict[int, http.Connection] = {}
        self._current = 0
        self._token: str | None = None
        self._last_date: str | None = None
        self._lock = threading.RLock()

    def _tls_context(self) -> ssl.SSLContext:
        import ssl

        try:
            context = ssl.create_default_context(cafile=self.config.cacert)
            if self.config.cert:
                context.load_cert_chain(self.config.cert, self.config.key)
        except OSError as exc:  # ssl.SSLError is one
            raise ConfigError(f"{self.display_url}: cannot load the TLS files: {exc}") from None
        return context

    def scrub(self, text: object) -> str:
        return scrub(text, self.config.secrets)

    def close(self) -> None:
        with self._lock:
            connections, self._connections = self._connections, {}
        for connection in connections.values():
            connection.close()

    def _headers(self) -> dict[str, str]:
        return {"Authorization": self._token} if self._token else {}

    def _connect(self, index: int, deadline: float) -> http.Connection:
        connection = self._connections.get(index)
        if connection is None:
            host, port = self.config.members[index]
            connection = http.Connection(host, port, self._tls, deadline)
            self._connections[index] = connection
        return connection

    def _drop(self, index: int) -> None:
        connection = self._connections.pop(index, None)
        if connection is not None:
            connection.close()

    def call(self, requests: list[tuple[str, dict[str, Any]]]) -> list[dict[str, Any]]:
        """Send the requests pipelined to one member and return their replies; fail over to
        the next member on trouble. Raises EtcdError for an answer that is an error (of the
        first failing request), StoreUnavailable when no member answered in time."""
        with self._lock:
            deadline = time.monotonic() + self.io_timeout
            problems: dict[int, str] = {}
            count = len(self.config.members)
            tried = 0
            reauthenticated = False
            while True:
                index = self._current
                left = deadline - time.monotonic()
                if left <= 0 or (tried >= count and _none_can_answer(problems)):
                    break
                # A member that does not answer may take half of what is left, so that
                # another one still gets its turn.
                share = left if count == 1 else max(left / 2, min(left, 0.25))
                attempt_deadline = time.monotonic() + share
                try:
                    replies = self._exchange(index, requests, attempt_deadline)
                except http.CertificateRejected as exc:
                    raise ConfigError(
                        f"{self.display_url}: the TLS certificate was rejected ({exc}); "
                        "check cacert= in the store URL"
                    ) from None
                except (OSError, http.Woken) as exc:  # ssl.SSLError is an OSError
                    self._drop(index)
                    problems[index] = describe(exc)
                    self._current = (index + 1) % count
                    tried += 1
                    if tried % count == 0 and not _none_can_answer(problems):
                        time.sleep(min(0.05, max(0.0, deadline - time.monotonic())))
                    continue
                error = _first_error(replies)
                if error is None:
                    return [reply for _, reply in replies]
                if error.code == _UNAUTHENTICATED and self.config.user and not reauthenticated:
                    reauthenticated = True
                    self._token = None
                    continue
                if _retry_elsewhere(error):
                    problems[index] = error.message
                    self._current = (index + 1) % count
                    tried += 1
                    if tried % count == 0:
                        time.sleep(min(0.05, max(0.0, deadline - time.monotonic())))
                    continue
                raise error
            detail = "; ".join(
                f"{self._where(i)}: {self.scrub(text)}" for i, text in sorted(problems.items())
            )
            if _none_can_answer(problems):  # said at once: waiting would change nothing
                raise StoreUnavailable(f"{self.display_url}: no etcd member reachable ({detail})")
            raise StoreUnavailable(
                f"{self.display_url}: no etcd member answered within "
                f"{self.io_timeout:g}s ({detail or 'no time left'})"
            )

    def call_dated(
        self, requests: list[tuple[str, dict[str, Any]]]
    ) -> tuple[list[dict[str, Any]], str | None]:
        """``call``, and the Date header of the last reply (the member's clock)."""
        with self._lock:
            replies = self.call(requests)
            return replies, self._last_date

    def _where(self, index: int) -> str:
        host, port = self.config.members[index]
        return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"

    def _exchange(
        self, index: int, requests: list[tuple[str, dict[str, Any]]], deadline: float
    ) -> list[tuple[int, dict[str, Any]]]:
        connection = self._connect(index, deadline)
        if self.config.user and self._token is None:
            self._authenticate(connection, deadline)
        host = self.config.members[index][0]
        encoded = [
            http.encode_request(host, path, body, self._headers()) for path, body in requests
        ]
        replies = connection.exchange(encoded, deadline)
        self._last_date = connection.last_date
        return replies

    def _authenticate(self, connection: http.Connection, deadline: float) -> None:
        body = {"name": self.config.user, "password": self.config.password or ""}
        request = http.encode_request(connection.host, "/v3/auth/authenticate", body, {})
        [(status, reply)] = connection.exchange([request], deadline)
        error = _error_of(status, reply)
        if error is not None:
            if _retry_elsewhere(error):
                raise error
            raise ConfigError(
                f"{self.display_url}: etcd refused the credentials ({error.message}); "
                "check the user name and password of the store URL"
            )
        self._token = str(reply.get("token", "")) or None

    def open_stream(self, path: str, body: dict[str, Any], deadline: float) -> http.Stream:
        """A new connection (to the current member) carrying one streamed request."""
        with self._lock:
            index = self._current
            host, port = self.config.members[index]
            if self.config.user and self._token is None:
                self._authenticate(self._connect(index, deadline), deadline)
            headers = self._headers()
        connection = http.Connection(host, port, self._tls, deadline)
        try:
            connection.send(http.encode_request(host, path, body, headers), deadline)
            status, reply_headers = connection.read_head(deadline)
            if status != 200:
                error = _error_of(
                    status, http.decode_json(connection.read_body(reply_headers, deadline))
                )
                raise error or EtcdError(14, f"HTTP {status}")
        except BaseException:
            connection.close()
            raise
        return http.Stream(connection)

    def server_date(self) -> float | None:
        """The member's wall clock (HTTP Date header, whole seconds), for doctor."""
        with self._lock:
            deadline = time.monotonic() + self.io_timeout
            connection = self._connect(self._current, deadline)
            host = self.config.members[self._current][0]
            connection.send(
                http.encode_request(host, "/v3/maintenance/status", {}, self._headers()),
                deadline,
            )
            _, headers = connection.read_head(deadline)
            connection.read_body(headers, deadline)
        date = headers.get("date")
        from email.utils import parsedate_to_datetime  # only doctor needs it

        return parsedate_to_datetime(date).timestamp() if date else None


_REFUSED = "connection refused"
_UNKNOWN_HOST = "unknown host"


def describe(exc: BaseException) -> str:
    if isinstance(exc, http.Woken | TimeoutError):
        return "timed out"
    if isinstance(exc, ConnectionRefusedError):
        return _REFUSED
    if isinstance(exc, socket.gaierror) and exc.errno in _NO_SUCH_NAME:
        return f"{_UNKNOWN_HOST} ({exc.strerror})"
    return str(exc) or type(exc).__name__


#: getaddrinfo's answers that a retry within seconds will not change (EAI_AGAIN, a DNS
#: server that did not answer, may).
_NO_SUCH_NAME = {socket.EAI_NONAME, getattr(socket, "EAI_NODATA", socket.EAI_NONAME)}


def _none_can_answer(problems: dict[int, str]) -> bool:
    """Whether every member said no at once (refused, or its name does not resolve)."""
    return bool(problems) and all(
        text == _REFUSED or text.startswith(_UNKNOWN_HOST) for text in problems.values()
    )


def _error_of(status: int, reply: dict[str, Any]) -> EtcdError | None:
    inner = reply.get("error")
    if isinstance(inner, dict):  # a streamed reply's error
        # Any: whatever the JSON holds, for int() to judge (mypy would add None to a get
        # whose default is Any).
        code: Any = inner.get("grpc_code", inner.get("code", 2))
        return EtcdError(int(code), str(inner))
    if status == 200 and inner is None:
        return None
    message = str(reply.get("message") or inner or f"HTTP {status}")
    return EtcdError(int(reply.get("code", 14 if status >= 500 else 2)), message)


def _first_error(replies: list[tuple[int, dict[str, Any]]]) -> EtcdError | None:
    for status, reply in replies:
        error = _error_of(status, reply)
        if error is not None:
            return error
    return None


def _retry_elsewhere(error: EtcdError) -> bool:
    text = error.message.lower()
    return error.code in (4, 14) or any(part in text for part in _RETRY_ELSEWHERE)


def revision(reply: dict[str, Any]) -> int:
    return int(reply.get("header", {}).get("revision", 0))


def kvs_of(response: dict[str, Any]) -> list[dict[str, Any]]:
    return response.get("response_range", {}).get("kvs", [])


def remaining_of(reply: dict[str, Any]) -> float:
    """Seconds a lease has left (-1 when gone), from its timetolive reply. etcd answers
    whole seconds, cut down: the middle of that second is the best guess, within the TTL
    granted."""
    remaining = int(reply.get("TTL", 0))  # 0 is left out of the reply
    if remaining < 0:
        return -1.0
    return min(remaining + 0.5, float(reply.get("grantedTTL", remaining + 1)))


def is_delete(event: dict[str, Any]) -> bool:
    return event.get("type") == "DELETE"


class EtcdClient:
    """The store's calls: the members' answers, etcd's errors as tasklock's, and the lease
    and watch requests every part of the store makes."""

    def __init__(self, config: EtcdConfig, display_url: str) -> None:
        self.display_url = display_url
        self.members = Members(config, display_url)

    def call(self, *requests: tuple[str, dict[str, Any]]) -> list[dict[str, Any]]:
        try:
            return self.members.call(list(requests))
        except EtcdError as exc:
            raise self.translate(exc) from None

    def translate(self, exc: EtcdError) -> TasklockError:
        text = self.members.scrub(exc.message)
        if "user name is empty" in text:
            return ConfigError(
                f"{self.display_url}: etcd requires authentication ({text}); put user:password@ "
                "in the store URL"
            )
        if exc.code in (7, 16) or "permission denied" in text.lower():
            return ConfigError(f"{self.display_url}: etcd refused what tasklock needs ({text})")
        return StoreUnavailable(f"{self.display_url}: etcd answered with an error: {text}")

    def txn(self, compare: list[dict], success: list[dict], failure: list[dict]) -> dict:
        body = {"compare": compare, "success": success, "failure": failure}
        return self.call(("/v3/kv/txn", body))[0]

    def range(self, name: bytes) -> tuple[dict[str, Any] | None, int]:
        reply = self.call(("/v3/kv/range", {"key": b64(name)}))[0]
        kvs = reply.get("kvs", [])
        return (kvs[0] if kvs else None), revision(reply)

    def revoke(self, lease_id: int) -> bool:
        """True when the lease existed (and its keys are now deleted)."""
        try:
            self.members.call([("/v3/lease/revoke", {"ID": str(lease_id)})])
        except EtcdError as exc:
            if exc.code == NOT_FOUND:
                return False
            raise self.translate(exc) from None
        return True

    def keepalive(self, lease_id: int) -> int:
        """The lease's TTL after a refresh; 0 when the lease is gone."""
        reply = self.call(("/v3/lease/keepalive", {"ID": str(lease_id)}))[0]
        return int(reply.get("result", reply).get("TTL", 0))

    def remaining(self, lease_id: int) -> float:
        return remaining_of(self.call(("/v3/lease/timetolive", {"ID": str(lease_id)}))[0])

    def remaining_many(self, lease_ids: list[int]) -> dict[int, float]:
        """``remaining`` of each lease, asked pipelined (in batches of TTL_BATCH)."""
        remaining: dict[int, float] = {}
        for at in range(0, len(lease_ids), TTL_BATCH):
            batch = lease_ids[at : at + TTL_BATCH]
            asks = [("/v3/lease/timetolive", {"ID": str(lease_id)}) for lease_id in batch]
            remaining.update(zip(batch, map(remaining_of, self.call(*asks)), strict=True))
        return remaining

    def on_new_lease(self, new_id: int, ttl_s: int, txn: dict) -> dict | None:
        """Grant lease ``new_id`` and run ``txn`` (which puts keys on it), pipelined; the
        grant's reply, or None (the lease revoked again) when the txn's compare failed."""
        try:
            granted, reply = self.members.call(
                [("/v3/lease/grant", {"ID": str(new_id), "TTL": str(ttl_s)}), ("/v3/kv/txn", txn)]
            )
        except EtcdError as exc:
            raise self.translate(exc) from None
        if not reply.get("succeeded"):
            self.revoke(new_id)
            return None
        return granted

    def open_watch(self, keys: dict[str, str]) -> Watch:
        """A watch of ``keys`` (a key, or a range) on a stream of its own, from the store's
        current revision, returned once etcd has confirmed it (its ``created`` message):
        it hears every change after that at once. Look at the keys after opening it, not
        before: a watch from an earlier look's revision starts in the past once anything
        was written in between, and etcd catches such watches up only every 100 ms."""
        deadline = time.monotonic() + self.members.io_timeout
        request = {"create_request": dict(keys)}
        watch = Watch(self.members.open_stream("/v3/watch", request, deadline))
        try:
            watch.confirmed(deadline)
        except BaseException:
            watch.close()
            raise
        return watch


class Watch:
    """One watch on a stream of its own (``EtcdClient.open_watch``)."""

    def __init__(self, stream: http.Stream) -> None:
        self._stream = stream

    def confirmed(self, deadline: float) -> None:
        """Read up to etcd's ``created`` message; raises if none comes by ``deadline``."""
        while True:
            message = self._stream.next(deadline)
            if message is None:
                raise http.HttpError("etcd did not confirm the watch in time")
            if self._result(message).get("created"):
                return

    def wait(
        self,
        deadline: float,
        wake_fd: int | None,
        matches: Callable[[dict[str, Any]], bool] = is_delete,
        keep: tuple[float, Callable[[], float | None]] | None = None,
    ) -> str:
        """Until an event ``matches`` ("matched"), ``deadline`` ("timeout") or wake_fd
        ("woken"). With ``keep`` (at, call): ``call()`` at monotonic time ``at`` and then
        whenever it says (a waiter's lease kept alive on the client's connection), the
        watch going on; "gone" when it says None. Raises when the watch breaks."""
        call_at, call = keep if keep is not None else (math.inf, None)
        while True:
            message = self._stream.next(min(deadline, call_at), wake_fd)
            if message is None:
                if fd_readable(wake_fd):
                    return "woken"
                if call is None or time.monotonic() >= deadline:
                    return "timeout"
                next_at = call()
                if next_at is None:
                    return "gone"
                call_at = next_at
                continue
            if any(matches(event) for event in self._result(message).get("events", [])):
                return "matched"

    def close(self) -> None:
        self._stream.close()

    @staticmethod
    def _result(message: dict[str, Any]) -> dict[str, Any]:
        result = message.get("result", {})
        if "error" in message:
            raise EtcdError(14, str(message["error"]))
        if result.get("canceled"):
            raise EtcdError(14, f"the watch was cancelled: {result}")
        return result
