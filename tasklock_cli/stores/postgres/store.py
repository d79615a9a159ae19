"""The PostgreSQL store class and its statements (the overview is the package's docstring)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from typing import Literal
from urllib.parse import unquote

import psycopg
import psycopg.errors as pgerr
from psycopg import sql
from psycopg.types.json import Jsonb

from tasklock_cli.errors import CounterUnreadable
from tasklock_cli.errors import FencingExhausted
from tasklock_cli.errors import LimitMismatch
from tasklock_cli.errors import QueueFull
from tasklock_cli.errors import StoreUnavailable
from tasklock_cli.errors import Superseded
from tasklock_cli.errors import TasklockError
from tasklock_cli.stores.failover import Quarantines
from tasklock_cli.stores.failover import quarantine_text
from tasklock_cli.stores.model import BROKEN_OWNER_PREFIX
from tasklock_cli.stores.model import LEDGER_KEEP
from tasklock_cli.stores.model import SHARED
from tasklock_cli.stores.model import UNREADABLE_EXPIRY_FLOOR_S
from tasklock_cli.stores.model import UNREADABLE_EXPIRY_MARGIN_S
from tasklock_cli.stores.model import Ask
from tasklock_cli.stores.model import Holder
from tasklock_cli.stores.model import Lease
from tasklock_cli.stores.model import LeaseInfo
from tasklock_cli.stores.model import RunRecord
from tasklock_cli.stores.model import breaker
from tasklock_cli.stores.model import breaker_of
from tasklock_cli.stores.model import place_record
from tasklock_cli.stores.postgres import CAPABILITIES
from tasklock_cli.stores.postgres.breaks import PgBreakListeners
from tasklock_cli.stores.postgres.connection import Overrun
from tasklock_cli.stores.postgres.connection import PgConnection
from tasklock_cli.stores.postgres.connection import one_row
from tasklock_cli.stores.postgres.epochs import BOUND_FORGED_QUARANTINE
from tasklock_cli.stores.postgres.epochs import EPOCH_KEY
from tasklock_cli.stores.postgres.epochs import EPOCH_SLOT
from tasklock_cli.stores.postgres.epochs import QUARANTINE_LEFT
from tasklock_cli.stores.postgres.queue import ACQUIRE
from tasklock_cli.stores.postgres.queue import ACQUIRE_IN_BAND
from tasklock_cli.stores.postgres.queue import COUNTER_SLOT
from tasklock_cli.stores.postgres.queue import LEAVE_QUEUE
from tasklock_cli.stores.postgres.queue import PAYLOAD
from tasklock_cli.stores.postgres.queue import SWEEP_WAITERS
from tasklock_cli.stores.postgres.queue import TIME_UNTIL_FREE
from tasklock_cli.stores.postgres.queue import WAKE_CTES
from tasklock_cli.stores.postgres.reads import INFO_COLUMNS
from tasklock_cli.stores.postgres.reads import SUCCEEDED
from tasklock_cli.stores.postgres.reads import PgReads
from tasklock_cli.stores.postgres.reads import lease_info_of
from tasklock_cli.stores.postgres.reads import utc
from tasklock_cli.stores.postgres.schema import PgSchema
from tasklock_cli.stores.postgres.waiting import PgListening
from tasklock_cli.stores.queueing import QUEUED
from tasklock_cli.stores.queueing import Queued
from tasklock_cli.stores.sql import SqlStore
from tasklock_cli.stores.sql import taken_lease
from tasklock_cli.stores.urls import redact_url
from tasklock_cli.stores.watches import BreakWatches

#: ``list`` in the store class's body is its method: annotations there say builtins.list.
TYPE_CHECKING = False
if TYPE_CHECKING:
    import builtins

DEFAULT_TABLE = "tasklock_leases"
SWEEP_BATCH = 1000
#: How often an acquire runs again after losing a race (another acquire of the key
#: committed since its snapshot; each loss is another client's win).
ACQUIRE_RACE_RETRIES = 50
#: How often a waiter looks again at a key whose slots changed during its look.
STALE_LOOKS = 3
_CLEARED = "owner_token = NULL, holder = NULL, acquired_at = NULL, expires_at = NULL"
# The lease of %(owner)s in slot %(slot)s, with fencing token %(fence)s.
_OURS = (
    "key = %(key)s AND slot = %(slot)s AND owner_token = %(owner)s AND fencing_token = %(fence)s"
)
#: A new connection's acquire sets the session up itself (``_acquire``, ``PgConnection.run``):
#: before its statement, the lease table's oid, which names the channels, and a read of each
#: of the tables (a missing one fails the call, which is then made again on a connection set
#: up as usual, whose look at the schema creates it).
_IN_BAND_OID = "SELECT {table}::regclass::oid, {runs}::regclass, {waiters}::regclass; "
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
# A release that freed its slot wakes the waiters that may now be admitted (see queue):
# one 'freed' row, and a 'woken' row per notification.
_FREED = """
SELECT 'freed' FROM cleared
UNION ALL
SELECT 'woken' || pg_notify(%(channel)s, wake.payload)::text FROM cleared, wake
"""
# (``done``: its command has ended; nothing runs under the lease any more)
_RELEASE_LATER = f"""
WITH kept AS (
    UPDATE {{table}}
       SET expires_at = clock_timestamp() + make_interval(secs => %(keep)s::float8),
           holder = holder || '{{{{"done": true}}}}'::jsonb
     WHERE {_OURS} AND expires_at > clock_timestamp()
    RETURNING key
), cleared AS ({_FREE_OURS.replace("%(owner)s, ", "")}), {WAKE_CTES}
SELECT 'freed' FROM kept
UNION ALL{_FREED}"""
_RELEASE = f"""
WITH cleared AS ({_FREE_OURS}), {WAKE_CTES}{_FREED}"""
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
                             WHERE key = %(key)s AND {SUCCEEDED}
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
# The leases on %(key)s, or the one with fencing token %(token)s when not NULL.
_MATCHING = (
    "key = %(key)s AND owner_token IS NOT NULL"
    " AND (%(token)s::bigint IS NULL OR fencing_token = %(token)s::bigint)"
)
_FORCE_RELEASE = f"""
WITH old AS (
    SELECT {INFO_COLUMNS}, expires_at > clock_timestamp() AS live
      FROM {{table}} WHERE {_MATCHING}
       FOR UPDATE
), cleared AS (
    UPDATE {{table}} AS t SET {_CLEARED}
      FROM old WHERE t.key = old.key AND t.slot = old.slot AND t.owner_token IS NOT NULL
    RETURNING t.slot
)
SELECT old.key, old.slot, old.slot_limit, old.fencing_token, old.acquired_at, old.expires_at,
       old.holder, old.mode, old.live,
       pg_notify(%(channel)s, {PAYLOAD.format(col="old.key")}),
       pg_notify(%(break_channel)s, old.fencing_token::text)
  FROM old JOIN cleared ON cleared.slot = old.slot
 ORDER BY old.slot
