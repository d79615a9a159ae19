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

The parts live beside this module, which keeps the lease statements and the store
interface: ``queue`` (the acquire statement and the queues), ``connection`` (the
connection and its bounds), ``schema``
(the tables, their creation and migration), ``waiting`` (LISTEN and the wake-ups),
``breaks`` (break listeners) and ``doctor``.
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
