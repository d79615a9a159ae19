"""etcd v3 store, over etcd's gRPC JSON gateway (``POST /v3/...``, etcd >= 3.4).

Expiry is decided by etcd's leases: each acquisition grants a lease and attaches the lock
key to it; the key exists exactly while the lease lives (or until it is released).

Key layout under the namespace prefix ``P`` (``?prefix=``, default ``tasklock/``), for lock
key ``K`` (stored exactly, UTF-8)::

    P lock/K             slot 0 (a plain lock is slot 0 of limit 1), value: JSON {owner,
                         holder, acquired_at (ms, client clock), ttl, limit (semaphores
                         only)} attached to the holder's lease. Fencing token = the key's
                         create_revision: etcd's global revision only ever grows, so a key
                         created again (after release, expiry, forced release) gets a
                         greater one, in any slot, and no counter can be reset or deleted.
    P lock/K NUL N/S     slot S > 0 of K held with limit N (S: SLOT_DIGITS digits, so key
                         order is slot order), as the lock key; for S = 0 the limit marker
                         put on slot 0's lease with the lock key. Keys hold no control
                         characters: no other key's lock key starts with ``K NUL``, and a
                         range from ``K`` to ``K \x01`` holds K's slots and nothing else
                         (one read, one watch). A key held with limit N has no key under
                         ``K NUL`` of another limit: the acquire's txn compares that.
    P owner/K NUL <owner>  a semaphore holder's mark, on its lease: a retry after a lost
                         reply finds its own slot instead of taking a free one
    P broken/K [NUL S]   value: the fencing token of a broken lease in slot S (none for
                         slot 0); attached, with the slot's keys, to the breaker's lease
                         (see ``break_lease``)
    P wait/<len>:K/<id>  a waiter's place in K's queue, attached to the waiter's lease;
                         ordered by create_revision (``wait_for_release``): the first
                         waiter watches K's slots, each other one the waiter before it
    P runs/K NUL <token> the run ledger: one JSON record per run (token: 20 digits, so
                         key order is token order), put by the release's txn. The
                         acquire's txn counts K's records and reads the oldest, so that
                         the release's txn can trim to the last LEDGER_KEEP runs
                         (keys hold no control characters: NUL ends K)
    P success/K          K's newest run that succeeded, as in the ledger but started_at
                         on the member's clock (see below); put by the same txn as its
                         record, apart from the trim (``--once-per``, ``metrics``)

Clocks: etcd has no clock a client can read but the HTTP ``Date`` header of its replies
(the member's wall clock, whole seconds, cut down). ``last_success`` answers that of its
reply as "now", and a success's start there is the ``Date`` of its acquisition's reply:
both on the member's clock, so hosts with skewed clocks agree on a ``--once-per``
window. Cut down to whole seconds, a time stays in its window exactly when the window's
length is whole seconds (its bounds are then whole seconds too); else within 1 s.

Round trips: acquire = 1 (the lease grant with a client-chosen ID and the ``txn`` that
creates the slot's key only if absent, with the lease attached, are pipelined on one
connection: grant, then txn, without waiting in between; the slots are tried in order by
txns nested in the failure branch of the one before, and where none was free the txn reads
the holders back). A limit over SLOTS_PER_TXN whose first slots are all held takes one more
txn per SLOTS_PER_TXN slots (etcd bounds the ops of a txn, nested ones counted in). Renew =
1 (lease keepalive: it fails once the lease was revoked, which is what release, forced
release and break do). Release = 1 (a ``txn`` guarded by the owner's value and the fencing
token deletes the slot's keys; the emptied lease runs out on its own, since a revoke could
report a release that a break had just moved away from it). ``keep_for``, break and
forced release take 2-4 per slot.

Leases have whole seconds, and etcd raises short ones to its minimum (1 s at least; 2 s
with the default election timeout); the granted TTL is used for ``expires_at``. A lease
also runs out up to ~0.5 s late (etcd's leader checks expiries twice a second). A TTL
under the granted one is still safe for the holder: its own deadline counts the TTL asked.

Client: the standard library only (sockets, ``ssl``, ``json``) — see ``_http``: no new
dependency and a fast import, and pipelining, which ``http.client`` cannot do. The python
``etcd3`` package is broken with protobuf >= 4; etcd3gw pulls in ``requests``.

Failover: every member listed in the URL may answer. On a connection error, a timeout or
an "unavailable"/"no leader" answer, the call moves to the next member, all within the
I/O timeout (``set_io_timeout``).
"""

from __future__ import annotations

import base64
import contextlib
import json
import math
import secrets
import select
import threading
import time
from collections.abc import Callable
from collections.abc import Iterator
from dataclasses import dataclass
from dataclasses import field
from datetime import datetime
from datetime import timezone
from typing import TYPE_CHECKING
from typing import Any
from typing import NamedTuple
from urllib.parse import parse_qsl
from urllib.parse import unquote
from urllib.parse import urlsplit

from tasklock_cli.errors import ConfigError
from tasklock_cli.errors import LimitMismatch
from tasklock_cli.errors import StoreUnavailable
from tasklock_cli.errors import TasklockError
from tasklock_cli.stores import _http
from tasklock_cli.stores.base import LEDGER_KEEP
from tasklock_cli.stores.base import LIST_PAGE
from tasklock_cli.stores.base import Holder
from tasklock_cli.stores.base import Lease
from tasklock_cli.stores.base import LeaseInfo
from tasklock_cli.stores.base import RunRecord
from tasklock_cli.stores.base import Store
from tasklock_cli.stores.base import StoreCheck
from tasklock_cli.stores.base import utc_from_timestamp
from tasklock_cli.stores.doctor import clock_check
from tasklock_cli.stores.doctor import warning
from tasklock_cli.stores.urls import redact_url
from tasklock_cli.stores.urls import scrub

if TYPE_CHECKING:  # imported when an etcds:// URL needs it
    import ssl

DEFAULT_PREFIX = "tasklock/"
DEFAULT_PORT = 2379
DEFAULT_IO_TIMEOUT_S = 5.0
#: A waiter's place in a queue lives this long without a refresh (a crashed waiter's place
#: is given up after it); waiting refreshes it every third of it.
WAITER_TTL_S = 6
#: When the watch breaks, waiting falls back to reading the key this often.
POLL_S = 0.1
#: The oldest ledger records an acquire reads, for its release to trim (more than one,
#: so that a ledger grown past LEDGER_KEEP shrinks back).
TRIM_READ = 4
#: Slot numbers in key names have this many digits (zero-padded: key order is slot order).
SLOT_DIGITS = 10
#: The slots one acquire txn tries, nested (etcd counts nested ops against --max-txn-ops,
#: 128 by default; a level takes 3-4); past them the read of a refusal says where to go on.
SLOTS_PER_TXN = 24
#: Leases whose remaining time one pipelined call asks.
TTL_BATCH = 64
_NOT_FOUND = 5
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
    parts = urlsplit(url)
    userinfo, at, hosts = parts.netloc.rpartition("@")
    config = EtcdConfig(members=[], tls=parts.scheme.lower() == "etcds")
    if at:
        user, colon, password = userinfo.partition(":")
        config.user = unquote(user)
        config.password = unquote(password) if colon else ""
        if config.password:
            config.secrets.append(config.password)
    for item in hosts.split(","):
        config.members.append(_member(item, shown))
    if parts.path not in ("", "/"):
        raise ConfigError(f"etcd store URL {shown!r}: unexpected path {parts.path!r}")
    for name, value in parse_qsl(parts.query, keep_blank_values=True):
        if name in ("prefix", "cacert", "cert", "key"):
            setattr(config, name, value)
        else:
            raise ConfigError(
                f"etcd store URL {shown!r}: unknown parameter {name!r} "
                "(known: prefix, cacert, cert, key)"
            )
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
        host, _, rest = item[1:].partition("]")
        port_text = rest[1:] if rest.startswith(":") else ""
    else:
        host, _, port_text = item.partition(":")
    if not host:
        raise ConfigError(f"etcd store URL {shown!r}: a member without a host")
    try:
        port = int(port_text) if port_text else DEFAULT_PORT
    except ValueError:
        raise ConfigError(f"etcd store URL {shown!r}: bad port in {item!r}") from None
    if not 0 < port < 65536:
        raise ConfigError(f"etcd store URL {shown!r}: bad port in {item!r}")
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


