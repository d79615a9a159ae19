"""etcd v3 store, over etcd's gRPC JSON gateway (``POST /v3/...``, etcd >= 3.4).

What it keeps where: each slot's keys (``keys``), attached to an etcd lease granted with the
acquire, so etcd's leases decide expiry; the queues' places under a waiter lease; the run
ledger (``ledger``). Waiters watch what keeps them out from a revision, so no release goes
unheard (``waiting``); holders watch their own slot for a break (``breaks``).

The design and its arguments: docs/design/etcd.md.
"""

from __future__ import annotations

from tasklock_cli.util.lazy import import_on_first_use

TITLE = "etcd"
SCHEMES = ("etcd", "etcds")
URL_FORM = "etcd://HOST:PORT"
DRIVER = None
#: ``EtcdStore`` is imported on first use: a companion module never brings the driver.
__getattr__ = import_on_first_use(__name__, "store", "EtcdStore")
__all__ = ["EtcdStore"]


def url_problem(url: str) -> str | None:
    """None: the connection reads the list of members itself (``connection.parse_url``)."""
    return None
