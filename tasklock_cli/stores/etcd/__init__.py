"""etcd v3 store, over etcd's gRPC JSON gateway (``POST /v3/...``, etcd >= 3.4).

Expiry is decided by etcd's leases: each acquisition grants a lease and attaches the
slot's keys to it; they exist exactly while the lease lives (or until it is released).
The key layout is in ``keys``; the acquire's txn in ``acquiring``; the connection
(members, failover, the calls) in ``connection``; waiters' queues in ``waiting``; breaking
in ``breaks``; the run ledger in ``ledger``; ``doctor`` in ``doctor``.

Modes: shared holders each take a slot of their own under ``K NUL 0/`` (never the lock
key), so an exclusive acquire is "no key of K at all" and a shared one "no lock key and no
other limit's key": one compare each in the same txn. Queue places carry their class
(front or normal, shared or exclusive, supersede or plain) in their names, so the txn's
compares say who is ahead of whom; ``--supersede`` deletes the older supersede places when
it joins (see ``waiting``).

Clocks: etcd has no clock a client can read but the HTTP ``Date`` header of its replies
(the member's wall clock, whole seconds, cut down). ``last_success`` answers that of its
reply as "now", and a success's start there is the ``Date`` of its acquisition's reply:
both on the member's clock, so hosts with skewed clocks agree on a ``--once-per``
window. Cut down to whole seconds, a time stays in its window exactly when the window's
length is whole seconds (its bounds are then whole seconds too); else within 1 s.

Round trips: acquire = 1 (the lease grant with a client-chosen ID and the ``txn`` that
creates the slot's key only if absent, with the lease attached, are pipelined on one
connection: grant, then txn, without waiting in between; a refused acquire keeps its lease
for the next, which keeps it alive the same way, or, kept alive under
``store.SPARE_FRESH_S`` ago, attaches it as it is: a woken waiter's acquire is then the txn
alone, its holder's deadline counting from that keepalive, ``lease_age``; the slots are
tried in order by txns nested in the failure branch of the one before, and where none was
free the txn reads the holders back). A limit over SLOTS_PER_TXN whose first slots are all
held takes one more txn per SLOTS_PER_TXN slots (etcd bounds the ops of a txn, nested ones
counted in). Renew = 1 (lease keepalive: it fails once the lease was revoked, which is what
release, forced release and break do). Release = 1 (a ``txn`` guarded by the owner's value
and the fencing token deletes the slot's keys; the emptied lease runs out on its own, since
a revoke could report a release that a break had just moved away from it). ``keep_for``,
break and forced release take 2-4 per slot.

Leases have whole seconds, and etcd raises short ones to its minimum (1 s at least; 2 s
with the default election timeout); the granted TTL is used for ``expires_at``. A lease
also runs out up to ~0.5 s late (etcd's leader checks expiries twice a second). A TTL
under the granted one is still safe for the holder: its own deadline counts the TTL asked.
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
