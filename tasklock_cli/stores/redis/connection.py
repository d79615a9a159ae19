"""The Redis store's connection: its URL, its pool of redis-py connections with tasklock's
timeouts, one retry on a broken connection, Redis's errors as tasklock's.

Connections: sockets are close-on-exec (Python's default), so a child never inherits them.
"""

from __future__ import annotations

import contextlib
import math
import os
import threading
import time
from collections.abc import Callable
from typing import Any
from typing import TypeVar
from urllib.parse import unquote
from urllib.parse import unquote_plus
from urllib.parse import urlsplit

# Absolute import: this is redis-py, not this module (Python 3 has no implicit relative
# imports, and ``from __future__ import annotations`` changes nothing about that).
import redis
import redis.connection
import redis.exceptions as rexc
from redis.backoff import NoBackoff
from redis.commands.core import Script
from redis.retry import Retry

from tasklock_cli.errors import ConfigError
from tasklock_cli.errors import ForeignKey
from tasklock_cli.errors import StoreUnavailable
from tasklock_cli.errors import TasklockError
from tasklock_cli.stores.redis.keys import DEFAULT_PREFIX
from tasklock_cli.stores.redis.keys import RedisKeys
from tasklock_cli.stores.redis.scripts import SCRIPTS
from tasklock_cli.stores.redis.sentinel import SENTINEL_PARAMETERS
from tasklock_cli.stores.redis.sentinel import SENTINEL_SCHEMES
from tasklock_cli.stores.redis.sentinel import QuorumSentinel
from tasklock_cli.stores.redis.sentinel import UnknownServiceError
from tasklock_cli.stores.redis.sentinel import is_sentinel_url
from tasklock_cli.stores.redis.sentinel import parse_sentinel_url
from tasklock_cli.stores.redis.sentinel import sentinel_client
from tasklock_cli.stores.urls import check_host
from tasklock_cli.stores.urls import redact_url
from tasklock_cli.stores.urls import scrub
from tasklock_cli.stores.urls import split_url as split_any_url
from tasklock_cli.stores.urls import unknown_parameter
from tasklock_cli.stores.urls import url_parameters
from tasklock_cli.stores.urls import url_passwords
from tasklock_cli.util.numbers import decimal

DEFAULT_IO_TIMEOUT_S = 5.0
#: Idle connections are PINGed before reuse, so a connection the server closed (restart,
#: ``timeout`` setting) fails *before* the real command is sent and can be retried safely.
HEALTH_CHECK_INTERVAL_S = 15
MAX_CONNECTIONS = 100

_T = TypeVar("_T")
#: What each part of a lock key must be, as foreign-key errors describe it.
_EXPECTED_TYPES = {
    "lease": "a tasklock lease hash",
    "fence": "an integer counter from 0 to 2**63-1",
    "wake": "a tasklock wake-up list",
    "runs": "a tasklock run ledger (sorted set)",
    "success": "a tasklock run record (string)",
    "limit": "a tasklock semaphore limit (string)",
    "epoch": "a tasklock failover epoch record (hash)",
}
_FORCED_OPTIONS = (
    "socket_timeout",
    "socket_connect_timeout",
    "retry",
    "protocol",
    "decode_responses",
)


#: The most databases a Redis server can have (its ``databases`` setting is an int).
MAX_DB_INDEX = 2**31 - 1
#: More replicas than any deployment has: a larger wait_replicas= is a typo.
MAX_WAIT_REPLICAS = 1000


#: tasklock's own URL parameters, taken out before redis-py sees the URL.
_OWN_PARAMETERS = ("prefix", "wait_replicas")


