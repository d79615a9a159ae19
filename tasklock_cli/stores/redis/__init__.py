"""Redis store: Redis's own TTLs decide expiry; the fencing counter lives as long as Redis's data.

Key layout, per lock key ``K`` under the namespace prefix ``P`` (``prefix=`` in the URL,
default ``tasklock:``)::

    P{K}:lease     hash  owner, fencing_token, holder (JSON), acquired_at, expires_at (ms)
                         with a PX TTL: the lease exists exactly while it is live; a plain
                         lock's, or slot 0 of a semaphore (which adds slot and limit), or
                         of shared holders (which add slot and ``mode`` = shared; no mode
                         field is exclusive, as an older tasklock's leases are)
    P{K}:lease:N   hash  slot N > 0 of a semaphore (``run --limit``) or of shared holders
                         (``run --shared``, unbounded), as slot 0's
    P{K}:limit     string  how many slots to look at: a semaphore's limit, or one past the
                           highest live shared slot, with a PX at least as late as the
                           expiry of its last live slot (see ``scripts``); none for a plain
                           lock or a lone shared holder in slot 0. An older tasklock reads
                           it as a limit and so sees every shared holder
    P{K}:fence     string  the per-key fencing counter (INCR); never given a TTL, never
                           deleted by release, expiry, sweep or force release
    P{K}:wake      list  an element per release while a slot is free after it: a waiter's
                         BLPOP takes it, so each release wakes exactly one waiter (the one
                         waiting longest); an acquire that fills the key deletes it, and it
                         expires by itself
    P{K}:queue     zset  the waiters' places, scored in arrival order (``--replace``'s
                         ahead of all): a waiter's owner token
    P{K}:waiters   hash  owner token -> 'expires_ms since_ms holder_json' of its place, the
                         holder with its mode and ``--supersede`` flag; the acquire script
                         joins, keeps and leaves places and drops the ones that ran out; a
                         release wakes the head on P{K}:wake:<owner>, or the run of shared
                         waiters at the head on theirs
    P{K}:superseded  hash  owner token -> expires_ms: the places a newer ``--supersede``
                           waiter took out of the queue (see ``queue``)
    P{K}:runs      zset  the run ledger: one JSON record per run, scored by its fencing
                         token; written by the release script, which trims it to the last
                         LEDGER_KEEP runs
    P{K}:success   string  the newest run that succeeded, as in the ledger: put by the same
                           release script, apart from the trim (``--once-per``, ``metrics``)

And per namespace::

    P{}:epoch      hash  the failover epoch record (see ``epochs``): replid, run_id, epoch,
                         quarantine_until, max_ttl; never given a TTL

A break marks a lease hash's owner ``broken:<owner>`` (see base) and PUBLISHes to
``P{K}:broken:<fencing token>``, which the lease's holder, waiting for a break, is
subscribed to on a connection of its own; a forced release deletes the hash, wakes a
waiter and PUBLISHes the same.

A lease hash without a PX (no tasklock writes one: it would never run out) is given one by
``release --force`` (before breaking it) and ``sweep``: the longest a holder's lease could
still be valid, ``model.unreadable_expiry_bound`` of the epoch record's max_ttl; and an
``expires_at`` that is not a time is written from the PX (scripts' ``bound_expiry``).

``K`` is stored exactly (no hashing, no truncation). The ``{...}`` hash tag keeps a lease
and its counter in one Redis Cluster slot (except for keys starting with ``}``, whose tag is
empty). Every mutation is one Lua script (EVALSHA, reloaded on NOSCRIPT) that checks the
owner token and takes its times from Redis's ``TIME``, never the client's clock.

Durability: ``FLUSHALL``/``FLUSHDB`` or a restart without persistence empties the
counters, and tokens issued before can be issued again, unless the namespace's next
acquire comes within the quarantine floor of the server's start (see ``epochs``). ``doctor``
warns about the settings that matter (AOF with ``appendfsync everysec|always``,
``maxmemory-policy noeviction``, replicas without ``wait_replicas=`` or
``min-replicas-to-write``).

Failover (``epochs``): a primary that lost the last writes -- a promoted replica, or a
restarted primary -- has another ``master_replid`` (or ``run_id``) than the one the
namespace's epoch record names. The acquire script reads them (``INFO`` inside the script:
still one round trip) and, on a change, starts epoch E = max(E_before + 1, TIME seconds),
with a quarantine Q = max(max_ttl, 30 s) + 2 s during which no acquire in the namespace
succeeds; tokens are max(counter + 1, E << 30). Why no two holders overlap:

- A holder H on the old primary runs only until its client-side deadline: its TTL counted
  from the *send* of its last acknowledged acquire or renewal (``LeaseKeeper``); its guard
  ends its tree before then when a renewal fails or is rejected.
- Assumption: the old primary acknowledges nothing once the new one took over. It holds
  with ``wait_replicas=N``, N = every replica that can be promoted: acquires and renewals
  wait for N replicas (``WAIT``, pipelined with the script), one that fewer confirm counts
  as failed, and after a promotion the old primary has fewer than N. It holds with the
  servers' ``min-replicas-to-write`` >= 1 and ``min-replicas-max-lag`` below the failover's
  detection time (the old primary refuses writes first). It does *not* hold otherwise: an
  old primary that was paused or partitioned and comes back still takes itself for the
  primary and acknowledges renewals, keeping H alive beside a new holder (split brain,
  unbounded while it lasts; README says so, ``doctor`` warns).
- Under that assumption, H's last acknowledgement came before the promotion, so before
  the first acquire on the new primary that notices the change; the quarantine starts at
  that acquire. So H's deadline <= quarantine start + H's TTL.
- H's TTL <= the namespace's max_ttl as the new primary knows it, or <= 30 s: the
  quarantine, max(max_ttl, 30 s) + 2 s, so outlasts H's deadline (the 2 s cover the
  servers' clock rates and H's send time). Not covered: a TTL above both, first used in the
  writes the replica missed (``wait_replicas=`` closes this; README says so).
- A lease that survived on the new primary is held there as before: nobody else takes it,
  and its renewals (not quarantined) keep it; one that did not survive is missing or
  expired there, so H's next renewal is rejected (LeaseLost, exit 70).
- Every token the old primary issued is < (E_old + 1) << 30 <= E << 30 (fewer than 2^30
  acquisitions per key per epoch), so tokens after the change are greater than all before,
  received by the new primary or not. (E > E_old: from the record, or, when the new
  primary missed E_old's start as well, from TIME, provided the two starts are more than a
  second apart on clocks in step.) E stays below 2^33: tokens <= 2^63 - 1.
- A missing record is a fresh namespace unless ``master_replid2`` is set (the server took
  over from another primary), or the server started less than the quarantine floor
  (32 s) ago (a restart without persistence may have lost the record): then its first
  acquire starts an epoch too.

Companions: ``scripts`` (the Lua), ``epochs`` (the failover rule), ``connection`` (URL,
pool, errors), ``sentinel`` (Sentinel URLs), ``keys`` (names), ``queue`` (the waiters'
places and who a release wakes), ``waiting`` (the wake lists), ``breaks`` (break watches),
``doctor``.
"""

from __future__ import annotations

from tasklock_cli.stores.registry import Driver
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
