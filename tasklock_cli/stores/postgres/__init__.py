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

A semaphore (``run --limit N``) has a row per slot; a plain lock is slot 0 of limit 1.
Shared holders (``run --shared``) each hold a slot of their own (0, 1, ...) under limit 1.
Each key also has a counter row (slot -1, never a lease) holding the last fencing token
issued in any of its slots: acquirers of a key queue on it within their statement, so
two of them never issue the same token. A table from before semaphores (one row per
key) is migrated on first use: its rows become slot 0 of limit 1; so is one from before
lock modes (its leases and places become exclusive, as an older tasklock's stay).

The table also holds its failover epoch row (key ``''``, slot -2, never a lease: see
``epochs``).

A lease whose ``expires_at`` cannot be read (NULL, ``infinity``, after the year 9999: no
tasklock writes one) is never judged expired; ``sweep`` and ``release --force`` give it
``clock_timestamp()`` + ``model.unreadable_expiry_bound`` of the epoch row's max_ttl, past
which no holder's lease can be valid (its last renewal was before now, for at most that).

Rows are never deleted: release, sweep and force release clear the owner, so the per-key
fencing counter survives them. Every lease statement is a single autocommit statement
timed with ``clock_timestamp()`` on the server, under READ COMMITTED (forced per
connection); serialization failures and deadlocks are retried here and never surface.

Waiting runs queue in a second table beside it (``<table>_waiters``: a row per waiter,
served in ``seq`` order, live until its ``expires_at``, with its mode, whether it
supersedes and whether it was superseded): the acquire statement takes a slot only when
the places ahead of the caller allow it (fewer than the free slots; for a shared caller,
only shared ones), and joins, keeps or leaves the caller's place in the same statement
(see ``queue``). ``front`` places get a negative ``seq``, ahead of every other.

Releases wake the waiters they may admit: release, force release and sweep ``pg_notify``
one channel per table (named after the table's oid), inside the same statement; a
release names by their places the head of the queue and, when it is shared, the shared
places after it up to the first exclusive one (the key itself when nobody queues); a
forced release and a sweep the key. A superseded waiter is woken by name too. A waiter
LISTENs, then asks whether the key is free for it and for how long (so a release between
its failed acquire and the LISTEN is not missed), then waits for a notification naming
its place or the key, or that expiry. A waiter's acquire is one simple query: UNLISTEN,
then the acquire.

Holders hear of a break the same way: a break or forced release ``pg_notify``s the key's
break channel (``tasklock_broken_<table oid>_<md5 of key>``) with the fencing token as
payload, in its statement; a holder waiting for a break LISTENs on it on a connection of
its own (one per lease, kept until release), which it selects on. A broken lease keeps
its row, its owner token prefixed with ``broken:`` (see base).

A new connection (every ``tasklock run`` opens one) costs the connect and one round trip
of set-up: the session settings, the statement timeout and the look at the table go in
one simple query.

Every call is bounded by the I/O timeout (``set_io_timeout``): ``statement_timeout`` on
the server, TCP keepalives and ``tcp_user_timeout`` on the socket, and a watchdog that
shuts the socket down when the server does not answer at all (a hung or cut-off host).
A broken connection is dropped and the next call opens a new one. Sockets are
close-on-exec, so a child never inherits them.

Failover epochs (``epochs``). A promoted asynchronous standby may lack the last leases,
renewals and tokens its primary granted. The table's epoch row records the server it was
written on; the acquire statement compares it with the server it runs on and, when they
differ, starts a new epoch: no lease is granted in the table until ``quarantine_until``,
and every token is at least ``epoch << 30``. The server's identity is its system
identifier and its current WAL timeline, ``SYSTEM:TIMELINE``, with the time it last
started beside it (``pg_postmaster_start_time()``), because:

- the timeline changes at promotion (and at a point-in-time restore), and the one in the
  name of the current WAL file (``pg_walfile_name(pg_current_wal_lsn())``) is the new one
  as soon as the promoted server takes writes. ``pg_control_checkpoint()``'s timeline is
  not: it changes at the first checkpoint after the promotion, which is spread out; with
  dirty buffers it still said 1 more than ten seconds after the server took writes on
  timeline 2 (measured on PostgreSQL 15);
- the system identifier (``pg_control_system()``) is shared by a physical standby and its
  primary, and tells another cluster behind the same host name (a ``pg_upgrade``, a copy);
- neither changes when a base backup or a disk snapshot is started as it is (crash
  recovery, no ``recovery.signal``): it runs on, on the same timeline, without the writes
  made after it was taken (measured: tokens up to 6, then 3 again). Its start time is new,
  so every start is a new epoch: a plain restart too, which quarantines once (as a
  restarted Redis, whose replication id changes). An old primary started again after a
  failover starts its own epoch the same way;
- all are public (PostgreSQL 10 or later), and are read in the acquire statement itself
  (one round trip per acquire, as before): the start time costs about 0.2 µs. On a standby
  they are not read (the WAL functions raise there; the statement's write fails as
  read-only, as it always did). A server that refuses one (no EXECUTE, a managed service)
  is a configuration error naming it.

Why no second holder runs while a holder of the old primary may still run:

- A holder H of a lease with TTL T, whose last renewal (or acquire) the old primary P
  answered was sent at s, ends its tree before s + T on its own monotonic clock, whatever
  any server says (the client-side deadline every store relies on), or earlier when a
  renewal is rejected.
- P answered that renewal before it stopped, and the promoted standby S takes its first
  write after P stopped (a failover promotes a standby once its primary is gone; a split
  brain, with P still taking writes, is not covered). So s comes before S's first acquire,
  at A on S's clock.
- That acquire finds the identity changed and sets ``quarantine_until`` = A + Q, with
  Q = max(``max_ttl``, 30 s) + 2 s. Acquires racing it start no second epoch (the row is
  written on its latest version; a statement whose snapshot saw it stale runs again) and
  grant nothing. Renewals and releases are not held up: a lease S has is H's to keep.
- So H's tree is gone by s + T < A + T <= A + Q - 2 s whenever T <= max(``max_ttl``,
  30 s). The 2 s margin covers the two servers' clocks and H's clock running at slightly
  different rates over Q, and the time from S's clock reading to the end of the statement.
- ``max_ttl`` is raised by the acquire that asks for a longer TTL, in the statement (so the
  commit) that grants that lease: a standby that has a lease has its TTL. A lease S never
  received is covered when its TTL <= max(30 s, the ``max_ttl`` S has); the first lease
  with a longer TTL than any before, granted within the replication lag, is not.
- Renewals S missed leave it an older ``expires_at``: such a lease may look expired on S
  before H's deadline, still within the quarantine by the same argument.
- H's next renewal on S matches no row: LeaseLost, its tree ends, exit 70 (about 1.3 s
  after the promotion in the failover test, with ``--ttl 6s``).

