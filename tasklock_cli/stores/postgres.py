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
    PRIMARY KEY (key, slot)

A semaphore (``run --limit N``) has a row per slot; a plain lock is slot 0 of limit 1.
Each key also has a counter row (slot -1, never a lease) holding the last fencing token
issued in any of its slots: acquirers of a key queue on it within their statement, so
two of them never issue the same token. A table from before semaphores (one row per
key) is migrated on first use: its rows become slot 0 of limit 1.

Rows are never deleted: release, sweep and force release clear the owner, so the per-key
fencing counter survives them. Every lease statement is a single autocommit statement
timed with ``clock_timestamp()`` on the server, under READ COMMITTED (forced per
connection); serialization failures and deadlocks are retried here and never surface.

Releases wake waiters: release, force release and sweep ``pg_notify`` one channel per
table (named after the table's oid) with the key as payload, inside the same statement,
whichever slot they free. A waiter LISTENs, then asks whether the key is full and for how
long (so a release between its failed acquire and the LISTEN is not missed), then waits
for the notification or that expiry. Only a key's first waiter listens; the others queue
behind it on a session advisory lock (its "turn"). A waiter's acquire is one simple
query: UNLISTEN, then the acquire, which also ends the turn when it is granted.

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
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import math
import os
import random
import re
import socket
import threading
import time
from collections.abc import Callable
from collections.abc import Iterator
from datetime import datetime
from datetime import timezone
from typing import Any
from typing import TypeVar
from urllib.parse import unquote

import psycopg
import psycopg.errors as pgerr
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict
from psycopg.pq import TransactionStatus
from psycopg.types.json import Jsonb

from tasklock_cli.errors import ConfigError
from tasklock_cli.errors import LimitMismatch
from tasklock_cli.errors import StoreUnavailable
from tasklock_cli.errors import TasklockError
from tasklock_cli.stores.base import BROKEN_OWNER_PREFIX
from tasklock_cli.stores.base import LEDGER_KEEP
from tasklock_cli.stores.base import LIST_PAGE
from tasklock_cli.stores.base import BreakWatches
from tasklock_cli.stores.base import Holder
from tasklock_cli.stores.base import Lease
from tasklock_cli.stores.base import LeaseInfo
from tasklock_cli.stores.base import RunRecord
from tasklock_cli.stores.base import SocketBreakWatch
from tasklock_cli.stores.base import Store
from tasklock_cli.stores.base import StoreCheck
from tasklock_cli.stores.base import fd_readable
from tasklock_cli.stores.base import prefix_upper_bound
from tasklock_cli.stores.base import wait_readable
from tasklock_cli.stores.doctor import clock_check
from tasklock_cli.stores.urls import redact_url
from tasklock_cli.stores.urls import scrub
from tasklock_cli.stores.urls import url_passwords

DEFAULT_TABLE = "tasklock_leases"
DEFAULT_IO_TIMEOUT_S = 5.0
SWEEP_BATCH = 1000
SERIALIZATION_RETRIES = 5
#: How often an acquire runs again after losing a race (another acquire of the key
#: committed since its snapshot; each loss is another client's win).
ACQUIRE_RACE_RETRIES = 50
#: How often a waiter looks again at a key whose slots changed during its look.
STALE_LOOKS = 3
#: Longest slice a waiter holds the store's lock while waiting for a notification.
WAIT_SLICE_S = 0.1
#: Longest slice a waiter queues for its turn to listen (see ``wait_for_release``).
TURN_SLICE_S = 0.5
#: The same for a caller that passes a ``wake_fd``, looked at between slices.
TURN_SLICE_WAKE_FD_S = 0.05
#: Notification payloads are limited to 8000 bytes; longer keys are sent as md5(key).
MAX_PAYLOAD_KEY_BYTES = 7000

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_$]{0,62}")
_T = TypeVar("_T")
_EPOCH = datetime.fromtimestamp(0, tz=timezone.utc)

#: What a tasklock table looks like (column -> format_type()).
_COLUMNS = {
    "key": "text",
    "slot": "integer",
    "slot_limit": "integer",
    "fencing_token": "bigint",
    "owner_token": "text",
    "holder": "jsonb",
    "acquired_at": "timestamp with time zone",
    "expires_at": "timestamp with time zone",
}
#: The table before semaphores: one row per key (migrated by ``_migrate``).
_COLUMNS_BEFORE_SLOTS = {
    name: kind for name, kind in _COLUMNS.items() if name not in ("slot", "slot_limit")
}
#: The slot of the row that keeps a key's fencing counter (never a lease).
COUNTER_SLOT = -1

_DDL = """\
CREATE TABLE IF NOT EXISTS {table} (
    key           text COLLATE "C" NOT NULL,
    slot          integer NOT NULL DEFAULT 0,
    slot_limit    integer NOT NULL DEFAULT 1,
    fencing_token bigint NOT NULL,
    owner_token   text,
    holder        jsonb,
    acquired_at   timestamptz,
    expires_at    timestamptz,
    PRIMARY KEY (key, slot)
);
CREATE INDEX IF NOT EXISTS {index} ON {table} (expires_at) WHERE owner_token IS NOT NULL;
CREATE TABLE IF NOT EXISTS {runs} (
    key           text COLLATE "C" NOT NULL,
    fencing_token bigint NOT NULL,
    started_at    timestamptz NOT NULL,
    ended_at      timestamptz NOT NULL,
    data          jsonb NOT NULL,
    PRIMARY KEY (key, fencing_token)
);
"""
# From the table before semaphores (one row per key): its rows become slot 0 of limit 1
# and the unique key moves from (key) to (key, slot). Idempotent; a no-op on a current
# table or none. ``_migrate`` runs it under the schema lock; ``schema_sql`` prints it.
_MIGRATE_TO_SLOTS = """
DO $migrate$
DECLARE
    drop_old_key text;
BEGIN
    IF to_regclass({name}) IS NULL THEN
        RETURN;
    END IF;
    ALTER TABLE {table} ADD COLUMN IF NOT EXISTS slot integer NOT NULL DEFAULT 0,
                        ADD COLUMN IF NOT EXISTS slot_limit integer NOT NULL DEFAULT 1;
    FOR drop_old_key IN  -- every unique index on (key) alone, or its constraint
        SELECT CASE WHEN con.conname IS NULL
                    THEN format('DROP INDEX %s', i.indexrelid::regclass)
                    ELSE format('ALTER TABLE %s DROP CONSTRAINT %I', {name}, con.conname) END
          FROM pg_index i
          JOIN pg_attribute k ON k.attrelid = i.indrelid AND k.attnum = i.indkey[0]
          LEFT JOIN pg_constraint con ON con.conindid = i.indexrelid
                                     AND con.conrelid = i.indrelid
         WHERE i.indrelid = to_regclass({name}) AND i.indisunique AND i.indnatts = 1
           AND k.attname = 'key'
    LOOP
        EXECUTE drop_old_key;
    END LOOP;
    IF NOT EXISTS (SELECT FROM pg_index
                    WHERE indrelid = to_regclass({name}) AND indisprimary) THEN
        ALTER TABLE {table} ADD PRIMARY KEY (key, slot);
    END IF;
END
$migrate$;
"""

# One query: kind of relation, its columns, the columns of each unique index (as
# "a,b"), and whether the run ledger's table exists (parameters: the ledger's name, the
# table's).
_INSPECT = """
SELECT c.oid::bigint, c.relkind::text, to_regclass(%s) IS NOT NULL,
       (SELECT coalesce(json_object_agg(a.attname, format_type(a.atttypid, a.atttypmod)),
                        '{}'::json)
          FROM pg_attribute a
         WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped),
       ARRAY(SELECT string_agg(a.attname, ',' ORDER BY k.n)
               FROM pg_index i
              CROSS JOIN LATERAL unnest(i.indkey::int2[]) WITH ORDINALITY AS k(attnum, n)
               JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
              WHERE i.indrelid = c.oid AND i.indisunique AND i.indpred IS NULL
              GROUP BY i.indexrelid)
  FROM pg_class c
 WHERE c.oid = to_regclass(%s)
"""