def split_url(url: str) -> tuple[str, str, list[str]]:
    """(url for redis-py without tasklock's own ``prefix=`` and ``wait_replicas=``, prefix,
    secrets to scrub). ConfigError for a parameter redis-py does not honour or a database
    that is no number."""
    scheme, _, path, query = split_any_url(url)
    sentinel = is_sentinel_url(url)
    prefix = DEFAULT_PREFIX
    kept: list[str] = []
    secrets: list[str] = []
    known = _url_parameters(scheme)
    for item in query.split("&") if query else []:
        name, _, value = item.partition("=")
        name = unquote_plus(name)
        if name not in known:
            raise unknown_parameter(
                "Redis",
                url,
                name,
                "tasklock's prefix= or wait_replicas=, or a connection option of redis-py",
            )
        if name == "db":
            _check_db(url, unquote_plus(value))
        if name == "prefix":
            prefix = unquote_plus(value)
            continue
        if name == "wait_replicas":
            wait_replicas(url, unquote_plus(value))
            continue
        if name == "protocol":
            continue  # tasklock speaks RESP2 (see _connection_kwargs), whatever the URL says
        if name in ("password", "sentinel_password") and value:
            secrets.append(unquote_plus(value))
        if name in _TLS_FILES:
            _check_readable(url, name, unquote_plus(value))
        kept.append(item)
    if sentinel:
        service_and_db = unquote(path).strip("/").split("/")
        if len(service_and_db) == 2:
            _check_db(url, service_and_db[1])
    elif scheme != "unix":
        if path.strip("/"):
            _check_db(url, unquote(path).strip("/"))
        check_host("Redis", url, unquote(urlsplit(url).hostname or ""))
    secrets.extend(url_passwords(url))
    # Rebuilt textually: urlunsplit would turn unix:///path into unix:/path.
    base, _, rest = url.partition("?")
    fragment = rest.partition("#")[2] if "#" in rest else ""
    clean = base + ("?" + "&".join(kept) if kept else "") + ("#" + fragment if fragment else "")
    return clean, prefix, secrets


#: The URL's TLS files: one that cannot be read is 78 (no retry makes it), not the
#: connection error redis-py would make of it.
_TLS_FILES = ("ssl_ca_certs", "ssl_certfile", "ssl_keyfile", "ssl_ca_path")


def _check_readable(url: str, name: str, path: str) -> None:
    if path and not os.access(path, os.R_OK):
        raise ConfigError(
            f"Redis store URL {redact_url(url)!r}: {name}={path!r} cannot be read"
            f" ({'no such file' if not os.path.exists(path) else 'permission denied'})"
        )


def wait_replicas(url: str, text: str | None = None) -> int:
    """The URL's ``wait_replicas=N`` (0 when absent): how many replicas must confirm an
    acquire's or a renewal's writes (Redis ``WAIT``) before it counts."""
    if text is None:
        text = url_parameters(url).get("wait_replicas")
        if text is None:
            return 0
    if decimal(text, 0, MAX_WAIT_REPLICAS) is None:
        raise ConfigError(
            f"Redis store URL {redact_url(url)!r}: wait_replicas must be a number of "
            f"replicas, 0 to {MAX_WAIT_REPLICAS} (got {text!r})"
        )
    return int(text)


def _check_db(url: str, text: str) -> None:
    if decimal(text, 0, MAX_DB_INDEX) is None:
        raise ConfigError(
            f"Redis store URL {redact_url(url)!r}: the database must be a number, "
            f"redis://HOST:PORT/N (got {text!r})"
        )


def _url_parameters(scheme: str) -> frozenset[str]:
    """What redis-py honours in a URL of ``scheme``: the options it parses, and the keyword
    arguments of the connection class it passes the others to (as strings)."""
    connection_class = {
        "rediss": redis.connection.SSLConnection,
        "rediss+sentinel": redis.connection.SSLConnection,
        "unix": redis.connection.UnixDomainSocketConnection,
    }.get(scheme, redis.connection.Connection)
    names = {*_OWN_PARAMETERS, "protocol", "password", "username"}
    if scheme in SENTINEL_SCHEMES:
        names.update(SENTINEL_PARAMETERS)
    names.update(getattr(redis.connection, "URL_QUERY_ARGUMENT_PARSERS", {}))
    import inspect  # the Redis store's path only, and its driver costs more

    for klass in connection_class.__mro__:
        if "__init__" in klass.__dict__ and klass is not object:
            parameters = inspect.signature(klass.__dict__["__init__"]).parameters.values()
            names.update(
                p.name for p in parameters if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
            )
    names.discard("self")
    return frozenset(names)


