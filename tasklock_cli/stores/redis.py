"""Redis store: Redis's own TTLs decide expiry; the fencing counter lives as long as Redis's data.

Key layout, per lock key ``K`` under the namespace prefix ``P`` (``prefix=`` in the URL,
default ``tasklock:``)::

    P{K}:lease     hash  owner, fencing_token, holder (JSON), acquired_at, expires_at (ms)
                         with a PX TTL: the lease exists exactly while it is live
    P{K}:fence     string  the per-key fencing counter (INCR); never given a TTL, never
                           deleted by release, expiry, sweep or force release
    P{K}:wake      list  one element while the key is free after a release: a waiter's
                         BLPOP takes it, so each release wakes exactly one waiter (the one
                         waiting longest); acquire deletes it, and it expires by itself
    P{K}:runs      zset  the run ledger: one JSON record per run, scored by its fencing
                         token; written by the release script, which trims it to the last
                         LEDGER_KEEP runs
    P{K}:success   string  the newest run that succeeded, as in the ledger: put by the same
                           release script, apart from the trim (``--once-per``, ``metrics``)

A break marks the lease hash's owner ``broken:<owner>`` (see base) and PUBLISHes to
``P{K}:broken:<fencing token>``, which the lease's holder, waiting for a break, is
subscribed to on a connection of its own; a forced release deletes the hash, wakes a
waiter and PUBLISHes the same.

``K`` is stored exactly (no hashing, no truncation). The ``{...}`` hash tag keeps a lease
and its counter in one Redis Cluster slot (except for keys starting with ``}``, whose tag is
empty). Every mutation is one Lua script (EVALSHA, reloaded on NOSCRIPT) that checks the
owner token and takes its times from Redis's ``TIME``, never the client's clock.

Durability: the fencing counter is only as durable as Redis. ``FLUSHALL``/``FLUSHDB``, a
restart without persistence, or a failover that loses the last writes resets the counter,
and tokens issued before can be issued again. ``doctor`` warns about the settings that
matter (AOF with ``appendfsync everysec|always``, ``maxmemory-policy noeviction``).

Connections: sockets are close-on-exec (Python's default), so a child never inherits them.
"""

from __future__ import annotations

import contextlib
import json
import math
import threading
import time
from collections import Counter
from collections.abc import Callable
from collections.abc import Iterator
from datetime import datetime
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
from tasklock_cli.errors import StoreUnavailable
from tasklock_cli.errors import TasklockError
from tasklock_cli.stores.base import BROKEN_OWNER_PREFIX
from tasklock_cli.stores.base import LEDGER_KEEP
from tasklock_cli.stores.base import LIST_PAGE
from tasklock_cli.stores.base import BreakWatches
from tasklock_cli.stores.base import Holder
from tasklock_cli.stores.base import Lease
from tasklock_cli.stores.base import LeaseInfo
from tasklock_cli.stores.base import RunRecord
from tasklock_cli.stores.base import SocketBreakWatch
from tasklock_cli.stores.base import Store
from tasklock_cli.stores.base import StoreCheck
from tasklock_cli.stores.base import fd_readable
from tasklock_cli.stores.base import utc_from_timestamp
from tasklock_cli.stores.base import wait_readable
from tasklock_cli.stores.doctor import clock_check
from tasklock_cli.stores.urls import redact_url
from tasklock_cli.stores.urls import scrub

DEFAULT_PREFIX = "tasklock:"
DEFAULT_IO_TIMEOUT_S = 5.0
#: Idle connections are PINGed before reuse, so a connection the server closed (restart,
#: ``timeout`` setting) fails *before* the real command is sent and can be retried safely.
HEALTH_CHECK_INTERVAL_S = 15
SCAN_COUNT = 10_000
MAX_CONNECTIONS = 100
#: How long a release's wake-up waits for a waiter that is between its PTTL and its BLPOP.
WAKE_TOKEN_MS = 5_000

_T = TypeVar("_T")
#: What each part of a lock key must be, as foreign-key errors describe it.
_EXPECTED_TYPES = {
    "lease": "a tasklock lease hash",
    "fence": "an integer counter",
    "wake": "a tasklock wake-up list",
    "runs": "a tasklock run ledger (sorted set)",
    "success": "a tasklock run record (string)",
}
_FORCED_OPTIONS = (
    "socket_timeout",
    "socket_connect_timeout",
    "retry",
    "protocol",
    "decode_responses",
)

# All scripts: KEYS[1] = lease hash. Types are checked first so that a foreign key under the
# prefix is reported (as "WRONGTYPE lease|fence|wake <type>") before anything is written.
_PRELUDE = """
if redis.replicate_commands then redis.replicate_commands() end
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local function ms(n) return string.format('%d', n) end
-- The key's type, and an error reply when it is neither missing nor the expected one.
local function key_type(name, expected, role)
  local t = redis.call('TYPE', name)['ok']
  if t ~= 'none' and t ~= expected then
    return t, redis.error_reply('WRONGTYPE ' .. role .. ' ' .. t)
  end
  return t, nil
end
local lease_type, bad_lease = key_type(KEYS[1], 'hash', 'lease')
if bad_lease then return bad_lease end
-- Wake exactly one waiter: one element, whoever BLPOPs first (Redis serves the longest
-- blocked client) takes it; nobody blocked: it waits a little for a waiter on its way.
local function wake_one(name)
  redis.call('DEL', name)
  redis.call('RPUSH', name, '1')
  redis.call('PEXPIRE', name, WAKE_TOKEN_MS)
end
local BROKEN = 'BROKEN_OWNER_PREFIX'
local function is_broken(owner) return string.sub(owner, 1, #BROKEN) == BROKEN end
""".replace("WAKE_TOKEN_MS", str(WAKE_TOKEN_MS)).replace("BROKEN_OWNER_PREFIX", BROKEN_OWNER_PREFIX)