"""
_ALREADY_BROKEN = "left(owner_token, length(%(prefix)s)) = %(prefix)s"
# (the first break's breaker stays: SET sees the row as it was)
_BREAK = f"""
WITH broken AS (
    UPDATE {{table}} SET
        owner_token = CASE WHEN {_ALREADY_BROKEN} THEN owner_token
                           ELSE %(prefix)s || owner_token END,
        holder = CASE WHEN {_ALREADY_BROKEN} THEN holder
                      ELSE holder || jsonb_build_object('broken_by', %(by)s::jsonb) END
     WHERE {_MATCHING} AND expires_at > clock_timestamp()
    RETURNING {INFO_COLUMNS}
)
SELECT {INFO_COLUMNS}, true, pg_notify(%(break_channel)s, fencing_token::text) FROM broken
 ORDER BY slot
"""
# A live lease kept after its command ended (--hold-at-least): nobody is there to let go.
_DONE = """SELECT 1 FROM {table}
 WHERE key = %(key)s AND fencing_token = %(token)s AND owner_token IS NOT NULL
   AND expires_at > clock_timestamp() AND holder @> '{{"done": true}}'::jsonb"""
_BROKEN_BY = """SELECT holder -> 'broken_by' FROM {table}
 WHERE key = %(key)s AND slot = %(slot)s AND owner_token = %(broken)s
   AND fencing_token = %(fence)s"""
# Our lease is still ours, unbroken (expired or not: the renewal tells that).
_INTACT = f"SELECT 1 FROM {{table}} WHERE {_OURS}"
# A lease whose expiry cannot be read: none, or one Python cannot hold (``infinity``,
# after the year 9999). No tasklock writes one; it is never judged expired (it may be a
# live holder's), and sweep and release --force give it the longest expiry a holder's
# lease could have (model.UNREADABLE_EXPIRY_FLOOR_S; the table's longest TTL is the epoch
# row's). A live lease, for every listing, is one that has not run out or is such a one.
_UNREADABLE_EXPIRY = (
    "owner_token IS NOT NULL"
    " AND (expires_at IS NULL OR expires_at >= '10000-01-01 00:00:00Z'::timestamptz)"
)
_LONGEST_TTL = f"""(SELECT CASE WHEN jsonb_typeof(holder -> 'max_ttl') = 'number'
                   THEN (holder ->> 'max_ttl')::float8 END
     FROM {{table}} WHERE key = '{EPOCH_KEY}' AND slot = {EPOCH_SLOT})"""
_BOUND = f"""make_interval(secs => least(1e9,
           greatest(coalesce({_LONGEST_TTL}, 0), {UNREADABLE_EXPIRY_FLOOR_S}))
           + {UNREADABLE_EXPIRY_MARGIN_S})"""
_BOUND_EXPIRY = f"""
UPDATE {{table}} SET expires_at = clock_timestamp() + {_BOUND}
 WHERE {_UNREADABLE_EXPIRY} {{live}}