def _ttl_seconds(seconds: float, what: str) -> int:
    if not math.isfinite(seconds) or seconds <= 0:
        raise ConfigError(f"the {what} must be a positive, finite duration (got {seconds!r})")
    return max(1, math.ceil(seconds))


def _new_lease_id() -> int:
    # Not the random module: a program (or a test framework) that seeds it would hand out
    # the same IDs again, and etcd refuses to grant an ID that exists.
    return secrets.randbits(62) | 1  # positive int64, never 0 (0 means "no lease")


class _Members:
    """Kept-alive connections to the listed members; calls fail over between them."""

    def __init__(self, config: EtcdConfig, display_url: str) -> None:
        self.config = config
        self.display_url = display_url
        self.io_timeout = DEFAULT_IO_TIMEOUT_S
        self._tls = self._tls_context() if config.tls else None
        self._connections: dict[int, _http.Connection] = {}
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

    def _connect(self, index: int, deadline: float) -> _http.Connection:
        connection = self._connections.get(index)
        if connection is None:
            host, port = self.config.members[index]
            connection = _http.Connection(host, port, self._tls, deadline)
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
                if left <= 0 or (tried >= count and self._all_refused(problems)):
                    break
                # A member that does not answer may take half of what is left, so that
                # another one still gets its turn.
                share = left if count == 1 else max(left / 2, min(left, 0.25))
                attempt_deadline = time.monotonic() + share
                try:
                    replies = self._exchange(index, requests, attempt_deadline)
                except _http.CertificateRejected as exc:
                    raise ConfigError(
                        f"{self.display_url}: the TLS certificate was rejected ({exc}); "
                        "check cacert= in the store URL"
                    ) from None
                except (OSError, _http.Woken) as exc:  # ssl.SSLError is an OSError
                    self._drop(index)
                    problems[index] = _describe(exc)
                    self._current = (index + 1) % count
                    tried += 1
                    if tried % count == 0 and not self._all_refused(problems):
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
        return f"{host}:{port}"

    @staticmethod
    def _all_refused(problems: dict[int, str]) -> bool:
        return bool(problems) and all("refused" in text for text in problems.values())

    def _exchange(
        self, index: int, requests: list[tuple[str, dict[str, Any]]], deadline: float
    ) -> list[tuple[int, dict[str, Any]]]:
        connection = self._connect(index, deadline)
        if self.config.user and self._token is None:
            self._authenticate(connection, deadline)
        host = self.config.members[index][0]
        encoded = [
            _http.encode_request(host, path, body, self._headers()) for path, body in requests
        ]
        replies = connection.exchange(encoded, deadline)
        self._last_date = connection.last_date
        return replies

    def _authenticate(self, connection: _http.Connection, deadline: float) -> None:
        body = {"name": self.config.user, "password": self.config.password or ""}
        request = _http.encode_request(connection.host, "/v3/auth/authenticate", body, {})
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

    def open_stream(self, path: str, body: dict[str, Any], deadline: float) -> _http.Stream:
        """A new connection (to the current member) carrying one streamed request."""
        with self._lock:
            index = self._current
            host, port = self.config.members[index]
            if self.config.user and self._token is None:
                self._authenticate(self._connect(index, deadline), deadline)
            headers = self._headers()
        connection = _http.Connection(host, port, self._tls, deadline)
        try:
            connection.send(_http.encode_request(host, path, body, headers), deadline)
            status, reply_headers = connection.read_head(deadline)
            if status != 200:
                error = _error_of(
                    status, _http.decode_json(connection.read_body(reply_headers, deadline))
                )
                raise error or EtcdError(14, f"HTTP {status}")
        except BaseException:
            connection.close()
            raise
        return _http.Stream(connection)

    def server_date(self) -> float | None:
        """The member's wall clock (HTTP Date header, whole seconds), for doctor."""
        with self._lock:
            deadline = time.monotonic() + self.io_timeout
            connection = self._connect(self._current, deadline)
            host = self.config.members[self._current][0]
            connection.send(
                _http.encode_request(host, "/v3/maintenance/status", {}, self._headers()),
                deadline,
            )
            _, headers = connection.read_head(deadline)
            connection.read_body(headers, deadline)
        date = headers.get("date")
        from email.utils import parsedate_to_datetime  # only doctor needs it

        return parsedate_to_datetime(date).timestamp() if date else None


def _describe(exc: BaseException) -> str:
    if isinstance(exc, _http.Woken | TimeoutError):
        return "timed out"
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused"
    return str(exc) or type(exc).__name__


def _error_of(status: int, reply: dict[str, Any]) -> EtcdError | None:
    inner = reply.get("error")
    if isinstance(inner, dict):  # a streamed reply's error
        return EtcdError(int(inner.get("grpc_code", inner.get("code", 2))), str(inner))
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


def _revision(reply: dict[str, Any]) -> int:
    return int(reply.get("header", {}).get("revision", 0))


def _kvs(response: dict[str, Any]) -> list[dict[str, Any]]:
    return response.get("response_range", {}).get("kvs", [])


@dataclass
class _Held:
    """What this client knows of a lease it holds."""

    lease_id: int
    value: bytes
    ttl: int  # as asked (etcd may have granted more)
    runs: int = 0  # the key's records in the ledger at the acquisition
    oldest_runs: list[bytes] = field(default_factory=list)  # the first TRIM_READ of them
    member_date: str | None = None  # the Date header of the acquisition's reply
    broken: bool = False  # read back broken: its renewals fail, its release still frees it


