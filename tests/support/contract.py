"""What the store contract's cases share: two holders, owner tokens, a short lease."""

from __future__ import annotations

import uuid

from tasklock_cli.stores.model import Holder

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
