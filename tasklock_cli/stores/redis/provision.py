"""How the tests and the bench get a Redis store: a key prefix of their own on the server
of ``TASKLOCK_TEST_REDIS_URL``, its keys deleted after (see ``stores.provisioning``). A
waiter that was refused and waited keeps no place: giving up takes no round trip."""

from __future__ import annotations

from tasklock_cli.stores.provisioning import Provisioning
from tasklock_cli.stores.provisioning import RoundTrips
from tasklock_cli.stores.provisioning import Server
from tasklock_cli.stores.provisioning import parameter


def drop_namespace(url: str) -> int:
    """Delete every key under the URL's ``prefix=`` (SCAN, never KEYS); returns how many."""
    import redis

    from tasklock_cli.stores.redis.connection import split_url
    from tasklock_cli.stores.redis.keys import glob_escape

    clean, prefix, _ = split_url(url)
    if not prefix:
        raise ValueError("refusing to drop an empty prefix (that is the whole database)")
    client = redis.Redis.from_url(clean, socket_timeout=5, socket_connect_timeout=5)
    removed = 0
    try:
        batch: list[bytes] = []
        for name in client.scan_iter(match=glob_escape(prefix.encode()) + b"*", count=10_000):
            batch.append(name)
            if len(batch) >= 1000:
                removed += client.unlink(*batch)
                batch = []
        if batch:
            removed += client.unlink(*batch)
    finally:
        client.close()
    return removed


PROVISIONING = Provisioning(
    server=Server("Redis server", "TASKLOCK_TEST_REDIS_URL", "redis://127.0.0.1:6379/0", 6379),
    namespace_url=parameter("prefix", ":"),
    cleanup=drop_namespace,
    round_trips=RoundTrips(stop_waiting=0),
)
