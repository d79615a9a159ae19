"""The PostgreSQL store's table: its DDL, the look at it on a new connection, its
creation on first use and its migration from older shapes (before semaphores, before lock
modes)."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable

import psycopg
import psycopg.errors as pgerr
from psycopg import sql

from tasklock_cli.errors import ConfigError
from tasklock_cli.stores.postgres.epochs import EPOCH_ROW_DDL
from tasklock_cli.stores.postgres.epochs import refused_function

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_$]{0,62}")

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
    "mode": "text",
}
#: The shapes an older tasklock left, migrated by ``_migrate``: the table before lock modes
#: (no ``mode``: every lease exclusive), and before semaphores (one row per key).
_COLUMNS_BEFORE_MODES = {name: kind for name, kind in _COLUMNS.items() if name != "mode"}
_COLUMNS_BEFORE_SLOTS = {
    name: kind for name, kind in _COLUMNS_BEFORE_MODES.items() if name not in ("slot", "slot_limit")
}
_OLDER_COLUMNS = (_COLUMNS_BEFORE_MODES, _COLUMNS_BEFORE_SLOTS)
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
    mode          text NOT NULL DEFAULT 'exclusive',
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
CREATE TABLE IF NOT EXISTS {waiters} (
    seq           bigserial PRIMARY KEY,
    key           text COLLATE "C" NOT NULL,
    owner_token   text NOT NULL,
    holder        jsonb NOT NULL,
    mode          text NOT NULL DEFAULT 'exclusive',
    since         timestamptz NOT NULL,
    expires_at    timestamptz NOT NULL,
    supersede     boolean NOT NULL DEFAULT false,
    superseded    boolean NOT NULL DEFAULT false,
    UNIQUE (key, owner_token)
);
CREATE INDEX IF NOT EXISTS {waiters_index} ON {waiters} (key, seq);
"""
# From older shapes. Before lock modes: the leases gain ``mode`` (default 'exclusive', so
# the leases and places of an older tasklock still connected stay exclusive), the places in
# queues ``supersede``/``superseded`` (default false). Before semaphores (one row per key):
# its rows become slot 0 of limit 1 and the unique key moves from (key) to (key, slot).
# Idempotent; a no-op on a current table or none. ``PgSchema._migrate`` runs it under the
# schema lock; ``schema_sql`` prints it.
_MIGRATE = """
DO $migrate$
DECLARE
    drop_old_key text;
BEGIN
    IF to_regclass({waiters_name}) IS NOT NULL THEN
        ALTER TABLE {waiters}
            ADD COLUMN IF NOT EXISTS supersede boolean NOT NULL DEFAULT false,
            ADD COLUMN IF NOT EXISTS superseded boolean NOT NULL DEFAULT false;
    END IF;
    IF to_regclass({name}) IS NULL THEN
        RETURN;
    END IF;
    ALTER TABLE {table} ADD COLUMN IF NOT EXISTS slot integer NOT NULL DEFAULT 0,
                        ADD COLUMN IF NOT EXISTS slot_limit integer NOT NULL DEFAULT 1,
                        ADD COLUMN IF NOT EXISTS mode text NOT NULL DEFAULT 'exclusive';
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

# One query, which reads:
# - the kind of relation, and its columns;
# - the columns of each unique index (as "a,b");
# - whether the run ledger's and the waiters' tables exist;
# - whether the waiters' table is from before lock modes.
# Parameters: their names, the waiters' again, the table's.
INSPECT = """
SELECT c.oid::bigint, c.relkind::text,
       to_regclass(%s) IS NOT NULL AND to_regclass(%s) IS NOT NULL,
       to_regclass(%s) IS NOT NULL
       AND NOT EXISTS (SELECT FROM pg_attribute
                        WHERE attrelid = to_regclass(%s) AND attname = 'superseded'
                          AND NOT attisdropped),
       (SELECT coalesce(json_object_agg(a.attname, format_type(a.atttypid, a.atttypmod)),
                        '{}'::json)
          FROM pg_attribute a
         WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped),
       ARRAY(SELECT string_agg(a.attname, ',' ORDER BY k.n)
               FROM pg_index i
              CROSS JOIN LATERAL unnest(i.indkey::int2[]) WITH ORDINALITY AS k(attnum, n)
               JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
              WHERE i.indrelid = c.oid AND i.indisunique AND i.indpred IS NULL
              GROUP BY i.indexrelid),
       coalesce(has_table_privilege(to_regclass(%s), 'SELECT'), false)
  FROM pg_class c
 WHERE c.oid = to_regclass(%s)