# KEYS[2] = fence, KEYS[3] = wake; ARGV: owner, ttl_ms, holder_json.
# -> {fencing_token, acquired_at_ms, expires_at_ms} or nil (held by someone else)
_ACQUIRE = (
    _PRELUDE
    + """
local fence_type, bad_fence = key_type(KEYS[2], 'string', 'fence')
if bad_fence then return bad_fence end
local _, bad_wake = key_type(KEYS[3], 'list', 'wake')
if bad_wake then return bad_wake end
local now = now_ms()
local ttl = tonumber(ARGV[2])
if lease_type == 'hash' then
  local cur = redis.call('HMGET', KEYS[1], 'owner', 'fencing_token', 'acquired_at')
  if cur[1] ~= ARGV[1] then return false end
  -- our own acquisition whose reply was lost: same lease, same token, refreshed TTL
  redis.call('HSET', KEYS[1], 'expires_at', ms(now + ttl), 'holder', ARGV[3])
  redis.call('PEXPIRE', KEYS[1], ttl)
  return {tonumber(cur[2]), tonumber(cur[3]), now + ttl}
end
if fence_type == 'string' then
  local value = redis.call('GET', KEYS[2])
  if not string.match(value, '^%d+$') then
    return redis.error_reply('WRONGTYPE fence non-integer string')
  end
end
local token = redis.call('INCR', KEYS[2])
redis.call('DEL', KEYS[3])  -- held again: a wake-up left for a waiter would be a false one
redis.call('HSET', KEYS[1], 'owner', ARGV[1], 'fencing_token', ms(token), 'holder', ARGV[3],
           'acquired_at', ms(now), 'expires_at', ms(now + ttl))
redis.call('PEXPIRE', KEYS[1], ttl)
return {token, now, now + ttl}
"""
)

# ARGV: owner, fencing_token, ttl_ms -> expires_at_ms, or nil when the lease is not ours/live
_RENEW = (
    _PRELUDE
    + """
if lease_type == 'none' then return false end
local cur = redis.call('HMGET', KEYS[1], 'owner', 'fencing_token')
if cur[1] ~= ARGV[1] or cur[2] ~= ARGV[2] then return false end
local now = now_ms()
local ttl = tonumber(ARGV[3])
redis.call('HSET', KEYS[1], 'expires_at', ms(now + ttl))
redis.call('PEXPIRE', KEYS[1], ttl)
return now + ttl
"""
)

# KEYS[2] = wake, KEYS[3] = runs, KEYS[4] = success; ARGV: owner, fencing_token, keep_ms
# (0 = delete now), the run's record as JSON without ended_at ('' = none), '1' when the run
# succeeded (it then becomes the key's newest success, unless a newer one is there)
# -> 1 released (or kept for keep_ms), 0 no lease at all, -1 someone else's lease.
# Our broken lease is ours to release too, and is never kept. The record goes into the
# ledger whatever the lease's state (once per token), ended_at from Redis's clock.
_RELEASE = (
    _PRELUDE
    + """
local _, bad_wake = key_type(KEYS[2], 'list', 'wake')
if bad_wake then return bad_wake end
local recording = ARGV[4] ~= ''
if recording then
  local _, bad_runs = key_type(KEYS[3], 'zset', 'runs')
  if bad_runs then return bad_runs end
  local _, bad_success = key_type(KEYS[4], 'string', 'success')
  if bad_success then return bad_success end
end
local function release()
  if lease_type == 'none' then return 0 end
  local cur = redis.call('HMGET', KEYS[1], 'owner', 'fencing_token')
  local broken = cur[1] == BROKEN .. ARGV[1]
  if (cur[1] ~= ARGV[1] and not broken) or cur[2] ~= ARGV[2] then return -1 end
  local keep = tonumber(ARGV[3])
  if keep > 0 and not broken then
    redis.call('HSET', KEYS[1], 'expires_at', ms(now_ms() + keep))
    redis.call('PEXPIRE', KEYS[1], keep)
    return 1
  end
  redis.call('DEL', KEYS[1])
  wake_one(KEYS[2])
  return 1
end
local result = release()
if recording and redis.call('ZCOUNT', KEYS[3], ARGV[2], ARGV[2]) == 0 then
  local record = string.sub(ARGV[4], 1, -2) .. ',"ended_at":' .. ms(now_ms()) .. '}'
  redis.call('ZADD', KEYS[3], ARGV[2], record)
  redis.call('ZREMRANGEBYRANK', KEYS[3], 0, -(LEDGER_KEEP + 1))
  if ARGV[5] == '1' then
    local newest = redis.call('GET', KEYS[4])
    if not newest or tonumber(cjson.decode(newest)['fencing_token']) < tonumber(ARGV[2]) then
      redis.call('SET', KEYS[4], record)
    end
  end
end
return result
""".replace("LEDGER_KEEP", str(LEDGER_KEEP))
)

# ARGV: fencing_token ('' = any), the holders' break channel without the token
# -> the lease's hash as a flat list, or nil when no lease matched
_BREAK = (
    _PRELUDE
    + """
if lease_type == 'none' then return false end
local cur = redis.call('HMGET', KEYS[1], 'owner', 'fencing_token')
if ARGV[1] ~= '' and cur[2] ~= ARGV[1] then return false end
if not is_broken(cur[1]) then  -- (HSET keeps the TTL: the expiry is not extended)
  redis.call('HSET', KEYS[1], 'owner', BROKEN .. cur[1])
end
redis.call('PUBLISH', ARGV[2] .. cur[2], '1')
return redis.call('HGETALL', KEYS[1])
"""
)

