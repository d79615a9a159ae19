"""PostgreSQL store (psycopg 3): the server's clock decides expiry.

One table (``table=`` in the URL, default ``tasklock_leases``, ``schema.table`` allowed)::

    key            text COLLATE "C"     -- the exact key, never hashed
    slot           integer              -- 0..limit-1; -1: the key's fencing counter
    slot_limit     integer              -- the limit its holder asked for (1: a plain lock)
    fencing_token  bigint NOT NULL      -- only ever increases
    owner_token    text                 -- NULL when free
    holder         jsonb
    acquired_at    timestamptz
    expires_at     timestamptz
    mode           text                 -- 'exclusive' (the default) or 'shared'
    PRIMARY KEY (key, slot)

Rows and slots:

- A semaphore (``run --limit N``) has a row per slot.
- A plain lock is slot 0 of limit 1.
- Shared holders (``run --shared``) each hold a slot of their own (0, 1, ...) under limit 1.
- Each key also has a counter row (slot -1, never a lease).
  It holds the last fencing token issued in any of the key's slots.
  Acquirers of a key queue on it within their statement.
  So two of them never issue the same token.
- The table also holds its failover epoch row (key ``''``, slot -2, never a lease).
  See ``epochs``.

Older tables are migrated on first use:

- A table from before semaphores has one row per key.
  Its rows become slot 0 of limit 1.
- A table from before lock modes is migrated too.
  Its leases and places become exclusive, as an older tasklock's stay.

No tasklock writes a lease whose ``expires_at`` cannot be read.
Such a value is NULL, ``infinity``, or after the year 9999.
A lease with one is never judged expired.
``sweep`` and ``release --force`` give it ``clock_timestamp()`` +
``model.unreadable_expiry_bound`` of the epoch row's max_ttl.
Past that time no holder's lease can be valid.
Its last renewal was before now, and lasted at most that long.

Rows are never deleted.
Release, sweep and force release clear the owner, so the per-key fencing counter survives
them.
Every lease statement is a single autocommit statement.
It is timed with ``clock_timestamp()`` on the server.
It runs under READ COMMITTED, which is forced per connection.
Serialization failures and deadlocks are retried here and never surface.

Waiting runs queue in a second table beside it, ``<table>_waiters`` (see ``queue``):

- It has a row per waiter, served in ``seq`` order.
- A row is live until its ``expires_at``.
- A row records its waiter's mode, whether it supersedes and whether it was superseded.
- The acquire statement takes a slot only when the places ahead of the caller allow it.
  They must be fewer than the free slots.
  For a shared caller, they must be shared ones only.
- The same statement joins, keeps or leaves the caller's place.
- ``front`` places get a negative ``seq``, ahead of every other.

Releases wake the waiters they may admit:

- Release, force release and sweep ``pg_notify`` one channel per table, inside the same
  statement.
  The channel is named after the table's oid.
- A release names the head of the queue by its place.
  When the head is shared, it also names the shared places after it, up to the first
  exclusive one.
  When nobody queues, it names the key itself.
- A forced release and a sweep name the key.
- A superseded waiter is woken by name too.
- A waiter LISTENs, then asks whether the key is free for it and for how long.
  So a release between its failed acquire and the LISTEN is not missed.
  Then it waits for a notification naming its place or the key, or for that expiry.
- A waiter's acquire is one simple query: UNLISTEN, then the acquire.

Holders hear of a break the same way:

- A break or forced release ``pg_notify``s the key's break channel, in its statement.
  The channel is ``tasklock_broken_<table oid>_<md5 of key>``.
  The payload is the fencing token.
- A holder waiting for a break LISTENs on it on a connection of its own, and selects on it.
  There is one such connection per lease, kept until release.
- A broken lease keeps its row.
  Its owner token is prefixed with ``broken:`` (see base).

A new connection costs the connect and one round trip of set-up.
Every ``tasklock run`` opens one.
The session settings, the statement timeout and the look at the table go in one simple
query.

Every call is bounded by the I/O timeout (``set_io_timeout``):

- ``statement_timeout`` on the server;
- TCP keepalives and ``tcp_user_timeout`` on the socket;
- a watchdog that shuts the socket down when the server does not answer at all (a hung or
  cut-off host).

A broken connection is dropped, and the next call opens a new one.
Sockets are close-on-exec, so a child never inherits them.

Failover epochs (``epochs``).
A promoted asynchronous standby may lack the last leases, renewals and tokens its primary
granted.
The table's epoch row records the server it was written on.
The acquire statement compares it with the server it runs on.
When they differ, it starts a new epoch:

- no lease is granted in the table until ``quarantine_until``;
- every token is at least ``epoch << 30``.

The server's identity is its system identifier and its current WAL timeline,
``SYSTEM:TIMELINE``.
The time it last started (``pg_postmaster_start_time()``) is kept beside it.
The reasons:

- The timeline changes at promotion, and at a point-in-time restore.
  The timeline in the name of the current WAL file
  (``pg_walfile_name(pg_current_wal_lsn())``) is the new one as soon as the promoted
  server takes writes.
- ``pg_control_checkpoint()``'s timeline is not.
  It changes at the first checkpoint after the promotion, which is spread out.
  With dirty buffers it still said 1 more than ten seconds after the server took writes on
  timeline 2 (measured on PostgreSQL 15).
- The system identifier (``pg_control_system()``) is shared by a physical standby and its
  primary.
  It tells another cluster behind the same host name (a ``pg_upgrade``, a copy).
- Neither changes when a base backup or a disk snapshot is started as it is (crash
  recovery, no ``recovery.signal``).
  Such a copy runs on, on the same timeline, without the writes made after it was taken.
  Measured: tokens up to 6, then 3 again.
- The start time of such a copy is new, and it starts by crash recovery.
  So a start by crash recovery is a new epoch, quarantined until the quarantine's length
  after the start (the copy's lost leases were granted before it).
  A start after a clean shutdown loses nothing and is no new epoch.
  The two are told apart by the cumulative statistics, which crash recovery discards: their
  reset time is then after the start (``CLEAN_START``).
  A copy of a cleanly stopped data directory looks like a clean restart (README says so).
  An old primary started again after a failover starts its own epoch when it starts by
  crash recovery.
- All of them are public (PostgreSQL 10 or later).
  They are read in the acquire statement itself, so there is still one round trip per
  acquire.
  The start time costs about 0.2 µs.
- On a standby they are not read: the WAL functions raise there.
  The statement's write fails as read-only, as it always did.
- A server that refuses one of them (no EXECUTE, a managed service) is a configuration
  error naming it.

Why no second holder runs while a holder of the old primary may still run:

- Take a holder H of a lease with TTL T.
  Its last renewal (or acquire) that the old primary P answered was sent at s.
  H ends its tree before s + W, W = min(T, 30 s), on its own monotonic clock, whatever any
  server says (``Store.failover_window``: the store's TTL is still T).
  That is the client-side deadline every store relies on, nearer for long TTLs.
  H ends it earlier when a renewal is rejected.
- P answered that renewal before it stopped.
  The promoted standby S takes its first write after P stopped.
  A failover promotes a standby once its primary is gone.
  A split brain, with P still taking writes, is not covered.
  So s comes before S's first acquire, at A on S's clock.
- That acquire finds the identity changed.
  It sets ``quarantine_until`` = A + Q, with Q = max(``max_ttl``, 30 s) + 2 s.
- Acquires racing it start no second epoch, and grant nothing.
  The row is written on its latest version.
  A statement whose snapshot saw it stale runs again.
- Renewals and releases are not held up: a lease S has is H's to keep.
- So H's tree is gone by s + W < A + W <= A + Q - 2 s, as W <= 30 s, whatever T.
- The 2 s margin covers two things.
  One is the two servers' clocks and H's clock running at slightly different rates over Q.
  The other is the time from S's clock reading to the end of the statement.
- ``max_ttl`` is raised by the acquire that asks for a longer TTL.
  It is raised in the statement (so the commit) that grants that lease.
  So a standby that has a lease has its TTL.
- A lease S never received is covered whatever its TTL, as W <= 30 s.
  (Before the window, the first lease with a longer TTL than any before, granted within
  the replication lag, was not: issue 46.)
- Renewals S missed leave it an older ``expires_at``.
  Such a lease may look expired on S before H's deadline.
  By the same argument, that is still within the quarantine.
- H's next renewal on S matches no row: LeaseLost, its tree ends, exit 70.
  In the failover test, with ``--ttl 6s``, that is about 1.3 s after the promotion.

Why tokens never go back:

- The tokens of epoch e count up from ``e << 30``.
- The next epoch is e' = max(e + 1, the server's clock in seconds).
- So epoch e's tokens stay below the first token of epoch e', ``e' << 30``.
  This holds while the key issues fewer than (e' - e) * 2**30 tokens in epoch e.
  That is never fewer than 2**30.
  It is about 2**30 more for every second between the two epochs' starts.
- Epoch 0, a table that never saw a change, keeps the tokens it always had.
  Its next epoch is the clock.
- A promoted standby may have missed the start of the old primary's last epoch e.
  Its row then still says an earlier one.
  Epoch e issued its first token only after its quarantine.
  That was at least 32 s after it began, at its clock reading e.
  The standby's new epoch is the clock, later still.
  So it is above e as long as the two servers' clocks are less than 30 s apart.
- Tokens stay below 2**63 while the clock is below 2**33 s (the year 2242).

A synchronous standby has every lease its primary granted.
Such a standby has ``synchronous_commit`` on and ``synchronous_standby_names`` naming it.
Its holders run on.
The quarantine still applies once to new leases.
Skipping it would need the new primary to prove that it confirmed every lease and renewal
of the old one.
It cannot, because of:

- a quorum (``ANY``) setting;
- a commit whose wait for the standby was cancelled (the statement timeout);
  the commit then stands locally, with a warning;
- a role with ``synchronous_commit = local``.

The epoch row is written with the table, in one transaction.
That happens at ``tasklock init`` or at first use.
A table created within the replication lag before a failover is missing on the new primary.
The new primary creates it afresh, and tokens start over.

An acquire may find no epoch row in a table holding other rows.
The table may be from before epochs.
It may be on a promoted standby that missed the row's first write.
It may be restored to before it.
The acquire cannot tell a lost row from one never written.
So it starts a new epoch, above the epoch of every token in the table.
The quarantine is 32 s.
Redis does the same when ``master_replid2`` is set.

The parts live beside this module, which keeps the lease statements and the store
interface:

- ``queue``: the acquire statement and the queues;
- ``connection``: the connection and its bounds;
- ``schema``: the tables, their creation and migration;
- ``epochs``: the failover epoch row;
- ``waiting``: LISTEN and the wake-ups;
- ``breaks``: break listeners;
- ``doctor``.
"""

from __future__ import annotations

from tasklock_cli.stores.failover import DEFAULT_TTL_S
from tasklock_cli.stores.model import WAITER_TTL_S
from tasklock_cli.stores.registry import Driver
from tasklock_cli.stores.traits import Capabilities
from tasklock_cli.util.lazy import import_on_first_use

TITLE = "postgresql"
SCHEMES = ("postgresql", "postgres")
URL_FORM = "postgresql://..."
DRIVER = Driver("psycopg", "psycopg[binary]>=3.1")
#: ``PostgresStore`` is imported on first use: a companion module never brings the driver.
__getattr__ = import_on_first_use(__name__, "store", "PostgresStore")
__all__ = ["PostgresStore"]
#: What the store can do, its class's traits (see ``traits.Capabilities``).
CAPABILITIES = Capabilities(
    signals_release=True,  # LISTEN/NOTIFY
    concurrent_release=False,
    waits_keep_places=False,
    byte_keys=False,  # text is UTF-8
    min_ttl=0.0,
    expiry_lag=0.0,
    waiter_ttl=WAITER_TTL_S,
    failover_window=DEFAULT_TTL_S,  # a promoted asynchronous standby may lack the last leases
)