"""


class Unset:
    """Not looked at yet (as opposed to None: looked at, and missing)."""


UNSET = Unset()


def parse_table(name: str) -> tuple[str, ...]:
    """``"leases"`` -> ``("leases",)``, ``"ops.leases"`` -> ``("ops", "leases")``."""
    parts = tuple(name.split("."))
    if not 1 <= len(parts) <= 2 or not all(_IDENTIFIER.fullmatch(part) for part in parts):
        raise ConfigError(
            f"invalid table name {name!r} in the store URL (expected NAME or SCHEMA.NAME, "
            "each a letter or underscore followed by up to 62 letters, digits, _ or $)"
        )
    return parts


class PgSchema:
    """The lease table and the run ledger's table beside it, as one store URL names them.

    ``ensure`` (once per connection) checks that the table is a tasklock table, creates
    it when missing and migrates it when it is of an older shape; it then knows the
    table's oid, which names the channels."""

    def __init__(self, table: str, display_url: str, scrub: Callable[[str], str]) -> None:
        self.table_name = table
        self._display_url = display_url
        self._scrub = scrub
        self._parts = parse_table(table)
        self.table = sql.Identifier(*self._parts)
        # The run ledger's table, beside the leases' (names are at most 63 bytes).
        runs_parts = (*self._parts[:-1], self._parts[-1][:58] + "_runs")
        self.runs = sql.Identifier(*runs_parts)
        self.runs_table_name = ".".join(runs_parts)
        # The queues of waiters, beside them too.
        waiters_parts = (*self._parts[:-1], self._parts[-1][:55] + "_waiters")
        self.waiters = sql.Identifier(*waiters_parts)
        self.waiters_table_name = ".".join(waiters_parts)
        # As text that to_regclass() and pg_get_serial_sequence() read (quoted: case kept).
        self.quoted_name = ".".join(f'"{part}"' for part in self._parts)
        self.waiters_quoted_name = ".".join(f'"{part}"' for part in waiters_parts)
        self.oid = 0
        self.channel = ""  # where releases are notified
        #: The run ledger's table exists and this role may read it (it may not beside a
        #: lease table from before it, where it cannot be made, or for a role granted the
        #: leases alone): the acquire reads its tokens (``ledger_tokens``).
        self.reads_ledger = True

    def inspection_params(self, conn: psycopg.Connection) -> list[str]:
        waiters = self.waiters.as_string(conn)
        runs = self.runs.as_string(conn)
        return [runs, waiters, waiters, waiters, runs, self.table.as_string(conn)]

    def inspect(self, conn: psycopg.Connection) -> tuple[int, bool, bool, bool] | None:
        return self.judge(conn.execute(INSPECT, self.inspection_params(conn)).fetchone())

    def judge(self, row: tuple | None) -> tuple[int, bool, bool, bool] | None:
        """(the table's oid, whether the run ledger's table exists, whether it or the
        waiters' table is of an older shape, to migrate, whether the ledger may be read)
        when it is a tasklock table, None when missing; else ConfigError."""
        if row is None:
            return None
        oid, relkind, has_runs, old_waiters, columns, unique_keys, ledger_readable = row
        columns = dict(columns or {})
        unique_keys = set(unique_keys or ())
        if relkind not in ("r", "p"):
            raise ConfigError(
                f"{self._display_url}: {self.table_name} exists but is not a table "
                f"(relkind {relkind!r}); choose another name with ?table="
            )
        current = columns == _COLUMNS and unique_keys >= {"key,slot"} and "key" not in unique_keys
        older = columns in (_COLUMNS, *_OLDER_COLUMNS) and bool(unique_keys & {"key", "key,slot"})
        if not (current or older):
            found = ", ".join(f"{name} {kind}" for name, kind in sorted(columns.items()))
            why = "" if unique_keys & {"key", "key,slot"} else "; no unique index on key"
            raise ConfigError(
                f"{self._display_url}: table {self.table_name} exists but is not a tasklock "
                f"table (columns: {found or 'none'}{why}); choose another name with ?table="
            )
        return int(oid), bool(has_runs), not current or bool(old_waiters), bool(ledger_readable)

    def describe(self, conn: psycopg.Connection) -> tuple[bool, str]:
        """``doctor``'s line about the table (it changes nothing)."""
        try:
            found = self.inspect(conn)
        except ConfigError as exc:
            return False, str(exc)
        if found is None:
            return True, f"table {self.table_name} will be created on first use"
        if found[2]:
            return (
                True,
                f"table {self.table_name} is an older tasklock table (migrated on first use)",
            )
        return True, f"table {self.table_name} is a tasklock table"

    def ensure(
        self, conn: psycopg.Connection, inspected: tuple | Unset | None, timeout_ms: int
    ) -> None:
        """The table exists (created if missing), is ours, and is current (migrated).
        ``inspected``: the table's row, when the connection's set-up read it already.
        ``timeout_ms``: the statement timeout of a creation or migration (its own
        transaction's; the session keeps its own)."""
        found = self.inspect(conn) if isinstance(inspected, Unset) else self.judge(inspected)
        if found is None:
            self._create(conn, timeout_ms)
            found = self.inspect(conn)
            if found is None:
                raise ConfigError(
                    f"{self._display_url}: table {self.table_name} could not be created"
                )
        else:
            if found[2]:
                self._migrate(conn, timeout_ms)
                found = self.inspect(conn) or found
            if not found[1]:
                # A lease table from before the run ledger or the queues. Leases work
                # without the ledger: when it cannot be created, writing a run fails
                # instead (and the run's release is retried without it).
                with contextlib.suppress(ConfigError):
                    self._create(conn, timeout_ms)
                found = self.inspect(conn) or found
        self.reads_ledger = found[1] and found[3]
        self.found(found[0])

    def ledger_tokens(self) -> sql.Composable:
        """The acquire's reading of the highest token the run ledger recorded (the epoch
        steps read it when the table has no epoch row); NULL without a ledger."""
        if not self.reads_ledger:
            return sql.SQL("NULL::bigint")
        return sql.SQL("(SELECT max(fencing_token) FROM {})").format(self.runs)

    def found(self, oid: int) -> None:
        """The table is ours, current, and has this oid (which names the channels)."""
        self.oid = oid
        self.channel = f"tasklock_released_{oid}"

    def _lock_id(self) -> int:
        import hashlib  # (here: OpenSSL's libcrypto, ~11 M instructions, for a first use only)

        digest = hashlib.sha256(f"tasklock:{self.table_name}".encode()).digest()
        return int.from_bytes(digest[:8], "big", signed=True)

    def _lock(self, conn: psycopg.Connection, timeout_ms: int) -> None:
        """Within a creation's or migration's transaction: its statement timeout, and the
        schema lock (racing first users queue on it)."""
        conn.execute(f"SET LOCAL statement_timeout = {int(timeout_ms)}")
        conn.execute("SELECT pg_advisory_xact_lock(%s)", [self._lock_id()])

    def _create(self, conn: psycopg.Connection, timeout_ms: int) -> None:
        try:
            # Racing first users queue on the advisory lock; CREATE ... IF NOT EXISTS
            # alone can still fail with unique_violation on pg_type when two race.
            with conn.transaction():
                self._lock(conn, timeout_ms)
                conn.execute(self.ddl())
                conn.execute(self.epoch_row())  # with the table: a standby has both or none
        except (pgerr.UniqueViolation, pgerr.DuplicateTable, pgerr.DuplicateObject):
            pass  # someone without our advisory lock created it at the same moment
        except (pgerr.InsufficientPrivilege, pgerr.InvalidSchemaName) as exc:
            if refused_function(exc):
                raise  # the epoch row's identity, not the table: said as such by the caller
            raise ConfigError(
                f"{self._display_url}: table {self.table_name} is missing and cannot be "
                f"created ({self._scrub(str(exc))}); have a DBA run the output of "
                "`tasklock init --print-sql`"
            ) from None

    def _migrate(self, conn: psycopg.Connection, timeout_ms: int) -> None:
        """Bring a table of an older shape to the current one (see ``_MIGRATE``).

        - The rows of a table from before semaphores become slot 0 of limit 1.
          Their fencing tokens stay: a key's counter row starts from them.
        - Leases and places from before lock modes are exclusive.
        - No place is superseded.

        It runs under the schema lock and in one transaction.
        So racing clients migrate the table once; one that comes second finds it done."""
        try:
            with conn.transaction():
                self._lock(conn, timeout_ms)
                found = self.inspect(conn)
                if found is not None and found[2]:
                    conn.execute(self.migration())
        except pgerr.InsufficientPrivilege as exc:
            raise ConfigError(
                f"{self._display_url}: table {self.table_name} is from an older tasklock and "
                f"cannot be migrated ({self._scrub(str(exc))}); have a DBA run the output "
                "of `tasklock init --print-sql`"
            ) from None

    def migration(self) -> sql.Composed:
        return sql.SQL(_MIGRATE).format(
            table=self.table,
            name=sql.Literal(self.quoted_name),
            waiters=self.waiters,
            waiters_name=sql.Literal(self.waiters_quoted_name),
        )

    def ddl(self) -> sql.Composed:
        index = self._parts[-1][:50] + "_expires_idx"
        waiters_index = self._parts[-1][:50] + "_queue_idx"
        return sql.SQL(_DDL).format(
            table=self.table,
            index=sql.Identifier(index),
            runs=self.runs,
            waiters=self.waiters,
            waiters_index=sql.Identifier(waiters_index),
        )

    def epoch_row(self) -> sql.Composed:
        """The table's failover epoch row (see ``epochs``), unless it has one."""
        return sql.SQL(EPOCH_ROW_DDL).format(table=self.table, runs=self.runs)

    def schema_sql(self) -> str:
        return (
            "-- tasklock lease table; rows are never deleted (they keep the fencing counter),\n"
            "-- the run ledger's table and the queues of waiters\n"
            + self.ddl().as_string(None)
            + "-- tables of an older tasklock: before lock modes, leases and places become\n"
            "-- exclusive; before semaphores (one row per key), rows become slot 0 of limit 1\n"
            "-- (nothing to do on current tables)"
            + self.migration().as_string(None)
            + "-- the table's failover epoch row: the server it was written on (run this on\n"
            "-- the primary)\n" + self.epoch_row().as_string(None)
        )