# KEYS[2] = wake; ARGV as _BREAK -> the freed lease's hash as a flat list, or nil
_FORCE_RELEASE = (
    _PRELUDE
    + """
local _, bad_wake = key_type(KEYS[2], 'list', 'wake')
if bad_wake then return bad_wake end
if lease_type == 'none' then return false end
local token = redis.call('HGET', KEYS[1], 'fencing_token')
if ARGV[1] ~= '' and token ~= ARGV[1] then return false end
local data = redis.call('HGETALL', KEYS[1])
redis.call('DEL', KEYS[1])
wake_one(KEYS[2])
redis.call('PUBLISH', ARGV[2] .. token, '1')
return data
"""
)

# ARGV: owner, fencing_token -> 1 while that lease is ours and unbroken (live), else 0
_INTACT = (
    _PRELUDE
    + """
if lease_type == 'none' then return 0 end
local cur = redis.call('HMGET', KEYS[1], 'owner', 'fencing_token')
if cur[1] == ARGV[1] and cur[2] == ARGV[2] then return 1 end
return 0
"""
)

# KEYS[2] = wake: a waiter whose wait was cut short may have taken the last release's
# wake-up with it; while the key is still free, one is left for the next waiter.
_PASS_ON = (
    _PRELUDE
    + """
local _, bad_wake = key_type(KEYS[2], 'list', 'wake')
if bad_wake then return bad_wake end
if lease_type == 'none' then wake_one(KEYS[2]) end
return 1
"""
)

# Read-only: for each KEYS[i] -> [fencing_token, acquired_at, expires_at, holder] (false for a
# missing field), 0 when the key is gone, or the type name of a foreign key. One JSON string
# per batch: decoding it is C-speed, where parsing 100,000 HGETALL replies in Python is not.
_READ_MANY = """
local out = {}
for i, name in ipairs(KEYS) do
  local t = redis.call('TYPE', name)['ok']
  if t == 'hash' then
    out[i] = redis.call('HMGET', name, 'fencing_token', 'acquired_at', 'expires_at', 'holder')
  elseif t == 'none' then
    out[i] = 0
  else
    out[i] = t
  end
end
return cjson.encode(out)
"""

_GLOB_SPECIAL = frozenset(b"*?[]\\^")


def _record_json(record: RunRecord | None) -> str:
    """The run's ledger entry without ``ended_at``, which the release script appends
    (so it must end with ``}``); '' for no record."""
    if record is None:
        return ""
    started_ms = math.floor(record.started_at.timestamp() * 1000)
    return json.dumps(
        {"fencing_token": record.fencing_token, "started_at": started_ms, **record.fields()}
    )


def _run_record(key: str, member: bytes) -> RunRecord:
    data = json.loads(member)
    return RunRecord.from_fields(
        key,
        int(data["fencing_token"]),
        utc_from_timestamp(int(data["started_at"]) / 1000),
        utc_from_timestamp(int(data["ended_at"]) / 1000),
        data,
    )


def glob_escape(raw: bytes) -> bytes:
    """``raw`` as a literal in a Redis MATCH pattern (every metacharacter backslashed)."""
    out = bytearray()
    for byte in raw:
        if byte in _GLOB_SPECIAL:
            out.append(0x5C)
        out.append(byte)
    return bytes(out)


def _ttl_ms(seconds: float, what: str) -> int:
    if not math.isfinite(seconds) or seconds <= 0:
        raise ConfigError(f"the {what} must be a positive, finite duration (got {seconds!r})")
    return max(1, math.ceil(seconds * 1000))


def _split_url(url: str) -> tuple[str, str, list[str]]:
    """(url for redis-py without tasklock's own ``prefix=``, prefix, secrets to scrub)."""
    parts = urlsplit(url)
    prefix = DEFAULT_PREFIX
    kept: list[str] = []
    secrets: list[str] = []
    for item in parts.query.split("&") if parts.query else []:
        name, _, value = item.partition("=")
        name = unquote_plus(name)
        if name == "prefix":
            prefix = unquote_plus(value)
            continue
        if name == "protocol":
            continue  # tasklock speaks RESP2 (see _connection_kwargs), whatever the URL says
        if name == "password" and value:
            secrets.append(unquote_plus(value))
        kept.append(item)
    if parts.password:
        secrets.append(unquote(parts.password))
    # Rebuilt textually: urlunsplit would turn unix:///path into unix:/path.
    base, _, rest = url.partition("?")
    fragment = rest.partition("#")[2] if "#" in rest else ""
    clean = base + ("?" + "&".join(kept) if kept else "") + ("#" + fragment if fragment else "")
    return clean, prefix, secrets


def _set_up_lean(connection: redis.connection.AbstractConnection) -> None:
    """The connection's handshake without what costs a round trip each on every new
    connection, i.e. on every ``tasklock run``: the health-check PING redis-py would first
    send on a socket that has only just connected, and CLIENT SETINFO LIB-NAME / LIB-VER
    (the client name, ``tasklock``, is kept). The handshake reads these attributes in
    every redis-py release (``driver_info`` in newer ones, ``lib_name``/``lib_version``
    in older ones), unlike the constructor options, whose ``None`` some releases ignore."""
    connection.next_health_check = time.monotonic() + HEALTH_CHECK_INTERVAL_S
    connection.driver_info = None
    connection.lib_name = connection.lib_version = None
    connection.on_connect()


#: ``_blpop_or_wake``: the wake-up fd was readable first.
_WOKEN = object()