"""
# A live lease of the key whose expiry lies further ahead than any lease the table granted
# could have (someone else wrote 9999-12-31), and not one kept after its command ended (a
# hold may be longer, and release --force frees that at once): release --force bounds it
# as an unreadable one, so the key frees when a holder's lease could no longer be valid.
_BOUND_FORGED_EXPIRY = f"""
UPDATE {{table}} SET expires_at = clock_timestamp() + {_BOUND}
 WHERE key = %(key)s AND owner_token IS NOT NULL AND NOT ({_UNREADABLE_EXPIRY})
   AND expires_at > clock_timestamp() + {_BOUND} AND NOT holder @> '{{{{"done": true}}}}'::jsonb
"""
_OF_KEY = "AND key = %(key)s"
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
SELECT key, slot, pg_notify(%(channel)s, {PAYLOAD.format(col="key")}) FROM cleared
"""


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


class PostgresStore(PgReads, SqlStore, capabilities=CAPABILITIES):
    #: Trouble while waiting: the wait sleeps out its time, the next acquire reports it.
    waiting_trouble = (TasklockError,)
    _db: PgConnection
    _schema: PgSchema

    def __init__(self, conninfo: str, table: str = DEFAULT_TABLE, display_url: str = "") -> None:
        self.display_url = display_url or redact_url(conninfo)
        self._schema = PgSchema(table, self.display_url, lambda text: self._db.scrub(text))
        self._db = PgConnection(conninfo, self.display_url, self._schema)
        self.table_name = table
        self.runs_table_name = self._schema.runs_table_name
        self._statements: dict[tuple[str, str, str, bool], sql.Composed] = {}
        self._listening = PgListening(self._db, self._schema)
        self._quarantines = Quarantines()  # the failover quarantines our acquires met
        self._breaks = PgBreakListeners(self._db, self._schema, self._sql(_INTACT))
        self._break_watches = BreakWatches(
            self._breaks.open, (psycopg.Error, Overrun, OSError, TasklockError)
        )

    @classmethod
    def from_url(cls, url: str) -> PostgresStore:
        clean, table = split_table(url)
        return cls(clean, table=table, display_url=redact_url(url))

    def _sql(self, template: str, live: str = "", upper: str = "") -> sql.Composed:
        """A statement with the table names quoted in; built once per template (and
        whether the acquire reads the run ledger)."""
        cache_key = (template, live, upper, self._schema.reads_ledger)
        statement = self._statements.get(cache_key)
        if statement is None:
            statement = sql.SQL(template).format(
                table=self._schema.table,
                runs=self._schema.runs,
                waiters=self._schema.waiters,
                waiters_name=sql.Literal(self._schema.waiters_quoted_name),
                table_name=sql.Literal(self._schema.quoted_name),
                ledger_tokens=self._schema.ledger_tokens(),
                live=sql.SQL(live),
                upper=sql.SQL(upper),
            )
            self._statements[cache_key] = statement
        return statement

    # -- the interface --------------------------------------------------------------

    def _acquire(
        self, key: str, ttl: float, holder: Holder, owner: str, limit: int, queue: bool, ask: Ask
    ) -> Lease | Queued | None:
        params = {
            "key": key,
            "owner": owner,
            "holder": Jsonb(place_record(holder, ask)),
            "ttl": float(ttl),
            "limit": int(limit),
            "queue": queue,
            "wttl": float(self.waiter_ttl),
            "mode": ask.mode,
            "shared": ask.mode == SHARED,
            "supersede": ask.supersede,
            "front": ask.front,
            "priority": int(ask.priority),
            "max_waiting": ask.max_waiting,
        }

        def attempt(conn: psycopg.Connection) -> list:
            channel = self._schema.channel  # known once connected
            statement = self._sql(ACQUIRE)  # (as the connection found the run ledger)
            with _counter_errors(key):
                return self._listening.acquire(conn, statement, {**params, "channel": channel})

        def in_band(conn: psycopg.Connection, set_up: str) -> tuple[int, list]:
            with _counter_errors(key):
                return self._acquire_in_band(conn, set_up, params)

        for _ in range(ACQUIRE_RACE_RETRIES):
            rows = self._db.run(attempt, in_band=in_band)
            queued = self._note_place(key, rows)
            left_ms = next((row[3] for row in rows if row[0] == "quarantine"), None)
            self._quarantines.met(key, None if left_ms is None else int(left_ms))
            if left_ms:
                self._db.run(lambda conn: conn.execute(self._sql(BOUND_FORGED_QUARANTINE)))
            outcome = _outcome(key, owner, limit, rows)
            if outcome is None and any(row[0] == "full" for row in rows):
                raise QueueFull(key, ask.max_waiting or 0)
            if outcome != "lost":
                return QUEUED if queued and outcome is None else outcome
            # "lost": another acquire of the key committed since the statement's snapshot
        raise StoreUnavailable(
            f"{self.display_url}: {key!r} is taken and freed too fast to acquire it"
        )

    def _acquire_in_band(self, conn: psycopg.Connection, set_up: str, params: dict) -> tuple:
        """``(the table's oid, the acquire's rows)`` on a new connection, with its session
        settings (``PgConnection.run``'s ``in_band``): the release channel named by the oid
        as the statement finds it, and the tables read (a missing one fails the call)."""
        query = sql.SQL(set_up + _IN_BAND_OID).format(
            table=sql.Literal(self._schema.quoted_name),
            runs=sql.Literal(self._schema.runs.as_string(conn)),
            waiters=sql.Literal(self._schema.waiters_quoted_name),
        ) + self._sql(ACQUIRE_IN_BAND)
        cursor = psycopg.ClientCursor(conn)  # one simple query, parameters bound here
        cursor.execute(query, params)
        while cursor.description is None:  # the settings'
            cursor.nextset()
        oid = one_row(cursor)[0]
        cursor.nextset()
        return int(oid), cursor.fetchall()

    def _note_place(self, key: str, rows: list) -> bool:
        """Our place in ``key``'s queue as the acquire left it: True when we have one."""
        seq = next((row[3] for row in rows if row[0] == "queued"), None)
        if seq is None:
            self._listening.places.pop(key, None)
            return False
        self._listening.places[key] = int(seq)
        return True

    def holdup(self, key: str) -> str | None:
        return _quarantine_text(self._quarantines.left(key))

    def quarantine(self) -> str | None:
        statement = self._sql(QUARANTINE_LEFT)
        row = self._db.run(lambda conn: conn.execute(statement).fetchone())
        return _quarantine_text(None if row is None else row[0])

    def renew(self, lease: Lease, ttl: float) -> Lease:
        params = {
            "key": lease.key,
            "slot": lease.slot,
            "owner": lease.owner_token,
            "fence": lease.fencing_token,
            "ttl": float(ttl),
        }
        statement = self._sql(_RENEW)
        row = self._db.run(lambda conn: conn.execute(statement, params).fetchone())
        return lease.renewed_until(None if row is None else utc(row[0]))

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
                rows = conn.execute(later, {**params, "channel": self._schema.channel}).fetchall()
                return _freed(rows)

            count = self._db.run(run_later)
        else:
            now = self._sql(_RELEASE if record is None else _RELEASE_RECORDED)

            def run(conn: psycopg.Connection) -> int:
                channel = self._schema.channel  # known once connected
                return _freed(conn.execute(now, {**params, "channel": channel}).fetchall())

            # Not retried on an ambiguous failure: if the row was cleared and the reply
            # lost, a retry would report False although the release worked.
            count = self._db.run(run, idempotent=False)
        return count == 1

    def time_left(self, key: str, fencing_token: int) -> float | None:
        statement = self._sql(_TIME_LEFT)
        params = {"key": key, "token": fencing_token, "prefix": BROKEN_OWNER_PREFIX}
        row = self._db.run(lambda conn: conn.execute(statement, params).fetchone())
        return max(0.0, float(row[0])) if row else None

    def sweep(self, dry_run: bool = False) -> int:
        if dry_run:
            count_sql = self._sql(_SWEEP_COUNT)
            return int(self._db.run(lambda conn: one_row(conn.execute(count_sql))[0]))
        statement = self._sql(_SWEEP)
        dead_places = self._sql(SWEEP_WAITERS)  # (not counted: no leases)
        self._db.run(lambda conn: conn.execute(dead_places))
        bound = self._sql(_BOUND_EXPIRY)
        self._db.run(lambda conn: conn.execute(bound))

        after: tuple[str, int] = ("", COUNTER_SLOT)  # keys are never empty

        def batch(conn: psycopg.Connection) -> list[tuple[str, int]]:
            params = {"channel": self._schema.channel, "after": after[0], "after_slot": after[1]}
            return [(row[0], row[1]) for row in conn.execute(statement, params).fetchall()]

        removed = 0
        while True:  # bounded batches: no statement holds many row locks for long
            started = time.monotonic()
            cleared = self._db.run(batch)
            removed += len(cleared)
            if len(cleared) < SWEEP_BATCH:
                return removed
            after = max(cleared)
            # Leave the server (and its WAL) to other clients twice as long as a batch took.
            time.sleep(2 * (time.monotonic() - started))

    def break_lease(
        self, key: str, token: int | None = None, by: Holder | None = None
    ) -> builtins.list[LeaseInfo]:
        statement = self._sql(_BREAK)
        bound = self._sql(_BOUND_EXPIRY, _OF_KEY)
        forged = self._sql(_BOUND_FORGED_EXPIRY)
        params = {
            "key": key,
            "token": token,
            "prefix": BROKEN_OWNER_PREFIX,
            "by": json.dumps(breaker(by)),
        }

        def run(conn: psycopg.Connection) -> list[tuple]:
            channel = self._breaks.channel(key)  # known once connected
            conn.execute(bound, params)
            conn.execute(forged, params)
            return conn.execute(statement, {**params, "break_channel": channel}).fetchall()

        rows = self._db.run(run)  # idempotent: a broken lease is found again and told again
        return [lease_info_of(row[:9]) for row in rows]

    def broken_by(self, lease: Lease) -> dict | None:
        statement = self._sql(_BROKEN_BY)
        params = {
            "key": lease.key,
            "slot": lease.slot,
            "broken": BROKEN_OWNER_PREFIX + lease.owner_token,
            "fence": lease.fencing_token,
        }
        row = self._db.run(lambda conn: conn.execute(statement, params).fetchone())
        return breaker_of(row[0]) if row else None

    def free_if_holder_gone(self, key: str, token: int) -> bool:
        """Only a lease kept after its command ended (--hold-at-least) is known to have
        nobody under it: its holder has exited."""
        statement = self._sql(_DONE)
        params = {"key": key, "token": token}
        done = self._db.run(lambda conn: conn.execute(statement, params).fetchone())
        return done is not None and bool(self.force_release(key, token))

    def force_release(self, key: str, token: int | None = None) -> builtins.list[LeaseInfo]:
        statement = self._sql(_FORCE_RELEASE)

        def run(conn: psycopg.Connection) -> list[tuple]:
            params = {
                "key": key,
                "token": token,
                "channel": self._schema.channel,
                "break_channel": self._breaks.channel(key),
            }
            return conn.execute(statement, params).fetchall()

        rows = self._db.run(run, idempotent=False)
        return [lease_info_of(row[:9]) for row in rows]

    # -- a holder waiting for a break ---------------------------------------------------

    def wait_for_break(self, lease: Lease, timeout: float, wake_fd: int | None = None) -> bool:
        """LISTEN on the lease's break channel on a connection of its own, then select on it
        and ``wake_fd`` (see BreakWatches)."""
        return self._break_watches.wait(lease, timeout, wake_fd)

    # -- waiting (the skeleton is Store.wait_for_release; the listening, PgListening) ----

    def _prepare_wait(self, key: str, deadline: float, wake_fd: int | None) -> bool:
        self._listening.prepare()
        return True

    def _time_until_free(self, key: str) -> float | None:
        quarantine_left = self._quarantines.left(key)
        if quarantine_left > 0:
            return quarantine_left
        statement = self._sql(TIME_UNTIL_FREE)
        params = {"key": key, "seq": self._listening.places.get(key)}
        for _ in range(STALE_LOOKS):
            row = self._db.run(lambda conn: one_row(conn.execute(statement, params)))
            if not row[0]:
                break
        _, left, live, limit, ahead, exclusive_ahead, mode = row
        if left is not None:
            return max(0.0, float(left))
        if mode == SHARED:  # shared places ahead of ours are admitted with us
            return None if int(exclusive_ahead) == 0 else self.waiter_ttl
        free = int(limit) - int(live) if live else 1  # (a free key's limit is the next taker's)
        return None if int(ahead) < free else self.waiter_ttl

    def _await_wakeup(self, key: str, until: float, wake_fd: int | None) -> None:
        self._listening.await_wakeup(key, until, wake_fd)

    def _leave_queue(self, key: str, owner: str | None) -> None:
        self._listening.stop(key, self._sql(LEAVE_QUEUE))

    def _close(self) -> None:
        self._break_watches.close()
        self._db.close()


