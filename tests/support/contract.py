"""What the store tests share: two holders, owner tokens, a short lease, a granted acquire,
a waiter in a thread."""

from __future__ import annotations

import threading
import time
import uuid

from tasklock_cli.stores.model import Holder
from tasklock_cli.stores.model import Lease

HOLDER = Holder(
    host="host-a", pid=4242, user="alice", command=["./job.sh", "--all"], note="nightly"
)
OTHER = Holder(host="host-b", pid=99, user="bob", command=["true"], note=None)

SHORT_TTL = 0.4
PAST_SHORT_TTL = 0.6


def short_ttl(store) -> tuple[float, float]:
    """A short lease on this store, and a wait after which it has expired: SHORT_TTL and
    PAST_SHORT_TTL, unless the store's leases cannot be that short (``Store.min_ttl``) or
    are freed late (``Store.expiry_lag``)."""
    ttl = max(SHORT_TTL, store.min_ttl)
    return ttl, ttl + (PAST_SHORT_TTL - SHORT_TTL) + store.expiry_lag


def token() -> str:
    return uuid.uuid4().hex


def granted(lease: Lease | None) -> Lease:
    """The lease of an acquire the test needs granted (``Store.acquire`` returns None for a
    refusal): fails the test there, instead of an AttributeError on None further on."""
    assert lease is not None, "the acquire was refused"
    return lease


def waiting_thread(waiter, key: str, timeout: float, woke: list[float]) -> threading.Thread:
    """A started thread in which ``waiter`` waits for ``key`` (``wait_for_release``), then
    adds the monotonic time it woke to ``woke``."""

    def wait() -> None:
        waiter.wait_for_release(key, timeout)
        woke.append(time.monotonic())

    thread = threading.Thread(target=wait, daemon=True)
    thread.start()
    return thread
