"""Redis store: Redis's own TTLs decide expiry; the fencing counter lives as long as Redis's data.

Key layout, per lock key ``K`` under the namespace prefix ``P`` (``prefix=`` in the URL,
default ``tasklock:``)::

    P{K}:lease        hash    slot 0: a plain lock, or slot 0 of a semaphore or shared holders.
    P{K}:lease:N      hash    slot N > 0 of a semaphore or of shared holders.
    P{K}:limit        string  how many slots to look at.
    P{K}:fence        string  the per-key fencing counter (INCR).
    P{K}:wake         list    an element per release while a slot is free after it.
    P{K}:queue        zset    the waiters' places, in arrival order.
    P{K}:waiters      hash    owner token -> 'expires_ms since_ms holder_json' of its place.
    P{K}:superseded   hash    owner token -> expires_ms of a place taken out of the queue.
    P{K}:runs         zset    the run ledger: one JSON record per run.
    P{K}:success      string  the newest run that succeeded.

The keys in detail:

- ``P{K}:lease`` holds owner, fencing_token, holder (JSON), acquired_at and expires_at (ms).
  It has a PX TTL, so the lease exists exactly while it is live.
  It is a plain lock's lease, or slot 0 of a semaphore, or slot 0 of shared holders.
  A semaphore's slot adds the fields slot and limit.
  A shared holder's slot adds slot and ``mode`` = shared.
  No mode field means exclusive, as in an older tasklock's leases.
- ``P{K}:lease:N`` is slot N > 0 of a semaphore (``run --limit``) or of shared holders
  (``run --shared``, unbounded).
  It has the same fields as slot 0.
- ``P{K}:limit`` is a semaphore's limit, or one past the highest live shared slot.
  Its PX is at least as late as the expiry of its last live slot (see ``scripts``).
  A plain lock has none, and neither has a lone shared holder in slot 0.
  An older tasklock reads it as a limit, and so it sees every shared holder.
- ``P{K}:fence`` is never given a TTL.
  Release, expiry, sweep and force release never delete it.
- ``P{K}:wake`` is taken by a waiter's BLPOP, one element at a time.
  So each release wakes exactly one waiter: the one waiting longest.
  An acquire that fills the key deletes the list, and the list expires by itself.
- ``P{K}:queue`` scores each waiter's owner token in arrival order.
  ``--replace``'s places come ahead of all.
- ``P{K}:waiters`` keeps each place's holder with its mode and ``--supersede`` flag.
  The acquire script joins, keeps and leaves places, and drops the ones that ran out.
  A release wakes the head on ``P{K}:wake:<owner>``, or the run of shared waiters at the
  head on theirs.
- ``P{K}:superseded`` holds the places that a newer ``--supersede`` waiter took out of the
  queue (see ``queue``).
- ``P{K}:runs`` scores each run's record by its fencing token.
  The release script writes it and trims it to the last LEDGER_KEEP runs.
- ``P{K}:success`` is the newest run that succeeded, as in the ledger.
  The same release script puts it, but the trim does not touch it.
  ``--once-per`` and ``metrics`` read it.

And per namespace::

    P{}:epoch      hash  the failover epoch record (see ``epochs``).

The epoch record holds replid, run_id, epoch, quarantine_until and max_ttl.
It is never given a TTL.

A break marks a lease hash's owner ``broken:<owner>`` (see base).
It also PUBLISHes to ``P{K}:broken:<fencing token>``.
The lease's holder, while it waits for a break, is subscribed to that channel on a
connection of its own.
A forced release deletes the hash, wakes a waiter and PUBLISHes the same.

No tasklock writes a lease hash without a PX: it would never run out.
If one is found anyway, ``release --force`` (before breaking it) and ``sweep`` give it one.
That PX is the longest the holder's lease could still be valid:
``model.unreadable_expiry_bound`` of the epoch record's max_ttl.
An ``expires_at`` that is not a time is written from the PX (``bound_expiry`` in ``scripts``).

``K`` is stored exactly (no hashing, no truncation).
The ``{...}`` hash tag keeps a lease and its counter in one Redis Cluster slot.
Keys starting with ``}`` are the exception: their tag is empty.
Every mutation is one Lua script (EVALSHA, reloaded on NOSCRIPT).
The script checks the owner token.
It takes its times from Redis's ``TIME``, never the client's clock.

Durability: ``FLUSHALL``/``FLUSHDB`` or a restart without persistence empties the counters.
Tokens issued before can then be issued again.
The exception is when the namespace's next acquire comes within the quarantine floor of the
server's start (see ``epochs``).
``doctor`` warns about the settings that matter:

- AOF with ``appendfsync everysec|always``;
- ``maxmemory-policy noeviction``;
- replicas without ``wait_replicas=`` or ``min-replicas-to-write``.

Failover (``epochs``): a primary may have lost the last writes.
It is a promoted replica, or a restarted primary.
Such a primary has another ``master_replid`` (or ``run_id``) than the one the namespace's
epoch record names.
The acquire script reads them with ``INFO`` inside the script, so it is still one round trip.
On a change, it starts epoch E = max(E_before + 1, TIME seconds).
A quarantine Q = max(max_ttl, 30 s) + 2 s follows.
During it no acquire in the namespace succeeds.
Tokens are max(counter + 1, E << 30).

Why no two holders overlap:

- A holder H on the old primary runs only until its client-side deadline.
  That deadline is its TTL counted from the *send* of its last acknowledged acquire or
  renewal (``LeaseKeeper``).
  Its guard ends its tree before then when a renewal fails or is rejected.
- Assumption: the old primary acknowledges nothing once the new one took over.

  - It holds with ``wait_replicas=N``, N = every replica that can be promoted.
    Acquires and renewals then wait for N replicas (``WAIT``, pipelined with the script).
    One that fewer replicas confirm counts as failed.
    After a promotion the old primary has fewer than N.
  - It holds with the servers' ``min-replicas-to-write`` >= 1 and ``min-replicas-max-lag``
    below the failover's detection time.
    Then the old primary refuses writes first.
  - It does *not* hold otherwise.
    An old primary that was paused or partitioned may come back.
    It still takes itself for the primary and acknowledges renewals.
    That keeps H alive beside a new holder: split brain, unbounded while it lasts.
    README says so, and ``doctor`` warns.

- Under that assumption, H's last acknowledgement came before the promotion.
  So it came before the first acquire on the new primary that notices the change.
  The quarantine starts at that acquire.
  So H's deadline <= quarantine start + H's TTL.
- H's TTL <= the namespace's max_ttl as the new primary knows it, or <= 30 s.
  So the quarantine, max(max_ttl, 30 s) + 2 s, outlasts H's deadline.
  The 2 s cover the servers' clock rates and H's send time.
  Not covered: a TTL above both, first used in the writes the replica missed.
  ``wait_replicas=`` closes this gap; README says so.
- A lease that survived on the new primary is held there as before.
  Nobody else takes it, and its renewals (not quarantined) keep it.
  A lease that did not survive is missing or expired there.
  So H's next renewal is rejected (LeaseLost, exit 70).
- Every token the old primary issued is < (E_old + 1) << 30 <= E << 30.
  This holds with fewer than 2^30 acquisitions per key per epoch.
  So tokens after the change are greater than all before, received by the new primary or not.
- E > E_old.
  E comes from the record.
  When the new primary missed E_old's start as well, E comes from TIME.
  That works provided the two starts are more than a second apart on clocks in step.
- E stays below 2^33, so tokens <= 2^63 - 1.
- A missing record is a fresh namespace, with two exceptions.
  In either, the server's first acquire starts an epoch too:

  - ``master_replid2`` is set: the server took over from another primary.
  - The server started less than the quarantine floor (32 s) ago.
    A restart without persistence may have lost the record.

Companions:

- ``scripts``: the Lua.
- ``epochs``: the failover rule.
- ``connection``: URL, pool, errors.
- ``sentinel``: Sentinel URLs.
- ``keys``: names.
- ``queue``: the waiters' places and who a release wakes.
- ``waiting``: the wake lists.
- ``breaks``: break watches.
- ``doctor``.
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
