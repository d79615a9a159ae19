"""Redis store: Redis's own TTLs decide expiry; the fencing counter lives as long as Redis's data.

What it keeps where: per key ``K`` under ``P{K}:`` (``prefix=``, default ``tasklock:``) a
hash per slot with a PX TTL, the fencing counter (never a TTL), the queue of waiters (zset
and hash) and the run ledger; each operation is one Lua script (``scripts``). Waiters hear
releases on wake lists (BLPOP: one element per release, ``waiting``); holders hear breaks
by pub/sub (``breaks``). A server that lost the last writes (failover, restart) starts a
failover epoch and its quarantine (``epochs``).

The design and its arguments: docs/design/redis.md.
"""

from __future__ import annotations

from tasklock_cli.stores.failover import DEFAULT_TTL_S
from tasklock_cli.stores.model import WAITER_TTL_S
from tasklock_cli.stores.registry import Driver
from tasklock_cli.stores.traits import Capabilities
from tasklock_cli.stores.urls import url_syntax_problem
from tasklock_cli.util.lazy import import_on_first_use

TITLE = "redis"
SCHEMES = ("redis", "rediss", "unix", "redis+sentinel", "rediss+sentinel")
URL_FORM = "redis://..."
DRIVER = Driver("redis", "redis>=5")


def url_problem(url: str) -> str | None:
    """What makes ``url`` unreadable; a Sentinel URL's list of hosts is read by its own
    parser (``sentinel``), which urlsplit's netloc checks would refuse in some Pythons."""
    if url.partition("://")[0].lower().endswith("+sentinel"):
        return None
    return url_syntax_problem(url)


#: ``RedisStore`` is imported on first use: a companion module never brings the driver.
__getattr__ = import_on_first_use(__name__, "store", "RedisStore")
__all__ = ["RedisStore"]
#: What the store can do, its class's traits (see ``traits.Capabilities``).
CAPABILITIES = Capabilities(
    signals_release=True,  # wake lists and pub/sub
    concurrent_release=False,
    waits_keep_places=False,
    byte_keys=True,  # key names are bytes
    min_ttl=0.0,
    expiry_lag=0.0,
    waiter_ttl=WAITER_TTL_S,
    failover_window=DEFAULT_TTL_S,  # None with ?wait_replicas=N (the store sets its own)
)