# Every new connection's settings, sent with its first statement (``_open``). READ
# COMMITTED whatever the server's or role's default: every lease statement re-checks the
# row it locks, and never fails with 40001.
_SESSION_SETUP = (
    "SET default_transaction_isolation = 'read committed';"
    " SET TIME ZONE 'UTC';"
    " SET idle_in_transaction_session_timeout = '60s';"
    " SET statement_timeout = {timeout};"
)


class _Unset:
    """Not looked at yet (as opposed to None: looked at, and missing)."""


_UNSET = _Unset()

_PAYLOAD = (
    "CASE WHEN octet_length({col}) <= "
    + str(MAX_PAYLOAD_KEY_BYTES)
    + " THEN {col} ELSE md5({col}) END"
)
_CLEARED = "owner_token = NULL, holder = NULL, acquired_at = NULL, expires_at = NULL"
_INFO_COLUMNS = "key, slot, slot_limit, fencing_token, acquired_at, expires_at, holder"
_NEW_EXPIRY = "n.t + make_interval(secs => %(ttl)s::float8)"

# One statement, one clock reading (the takeover test and the new times agree exactly).
# Acquirers of a key queue on its counter row (slot -1): the upsert of ``counter`` locks
# it and bumps it only when it still holds what this statement's snapshot saw. When it
# does not, another acquire committed since the snapshot, and what ``seen`` shows of the
# slots may be out of date: nothing is taken and the outcome is 'lost' (the caller runs
# the statement again, on a new snapshot). A slot row is only ever taken when its latest
# version is free (ON CONFLICT ... WHERE), so a stale snapshot costs a retry, never a
# second holder. Outcomes: 'taken' (with the lease), 'mismatch' (with the live holders'
# limit), 'lost'; no row when every slot is held.
_ACQUIRE = f"""
WITH n AS (SELECT clock_timestamp() AS t),
seen AS (
    SELECT slot, slot_limit, fencing_token, owner_token, expires_at
      FROM {{table}} WHERE key = %(key)s
), live AS (
    SELECT s.slot, s.slot_limit FROM seen AS s, n
     WHERE s.slot >= 0 AND s.owner_token IS NOT NULL AND s.expires_at > n.t
), mine AS (
    SELECT slot FROM seen WHERE slot >= 0 AND owner_token = %(owner)s
), free AS (
    SELECT g AS slot FROM generate_series(0, %(limit)s::integer - 1) AS g
     WHERE g NOT IN (SELECT slot FROM live)
       AND NOT EXISTS (SELECT FROM mine)
       AND NOT EXISTS (SELECT FROM live WHERE slot_limit <> %(limit)s::integer)
     ORDER BY g LIMIT 1
), counter AS (
    INSERT INTO {{table}} AS c (key, slot, slot_limit, fencing_token)
    SELECT %(key)s, {COUNTER_SLOT}, 0, coalesce((SELECT max(fencing_token) FROM seen), 0) + 1
      FROM free
    ON CONFLICT (key, slot) DO UPDATE SET fencing_token = c.fencing_token + 1
     WHERE c.fencing_token = (SELECT fencing_token FROM seen WHERE slot = {COUNTER_SLOT})
    RETURNING fencing_token
), claimed AS (
    INSERT INTO {{table}} AS l
           (key, slot, slot_limit, fencing_token, owner_token, holder, acquired_at, expires_at)
    SELECT %(key)s, free.slot, %(limit)s::integer, counter.fencing_token, %(owner)s,
           %(holder)s, n.t, {_NEW_EXPIRY}
      FROM free, counter, n
    ON CONFLICT (key, slot) DO UPDATE SET
        slot_limit = excluded.slot_limit,
        fencing_token = excluded.fencing_token,
        owner_token = excluded.owner_token,
        holder = excluded.holder,
        acquired_at = excluded.acquired_at,
        expires_at = excluded.expires_at
     WHERE l.owner_token IS NULL OR l.expires_at <= excluded.acquired_at
    RETURNING slot, slot_limit, fencing_token, acquired_at, expires_at
), retried AS (
    UPDATE {{table}} AS l SET holder = %(holder)s, expires_at = {_NEW_EXPIRY}
      FROM mine, n
     WHERE l.key = %(key)s AND l.slot = mine.slot AND l.owner_token = %(owner)s
    RETURNING l.slot, l.slot_limit, l.fencing_token, l.acquired_at, l.expires_at
)
SELECT r.* {{turn_end}} FROM (
    SELECT 'taken' AS outcome, slot, slot_limit, fencing_token, acquired_at, expires_at
      FROM claimed
    UNION ALL
    SELECT 'taken', slot, slot_limit, fencing_token, acquired_at, expires_at FROM retried
    UNION ALL
    SELECT CASE WHEN h.held IS NULL OR EXISTS (SELECT FROM mine) THEN 'lost' ELSE 'mismatch' END,
           NULL, h.held, NULL, NULL, NULL
      FROM (SELECT max(slot_limit) AS held FROM live
             WHERE slot_limit <> %(limit)s::integer) AS h
     WHERE NOT EXISTS (SELECT FROM claimed) AND NOT EXISTS (SELECT FROM retried)
       AND (h.held IS NOT NULL OR EXISTS (SELECT FROM free) OR EXISTS (SELECT FROM mine))
) AS r
"""
# A waiter's acquire ends its turn in the same statement once the lease is taken.
_ENDING_TURN = ", CASE WHEN r.outcome = 'taken' THEN {unlock} END"
# The lease of %(owner)s in slot %(slot)s, with fencing token %(fence)s.
_OURS = (
    "key = %(key)s AND slot = %(slot)s AND owner_token = %(owner)s AND fencing_token = %(fence)s"
)
_RENEW = f"""
UPDATE {{table}} SET expires_at = clock_timestamp() + make_interval(secs => %(ttl)s::float8)
 WHERE {_OURS} AND expires_at > clock_timestamp()
RETURNING expires_at
"""
# Our own lease, broken or not, is freed; a broken one is never kept for longer.
_FREE_OURS = f"""
    UPDATE {{table}} SET {_CLEARED}
     WHERE key = %(key)s AND slot = %(slot)s AND owner_token IN (%(owner)s, %(broken)s)
       AND fencing_token = %(fence)s
    RETURNING key
"""
_RELEASE_LATER = f"""
WITH kept AS (
    UPDATE {{table}}
       SET expires_at = clock_timestamp() + make_interval(secs => %(keep)s::float8)
     WHERE {_OURS} AND expires_at > clock_timestamp()
    RETURNING key
), cleared AS ({_FREE_OURS.replace("%(owner)s, ", "")})
SELECT key FROM kept
UNION ALL
SELECT pg_notify(%(channel)s, {_PAYLOAD.format(col="key")})::text FROM cleared
"""
_RELEASE = f"""
WITH cleared AS ({_FREE_OURS})
SELECT pg_notify(%(channel)s, {_PAYLOAD.format(col="key")}) FROM cleared
"""
# The run ledger's part of a release: the run's record (kept as first written when a
# retry writes it again) and the trim to the key's last LEDGER_KEEP runs, counting the new
# one (the statement's snapshot does not show its own insert). The key's newest success
# (the new run, when %(succeeded)s) is never trimmed: ``--once-per`` and ``metrics`` need it.
_SUCCEEDED = "data->>'outcome' = 'succeeded'"
_RECORD_RUN = f"""recorded AS (
    INSERT INTO {{runs}} (key, fencing_token, started_at, ended_at, data)
    VALUES (%(key)s, %(fence)s, %(started)s, clock_timestamp(), %(data)s)
    ON CONFLICT DO NOTHING
    RETURNING 1
), trimmed AS (
    DELETE FROM {{runs}} WHERE key = %(key)s AND fencing_token < (
        SELECT t FROM (SELECT fencing_token AS t FROM {{runs}} WHERE key = %(key)s
                       UNION SELECT %(fence)s::bigint) AS s
         ORDER BY t DESC OFFSET {LEDGER_KEEP - 1} LIMIT 1)
      AND fencing_token <> coalesce((
        SELECT max(t) FROM (SELECT fencing_token AS t FROM {{runs}}
                             WHERE key = %(key)s AND {_SUCCEEDED}
                            UNION ALL SELECT %(fence)s::bigint WHERE %(succeeded)s) AS s), -1)
    RETURNING 1
), """
_RELEASE_RECORDED = _RELEASE.replace("WITH ", "WITH " + _RECORD_RUN, 1)
_RELEASE_LATER_RECORDED = _RELEASE_LATER.replace("WITH ", "WITH " + _RECORD_RUN, 1)
_TIME_LEFT = """
SELECT extract(epoch FROM expires_at - clock_timestamp())::float8 FROM {table}
 WHERE key = %(key)s AND fencing_token = %(token)s AND owner_token IS NOT NULL
   AND left(owner_token, length(%(prefix)s)) <> %(prefix)s AND expires_at > clock_timestamp()
"""
_HISTORY = """
SELECT key, fencing_token, started_at, ended_at, data FROM {runs}
 WHERE key = %(key)s ORDER BY fencing_token DESC LIMIT %(limit)s
"""
# The key's newest success and the server's clock, in one statement.
_LAST_SUCCESS = f"""
SELECT n.now, r.key, r.fencing_token, r.started_at, r.ended_at, r.data
  FROM (SELECT clock_timestamp() AS now) AS n
  LEFT JOIN LATERAL (
    SELECT key, fencing_token, started_at, ended_at, data FROM {{runs}}
     WHERE key = %(key)s AND {_SUCCEEDED} ORDER BY fencing_token DESC LIMIT 1
  ) AS r ON true
"""
_LEDGER_KEYS = """
SELECT DISTINCT key FROM {runs}
 WHERE key >= %(prefix)s COLLATE "C" AND left(key, char_length(%(prefix)s)) = %(prefix)s
 ORDER BY key
"""
# The leases on %(key)s, or the one with fencing token %(token)s when not NULL.
_MATCHING = (
    "key = %(key)s AND owner_token IS NOT NULL"
    " AND (%(token)s::bigint IS NULL OR fencing_token = %(token)s::bigint)"
)
_FORCE_RELEASE = f"""
WITH old AS (
    SELECT {_INFO_COLUMNS}, expires_at > clock_timestamp() AS live
      FROM {{table}} WHERE {_MATCHING}
       FOR UPDATE
), cleared AS (
    UPDATE {{table}} AS t SET {_CLEARED}
      FROM old WHERE t.key = old.key AND t.slot = old.slot AND t.owner_token IS NOT NULL
    RETURNING t.slot
)
SELECT old.key, old.slot, old.slot_limit, old.fencing_token, old.acquired_at, old.expires_at,
       old.holder, old.live,
       pg_notify(%(channel)s, {_PAYLOAD.format(col="old.key")}),
       pg_notify(%(break_channel)s, old.fencing_token::text)
  FROM old JOIN cleared ON cleared.slot = old.slot
 ORDER BY old.slot
"""
_BREAK = f"""
WITH broken AS (
    UPDATE {{table}} SET owner_token = CASE
            WHEN left(owner_token, length(%(prefix)s)) = %(prefix)s THEN owner_token
            ELSE %(prefix)s || owner_token END
     WHERE {_MATCHING} AND expires_at > clock_timestamp()
    RETURNING {_INFO_COLUMNS}
)
SELECT {_INFO_COLUMNS}, true, pg_notify(%(break_channel)s, fencing_token::text) FROM broken
 ORDER BY slot
"""
# Our lease is still ours, unbroken (expired or not: the renewal tells that).
_INTACT = f"SELECT 1 FROM {{table}} WHERE {_OURS}"
_SELECT = f"SELECT {_INFO_COLUMNS}, expires_at > clock_timestamp() AS live FROM {{table}}"
_HOLDERS = (
    _SELECT + " WHERE key = %(key)s AND owner_token IS NOT NULL"
    " AND expires_at > clock_timestamp() ORDER BY slot"
)
# Literal prefix match (no LIKE wildcards); the range bound lets the primary key help.
_LIST = (
    _SELECT + " WHERE owner_token IS NOT NULL {live}"
    ' AND key >= %(prefix)s COLLATE "C" {upper}'
    ' AND (key, slot) > (%(after)s COLLATE "C", %(after_slot)s::integer)'
    ' AND left(key, char_length(%(prefix)s)) = %(prefix)s ORDER BY key COLLATE "C", slot'
    f" LIMIT {LIST_PAGE}"
)
_UPPER = ' AND key < %(upper)s COLLATE "C"'
_SWEEP_COUNT = (
    "SELECT count(*) FROM {table} WHERE owner_token IS NOT NULL AND expires_at <= clock_timestamp()"
)
# Batches walk the primary key forwards (past the last batch's last key and slot): no
# batch scans again past rows an earlier one cleared, so none holds its row locks for long.
_SWEEP = f"""
WITH victims AS (
    SELECT key, slot FROM {{table}}
     WHERE (key, slot) > (%(after)s COLLATE "C", %(after_slot)s::integer)
       AND owner_token IS NOT NULL AND expires_at <= clock_timestamp()
     ORDER BY key COLLATE "C", slot
     LIMIT {SWEEP_BATCH}
       FOR UPDATE SKIP LOCKED
), cleared AS (
    UPDATE {{table}} AS t SET {_CLEARED}
      FROM victims AS v
     WHERE t.key = v.key AND t.slot = v.slot AND t.owner_token IS NOT NULL
       AND t.expires_at <= clock_timestamp()
    RETURNING t.key, t.slot
)
SELECT key, slot, pg_notify(%(channel)s, {_PAYLOAD.format(col="key")}) FROM cleared
"""
# Whether the key is full -- seconds until its first live lease runs out on the server's
# clock -- or not (NULL). Its counter row is locked FOR SHARE first: that waits for an
# acquire still in flight (a woken waiter hands on its turn in the statement that takes
# the lease, before that commits). The first column tells whether the counter changed
# since this statement's snapshot (its latest version is another): then the slots as read
# here are out of date and the caller asks again.
_TIME_UNTIL_FREE = f"""
WITH latest AS (
    SELECT xmin::text AS version FROM {{table}}
     WHERE key = %(key)s AND slot = {COUNTER_SLOT} FOR SHARE
), live AS (
    SELECT slot_limit, expires_at FROM {{table}}
     WHERE key = %(key)s AND slot >= 0 AND owner_token IS NOT NULL
       AND expires_at > clock_timestamp()
)
SELECT (SELECT version FROM latest) IS DISTINCT FROM
       (SELECT xmin::text FROM {{table}} WHERE key = %(key)s AND slot = {COUNTER_SLOT}),
       CASE WHEN count(*) >= max(slot_limit)
            THEN extract(epoch FROM min(expires_at) - clock_timestamp())::float8 END
  FROM live
"""