def _quarantine_text(left: float | None) -> str | None:
    """What a failover quarantine with ``left`` seconds to run means; None when over."""
    return quarantine_text(
        "the PostgreSQL primary changed or restarted without a clean shutdown (a failover, "
        "a crash, a restored backup), or the table was lost and made again",
        "table",
        left,
    )


def _outcome(key: str, owner: str, limit: int, rows: list) -> Lease | Literal["lost"] | None:
    """What the acquire statement's ``rows`` tell: the lease taken, None (nothing free),
    or "lost" (run it again); LimitMismatch or Superseded raised."""
    outcomes = {row[0]: row for row in rows if not row[0].startswith("woken")}
    if "superseded" in outcomes:
        raise Superseded(key)
    outcomes.pop("queued", None)
    outcomes.pop("full", None)  # (raised by ``_acquire``)
    outcomes.pop("quarantine", None)  # (noted by ``_acquire``)
    if not outcomes:
        return None
    outcome, *columns = next(iter(outcomes.values()))
    if outcome == "mismatch":
        raise LimitMismatch(key, int(columns[1]), int(limit))
    if outcome != "taken":
        return outcome
    return taken_lease(key, owner, tuple(columns), utc)


def _freed(rows: list) -> int:
    """How many leases a release statement freed (or kept for later): its 'freed' rows (the
    others tell the waiters it woke)."""
    return sum(1 for row in rows if row[0] == "freed")


@contextmanager
def _counter_errors(key: str) -> Iterator[None]:
    """A key's fencing counter that has no next token (at 2**63-1), or that is below 0 (see
    queue._ACQUIRE_TAKE), as tasklock's errors."""
    try:
        yield
    except pgerr.NumericValueOutOfRange:
        raise FencingExhausted(key) from None
    except pgerr.DivisionByZero:
        raise CounterUnreadable(key) from None
