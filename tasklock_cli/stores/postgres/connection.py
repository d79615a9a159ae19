"""The PostgreSQL store's connection: opened on first use and set up in one round trip,
every call bounded by the I/O timeout, failures mapped to tasklock errors, a broken
connection dropped and the next call made on a new one."""

from __future__ import annotations

import contextlib
import functools
import math
import os
import random
import re
import socket
import threading
import time
from collections.abc import Callable
from typing import Any
from typing import TypeVar

import psycopg
import psycopg.errors as pgerr
from psycopg.conninfo import conninfo_to_dict
from psycopg.types.datetime import TimestamptzLoader

from tasklock_cli.errors import ConfigError
from tasklock_cli.errors import StoreUnavailable
from tasklock_cli.errors import TasklockError
from tasklock_cli.stores.postgres.epochs import refusal
from tasklock_cli.stores.postgres.epochs import refused_function
from tasklock_cli.stores.postgres.schema import INSPECT
from tasklock_cli.stores.postgres.schema import UNSET
from tasklock_cli.stores.postgres.schema import PgSchema
from tasklock_cli.stores.postgres.schema import Unset
from tasklock_cli.stores.sql import SqlConnection
from tasklock_cli.stores.urls import check_host
from tasklock_cli.stores.urls import unknown_parameter
from tasklock_cli.stores.urls import url_passwords

SERIALIZATION_RETRIES = 5

_T = TypeVar("_T")


class _LenientTimestamptz(TimestamptzLoader):
    """A ``timestamptz`` that Python cannot hold (``infinity``, after the year 9999) is read
    as None, which the store's row parsing reports as malformed (see ``rows``), instead of
    failing the whole statement: one forged row must not stop every listing."""

    def load(self, data: Any) -> Any:
        try:
            return super().load(data)
        except psycopg.DataError:
            return None


psycopg.adapters.register_loader("timestamptz", _LenientTimestamptz)

# Every new connection's settings, sent with its first statement (``_open``). READ
# COMMITTED whatever the server's or role's default: every lease statement re-checks the
# row it locks, and never fails with 40001.
_SESSION_SETUP = (
    "SET default_transaction_isolation = 'read committed';"
    " SET TIME ZONE 'UTC';"
    " SET idle_in_transaction_session_timeout = '60s';"
    " SET statement_timeout = {timeout};"
)


#: Before the session settings of a call that sends them itself (``run``'s ``in_band``):
#: its transaction began with the server's or role's isolation level.
_IN_BAND_SET_UP = "SET TRANSACTION ISOLATION LEVEL READ COMMITTED; "

#: ``run``'s ``in_band``: (connection, the session settings to send first) -> (the lease
#: table's oid, the result).
InBand = Callable[[psycopg.Connection, str], tuple[int, _T]]


class _CallAgain(Exception):
    """A first call that set up its own session failed: again, on a connection set up as
    usual."""


# Connection failures that mean "fix the URL / the server's setup", not "try again later".
#: libpq's words for a parameter it does not know, in a URL and in a conninfo string.
_UNKNOWN_PARAMETER = re.compile(r'invalid (?:URI query parameter|connection option):? "([^"]*)"')
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
    "server does not support ssl",  # sslmode=require (or verify-*) and a server without TLS
)


def one_row(cursor: psycopg.Cursor[tuple[Any, ...]]) -> tuple[Any, ...]:
    """The row of a statement that always returns exactly one (an aggregate without GROUP
    BY, a SELECT of values without FROM)."""
    row = cursor.fetchone()
    assert row is not None, "a one-row statement returned no row"
    return row


class Overrun(Exception):
    """The watchdog shut the socket: the server did not answer within ``seconds`` (the I/O
    timeout, or a first creation's longer one)."""

    def __init__(self, seconds: float) -> None:
        super().__init__(seconds)
        self.seconds = seconds


class Watchdog:
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


