"""PostgreSQL store: one statement per operation, expiry on the server's clock.

Every statement runs in autocommit under READ COMMITTED and reads ``clock_timestamp()``,
so no transaction opened earlier can make a lease look younger than it is. Rows are never
deleted: releasing clears the owner and keeps the row's fencing counter.
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import re
import select
import threading
import time
from collections.abc import Iterator
from datetime import datetime, timezone
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import psycopg
from psycopg import errors, sql
from psycopg.types.json import Jsonb

from tasklock_cli.errors import ConfigError, LeaseLost, StoreUnavailable
from tasklock_cli.stores import redact_url
from tasklock_cli.stores.base import Holder, Lease, LeaseInfo, Store, StoreCheck

DEFAULT_TABLE = "tasklock_leases"
DEFAULT_IO_TIMEOUT_S = 5.0
SWEEP_BATCH = 1000
SERIALIZATION_RETRIES = 5
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_$]{0,62}")
_COLUMNS = {"key", "fencing_token", "owner_token", "holder", "acquired_at", "expires_at"}
_RETRYABLE = (errors.SerializationFailure, errors.DeadlockDetected)


def _table_parts(name: str) -> tuple[str, ...]:
    parts = tuple(name.split("."))
    if len(parts) > 2 or not all(_IDENTIFIER.fullmatch(part) for part in parts):
        raise ConfigError(f"invalid table name {name!r} (use NAME or SCHEMA.NAME)")
    return parts


class PostgresStore(Store):
    signals_release = True

    def __init__(self, conninfo: str, table: str = DEFAULT_TABLE, display_url: str = "") -> None:
        self._conninfo = conninfo
        self._table_name = table
        self._table = sql.Identifier(*_table_parts(table))
        self._channel = "tasklock_" + hashlib.sha1(table.encode()).hexdigest()[:20]
        self.display_url = display_url or redact_url(conninfo)
        self._io_timeout = DEFAULT_IO_TIMEOUT_S
        self._conn: psycopg.Connection | None = None
        self._lock = threading.RLock()
        self._released_keys: set[str] = set()

    @classmethod
    def from_url(cls, url: str) -> PostgresStore:
        parts = urlsplit(url)
        query = parse_qsl(parts.query, keep_blank_values=True)
        table = next((value for name, value in query if name == "table"), DEFAULT_TABLE)
        rest = urlencode([(name, value) for name, value in query if name != "table"])
        conninfo = urlunsplit(parts._replace(query=rest))
        return cls(conninfo, table, redact_url(url))

    # -- connection -------------------------------------------------------------------

    def set_io_timeout(self, seconds: float) -> None:
        self._io_timeout = seconds
        with self._lock:
            if self._conn is not None:
                self._run(
                    sql.SQL("SELECT set_config('statement_timeout', %s, false)"),
                    (f"{self._timeout_ms()}ms",),
                )

    def _timeout_ms(self) -> int:
        return max(100, int(self._io_timeout * 1000))

    def _connect(self) -> psycopg.Connection:
        try:
            conn = psycopg.connect(
                self._conninfo,
                autocommit=True,
                application_name="tasklock",
                connect_timeout=max(1, math.ceil(self._io_timeout)),
                keepalives=1,
                keepalives_idle=max(1, int(self._io_timeout)),
                keepalives_interval=1,
                keepalives_count=3,
                tcp_user_timeout=self._timeout_ms(),
                options=f"-c default_transaction_isolation=read\\ committed "
                f"-c statement_timeout={self._timeout_ms()}",
            )
        except psycopg.OperationalError as exc:
            raise self._connect_error(exc) from None
        conn.add_notify_handler(lambda notify: self._released_keys.add(notify.payload))
        try:
            self._ensure_schema(conn)
            conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(self._channel)))
        except BaseException:
            conn.close()
            raise
        return conn

    def _connect_error(self, exc: Exception) -> Exception:
        message = self._scrub(str(exc).strip().splitlines()[0] if str(exc).strip() else repr(exc))
        # The server answered and refused: retrying cannot help, so it is a configuration
        # error (78), not an outage (69).
        refused = (
            "password authentication failed",
            "does not exist",
            "no password supplied",
            "no pg_hba.conf entry",
            "role",
        )
        if any(marker in message for marker in refused):
            return ConfigError(f"{self.display_url}: {message}")
        return StoreUnavailable(f"cannot reach {self.display_url}: {message}")

    def _scrub(self, message: str) -> str:
        password = urlsplit(self._conninfo).password
        return message.replace(password, "***") if password else message

    def _run(self, statement, params=None, *, fetch: str = "one"):
        """Execute one statement; reconnect next time after a broken connection."""
        with self._lock:
            for attempt in range(SERIALIZATION_RETRIES):
                if self._conn is None or self._conn.closed:
                    self._conn = self._connect()
                try:
                    cursor = self._conn.execute(statement, params)
                    if fetch == "one":
                        return cursor.fetchone()
                    if fetch == "all":
                        return cursor.fetchall()
                    return cursor.rowcount
                except _RETRYABLE:
                    time.sleep(0.001 * 2**attempt)
                except errors.UndefinedTable as exc:
                    raise ConfigError(f"{self.display_url}: {self._scrub(str(exc))}") from None
                except errors.QueryCanceled as exc:
                    raise StoreUnavailable(
                        f"{self.display_url}: statement timed out ({exc})"
                    ) from None
                except psycopg.OperationalError as exc:
                    self._drop_connection()
                    raise StoreUnavailable(f"{self.display_url}: {self._scrub(str(exc))}") from None
                except psycopg.Error as exc:
                    raise StoreUnavailable(f"{self.display_url}: {self._scrub(str(exc))}") from None
            raise StoreUnavailable(f"{self.display_url}: serialization failures persisted")

    def _drop_connection(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(psycopg.Error):
                self._conn.close()
        self._conn = None

    # -- schema -------------------------------------------------------------------------

    def schema_sql(self) -> str:
        table = self._table_name
        index = _table_parts(table)[-1] + "_held"
        return (
            f"CREATE TABLE IF NOT EXISTS {table} (\n"
            '    key           text COLLATE "C" PRIMARY KEY,\n'
            "    fencing_token bigint NOT NULL,\n"
            "    owner_token   text,\n"
            "    holder        jsonb,\n"
            "    acquired_at   timestamptz,\n"
            "    expires_at    timestamptz\n"
            ");\n"
            f"CREATE INDEX IF NOT EXISTS {index} ON {table} (expires_at)"
            " WHERE owner_token IS NOT NULL;\n"
        )

    def _columns(self, conn: psycopg.Connection) -> set[str]:
        rows = conn.execute(
            "SELECT attname FROM pg_attribute WHERE attrelid = to_regclass(%s)"
            " AND attnum > 0 AND NOT attisdropped",
            (self._qualified(),),
        ).fetchall()
        return {row[0] for row in rows}

    def _qualified(self) -> str:
        return ".".join(f'"{part}"' for part in _table_parts(self._table_name))

    def _ensure_schema(self, conn: psycopg.Connection) -> None:
        columns = self._columns(conn)
        if not columns:
            # Racing first users: one creates the table, the others wait on the same lock.
            with conn.transaction():
                conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (self._qualified(),))
                conn.execute(self.schema_sql())
            columns = self._columns(conn)
        if columns != _COLUMNS:
            raise ConfigError(
                f"{self.display_url}: table {self._table_name} exists but is not a tasklock "
                f"table (columns: {', '.join(sorted(columns))})"
            )

    def init_schema(self) -> None:
        self._run("SELECT 1")

    # -- the interface ------------------------------------------------------------------

    def acquire(self, key: str, ttl: float, holder: Holder, owner_token: str) -> Lease | None:
        statement = sql.SQL("""
            INSERT INTO {t} AS l (key, fencing_token, owner_token, holder, acquired_at,
                                  expires_at)
            VALUES (%(key)s, 1, %(owner)s, %(holder)s, clock_timestamp(),
                    clock_timestamp() + %(ttl)s * interval '1 second')
            ON CONFLICT (key) DO UPDATE SET
                fencing_token = CASE WHEN l.owner_token = excluded.owner_token
                                     THEN l.fencing_token ELSE l.fencing_token + 1 END,
                acquired_at = CASE WHEN l.owner_token = excluded.owner_token
                                   THEN l.acquired_at ELSE excluded.acquired_at END,
                owner_token = excluded.owner_token, holder = excluded.holder,
                expires_at = excluded.expires_at
            WHERE l.owner_token IS NULL OR l.owner_token = excluded.owner_token
               OR l.expires_at <= clock_timestamp()
            RETURNING fencing_token, acquired_at, expires_at
        """).format(t=self._table)
        row = self._run(
            statement,
            {"key": key, "owner": owner_token, "ttl": ttl, "holder": Jsonb(holder.to_dict())},
        )
        if row is None:
            return None
        self._released_keys.discard(key)
        return Lease(key, owner_token, row[0], row[1], row[2])

    def renew(self, lease: Lease, ttl: float) -> Lease:
        statement = sql.SQL("""
            UPDATE {t} SET expires_at = clock_timestamp() + %(ttl)s * interval '1 second'
            WHERE key = %(key)s AND owner_token = %(owner)s AND expires_at > clock_timestamp()
            RETURNING expires_at
        """).format(t=self._table)
        row = self._run(statement, {"key": lease.key, "owner": lease.owner_token, "ttl": ttl})
        if row is None:
            raise LeaseLost(f"the lease on {lease.key!r} is no longer ours")
        return Lease(lease.key, lease.owner_token, lease.fencing_token, lease.acquired_at, row[0])

    def release(self, lease: Lease, keep_for: float = 0.0) -> bool:
        params = {
            "key": lease.key,
            "owner": lease.owner_token,
            "keep": keep_for,
            "channel": self._channel,
        }
        if keep_for > 0:
            statement = sql.SQL("""
                UPDATE {t} SET expires_at = clock_timestamp() + %(keep)s * interval '1 second'
                WHERE key = %(key)s AND owner_token = %(owner)s
                  AND expires_at > clock_timestamp()
                RETURNING key
            """)
        else:
            statement = sql.SQL("""
                WITH freed AS (
                    UPDATE {t} SET owner_token = NULL, holder = NULL, acquired_at = NULL,
                                   expires_at = NULL
                    WHERE key = %(key)s AND owner_token = %(owner)s RETURNING key)
                SELECT pg_notify(%(channel)s, key) FROM freed
            """)
        return self._run(statement.format(t=self._table), params) is not None

    _SELECT = """SELECT key, fencing_token, holder, acquired_at, expires_at,
                        expires_at > clock_timestamp() FROM {t} """

    def peek(self, key: str) -> LeaseInfo | None:
        statement = sql.SQL(
            self._SELECT + "WHERE key = %s AND owner_token IS NOT NULL"
            " AND expires_at > clock_timestamp()"
        ).format(t=self._table)
        row = self._run(statement, (key,))
        return _info(row) if row else None

    def list(self, prefix: str = "", include_expired: bool = False) -> Iterator[LeaseInfo]:
        live = "" if include_expired else " AND expires_at > clock_timestamp()"
        statement = sql.SQL(
            self._SELECT
            + "WHERE owner_token IS NOT NULL"
            + live
            + " AND key >= %(p)s AND starts_with(key, %(p)s) ORDER BY key"
        ).format(t=self._table)
        for row in self._run(statement, {"p": prefix}, fetch="all"):
            yield _info(row)

    def sweep(self, dry_run: bool = False) -> int:
        expired = "owner_token IS NOT NULL AND expires_at <= clock_timestamp()"
        if dry_run:
            statement = sql.SQL("SELECT count(*) FROM {t} WHERE " + expired).format(t=self._table)
            return int(self._run(statement)[0])
        statement = sql.SQL(
            """
            WITH batch AS (SELECT key FROM {t} WHERE """
            + expired
            + """
                           LIMIT %(n)s FOR UPDATE SKIP LOCKED)
            UPDATE {t} AS l SET owner_token = NULL, holder = NULL, acquired_at = NULL,
                                expires_at = NULL
            FROM batch WHERE l.key = batch.key AND l.expires_at <= clock_timestamp()
        """
        ).format(t=self._table)
        removed = 0
        while True:  # bounded batches: acquirers never wait behind one huge statement
            count = self._run(statement, {"n": SWEEP_BATCH}, fetch="rowcount")
            removed += count
            if count < SWEEP_BATCH:
                return removed

    def force_release(self, key: str) -> LeaseInfo | None:
        statement = sql.SQL("""
            WITH old AS (
                SELECT key, fencing_token, holder, acquired_at, expires_at,
                       expires_at > clock_timestamp() AS live
                FROM {t} WHERE key = %(key)s AND owner_token IS NOT NULL FOR UPDATE),
            freed AS (
                UPDATE {t} AS l SET owner_token = NULL, holder = NULL, acquired_at = NULL,
                                    expires_at = NULL
                FROM old WHERE l.key = old.key RETURNING l.key)
            SELECT old.*, pg_notify(%(channel)s, old.key) FROM old
        """).format(t=self._table)
        row = self._run(statement, {"key": key, "channel": self._channel})
        return _info(row[:6]) if row else None

    def wait_for_release(self, key: str, timeout: float) -> None:
        """Wake on a NOTIFY for this key, else after ``timeout``. We LISTEN from the moment
        we connect and a handler records every release, so one sent between our failed
        acquire and this wait is not missed."""
        give_up = time.monotonic() + timeout
        with self._lock:
            while key not in self._released_keys:
                left = give_up - time.monotonic()
                if left <= 0:
                    return
                if self._conn is None:
                    time.sleep(left)
                    return
                try:
                    readable, _, _ = select.select([self._conn.fileno()], [], [], left)
                    if readable:
                        self._conn.execute("SELECT 1")  # lets psycopg dispatch the NOTIFYs
                except (psycopg.Error, OSError, ValueError):
                    self._drop_connection()
                    time.sleep(max(0.0, give_up - time.monotonic()))
                    return
            self._released_keys.discard(key)

    def doctor(self) -> list[StoreCheck]:
        checks = [StoreCheck("store", True, self.display_url)]
        try:
            self._run("SELECT 1")  # connect (and check the schema) outside the timing
            started = time.perf_counter()
            self._run("SELECT 1")
            rtt = time.perf_counter() - started
            version = self._run("SHOW server_version")[0]
            sent = time.time()
            server_now = self._run("SELECT clock_timestamp()")[0]
            received = time.time()
        except (StoreUnavailable, ConfigError) as exc:
            checks.append(StoreCheck("reachable", False, str(exc)))
            return checks
        checks.append(StoreCheck("reachable", True, f"SELECT 1 round trip {rtt * 1000:.1f} ms"))
        checks.append(StoreCheck("server", True, f"PostgreSQL {version}"))
        checks.append(StoreCheck("schema", True, f"table {self._table_name} ok"))
        offset = server_now.timestamp() - (sent + received) / 2
        checks.append(
            StoreCheck(
                "clock",
                True,
                f"server clock {offset * 1000:+.1f} ms from this machine's "
                "(the server's clock decides expiry)",
                warning=abs(offset) > 1.0,
            )
        )
        return checks

    def close(self) -> None:
        with self._lock:
            self._drop_connection()


def _info(row: tuple) -> LeaseInfo:
    key, token, holder, acquired_at, expires_at, live = row
    epoch = datetime.fromtimestamp(0, tz=timezone.utc)
    return LeaseInfo(
        key=key,
        holder=Holder.from_dict(holder or {}),
        fencing_token=int(token),
        acquired_at=acquired_at or epoch,
        expires_at=expires_at or epoch,
        expired=not live,
    )