def _takes_driver_info() -> bool:
    """Whether this redis-py's connections take ``driver_info`` (redis-py 7.1 and later;
    from 8 its constructor is wrapped by a decorator that warns of deprecated arguments)."""
    init = redis.connection.AbstractConnection.__init__
    init = getattr(init, "__wrapped__", init)
    return "driver_info" in init.__code__.co_varnames


_TAKES_DRIVER_INFO = _takes_driver_info()


def _set_up_lean(connection: redis.connection.AbstractConnection) -> None:
    """The connection's handshake, without two steps that each cost a round trip.

    Each new connection pays them, which means every ``tasklock run`` does.
    Left out:

    - the health-check PING that redis-py would first send on a socket that has only just
      connected;
    - CLIENT SETINFO LIB-NAME / LIB-VER (the client name, ``tasklock``, is kept).

    The handshake reads these attributes in every redis-py release.
    Newer ones read ``driver_info``; older ones read ``lib_name``/``lib_version``.
    The constructor options are not used instead: some releases ignore their ``None``."""
    # Why the ignores: redis-py infers next_health_check's type from its 0, and assigns it
    # floats itself. lib_name and lib_version are older releases' attributes; driver_info is
    # newer ones'. Which is wrong depends on the redis-py installed, hence unused-ignore.
    connection.next_health_check = time.monotonic() + HEALTH_CHECK_INTERVAL_S  # type: ignore[assignment, unused-ignore]
    connection.driver_info = None  # type: ignore[attr-defined, unused-ignore]
    connection.lib_name = connection.lib_version = None  # type: ignore[attr-defined, unused-ignore]
    connection.on_connect()


def _fsync_always_run_id(connection: redis.connection.AbstractConnection) -> str:
    """``_set_up_lean``, with the client name set in one round trip together with a look at
    the server's durability: the run_id of this server when it fsyncs its AOF before every
    reply (``appendfsync always``), else ''. The acquire script records with it whether a
    restart of the server would lose nothing (see ``epochs``); CONFIG refused (managed
    Redis) reads as not known, so as not lossless."""
    name = connection.client_name
    connection.client_name = None  # (set below, in the same round trip as the look)
    try:
        _set_up_lean(connection)
    finally:
        connection.client_name = name
    commands: list[tuple[Any, ...]] = [("CONFIG", "GET", "appendfsync"), ("INFO", "server")]
    if name:
        commands.insert(0, ("CLIENT", "SETNAME", name))
    connection.send_packed_command(connection.pack_commands(commands), check_health=False)
    replies: list[Any] = []
    for _ in commands:
        try:
            replies.append(connection.read_response())
        except rexc.ResponseError as exc:
            replies.append(exc)
    if name and isinstance(replies[0], Exception):
        raise rexc.ConnectionError(f"Error setting client name: {replies[0]}")
    fsync, info = replies[-2:]
    always = isinstance(fsync, list) and len(fsync) == 2 and fsync[1] in (b"always", "always")
    if not always or not isinstance(info, bytes | str):
        return ""
    text = info.decode("latin-1") if isinstance(info, bytes) else info
    _, found, rest = text.partition("run_id:")
    return rest.split("\r\n", 1)[0].strip() if found else ""


def _connect_one(client: redis.Redis) -> None:
    """Make (or take) one of the pool's connections and put it back, connected."""
    pool = client.connection_pool
    try:
        connection = pool.get_connection()
    except TypeError:  # redis-py before 5.3 wants a command name
        connection = pool.get_connection("PING")  # type: ignore[call-arg, unused-ignore]
    pool.release(connection)