# Connection failures that mean "fix the URL / the server's setup", not "try again later".
_CONFIG_FAILURES = (
    "password authentication failed",
    "authentication failed",
    "no password supplied",
    "password is required",
    "does not exist",  # database "x" / role "x" does not exist
    "no pg_hba.conf entry",
    "pg_hba.conf rejects",
    "permission denied for database",
    "invalid connection option",
    "invalid uri",
    "invalid sslmode",
    "invalid integer value",
)


def split_table(url: str) -> tuple[str, str]:
    """``(url without table=, table name)``; every other parameter goes to libpq unchanged."""
    base, sep, query = url.partition("?")
    if not sep:
        return url, DEFAULT_TABLE
    kept: list[str] = []
    table = DEFAULT_TABLE
    for part in query.split("&"):
        if not part:
            continue
        name, _, value = part.partition("=")
        if unquote(name) == "table":
            table = unquote(value)
        else:
            kept.append(part)
    return base + ("?" + "&".join(kept) if kept else ""), table


def parse_table(name: str) -> tuple[str, ...]:
    """``"leases"`` -> ``("leases",)``, ``"ops.leases"`` -> ``("ops", "leases")``."""
    parts = tuple(name.split("."))
    if not 1 <= len(parts) <= 2 or not all(_IDENTIFIER.fullmatch(part) for part in parts):
        raise ConfigError(
            f"invalid table name {name!r} in the store URL (expected NAME or SCHEMA.NAME, "
            "each a letter or underscore followed by up to 62 letters, digits, _ or $)"
        )
    return parts