Why tokens never go back: the tokens of epoch e count up from ``e << 30``, and the next
epoch is e' = max(e + 1, the server's clock in seconds), so they stay below its first,
``e' << 30``, while the key issues fewer than (e' - e) * 2**30 tokens in epoch e: never
fewer than 2**30, and about 2**30 more for every second between the two epochs' starts
(epoch 0, a table that never saw a change, keeps the tokens it always had, and its next
epoch is the clock). A promoted standby may have missed the start of the old primary's last
epoch e (its row still says an earlier one): that epoch issued its first token only after
its quarantine, at least 32 s after it began at its clock reading e, so the standby's new
epoch (the clock, later still) is above e as long as the two servers' clocks are less than
30 s apart. Tokens stay below 2**63 while the clock is below 2**33 s (the year 2242).

A synchronous standby (``synchronous_commit`` on, ``synchronous_standby_names`` naming it)
has every lease its primary granted, so its holders run on; the quarantine still applies
once to new leases. Skipping it would need the new primary to prove that it confirmed every
lease and renewal of the old one, which it cannot: a quorum (``ANY``) setting, a commit
whose wait for the standby was cancelled (the statement timeout: the commit then stands
locally, with a warning), a role with ``synchronous_commit = local``.

The epoch row is written with the table (``tasklock init`` or first use), in one
transaction; a table created within the replication lag before a failover is missing on
the new primary, which creates it afresh: tokens start over. An acquire that finds no
epoch row in a table holding other rows (from before epochs; or a standby that missed the
row's first write, promoted; or a table restored to before it) cannot tell a lost row
from one never written: it starts a new epoch, above the epoch of every token in the
table, with a quarantine of 32 s (Redis does the same when ``master_replid2`` is set).

The parts live beside this module, which keeps the lease statements and the store
interface: ``queue`` (the acquire statement and the queues), ``connection`` (the
connection and its bounds), ``schema``
(the tables, their creation and migration), ``epochs`` (the failover epoch row),
``waiting`` (LISTEN and the wake-ups), ``breaks`` (break listeners) and ``doctor``.
"""

from __future__ import annotations

from tasklock_cli.stores.registry import Driver
from tasklock_cli.util.lazy import import_on_first_use

TITLE = "postgresql"
SCHEMES = ("postgresql", "postgres")
URL_FORM = "postgresql://..."
DRIVER = Driver("psycopg", "psycopg[binary]>=3.1")
#: ``PostgresStore`` is imported on first use: a companion module never brings the driver.
__getattr__ = import_on_first_use(__name__, "store", "PostgresStore")
__all__ = ["PostgresStore"]
