"""Redis Sentinel URLs: ``redis+sentinel://[[USER]:PASSWORD@]HOST:PORT[,HOST:PORT...]/SERVICE[/DB]``
(``rediss+sentinel://``: TLS to the sentinels and the data nodes alike).

The sentinels are asked for SERVICE's primary when a connection is made, and again after a
connection error or a READONLY reply (the primary was demoted): redis-py's
``SentinelConnectionPool`` does this. Its discovery takes the first sentinel's word; ours
takes a primary only when a majority of the listed sentinels name the same one, so a
sentinel cut off with a stale view (naming the old primary) is outvoted.

The URL's user and password are the data nodes'. The sentinels get ``sentinel_username=``
and ``sentinel_password=`` (none by default: sentinels usually run without ``requirepass``).

The sentinels choose where that password goes: they are trusted. Still, a reply is checked
before it counts as a vote (``QuorumSentinel._vote``): one sentinel answering what none
would (a port ``notaport``) is outvoted, not a traceback before the others are asked.
"""

from __future__ import annotations

import ipaddress
from collections import Counter
from dataclasses import dataclass
from dataclasses import field
from typing import Any
from urllib.parse import unquote
from urllib.parse import unquote_plus

import redis
import redis.connection
import redis.exceptions as rexc
from redis.sentinel import MasterNotFoundError
from redis.sentinel import Sentinel
from redis.sentinel import SentinelConnectionPool

from tasklock_cli.errors import ConfigError
from tasklock_cli.stores.urls import check_host
from tasklock_cli.stores.urls import host_problem
from tasklock_cli.stores.urls import redact_url
from tasklock_cli.stores.urls import split_url as split_any_url
from tasklock_cli.util.numbers import decimal

SENTINEL_SCHEMES = ("redis+sentinel", "rediss+sentinel")
DEFAULT_SENTINEL_PORT = 26379
#: The URL parameters for the sentinels themselves (the rest are the data nodes').
SENTINEL_PARAMETERS = ("sentinel_username", "sentinel_password")
#: What a sentinel answers ``SENTINEL MASTER`` for a service it does not monitor.
_NO_SUCH_SERVICE = "No such master with that name"


class UnknownServiceError(MasterNotFoundError):
    """A majority of the sentinels monitor no service of that name: the URL is wrong (78),
    not the store down (69)."""


def is_sentinel_url(url: str) -> bool:
    return url.partition("://")[0].lower() in SENTINEL_SCHEMES


@dataclass
class SentinelTarget:
    """What a sentinel URL names: the sentinels, the service, and how to talk to each."""

    sentinels: list[tuple[str, int]]
    service: str
    tls: bool
    #: redis-py connection options for the data nodes (typed, from the URL), no host/port.
    node_options: dict[str, Any] = field(default_factory=dict)
    sentinel_username: str | None = None
    sentinel_password: str | None = None


def parse_sentinel_url(url: str, query_items: list[str]) -> SentinelTarget:
    """The target of a sentinel URL whose query (without tasklock's own parameters) is
    ``query_items``. ConfigError naming what is wrong (the password redacted)."""
    scheme, netloc, path, _ = split_any_url(url)
    userinfo, _, hosts = netloc.rpartition("@")
    sentinels = [_host_port(url, item) for item in hosts.split(",")]
    parts = [unquote(part) for part in path.strip("/").split("/")] if path.strip("/") else []
    if not parts or not parts[0] or len(parts) > 2:
        raise _bad(url, "name the service: redis+sentinel://HOST:PORT[,HOST:PORT...]/SERVICE[/DB]")
    service = parts[0]
    db = parts[1] if len(parts) == 2 else "0"
    kept: list[str] = []
    sentinel_auth: dict[str, str] = {}
    for item in query_items:
        name, _, value = item.partition("=")
        if unquote_plus(name) in SENTINEL_PARAMETERS:
            sentinel_auth[unquote_plus(name)] = unquote_plus(value)
        else:
            kept.append(item)
    # redis-py's own URL parser types the data nodes' options (timeouts, TLS files, ...).
    tls = scheme == "rediss+sentinel"
    auth = userinfo + "@" if userinfo else ""
    stand_in = f"{'rediss' if tls else 'redis'}://{auth}localhost/{db}"
    if kept:
        stand_in += "?" + "&".join(kept)
    try:
        options = redis.connection.parse_url(stand_in)
    except (ValueError, TypeError) as exc:
        raise _bad(url, str(exc).replace(stand_in, "...")) from None
    for name in ("host", "port", "connection_class", "path"):
        options.pop(name, None)
    return SentinelTarget(
        sentinels,
        service,
        tls,
        options,
        sentinel_auth.get("sentinel_username") or None,
        sentinel_auth.get("sentinel_password") or None,
    )


def _host_port(url: str, item: str) -> tuple[str, int]:
    host, port = item, str(DEFAULT_SENTINEL_PORT)
    if item.startswith("["):  # [IPv6]:PORT
        inside, closed, rest = item[1:].partition("]")
        if not closed or (rest and not rest.startswith(":")):
            raise _bad(url, f"a sentinel must be HOST:PORT or [IPv6]:PORT (got {item!r})")
        host, port = inside, rest[1:] if rest else port
        if not _is_ipv6(host):
            raise _bad(url, f"{item!r}: inside [ ] must be an IPv6 address")
    elif ":" in item:
        host, _, port = item.rpartition(":")
    number = decimal(port, 1, 65535)
    if not host or number is None:
        raise _bad(url, f"a sentinel must be HOST:PORT (got {item!r})")
    check_host("Redis Sentinel", url, host)
    return host, number