class RedisConnection:
    """The store's redis-py client (remade when the I/O timeout changes) and how each call
    goes through it: ``call`` retries a broken connection once and turns Redis's errors
    into tasklock's; ``scripts`` are the store's Lua scripts, loaded on first use."""

    def __init__(
        self, url: str, display_url: str, names: RedisKeys, wait_replicas: int = 0
    ) -> None:
        self._url = url
        self.display_url = display_url
        self.names = names
        #: How many replicas must confirm an acquire's or renewal's writes (``wait_replicas=``).
        self.wait_replicas = wait_replicas
        self._secrets = [s for s in split_url(url)[2] if s]
        self.sentinel_target = None
        if is_sentinel_url(url):
            query = split_any_url(url)[3]
            self.sentinel_target = parse_sentinel_url(url, query.split("&") if query else [])
        #: The sentinels asked for the primary (sentinel URLs only).
        self.sentinels: QuorumSentinel | None = None
        self._tcp = split_any_url(url)[0] in ("redis", "rediss", *SENTINEL_SCHEMES)
        self.io_timeout = DEFAULT_IO_TIMEOUT_S
        self.scripts = {
            # (ignore: no client is registered, each call passes one: Script(..., client=))
            name: Script(None, source.encode("utf-8"))  # type: ignore[arg-type]
            for name, source in SCRIPTS.items()
        }
        #: The run_id of the server last seen fsyncing before every reply, else '' (the
        #: acquire script's last argument: see ``_fsync_always_run_id``).
        self.fsync_always_run_id = ""
        self._looked = False  # whether a connection has made that look yet
        self._client_lock = threading.Lock()
        self._client = self._make_client()

    def _set_up(self, connection: redis.connection.AbstractConnection) -> None:
        """Each new connection's handshake (``_fsync_always_run_id``)."""
        self.fsync_always_run_id = _fsync_always_run_id(connection)
        self._looked = True

    def durability(self) -> str:
        """``fsync_always_run_id`` as a connection found it: connects first if none has (the
        pool keeps that connection for the call that follows, so it costs no round trip)."""
        if not self._looked:
            self.call(_connect_one)
        return self.fsync_always_run_id

    @property
    def client(self) -> redis.Redis:
        with self._client_lock:
            return self._client

    def _connection_kwargs(self) -> dict[str, Any]:
        kwargs: dict[str, Any] = {
            "socket_connect_timeout": self.io_timeout,
            "socket_timeout": self.io_timeout,
            # No silent retries inside redis-py (they would multiply the time a call can
            # take past the supervisor's deadline); ``call`` retries once, knowingly.
            "retry": Retry(NoBackoff(), 0),
            "health_check_interval": HEALTH_CHECK_INTERVAL_S,
            "redis_connect_func": self._set_up,
            "client_name": "tasklock",  # CLIENT LIST shows who holds the connections
            "decode_responses": False,
            # RESP2, so servers and proxies without HELLO work too.
            "protocol": 2,
        }
        if self._tcp:
            kwargs["socket_keepalive"] = True
        if _TAKES_DRIVER_INFO:
            # No CLIENT SETINFO (see _set_up_lean): and no reading redis-py's own version
            # from its package metadata for it (importlib.metadata and the email package's
            # parser: ~4 ms, once a process).
            kwargs["driver_info"] = None
        return kwargs

    def _make_client(self) -> redis.Redis:
        if self.sentinel_target is not None:
            return self._make_sentinel_client()
        try:
            ours = self._connection_kwargs()
            # Blocking: a thread beyond MAX_CONNECTIONS waits (within the I/O timeout) for a
            # connection instead of failing with "Too many connections".
            pool = redis.BlockingConnectionPool.from_url(
                self._url, max_connections=MAX_CONNECTIONS, timeout=self.io_timeout, **ours
            )
            client = redis.Redis(connection_pool=pool)
            # redis-py lets URL options override keyword arguments; these stay tasklock's, so
            # ``set_io_timeout`` bounds every call whatever the URL says.
            for name in _FORCED_OPTIONS:
                pool.connection_kwargs[name] = ours[name]
            # Build (not connect) one connection so unknown URL parameters fail here, clearly.
            pool.connection_class(**pool.connection_kwargs)
        except (ValueError, TypeError, rexc.RedisError) as exc:
            raise ConfigError(
                f"invalid Redis URL {self.display_url!r}: {self.scrub(exc)}"
            ) from None
        return client

    def _make_sentinel_client(self) -> redis.Redis:
        assert self.sentinel_target is not None
        try:
            client, self.sentinels = sentinel_client(
                self.sentinel_target, self._connection_kwargs(), _FORCED_OPTIONS
            )
            pool = client.connection_pool
            pool.connection_class(**pool.connection_kwargs)  # unknown options fail here
        except (ValueError, TypeError, rexc.RedisError) as exc:
            raise ConfigError(
                f"invalid Redis URL {self.display_url!r}: {self.scrub(exc)}"
            ) from None
        return client

    def set_io_timeout(self, seconds: float) -> None:
        if not math.isfinite(seconds) or seconds <= 0 or seconds == self.io_timeout:
            return
        with self._client_lock:
            self.io_timeout = seconds
            old, self._client = self._client, self._make_client()
        # Idle connections of the old pool close now; ones in use close when collected.
        old.connection_pool.disconnect(inuse_connections=False)
        # (the old pool's sentinel clients close when collected, as its connections do)

    def call(self, operation: Callable[[redis.Redis], _T], key: str | None = None) -> _T:
        """Run ``operation`` once more on a fresh connection if the connection broke.

        A broken connection (refused, reset, closed by the server) fails fast; a timeout is
        not retried here, so one call stays within about one I/O timeout. Every retried
        operation is safe to repeat: acquire recognises its own owner token, renew and
        release check it, reads are reads.
        """
        for attempt in (1, 2):
            try:
                return operation(self._client)
            except (rexc.AuthenticationError, rexc.AuthorizationError, UnknownServiceError) as exc:
                raise self.translate(exc, key) from None
            except rexc.ConnectionError as exc:
                if attempt == 1 and not isinstance(exc, rexc.BusyLoadingError):
                    continue
                raise self.translate(exc, key) from None
            except rexc.RedisError as exc:
                raise self.translate(exc, key) from None
        raise AssertionError("unreachable")

    def translate(self, exc: Exception, key: str | None = None) -> TasklockError:
        text = self.scrub(exc)
        where = self.display_url
        if isinstance(exc, rexc.AuthenticationError | rexc.AuthorizationError):
            # 78, not 69: the server answered and refused these credentials. Retrying cannot
            # help; the store URL (or the server's ACL) has to be fixed.
            return ConfigError(
                f"{where}: Redis refused the credentials ({text}); "
                "check the user name and password of the store URL"
            )
        if isinstance(exc, UnknownServiceError):
            return ConfigError(f"{where}: {text}")
        if isinstance(exc, rexc.ConnectionError | rexc.TimeoutError):
            return StoreUnavailable(f"{where}: {text}")
        if isinstance(exc, rexc.InvalidResponse):
            return StoreUnavailable(f"{where}: the server does not speak Redis ({text})")
        if isinstance(exc, rexc.NoPermissionError):
            return ConfigError(f"{where}: the Redis user may not run what tasklock needs ({text})")
        if isinstance(exc, rexc.ResponseError):
            if "DB index is out of range" in text:
                return ConfigError(f"{where}: this Redis has no such database ({text})")
            if text.startswith("WRONGTYPE"):
                return self.foreign_key_error(text, key)
            if "unknown command" in text.lower():
                return ConfigError(f"{where}: this Redis lacks a command tasklock needs ({text})")
        return StoreUnavailable(f"{where}: Redis answered with an error: {text}")

    def foreign_key_error(self, text: str, key: str | None) -> ForeignKey:
        # Our scripts answer "WRONGTYPE lease|fence|wake <type>"; plain commands "WRONGTYPE ...".
        words = text.split()
        which = words[1] if len(words) > 1 and words[1] in _EXPECTED_TYPES else "lease"
        found = " ".join(words[2:]) if len(words) > 2 and words[1] == which else None
        if key is not None or which == "epoch":
            if which == "epoch" or key is None:  # (key is None only for the epoch record)
                name = self.names.epoch_record()
            else:
                name = self.names.name(key, which)
            described = f"Redis key {name.decode('utf-8', 'replace')!r}"
            if found is None:
                with contextlib.suppress(rexc.RedisError):
                    kind = self._client.type(name)  # bytes: the client does not decode
                    found = kind.decode() if isinstance(kind, bytes) else kind
        else:
            described = "a Redis key"
        expected = _EXPECTED_TYPES[which]
        holds = f"holds a {found}" if found else "holds another type"
        return ForeignKey(
            f"{self.display_url}: {described} {holds}, not {expected}: another application "
            f"uses the prefix {self.names.prefix!r}; remove that key or set another prefix= in the "
            "store URL (nothing was changed)",
            f"a Redis {found or 'key of another type'}, not {expected}",
        )

    def config_get(self, name: str) -> str | None:
        """The setting's value, or None when CONFIG is refused (managed Redis)."""
        try:
            values = self._client.config_get(name)
        except rexc.ResponseError:  # unknown/renamed command, NOPERM, ...
            return None
        except rexc.RedisError as exc:
            raise self.translate(exc) from None
        # Keyed by bytes (the client does not decode responses), which redis-py's type
        # (str) does not know; by str too, as it says.
        known: dict[Any, Any] = values or {}
        value = known.get(name, known.get(name.encode()))
        return value.decode() if isinstance(value, bytes) else value

    def script(self, name: str, keys: list[bytes], args: list[Any], key: str | None) -> Any:
        """Run the store's Lua script ``name`` (EVALSHA, reloaded on NOSCRIPT) in ``call``."""
        script = self.scripts[name]
        return self.call(lambda c: script(keys=keys, args=args, client=c), key)

    def script_and_wait(
        self, name: str, keys: list[bytes], args: list[Any], key: str | None
    ) -> tuple[Any, int]:
        """``script``, then Redis ``WAIT`` for ``wait_replicas`` replicas in the same round
        trip, on the same connection (WAIT waits for that connection's writes): the
        script's result and how many replicas confirmed. WAIT's bound is half the I/O
        timeout, so the call stays within one."""
        script = self.scripts[name]
        timeout_ms = max(10, int(self.io_timeout * 500))

        def run(client: redis.Redis) -> tuple[Any, int]:
            for attempt in (1, 2):
                pipe = client.pipeline(transaction=False)
                pipe.evalsha(script.sha, len(keys), *keys, *args)
                pipe.wait(self.wait_replicas, timeout_ms)
                result, confirmed = pipe.execute(raise_on_error=False)
                if isinstance(result, rexc.NoScriptError) and attempt == 1:
                    client.script_load(script.script)
                    continue
                for reply in (result, confirmed):
                    if isinstance(reply, Exception):
                        raise reply
                return result, int(confirmed)
            raise AssertionError("unreachable")

        return self.call(run, key)

    def confirmed_script(
        self, name: str, keys: list[bytes], args: list[Any], key: str, what: str
    ) -> Any:
        """``script``; with ``wait_replicas``, through ``script_and_wait``, and
        StoreUnavailable when it wrote (a result) that fewer replicas confirmed."""
        if not self.wait_replicas:
            return self.script(name, keys, args, key)
        result, confirmed = self.script_and_wait(name, keys, args, key)
        if result is not None and confirmed < self.wait_replicas:
            raise StoreUnavailable(
                f"{self.display_url}: only {confirmed} of the {self.wait_replicas} replicas "
                f"that wait_replicas= asks for confirmed {what} of {key!r} in time"
            )
        return result

    def scrub(self, exc: object) -> str:
        return scrub(exc, self._secrets)

    def not_ours(self, name: bytes, holds: str, exc: Exception) -> ConfigError:
        """A key under our prefix that does not hold what tasklock keeps there."""
        return ConfigError(
            f"{self.display_url}: Redis key {name.decode('utf-8', 'replace')!r} {holds} "
            f"({type(exc).__name__}: {exc}); another application uses the prefix "
            f"{self.names.prefix!r}"
        )

    def close(self) -> None:
        client = self.client
        with contextlib.suppress(Exception):
            client.close()
            client.connection_pool.disconnect()
        if self.sentinels is not None:
            for sentinel in self.sentinels.sentinels:
                with contextlib.suppress(Exception):
                    sentinel.close()
