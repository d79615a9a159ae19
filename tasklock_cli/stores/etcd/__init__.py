"""etcd v3 store, over etcd's gRPC JSON gateway (``POST /v3/...``, etcd >= 3.4).

What it keeps where: each slot's keys (``keys``), attached to an etcd lease granted with the
acquire, so etcd's leases decide expiry; the queues' places under a waiter lease; the run
ledger (``ledger``). Waiters watch what keeps them out from a revision, so no release goes
unheard (``waiting``); holders watch their own slot for a break (``breaks``).

The design and its arguments: docs/design/etcd.md.
"""

from __future__ import annotations

import math

from tasklock_cli.stores.model import WAITER_TTL_S
from tasklock_cli.stores.traits import Capabilities
from tasklock_cli.util.lazy import import_on_first_use

TITLE = "etcd"
SCHEMES = ("etcd", "etcds")
URL_FORM = "etcd://HOST:PORT"
DRIVER = None
#: ``EtcdStore`` is imported on first use: a companion module never brings the driver.
__getattr__ = import_on_first_use(__name__, "store", "EtcdStore")
__all__ = ["EtcdStore"]
#: What the store can do, its class's traits (see ``traits.Capabilities``).
CAPABILITIES = Capabilities(
    signals_release=True,  # watches
    concurrent_release=True,  # its calls take the client's lock; a break watch has its own stream
    waits_keep_places=True,  # the waits keep the waiter lease alive; watches start at a revision
    byte_keys=False,  # keys as tasklock writes them are UTF-8
    # Whole seconds, raised to etcd's own minimum (1.5 x its election timeout, 2 s by
    # default); the leader looks for expired leases twice a second.
    min_ttl=1.0,
    expiry_lag=1.0,  # its check every 0.5 s, then a Raft round: 0.7 s was passed under load
    waiter_ttl=float(math.ceil(WAITER_TTL_S)),  # whole seconds (a waiter lease)
    failover_window=None,  # Raft: a confirmed lease survives a change of leader
)


def url_problem(url: str) -> str | None:
    """None: the connection reads the list of members itself (``connection.parse_url``)."""
    return None