class _BreakSubscription(SocketBreakWatch):
    """A holder's own subscription to its lease's break channel."""

    def __init__(self, pubsub: redis.client.PubSub, channel: bytes) -> None:
        super().__init__()
        self.pubsub = pubsub
        self.channel = channel

    def subscribe(self, timeout: float) -> None:
        """SUBSCRIBE and wait for the server's confirmation (from then on nothing is missed)."""
        self.pubsub.subscribe(self.channel)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            message = self.pubsub.get_message(timeout=deadline - time.monotonic())
            if message is not None and message["type"] == "subscribe":
                return
        raise rexc.TimeoutError(f"no answer to SUBSCRIBE within {timeout:g} s")

    def _fileno(self) -> int:
        sock = self.pubsub.connection._sock if self.pubsub.connection else None
        if sock is None:
            raise rexc.ConnectionError("the subscription's connection is closed")
        return sock.fileno()

    def _heard(self) -> bool:
        """Read every message already here (redis-py may buffer several); never blocks."""
        heard = False
        while (message := self.pubsub.get_message(timeout=0)) is not None:
            heard |= message["type"] == "message" and message["channel"] == self.channel
        return heard

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.pubsub.close()


class RedisStore(Store):
    signals_release = True

    def __init__(self, url: str, prefix: str = DEFAULT_PREFIX, display_url: str | None = None):
        self._url = url
        self.prefix = prefix
        self._prefix_b = prefix.encode("utf-8")
        self.display_url = display_url or redact_url(url)
        self._secrets = [s for s in _split_url(url)[2] if s]
        self._tcp = urlsplit(url).scheme.lower() in ("redis", "rediss")
        self._io_timeout = DEFAULT_IO_TIMEOUT_S
        # The keys of BLPOPs under way, per thread: left there only when a signal cuts
        # one short, so that close passes on the wake-up it may have taken.
        self._blocked_lock = threading.Lock()
        self._blocked_on: Counter[str] = Counter()
        self._break_watches = BreakWatches(
            self._break_subscription, (rexc.RedisError, TasklockError, OSError)
        )
        self._scripts = {
            name: Script(None, source.encode("utf-8"))
            for name, source in (
                ("acquire", _ACQUIRE),
                ("renew", _RENEW),
                ("release", _RELEASE),
                ("force_release", _FORCE_RELEASE),
                ("break", _BREAK),
                ("intact", _INTACT),
                ("pass_on", _PASS_ON),
                ("read_many", _READ_MANY),
            )
        }
        self._client_lock = threading.Lock()
        self._client = self._make_client()

    @classmethod
    def from_url(cls, url: str) -> RedisStore:
        clean, prefix, _ = _split_url(url)
        return cls(clean, prefix=prefix, display_url=redact_url(url))

    # -- connection ---------------------------------------------------------------

    def _connection_kwargs(self) -> dict[str, Any]:
        kwargs: dict[str, Any] = {
            "socket_connect_timeout": self._io_timeout,
            "socket_timeout": self._io_timeout,
            # No silent retries inside redis-py (they would multiply the time a call can
            # take past the supervisor's deadline); ``_call`` retries once, knowingly.
            "retry": Retry(NoBackoff(), 0),
            "health_check_interval": HEALTH_CHECK_INTERVAL_S,
            "redis_connect_func": _set_up_lean,
            "client_name": "tasklock",  # CLIENT LIST shows who holds the connections
            "decode_responses": False,
            # RESP2, so servers and proxies without HELLO work too.
            "protocol": 2,
        }
        if self._tcp:
            kwargs["socket_keepalive"] = True
        if "driver_info" in redis.connection.AbstractConnection.__init__.__code__.co_varnames:
            # No CLIENT SETINFO (see _set_up_lean): and no reading redis-py's own version
            # from its package metadata for it, 4 ms per connection made.
            kwargs["driver_info"] = None
        return kwargs

    def _make_client(self) -> redis.Redis:
        try:
            ours = self._connection_kwargs()
            # Blocking: a thread beyond MAX_CONNECTIONS waits (within the I/O timeout) for a
            # connection instead of failing with "Too many connections".
            pool = redis.BlockingConnectionPool.from_url(
                self._url, max_connections=MAX_CONNECTIONS, timeout=self._io_timeout, **ours
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
                f"invalid Redis URL {self.display_url!r}: {self._scrub(exc)}"
            ) from None
        return client

    def set_io_timeout(self, seconds: float) -> None:
        if not math.isfinite(seconds) or seconds <= 0 or seconds == self._io_timeout:
            return
        with self._client_lock:
            self._io_timeout = seconds
            old, self._client = self._client, self._make_client()
        # Idle connections of the old pool close now; ones in use close when collected.
        old.connection_pool.disconnect(inuse_connections=False)

    def _scrub(self, exc: object) -> str:
        return scrub(exc, self._secrets)

    def _name(self, key: str, role: str) -> bytes:
        """The Redis key of one of a lock key's parts: lease, fence or wake."""
        return self._prefix_b + b"{" + key.encode("utf-8") + b"}:" + role.encode()

    def _lease_key(self, key: str) -> bytes:
        return self._name(key, "lease")

    def _fence_key(self, key: str) -> bytes:
        return self._name(key, "fence")

    def _wake_key(self, key: str) -> bytes:
        return self._name(key, "wake")

    def _runs_key(self, key: str) -> bytes:
        return self._name(key, "runs")

    def _success_key(self, key: str) -> bytes:
        return self._name(key, "success")

    def _break_channel(self, key: str, token: int | str = "") -> bytes:
        """Where a break of ``key``'s lease with fencing token ``token`` is published
        (without ``token``: the part before it, which the scripts complete)."""
        return self._name(key, "broken:") + str(token).encode()

    def _key_of(self, lease_key: bytes) -> str:
        return lease_key[len(self._prefix_b) + 1 : -len(b"}:lease")].decode("utf-8", "replace")

    def _call(self, operation: Callable[[redis.Redis], _T], key: str | None = None) -> _T:
        """Run ``operation`` once more on a fresh connection if the connection broke.

        A broken connection (refused, reset, closed by the server) fails fast; a timeout is
        not retried here, so one call stays within about one I/O timeout. Every retried
        operation is safe to repeat: acquire recognises its own owner token, renew and
        release check it, reads are reads.
        """
        for attempt in (1, 2):
            try:
                return operation(self._client)
            except (rexc.AuthenticationError, rexc.AuthorizationError) as exc:
                raise self._translate(exc, key) from None
            except rexc.ConnectionError as exc:
                if attempt == 1 and not isinstance(exc, rexc.BusyLoadingError):
                    continue
                raise self._translate(exc, key) from None
            except rexc.RedisError as exc:
                raise self._translate(exc, key) from None
        raise AssertionError("unreachable")

    def _translate(self, exc: Exception, key: str | None = None) -> TasklockError:
        text = self._scrub(exc)
        where = self.display_url
        if isinstance(exc, rexc.AuthenticationError | rexc.AuthorizationError):
            # 78, not 69: the server answered and refused these credentials. Retrying cannot
            # help; the store URL (or the server's ACL) has to be fixed.
            return ConfigError(
                f"{where}: Redis refused the credentials ({text}); "
                "check the user name and password of the store URL"
            )
        if isinstance(exc, rexc.ConnectionError | rexc.TimeoutError):
            return StoreUnavailable(f"{where}: {text}")
        if isinstance(exc, rexc.InvalidResponse):
            return StoreUnavailable(f"{where}: the server does not speak Redis ({text})")
        if isinstance(exc, rexc.NoPermissionError):
            return ConfigError(f"{where}: the Redis user may not run what tasklock needs ({text})")
        if isinstance(exc, rexc.ResponseError):
            if text.startswith("WRONGTYPE"):
                return self._foreign_key_error(text, key)
            if "unknown command" in text.lower():
                return ConfigError(f"{where}: this Redis lacks a command tasklock needs ({text})")
        return StoreUnavailable(f"{where}: Redis answered with an error: {text}")

    def _foreign_key_error(self, text: str, key: str | None) -> ConfigError:
        # Our scripts answer "WRONGTYPE lease|fence|wake <type>"; plain commands "WRONGTYPE ...".
        words = text.split()
        which = words[1] if len(words) > 1 and words[1] in _EXPECTED_TYPES else "lease"
        found = " ".join(words[2:]) if len(words) > 2 and words[1] == which else None
        if key is not None:
            name = self._name(key, which)
            described = f"Redis key {name.decode('utf-8', 'replace')!r}"
            if found is None:
                with contextlib.suppress(rexc.RedisError):
                    found = self._client.type(name).decode()
        else:
            described = "a Redis key"
        expected = _EXPECTED_TYPES[which]
        holds = f"holds a {found}" if found else "holds another type"
        return ConfigError(
            f"{self.display_url}: {described} {holds}, not {expected}: another application "
            f"uses the prefix {self.prefix!r}; remove that key or set another prefix= in the "
            "store URL (nothing was changed)"
        )

    # -- the interface --------------------------------------------------------------

    def acquire(self, key: str, ttl: float, holder: Holder, owner_token: str) -> Lease | None:
        ttl_ms = _ttl_ms(ttl, "lease TTL")
        holder_json = json.dumps(holder.to_dict())
        script = self._scripts["acquire"]
        result = self._call(
            lambda c: script(
                keys=[self._lease_key(key), self._fence_key(key), self._wake_key(key)],
                args=[owner_token, ttl_ms, holder_json],
                client=c,
            ),
            key,
        )
        if result is None:
            return None
        token, acquired_ms, expires_ms = (int(v) for v in result)
        return Lease(
            key,
            owner_token,
            token,
            utc_from_timestamp(acquired_ms / 1000),
            utc_from_timestamp(expires_ms / 1000),
        )

    def renew(self, lease: Lease, ttl: float) -> Lease:
        ttl_ms = _ttl_ms(ttl, "lease TTL")
        script = self._scripts["renew"]
        result = self._call(
            lambda c: script(
                keys=[self._lease_key(lease.key)],
                args=[lease.owner_token, lease.fencing_token, ttl_ms],
                client=c,
            ),
            lease.key,
        )
        return lease.renewed_until(
            None if result is None else utc_from_timestamp(int(result) / 1000)
        )

    def release(self, lease: Lease, keep_for: float = 0.0, record: RunRecord | None = None) -> bool:
        keep_ms = _ttl_ms(keep_for, "keep-for time") if keep_for > 0 else 0
        script = self._scripts["release"]
        attempts = 0
        keys = [
            self._lease_key(lease.key),
            self._wake_key(lease.key),
            self._runs_key(lease.key),
            self._success_key(lease.key),
        ]
        succeeded = "1" if record is not None and record.outcome == "succeeded" else ""
        args = [lease.owner_token, lease.fencing_token, keep_ms, _record_json(record), succeeded]

        def run(client: redis.Redis) -> Any:
            nonlocal attempts
            attempts += 1
            return script(keys=keys, args=args, client=client)

        self._break_watches.drop(lease)
        result = int(self._call(run, lease.key))
        if result == 1:
            return True
        # No lease at all on a second attempt: the first one may have deleted it before its
        # reply was lost. Either way nobody holds the key in our name or anyone else's.
        return result == 0 and attempts > 1 and keep_ms == 0

    def time_left(self, key: str, fencing_token: int) -> float | None:
        name = self._lease_key(key)

        def read(client: redis.Redis) -> list[Any]:
            pipe = client.pipeline(transaction=True)  # one round trip, one moment
            pipe.hmget(name, ["owner", "fencing_token"])
            pipe.pttl(name)
            return pipe.execute()

        (owner, token), pttl = self._call(read, key)
        if owner is None or owner.decode().startswith(BROKEN_OWNER_PREFIX):
            return None
        if token != str(fencing_token).encode() or pttl <= 0:
            return None
        return pttl / 1000

    def history(self, key: str, limit: int = LEDGER_KEEP) -> list[RunRecord]:
        name = self._runs_key(key)
        members = self._call(lambda c: c.zrevrange(name, 0, limit - 1), key)
        return self._decoded(key, name, members)

    def last_success(self, key: str) -> tuple[RunRecord | None, datetime]:
        name = self._success_key(key)

        def read(client: redis.Redis) -> list[Any]:
            pipe = client.pipeline(transaction=True)  # one round trip, one moment
            pipe.get(name)
            pipe.time()
            return pipe.execute()

        member, (seconds, micros) = self._call(read, key)
        now = utc_from_timestamp(seconds + micros / 1_000_000)  # Redis's clock, as in TIME
        return (self._decoded(key, name, [member])[0] if member else None), now

    def _decoded(self, key: str, name: bytes, members: list[bytes]) -> list[RunRecord]:
        try:
            return [_run_record(key, member) for member in members]
        except (ValueError, TypeError, KeyError) as exc:
            raise ConfigError(
                f"{self.display_url}: Redis key {name.decode('utf-8', 'replace')!r} does not hold "
                f"tasklock run records ({type(exc).__name__}: {exc}); another application uses "
                f"the prefix {self.prefix!r}"
            ) from None

    def ledger_keys(self, prefix: str = "") -> list[str]:
        pattern = glob_escape(self._prefix_b + b"{" + prefix.encode("utf-8")) + b"*}:runs"
        names = set(self._call(lambda c: self._scan(c, pattern)))
        start, end = len(self._prefix_b) + 1, -len(b"}:runs")
        keys = {name[start:end].decode("utf-8", "replace") for name in names}
        return sorted(key for key in keys if key.startswith(prefix))

    def peek(self, key: str) -> LeaseInfo | None:
        name = self._lease_key(key)
        data = self._call(lambda c: c.hgetall(name), key)
        return self._info(key, name, data) if data else None

    def list(self, prefix: str = "", include_expired: bool = False) -> Iterator[LeaseInfo]:
        # Redis frees expired keys itself: include_expired can only ever show live leases.
        pattern = glob_escape(self._prefix_b + b"{" + prefix.encode("utf-8")) + b"*}:lease"
        # SCAN returns names in no order: collect them (names only), sort by key, then
        # read and yield the leases page by page.
        names = sorted(set(self._call(lambda c: self._scan(c, pattern))), key=self._key_of)
        return self._read_pages(names, prefix)

    def _read_pages(self, names: list[bytes], prefix: str) -> Iterator[LeaseInfo]:
        for start in range(0, len(names), LIST_PAGE):
            batch = names[start : start + LIST_PAGE]
            rows = self._call(lambda c, batch=batch: self._fetch(c, batch))
            for name, row in zip(batch, rows, strict=True):
                key = self._key_of(name)
                if row is None or not key.startswith(prefix):
                    continue  # expired between SCAN and the read
                if isinstance(row, str):
                    raise self._foreign_key_error(f"WRONGTYPE lease {row}", key)
                yield self._record(key, name, *row)

    @staticmethod
    def _scan(client: redis.Redis, pattern: bytes) -> list[bytes]:
        return list(client.scan_iter(match=pattern, count=SCAN_COUNT))

    def _fetch(self, client: redis.Redis, names: list[bytes]) -> list[Any]:
        """Per name: (token, acquired_at, expires_at, holder), None when gone, or a type name."""
        raw = self._scripts["read_many"](keys=names, client=client)
        try:
            decoded = json.loads(raw)
        except ValueError:  # a foreign hash with bytes that are not UTF-8: read it plainly
            decoded = None
        if isinstance(decoded, list) and len(decoded) == len(names):
            return [None if row == 0 else row for row in decoded]
        pipe = client.pipeline(transaction=False)
        for name in names:
            pipe.hmget(name, ["fencing_token", "acquired_at", "expires_at", "holder"])
        rows: list[Any] = []
        for name, result in zip(names, pipe.execute(raise_on_error=False), strict=True):
            if isinstance(result, rexc.ResponseError):
                rows.append(client.type(name).decode())
            elif isinstance(result, Exception):
                raise result
            else:
                rows.append(None if all(v is None for v in result) else result)
        return rows

    def sweep(self, dry_run: bool = False) -> int:
        # Expired leases vanish by themselves (PX) and there is no index to prune; counters
        # are never touched. Still check that the store answers, so `sweep` reports an
        # unreachable store instead of claiming success.
        self._call(lambda c: c.ping())
        return 0

    def break_lease(self, key: str, token: int | None = None) -> LeaseInfo | None:
        script = self._scripts["break"]
        name = self._lease_key(key)
        args = ["" if token is None else token, self._break_channel(key)]
        flat = self._call(lambda c: script(keys=[name], args=args, client=c), key)
        return self._flat_info(key, name, flat)

    def force_release(self, key: str, token: int | None = None) -> LeaseInfo | None:
        script = self._scripts["force_release"]
        name = self._lease_key(key)
        wake = self._wake_key(key)
        args = ["" if token is None else token, self._break_channel(key)]
        flat = self._call(lambda c: script(keys=[name, wake], args=args, client=c), key)
        return self._flat_info(key, name, flat)

    def _flat_info(self, key: str, name: bytes, flat: list[bytes] | None) -> LeaseInfo | None:
        if not flat:
            return None
        data = dict(zip(flat[0::2], flat[1::2], strict=True))
        return self._info(key, name, data)

    # -- a holder waiting for a break ---------------------------------------------------

    def wait_for_break(self, lease: Lease, timeout: float, wake_fd: int | None = None) -> bool:
        """SUBSCRIBE to the lease's break channel on a connection of its own (made at the
        first wait, kept until release), then look at the lease once; from then on select
        on that connection and ``wake_fd``.

        Pub/sub rather than a per-lease list to BLPOP: the holder selects on the
        subscription's socket together with ``wake_fd`` and can stop at any moment, with
        no blocked command to cancel and nothing left on the server; a message published
        before the subscription is not needed, as the look after subscribing sees the
        break. Trouble with that connection is not a break: it is dropped (the next wait
        makes another) and this wait sleeps on ``wake_fd``; the renewals report the
        store's state."""
        return self._break_watches.wait(lease, timeout, wake_fd)

    def _break_subscription(self, lease: Lease) -> tuple[_BreakSubscription, bool]:
        """A new subscription for the lease, and whether the lease was found broken on
        making it."""
        with self._client_lock:
            client = self._client
        subscription = _BreakSubscription(
            client.pubsub(), self._break_channel(lease.key, lease.fencing_token)
        )
        try:
            subscription.subscribe(self._io_timeout)  # confirmed before the look
            script = self._scripts["intact"]
            intact = self._call(
                lambda c: script(
                    keys=[self._lease_key(lease.key)],
                    args=[lease.owner_token, lease.fencing_token],
                    client=c,
                ),
                lease.key,
            )
        except BaseException:
            subscription.close()
            raise
        return subscription, int(intact) != 1

    def wait_for_release(self, key: str, timeout: float, wake_fd: int | None = None) -> None:
        """Block until the lease on ``key`` is released or expires, at most ``timeout``.

        Look at the lease first (free: return), then BLPOP the key's wake list, at most
        until the lease's own expiry. A release between the two leaves its wake-up in the
        list, so it is not missed; each release wakes one waiter, so N waiters do not all
        rush at the store and the CPU when one of them can win. Never raises: on trouble it
        sleeps the rest of the timeout and the caller's next acquire reports the store's
        state. With ``wake_fd``, the BLPOP's socket is selected on together with it: once
        it is readable the BLPOP is abandoned with its connection, and the wake-up it may
        have taken is passed on.
        """
        if timeout <= 0:
            return
        deadline = time.monotonic() + timeout
        try:
            name, wake = self._lease_key(key), self._wake_key(key)
            pttl = int(self._call(lambda c: c.pttl(name), key))
            if pttl == -2:
                return  # already free
            if pttl >= 0:  # wake at the lease's own expiry (nobody pushes a wake-up for it)
                deadline = min(deadline, time.monotonic() + pttl / 1000 + 0.002)
            while True:
                # Slices well inside the socket timeout; BLPOP's timeout 0 means forever.
                left = min(deadline - time.monotonic(), self._io_timeout / 2)
                if left < 0.001 or fd_readable(wake_fd):
                    return
                seconds = math.floor(left * 1000) / 1000
                with self._blocked(key):
                    if wake_fd is None:
                        popped = self._call(lambda c, s=seconds: c.blpop([wake], timeout=s), key)
                    else:
                        popped = self._blpop_or_wake(wake, seconds, wake_fd)
                if popped is _WOKEN:
                    self._pass_on(key)
                    return
                if popped is not None:
                    return
        except (rexc.RedisError, TasklockError, OSError):
            wait_readable([wake_fd], deadline - time.monotonic())

    @contextlib.contextmanager
    def _blocked(self, key: str) -> Iterator[None]:
        """Mark a BLPOP on ``key`` under way; the mark stays when a signal's exception
        cuts it short (close then passes on the wake-up it may have taken)."""
        with self._blocked_lock:
            self._blocked_on[key] += 1
        try:
            yield
        except (rexc.RedisError, TasklockError, OSError):
            self._unblocked(key)
            raise
        self._unblocked(key)

    def _unblocked(self, key: str) -> None:
        with self._blocked_lock:
            self._blocked_on[key] -= 1
            if self._blocked_on[key] <= 0:
                del self._blocked_on[key]

    def _blpop_or_wake(self, wake: bytes, seconds: float, wake_fd: int) -> object:
        """BLPOP on a pool connection whose socket is selected on with ``wake_fd``: the
        popped element, None at BLPOP's timeout, or _WOKEN when ``wake_fd`` came first."""
        with self._client_lock:
            pool = self._client.connection_pool
        conn = pool.get_connection()
        try:
            conn.send_command("BLPOP", wake, seconds)
            sock = conn._sock  # (redis-py keeps the socket there; selected on, not read)
            if sock is None:
                raise rexc.ConnectionError("the connection closed while sending BLPOP")
            ready = wait_readable([sock.fileno(), wake_fd], seconds + self._io_timeout)
            if sock.fileno() in ready:
                return conn.read_response()
            conn.disconnect()  # abandoned: the server drops the BLPOP with the connection
            if not ready:
                raise rexc.TimeoutError(f"no answer to BLPOP within {seconds:g} s")
            return _WOKEN
        except BaseException:
            conn.disconnect()
            raise
        finally:
            pool.release(conn)

    def _pass_on(self, key: str) -> None:
        """A waiter leaving early may have taken the last release's wake-up: while the key
        is free, one is left for the next waiter. Never raises."""
        script = self._scripts["pass_on"]
        keys = [self._lease_key(key), self._wake_key(key)]
        with contextlib.suppress(TasklockError):
            self._call(lambda c: script(keys=keys, client=c), key)

    # -- schema and diagnostics --------------------------------------------------------

    def init_schema(self) -> None:
        """Nothing to create: keys appear on first use."""

    def schema_sql(self) -> str | None:
        return None

    def doctor(self) -> list[StoreCheck]:
        checks = [StoreCheck("store", True, f"{self.display_url} (key prefix {self.prefix!r})")]
        try:
            self._call(lambda c: c.ping())  # connects (and authenticates)
            started = time.perf_counter()
            self._call(lambda c: c.ping())
            rtt = time.perf_counter() - started
        except TasklockError as exc:
            checks.append(StoreCheck("reachable", False, str(exc)))
            return checks
        checks.append(StoreCheck("reachable", True, f"PING answered in {rtt * 1000:.1f} ms"))
        for check in (self._check_server, self._check_persistence, self._check_eviction):
            try:
                checks.append(check())
            except TasklockError as exc:
                checks.append(StoreCheck(check.__name__[7:], False, str(exc)))
        checks.append(self._check_scripts())
        checks.append(self._check_clock())
        return checks

    def _check_scripts(self) -> StoreCheck:
        try:
            for script in self._scripts.values():
                self._call(lambda c, script=script: c.script_load(script.script))
        except TasklockError as exc:
            return StoreCheck("scripts", False, f"cannot load tasklock's Lua scripts: {exc}")
        return StoreCheck("scripts", True, f"{len(self._scripts)} Lua scripts loaded")

    def _info_section(self, section: str) -> dict[str, Any]:
        return self._call(lambda c: c.info(section))

    def _config_get(self, name: str) -> str | None:
        """The setting's value, or None when CONFIG is refused (managed Redis)."""
        try:
            values = self._client.config_get(name)
        except rexc.ResponseError:  # unknown/renamed command, NOPERM, ...
            return None
        except rexc.RedisError as exc:
            raise self._translate(exc) from None
        values = values or {}
        value = values.get(name, values.get(name.encode()))
        return value.decode() if isinstance(value, bytes) else value

    def _check_server(self) -> StoreCheck:
        info = self._info_section("server")
        version = info.get("redis_version", "unknown")
        mode = info.get("redis_mode", "standalone")
        if mode == "cluster":
            return StoreCheck(
                "server",
                True,
                f"Redis {version} in cluster mode: tasklock talks to one node; keys of other "
                "slots get MOVED errors — use a standalone or primary endpoint",
                warning=True,
            )
        return StoreCheck("server", True, f"Redis {version} ({mode})")

    def _check_persistence(self) -> StoreCheck:
        appendonly = self._config_get("appendonly")
        fsync = self._config_get("appendfsync")
        risk = (
            "fencing tokens are only as durable as Redis: after a restart or failover that "
            "loses writes, tokens issued before can be issued again"
        )
        if appendonly is None or fsync is None:
            try:
                aof = self._info_section("persistence").get("aof_enabled")
            except TasklockError:
                aof = None
            known = "" if aof is None else f" (INFO says aof_enabled={aof})"
            return StoreCheck(
                "persistence",
                True,
                f"could not be checked: CONFIG GET is not allowed{known}; {risk} — "
                "make sure AOF with appendfsync everysec or always is on",
                warning=True,
            )
        if appendonly == "yes" and fsync in ("everysec", "always"):
            return StoreCheck("persistence", True, f"AOF on, appendfsync {fsync}")
        return StoreCheck(
            "persistence",
            True,
            f"appendonly {appendonly}, appendfsync {fsync}: {risk}; "
            "enable appendonly yes with appendfsync everysec or always",
            warning=True,
        )

    def _check_eviction(self) -> StoreCheck:
        policy = self._config_get("maxmemory-policy")
        if policy is None:
            try:
                policy = self._info_section("memory").get("maxmemory_policy")
            except TasklockError:
                policy = None
        if policy is None:
            return StoreCheck(
                "eviction",
                True,
                "maxmemory-policy could not be checked (CONFIG GET and INFO refused); it "
                "must be noeviction",
                warning=True,
            )
        if policy == "noeviction":
            return StoreCheck("eviction", True, "maxmemory-policy noeviction")
        what = (
            "volatile-* policies evict live leases (a second holder can start)"
            if str(policy).startswith("volatile")
            else "allkeys-* policies can evict leases and fencing counters"
        )
        return StoreCheck(
            "eviction", True, f"maxmemory-policy {policy}: {what}; use noeviction", warning=True
        )

    def _check_clock(self) -> StoreCheck:
        try:
            sent_wall = time.time()
            sent = time.perf_counter()
            seconds, micros = self._call(lambda c: c.time())
            rtt = time.perf_counter() - sent
        except TasklockError as exc:
            return StoreCheck("clock", False, str(exc))
        offset = seconds + micros / 1_000_000 - (sent_wall + rtt / 2)
        return clock_check("Redis's", offset, rtt / 2, "expiry runs on Redis's clock")

    def close(self) -> None:
        with self._blocked_lock:
            blocked, self._blocked_on = list(self._blocked_on), Counter()
        for key in blocked:  # the wake-up it may have popped goes to the next waiter
            self._pass_on(key)
        self._break_watches.close()
        with self._client_lock:
            client = self._client
        with contextlib.suppress(Exception):
            client.close()
            client.connection_pool.disconnect()

    # -- records ----------------------------------------------------------------------

    def _info(self, key: str, name: bytes, data: dict[bytes, bytes]) -> LeaseInfo:
        fields = (b"fencing_token", b"acquired_at", b"expires_at", b"holder")
        return self._record(key, name, *(data.get(field) for field in fields))

    def _record(
        self, key: str, name: bytes, token: Any, acquired: Any, expires: Any, holder: Any
    ) -> LeaseInfo:
        try:
            info = LeaseInfo(
                key=key,
                holder=Holder.from_dict(json.loads(holder)),
                fencing_token=int(token),
                acquired_at=utc_from_timestamp(int(acquired) / 1000),
                expires_at=utc_from_timestamp(int(expires) / 1000),
                expired=False,  # a lease key that exists is live: Redis drops it at its PX
            )
        except (ValueError, TypeError, AttributeError) as exc:
            raise ConfigError(
                f"{self.display_url}: Redis key {name.decode('utf-8', 'replace')!r} is not a "
                f"tasklock lease ({type(exc).__name__}: {exc}); another application uses the "
                f"prefix {self.prefix!r}"
            ) from None
        return info