def _payload_for(key: str) -> str:
    encoded = key.encode("utf-8")
    if len(encoded) <= MAX_PAYLOAD_KEY_BYTES:
        return key
    return hashlib.md5(encoded).hexdigest()


def _utc(moment: datetime | None) -> datetime:
    return moment.astimezone(timezone.utc) if moment is not None else _EPOCH


class _Overrun(Exception):
    """The watchdog shut the socket: the server did not answer within the I/O timeout."""


class _Watchdog:
    """Shuts a connection's socket down when a call overruns its deadline.

    libpq has no client-side read timeout: a server that accepted the request and went
    silent (SIGSTOPped, or its host cut off before TCP notices) would block the caller
    for as long as the kernel keeps the connection. Shutting the socket down makes the
    blocked read fail at once; the connection is then dropped and reopened next time.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._deadline: float | None = None
        self._fd = -1
        self._fired = False
        self._stopped = False
        self._thread: threading.Thread | None = None

    def arm(self, fd: int, seconds: float) -> None:
        with self._cond:
            if self._thread is None:
                self._stopped = False
                self._thread = threading.Thread(
                    target=self._run, name="tasklock-pg-watchdog", daemon=True
                )
                self._thread.start()
            self._fd, self._fired = fd, False
            self._deadline = time.monotonic() + seconds
            self._cond.notify()

    def disarm(self) -> bool:
        """Stop watching; True when the deadline had passed and the socket was shut."""
        with self._cond:
            self._deadline = None
            fired, self._fired = self._fired, False
            return fired

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            self._deadline = None
            self._thread = None
            self._cond.notify_all()

    def _run(self) -> None:
        with self._cond:
            while not self._stopped:
                if self._deadline is None:
                    self._cond.wait()
                    continue
                left = self._deadline - time.monotonic()
                if left > 0:
                    self._cond.wait(left)
                    continue
                # Still armed past the deadline: the call is blocked on this socket, and
                # the caller holds the store lock, so the fd cannot have been closed.
                with contextlib.suppress(OSError):
                    sock = socket.socket(fileno=os.dup(self._fd))
                    try:
                        sock.shutdown(socket.SHUT_RDWR)
                    finally:
                        sock.close()
                self._fired = True
                self._deadline = None


class _BreakListener(SocketBreakWatch):
    """A holder's own connection, LISTENing on its lease's break channel."""

    def __init__(self, conn: psycopg.Connection, payload: str, io_timeout: float) -> None:
        super().__init__()
        self.conn = conn
        self.payload = payload
        self.io_timeout = io_timeout
        self._watchdog = _Watchdog()

    def guarded(self, operation: Callable[[], _T]) -> _T:
        """Run ``operation`` on the connection, shut down if it overruns the I/O timeout."""
        self._watchdog.arm(self.conn.fileno(), self.io_timeout)
        try:
            return operation()
        finally:
            if self._watchdog.disarm():
                raise _Overrun()

    def _fileno(self) -> int:
        return self.conn.fileno()

    def _heard(self) -> bool:
        """Read what has arrived (never blocks); True when our break is among it."""
        notes = self.conn.notifies(timeout=0)
        try:
            return any(note.payload == self.payload for note in notes)
        finally:
            notes.close()

    def close(self) -> None:
        self._watchdog.stop()
        with contextlib.suppress(Exception):
            self.conn.close()


class PostgresStore(Store):
    signals_release = True

    def __init__(self, conninfo: str, table: str = DEFAULT_TABLE, display_url: str = "") -> None:
        self._conninfo = conninfo
        self.table_name = table
        self._table_parts = parse_table(table)
        self._table = sql.Identifier(*self._table_parts)
        # The run ledger's table, beside the leases' (names are at most 63 bytes).
        runs_parts = (*self._table_parts[:-1], self._table_parts[-1][:58] + "_runs")
        self._runs = sql.Identifier(*runs_parts)
        self.runs_table_name = ".".join(runs_parts)
        self.display_url = display_url or redact_url(conninfo)
        self._secrets = sorted(url_passwords(conninfo), key=len, reverse=True)
        try:
            params = conninfo_to_dict(conninfo)
        except psycopg.Error as exc:
            raise ConfigError(
                f"invalid PostgreSQL URL {self.display_url!r}: {self._scrub(str(exc))}"
            ) from None
        password = str(params.get("password") or "")
        if password and password not in self._secrets:
            self._secrets.insert(0, password)
        self._user_params = {k for k, v in params.items() if v is not None}
        self._io_timeout = DEFAULT_IO_TIMEOUT_S
        self._lock = threading.RLock()
        self._watchdog = _Watchdog()
        self._conn: psycopg.Connection | None = None
        self._applied_timeout: float | None = None
        self._schema_ok = False
        self._oid = 0
        self._channel = ""
        self._turn_space = 0
        self._break_watches = BreakWatches(
            self._break_listener, (psycopg.Error, _Overrun, OSError, TasklockError)
        )
        self._listening = False
        self._turn_of: str | None = None  # the key whose first waiter we are (advisory lock)
        self._statements: dict[tuple[str, str], sql.Composed] = {}

    @classmethod
    def from_url(cls, url: str) -> PostgresStore:
        clean, table = split_table(url)
        return cls(clean, table=table, display_url=redact_url(url))

    def _scrub(self, text: str) -> str:
        return " ".join(scrub(text, self._secrets).split())  # libpq's messages span lines

    def _sql(self, template: str, live: str = "", upper: str = "") -> sql.Composed:
        """A statement with the table name quoted in; built once per template."""
        statement = self._statements.get((template, live, upper))
        if statement is None:
            statement = sql.SQL(template).format(
                table=self._table,
                runs=self._runs,
                live=sql.SQL(live),
                upper=sql.SQL(upper),
                turn_end=sql.SQL(""),
            )
            self._statements[(template, live, upper)] = statement
        return statement

    # -- connection ---------------------------------------------------------------

    def set_io_timeout(self, seconds: float) -> None:
        if not math.isfinite(seconds) or seconds <= 0:
            return
        with self._lock:
            self._io_timeout = seconds  # applied to the connection on its next use

    def _connect_kwargs(self) -> dict[str, Any]:
        io = self._io_timeout
        kwargs: dict[str, Any] = {
            # libpq's minimum is 2 s (smaller values are raised to 2), per host tried.
            "connect_timeout": max(2, math.ceil(io)),
            "keepalives": 1,
            "keepalives_idle": max(1, int(io)),
            "keepalives_interval": max(1, int(io / 3)),
            "keepalives_count": 3,
            "tcp_user_timeout": max(100, int(io * 1000)),
        }
        if "application_name" not in self._user_params:
            kwargs["application_name"] = "tasklock"
        return kwargs

    def _open(self, inspect: bool) -> tuple[psycopg.Connection, tuple | None]:
        """A new connection, set up in one round trip after connecting: the session
        settings, the statement timeout and (``inspect``) the look at the table, whose
        row is returned for ``_ensure_schema``."""
        conn = psycopg.Connection.connect(self._conninfo, autocommit=True, **self._connect_kwargs())
        try:
            os.set_inheritable(conn.fileno(), False)  # libpq sets FD_CLOEXEC; make sure
            setup = _SESSION_SETUP.format(timeout=self._statement_timeout_ms())
            cursor = psycopg.ClientCursor(conn)  # one simple query, parameters bound here
            if not inspect:
                self._guarded(conn, lambda: cursor.execute(setup))
                return conn, None

            def set_up_and_inspect() -> tuple | None:
                cursor.execute(setup + _INSPECT, self._inspect_params(conn))
                while cursor.nextset():  # to the last result, the inspection's
                    pass
                return cursor.fetchone()

            return conn, self._guarded(conn, set_up_and_inspect)
        except BaseException:
            conn.close()
            raise

    def _statement_timeout_ms(self) -> int:
        return max(100, int(self._io_timeout * 800))  # the server cancels before we give up

    def _guarded(self, conn: psycopg.Connection, operation: Callable[[], _T]) -> _T:
        """Run ``operation`` with the watchdog armed for one I/O timeout."""
        self._watchdog.arm(conn.fileno(), self._io_timeout + 0.05)
        overran = False
        try:
            return operation()
        finally:
            overran = self._watchdog.disarm()
            if overran:
                raise _Overrun()

    def _connection(self, ensure_schema: bool = True) -> psycopg.Connection:
        conn = self._conn
        if conn is not None and (conn.closed or conn.broken):
            self._drop()
            conn = None
        inspected: tuple | _Unset | None = _UNSET
        if conn is None:
            conn, row = self._open(inspect=ensure_schema)
            if ensure_schema:
                inspected = row
            self._conn = conn
            self._applied_timeout = self._io_timeout
            self._schema_ok = False
            self._listening = False
            self._turn_of = None
        if self._applied_timeout != self._io_timeout:
            millis = self._statement_timeout_ms()
            self._guarded(conn, lambda: conn.execute(f"SET statement_timeout = {millis}"))
            self._applied_timeout = self._io_timeout
        if ensure_schema and not self._schema_ok:
            self._ensure_schema(conn, inspected)
        return conn

    def _drop(self) -> None:
        conn, self._conn = self._conn, None
        self._schema_ok = False
        self._listening = False
        self._turn_of = None
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.close()

    def _run(
        self,
        operation: Callable[[psycopg.Connection], _T],
        *,
        idempotent: bool = True,
        ensure_schema: bool = True,
    ) -> _T:
        """Run ``operation`` on the connection, mapping every failure to a tasklock error.

        Retried here: serialization failures and deadlocks (a few times), a table that
        vanished (recreated once), and a connection found broken when reused (once, on a
        new connection) -- for non-idempotent statements only when the server said it
        had not run the statement (it was shutting down or terminated the session).
        """
        with self._lock:
            conflicts = 0
            reconnected = recreated = False
            while True:
                # A failure on a connection opened by an earlier call may just mean it went
                # stale (server restart, terminated backend, idle timeout): retry once.
                stale = self._conn is not None
                try:
                    conn = self._connection(ensure_schema)
                    return self._guarded(conn, functools.partial(operation, conn))
                except _Overrun:
                    self._drop()
                    raise StoreUnavailable(
                        f"{self.display_url}: no answer within {self._io_timeout:g} s"
                    ) from None
                except (pgerr.SerializationFailure, pgerr.DeadlockDetected) as exc:
                    conflicts += 1
                    if conflicts > SERIALIZATION_RETRIES:
                        raise self._translate(exc) from None
                    time.sleep(random.uniform(0.001, 0.005) * conflicts)
                except pgerr.UndefinedTable as exc:
                    self._schema_ok = False
                    if recreated:
                        raise self._translate(exc) from None
                    recreated = True
                except (psycopg.OperationalError, psycopg.InterfaceError) as exc:
                    current = self._conn
                    broken = current is None or current.closed or current.broken
                    if broken:
                        self._drop()
                    not_run = (getattr(exc, "sqlstate", None) or "").startswith("57P")
                    if (
                        broken
                        and stale
                        and not reconnected
                        and (idempotent or not_run)
                        and not isinstance(exc, pgerr.QueryCanceled)
                    ):
                        reconnected = True
                        continue
                    raise self._translate(exc) from None
                except psycopg.Error as exc:
                    raise self._translate(exc) from None

    def _translate(self, exc: Exception) -> TasklockError:
        text = self._scrub(str(exc)) or type(exc).__name__
        where = self.display_url
        state = getattr(exc, "sqlstate", None) or ""
        if isinstance(exc, pgerr.QueryCanceled):
            return StoreUnavailable(
                f"{where}: the statement did not finish within {self._io_timeout:g} s ({text})"
            )
        if isinstance(exc, pgerr.ReadOnlySqlTransaction):
            return StoreUnavailable(
                f"{where}: connected to a read-only server ({text}); "
                "add target_session_attrs=read-write to the URL for failover setups"
            )
        if isinstance(exc, pgerr.InsufficientPrivilege):
            return ConfigError(
                f"{where}: the database user may not use table {self.table_name} ({text})"
            )
        if isinstance(exc, pgerr.UndefinedTable):
            return ConfigError(f"{where}: table {self.table_name} is missing ({text})")
        if state in ("28P01", "28000", "3D000") or (
            isinstance(exc, psycopg.OperationalError)
            and not state
            and any(marker in text.lower() for marker in _CONFIG_FAILURES)
        ):
            # Wrong password, unknown role or database, a pg_hba rule: the server answered
            # and refused. Retrying cannot help and the supervisor must not wait it out as
            # an outage, so this is a configuration error (78), not "unreachable" (69).
            # Refused/reset connections, unknown hosts and timeouts stay 69.
            return ConfigError(f"{where}: the server refused the connection: {text}")
        if isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError):
            return StoreUnavailable(f"{where}: {text}")
        if state.startswith("42") or isinstance(exc, psycopg.ProgrammingError):
            return ConfigError(f"{where}: table {self.table_name} is unusable ({text})")
        return StoreUnavailable(f"{where}: PostgreSQL answered with an error: {text}")

    # -- schema -------------------------------------------------------------------

    def _inspect_params(self, conn: psycopg.Connection) -> list[str]:
        return [self._runs.as_string(conn), self._table.as_string(conn)]

    def _inspect(self, conn: psycopg.Connection) -> tuple[int, bool, bool] | None:
        return self._judge_table(conn.execute(_INSPECT, self._inspect_params(conn)).fetchone())

    def _judge_table(self, row: tuple | None) -> tuple[int, bool, bool] | None:
        """(the table's oid, whether the run ledger's table exists, whether it is a table
        from before semaphores, to migrate) when it is a tasklock table, None when
        missing; else ConfigError."""
        if row is None:
            return None
        oid, relkind, has_runs, columns, unique_keys = row
        columns = dict(columns or {})
        unique_keys = set(unique_keys or ())
        if relkind not in ("r", "p"):
            raise ConfigError(
                f"{self.display_url}: {self.table_name} exists but is not a table "
                f"(relkind {relkind!r}); choose another name with ?table="
            )
        current = columns == _COLUMNS and unique_keys >= {"key,slot"} and "key" not in unique_keys
        before_slots = columns in (_COLUMNS, _COLUMNS_BEFORE_SLOTS) and bool(
            unique_keys & {"key", "key,slot"}
        )
        if not (current or before_slots):
            found = ", ".join(f"{name} {kind}" for name, kind in sorted(columns.items()))
            why = "" if unique_keys & {"key", "key,slot"} else "; no unique index on key"
            raise ConfigError(
                f"{self.display_url}: table {self.table_name} exists but is not a tasklock "
                f"table (columns: {found or 'none'}{why}); choose another name with ?table="
            )
        return int(oid), bool(has_runs), not current

    def _schema_lock_id(self) -> int:
        digest = hashlib.sha256(f"tasklock:{self.table_name}".encode()).digest()
        return int.from_bytes(digest[:8], "big", signed=True)

    def _create(self, conn: psycopg.Connection) -> None:
        try:
            # Racing first users queue on the advisory lock; CREATE ... IF NOT EXISTS
            # alone can still fail with unique_violation on pg_type when two race.
            with conn.transaction():
                conn.execute("SELECT pg_advisory_xact_lock(%s)", [self._schema_lock_id()])
                conn.execute(self._ddl())
        except (pgerr.UniqueViolation, pgerr.DuplicateTable, pgerr.DuplicateObject):
            pass  # someone without our advisory lock created it at the same moment
        except (pgerr.InsufficientPrivilege, pgerr.InvalidSchemaName) as exc:
            raise ConfigError(
                f"{self.display_url}: table {self.table_name} is missing and cannot be "
                f"created ({self._scrub(str(exc))}); have a DBA run the output of "
                "`tasklock init --print-sql`"
            ) from None

    def _migrate(self, conn: psycopg.Connection) -> None:
        """Bring a table from before semaphores to the current shape: its rows become slot
        0 of limit 1 (their fencing tokens stay: a key's counter row starts from them).
        Under the schema lock and in one transaction, so racing clients migrate it once;
        one that comes second finds it done."""
        try:
            with conn.transaction():
                conn.execute("SELECT pg_advisory_xact_lock(%s)", [self._schema_lock_id()])
                found = self._inspect(conn)
                if found is None or not found[2]:
                    return
                conn.execute(self._migration())
        except pgerr.InsufficientPrivilege as exc:
            raise ConfigError(
                f"{self.display_url}: table {self.table_name} is from an older tasklock and "
                f"cannot be migrated ({self._scrub(str(exc))}); have a DBA run the output "
                "of `tasklock init --print-sql`"
            ) from None

    def _ensure_schema(self, conn: psycopg.Connection, inspected: tuple | _Unset | None) -> None:
        """Once per connection: the table exists (created if missing) and is ours.
        ``inspected``: the table's row, when the connection's set-up read it already."""

        def check() -> None:
            if isinstance(inspected, _Unset):
                found = self._inspect(conn)
            else:
                found = self._judge_table(inspected)
            if found is None:
                self._create(conn)
                found = self._inspect(conn)
                if found is None:
                    raise ConfigError(
                        f"{self.display_url}: table {self.table_name} could not be created"
                    )
            else:
                if found[2]:
                    self._migrate(conn)
                    found = self._inspect(conn) or found
                if not found[1]:
                    # A lease table from before the run ledger. Leases work without the
                    # ledger: when it cannot be created, writing a run fails instead (and
                    # the run's release is retried without it).
                    with contextlib.suppress(ConfigError):
                        self._create(conn)
            oid = found[0]
            self._oid = oid
            self._channel = f"tasklock_released_{oid}"
            self._turn_space = oid & 0x7FFFFFFF  # first int4 of the waiters' advisory locks

        self._guarded(conn, check)
        self._schema_ok = True

    def _migration(self) -> sql.Composed:
        name = sql.Literal(".".join(f'"{part}"' for part in self._table_parts))
        return sql.SQL(_MIGRATE_TO_SLOTS).format(table=self._table, name=name)

    def _ddl(self) -> sql.Composed:
        index = self._table_parts[-1][:50] + "_expires_idx"
        return sql.SQL(_DDL).format(table=self._table, index=sql.Identifier(index), runs=self._runs)

    def init_schema(self) -> None:
        self._run(lambda conn: None)

    def schema_sql(self) -> str:
        return (
            "-- tasklock lease table; rows are never deleted (they keep the fencing counter),\n"
            "-- and the run ledger's table\n"
            + self._ddl().as_string(None)
            + "-- a lease table from before semaphores (one row per key): its rows become\n"
            "-- slot 0 of limit 1 (nothing to do on a current table)"
            + self._migration().as_string(None)
        )

    # -- the interface --------------------------------------------------------------

    def acquire(
        self, key: str, ttl: float, holder: Holder, owner_token: str, limit: int = 1
    ) -> Lease | None:
        params = {
            "key": key,
            "owner": owner_token,
            "holder": Jsonb(holder.to_dict()),
            "ttl": float(ttl),
            "limit": int(limit),
        }
        statement = self._sql(_ACQUIRE)

        def attempt(conn: psycopg.Connection) -> tuple | None:
            if self._listening or self._turn_of is not None:
                return self._acquire_as_waiter(conn, params)
            return conn.execute(statement, params).fetchone()

        for _ in range(ACQUIRE_RACE_RETRIES):
            row = self._run(attempt)
            if row is None:
                return None
            outcome, slot, slot_limit, token, acquired_at, expires_at = row[:6]
            if outcome == "mismatch":
                raise LimitMismatch(key, int(slot_limit), int(limit))
            if outcome == "taken":
                return Lease(
                    key,
                    owner_token,
                    int(token),
                    _utc(acquired_at),
                    _utc(expires_at),
                    slot=int(slot),
                    limit=int(slot_limit),
                )
            # "lost": another acquire of the key committed since the statement's snapshot
        raise StoreUnavailable(
            f"{self.display_url}: {key!r} is taken and freed too fast to acquire it"
        )

    def _acquire_as_waiter(self, conn: psycopg.Connection, params: dict) -> tuple | None:
        """A waiter's acquire, in the same round trip as what a holder no longer needs:
        UNLISTEN (notifications would pile up on the connection) and, when the lease is
        granted, the end of its turn, so the next waiter in line listens at once.

        One simple query (parameters bound client-side), one implicit transaction. A
        refused acquire has still unlistened: the next wait listens again first."""
        acquire = self._sql(_ACQUIRE)
        if self._turn_of is not None:
            unlock = self._turn_lock("pg_advisory_unlock", self._turn_of, call_only=True)
            acquire = sql.SQL(_ACQUIRE).format(
                table=self._table, turn_end=sql.SQL(_ENDING_TURN).format(unlock=unlock)
            )
        cursor = psycopg.ClientCursor(conn)
        cursor.execute(sql.SQL("UNLISTEN *; ") + acquire, params)
        cursor.nextset()
        row = cursor.fetchone()
        self._listening = False
        if row is not None and row[0] == "taken":
            self._turn_of = None
        for _ in conn.notifies(timeout=0):  # what arrived before the UNLISTEN
            pass
        return row

    def renew(self, lease: Lease, ttl: float) -> Lease:
        params = {
            "key": lease.key,
            "slot": lease.slot,
            "owner": lease.owner_token,
            "fence": lease.fencing_token,
            "ttl": float(ttl),
        }
        statement = self._sql(_RENEW)
        row = self._run(lambda conn: conn.execute(statement, params).fetchone())
        return lease.renewed_until(None if row is None else _utc(row[0]))

    def release(self, lease: Lease, keep_for: float = 0.0, record: RunRecord | None = None) -> bool:
        params: dict[str, Any] = {
            "key": lease.key,
            "slot": lease.slot,
            "owner": lease.owner_token,
            "broken": BROKEN_OWNER_PREFIX + lease.owner_token,
            "fence": lease.fencing_token,
        }
        if record is not None:
            params["started"] = record.started_at
            params["data"] = Jsonb(record.fields())
            params["succeeded"] = record.outcome == "succeeded"
        self._break_watches.drop(lease)
        if keep_for > 0:
            params["keep"] = float(keep_for)
            later = self._sql(_RELEASE_LATER if record is None else _RELEASE_LATER_RECORDED)

            def run_later(conn: psycopg.Connection) -> int:
                rows = conn.execute(later, {**params, "channel": self._channel}).fetchall()
                return len(rows)

            count = self._run(run_later)
        else:
            now = self._sql(_RELEASE if record is None else _RELEASE_RECORDED)

            def run(conn: psycopg.Connection) -> int:
                return len(conn.execute(now, {**params, "channel": self._channel}).fetchall())

            # Not retried on an ambiguous failure: if the row was cleared and the reply
            # lost, a retry would report False although the release worked.
            count = self._run(run, idempotent=False)
        return count == 1

    def time_left(self, key: str, fencing_token: int) -> float | None:
        statement = self._sql(_TIME_LEFT)
        params = {"key": key, "token": fencing_token, "prefix": BROKEN_OWNER_PREFIX}
        row = self._run(lambda conn: conn.execute(statement, params).fetchone())
        return max(0.0, float(row[0])) if row else None

    def history(self, key: str, limit: int = LEDGER_KEEP) -> list[RunRecord]:
        statement = self._sql(_HISTORY)
        params = {"key": key, "limit": limit}
        rows = self._run(lambda conn: conn.execute(statement, params).fetchall())
        return [
            RunRecord.from_fields(key, token, _utc(started), _utc(ended), data or {})
            for key, token, started, ended, data in rows
        ]

    def last_success(self, key: str) -> tuple[RunRecord | None, datetime]:
        statement = self._sql(_LAST_SUCCESS)
        now, *run = self._run(lambda conn: conn.execute(statement, {"key": key}).fetchone())
        if run[0] is None:
            return None, _utc(now)
        key, token, started, ended, data = run
        return RunRecord.from_fields(key, token, _utc(started), _utc(ended), data or {}), _utc(now)

    def ledger_keys(self, prefix: str = "") -> list[str]:
        statement = self._sql(_LEDGER_KEYS)
        rows = self._run(lambda conn: conn.execute(statement, {"prefix": prefix}).fetchall())
        return [row[0] for row in rows]

    def holders(self, key: str) -> list[LeaseInfo]:
        statement = self._sql(_HOLDERS)
        rows = self._run(lambda conn: conn.execute(statement, {"key": key}).fetchall())
        return [self._info(row) for row in rows]

    def list(self, prefix: str = "", include_expired: bool = False) -> Iterator[LeaseInfo]:
        live = "" if include_expired else "AND expires_at > clock_timestamp()"
        upper = prefix_upper_bound(prefix)
        statement = self._sql(_LIST, live, _UPPER if upper is not None else "")
        # Keys are never empty, and slots are never below the counter's.
        params = {"prefix": prefix, "upper": upper, "after": "", "after_slot": COUNTER_SLOT}
        while True:
            rows = self._run(lambda conn: conn.execute(statement, params).fetchall())
            yield from (self._info(row) for row in rows)
            if len(rows) < LIST_PAGE:
                return
            params["after"], params["after_slot"] = rows[-1][0], rows[-1][1]

    def sweep(self, dry_run: bool = False) -> int:
        if dry_run:
            count_sql = self._sql(_SWEEP_COUNT)
            return int(self._run(lambda conn: conn.execute(count_sql).fetchone()[0]))
        statement = self._sql(_SWEEP)

        after: tuple[str, int] = ("", COUNTER_SLOT)  # keys are never empty

        def batch(conn: psycopg.Connection) -> list[tuple[str, int]]:
            params = {"channel": self._channel, "after": after[0], "after_slot": after[1]}
            return [(row[0], row[1]) for row in conn.execute(statement, params).fetchall()]

        removed = 0
        while True:  # bounded batches: no statement holds many row locks for long
            started = time.monotonic()
            cleared = self._run(batch)
            removed += len(cleared)
            if len(cleared) < SWEEP_BATCH:
                return removed
            after = max(cleared)
            # Leave the server (and its WAL) to other clients twice as long as a batch took.
            time.sleep(2 * (time.monotonic() - started))

    def break_lease(self, key: str, token: int | None = None) -> list[LeaseInfo]:
        statement = self._sql(_BREAK)
        params = {"key": key, "token": token, "prefix": BROKEN_OWNER_PREFIX}

        def run(conn: psycopg.Connection) -> list[tuple]:
            channel = self._break_channel(key)  # known once connected
            return conn.execute(statement, {**params, "break_channel": channel}).fetchall()

        rows = self._run(run)  # idempotent: a broken lease is found again and told again
        return [self._info(row[:8]) for row in rows]

    def force_release(self, key: str, token: int | None = None) -> list[LeaseInfo]:
        statement = self._sql(_FORCE_RELEASE)

        def run(conn: psycopg.Connection) -> list[tuple]:
            params = {
                "key": key,
                "token": token,
                "channel": self._channel,
                "break_channel": self._break_channel(key),
            }
            return conn.execute(statement, params).fetchall()

        rows = self._run(run, idempotent=False)
        return [self._info(row[:8]) for row in rows]

    def _break_channel(self, key: str) -> str:
        """The channel a break of ``key``'s lease is notified on (an identifier: at most 63
        bytes, so the key is hashed; the payload, the fencing token, says which lease)."""
        return f"tasklock_broken_{self._oid}_{hashlib.md5(key.encode()).hexdigest()[:24]}"

    # -- a holder waiting for a break ---------------------------------------------------

    def wait_for_break(self, lease: Lease, timeout: float, wake_fd: int | None = None) -> bool:
        """LISTEN on the lease's break channel on a connection of its own, then select on it
        and ``wake_fd`` (see BreakWatches)."""
        return self._break_watches.wait(lease, timeout, wake_fd)

    def _break_listener(self, lease: Lease) -> tuple[_BreakListener, bool]:
        """A new listener for the lease, and whether the lease was found broken on making it."""
        if not self._oid:
            self._run(lambda conn: None)  # learn the table's oid
        conn = psycopg.Connection.connect(self._conninfo, autocommit=True, **self._connect_kwargs())
        listener = _BreakListener(conn, str(lease.fencing_token), self._io_timeout)
        try:
            os.set_inheritable(conn.fileno(), False)
            listen = sql.SQL("LISTEN {}").format(sql.Identifier(self._break_channel(lease.key)))
            params = {
                "key": lease.key,
                "slot": lease.slot,
                "owner": lease.owner_token,
                "fence": lease.fencing_token,
            }

            def listen_then_look() -> tuple | None:
                conn.execute(listen)  # committed (autocommit) before the look: nothing missed
                return conn.execute(self._sql(_INTACT), params).fetchone()

            intact = listener.guarded(listen_then_look)
        except BaseException:
            listener.close()
            raise
        return listener, intact is None

    # -- waiting (the skeleton is Store.wait_for_release) ------------------------------

    #: Trouble while waiting: the wait sleeps out its time, the next acquire reports it.
    waiting_trouble = (TasklockError,)

    def _prepare_wait(self, key: str, deadline: float, wake_fd: int | None) -> bool:
        """Waiters take turns: only the first waiter of a key listens, and the others
        queue on a session advisory lock behind it, so a release wakes one waiter, not
        all of them at once. The first waiter keeps its turn until it gets the lease,
        stops waiting (``stop_waiting``) or its session ends; then the next in line
        listens. Once it is our turn: LISTEN (before the look at the key)."""
        if self._turn_of != key and not self._wait_for_turn(key, deadline, wake_fd):
            return False  # still queued behind another waiter: the caller looks again
        self._run(self._listen)
        return True

    def _time_until_free(self, key: str) -> float | None:
        statement = self._sql(_TIME_UNTIL_FREE)
        for _ in range(STALE_LOOKS):
            row = self._run(lambda conn: conn.execute(statement, {"key": key}).fetchone())
            stale, left = row
            if not stale:
                break
        return None if left is None else max(0.0, float(left))

    def _await_wakeup(self, key: str, until: float, wake_fd: int | None) -> None:
        wanted = _payload_for(key)
        while True:
            left = until - time.monotonic()
            if left <= 0:
                return
            slice_s = min(left, WAIT_SLICE_S, self._io_timeout / 2)
            if self._wait_slice(wanted, slice_s, wake_fd):
                return

    def stop_waiting(self, key: str) -> None:
        """UNLISTEN and hand the turn on, in one round trip. The next waiter in line then
        listens and looks at the lease, so a notification we did not use is not lost."""

        def run(conn: psycopg.Connection) -> None:
            ours = self._turn_of == key  # (a new connection holds nothing)
            if not (self._listening or ours):
                return
            statement = sql.SQL("UNLISTEN *")
            if ours:
                statement += sql.SQL("; ") + self._turn_lock("pg_advisory_unlock", key)
            conn.execute(statement)
            self._listening = False
            if ours:
                self._turn_of = None
            for _ in conn.notifies(timeout=0):
                pass

        with self._lock:
            conn = self._conn
            if conn is not None and conn.info.transaction_status != TransactionStatus.IDLE:
                self._drop()  # cut off mid-call (a signal): ending the session gives up all
                return
        if self._listening or self._turn_of == key:
            self._run(run)

    def _wait_for_turn(self, key: str, deadline: float, wake_fd: int | None = None) -> bool:
        """Queue (in slices) for the key's waiters' advisory lock; True once it is ours.
        With ``wake_fd``, slices are short and it is looked at between them (False)."""
        longest = TURN_SLICE_S if wake_fd is None else TURN_SLICE_WAKE_FD_S
        while True:
            left = min(deadline - time.monotonic(), longest, self._io_timeout / 2)
            if left < 0.001 or fd_readable(wake_fd):
                return False
            if self._run(functools.partial(self._take_turn, key, left)):
                return True

    def _take_turn(self, key: str, seconds: float, conn: psycopg.Connection) -> bool:
        if self._turn_of is not None:  # our turn at another key: give it up first
            conn.execute(self._turn_lock("pg_advisory_unlock", self._turn_of))
            self._turn_of = None
        # One simple query, one implicit transaction: the SET LOCAL ends with it.
        timeout = sql.SQL("SET LOCAL lock_timeout = {}; ").format(
            sql.Literal(max(1, int(seconds * 1000)))
        )
        # Marked before it is asked for: a call cut short after the server granted it must
        # still be given up (unlocking a lock we do not hold only warns).
        self._turn_of = key
        try:
            conn.execute(timeout + self._turn_lock("pg_advisory_lock", key))
        except pgerr.LockNotAvailable:
            self._turn_of = None
            return False
        except Exception:
            self._turn_of = None  # failed: not ours
            raise
        return True

    def _turn_lock(self, function: str, key: str, call_only: bool = False) -> sql.Composed:
        """``SELECT function(space, hashtext(key))`` with literals, for simple queries."""
        call = sql.SQL("{}({}, hashtext({}))").format(
            sql.Identifier(function), sql.Literal(self._turn_space), sql.Literal(key)
        )
        return call if call_only else sql.SQL("SELECT ") + call

    def _listen(self, conn: psycopg.Connection) -> None:
        if not self._listening:
            self._listening = True  # before, like the turn: see _take_turn
            conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(self._channel)))
        # Whatever arrived before this point is answered by the look that follows.
        for _ in conn.notifies(timeout=0):
            pass

    def _wait_slice(self, wanted: str, seconds: float, wake_fd: int | None = None) -> bool:
        """Wait up to ``seconds`` for a notification about ``wanted``, or for ``wake_fd``
        to be readable; True when either came."""

        def heard(conn: psycopg.Connection, timeout: float) -> bool:
            notes = conn.notifies(timeout=timeout)
            try:
                return any(note.payload == wanted for note in notes)
            finally:
                notes.close()  # it holds the connection's lock while paused, say by a signal

        def wait(conn: psycopg.Connection) -> bool:
            if not self._listening:
                return True  # the connection was replaced: let the caller look again
            if wake_fd is None:
                return heard(conn, seconds)
            if heard(conn, 0):  # what was read already sits in psycopg's backlog
                return True
            ready = wait_readable([conn.fileno(), wake_fd], seconds)
            if not ready:
                return False
            return conn.fileno() not in ready or heard(conn, 0)

        return self._run(wait)

    # -- doctor ---------------------------------------------------------------------

    def doctor(self) -> list[StoreCheck]:
        checks = [StoreCheck("store", True, self.display_url)]

        def probe(conn: psycopg.Connection) -> dict[str, Any]:
            started = time.perf_counter()
            conn.execute("SELECT 1").fetchone()
            rtt = time.perf_counter() - started
            version, standby = conn.execute(
                "SELECT current_setting('server_version'), pg_is_in_recovery()"
            ).fetchone()
            try:
                oid = self._inspect(conn)
                schema = (
                    (True, f"table {self.table_name} will be created on first use")
                    if oid is None
                    else (True, f"table {self.table_name} is a tasklock table")
                )
            except ConfigError as exc:
                schema = (False, str(exc))
            return {
                "rtt": rtt,
                "version": version,
                "standby": standby,
                "schema": schema,
                "clock": _clock_offset(conn),
            }

        try:
            result = self._run(probe, ensure_schema=False)
        except TasklockError as exc:
            checks.append(StoreCheck("reachable", False, str(exc)))
            return checks
        checks.append(
            StoreCheck("reachable", True, f"SELECT 1 round trip {result['rtt'] * 1000:.1f} ms")
        )
        if result["standby"]:
            checks.append(
                StoreCheck(
                    "server",
                    False,
                    f"PostgreSQL {result['version']} is a read-only standby; "
                    "add target_session_attrs=read-write to the URL",
                )
            )
        else:
            checks.append(StoreCheck("server", True, f"PostgreSQL {result['version']} (primary)"))
        ok, detail = result["schema"]
        checks.append(StoreCheck("schema", ok, detail))
        offset, elapsed = result["clock"]
        checks.append(
            clock_check("the server's", offset, elapsed / 2, "the server's clock decides expiry")
        )
        return checks

    def close(self) -> None:
        self._break_watches.close()
        with self._lock:
            self._drop()
        self._watchdog.stop()

    def _info(self, row: tuple) -> LeaseInfo:
        key, slot, slot_limit, token, acquired_at, expires_at, holder, live = row
        return LeaseInfo(
            key=key,
            holder=Holder.from_dict(holder or {}),
            fencing_token=int(token),
            acquired_at=_utc(acquired_at),
            expires_at=_utc(expires_at),
            expired=not live,
            slot=int(slot),
            limit=int(slot_limit),
        )


def _clock_offset(conn: psycopg.Connection) -> tuple[float, float]:
    """(server clock - ours, round trip) in seconds: the sample of three with the shortest
    round trip."""
    best: tuple[float, float] | None = None
    for _ in range(3):
        before, started = time.time(), time.perf_counter()
        query = "SELECT extract(epoch FROM clock_timestamp())::float8"
        server = conn.execute(query).fetchone()[0]
        elapsed = time.perf_counter() - started
        offset = float(server) - (before + elapsed / 2)
        if best is None or elapsed < best[1]:
            best = (offset, elapsed)
    assert best is not None
    return best
