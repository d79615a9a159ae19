"""etcd v3 store, over etcd's gRPC JSON gateway (``POST /v3/...``, etcd >= 3.4).

Expiry is decided by etcd's leases. Each acquisition grants a lease and attaches the slot's
keys to it: they exist exactly while the lease lives, or until the slot is released.

Companions: ``keys`` (the key layout), ``acquiring`` (the acquire's txn), ``connection``
(members, failover, the calls), ``waiting`` (waiters' queues), ``breaks``, ``ledger`` (the
run ledger), ``doctor``.

Modes:
- Shared holders each take a slot of their own under ``K NUL 0/``, never the lock key.
- So an exclusive acquire is "no key of K at all", and a shared one "no lock key and no
  other limit's key": one compare each, in the same txn.
- Queue places carry their class in their names (front or normal, shared or exclusive,
  supersede or plain), so the txn's compares say who is ahead of whom.
- ``--supersede`` deletes the older supersede places when it joins (see ``waiting``).

Clocks:
- etcd has no clock a client can read but the HTTP ``Date`` header of its replies: the
  member's wall clock, in whole seconds, cut down.
- ``last_success`` takes its reply's ``Date`` as "now". A success's start is the ``Date`` of
  its acquisition's reply. Both are on the member's clock, so hosts with skewed clocks
  agree on a ``--once-per`` window.
- Cut down to whole seconds, a time stays in its window exactly when the window's length is
  whole seconds (its bounds are whole seconds too); otherwise within 1 s.

Round trips:
- Acquire = 1. The lease grant (with a client-chosen ID) and the ``txn`` that creates the
  slot's key only if absent, with the lease attached, are pipelined on one connection.
- A refused acquire keeps its lease for the next one, which keeps it alive the same way. A
  lease kept alive less than ``store.SPARE_FRESH_S`` ago is attached as it is: a woken
  waiter's acquire is then the txn alone, and its holder's deadline counts from that
  keepalive (``lease_age``).
- The slots are tried in order, by txns nested in the failure branch of the one before.
  Where none was free, the txn reads the holders back.
- A limit over SLOTS_PER_TXN whose first slots are all held takes one more txn per
  SLOTS_PER_TXN slots (etcd bounds the ops of a txn, nested ones counted in).
- Renew = 1: a lease keepalive. It fails once the lease was revoked, which is what release,
  forced release and break do.
- Release = 1: a ``txn`` guarded by the owner's value and the fencing token deletes the
  slot's keys. The emptied lease runs out on its own: a revoke could report a release that
  a break had just moved away from it.
- ``keep_for``, break and forced release take 2-4 per slot.

Lease lengths:
- Leases have whole seconds, and etcd raises short ones to its minimum (1 s at least; 2 s
  with the default election timeout). The granted TTL is used for ``expires_at``.
- A lease also runs out up to ~0.5 s late: etcd's leader checks expiries twice a second.
- A TTL under the granted one is still safe for the holder: its own deadline counts the
  TTL asked.
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