class EtcdStore(Store):
    signals_release = True
    # Whole seconds, raised to etcd's own minimum (1.5 x its election timeout, 2 s by
    # default); the leader looks for expired leases twice a second.
    min_ttl = 1.0
    expiry_lag = 0.7

    def __init__(self, config: EtcdConfig, display_url: str) -> None:
        self.display_url = display_url
        self.prefix = config.prefix
        self._p = config.prefix.encode("utf-8")
        self._members = _Members(config, display_url)
        self._held: dict[tuple[str, str, int], _Held] = {}
        self._spare: tuple[int, int] | None = None  # (lease ID, TTL) granted but not used
        self._waiter_lease: int | None = None
        self._waiter_refreshed = 0.0
        self._queued: set[str] = set()
        self._looked_at: dict[str, int] = {}  # key -> revision of the waiter's last look
        self._state_lock = threading.Lock()

    @classmethod
    def from_url(cls, url: str) -> EtcdStore:
        return cls(parse_url(url), redact_url(url))

    # -- names ------------------------------------------------------------------------

    def _lock_key(self, key: str) -> bytes:
        return self._p + b"lock/" + key.encode("utf-8")

    def _slot_key(self, key: str, slot: int, limit: int) -> bytes:
        """Where slot ``slot`` of ``key`` held with ``limit`` keeps its lease: slot 0 in the
        lock key (as a plain lock, which it is with limit 1), the others under the key's
        own ``NUL`` prefix."""
        if slot == 0:
            return self._lock_key(key)
        return self._lock_key(key) + f"\0{limit}/{slot:0{SLOT_DIGITS}d}".encode()

    def _slot_names(self, key: str, slot: int, limit: int, owner: str) -> list[bytes]:
        """The keys a holder of the slot puts on its lease: the slot's key; for a semaphore
        its owner mark (a retry finds its own slot though another is free) and, for slot
        0, the limit marker (where slot 0 would be among the other slots)."""
        names = [self._slot_key(key, slot, limit)]
        if limit > 1:
            names.append(self._owner_mark(key, owner))
            if slot == 0:
                names.append(self._limit_marker(key, limit))
        return names

    def _owner_mark(self, key: str, owner: str) -> bytes:
        return self._p + b"owner/" + key.encode("utf-8") + b"\0" + owner.encode("utf-8")

    def _limit_marker(self, key: str, limit: int) -> bytes:
        return self._lock_key(key) + f"\0{limit}/{0:0{SLOT_DIGITS}d}".encode()

    def _broken_key(self, key: str, slot: int = 0) -> bytes:
        name = self._p + b"broken/" + key.encode("utf-8")
        return name if slot == 0 else name + f"\0{slot:0{SLOT_DIGITS}d}".encode()

    def _queue_prefix(self, key: str) -> bytes:
        raw = key.encode("utf-8")
        return self._p + b"wait/" + str(len(raw)).encode() + b":" + raw + b"/"

    def _queue_entry(self, key: str, waiter_lease: int) -> bytes:
        return self._queue_prefix(key) + f"{waiter_lease:016x}".encode()

    def _success_key(self, key: str) -> bytes:
        return self._p + b"success/" + key.encode("utf-8")

    def _runs_prefix(self, key: str) -> bytes:
        return self._p + b"runs/" + key.encode("utf-8") + b"\0"

    def _run_key(self, key: str, token: int) -> bytes:
        return self._runs_prefix(key) + f"{token:020d}".encode()

    # -- calls ------------------------------------------------------------------------

    def _call(self, *requests: tuple[str, dict[str, Any]]) -> list[dict[str, Any]]:
        try:
            return self._members.call(list(requests))
        except EtcdError as exc:
            raise self._translate(exc) from None

    def _translate(self, exc: EtcdError) -> TasklockError:
        text = self._members.scrub(exc.message)
        if "user name is empty" in text:
            return ConfigError(
                f"{self.display_url}: etcd requires authentication ({text}); put user:password@ "
                "in the store URL"
            )
        if exc.code in (7, 16) or "permission denied" in text.lower():
            return ConfigError(f"{self.display_url}: etcd refused what tasklock needs ({text})")
        return StoreUnavailable(f"{self.display_url}: etcd answered with an error: {text}")

    def _txn(self, compare: list[dict], success: list[dict], failure: list[dict]) -> dict:
        body = {"compare": compare, "success": success, "failure": failure}
        return self._call(("/v3/kv/txn", body))[0]

    def _range(self, name: bytes) -> tuple[dict[str, Any] | None, int]:
        reply = self._call(("/v3/kv/range", {"key": b64(name)}))[0]
        kvs = reply.get("kvs", [])
        return (kvs[0] if kvs else None), _revision(reply)

    def _revoke(self, lease_id: int) -> bool:
        """True when the lease existed (and its keys are now deleted)."""
        try:
            self._members.call([("/v3/lease/revoke", {"ID": str(lease_id)})])
        except EtcdError as exc:
            if exc.code == _NOT_FOUND:
                return False
            raise self._translate(exc) from None
        return True

    def _keepalive(self, lease_id: int) -> int:
        """The lease's TTL after a refresh; 0 when the lease is gone."""
        reply = self._call(("/v3/lease/keepalive", {"ID": str(lease_id)}))[0]
        return int(reply.get("result", reply).get("TTL", 0))

    # -- acquire / renew / release ---------------------------------------------------

    def acquire(
        self, key: str, ttl: float, holder: Holder, owner_token: str, limit: int = 1
    ) -> Lease | None:
        ttl_s = _ttl_seconds(ttl, "lease TTL")
        start = 0  # the first slot the txn tries (past SLOTS_PER_TXN: where the read said)
        for _ in range(3 + limit // SLOTS_PER_TXN):
            lease_id, first = self._lease_request(ttl_s)
            sent = time.time()
            value = _lease_value(owner_token, holder, sent, ttl_s, limit)
            txn, plan = self._acquire_txn(key, limit, start, owner_token, value, lease_id)
            try:
                (granted, reply), date = self._members.call_dated([first, ("/v3/kv/txn", txn)])
            except EtcdError as exc:
                if exc.code == _NOT_FOUND or "lease" in exc.message.lower():
                    self._spare = None  # the spare lease ran out: grant a fresh one
                    continue
                raise self._translate(exc) from None
            granted_ttl = int(granted.get("result", granted).get("TTL", 0))
            if granted_ttl <= 0:
                self._spare = None
                continue
            slot, responses = _taken_slot(reply, plan)
            if slot is not None:
                self._spare = None
                self._queued.discard(key)
                token = _revision(reply)
                runs = responses[-1].get("response_range", {})
                oldest = [unb64(kv["key"]) for kv in runs.get("kvs", [])]
                self._held[(key, owner_token, token)] = _Held(
                    lease_id, value, ttl_s, int(runs.get("count", 0)), oldest, date
                )
                expires = utc_from_timestamp(sent + granted_ttl)
                return Lease(
                    key, owner_token, token, utc_from_timestamp(sent), expires, slot, limit
                )
            self._spare = (lease_id, ttl_s)
            slots, broken = self._slots_from(responses)
            outcome = self._after_conflict(key, owner_token, limit, slots, broken, sent)
            if not isinstance(outcome, int):
                return outcome
            start = outcome  # a slot is free after all (freed meanwhile, or past this txn's)
        raise StoreUnavailable(f"{self.display_url}: could not get a lease from etcd for {key!r}")

    def _after_conflict(
        self,
        key: str,
        owner_token: str,
        limit: int,
        slots: list[_SlotKv],
        broken: set[int],
        sent: float,
    ) -> Lease | int | None:
        """What the read of a refused acquire says: our own lease (a lost reply), None
        (every slot held), or the lowest free slot to try next; raises LimitMismatch."""
        for held in slots:
            if held.limit != limit:
                raise LimitMismatch(key, held.limit, limit)
        for held in slots:
            record = _decode_value(unb64(held.kv.get("value")))
            if record is not None and record.get("owner") == owner_token:
                if held.token in broken:
                    return None  # broken: not even its owner may take it back
                return self._own_lease(key, owner_token, held, sent)
        taken = {held.slot for held in slots}
        return next((slot for slot in range(limit) if slot not in taken), None)

    def _acquire_txn(
        self, key: str, limit: int, start: int, owner_token: str, value: bytes, lease_id: int
    ) -> tuple[dict[str, Any], list[int | None]]:
        """The acquire's txn: take the lowest free slot from ``start`` on, each slot a txn
        nested in the failure branch of the one before (etcd 3.4 has no loop), at most
        SLOTS_PER_TXN of them (etcd bounds a txn's ops, nested ones counted in). A taking
        leaves the key's waiting queue and reads the oldest ledger records (for the
        release's trim). Guards: no key of another limit (or a semaphore's slot 0 without
        its marker: a plain lock), and no slot taken by us already. Where it ends without
        a slot it reads the key's slots and broken marks. Returns the txn and its plan (the
        slot of each nested level, None for the guard) for ``_taken_slot``."""
        reads = self._slot_reads(key)
        guards = self._other_limits_absent(key, limit)
        if limit > 1:  # and no slot of ours already (a retry after a lost reply)
            guards.append(_absent(self._owner_mark(key, owner_token)))
        chain, plan = reads, []
        for slot in reversed(range(max(start, 1), min(limit, start + SLOTS_PER_TXN))):
            level = _nested(
                [_absent(self._slot_key(key, slot, limit))],
                self._take_slot_ops(key, slot, limit, owner_token, value, lease_id),
                chain,
            )
            chain, plan = [level], [slot, *plan]
        if limit > 1:
            marker = {**_absent(self._limit_marker(key, limit)), "result": "GREATER"}
            chain, plan = [_nested([marker, *guards], chain, reads)], [None, *plan]
        if start == 0:
            free = [_absent(self._lock_key(key)), *guards]
            taking = self._take_slot_ops(key, 0, limit, owner_token, value, lease_id)
            chain, plan = [_nested(free, taking, chain)], [0, *plan]
        return chain[0]["request_txn"], plan

    def _take_slot_ops(
        self, key: str, slot: int, limit: int, owner: str, value: bytes, lease_id: int
    ) -> list[dict[str, Any]]:
        ops: list[dict[str, Any]] = [
            {"request_put": {"key": b64(name), "value": b64(value), "lease": str(lease_id)}}
            for name in self._slot_names(key, slot, limit, owner)
        ]
        if key in self._queued and self._waiter_lease is not None:
            entry = self._queue_entry(key, self._waiter_lease)
            ops.append({"request_delete_range": {"key": b64(entry)}})
        ops.append(self._oldest_runs_op(key))
        return ops

    def _other_limits_absent(self, key: str, limit: int) -> list[dict[str, Any]]:
        """Compares that hold while no slot key of another limit than ``limit`` exists."""
        slots = self._lock_key(key) + b"\0"
        ours = slots + f"{limit}/".encode()
        return [
            {**_absent(slots), "range_end": b64(ours)},
            {**_absent(prefix_end(ours)), "range_end": b64(prefix_end(slots))},
        ]

    def _slot_reads(self, key: str) -> list[dict[str, Any]]:
        """Range ops reading every slot key of ``key`` and every broken mark."""
        return [
            {"request_range": _family(self._lock_key(key))},
            {"request_range": _family(self._broken_key(key))},
        ]

    def _slots_from(self, responses: list[dict[str, Any]]) -> tuple[list[_SlotKv], set[int]]:
        """The live slots (ordered by slot) and the broken tokens ``_slot_reads`` read."""
        lock_kvs, broken_kvs = (_kvs(response) for response in responses)
        slots = [held for kv in lock_kvs if (held := self._slot_of(kv)) is not None]
        broken = {int(value) for kv in broken_kvs if (value := unb64(kv.get("value"))).isdigit()}
        return sorted(slots, key=lambda held: held.slot), broken

    def _read_slots(self, key: str) -> tuple[list[_SlotKv], set[int], int]:
        """``key``'s live slots, broken tokens, and the revision they were read at."""
        reply = self._txn([], self._slot_reads(key), [])
        slots, broken = self._slots_from(reply.get("responses", []))
        return slots, broken, _revision(reply)

    def _slot_of(self, kv: dict[str, Any]) -> _SlotKv | None:
        """The slot a key under the lock prefix holds; None for a limit marker."""
        rest = unb64(kv["key"])[len(self._lock_key("")) :]
        name, nul, tail = rest.partition(b"\0")
        key = name.decode("utf-8", "replace")
        if not nul:
            record = _decode_value(unb64(kv.get("value"))) or {}
            return _SlotKv(key, 0, int(record.get("limit", 1)), kv)
        limit_text, _, slot_text = tail.partition(b"/")
        if not (limit_text.isdigit() and slot_text.isdigit()):
            raise self._foreign(unb64(kv["key"]), "lease")
        slot = int(slot_text)
        return None if slot == 0 else _SlotKv(key, slot, int(limit_text), kv)

    def _foreign(self, name: bytes, what: str) -> ConfigError:
        return ConfigError(
            f"{self.display_url}: etcd key {name.decode('utf-8', 'replace')!r} is not a "
            f"tasklock {what}; another application uses the prefix {self.prefix!r}"
        )

    def _lease_request(self, ttl_s: int) -> tuple[int, tuple[str, dict[str, Any]]]:
        """A lease for an acquisition: the spare one refreshed, or a new one."""
        if self._spare is not None and self._spare[1] == ttl_s:
            lease_id = self._spare[0]
            return lease_id, ("/v3/lease/keepalive", {"ID": str(lease_id)})
        lease_id = _new_lease_id()
        return lease_id, ("/v3/lease/grant", {"ID": str(lease_id), "TTL": str(ttl_s)})

    def _own_lease(self, key: str, owner_token: str, held: _SlotKv, sent: float) -> Lease | None:
        """Our own acquisition whose reply was lost, read back; None when its lease ran out."""
        value = unb64(held.kv.get("value"))
        record = _decode_value(value) or {}
        lease_id = int(held.kv.get("lease", 0))
        remaining = self._keepalive(lease_id) if lease_id else 0
        if remaining <= 0:
            return None
        self._held[(key, owner_token, held.token)] = _Held(
            lease_id, value, int(record.get("ttl", 0))
        )
        acquired = int(record.get("acquired_at", sent * 1000)) / 1000
        return Lease(
            key,
            owner_token,
            held.token,
            utc_from_timestamp(acquired),
            utc_from_timestamp(sent + remaining),
            held.slot,
            held.limit,
        )

    def _held_lease(self, lease: Lease) -> _Held | None:
        """Our lease ID and value for ``lease``; read from etcd when this client did not
        acquire it. None when the slot is not held with this owner token and fencing token."""
        known = self._held.get((lease.key, lease.owner_token, lease.fencing_token))
        if known is not None:
            return known
        name, mark = (
            self._slot_key(lease.key, lease.slot, lease.limit),
            self._broken_key(lease.key, lease.slot),
        )
        reply = self._txn([], [_range_op(name), _range_op(mark)], [])
        lock_kvs, broken_kvs = (_kvs(r) for r in reply.get("responses", []))
        if not lock_kvs or int(lock_kvs[0].get("create_revision", 0)) != lease.fencing_token:
            return None
        value = unb64(lock_kvs[0].get("value"))
        record = _decode_value(value)
        if record is None or record.get("owner") != lease.owner_token:
            return None
        broken = any(
            unb64(kv.get("value")) == str(lease.fencing_token).encode() for kv in broken_kvs
        )
        return _Held(
            int(lock_kvs[0].get("lease", 0)), value, int(record.get("ttl", 0)), broken=broken
        )

    def renew(self, lease: Lease, ttl: float) -> Lease:
        ttl_s = _ttl_seconds(ttl, "lease TTL")
        ident = (lease.key, lease.owner_token, lease.fencing_token)
        held = self._held_lease(lease)
        if held is not None and held.broken:
            held = None  # on the breaker's lease now: not ours to keep alive
        sent = time.time()
        remaining = self._keepalive(held.lease_id) if held and held.lease_id else 0
        if held is not None and remaining > 0 and ttl_s != held.ttl:
            # An etcd lease keeps the TTL it was granted: another TTL takes a new lease.
            remaining = self._move_own_lease(lease, held, ttl_s)
        if held is None or remaining <= 0:
            self._held.pop(ident, None)
            return lease.renewed_until(None)
        return lease.renewed_until(utc_from_timestamp(sent + remaining))

    def release(self, lease: Lease, keep_for: float = 0.0, record: RunRecord | None = None) -> bool:
        ident = (lease.key, lease.owner_token, lease.fencing_token)
        held = self._held_lease(lease)
        ledger = self._record_ops(record, held) if record is not None else []
        if held is None:
            if ledger:
                self._txn([], ledger, [])
            return False
        if keep_for > 0:
            # A broken lease (moved off our etcd lease) is let go at once instead.
            keep_s = _ttl_seconds(keep_for, "keep-for time")
            released = self._move_own_lease(lease, held, keep_s, ledger) > 0
            released = released or self._delete_as_owner(lease, held, ledger)
        else:
            # Not a revoke of our lease: a break may have moved the key to another lease
            # the moment before, and a revoke would then report a release that freed
            # nothing. The emptied lease runs out on its own.
            released = self._delete_as_owner(lease, held, ledger)
        self._held.pop(ident, None)
        return released

    def _oldest_runs_op(self, key: str) -> dict[str, Any]:
        """A range op counting ``key``'s ledger records and reading the oldest names."""
        start = self._runs_prefix(key)
        body = {
            "key": b64(start),
            "range_end": b64(prefix_end(start)),
            "keys_only": True,
            "limit": str(TRIM_READ),
            "sort_order": "ASCEND",
            "sort_target": "KEY",
        }
        return {"request_range": body}

    def _record_ops(self, record: RunRecord, held: _Held | None) -> list[dict[str, Any]]:
        """The txn ops that put ``record`` into the ledger (again: the same key) and trim
        the oldest records counted at the acquisition down to LEDGER_KEEP."""
        value = {
            "fencing_token": record.fencing_token,
            "started_at": math.floor(record.started_at.timestamp() * 1000),
            "ended_at": math.floor(time.time() * 1000),
            **record.fields(),
        }
        name = self._run_key(record.key, record.fencing_token)
        ops: list[dict[str, Any]] = [
            {"request_put": {"key": b64(name), "value": b64(json.dumps(value).encode())}}
        ]
        if record.outcome == "succeeded":
            # Successes are released in token order (a run whose lease could have been
            # taken over is lost, not succeeded), so the last one put is the newest.
            member_started = _http_date(held.member_date) if held is not None else None
            if member_started is not None:
                value["started_at"] = math.floor(member_started * 1000)
            success = b64(self._success_key(record.key))
            ops.append({"request_put": {"key": success, "value": b64(json.dumps(value).encode())}})
        if held is not None:
            excess = held.runs + 1 - LEDGER_KEEP
            for old in held.oldest_runs[: max(0, excess)]:
                if old != name:
                    ops.append({"request_delete_range": {"key": b64(old)}})
        return ops

    def time_left(self, key: str, fencing_token: int) -> float | None:
        slots, broken, _ = self._read_slots(key)
        if fencing_token in broken:
            return None
        for held in slots:
            if held.token == fencing_token:
                lease_id = int(held.kv.get("lease", 0))
                remaining = self._remaining(lease_id) if lease_id else -1.0
                return remaining if remaining > 0 else None
        return None

    def history(self, key: str, limit: int = LEDGER_KEEP) -> list[RunRecord]:
        start = self._runs_prefix(key)
        body = {
            "key": b64(start),
            "range_end": b64(prefix_end(start)),
            "limit": str(limit),
            "sort_order": "DESCEND",
            "sort_target": "KEY",
        }
        reply = self._call(("/v3/kv/range", body))[0]
        return self._run_records(key, reply.get("kvs", []))

    def _run_records(self, key: str, kvs: list[dict[str, Any]]) -> list[RunRecord]:
        records = []
        for kv in kvs:
            try:
                data = json.loads(unb64(kv.get("value")))
                records.append(
                    RunRecord.from_fields(
                        key,
                        int(data["fencing_token"]),
                        utc_from_timestamp(int(data["started_at"]) / 1000),
                        utc_from_timestamp(int(data["ended_at"]) / 1000),
                        data,
                    )
                )
            except (ValueError, TypeError, KeyError) as exc:
                raise ConfigError(
                    f"{self.display_url}: etcd key {unb64(kv['key'])!r} is not a tasklock run "
                    f"record ({type(exc).__name__}: {exc}); another application uses the "
                    f"prefix {self.prefix!r}"
                ) from None
        return records

    def last_success(self, key: str) -> tuple[RunRecord | None, datetime]:
        name = self._success_key(key)
        try:
            [reply], date = self._members.call_dated([("/v3/kv/range", {"key": b64(name)})])
        except EtcdError as exc:
            raise self._translate(exc) from None
        now = _http_date(date)
        if now is None:  # no Date header (a proxy dropped it?): this machine's clock
            now = time.time()
        kvs = reply.get("kvs", [])
        return (self._run_records(key, kvs)[0] if kvs else None), utc_from_timestamp(now)

    def ledger_keys(self, prefix: str = "") -> list[str]:
        start = self._p + b"runs/" + prefix.encode("utf-8")
        end = prefix_end(start)
        strip = len(self._p + b"runs/")
        keys: set[str] = set()
        while True:
            body = {"key": b64(start), "range_end": b64(end), "keys_only": True}
            body["limit"] = str(LIST_PAGE)
            reply = self._call(("/v3/kv/range", body))[0]
            kvs = reply.get("kvs", [])
            for kv in kvs:
                name = unb64(kv["key"])[strip:]
                keys.add(name.partition(b"\0")[0].decode("utf-8", "replace"))
            if not reply.get("more") or not kvs:
                return sorted(keys)
            start = unb64(kvs[-1]["key"]) + b"\0"

    def _owner_compare(self, lease: Lease, held: _Held) -> list[dict[str, Any]]:
        name = b64(self._slot_key(lease.key, lease.slot, lease.limit))
        return [
            {"key": name, "target": "CREATE", "create_revision": str(lease.fencing_token)},
            {"key": name, "target": "VALUE", "value": b64(held.value)},
        ]

    def _delete_as_owner(self, lease: Lease, held: _Held, ledger: list[dict] | None = None) -> bool:
        """Delete the slot's keys if still ours by value and fencing token (our lease may be
        gone: broken, or a release whose reply was lost); ``ledger`` ops run either way."""
        names = [
            *self._slot_names(lease.key, lease.slot, lease.limit, lease.owner_token),
            self._broken_key(lease.key, lease.slot),
        ]
        success = [{"request_delete_range": {"key": b64(name)}} for name in names]
        ledger = ledger or []
        reply = self._txn(self._owner_compare(lease, held), success + ledger, ledger)
        return bool(reply.get("succeeded"))

    def _move_own_lease(
        self, lease: Lease, held: _Held, ttl_s: int, ledger: list[dict] | None = None
    ) -> int:
        """Move our slot's keys to a new lease of ``ttl_s`` (grant and txn pipelined),
        revoke the old one; the new lease's TTL, 0 when the slot was no longer ours.
        ``ledger`` ops run in the txn either way."""
        new_id = _new_lease_id()
        name = b64(self._slot_key(lease.key, lease.slot, lease.limit))
        compare = [
            *self._owner_compare(lease, held),
            {"key": name, "target": "LEASE", "lease": str(held.lease_id)},
        ]
        names = self._slot_names(lease.key, lease.slot, lease.limit, lease.owner_token)
        txn = {
            "compare": compare,
            "success": [*_moves_to_lease(names, new_id), *(ledger or [])],
            "failure": list(ledger or []),
        }
        granted = self._on_new_lease(new_id, ttl_s, txn)
        if granted is None:
            return 0
        self._revoke(held.lease_id)
        held.lease_id, held.ttl = new_id, ttl_s
        return int(granted.get("TTL", 0))

    # -- reading ----------------------------------------------------------------------

    def holders(self, key: str) -> list[LeaseInfo]:
        slots, _, _ = self._read_slots(key)
        return [info for _, info in self._with_infos(slots)]

    def _remaining(self, lease_id: int) -> float:
        return _remaining_of(self._call(("/v3/lease/timetolive", {"ID": str(lease_id)}))[0])

    def _remaining_many(self, lease_ids: list[int]) -> dict[int, float]:
        """``_remaining`` of each lease, asked pipelined (in batches of TTL_BATCH)."""
        remaining: dict[int, float] = {}
        for at in range(0, len(lease_ids), TTL_BATCH):
            batch = lease_ids[at : at + TTL_BATCH]
            asks = [("/v3/lease/timetolive", {"ID": str(lease_id)}) for lease_id in batch]
            remaining.update(zip(batch, map(_remaining_of, self._call(*asks)), strict=True))
        return remaining

    def _with_infos(self, slots: list[_SlotKv]) -> list[tuple[_SlotKv, LeaseInfo]]:
        """Each slot with what an observer sees of it; those whose lease ran out meanwhile
        are left out."""
        lease_ids = sorted({held.lease_id for held in slots if held.lease_id})
        remaining = self._remaining_many(lease_ids)
        pairs = []
        for held in slots:
            info = self._info(held, remaining.get(held.lease_id, -1.0))
            if info is not None:
                pairs.append((held, info))
        return pairs

    def _info(self, held: _SlotKv, remaining: float) -> LeaseInfo | None:
        if remaining < 0:
            return None  # the lease ran out between the two reads
        record = _decode_value(unb64(held.kv.get("value")))
        if record is None:
            raise self._foreign(unb64(held.kv["key"]), "lease")
        return LeaseInfo(
            key=held.key,
            holder=Holder.from_dict(record.get("holder", {})),
            fencing_token=held.token,
            acquired_at=utc_from_timestamp(int(record.get("acquired_at", 0)) / 1000),
            expires_at=utc_from_timestamp(time.time() + remaining),
            expired=False,  # a key that exists is live: etcd deletes it with its lease
            slot=held.slot,
            limit=held.limit,
        )

    def list(self, prefix: str = "", include_expired: bool = False) -> Iterator[LeaseInfo]:
        # etcd deletes a key with its lease: include_expired can only ever show live leases.
        # A key's slots follow its lock key: NUL sorts before any character of a key.
        start = self._lock_key(prefix)
        end = prefix_end(start)
        while True:
            body = {"key": b64(start), "range_end": b64(end), "limit": str(LIST_PAGE)}
            reply = self._call(("/v3/kv/range", body))[0]
            kvs = reply.get("kvs", [])
            slots = [held for kv in kvs if (held := self._slot_of(kv)) is not None]
            for _, info in self._with_infos(slots):
                yield info
            if not reply.get("more") or not kvs:
                return
            start = unb64(kvs[-1]["key"]) + b"\0"

    def sweep(self, dry_run: bool = False) -> int:
        # etcd deletes expired leases' keys itself; counters are revisions. Still check that
        # the store answers, so `sweep` reports an unreachable store instead of success.
        self._call(("/v3/maintenance/status", {}))
        return 0

    # -- forced release and breaking --------------------------------------------------

    def force_release(self, key: str, token: int | None = None) -> list[LeaseInfo]:
        """Revoke the leases of the chosen slots (revoking deletes their keys and tells the
        holder: its keepalive fails); a slot whose key moved meanwhile (a break) is read
        and revoked again."""
        freed: dict[int, LeaseInfo] = {}
        wanted: set[int] | None = None  # the tokens of the first read
        for _ in range(5):
            slots, _, _ = self._read_slots(key)
            chosen = [held for held in slots if token is None or held.token == token]
            wanted = {held.token for held in chosen} if wanted is None else wanted
            left = [held for held in chosen if held.token in wanted - freed.keys()]
            if not left:
                break
            for held, info in self._with_infos(left):
                if held.lease_id and self._revoke(held.lease_id):
                    freed[held.token] = info
        return sorted(freed.values(), key=lambda info: info.slot)

    def break_lease(self, key: str, token: int | None = None) -> list[LeaseInfo]:
        slots, broken, _ = self._read_slots(key)
        infos = []
        for held in slots:
            if token is None or held.token == token:
                info = self._break_slot(held, held.token in broken)
                if info is not None:
                    infos.append(info)
        return infos

    def _break_slot(self, held: _SlotKv, already_broken: bool) -> LeaseInfo | None:
        """Move the slot's keys to a new lease (the breaker's) for the time the old one had
        left, and revoke the old one: the holder's renew fails at once, nobody else can
        take the slot meanwhile, and the fencing token (create_revision) stays the same."""
        mark = self._broken_key(held.key, held.slot)
        for attempt in range(5):
            if attempt:
                reread = self._reread_slot(held, mark)
                if reread is None:
                    return None
                held, already_broken = reread
            info = self._info(held, self._remaining(held.lease_id) if held.lease_id else -1.0)
            if info is None:
                continue
            if already_broken:
                return info
            left = max(1, math.ceil(info.expires_at.timestamp() - time.time()))
            if self._move_to_new_lease(held, mark, left):
                self._revoke(held.lease_id)
                return info
        return None

    def _held_names(self, held: _SlotKv) -> list[bytes]:
        record = _decode_value(unb64(held.kv.get("value"))) or {}
        return self._slot_names(held.key, held.slot, held.limit, str(record.get("owner", "")))

    def _reread_slot(self, held: _SlotKv, mark: bytes) -> tuple[_SlotKv, bool] | None:
        """The slot read again (and whether it is broken); None once another lease holds it."""
        name = self._slot_key(held.key, held.slot, held.limit)
        reply = self._txn([], [_range_op(name), _range_op(mark)], [])
        lock_kvs, broken_kvs = (_kvs(r) for r in reply.get("responses", []))
        if not lock_kvs or int(lock_kvs[0]["create_revision"]) != held.token:
            return None
        broken = bool(broken_kvs) and unb64(broken_kvs[0].get("value")) == str(held.token).encode()
        return held._replace(kv=lock_kvs[0]), broken

    def _move_to_new_lease(self, held: _SlotKv, mark: bytes, ttl_s: int) -> bool:
        new_id = _new_lease_id()
        name = b64(self._slot_key(held.key, held.slot, held.limit))
        txn = {
            "compare": [
                {"key": name, "target": "CREATE", "create_revision": str(held.token)},
                {"key": name, "target": "LEASE", "lease": str(held.lease_id)},
            ],
            "success": [
                *_moves_to_lease(self._held_names(held), new_id),
                {
                    "request_put": {
                        "key": b64(mark),
                        "value": b64(str(held.token).encode()),
                        "lease": str(new_id),
                    }
                },
            ],
            "failure": [],
        }
        return self._on_new_lease(new_id, ttl_s, txn) is not None

    def _on_new_lease(self, new_id: int, ttl_s: int, txn: dict) -> dict | None:
        """Grant lease ``new_id`` and run ``txn`` (which puts keys on it), pipelined; the
        grant's reply, or None (the lease revoked again) when the txn's compare failed."""
        try:
            granted, reply = self._members.call(
                [("/v3/lease/grant", {"ID": str(new_id), "TTL": str(ttl_s)}), ("/v3/kv/txn", txn)]
            )
        except EtcdError as exc:
            raise self._translate(exc) from None
        if not reply.get("succeeded"):
            self._revoke(new_id)
            return None
        return granted

    # -- waiting ----------------------------------------------------------------------

    # Waiters queue up (a key per waiter, ordered by create_revision, as etcd's own lock
    # recipe does): the first watches every slot of the key, each other one the waiter
    # before it, so a release wakes exactly one waiter. A watch starts at the revision of
    # the read before it, so a release in between is not missed.

    waiting_trouble = (TasklockError, EtcdError, OSError, _http.Woken)

    def _prepare_wait(self, key: str, deadline: float, wake_fd: int | None) -> bool:
        """Join ``key``'s queue and wait until we are first in it (watching the waiter
        before us); False when the turn did not come before the deadline."""
        while time.monotonic() < deadline:
            entry = self._join_queue(key)
            ahead, present, rev = self._queue_state(key, entry)
            if not present:
                self._forget_waiter_lease()
                continue
            if ahead is None:
                return True
            until = min(deadline, self._waiter_refreshed + WAITER_TTL_S / 3)
            if self._watch({"key": b64(ahead)}, rev + 1, until, wake_fd) == "woken":
                return False
        return False

    def _time_until_free(self, key: str) -> float | None:
        slots, _, rev = self._read_slots(key)
        self._looked_at[key] = rev
        if not slots or len(slots) < slots[0].limit:
            return None
        remaining = self._remaining_many(sorted({held.lease_id for held in slots}))
        # The latest the key can go: whole seconds answered (the guess is their middle),
        # and the leader's expiry lag. Its deletion is what wakes the watch, earlier.
        return max(0.0, min(remaining.values(), default=0.0)) + 0.5 + self.expiry_lag

    def _await_wakeup(self, key: str, until: float, wake_fd: int | None) -> None:
        """Watch every slot of ``key`` from the revision ``_time_until_free`` read it at
        until one is deleted (released, freed, run out), refreshing our waiter lease."""
        rev = self._looked_at.pop(key)
        while time.monotonic() < until:
            refresh_by = min(until, self._waiter_refreshed + WAITER_TTL_S / 3)
            event = self._watch(_family(self._lock_key(key)), rev + 1, refresh_by, wake_fd)
            if event != "timeout" or not self._refresh_waiter_lease():
                return  # woken, or our place in the queue is gone: look again

    def _wait_after_trouble(self, key: str, deadline: float, wake_fd: int | None) -> None:
        """Poll the key until a slot is free."""
        self._poll_until(deadline, wake_fd, lambda: self._slot_free(key))

    def _slot_free(self, key: str) -> bool:
        slots, _, _ = self._read_slots(key)
        return not slots or len(slots) < slots[0].limit

    def _join_queue(self, key: str) -> bytes:
        """Our place in ``key``'s queue (joining, or refreshing our waiter lease when due)."""
        if time.monotonic() - self._waiter_refreshed > WAITER_TTL_S / 3:
            self._refresh_waiter_lease()
        with self._state_lock:
            now = time.monotonic()
            requests: list[tuple[str, dict[str, Any]]] = []
            if self._waiter_lease is None:
                self._waiter_lease = _new_lease_id()
                self._waiter_refreshed = now
                grant = {"ID": str(self._waiter_lease), "TTL": str(WAITER_TTL_S)}
                requests.append(("/v3/lease/grant", grant))
            entry = self._queue_entry(key, self._waiter_lease)
            if key not in self._queued:
                put = {"key": b64(entry), "value": "", "lease": str(self._waiter_lease)}
                requests.append(("/v3/kv/put", put))
            if requests:
                self._call(*requests)
                self._queued.add(key)
            return entry

    def _refresh_waiter_lease(self) -> bool:
        """Keep our places in queues; False when they are gone (the waiter lease ran out)."""
        with self._state_lock:
            if self._waiter_lease is None:
                return False
            if self._keepalive(self._waiter_lease) <= 0:
                self._waiter_lease = None
                self._queued.clear()
                return False
            self._waiter_refreshed = time.monotonic()
            return True

    def _forget_waiter_lease(self) -> None:
        with self._state_lock:
            self._waiter_lease = None
            self._queued.clear()

    def _queue_state(self, key: str, entry: bytes) -> tuple[bytes | None, bool, int]:
        """(the waiter just before us or None, whether we are queued, the read's revision)."""
        queue = self._queue_prefix(key)
        body = {
            "key": b64(queue),
            "range_end": b64(prefix_end(queue)),
            "sort_order": "ASCEND",
            "sort_target": "CREATE",
            "keys_only": True,
        }
        reply = self._call(("/v3/kv/range", body))[0]
        names = [unb64(kv["key"]) for kv in reply.get("kvs", [])]
        if entry not in names:
            return None, False, _revision(reply)
        at = names.index(entry)
        return (names[at - 1] if at > 0 else None), True, _revision(reply)

    def _watch(
        self,
        keys: dict[str, str],
        start_revision: int,
        deadline: float,
        wake_fd: int | None,
        matches: Callable[[dict[str, Any]], bool] = lambda event: _is_delete(event),
    ) -> str:
        """Watch ``keys`` (a key, or a range) from ``start_revision`` until an event
        ``matches`` ("matched"), ``deadline`` ("timeout") or wake_fd ("woken"). Raises when
        the watch breaks."""
        request = {"create_request": {**keys, "start_revision": str(start_revision)}}
        connect_by = min(deadline, time.monotonic() + self._members.io_timeout)
        stream = self._members.open_stream("/v3/watch", request, connect_by)
        try:
            while True:
                message = stream.next(deadline, wake_fd)
                if message is None:
                    return "woken" if _readable(wake_fd) else "timeout"
                result = message.get("result", {})
                if "error" in message:
                    raise EtcdError(14, str(message["error"]))
                if result.get("canceled"):
                    raise EtcdError(14, f"the watch was cancelled: {result}")
                if any(matches(event) for event in result.get("events", [])):
                    return "matched"
        finally:
            stream.close()

    def _poll_until(self, deadline: float, wake_fd: int | None, done: Callable[[], bool]) -> bool:
        """Ask ``done()`` every POLL_S until it is True; False at the deadline or on wake_fd."""
        while True:
            with contextlib.suppress(TasklockError, EtcdError, OSError):
                if done():
                    return True
            left = deadline - time.monotonic()
            if left <= 0 or _sleep_or_wake(min(POLL_S, left), wake_fd):
                return False

    def stop_waiting(self, key: str) -> None:
        with self._state_lock:
            if key not in self._queued or self._waiter_lease is None:
                return
            entry = self._queue_entry(key, self._waiter_lease)
            self._queued.discard(key)
        with contextlib.suppress(TasklockError):
            self._call(("/v3/kv/deleterange", {"key": b64(entry)}))

    def wait_for_break(self, lease: Lease, timeout: float, wake_fd: int | None = None) -> bool:
        """Block until the lease is broken or freed by force (True), ``timeout`` passes or
        wake_fd is readable (False). Watches the slot's key from the revision of a first read
        (which already tells of a break before the call)."""
        deadline = time.monotonic() + max(0.0, timeout)
        known = self._held.get((lease.key, lease.owner_token, lease.fencing_token))
        lease_id = known.lease_id if known else None

        def gone(kv: dict[str, Any] | None) -> bool:
            if kv is None or int(kv.get("create_revision", 0)) != lease.fencing_token:
                return True
            return lease_id is not None and int(kv.get("lease", 0)) != lease_id

        name = self._slot_key(lease.key, lease.slot, lease.limit)
        try:
            kv, rev = self._range(name)
            if gone(kv):
                return True
            if lease_id is None:
                lease_id = int(kv.get("lease", 0))
            outcome = self._watch(
                {"key": b64(name)},
                rev + 1,
                deadline,
                wake_fd,
                lambda ev: _is_delete(ev) or gone(ev.get("kv")),
            )
            return outcome == "matched"
        except (TasklockError, EtcdError, OSError, _http.Woken):
            return self._poll_until(deadline, wake_fd, lambda: gone(self._range(name)[0]))

    # -- settings, diagnostics, closing -----------------------------------------------

    def set_io_timeout(self, seconds: float) -> None:
        if math.isfinite(seconds) and seconds > 0:
            self._members.io_timeout = seconds

    def doctor(self) -> list[StoreCheck]:
        shown = ", ".join(f"{h}:{p}" for h, p in self._members.config.members)
        checks = [
            StoreCheck(
                "store", True, f"{self.display_url} (members {shown}; key prefix {self.prefix!r})"
            )
        ]
        try:
            self._call(("/v3/maintenance/status", {}))
            started = time.perf_counter()
            [status] = self._call(("/v3/maintenance/status", {}))
            rtt = time.perf_counter() - started
        except TasklockError as exc:
            checks.append(StoreCheck("reachable", False, str(exc)))
            return checks
        version = status.get("version", "unknown")
        checks.append(
            StoreCheck("reachable", True, f"etcd {version} answered in {rtt * 1000:.1f} ms")
        )
        checks.append(self._check_cluster(status))
        checks.append(self._check_clock())
        return checks

    def _check_cluster(self, status: dict[str, Any]) -> StoreCheck:
        try:
            [members] = self._call(("/v3/cluster/member/list", {}))
        except TasklockError as exc:
            return StoreCheck("cluster", False, str(exc))
        listed = members.get("members", [])
        leader = status.get("leader")
        names = {str(m.get("ID")): m.get("name") or m.get("ID") for m in listed}
        if not leader or leader == "0":
            return StoreCheck("cluster", False, f"{len(listed)} members and no leader")
        detail = f"{len(listed)} member(s), leader {names.get(str(leader), leader)}"
        if len(listed) < 3:
            return warning("cluster", detail + "; fewer than 3 members cannot survive losing one")
        return StoreCheck("cluster", True, detail)

    def _check_clock(self) -> StoreCheck:
        try:
            sent = time.time()
            server = self._members.server_date()
            received = time.time()
        except (OSError, _http.Woken) as exc:
            return StoreCheck("clock", False, f"cannot read the member's clock: {_describe(exc)}")
        if server is None:
            return StoreCheck("clock", True, "the member sent no Date header", warning=True)
        offset = server + 0.5 - (sent + received) / 2  # Date has whole seconds
        decides = "expiry runs on etcd's lease timers, acquired_at on the acquirer's clock"
        return clock_check("the member's", offset, 0.5 + (received - sent) / 2, decides)

    def close(self) -> None:
        with self._state_lock:
            waiter, self._waiter_lease = self._waiter_lease, None
            self._queued.clear()
        if waiter is not None:  # our places in queues go, so the waiters behind move up
            with contextlib.suppress(TasklockError):
                self._revoke(waiter)
        self._members.close()


class _SlotKv(NamedTuple):
    """A slot of a key as read: the etcd kv of its key (slot 0: the lock key)."""

    key: str
    slot: int
    limit: int
    kv: dict[str, Any]

    @property
    def token(self) -> int:
        return int(self.kv["create_revision"])

    @property
    def lease_id(self) -> int:
        return int(self.kv.get("lease", 0))


def _lease_value(owner_token: str, holder: Holder, sent: float, ttl_s: int, limit: int) -> bytes:
    """A slot key's value; ``limit`` only for a semaphore (a plain lock's value is as an
    older tasklock writes it)."""
    value: dict[str, Any] = {
        "owner": owner_token,
        "holder": holder.to_dict(),
        "acquired_at": int(sent * 1000),
        "ttl": ttl_s,
    }
    if limit > 1:
        value["limit"] = limit
    return json.dumps(value, sort_keys=True).encode()


def _absent(name: bytes) -> dict[str, Any]:
    """A compare that holds while ``name`` does not exist (with a range_end: no key in it)."""
    return {"key": b64(name), "target": "CREATE", "create_revision": "0"}


def _family(name: bytes) -> dict[str, str]:
    """The range of ``name`` and every key under ``name`` NUL (its slots, its marks)."""
    return {"key": b64(name), "range_end": b64(name + b"\x01")}


def _nested(compare: list[dict], success: list[dict], failure: list[dict]) -> dict[str, Any]:
    return {"request_txn": {"compare": compare, "success": success, "failure": failure}}


def _taken_slot(
    reply: dict[str, Any], plan: list[int | None]
) -> tuple[int | None, list[dict[str, Any]]]:
    """Follow the acquire's nested txn (see ``_acquire_txn``) down to where it ended: the
    slot taken (None when none was) and the responses of that level."""
    node = reply
    for at, slot in enumerate(plan):
        succeeded = bool(node.get("succeeded"))
        responses = node.get("responses", [])
        if slot is not None and succeeded:
            return slot, responses
        goes_on = succeeded if slot is None else not succeeded
        if not goes_on or at == len(plan) - 1:
            return None, responses
        node = responses[0]["response_txn"]
    return None, []


def _moves_to_lease(names: list[bytes], lease_id: int) -> list[dict[str, Any]]:
    return [
        {"request_put": {"key": b64(name), "ignore_value": True, "lease": str(lease_id)}}
        for name in names
    ]


def _remaining_of(reply: dict[str, Any]) -> float:
    """Seconds a lease has left (-1 when gone), from its timetolive reply. etcd answers
    whole seconds, cut down: the middle of that second is the best guess, within the TTL
    granted."""
    remaining = int(reply.get("TTL", 0))  # 0 is left out of the reply
    if remaining < 0:
        return -1.0
    return min(remaining + 0.5, float(reply.get("grantedTTL", remaining + 1)))


_MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")


def _http_date(text: str | None) -> float | None:
    """An HTTP Date header (``Tue, 15 Nov 1994 08:12:31 GMT``) as Unix time; None if none."""
    try:
        _, day, month, year, clock, _ = text.split()  # type: ignore[union-attr]
        hour, minute, second = (int(part) for part in clock.split(":"))
        moment = datetime(
            int(year), _MONTHS.index(month) + 1, int(day), hour, minute, second, tzinfo=timezone.utc
        )
    except (AttributeError, ValueError):
        return None
    return moment.timestamp()


def _range_op(name: bytes) -> dict[str, Any]:
    return {"request_range": {"key": b64(name)}}


def _is_delete(event: dict[str, Any]) -> bool:
    return event.get("type") == "DELETE"


def _decode_value(value: bytes) -> dict[str, Any] | None:
    try:
        record = json.loads(value)
    except ValueError:
        return None
    return record if isinstance(record, dict) and "owner" in record else None


def _readable(fd: int | None) -> bool:
    if fd is None:
        return False
    readable, _, _ = select.select([fd], [], [], 0)
    return bool(readable)


def _sleep_or_wake(seconds: float, wake_fd: int | None) -> bool:
    """Sleep; True when wake_fd became readable first."""
    if wake_fd is None:
        time.sleep(seconds)
        return False
    readable, _, _ = select.select([wake_fd], [], [], seconds)
    return bool(readable)