def _is_ipv6(text: str) -> bool:
    try:
        ipaddress.IPv6Address(text)
    except ValueError:
        return False
    return True


def _bad(url: str, problem: str) -> ConfigError:
    return ConfigError(f"Redis Sentinel store URL {redact_url(url)!r}: {problem}")


class QuorumSentinel(Sentinel):
    """redis-py's Sentinel client whose primary is the one a majority of the listed
    sentinels name (and none of them sees down)."""

    def discover_master(self, service_name: str) -> tuple[str, int]:
        needed = len(self.sentinels) // 2 + 1
        votes: Counter[tuple[str, int]] = Counter()
        problems: list[str] = []
        unknown = 0
        for sentinel in self.sentinels:
            try:
                state = sentinel.sentinel_master(service_name)
            except (rexc.RedisError, *_MALFORMED) as exc:
                problems.append(f"{_address(sentinel)}: {_failure(exc)}")
                unknown += isinstance(exc, rexc.ResponseError) and _NO_SUCH_SERVICE in str(exc)
                continue
            address = self._vote(state, service_name)
            if isinstance(address, str):
                problems.append(f"{_address(sentinel)}: {address}")
                continue
            votes[address] += 1
            if votes[address] >= needed:
                return address
        if unknown >= needed:
            raise UnknownServiceError(
                f"service {service_name!r} is unknown to {unknown} of the {len(self.sentinels)} "
                "sentinels (the SERVICE in redis+sentinel://HOST:PORT,.../SERVICE)"
            )
        named = ", ".join(f"{host}:{port} by {n}" for (host, port), n in votes.items())
        raise MasterNotFoundError(
            f"no primary for service {service_name!r} named by a majority ({needed} of "
            f"{len(self.sentinels)}) of the sentinels"
            + (f"; named: {named}" if named else "")
            + (f"; {'; '.join(problems)}" if problems else "")
        )

    def _vote(self, state: object, service_name: str) -> tuple[str, int] | str:
        """The primary a sentinel's ``SENTINEL MASTER`` reply names, or why it names none.

        Validated before it counts: a sentinel is another server, and one that answers
        what no sentinel would (a port ``notaport`` or ``99999``, fields missing) is
        outvoted like one that is down, never a traceback before the others are asked."""
        if not isinstance(state, dict):
            return "answered no primary's state"
        try:
            healthy = self.check_master_state(state, service_name)
        except _MALFORMED:
            return "answered a malformed primary's state"
        if not healthy:
            return "sees the primary down"
        ip, port = state.get("ip"), decimal(str(state.get("port")), 1, 65535)
        if not isinstance(ip, str) or not ip or port is None:
            return f"named no valid address (ip {ip!r}, port {state.get('port')!r})"
        problem = host_problem(ip)
        return (ip, port) if problem is None else f"named {problem}"

    def replicas_of(self, service_name: str) -> list[dict[str, Any]]:
        """The replicas the first answering sentinel knows of SERVICE (flags included)."""
        for sentinel in self.sentinels:
            try:
                return list(sentinel.sentinel_slaves(service_name))
            except (rexc.RedisError, *_MALFORMED):
                continue
        return []


#: What redis-py's parsing of a malformed sentinel reply raises (a field missing, a number
#: that is text), and redis-py's ``check_master_state`` on one.
_MALFORMED = (KeyError, ValueError, TypeError, IndexError, AttributeError)


def _failure(exc: Exception) -> str:
    """A sentinel's failure as ``discover_master`` lists it."""
    if isinstance(exc, _MALFORMED):
        return f"answered what no sentinel answers ({type(exc).__name__}: {exc})"
    return str(exc)


def _address(client: redis.Redis) -> str:
    options = client.connection_pool.connection_kwargs
    return f"sentinel {options.get('host')}:{options.get('port')}"


def sentinel_client(
    target: SentinelTarget, ours: dict[str, Any], forced: tuple[str, ...]
) -> tuple[redis.Redis, QuorumSentinel]:
    """A client of SERVICE's primary, with tasklock's connection options ``ours`` (those in
    ``forced`` win over the URL's), and the sentinels it asks."""
    node_options = {**target.node_options, **ours}
    for name in forced:
        node_options[name] = ours[name]
    node_options.pop("connection_pool_class", None)
    # Each sentinel gets a share of the I/O timeout, so that a dead one leaves time to ask
    # the others within one call's bound.
    share = max(0.1, float(ours["socket_timeout"]) / max(1, len(target.sentinels)))
    sentinel_options: dict[str, Any] = {
        "socket_timeout": share,
        "socket_connect_timeout": share,
        "retry": ours["retry"],
        "protocol": 2,
        "decode_responses": True,
        "client_name": "tasklock",
    }
    if target.tls:
        sentinel_options["ssl"] = True
        sentinel_options.update(
            {k: v for k, v in target.node_options.items() if k.startswith("ssl_")}
        )
    if target.sentinel_username:
        sentinel_options["username"] = target.sentinel_username
    if target.sentinel_password:
        sentinel_options["password"] = target.sentinel_password
    manager = QuorumSentinel(target.sentinels, sentinel_kwargs=sentinel_options)
    if target.tls:
        node_options["ssl"] = True
    pool = SentinelConnectionPool(target.service, manager, **node_options)
    return redis.Redis(connection_pool=pool), manager