class PgConnection(SqlConnection):
    """The store's one connection (``current``), used under ``lock`` through ``run``.

    ``on_new_session`` callbacks are told when the session ends (dropped, or replaced by
    a new one): what the server kept for it -- LISTENs, advisory locks -- is gone."""

    current: psycopg.Connection | None

    def __init__(self, conninfo: str, display_url: str, schema: PgSchema) -> None:
        super().__init__(display_url, url_passwords(conninfo))
        self._conninfo = conninfo
        self._schema = schema
        try:
            params = conninfo_to_dict(conninfo)
        except psycopg.Error as exc:
            unknown = _UNKNOWN_PARAMETER.search(str(exc))
            if unknown:
                raise unknown_parameter(
                    "PostgreSQL",
                    display_url,
                    unknown[1],
                    "libpq's connection parameters, or table=",
                ) from None
            raise ConfigError(
                f"invalid PostgreSQL URL {display_url!r}: {self.scrub(str(exc))}"
            ) from None
        for host in str(params.get("host") or "").split(","):
            check_host("PostgreSQL", display_url, host)
        password = str(params.get("password") or "")
        if password and password not in self._secrets:
            self._secrets.insert(0, password)
        self._user_params = {k for k, v in params.items() if v is not None}
        self._watchdog = Watchdog()
        self.on_new_session: list[Callable[[], None]] = []

    def connect_kwargs(self) -> dict[str, Any]:
        io = self.io_timeout
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

    def connect(self) -> psycopg.Connection:
        """A new autocommit connection, close-on-exec, not set up (a holder's own)."""
        conn = psycopg.Connection.connect(self._conninfo, autocommit=True, **self.connect_kwargs())
        try:
            os.set_inheritable(conn.fileno(), False)  # libpq sets FD_CLOEXEC; make sure
        except BaseException:
            conn.close()
            raise
        return conn

    def _open(self, inspect: bool) -> tuple[psycopg.Connection, tuple | None]:
        """A new connection, set up in one round trip after connecting: the session
        settings, the statement timeout and (``inspect``) the look at the table, whose
        row is returned for ``PgSchema.ensure``."""
        conn = psycopg.Connection.connect(self._conninfo, autocommit=True, **self.connect_kwargs())
        try:
            os.set_inheritable(conn.fileno(), False)  # libpq sets FD_CLOEXEC; make sure
            setup = _SESSION_SETUP.format(timeout=self._statement_timeout_ms())
            cursor = psycopg.ClientCursor(conn)  # one simple query, parameters bound here
            if not inspect:
                self._guarded(conn, lambda: cursor.execute(setup))
                return conn, None

            def set_up_and_inspect() -> tuple | None:
                cursor.execute(setup + INSPECT, self._schema.inspection_params(conn))
                while cursor.nextset():  # to the last result, the inspection's
                    pass
                return cursor.fetchone()

            return conn, self._guarded(conn, set_up_and_inspect)
        except BaseException:
            conn.close()
            raise

    def _first_call_in_band(self, in_band: InBand[_T]) -> _T:
        """``in_band`` on a new connection: it sends the session settings it is given
        before its own statement, in one simple query (one round trip, one transaction),
        and answers the table's oid with its result.

        The schema is not looked at first (a look at the catalogs costs a new session
        ~5 ms of the server's). A call that fails (a table missing or of an older shape)
        raises _CallAgain: ``run`` makes it again as its ``operation``, on a connection
        set up as usual, whose look creates or migrates the table."""
        try:
            conn = self.connect()
        except psycopg.Error as exc:
            raise self._translate(exc) from None
        self.current = conn
        self._applied_timeout = self.io_timeout
        self._session_ended()
        set_up = _SESSION_SETUP.format(timeout=self._statement_timeout_ms())
        try:
            oid, result = self._guarded(conn, lambda: in_band(conn, _IN_BAND_SET_UP + set_up))
        except Overrun:
            self.drop()
            raise StoreUnavailable(
                f"{self.display_url}: no answer within {self.io_timeout:g} s"
            ) from None
        except psycopg.Error as exc:
            broken = conn.closed or conn.broken
            self.drop()
            if broken or isinstance(exc, pgerr.QueryCanceled):
                raise self._translate(exc) from None
            raise _CallAgain() from None
        except BaseException:
            self.drop()  # (its session settings went back with the call's transaction)
            raise
        self._schema.found(oid)
        self._schema_confirmed()
        return result

    def _statement_timeout_ms(self, seconds: float | None = None) -> int:
        """The server's limit for ``seconds`` (the I/O timeout): it cancels before we give up."""
        return max(100, int((seconds or self.io_timeout) * 800))

    def _guarded(
        self, conn: psycopg.Connection, operation: Callable[[], _T], seconds: float | None = None
    ) -> _T:
        """Run ``operation`` with the watchdog armed for ``seconds`` (one I/O timeout)."""
        seconds = seconds or self.io_timeout
        self._watchdog.arm(conn.fileno(), seconds + 0.05)
        overran = False
        try:
            return operation()
        finally:
            overran = self._watchdog.disarm()
            if overran:
                raise Overrun(seconds)

    def _connection(self, ensure_schema: bool = True) -> psycopg.Connection:
        conn = self.current
        if conn is not None and (conn.closed or conn.broken):
            self.drop()
            conn = None
        inspected: tuple | Unset | None = UNSET
        if conn is None:
            conn, row = self._open(inspect=ensure_schema)
            if ensure_schema:
                inspected = row
            self.current = conn
            self._applied_timeout = self.io_timeout
            self._session_ended()
        if self._applied_timeout != self.io_timeout:
            millis = self._statement_timeout_ms()
            self._guarded(conn, lambda: conn.execute(f"SET statement_timeout = {millis}"))
            self._applied_timeout = self.io_timeout
        if ensure_schema and not self._schema_ok:
            patience = self.schema_timeout()
            millis = self._statement_timeout_ms(patience)
            self._guarded(conn, lambda: self._schema.ensure(conn, inspected, millis), patience)
            self._schema_confirmed()
        return conn

    def _session_ended(self) -> None:
        super()._session_ended()
        for forget in self.on_new_session:
            forget()

    def close(self) -> None:
        super().close()
        self._watchdog.stop()

    def run(
        self,
        operation: Callable[[psycopg.Connection], _T],
        *,
        idempotent: bool = True,
        ensure_schema: bool = True,
        in_band: InBand[_T] | None = None,
    ) -> _T:
        """Run ``operation`` on the connection, mapping every failure to a tasklock error.

        ``in_band`` (an idempotent call: a run's acquire): made instead of ``operation`` on
        a new connection, which it sets up itself (``_first_call_in_band``).

        Retried here:

        - serialization failures and deadlocks, a few times;
        - a table that vanished, recreated once;
        - a connection found broken when reused, once, on a new connection.
          For non-idempotent statements, only when the server said it had not run the
          statement: it was shutting down, or it terminated the session.
        """
        with self.lock:
            current = self.current
            if in_band is not None and idempotent and (current is None or current.closed):
                with contextlib.suppress(_CallAgain):
                    return self._first_call_in_band(in_band)
            conflicts = 0
            reconnected = recreated = False
            while True:
                # A failure on a connection opened by an earlier call may just mean it went
                # stale (server restart, terminated backend, idle timeout): retry once.
                stale = self.current is not None
                try:
                    conn = self._connection(ensure_schema)
                    return self._guarded(conn, functools.partial(operation, conn))
                except Overrun as overrun:
                    self.drop()
                    raise StoreUnavailable(
                        f"{self.display_url}: no answer within {overrun.seconds:g} s"
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
                    retry = self._worth_reconnecting(exc, idempotent)  # (drops a broken one)
                    if not (retry and stale and not reconnected):
                        raise self._translate(exc) from None
                    reconnected = True
                except psycopg.Error as exc:
                    raise self._translate(exc) from None

    def _worth_reconnecting(self, exc: psycopg.Error, idempotent: bool) -> bool:
        """After a failure on a connection opened by an earlier call: drops it when broken;
        True when the call may run again on a new one."""
        current = self.current
        broken = current is None or current.closed or current.broken
        if broken:
            self.drop()
        not_run = (getattr(exc, "sqlstate", None) or "").startswith("57P")
        return broken and (idempotent or not_run) and not isinstance(exc, pgerr.QueryCanceled)

    def _translate(self, exc: Exception) -> TasklockError:
        text = self.scrub(str(exc)) or type(exc).__name__
        where = self.display_url
        table = self._schema.table_name
        state = getattr(exc, "sqlstate", None) or ""
        if isinstance(exc, pgerr.QueryCanceled):
            return StoreUnavailable(
                f"{where}: the statement did not finish within {self.io_timeout:g} s ({text})"
            )
        if isinstance(exc, pgerr.ReadOnlySqlTransaction):
            return StoreUnavailable(
                f"{where}: connected to a read-only server ({text}); "
                "add target_session_attrs=read-write to the URL for failover setups"
            )
        refused = refused_function(exc)
        if refused is not None:
            return ConfigError(f"{where}: {refusal(refused, text)}")
        if isinstance(exc, pgerr.InsufficientPrivilege):
            return ConfigError(f"{where}: the database user may not use table {table} ({text})")
        if isinstance(exc, pgerr.UndefinedTable):
            return ConfigError(f"{where}: table {table} is missing ({text})")
        if "invalid port number" in text:
            return ConfigError(f"{where}: {text}")
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
            return ConfigError(f"{where}: table {table} is unusable ({text})")
        return StoreUnavailable(f"{where}: PostgreSQL answered with an error: {text}")
